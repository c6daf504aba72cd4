//! The verifier: proves a schedule implements its collective and cannot deadlock.
//!
//! (Interface fixed; the implementation lands with the verifier work.)

use crate::plan::PlanFile;
use crate::schedule::{Schedule, StepRef};
use std::fmt;

/// What is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// The step at fault, or `None` for whole-schedule problems (e.g. header fields).
    pub at: Option<StepRef>,
    /// Channel of the stream at fault, when `at` is set.
    pub channel: Option<u32>,
    pub kind: ErrorKind,
    /// Human-readable explanation (full sentence fragment, no trailing period).
    pub message: String,
}

/// Classes of verification failures, so tests and tools can match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Header fields inconsistent (nranks, chunks, buffer extents, root).
    Header,
    /// An offset/count outside its buffer.
    Bounds,
    /// A peer out of range or equal to the rank itself.
    Peer,
    /// A dependency that names no step, or a cycle of dependencies.
    Dependency,
    /// Sends and receives that do not pair up on a connection.
    Matching,
    /// Several streams of a rank share one connection direction.
    Connection,
    /// No step can make progress.
    Deadlock,
    /// A step reads data that was never written.
    Uninitialized,
    /// Chunks combined from different origins, or contributions counted twice.
    BadReduction,
    /// The final buffers do not hold the collective's result.
    Postcondition,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.at, self.channel) {
            (Some(at), Some(ch)) => write!(
                f,
                "rank {} stream {} (channel {ch}) step {}: {}",
                at.rank, at.stream, at.step, self.message
            ),
            (Some(at), None) => write!(f, "{at}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Verifies a schedule: structure, deadlock freedom, then the collective's postcondition.
/// Returns every error found by the first failing layer (at least one on `Err`).
pub fn verify(schedule: &Schedule) -> Result<(), Vec<VerifyError>> {
    let _ = schedule;
    Ok(())
}

/// Verifies every entry of a plan; errors carry the entry index.
pub fn verify_plan(plan: &PlanFile) -> Result<(), Vec<(usize, Vec<VerifyError>)>> {
    let failures: Vec<_> = plan
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| verify(&e.schedule).err().map(|errs| (i, errs)))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}
