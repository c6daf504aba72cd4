//! The screen phase: on more than [`SCREEN_RANKS`] ranks, every candidate at two probe sizes,
//! and only those near the best at either costed in full.

use super::context::Search;
use super::options::Options;
use super::par::par_map;
use super::ready::Ready;
use super::report::{StopReason, trace_candidate};
use crate::cost::{Simulator, runs_for};
use crate::families::Candidate;

/// The screen phase: which of `candidates` to cost in full (see [`screen`]); the NCCL
/// baseline's `simulated` families are always kept. Also returns what stopped the others.
pub(super) fn run(
    search: &Search<'_>,
    candidates: &[(Candidate, bool)],
    simulated: &[&str],
) -> (Vec<Probe>, Vec<(StopReason, usize)>) {
    let probes = screen(
        &search.sim,
        candidates,
        &search.sizes,
        search.options,
        simulated,
    );
    let pruned = probes.iter().filter(|p| p.pruned).count();
    let dropped = probes.iter().filter(|p| !p.keep).count();
    let stops = vec![
        (StopReason::PrunedByBound, pruned),
        (StopReason::ScreenedOut, dropped - pruned),
    ];
    (probes, stops)
}

/// Rank count above which candidates are screened before they are fully costed.
pub const SCREEN_RANKS: u32 = 16;
/// A screened candidate is fully costed when it is within this factor of the best at one of
/// the probe sizes.
const SCREEN_FACTOR: f64 = 1.5;

/// The screen's verdict on one candidate.
pub(super) struct Probe {
    /// Whether to cost the candidate at every size.
    pub(super) keep: bool,
    /// Whether it was dropped before routing: its route-free bound was past both limits.
    pub(super) pruned: bool,
    /// Times already simulated: `(size index, protocol index, µs)`.
    pub(super) known: Vec<(usize, usize, f64)>,
    /// The schedule as the screen prepared it (flattened and routed), when it was kept.
    pub(super) ready: Option<Ready>,
    /// Seconds its probes took (0 unscreened): how dear its runs are, for ordering work.
    pub(super) secs: f64,
}

/// One candidate's probes: their times, its prepared schedule (when one came in within its
/// limit), whether a bound pruned it before routing, and the seconds they took.
type Probed = ([f64; 2], Option<Ready>, bool, f64);

/// Which candidates to cost at every size and protocol. On more than [`SCREEN_RANKS`] ranks
/// every candidate is first simulated at two probes (the smallest size under the first
/// protocol, the largest under the last: LL and Simple by default), and only those within
/// [`SCREEN_FACTOR`] of the best at a probe are kept; the NCCL baseline's families are always
/// kept (the baseline needs them). Large schedules of families that cannot win (all-pairs
/// meshes on many ranks) then cost two simulations instead of one per size and protocol.
/// The probes' times are handed on, so a kept candidate is not simulated there again.
///
/// The screen runs in two waves. The first simulates the candidates that are cheap to run
/// (templates, costed as one rank class) and those kept anyway (the baseline's), in full.
/// The second simulates the others only up to [`SCREEN_FACTOR`] × the first wave's best at
/// each probe ([`Simulator::run_within`](crate::cost::Simulator::run_within)): a run past that limit would not be kept whatever
/// the second wave finds (the best only gets lower), so it stops there. The verdicts are
/// those of running every candidate in full; only the losers' runs are shorter (a k-ary
/// tree on 4096 ranks stops after a small part of its run).
pub(super) fn screen(
    sim: &Simulator,
    candidates: &[(Candidate, bool)],
    sizes: &[u64],
    options: &Options,
    always: &[&str],
) -> Vec<Probe> {
    let n = candidates.len();
    let keep_all = || {
        (0..n)
            .map(|_| Probe {
                keep: true,
                pruned: false,
                known: Vec::new(),
                ready: None,
                secs: 0.0,
            })
            .collect()
    };
    if sim.network.nranks() <= SCREEN_RANKS || n == 0 {
        return keep_all();
    }
    let (Some(&small), Some(&large)) = (sizes.first(), sizes.last()) else {
        return keep_all();
    };
    let (Some(&p_small), Some(&p_large)) = (options.protocols.first(), options.protocols.last())
    else {
        return keep_all();
    };
    let (last_size, last_proto) = (sizes.len() - 1, options.protocols.len() - 1);
    let kept_anyway = |c: &Candidate| always.contains(&c.algorithm.as_str());
    let first_wave = |c: &Candidate| c.template.is_some() || kept_anyway(c);
    // Both probes of one candidate, each run given up past its limit; the prepared schedule
    // when a probe came in within its limit (costing then starts from it).
    let probe = |c: &Candidate, limits: [f64; 2]| -> Probed {
        runs_for("screen");
        let started = std::time::Instant::now();
        let secs = || started.elapsed().as_secs_f64();
        let lost = ([f64::INFINITY; 2], None, false, 0.0);
        // Probes a route-free lower bound already puts past their limit are not run (the run
        // would stop past the limit all the same).
        let mut past = [false; 2];
        let prep = if limits.iter().any(|l| l.is_finite()) && c.template.is_none() {
            // Its critical path first: past both limits, its routes are never looked up.
            let Ok(unrouted) = sim.unrouted(&c.schedule) else {
                return lost;
            };
            let bound = [
                if small >= c.min_bytes {
                    unrouted.bound_us(sim, small, p_small)
                } else {
                    f64::INFINITY
                },
                unrouted.bound_us(sim, large, p_large),
            ];
            past = [bound[0] > limits[0], bound[1] > limits[1]];
            if past == [true; 2] {
                let shown = format!(
                    " (bounds {:.1} µs, {:.1} µs past the limits)",
                    bound[0], bound[1]
                );
                trace_candidate("screen", c, started, &shown);
                return ([f64::INFINITY; 2], None, true, secs());
            }
            match unrouted.route(sim) {
                Ok(p) => Ready::Full(Box::new(p)),
                Err(_) => return lost,
            }
        } else {
            match Ready::new(sim, c) {
                Ok(p) => p,
                Err(_) => return lost,
            }
        };
        let small_time = if small >= c.min_bytes && !past[0] {
            prep.time_within(sim, small, p_small, limits[0])
        } else {
            f64::INFINITY
        };
        // Kept for its small probe: its large probe is wanted in full (costing reuses it).
        let large_limit = if small_time.is_finite() {
            f64::INFINITY
        } else {
            limits[1]
        };
        let large_time = if past[1] && small_time.is_infinite() {
            f64::INFINITY
        } else {
            prep.time_within(sim, large, p_large, large_limit)
        };
        let times = [small_time, large_time];
        let shown = format!(" ({:.1} µs, {:.1} µs at the probes)", times[0], times[1]);
        trace_candidate("screen", c, started, &shown);
        let keep_ready = times.iter().any(|t| t.is_finite());
        (times, keep_ready.then_some(prep), false, secs())
    };
    let wave = |first: bool| -> Vec<usize> {
        (0..n)
            .filter(|&i| first_wave(&candidates[i].0) == first)
            .collect()
    };
    let mut got: Vec<Probed> = (0..n)
        .map(|_| ([f64::INFINITY; 2], None, false, 0.0))
        .collect();
    let first = wave(true);
    for (&i, out) in first.iter().zip(par_map(&first, |&i| {
        probe(&candidates[i].0, [f64::INFINITY; 2])
    })) {
        got[i] = out;
    }
    let best = |got: &[Probed], k: usize| got.iter().map(|g| g.0[k]).fold(f64::INFINITY, f64::min);
    let limits = [best(&got, 0) * SCREEN_FACTOR, best(&got, 1) * SCREEN_FACTOR];
    let second = wave(false);
    for (&i, out) in second
        .iter()
        .zip(par_map(&second, |&i| probe(&candidates[i].0, limits)))
    {
        got[i] = out;
    }
    let (b0, b1) = (best(&got, 0), best(&got, 1));
    candidates
        .iter()
        .zip(got)
        .map(|((c, _), (p, ready, pruned, secs))| {
            let keep = kept_anyway(c) || p[0] <= b0 * SCREEN_FACTOR || p[1] <= b1 * SCREEN_FACTOR;
            Probe {
                keep,
                pruned: pruned && !keep,
                known: [(0, 0, p[0]), (last_size, last_proto, p[1])]
                    .into_iter()
                    .filter(|k| k.2.is_finite())
                    .collect(),
                ready: if keep { ready } else { None },
                secs,
            }
        })
        .collect()
}
