//! The cost phase: every kept candidate at every size and protocol, within the
//! per-candidate simulation budget ([`sim_budget`]), interpolated between sampled sizes
//! beyond it.

use super::context::{Costed, Search};
use super::options::{Options, Progress};
use super::par::par_map;
use super::ready::Ready;
use super::report::{Counts, StopReason, trace_candidate, tracing};
use super::screen::Probe;
use crate::cost::Simulator;
use crate::families::Candidate;
use hccl_ir::CollectiveKind;

/// Where the cost phase reports progress: after each costed candidate, as
/// `(candidates done, candidates in all)` of the collective `kind`, the `index`-th of the
/// options' collectives.
pub(super) struct Tick<'p> {
    pub(super) kind: CollectiveKind,
    pub(super) index: usize,
    pub(super) progress: &'p mut dyn FnMut(Progress),
}

/// The cost phase: the candidates the screen kept costed (NCCL's `simulated` families at
/// every protocol), the others with no time; in candidate order, reporting progress after
/// each. `None` when cancelled. Also returns what stopped candidates.
pub(super) fn run(
    search: &Search<'_>,
    candidates: Vec<(Candidate, bool)>,
    probes: &[Probe],
    simulated: &[&str],
    budget: usize,
    tick: Tick<'_>,
) -> Option<(Vec<Costed>, Counts)> {
    let options = search.options;
    let sizes = &search.sizes;
    let indexed: Vec<(usize, &Candidate)> = candidates.iter().map(|(c, _)| c).enumerate().collect();
    let mut all_times = par_map(&indexed, |&(i, candidate)| {
        if probes[i].keep && !options.cancelled() {
            let started = std::time::Instant::now();
            let (times, exact) = cost_sampled(
                &search.sim,
                candidate,
                sizes,
                options,
                budget,
                Some(&probes[i]),
                !simulated.iter().any(|b| candidate.algorithm == *b),
            );
            let shown = if tracing() {
                let best = times
                    .iter()
                    .flatten()
                    .flatten()
                    .fold(f64::INFINITY, |a, &b| a.min(b));
                format!(", best {best:.2} us")
            } else {
                String::new()
            };
            trace_candidate("cost", candidate, started, &shown);
            (times, exact)
        } else {
            (vec![None; options.protocols.len()], vec![true; sizes.len()])
        }
    })
    .into_iter();
    if options.cancelled() {
        return None;
    }
    let total = candidates.len();
    let mut costed = Vec::with_capacity(total);
    for (i, (candidate, selectable)) in candidates.into_iter().enumerate() {
        let (times, exact) = all_times.next().unwrap_or_default();
        costed.push(Costed {
            candidate,
            selectable,
            times,
            exact,
            verified: None,
        });
        (tick.progress)(Progress {
            collective: tick.kind,
            done: i + 1,
            total,
            collectives_done: tick.index,
            collectives_total: options.collectives.len(),
        });
    }
    let kept: Vec<&Costed> = costed
        .iter()
        .zip(probes)
        .filter(|(_, p)| p.keep)
        .map(|(c, _)| c)
        .collect();
    let interpolated = kept.iter().filter(|c| c.exact.contains(&false)).count();
    let not_costable = kept
        .iter()
        .filter(|c| !c.times.iter().flatten().flatten().any(|t| t.is_finite()))
        .count();
    let stops = vec![
        (StopReason::SimBudget, interpolated),
        (StopReason::NotCostable, not_costable),
    ];
    Some((costed, stops))
}

/// Rank count above which the per-candidate simulation budget shrinks (see [`sim_budget`]).
pub const SCALE_RANKS: u32 = 64;

/// The simulated-steps budget per candidate and protocol on `nranks` ranks: `budget` up to
/// [`SCALE_RANKS`] ranks, then shrinking as `1/nranks` (a schedule's step count grows at least
/// linearly with the ranks, so this keeps the number of simulations per candidate roughly
/// constant while each costs more); large schedules are then simulated at fewer sizes and
/// interpolated.
pub fn sim_budget(budget: usize, nranks: u32) -> usize {
    if nranks <= SCALE_RANKS {
        budget
    } else {
        budget.saturating_mul(SCALE_RANKS as usize) / nranks as usize
    }
}

/// Predicted times of one candidate at every size, per protocol, simulating at most
/// `budget` steps per protocol (see [`sample_indices`]); what the screen found (`screened`:
/// the times it simulated, used instead of simulating again, and the schedule as it prepared
/// it) is reused. Sizes below the candidate's
/// [`Candidate::min_bytes`] are not simulated and get an infinite time.
/// Also returns, per size, whether its times were simulated (or are known, or cannot be
/// had: below the candidate's least size) rather than interpolated.
pub(super) fn cost_sampled(
    sim: &Simulator,
    candidate: &Candidate,
    sizes: &[u64],
    options: &Options,
    budget: usize,
    screened: Option<&Probe>,
    prune: bool,
) -> (Vec<Option<Vec<f64>>>, Vec<bool>) {
    let known: &[(usize, usize, f64)] = screened.map_or(&[], |p| &p.known);
    let ready = screened.and_then(|p| p.ready.as_ref());
    let np = options.protocols.len();
    let first = sizes.partition_point(|&s| s < candidate.min_bytes);
    if first == sizes.len() {
        return (vec![None; np], vec![true; sizes.len()]);
    }
    let owned;
    let prepared = match ready {
        Some(r) => r,
        None => match Ready::new(sim, candidate) {
            Ok(r) => {
                owned = r;
                &owned
            }
            Err(_) => return (vec![None; np], vec![true; sizes.len()]),
        },
    };
    // A template costs one rank class: its steps do not grow with the ranks as a whole
    // schedule's do, so the budget does not shrink with them either (see `sim_budget`).
    let budget = match *prepared {
        Ready::Template(_) => budget.max(options.sim_budget),
        Ready::Full(_) => budget,
    };
    let samples: Vec<usize> = sample_indices(sizes.len() - first, prepared.step_count(), budget)
        .into_iter()
        .map(|i| i + first)
        .collect();
    // Protocols by falling efficiency: with `prune`, a protocol whose lower bound (the
    // busiest link at its efficiency, [`Simulator::lower_bound_us`]) already exceeds the
    // best time this candidate reached at a size is not simulated there; it cannot be the
    // candidate's best, and the baseline families (whose per-protocol times NCCL's choice
    // reads) are never pruned.
    let mut order: Vec<usize> = (0..np).collect();
    order.sort_by(|&a, &b| {
        sim.model
            .efficiency(options.protocols[b])
            .total_cmp(&sim.model.efficiency(options.protocols[a]))
    });
    // Times at the sampled sizes, per protocol; `None` once a protocol fails to simulate.
    let mut at: Vec<Option<Vec<(usize, f64)>>> = vec![Some(Vec::new()); np];
    for &si in &samples {
        let mut best = f64::INFINITY;
        let mut loads: Option<Vec<f64>> = None;
        for &pi in &order {
            let p = options.protocols[pi];
            let Some(list) = at[pi].as_mut() else {
                continue;
            };
            let t = if let Some(k) = known.iter().find(|&&(ks, kp, _)| ks == si && kp == pi) {
                k.2
            } else if prune
                && let Some(loads) = &loads
                && sim
                    .lower_bound_us(loads, sizes[si], p)
                    .is_some_and(|lb| lb > best)
            {
                f64::INFINITY
            } else {
                match prepared.run(sim, sizes[si], p) {
                    Ok(e) => {
                        if loads.is_none() {
                            loads = Some(e.resource_bytes);
                        }
                        e.time_us
                    }
                    Err(_) => {
                        at[pi] = None;
                        continue;
                    }
                }
            };
            best = best.min(t);
            list.push((si, t));
        }
    }
    let mut exact = vec![false; sizes.len()];
    exact[..first].fill(true);
    for &i in &samples {
        exact[i] = true;
    }
    let times = at
        .into_iter()
        .map(|list| list.map(|list| interpolate(sizes, &list)))
        .collect();
    (times, exact)
}

/// Times at every size from times at sampled size indices (ascending): linear in bytes
/// between samples; infinite outside them and where either end is infinite.
pub(super) fn interpolate(sizes: &[u64], at: &[(usize, f64)]) -> Vec<f64> {
    let mut out = vec![f64::INFINITY; sizes.len()];
    for (k, &(i0, t0)) in at.iter().enumerate() {
        out[i0] = t0;
        let Some(&(i1, t1)) = at.get(k + 1) else {
            continue;
        };
        if !(t0.is_finite() && t1.is_finite()) {
            continue;
        }
        let (x0, x1) = (sizes[i0] as f64, sizes[i1] as f64);
        for i in i0 + 1..i1 {
            out[i] = t0 + (t1 - t0) * (sizes[i] as f64 - x0) / (x1 - x0);
        }
    }
    out
}

/// Which size indices to simulate: all when `steps × n ≤ budget`, else an even subsample
/// that always contains the first and the last.
pub(super) fn sample_indices(n: usize, steps: usize, budget: usize) -> Vec<usize> {
    let affordable = (budget / steps.max(1)).max(2);
    if n <= affordable {
        return (0..n).collect();
    }
    let k = affordable;
    let mut idx: Vec<usize> = (0..k).map(|j| j * (n - 1) / (k - 1)).collect();
    idx.dedup();
    idx
}
