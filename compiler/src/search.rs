//! The search: for every collective and message-size bucket, the fastest verified schedule.
//!
//! For each collective, candidates are every built-in family ([`all_families`]) × its
//! parameter space, plus the external candidates of [`Options::extra`] (imported
//! algorithms, synthesizers). Each candidate schedule is generated once, flattened once
//! ([`Simulator::prepare`]) and simulated under each protocol at every bucket's lower edge.
//! Large schedules are simulated at a geometric subsample of the sizes and interpolated
//! linearly in between (see [`Options::sim_budget`]); small ones at every size.
//!
//! Winners are chosen by predicted time; ties go to the earlier candidate (family registry
//! order, then parameter order, then extras in the order given) and protocol (LL, LL128,
//! Simple), so the same input always gives a byte-identical plan. Every emitted schedule is
//! checked with [`hccl_ir::verify::verify`]; a candidate that fails is dropped and the buckets
//! it won are decided again. Adjacent buckets with the same winner become one [`PlanEntry`]
//! with a [`CostFit`] through the predictions at its ends. The first entry of a collective
//! starts at 0 bytes and the last is unbounded, so a plan answers every size.
//!
//! Rooted collectives (Broadcast, Reduce) are compiled for root 0.
//!
//! The NCCL baseline's schedules (`ring`, `tree`, `pairwise`) are candidates too, so a winner is
//! never slower than the baseline under the model.

use crate::cost::{
    Bound, CostModel, NcclTopo, Network, Prepared, Simulator, bounds::bound, device_models,
};
use crate::families::{Candidate, FamilyParams, all_families};
use hccl_ir::{
    Collective, CollectiveKind, CostFit, PlanEntry, PlanFile, PlanMeta, Protocol, Schedule,
};
use hccl_topologies::Topology;

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

/// One line of the compile table: the winner at one size, with the baseline and the bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub collective: CollectiveKind,
    /// Size (bytes, nccl-tests convention): the bucket's lower edge.
    pub bytes: u64,
    pub algorithm: String,
    pub params: FamilyParams,
    /// Channels the schedule uses.
    pub channels: u32,
    /// Chunks the buffer is cut into.
    pub chunks: u32,
    pub protocol: Protocol,
    /// Predicted time (µs).
    pub predicted_us: f64,
    /// NCCL's algorithm family (`None` when it is not available here).
    pub baseline_algorithm: Option<String>,
    /// Its protocol.
    pub baseline_protocol: Option<Protocol>,
    /// Its time in our model (µs).
    pub baseline_us: Option<f64>,
    /// Lower bound (µs).
    pub bound_us: f64,
    /// Number of ranks (for bus bandwidth).
    pub nranks: u32,
}

impl Row {
    /// Algorithm bandwidth (GB/s): bytes / time.
    pub fn algbw_gbps(&self) -> f64 {
        if self.predicted_us > 0.0 {
            self.bytes as f64 / (self.predicted_us * 1e3)
        } else {
            0.0
        }
    }

    /// Bus bandwidth (GB/s), nccl-tests convention.
    pub fn busbw_gbps(&self) -> f64 {
        self.algbw_gbps() * self.collective.busbw_factor(self.nranks)
    }

    /// Baseline time over ours (> 1 means we are faster).
    pub fn speedup(&self) -> Option<f64> {
        self.baseline_us
            .filter(|_| self.predicted_us > 0.0)
            .map(|b| b / self.predicted_us)
    }

    /// Our time over the lower bound (≥ 1).
    pub fn bound_ratio(&self) -> f64 {
        if self.bound_us > 0.0 {
            self.predicted_us / self.bound_us
        } else {
            1.0
        }
    }
}

/// The result of a compilation.
#[derive(Debug, Clone)]
pub struct CompiledPlan {
    pub plan: PlanFile,
    /// One row per collective and size, in [`Options::collectives`] × size order.
    pub rows: Vec<Row>,
}

/// Progress of a compilation, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub collective: CollectiveKind,
    /// Candidates costed so far for this collective.
    pub done: usize,
    /// Candidates of this collective.
    pub total: usize,
    /// Collectives finished before this one.
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
}

/// A costed candidate.
struct Costed {
    candidate: Candidate,
    /// Whether `--algo` allows it to win (baseline-only candidates do not).
    selectable: bool,
    /// `times[p][s]`: predicted µs under `protocols[p]` at `sizes[s]` (None: not costable).
    times: Vec<Option<Vec<f64>>>,
    verified: Option<bool>,
}

/// Compiles `topo` with `options`; no progress reporting.
pub fn compile(topo: &Topology, options: &Options) -> Result<CompiledPlan, SearchError> {
    compile_with_progress(topo, options, &mut |_| {})
}

/// Compiles `topo` with `options`, calling `progress` after each costed candidate.
pub fn compile_with_progress(
    topo: &Topology,
    options: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<CompiledPlan, SearchError> {
    if options.sizes.is_empty() {
        return Err(SearchError::BadOptions(
            "no message sizes to compile for".into(),
        ));
    }
    if options.protocols.is_empty() {
        return Err(SearchError::BadOptions(
            "no protocols to compile for".into(),
        ));
    }
    let mut sizes = options.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let families = all_families();
    if let Some(wanted) = &options.algorithms {
        for name in wanted {
            let known = families.iter().any(|f| f.name() == name)
                || options.extra.iter().any(|c| &c.algorithm == name);
            if !known {
                let mut names: Vec<&str> = families.iter().map(|f| f.name()).collect();
                names.extend(options.extra.iter().map(|c| c.algorithm.as_str()));
                return Err(SearchError::BadOptions(format!(
                    "unknown algorithm `{name}` (known: {})",
                    names.join(", ")
                )));
            }
        }
    }
    let allowed = |name: &str| {
        options
            .algorithms
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == name))
    };
    let sim = Simulator::new(Network::new(topo), options.model.clone());
    let nccl = NcclTopo::new(&sim.network, &device_models(topo));
    let nranks = topo.nranks();
    let mut plan = PlanFile::new(PlanMeta {
        topology: topo.name.clone(),
        topology_hash: topo.hash.clone(),
        compiler: format!("hcclc {}", env!("CARGO_PKG_VERSION")),
    });
    let mut rows = Vec::new();
    let ncoll = options.collectives.len();
    for (ci, &kind) in options.collectives.iter().enumerate() {
        let collective = collective_of(kind);
        // NCCL's families are generated even when --algo excludes them: they are the baseline.
        let baseline_names = ["ring", "tree", "pairwise"];
        let mut candidates: Vec<(Candidate, bool)> = Vec::new();
        let mut channels_hint = 1;
        for family in &families {
            if !family.supports(kind) {
                continue;
            }
            let selectable = allowed(family.name());
            if !selectable && !baseline_names.contains(&family.name()) {
                continue;
            }
            for params in family.param_space(topo, collective) {
                if family.name() == "ring" {
                    channels_hint = channels_hint.max(params.channels);
                }
                for c in family.generate(topo, collective, params) {
                    if c.schedule.collective == collective && c.schedule.nranks == nranks {
                        candidates.push((c, selectable));
                    }
                }
            }
        }
        for c in &options.extra {
            if c.schedule.collective == collective && c.schedule.nranks == nranks {
                candidates.push((c.clone(), allowed(&c.algorithm)));
            }
        }
        let total = candidates.len();
        let keep = screen(&sim, &candidates, &sizes, options, &baseline_names);
        let mut costed = Vec::with_capacity(total);
        for (i, (candidate, selectable)) in candidates.into_iter().enumerate() {
            let times = if keep[i] {
                cost_candidate(&sim, &candidate.schedule, &sizes, options)
            } else {
                vec![None; options.protocols.len()]
            };
            costed.push(Costed {
                candidate,
                selectable,
                times,
                verified: None,
            });
            progress(Progress {
                collective: kind,
                done: i + 1,
                total,
                collectives_done: ci,
                collectives_total: ncoll,
            });
        }
        // Winners per size, re-deciding when a winner fails verification.
        let winners = loop {
            let winners = pick_winners(&costed, &sizes, options.protocols.len());
            let mut all_ok = true;
            for &(c, _) in winners.iter().flatten() {
                if costed[c].verified.is_none() {
                    let ok = hccl_ir::verify::verify(&costed[c].candidate.schedule).is_ok();
                    costed[c].verified = Some(ok);
                    all_ok &= ok;
                }
            }
            if all_ok {
                break winners;
            }
        };
        let Some(winners) = winners.into_iter().collect::<Option<Vec<_>>>() else {
            return Err(SearchError::NoCandidate {
                collective: kind,
                topology: topo.name.clone(),
                tried: total,
            });
        };
        // Rows.
        for (si, &bytes) in sizes.iter().enumerate() {
            let (c, p) = winners[si];
            let cand = &costed[c].candidate;
            let predicted_us = costed[c].times[p].as_ref().map_or(f64::NAN, |t| t[si]);
            let choice = nccl.choose(kind, bytes, channels_hint, |name| {
                costed.iter().any(|c| c.candidate.algorithm == name)
            });
            let baseline = choice.and_then(|ch| {
                let pi = options.protocols.iter().position(|&q| q == ch.protocol)?;
                let best = costed
                    .iter()
                    .filter(|c| c.candidate.algorithm == ch.algo.family())
                    .filter_map(|c| c.times[pi].as_ref().map(|t| t[si]))
                    .fold(f64::INFINITY, f64::min);
                best.is_finite()
                    .then(|| (ch.algo.family().to_string(), ch.protocol, best))
            });
            let b: Bound = bound(&sim.network, &options.model, collective, bytes);
            rows.push(Row {
                collective: kind,
                bytes,
                algorithm: cand.algorithm.clone(),
                params: cand.params,
                channels: cand.schedule.channel_count(),
                chunks: cand.schedule.chunks,
                protocol: options.protocols[p],
                predicted_us,
                baseline_algorithm: baseline.as_ref().map(|b| b.0.clone()),
                baseline_protocol: baseline.as_ref().map(|b| b.1),
                baseline_us: baseline.as_ref().map(|b| b.2),
                bound_us: b.total_us,
                nranks,
            });
        }
        // Entries: merge runs of equal winners.
        let mut start = 0;
        while start < sizes.len() {
            let mut end = start + 1;
            while end < sizes.len() && winners[end] == winners[start] {
                end += 1;
            }
            let (c, p) = winners[start];
            let times = costed[c].times[p].as_deref().unwrap_or(&[]);
            let cost = fit(&sizes, times, start, end);
            plan.entries.push(PlanEntry {
                min_bytes: if start == 0 { 0 } else { sizes[start] },
                max_bytes: sizes.get(end).copied(),
                algorithm: costed[c].candidate.algorithm.clone(),
                protocol: options.protocols[p],
                cost,
                schedule: costed[c].candidate.schedule.clone(),
            });
            start = end;
        }
        progress(Progress {
            collective: kind,
            done: total,
            total,
            collectives_done: ci + 1,
            collectives_total: ncoll,
        });
    }
    Ok(CompiledPlan { plan, rows })
}

/// Rows for an existing plan on `topo`: for every collective the plan holds (root 0 for
/// rooted ones) and every size in `options.sizes` that an entry covers, the entry's schedule
/// simulated under its protocol, with the NCCL baseline and the lower bound.
pub fn evaluate_plan(
    topo: &Topology,
    plan: &PlanFile,
    options: &Options,
) -> Result<Vec<Row>, SearchError> {
    let mut sizes = options.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let sim = Simulator::new(Network::new(topo), options.model.clone());
    let nccl = NcclTopo::new(&sim.network, &device_models(topo));
    let nranks = topo.nranks();
    if let Some(e) = plan.entries.iter().find(|e| e.schedule.nranks != nranks) {
        return Err(SearchError::BadOptions(format!(
            "the plan's {} schedule is for {} ranks but topology {} has {nranks}",
            e.schedule.collective, e.schedule.nranks, topo.name
        )));
    }
    let families = all_families();
    let mut kinds: Vec<Collective> = plan.entries.iter().map(|e| e.schedule.collective).collect();
    kinds.sort();
    kinds.dedup();
    let mut rows = Vec::new();
    for collective in kinds {
        let kind = collective.kind();
        if !options.collectives.contains(&kind) {
            continue;
        }
        // Baseline candidates: NCCL's families.
        let mut base: Vec<(String, Vec<Option<Vec<f64>>>)> = Vec::new();
        let mut channels_hint = 1;
        for family in families
            .iter()
            .filter(|f| ["ring", "tree", "pairwise"].contains(&f.name()) && f.supports(kind))
        {
            for params in family.param_space(topo, collective) {
                if family.name() == "ring" {
                    channels_hint = channels_hint.max(params.channels);
                }
                for c in family.generate(topo, collective, params) {
                    let times = cost_candidate(&sim, &c.schedule, &sizes, options);
                    base.push((c.algorithm, times));
                }
            }
        }
        let mut prepared: Vec<Option<Prepared>> = vec![None; plan.entries.len()];
        for (si, &bytes) in sizes.iter().enumerate() {
            let Some(entry) = plan.lookup(collective, bytes, false) else {
                continue;
            };
            let ei = plan
                .entries
                .iter()
                .position(|e| std::ptr::eq(e, entry))
                .unwrap_or(0);
            if prepared[ei].is_none() {
                prepared[ei] = sim.prepare(&entry.schedule).ok();
            }
            let predicted_us = prepared[ei]
                .as_ref()
                .and_then(|p| sim.run(p, bytes, entry.protocol).ok())
                .map_or(f64::NAN, |e| e.time_us);
            let choice = nccl.choose(kind, bytes, channels_hint, |name| {
                base.iter().any(|(n, _)| n == name)
            });
            let baseline = choice.and_then(|ch| {
                let pi = options.protocols.iter().position(|&q| q == ch.protocol)?;
                let best = base
                    .iter()
                    .filter(|(n, _)| n == ch.algo.family())
                    .filter_map(|(_, t)| t[pi].as_ref().map(|t| t[si]))
                    .fold(f64::INFINITY, f64::min);
                best.is_finite()
                    .then(|| (ch.algo.family().to_string(), ch.protocol, best))
            });
            let b = bound(&sim.network, &options.model, collective, bytes);
            rows.push(Row {
                collective: kind,
                bytes,
                algorithm: entry.algorithm.clone(),
                params: FamilyParams {
                    channels: entry.schedule.channel_count(),
                    pipeline: 0,
                },
                channels: entry.schedule.channel_count(),
                chunks: entry.schedule.chunks,
                protocol: entry.protocol,
                predicted_us,
                baseline_algorithm: baseline.as_ref().map(|b| b.0.clone()),
                baseline_protocol: baseline.as_ref().map(|b| b.1),
                baseline_us: baseline.as_ref().map(|b| b.2),
                bound_us: b.total_us,
                nranks,
            });
        }
    }
    if rows.is_empty() && !plan.entries.is_empty() {
        return Err(SearchError::BadOptions(
            "the plan has no entry for the requested collectives and sizes".into(),
        ));
    }
    Ok(rows)
}

/// Best `(candidate, protocol)` per size among selectable, not-rejected candidates.
fn pick_winners(
    costed: &[Costed],
    sizes: &[u64],
    nprotocols: usize,
) -> Vec<Option<(usize, usize)>> {
    (0..sizes.len())
        .map(|si| {
            let mut best: Option<(f64, usize, usize)> = None;
            for (c, costed) in costed.iter().enumerate() {
                if !costed.selectable || costed.verified == Some(false) {
                    continue;
                }
                for p in 0..nprotocols {
                    let Some(t) = costed.times[p].as_ref().map(|t| t[si]) else {
                        continue;
                    };
                    if t.is_finite() && best.is_none_or(|(bt, _, _)| t < bt) {
                        best = Some((t, c, p));
                    }
                }
            }
            best.map(|(_, c, p)| (c, p))
        })
        .collect()
}

/// Rank count above which candidates are screened before they are fully costed.
pub const SCREEN_RANKS: u32 = 16;
/// A screened candidate is fully costed when it is within this factor of the best at one of
/// the probe sizes.
const SCREEN_FACTOR: f64 = 1.5;

/// Which candidates to cost at every size and protocol. On more than [`SCREEN_RANKS`] ranks
/// every candidate is first simulated at two probes (the smallest size under the first
/// protocol, the largest under the last: LL and Simple by default), and only those within
/// [`SCREEN_FACTOR`] of the best at a probe are kept; the NCCL baseline's families are always
/// kept (the baseline needs them). Large schedules of families that cannot win (all-pairs
/// meshes on many ranks) then cost two simulations instead of one per size and protocol.
fn screen(
    sim: &Simulator,
    candidates: &[(Candidate, bool)],
    sizes: &[u64],
    options: &Options,
    always: &[&str],
) -> Vec<bool> {
    let n = candidates.len();
    if sim.network.nranks() <= SCREEN_RANKS || n == 0 {
        return vec![true; n];
    }
    let (Some(&small), Some(&large)) = (sizes.first(), sizes.last()) else {
        return vec![true; n];
    };
    let (Some(&p_small), Some(&p_large)) = (options.protocols.first(), options.protocols.last())
    else {
        return vec![true; n];
    };
    let probes: Vec<[f64; 2]> = candidates
        .iter()
        .map(|(c, _)| {
            let Ok(prep) = sim.prepare(&c.schedule) else {
                return [f64::INFINITY; 2];
            };
            let at = |bytes, p| {
                sim.run(&prep, bytes, p)
                    .map_or(f64::INFINITY, |e| e.time_us)
            };
            [at(small, p_small), at(large, p_large)]
        })
        .collect();
    let best = |k: usize| probes.iter().map(|p| p[k]).fold(f64::INFINITY, f64::min);
    let (b0, b1) = (best(0), best(1));
    candidates
        .iter()
        .zip(&probes)
        .map(|((c, _), p)| {
            always.contains(&c.algorithm.as_str())
                || p[0] <= b0 * SCREEN_FACTOR
                || p[1] <= b1 * SCREEN_FACTOR
        })
        .collect()
}

/// Predicted times of one schedule at every size, per protocol.
fn cost_candidate(
    sim: &Simulator,
    schedule: &Schedule,
    sizes: &[u64],
    options: &Options,
) -> Vec<Option<Vec<f64>>> {
    let Ok(prepared) = sim.prepare(schedule) else {
        return vec![None; options.protocols.len()];
    };
    let samples = sample_indices(sizes.len(), prepared.step_count(), options.sim_budget);
    options
        .protocols
        .iter()
        .map(|&p| times_at(sim, &prepared, p, sizes, &samples))
        .collect()
}

fn times_at(
    sim: &Simulator,
    prepared: &Prepared,
    protocol: Protocol,
    sizes: &[u64],
    samples: &[usize],
) -> Option<Vec<f64>> {
    let mut at = Vec::with_capacity(samples.len());
    for &i in samples {
        at.push((i, sim.run(prepared, sizes[i], protocol).ok()?.time_us));
    }
    let mut out = Vec::with_capacity(sizes.len());
    let mut k = 0;
    for (i, &bytes) in sizes.iter().enumerate() {
        while k + 1 < at.len() && at[k + 1].0 <= i {
            k += 1;
        }
        let (i0, t0) = at[k];
        if i0 == i || k + 1 >= at.len() {
            out.push(t0);
        } else {
            let (i1, t1) = at[k + 1];
            let (x0, x1) = (sizes[i0] as f64, sizes[i1] as f64);
            out.push(t0 + (t1 - t0) * (bytes as f64 - x0) / (x1 - x0));
        }
    }
    Some(out)
}

/// Which size indices to simulate: all when `steps × n ≤ budget`, else an even subsample
/// that always contains the first and the last.
fn sample_indices(n: usize, steps: usize, budget: usize) -> Vec<usize> {
    let affordable = (budget / steps.max(1)).max(2);
    if n <= affordable {
        return (0..n).collect();
    }
    let k = affordable;
    let mut idx: Vec<usize> = (0..k).map(|j| j * (n - 1) / (k - 1)).collect();
    idx.dedup();
    idx
}

/// `latency + bytes / bandwidth` through the predictions at the two ends of `start..end`
/// (the next bucket's edge when the range has one size, the previous when it is the last).
fn fit(sizes: &[u64], times: &[f64], start: usize, end: usize) -> Option<CostFit> {
    if times.len() != sizes.len() {
        return None;
    }
    let (i0, i1) = if end - start >= 2 {
        (start, end - 1)
    } else if end < sizes.len() {
        (start, end)
    } else if start > 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_sizes_include_both_ends() {
        assert_eq!(geometric_sizes(1024, 8192, 2), vec![1024, 2048, 4096, 8192]);
        assert_eq!(geometric_sizes(1024, 1000, 2), vec![1024]);
        assert_eq!(geometric_sizes(1, u64::MAX, 2).len(), 64);
    }

    #[test]
    fn subsampling_keeps_the_ends() {
        assert_eq!(sample_indices(5, 10, 1000), vec![0, 1, 2, 3, 4]);
        let s = sample_indices(23, 100_000, 400_000);
        assert_eq!(s.first(), Some(&0));
        assert_eq!(s.last(), Some(&22));
        assert_eq!(s.len(), 4);
        assert_eq!(sample_indices(23, usize::MAX, 1).len(), 2);
    }

    #[test]
    fn fit_passes_through_the_range_ends() {
        let sizes = [1000, 2000, 4000];
        let times = [11.0, 12.0, 14.0];
        let f = fit(&sizes, &times, 0, 3).unwrap();
        assert!((f.latency_us - 10.0).abs() < 1e-9);
        assert!((f.predict_us(4000) - 14.0).abs() < 1e-9);
        // One-size last range uses the previous point.
        let g = fit(&sizes, &times, 2, 3).unwrap();
        assert!((g.predict_us(2000) - 12.0).abs() < 1e-9);
    }
}
