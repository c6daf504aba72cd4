//! The chunk-level IR of hccl: schedules, plan files and the verifier.
//!
//! This crate is the contract between the compiler, which writes plans, and the executor,
//! which trusts them once they verify. It does no topology reasoning and no I/O beyond
//! reading and writing plan files.
//!
//! - [`schedule`]: the data model ([`Schedule`], [`RankProgram`], [`Stream`], [`Step`], [`Op`])
//!   and its execution semantics;
//! - [`plan`]: plan files ([`PlanFile`]), their RON form and format versioning;
//! - [`seal`]: seals ([`Seal`]), the verifier's record that a schedule passed, which one
//!   rank can check against its own program ([`PlanPart`]);
//! - [`dag`]: the step DAG of a schedule ([`StepDag`]): steps numbered, their order and the
//!   pairing of sends with receives derived once for whoever runs or checks a schedule;
//! - [`symmetric`]: rank-symmetric schedules ([`SymmetricSchedule`]): one template program
//!   and the translations ([`Symmetry`]) that give every rank its own, the compact form of
//!   ring, hierarchical and halving-doubling schedules in plan files;
//! - [`reference`]: the result a collective must produce from given inputs, the one the
//!   tests of every crate compare against;
//! - [`verify`]: structural checks, deadlock freedom and the symbolic proof that a schedule
//!   implements its collective.

pub mod dag;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod msccl;
pub mod par;
pub mod plan;
pub mod plan_index;
mod plan_scan;
pub mod reference;
pub mod runs;
pub mod schedule;
pub mod seal;
pub mod symmetric;
pub mod trace;
pub mod units;
pub mod verify;

pub use dag::{DagError, DagParts, StepDag, StepNumbering};
pub use error::{Located, PlanError};
pub use plan::{
    CostFit, EntryText, FORMAT_VERSION, MIN_FORMAT_VERSION, PlanEntry, PlanFile, PlanMeta,
    Protocol, Synthesis,
};
pub use schedule::{
    Buf, CONNECTION_SLOTS, Collective, CollectiveKind, Dep, Loc, Op, Rank, RankProgram, Schedule,
    ScheduleHeader, Step, StepRef, Stream,
};
pub use seal::{PlanPart, Seal, rank_digest, schedule_hash, seal_of};
pub use symmetric::{
    Action, BlockLabel, BlockLayout, ChunkMap, SymmetricSchedule, Symmetry, SymmetryError,
    SymmetryTable, Translation, TranslationMemo,
};

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// readers never see a half-written file and a failed write leaves the old file intact.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".to_string());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
