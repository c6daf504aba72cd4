//! Where a compile's result depends on the clock: a solver that stopped at its time limit
//! returns what it had found by then, which depends on the machine's speed and load. Such a
//! result may differ from one compile to the next, so a compile that met one is not kept in
//! the plan cache ([`crate::search::plan_cache`]), as the synthesis cache already refuses
//! such frontiers ([`crate::synth::milp::cached_pareto`]).
//!
//! The count is process-wide: a caller reads [`clock_stops`] before and after its compile,
//! and a change means some solve of that compile (or of one running beside it, which only
//! makes the caller more careful) stopped on the clock.

use std::sync::atomic::{AtomicU64, Ordering};

static STOPS: AtomicU64 = AtomicU64::new(0);

/// Solves that have stopped on the clock in this process so far.
pub fn clock_stops() -> u64 {
    STOPS.load(Ordering::Acquire)
}

/// Records a solve whose result depends on the clock.
pub(crate) fn note_clock_stop() {
    STOPS.fetch_add(1, Ordering::AcqRel);
}
