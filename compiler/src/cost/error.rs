//! Why a schedule could not be costed.

use hccl_ir::{Rank, StepRef};

/// Why a schedule could not be costed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostError {
    /// The schedule is for a different number of ranks than the topology has.
    #[error("schedule has {schedule} ranks but the topology has {topology}")]
    RankMismatch { schedule: u32, topology: u32 },
    /// The schedule cuts the buffer into zero chunks.
    #[error("schedule has zero chunks")]
    NoChunks,
    /// A step addresses a peer out of range or itself.
    #[error("transfer from rank {from} to rank {to}: peer out of range or equal to the rank")]
    BadPeer { from: Rank, to: Rank },
    /// A dependency names a step that does not exist.
    #[error("{at}: dependency on a step that does not exist")]
    BadDep { at: StepRef },
    /// The topology has no path between two ranks.
    #[error("no route from rank {from} to rank {to} in the topology")]
    NoRoute { from: Rank, to: Rank },
    /// No step can make progress; names the first step that never completed.
    #[error("{at}: never completes (deadlock or unmatched receive)")]
    Deadlock { at: StepRef },
    /// More steps than the simulator indexes.
    #[error("schedule has {steps} steps, more than the simulator supports")]
    TooLarge { steps: usize },
    /// A symmetric schedule whose symmetry or template is malformed, or a prepared symmetric
    /// schedule run on another network or kind of model.
    #[error("symmetric schedule: {0}")]
    BadSymmetry(String),
    /// A run given a time limit ([`Simulator::run_within`]) passed it, or was sure to: its
    /// clock was at `at_us` when it stopped (below the limit when what was left to carry
    /// over its busiest resources could not make it in time).
    #[error("the collective takes longer than {limit_us} µs (stopped at {at_us} µs)")]
    PastLimit { limit_us: f64, at_us: f64 },
}
