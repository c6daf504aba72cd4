//! The emit phase: the rows (winner, NCCL baseline and lower bound per size) and the plan
//! entries (runs of sizes with the same winner, each with a fitted cost and sealed as
//! verified).

use super::context::{Costed, Search};
use super::nccl::baseline_time;
use super::par::par_map;
use super::row::Row;
use crate::cost::bounds::bound;
use crate::cost::{Bound, NcclChoice};
use hccl_ir::{Collective, CostFit, PlanEntry, PlanFile};

/// The lower bound at every size of one collective, computed where refining or the rows
/// first need it.
pub(super) struct Bounds {
    collective: Collective,
    at: Vec<Option<Bound>>,
}

impl Bounds {
    pub(super) fn new(search: &Search<'_>, collective: Collective) -> Bounds {
        Bounds {
            collective,
            at: vec![None; search.sizes.len()],
        }
    }

    /// The bound at the `si`-th size.
    pub(super) fn at(&mut self, search: &Search<'_>, si: usize) -> Bound {
        *self.at[si].get_or_insert_with(|| {
            bound(
                &search.sim.network,
                &search.options.model,
                self.collective,
                search.sizes[si],
            )
        })
    }

    /// Computes the bounds not yet needed, side by side.
    fn fill(&mut self, search: &Search<'_>) {
        let missing: Vec<usize> = (0..self.at.len())
            .filter(|&si| self.at[si].is_none())
            .collect();
        let found = par_map(&missing, |&si| {
            bound(
                &search.sim.network,
                &search.options.model,
                self.collective,
                search.sizes[si],
            )
        });
        for (&si, b) in missing.iter().zip(found) {
            self.at[si] = Some(b);
        }
    }
}

/// The emit phase's rows: at every size the winner, NCCL's choice (its time ours or its
/// own formula, see [`baseline_time`]) and the lower bound; appended to `rows`. The third
/// argument is NCCL's choice at each size ([`nccl_choices`](super::nccl::nccl_choices)),
/// the families over the step cap, and those whose time is NCCL's formula
/// ([`modelled_baselines`](super::modelled_baselines)).
pub(super) fn rows(
    search: &Search<'_>,
    costed: &[Costed],
    winners: &[(usize, usize)],
    (nccl, capped, modelled): (&[Option<NcclChoice>], &[&str], &[&str]),
    bounds: &mut Bounds,
    rows: &mut Vec<Row>,
) {
    let options = search.options;
    let kind = bounds.collective.kind();
    // The bounds refining did not need, side by side.
    bounds.fill(search);
    for (si, &bytes) in search.sizes.iter().enumerate() {
        let (c, p) = winners[si];
        let cand = &costed[c].candidate;
        let predicted_us = costed[c].times[p].as_ref().map_or(f64::NAN, |t| t[si]);
        let baseline = nccl[si].and_then(|ch| {
            let best = options
                .protocols
                .iter()
                .position(|&q| q == ch.protocol)
                .map_or(f64::INFINITY, |pi| {
                    costed
                        .iter()
                        .filter(|c| c.candidate.algorithm == ch.algo.family())
                        .filter_map(|c| c.times[pi].as_ref().map(|t| t[si]))
                        .fold(f64::INFINITY, f64::min)
                });
            baseline_time(&ch, best, capped, modelled)
                .map(|(t, m)| (ch.algo.family().to_string(), ch.protocol, t, m))
        });
        let b: Bound = bounds.at(search, si);
        rows.push(Row {
            collective: kind,
            bytes,
            algorithm: cand.algorithm.clone(),
            params: cand.params,
            channels: cand.channel_count(),
            chunks: cand.schedule.chunks,
            protocol: options.protocols[p],
            predicted_us,
            baseline_algorithm: baseline.as_ref().map(|b| b.0.clone()),
            baseline_protocol: baseline.as_ref().map(|b| b.1),
            baseline_us: baseline.as_ref().map(|b| b.2),
            baseline_modelled: baseline.as_ref().is_some_and(|b| b.3),
            bound_us: b.total_us,
            nranks: search.topo.nranks(),
            synthesis: cand.synthesis.clone(),
        });
    }
}

/// The emit phase's plan entries: runs of sizes with the same winner merged into one entry
/// with a [`CostFit`] through its ends, each winner's schedule sealed as verified once (it
/// passed the verifier; a job loading the plan then skips verifying it). A template
/// candidate's entry holds the template (written in symmetric form). Returns how many
/// entries it added.
pub(super) fn entries(
    search: &Search<'_>,
    costed: &[Costed],
    winners: &[(usize, usize)],
    plan: &mut PlanFile,
) -> usize {
    let sizes = &search.sizes;
    let mut hashed: rustc_hash::FxHashMap<usize, hccl_ir::Seal> = Default::default();
    let mut added = 0;
    let mut start = 0;
    while start < sizes.len() {
        let mut end = start + 1;
        while end < sizes.len() && winners[end] == winners[start] {
            end += 1;
        }
        let (c, p) = winners[start];
        let times = costed[c].times[p].as_deref().unwrap_or(&[]);
        let cost = fit(sizes, times, start, end);
        let cand = &costed[c].candidate;
        let entry = PlanEntry {
            min_bytes: if start == 0 { 0 } else { sizes[start] },
            max_bytes: sizes.get(end).copied(),
            algorithm: cand.algorithm.clone(),
            protocol: search.options.protocols[p],
            cost,
            symmetry: cand.symmetry.clone(),
            synthesis: cand.synthesis.clone(),
            schedule: cand.schedule.clone(),
            template: cand.template.clone(),
        };
        let seal = hashed
            .entry(c)
            .or_insert_with(|| hccl_ir::seal_of(&entry))
            .clone();
        plan.add_seal(seal);
        plan.entries.push(entry);
        added += 1;
        start = end;
    }
    added
}

/// `latency + bytes / bandwidth` through the predictions at the two ends of `start..end`
/// (the next bucket's edge when the range has one size, the previous when it is the last).
pub(super) fn fit(sizes: &[u64], times: &[f64], start: usize, end: usize) -> Option<CostFit> {
    if times.len() != sizes.len() {
        return None;
    }
    // A neighbour outside the range may be below the candidate's least size (no time
    // there): then the range's own ends (one point: all bandwidth).
    let usable = |i: usize| times[i].is_finite() && times[i] > 0.0;
    let (i0, i1) = if end - start >= 2 {
        (start, end - 1)
    } else if end < sizes.len() && usable(end) {
        (start, end)
    } else if start > 0 && usable(start - 1) {
        (start - 1, start)
    } else {
        (start, start)
    };
    let (x0, x1) = (sizes[i0] as f64, sizes[i1] as f64);
    let (t0, t1) = (times[i0], times[i1]);
    if !(t0.is_finite() && t1.is_finite()) || t0 <= 0.0 {
        return None;
    }
    let slope = if x1 > x0 { (t1 - t0) / (x1 - x0) } else { 0.0 };
    let (latency_us, slope) = if slope > 0.0 && t0 - slope * x0 >= 0.0 {
        (t0 - slope * x0, slope)
    } else {
        // Flat or concave: all bandwidth, through the larger end.
        (0.0, t1.max(t0) / x1.max(x0).max(1.0))
    };
    Some(CostFit {
        latency_us,
        algbw_gbps: 1.0 / (slope * 1e3),
    })
}
