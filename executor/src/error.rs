//! Typed errors of the executor. Every runtime error names the rank that reports it and,
//! where one is involved, the peer, stream and step.

use hccl_ir::{Collective, PlanError};
use thiserror::Error;

/// Result type of the executor.
pub type Result<T, E = ExecError> = std::result::Result<T, E>;

/// Everything that can go wrong building a communicator or running a collective.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The plan file could not be read.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A plan directory could not be listed or held no plan files.
    #[error("{path}: {message}")]
    PlanDir { path: String, message: String },
    /// An entry of the plan failed verification.
    #[error("plan entry {entry} ({collective}) failed verification: {message}")]
    Verify {
        entry: usize,
        collective: Collective,
        message: String,
    },
    /// An entry is structurally unusable (bounds, peers, dependencies) for this executor.
    #[error("plan entry {entry}: rank {rank} stream {stream} step {step}: {message}")]
    BadStep {
        entry: usize,
        rank: u32,
        stream: u32,
        step: u32,
        message: String,
    },
    /// The plan was compiled for another number of ranks.
    #[error("plan entry {entry} is for {plan} ranks but the job has {world}")]
    WorldSize { entry: usize, plan: u32, world: u32 },
    /// Ranks hold different plans.
    #[error(
        "rank {rank} holds plan {theirs} but rank {me} holds plan {mine}: all ranks must use the same plan file"
    )]
    PlanMismatch {
        me: u32,
        mine: String,
        rank: u32,
        theirs: String,
    },
    /// No entry of the plan implements the requested call.
    #[error("the plan has no entry for {collective} at {bytes} bytes{filter}")]
    NoEntry {
        collective: Collective,
        bytes: u64,
        filter: String,
    },
    /// The caller's buffers do not fit the collective.
    #[error("rank {rank}: {collective}: {message}")]
    BadBuffers {
        rank: u32,
        collective: Collective,
        message: String,
    },
    /// An `HCCL_*` variable of the environment has a value the executor does not accept
    /// (every variable: `docs/env.md`).
    #[error("{name}={value}: expected {expected}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value, as set.
        value: String,
        /// The values accepted.
        expected: String,
    },
    /// Invalid arguments (rank out of range, bad root, bad configuration).
    #[error("{0}")]
    Invalid(String),
    /// This rank waited longer than the timeout for a peer.
    #[error(
        "rank {rank}: timed out after {secs:.1} s at stream {stream} step {step} waiting for rank {peer} ({what}){}",
        blocked_by.map_or_else(String::new, |b| format!(", which itself waited for rank {b}"))
    )]
    Timeout {
        rank: u32,
        peer: u32,
        stream: u32,
        step: u32,
        secs: f64,
        what: &'static str,
        /// Where `peer` was itself waiting in a call: the rank at the end of that chain of
        /// waits (one that was not waiting, so the one holding everyone up), as far as this
        /// host's ranks show it.
        blocked_by: Option<u32>,
    },
    /// A peer died, left the communicator, or another rank aborted because of it.
    #[error("rank {rank}: rank {failed} failed ({reason}); collective aborted")]
    PeerFailed {
        rank: u32,
        failed: u32,
        reason: String,
    },
    /// This rank's call and a peer's call of the same number differ (see `HCCL_CHECK_CALLS`).
    #[error(
        "rank {rank}: its call #{seq} is {call}, but rank {peer}'s call #{seq} is {peer_call}; collective aborted"
    )]
    CallMismatch {
        rank: u32,
        peer: u32,
        /// The calls' number on their communicator (from 1).
        seq: u64,
        call: String,
        peer_call: String,
    },
    /// A message's bytes do not match the checksum its sender computed (`HCCL_CHECKSUM=1`):
    /// corrupted between the sender's write and this rank's read.
    #[error(
        "rank {rank}: message {seq} from rank {sender} on channel {channel} is corrupt ({detail}), received at stream {stream} step {step}; collective aborted"
    )]
    Corrupt {
        /// The receiver (this rank).
        rank: u32,
        sender: u32,
        channel: u32,
        stream: u32,
        step: u32,
        /// The message's number on its connection (from 0).
        seq: u64,
        /// What was compared, or where it was caught.
        detail: String,
    },
    /// The communicator is unusable after an earlier failure or a lost non-blocking request.
    #[error("rank {rank}: communicator unusable: {reason}")]
    Poisoned { rank: u32, reason: String },
    /// Bootstrap (rendezvous, shared memory) failed.
    #[error("rank {rank}: bootstrap failed: {message}")]
    Bootstrap { rank: u32, message: String },
    /// An operating-system error with what was being done.
    #[error("rank {rank}: {what}: {source}")]
    Io {
        rank: u32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An internal invariant failed (a bug); reported instead of panicking.
    #[error("rank {rank}: internal error: {message}")]
    Internal { rank: u32, message: String },
}
