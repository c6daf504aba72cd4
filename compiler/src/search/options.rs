//! What a compile is asked for ([`Options`]), how it reports progress ([`Progress`]) and
//! why it fails ([`SearchError`]).

use crate::cost::CostModel;
use crate::families::Candidate;
use crate::synth::SynthLevel;
use hccl_ir::{Collective, CollectiveKind, Protocol};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Default smallest size bucket (1 KiB).
pub const DEFAULT_MIN_BYTES: u64 = 1 << 10;
/// Default largest size bucket (4 GiB).
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// What to compile and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Collectives to compile, in output order.
    pub collectives: Vec<CollectiveKind>,
    /// Lower edges of the size buckets, ascending (bytes).
    pub sizes: Vec<u64>,
    /// Restrict the candidates to these algorithm names (`--algo`); `None` = all.
    pub algorithms: Option<Vec<String>>,
    /// Protocols to consider.
    pub protocols: Vec<Protocol>,
    /// Candidates from outside the built-in families; used for the collective they implement.
    pub extra: Vec<Candidate>,
    /// Cost constants.
    pub model: CostModel,
    /// Simulated steps allowed per candidate and protocol over all sizes; beyond it the
    /// sizes are subsampled (at least the smallest and largest are always simulated).
    pub sim_budget: usize,
    /// Which synthesizers compete ([`SynthLevel`]).
    pub synth: SynthLevel,
    /// A collective no candidate schedules is left out of the plan (and listed in
    /// [`CompiledPlan::skipped`](super::CompiledPlan::skipped)) instead of failing the whole compile.
    pub partial: bool,
    /// Set from elsewhere (another thread, a signal handler) to stop the compile: it returns
    /// [`SearchError::Cancelled`] at the next phase boundary, and skips the candidates of the
    /// current phase not yet started. `None`: runs to the end.
    pub cancel: Option<Arc<AtomicBool>>,
    /// The synthesis cache directory ([`crate::synth::cache`]: solver results kept between
    /// compiles, read before solving and written after); `None` (the default): solved in
    /// this process, nothing read or written. `hcclc compile` passes
    /// [`crate::synth::cache::default_dir`] unless `--no-cache`.
    pub cache_dir: Option<PathBuf>,
}

impl Options {
    /// Whether [`Options::cancel`] is set.
    pub fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(super) fn check_cancel(&self) -> Result<(), SearchError> {
        if self.cancelled() {
            Err(SearchError::Cancelled)
        } else {
            Ok(())
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            collectives: CollectiveKind::ALL.to_vec(),
            sizes: geometric_sizes(DEFAULT_MIN_BYTES, DEFAULT_MAX_BYTES, 2),
            algorithms: None,
            protocols: Protocol::ALL.to_vec(),
            extra: Vec::new(),
            model: CostModel::default(),
            sim_budget: 400_000,
            synth: SynthLevel::Auto,
            partial: false,
            cancel: None,
            cache_dir: None,
        }
    }
}

/// `min, min·factor, …` up to and including `max` (at least one size).
pub fn geometric_sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let factor = factor.max(2);
    let mut sizes = vec![min.max(1)];
    while let Some(&last) = sizes.last() {
        match last.checked_mul(factor) {
            Some(next) if next <= max => sizes.push(next),
            _ => break,
        }
    }
    sizes
}

/// The root used for rooted collectives.
pub const ROOT: u32 = 0;

/// The collective of `kind` the search compiles (root [`ROOT`] for rooted ones).
pub fn collective_of(kind: CollectiveKind) -> Collective {
    match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::Broadcast => Collective::Broadcast { root: ROOT },
        CollectiveKind::Reduce => Collective::Reduce { root: ROOT },
        CollectiveKind::AllToAll => Collective::AllToAll,
    }
}

/// Progress of a compilation, for a progress bar. On machines of up to 64 ranks the
/// collectives compile side by side, so reports of different collectives interleave (each
/// is reported from the thread that called [`compile_with_progress`](super::compile_with_progress)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub collective: CollectiveKind,
    /// Candidates costed so far for this collective.
    pub done: usize,
    /// Candidates of this collective.
    pub total: usize,
    /// Collectives finished so far (all of them in the last report).
    pub collectives_done: usize,
    /// Collectives to compile.
    pub collectives_total: usize,
}

/// Why a compilation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SearchError {
    /// Options that cannot be honoured (unknown algorithm, no sizes, …).
    #[error("{0}")]
    BadOptions(String),
    /// No candidate produced a verified schedule.
    #[error("no verified schedule for {collective} on {topology} (candidates tried: {tried})")]
    NoCandidate {
        collective: CollectiveKind,
        topology: String,
        tried: usize,
    },
    /// [`Options::cancel`] was set.
    #[error("compilation cancelled")]
    Cancelled,
}
