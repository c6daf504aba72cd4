//! The search: for every collective and message-size bucket, the fastest verified schedule.
//!
//! For each collective, candidates are every built-in family ([`all_families`]) × its
//! parameter space, plus the external candidates of [`Options::extra`] (imported
//! algorithms, synthesizers). Each candidate schedule is generated once, flattened once
//! ([`Simulator::prepare`]) and simulated under each protocol at every bucket's lower edge.
//! Large schedules are simulated at a geometric subsample of the sizes and interpolated
//! linearly in between (see [`Options::sim_budget`]); small ones at every size. Where an
//! interpolated time is close to a size's best, the size is simulated after all before the
//! winner is picked (`refine`), so a chord across sizes far apart does not decide it.
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
//! never slower than the baseline under the model, as long as those schedules fit
//! [`MAX_CANDIDATE_STEPS`]. Schedules over that cap (ranks² families on large topologies,
//! e.g. the ring from about 512 ranks) are not generated; where NCCL's chosen family was
//! capped, the baseline's time is NCCL's own predicted time ([`NcclTopo::predict`]) and the
//! winner is compared with that (it can then be slower). So it is where even the family's
//! cheapest schedule is too large to simulate at [`BASELINE_MIN_SAMPLES`] sizes within the
//! per-candidate budget ([`modelled_baselines`]: the double binary tree from about 2048
//! ranks): its schedules then still compete, screened like any other family's, but the
//! baseline is NCCL's formula, marked as such in the rows ([`Row::baseline_modelled`]).
//!
//! Candidates are costed and winners verified on all available cores; results are collected
//! in candidate order, so the plan does not depend on the thread count.

mod nccl;
mod registry;

pub use nccl::{baseline, nccl_channels};
pub use registry::{all_families, families_for, generate_with};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::cost::{
    Bound, CostError, CostModel, Estimate, NcclChoice, NcclTopo, Network, Prepared,
    PreparedSymmetric, Simulator, bounds::bound, device_models,
};
use crate::families::{Candidate, Family, FamilyParams, TEMPLATE_RANKS};
use crate::synth::SynthLevel;
use hccl_ir::{
    Collective, CollectiveKind, CostFit, PlanEntry, PlanFile, PlanMeta, Protocol, Synthesis,
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
    /// Which synthesizers compete ([`SynthLevel`]).
    pub synth: SynthLevel,
    /// A collective no candidate schedules is left out of the plan (and listed in
    /// [`CompiledPlan::skipped`]) instead of failing the whole compile.
    pub partial: bool,
    /// Set from elsewhere (another thread, a signal handler) to stop the compile: it returns
    /// [`SearchError::Cancelled`] at the next phase boundary, and skips the candidates of the
    /// current phase not yet started. `None`: runs to the end.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Options {
    /// Whether [`Options::cancel`] is set.
    pub fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn check_cancel(&self) -> Result<(), SearchError> {
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
    /// Whether `baseline_us` is NCCL's own tuning-model time ([`NcclChoice::nccl_model_us`])
    /// rather than our simulation of its algorithm: where its family was over the step cap
    /// or too large to simulate at enough sizes ([`modelled_baselines`]).
    pub baseline_modelled: bool,
    /// Lower bound (µs).
    pub bound_us: f64,
    /// Number of ranks (for bus bandwidth).
    pub nranks: u32,
    /// How a synthesizer found the schedule, when one did.
    pub synthesis: Option<Synthesis>,
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
    /// With [`Options::partial`]: the collectives left out, each with why.
    pub skipped: Vec<SearchError>,
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
    /// [`Options::cancel`] was set.
    #[error("compilation cancelled")]
    Cancelled,
}

/// A costed candidate.
struct Costed {
    candidate: Candidate,
    /// Whether `--algo` allows it to win (baseline-only candidates do not).
    selectable: bool,
    /// `times[p][s]`: predicted µs under `protocols[p]` at `sizes[s]` (None: not costable).
    times: Vec<Option<Vec<f64>>>,
    /// `exact[s]`: whether `times[·][s]` were simulated rather than interpolated.
    exact: Vec<bool>,
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
    // Only the protocols the target's executor implements compete.
    let offered: Vec<Protocol> = options
        .protocols
        .iter()
        .copied()
        .filter(|&p| options.model.offers(p))
        .collect();
    if offered.is_empty() {
        let names: Vec<&str> = options.protocols.iter().map(|p| p.name()).collect();
        return Err(SearchError::BadOptions(format!(
            "none of the protocols {} runs on this target (it offers {})",
            names.join(", "),
            Protocol::ALL
                .iter()
                .filter(|&&p| options.model.offers(p))
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let owned;
    let options = if offered.len() == options.protocols.len() {
        options
    } else {
        owned = Options {
            protocols: offered,
            ..options.clone()
        };
        &owned
    };
    let mut sizes = options.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let families = families_for(options.synth);
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
    let mut skipped = Vec::new();
    let ncoll = options.collectives.len();
    for (ci, &kind) in options.collectives.iter().enumerate() {
        options.check_cancel()?;
        let mut phase = Phase::start(kind);
        let collective = collective_of(kind);
        // NCCL's families are generated even when --algo excludes them: they are the baseline.
        let baseline_names = BASELINE_FAMILIES;
        let mut candidates: Vec<(Candidate, bool)> = Vec::new();
        let mut channels_hint = 1;
        // Baseline families some of whose schedules were over the step cap.
        let mut capped: Vec<&str> = Vec::new();
        // Families generate side by side (each is deterministic; results in family order).
        let wanted: Vec<&dyn Family> = families
            .iter()
            .map(|f| f.as_ref())
            .filter(|f| {
                f.supports(kind) && (allowed(f.name()) || baseline_names.contains(&f.name()))
            })
            .collect();
        let generated_all = par_map(&wanted, |f| {
            if options.cancelled() {
                return Generated::default();
            }
            generate_capped(*f, topo, collective)
        });
        options.check_cancel()?;
        for (family, generated) in wanted.iter().zip(generated_all) {
            let selectable = allowed(family.name());
            if family.name() == "ring" {
                channels_hint = channels_hint.max(generated.max_channels);
            }
            if generated.capped {
                capped.push(family.name());
            }
            for c in generated.candidates {
                if c.schedule.collective == collective && c.schedule.nranks == nranks {
                    candidates.push((c, selectable));
                }
            }
        }
        for c in &options.extra {
            if c.schedule.collective == collective && c.schedule.nranks == nranks {
                candidates.push((c.clone(), allowed(&c.algorithm)));
            }
        }
        // Nothing selectable under the step cap (an AllGather on a thousand ranks: every
        // block reaches every rank by a message of its own somewhere): each capped family's
        // smallest parameter set, up to the fallback cap, rather than no plan at all.
        if !candidates.iter().any(|(_, selectable)| *selectable) {
            for family in &families {
                if family.supports(kind)
                    && allowed(family.name())
                    && capped.contains(&family.name())
                {
                    for c in generate_smallest(family.as_ref(), topo, collective) {
                        if c.schedule.collective == collective && c.schedule.nranks == nranks {
                            candidates.push((c, true));
                        }
                    }
                }
            }
        }
        let total = candidates.len();
        phase.done("generate");
        let budget = sim_budget(options.sim_budget, nranks);
        let modelled =
            modelled_baselines(candidates.iter().map(|(c, _)| c), &sizes, options, budget);
        // The baseline's simulated families: kept by the screen and costed at every
        // protocol whatever their times (NCCL's choice reads them).
        let simulated: Vec<&str> = baseline_names
            .iter()
            .copied()
            .filter(|name| !modelled.contains(name))
            .collect();
        let probes = screen(&sim, &candidates, &sizes, options, &simulated);
        options.check_cancel()?;
        phase.done("screen");
        let indexed: Vec<(usize, &Candidate)> =
            candidates.iter().map(|(c, _)| c).enumerate().collect();
        let mut all_times = par_map(&indexed, |&(i, candidate)| {
            if probes[i].keep && !options.cancelled() {
                let started = std::time::Instant::now();
                let (times, exact) = cost_sampled(
                    &sim,
                    candidate,
                    &sizes,
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
        options.check_cancel()?;
        phase.done("cost");
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
            progress(Progress {
                collective: kind,
                done: i + 1,
                total,
                collectives_done: ci,
                collectives_total: ncoll,
            });
        }
        // Lower bounds per size, computed where refining or the rows first need them.
        let mut bounds: Vec<Option<Bound>> = vec![None; sizes.len()];
        let bound_at = |si: usize| bound(&sim.network, &options.model, collective, sizes[si]);
        refine(
            &sim,
            &mut costed,
            &sizes,
            options,
            REFINE_BUDGET * budget,
            &mut |si| bounds[si].get_or_insert_with(|| bound_at(si)).total_us,
        );
        phase.done("refine");
        // Winners per size, re-deciding when a winner fails verification.
        let winners = loop {
            let winners = pick_winners(&costed, &sizes, options.protocols.len());
            let mut todo: Vec<usize> = winners
                .iter()
                .flatten()
                .map(|&(c, _)| c)
                .filter(|&c| costed[c].verified.is_none())
                .collect();
            todo.sort_unstable();
            todo.dedup();
            let results = par_map(&todo, |&c| costed[c].candidate.verify().is_ok());
            let mut all_ok = true;
            for (&c, ok) in todo.iter().zip(results) {
                costed[c].verified = Some(ok);
                all_ok &= ok;
            }
            if all_ok {
                break winners;
            }
        };
        if let Some(si) = winners.iter().position(Option::is_none) {
            // A size below the least size of every selectable candidate (deep synthesized
            // pipelines start at some size) is an option the user can change.
            let bytes = sizes[si];
            let selectable: Vec<&Costed> = costed.iter().filter(|c| c.selectable).collect();
            if !selectable.is_empty() && selectable.iter().all(|c| c.candidate.min_bytes > bytes) {
                let least = selectable
                    .iter()
                    .map(|c| c.candidate.min_bytes)
                    .min()
                    .unwrap_or(0);
                return Err(SearchError::BadOptions(format!(
                    "{kind} at {bytes} B: every allowed candidate starts at a larger size (the \
                     least at {least} B); allow more algorithms (--algo) or start --sizes there"
                )));
            }
        }
        let Some(winners) = winners.into_iter().collect::<Option<Vec<_>>>() else {
            let err = SearchError::NoCandidate {
                collective: kind,
                topology: topo.name.clone(),
                tried: total,
            };
            if options.partial {
                skipped.push(err);
                continue;
            }
            return Err(err);
        };
        phase.done("verify");
        // The bounds refining did not need, side by side.
        let missing: Vec<usize> = (0..sizes.len())
            .filter(|&si| bounds[si].is_none())
            .collect();
        for (&si, b) in missing.iter().zip(par_map(&missing, |&si| bound_at(si))) {
            bounds[si] = Some(b);
        }
        // Rows.
        for (si, &bytes) in sizes.iter().enumerate() {
            let (c, p) = winners[si];
            let cand = &costed[c].candidate;
            let predicted_us = costed[c].times[p].as_ref().map_or(f64::NAN, |t| t[si]);
            let choice = nccl.choose(kind, bytes, channels_hint, |name| {
                capped.contains(&name) || costed.iter().any(|c| c.candidate.algorithm == name)
            });
            let baseline = choice.and_then(|ch| {
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
                baseline_time(&ch, best, &capped, &modelled)
                    .map(|(t, m)| (ch.algo.family().to_string(), ch.protocol, t, m))
            });
            let b: Bound = *bounds[si].get_or_insert_with(|| bound_at(si));
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
                nranks,
                synthesis: cand.synthesis.clone(),
            });
        }
        phase.done("rows and bounds");
        // Entries: merge runs of equal winners.
        let mut hashed: std::collections::HashMap<usize, hccl_ir::Seal> = Default::default();
        let mut start = 0;
        while start < sizes.len() {
            let mut end = start + 1;
            while end < sizes.len() && winners[end] == winners[start] {
                end += 1;
            }
            let (c, p) = winners[start];
            let times = costed[c].times[p].as_deref().unwrap_or(&[]);
            let cost = fit(&sizes, times, start, end);
            // Every winner passed the verifier above: its schedule is sealed as verified,
            // once (a job loading the plan then skips verifying it).
            // A template candidate's entry holds the template (written in symmetric form).
            let cand = &costed[c].candidate;
            let entry = PlanEntry {
                min_bytes: if start == 0 { 0 } else { sizes[start] },
                max_bytes: sizes.get(end).copied(),
                algorithm: costed[c].candidate.algorithm.clone(),
                protocol: options.protocols[p],
                cost,
                symmetry: costed[c].candidate.symmetry.clone(),
                synthesis: costed[c].candidate.synthesis.clone(),
                schedule: cand.schedule.clone(),
                template: cand.template.clone(),
            };
            let seal = hashed
                .entry(c)
                .or_insert_with(|| hccl_ir::seal_of(&entry))
                .clone();
            plan.add_seal(seal);
            plan.entries.push(entry);
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
    Ok(CompiledPlan {
        plan,
        rows,
        skipped,
    })
}

/// Rows for an existing plan on `topo`: for every collective the plan holds (root 0 for
/// rooted ones) and every size in `options.sizes` that an entry covers, the entry's schedule
/// simulated under its protocol, with the NCCL baseline and the lower bound.
pub fn evaluate_plan(
    topo: &Topology,
    plan: &PlanFile,
    options: &Options,
) -> Result<Vec<Row>, SearchError> {
    if let Some(e) = plan
        .entries
        .iter()
        .find(|e| e.schedule.nranks != topo.nranks())
    {
        return Err(SearchError::BadOptions(format!(
            "the plan's {} schedule is for {} ranks but topology {} has {}",
            e.schedule.collective,
            e.schedule.nranks,
            topo.name,
            topo.nranks()
        )));
    }
    let mut kinds: Vec<Collective> = plan.entries.iter().map(|e| e.schedule.collective).collect();
    kinds.sort();
    kinds.dedup();
    let mut prepared: Vec<Option<Option<Prepared>>> = vec![None; plan.entries.len()];
    let rows = evaluate_with(topo, &kinds, options, &mut |sim, collective, bytes| {
        let entry = plan.lookup(collective, bytes, false)?;
        let ei = plan
            .entries
            .iter()
            .position(|e| std::ptr::eq(e, entry))
            .unwrap_or(0);
        let predicted_us = prepared[ei]
            .get_or_insert_with(|| sim.prepare(&entry.schedule).ok())
            .as_ref()
            .and_then(|p| sim.run(p, bytes, entry.protocol).ok())
            .map_or(f64::NAN, |e| e.time_us);
        Some(Choice {
            algorithm: entry.algorithm.clone(),
            protocol: entry.protocol,
            predicted_us,
            channels: entry.schedule.channel_count(),
            chunks: entry.schedule.chunks,
            synthesis: entry.synthesis.clone(),
        })
    })?;
    if rows.is_empty() && !plan.entries.is_empty() {
        return Err(SearchError::BadOptions(
            "the plan has no entry for the requested collectives and sizes".into(),
        ));
    }
    Ok(rows)
}

/// Rows for one schedule, named `algorithm`, on `topo`: at every size of `options.sizes`, its
/// time under the fastest of `protocols` (the same simulator, NCCL baseline and lower bound as
/// [`compile`] and [`evaluate_plan`]; NCCL's choice picks its protocol among
/// `options.protocols`, as in the search). What a front end that writes a new algorithm
/// asks: is it correct (verify it first), how fast, how far from the bound, and does it beat
/// NCCL's choice.
pub fn evaluate_schedule(
    topo: &Topology,
    algorithm: &str,
    schedule: &hccl_ir::Schedule,
    protocols: &[Protocol],
    options: &Options,
) -> Result<Vec<Row>, SearchError> {
    if schedule.nranks != topo.nranks() {
        return Err(SearchError::BadOptions(format!(
            "the {} schedule is for {} ranks but topology {} has {}",
            schedule.collective,
            schedule.nranks,
            topo.name,
            topo.nranks()
        )));
    }
    if protocols.is_empty() {
        return Err(SearchError::BadOptions(
            "no protocols to evaluate under".into(),
        ));
    }
    let collective = schedule.collective;
    let mut prepared: Option<Prepared> = None;
    let mut failure: Option<String> = None;
    let options = Options {
        collectives: vec![collective.kind()],
        ..options.clone()
    };
    let rows = evaluate_with(topo, &[collective], &options, &mut |sim, _, bytes| {
        if prepared.is_none() && failure.is_none() {
            match sim.prepare(schedule) {
                Ok(p) => prepared = Some(p),
                Err(e) => failure = Some(e.to_string()),
            }
        }
        let p = prepared.as_ref()?;
        let (protocol, predicted_us) = protocols
            .iter()
            .filter_map(|&q| sim.run(p, bytes, q).ok().map(|e| (q, e.time_us)))
            .filter(|(_, t)| t.is_finite())
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        Some(Choice {
            algorithm: algorithm.to_string(),
            protocol,
            predicted_us,
            channels: schedule.channel_count(),
            chunks: schedule.chunks,
            synthesis: None,
        })
    })?;
    if let Some(why) = failure {
        return Err(SearchError::BadOptions(format!(
            "cannot simulate {algorithm}: {why}"
        )));
    }
    Ok(rows)
}

/// What a row of [`evaluate_with`] reports of the schedule it evaluates at one size.
struct Choice {
    algorithm: String,
    protocol: Protocol,
    predicted_us: f64,
    channels: u32,
    chunks: u32,
    synthesis: Option<Synthesis>,
}

/// Rows for `collectives` at every size of `options.sizes`: `choose` names and times the
/// schedule evaluated at that size (`None`: no row), beside NCCL's choice and the bound.
fn evaluate_with(
    topo: &Topology,
    collectives: &[Collective],
    options: &Options,
    choose: &mut dyn FnMut(&Simulator, Collective, u64) -> Option<Choice>,
) -> Result<Vec<Row>, SearchError> {
    let mut sizes = options.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let sim = Simulator::new(Network::new(topo), options.model.clone());
    let nccl = NcclTopo::new(&sim.network, &device_models(topo));
    let nranks = topo.nranks();
    let families = all_families();
    let mut rows = Vec::new();
    for &collective in collectives {
        let kind = collective.kind();
        if !options.collectives.contains(&kind) {
            continue;
        }
        // Baseline candidates: NCCL's families.
        let mut base: Vec<(String, Vec<Option<Vec<f64>>>)> = Vec::new();
        let mut channels_hint = 1;
        let mut capped: Vec<&str> = Vec::new();
        let mut modelled: Vec<&str> = Vec::new();
        let budget = sim_budget(options.sim_budget, nranks);
        for family in families
            .iter()
            .filter(|f| BASELINE_FAMILIES.contains(&f.name()) && f.supports(kind))
        {
            let generated = generate_capped(family.as_ref(), topo, collective);
            if family.name() == "ring" {
                channels_hint = channels_hint.max(generated.max_channels);
            }
            if generated.capped {
                capped.push(family.name());
            }
            if !modelled_baselines(generated.candidates.iter(), &sizes, options, budget).is_empty()
            {
                // NCCL's formula, as the search uses: nothing to simulate.
                modelled.push(family.name());
                continue;
            }
            for c in generated.candidates {
                let (times, _) = cost_sampled(&sim, &c, &sizes, options, budget, None, false);
                base.push((c.algorithm, times));
            }
        }
        for (si, &bytes) in sizes.iter().enumerate() {
            let Some(chosen) = choose(&sim, collective, bytes) else {
                continue;
            };
            let choice = nccl.choose(kind, bytes, channels_hint, |name| {
                capped.contains(&name)
                    || modelled.contains(&name)
                    || base.iter().any(|(n, _)| n == name)
            });
            let baseline = choice.and_then(|ch| {
                let best = options
                    .protocols
                    .iter()
                    .position(|&q| q == ch.protocol)
                    .map_or(f64::INFINITY, |pi| {
                        base.iter()
                            .filter(|(n, _)| n == ch.algo.family())
                            .filter_map(|(_, t)| t[pi].as_ref().map(|t| t[si]))
                            .fold(f64::INFINITY, f64::min)
                    });
                baseline_time(&ch, best, &capped, &modelled)
                    .map(|(t, m)| (ch.algo.family().to_string(), ch.protocol, t, m))
            });
            let b = bound(&sim.network, &options.model, collective, bytes);
            rows.push(Row {
                collective: kind,
                bytes,
                algorithm: chosen.algorithm,
                params: FamilyParams {
                    channels: chosen.channels,
                    pipeline: 0,
                },
                channels: chosen.channels,
                chunks: chosen.chunks,
                protocol: chosen.protocol,
                predicted_us: chosen.predicted_us,
                baseline_algorithm: baseline.as_ref().map(|b| b.0.clone()),
                baseline_protocol: baseline.as_ref().map(|b| b.1),
                baseline_us: baseline.as_ref().map(|b| b.2),
                baseline_modelled: baseline.as_ref().is_some_and(|b| b.3),
                bound_us: b.total_us,
                nranks,
                synthesis: chosen.synthesis,
            });
        }
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

/// Rounds of [`refine`].
const REFINE_ROUNDS: usize = 3;
/// Interpolated candidates [`refine`] simulates per size and round, best first.
const REFINE_PER_SIZE: usize = 3;
/// How far above the best time at a size an interpolated time may be and still be refined:
/// a pipeline's time is convex in the size where its pieces fall below a connection's
/// latency (two slots stop covering it), so the chord between samples overestimates it
/// there (a 432-piece rail schedule on the 4-node H100 cluster: 25% at 1 GiB between
/// samples at 1 KiB and 4 GiB).
const REFINE_FACTOR: f64 = 1.3;

/// Steps [`refine`] may simulate per collective, in units of the per-candidate budget
/// ([`sim_budget`]: it shrinks beyond [`SCALE_RANKS`], and so does refining).
const REFINE_BUDGET: usize = 10;
/// Sizes whose best time is within this fraction of the lower bound are not refined.
const REFINE_SLACK: f64 = 0.01;

/// Simulates, at each size, the candidates whose time there is interpolated (their
/// schedules too large to simulate at every size within the budget) and within
/// [`REFINE_FACTOR`] of the size's best, [`REFINE_PER_SIZE`] at a time from the fastest,
/// for up to [`REFINE_ROUNDS`] rounds and `steps_left` simulated steps (the closest to
/// their size's best first), except where the best is within [`REFINE_SLACK`] of
/// `bound_us`: winners are then decided on simulated times wherever the decision is close
/// and matters, not on a chord across sizes far apart.
fn refine(
    sim: &Simulator,
    costed: &mut [Costed],
    sizes: &[u64],
    options: &Options,
    mut steps_left: usize,
    bound_us: &mut dyn FnMut(usize) -> f64,
) {
    let np = options.protocols.len();
    let time =
        |c: &Costed, si: usize, p: usize| c.times[p].as_ref().map_or(f64::INFINITY, |t| t[si]);
    for _ in 0..REFINE_ROUNDS {
        // (time over the size's best, candidate, size) of the pairs to simulate.
        let mut wanted: Vec<(f64, usize, usize)> = Vec::new();
        for si in 0..sizes.len() {
            let live = |c: &&Costed| c.selectable && c.verified != Some(false);
            let best = costed
                .iter()
                .filter(live)
                .flat_map(|c| (0..np).map(move |p| time(c, si, p)))
                .fold(f64::INFINITY, f64::min);
            if !best.is_finite() {
                continue;
            }
            let mut near: Vec<(f64, usize)> = costed
                .iter()
                .enumerate()
                .filter(|(_, c)| live(c) && !c.exact[si])
                .map(|(i, c)| {
                    let t = (0..np)
                        .map(|p| time(c, si, p))
                        .fold(f64::INFINITY, f64::min);
                    (t, i)
                })
                .filter(|&(t, _)| t <= best * REFINE_FACTOR)
                .collect();
            // Nothing can gain more than the slack where the best is that near the bound.
            if near.is_empty() || best <= bound_us(si) * (1.0 + REFINE_SLACK) {
                continue;
            }
            near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            wanted.extend(
                near.iter()
                    .take(REFINE_PER_SIZE)
                    .map(|&(t, i)| (t / best, i, si)),
            );
        }
        // The closest first, within the steps left to simulate.
        wanted.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        for (_, c, si) in wanted {
            let cost = costed[c].candidate.work_steps().max(1) as usize * np;
            if cost > steps_left {
                continue;
            }
            steps_left -= cost;
            jobs.push((c, si));
        }
        if jobs.is_empty() {
            return;
        }
        // One preparation per candidate, its sizes together.
        let mut by: Vec<(usize, Vec<usize>)> = Vec::new();
        jobs.sort_unstable();
        for (c, si) in jobs {
            match by.last_mut() {
                Some((last, list)) if *last == c => list.push(si),
                _ => by.push((c, vec![si])),
            }
        }
        let results = par_map(&by, |(c, list)| {
            let c = &costed[*c];
            let Ok(prepared) = Ready::new(sim, &c.candidate) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for &si in list {
                for p in 0..np {
                    if c.times[p].is_some() {
                        let t = prepared
                            .run(sim, sizes[si], options.protocols[p])
                            .map_or(f64::INFINITY, |e| e.time_us);
                        out.push((si, p, t));
                    }
                }
            }
            out
        });
        for ((c, list), out) in by.iter().zip(results) {
            for (si, p, t) in out {
                if let Some(times) = costed[*c].times[p].as_mut() {
                    times[si] = t;
                }
            }
            for &si in list {
                costed[*c].exact[si] = true;
            }
        }
    }
}

/// A candidate ready to simulate at any size: its whole schedule, or (a template candidate)
/// its template, costed as one rank class ([`Simulator::run_symmetric`]).
/// A template whose translations do not map the network onto itself
/// ([`PreparedSymmetric::is_equivariant`]: some rank's translate sees other links) is costed
/// on its expansion instead.
enum Ready {
    Full(Box<Prepared>),
    Template(PreparedSymmetric),
}

impl Ready {
    fn new(sim: &Simulator, c: &Candidate) -> Result<Ready, CostError> {
        if let Some(t) = &c.template {
            let p = sim.prepare_symmetric(t)?;
            if p.is_equivariant() {
                return Ok(Ready::Template(p));
            }
        }
        let whole = c.expanded().ok_or(CostError::TooLarge {
            steps: c.step_count() as usize,
        })?;
        sim.prepare(&whole).map(|p| Ready::Full(Box::new(p)))
    }

    /// Steps one simulation walks.
    fn step_count(&self) -> usize {
        match self {
            Ready::Full(p) => p.step_count(),
            Ready::Template(p) => p.step_count(),
        }
    }

    fn run(&self, sim: &Simulator, bytes: u64, protocol: Protocol) -> Result<Estimate, CostError> {
        match self {
            Ready::Full(p) => sim.run(p, bytes, protocol),
            Ready::Template(p) => sim.run_symmetric(p, bytes, protocol),
        }
    }

    /// The time (µs) at `bytes` under `protocol`, or infinity when the run fails or is sure
    /// to take longer than `limit_us` ([`Simulator::run_within`]; a template run is cheap
    /// and always runs to its end).
    fn time_within(&self, sim: &Simulator, bytes: u64, protocol: Protocol, limit_us: f64) -> f64 {
        let estimate = match self {
            Ready::Full(p) => sim.run_within(p, bytes, protocol, limit_us),
            Ready::Template(p) => sim.run_symmetric(p, bytes, protocol).map(Some),
        };
        match estimate {
            Ok(Some(e)) => e.time_us,
            Ok(None) | Err(_) => f64::INFINITY,
        }
    }
}

/// Rank count above which candidates are screened before they are fully costed.
pub const SCREEN_RANKS: u32 = 16;
/// A screened candidate is fully costed when it is within this factor of the best at one of
/// the probe sizes.
const SCREEN_FACTOR: f64 = 1.5;

/// Most steps (over all ranks) a built-in candidate may have. Families whose schedules grow
/// as ranks² (mesh and one-shot, rings with one chunk per rank, pairwise and Bruck
/// AllToAll) pass it somewhere between 256 and 1024 ranks and are then not generated (see
/// [`Family::estimated_steps`](crate::families::Family::estimated_steps)), so compile time
/// and plan size stop growing as ranks². Every schedule on up to 64 ranks is far below it
/// (the largest, a double ring on 64 ranks with 8 channels × 2 pieces, has 260 096 steps).
/// External candidates ([`Options::extra`]) are not capped.
pub const MAX_CANDIDATE_STEPS: u64 = 600_000;

/// Most steps of the one candidate per family the search falls back to when no family has
/// one under [`MAX_CANDIDATE_STEPS`] (see [`generate_smallest`]): an AllGather on 1024 ranks
/// (about 2M steps, 1.8 GB and half a minute to compile at one size) compiles rather than
/// fails; on 4096 ranks (about 33M) it still fails, saying so.
pub const FALLBACK_CANDIDATE_STEPS: u64 = 2_500_000;

/// Rank count above which the per-candidate simulation budget shrinks (see [`sim_budget`]).
pub const SCALE_RANKS: u32 = 64;

/// NCCL's families in our registry: the baseline needs them even when `--algo` excludes them.
const BASELINE_FAMILIES: [&str; 3] = ["ring", "tree", "pairwise"];

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

/// What [`generate_capped`] produced for one family.
#[derive(Default)]
struct Generated {
    /// Schedules within [`MAX_CANDIDATE_STEPS`], in parameter order.
    candidates: Vec<Candidate>,
    /// Most channels of any parameter set offered (capped or not): NCCL's channel count.
    max_channels: u32,
    /// Whether some parameter set or schedule was left out for its size.
    capped: bool,
}

/// The schedules of the family's parameter set with the fewest estimated steps (the first
/// when it gives no estimate) within [`FALLBACK_CANDIDATE_STEPS`] and the verifier's limits.
fn generate_smallest(
    family: &dyn Family,
    topo: &Topology,
    collective: Collective,
) -> Vec<Candidate> {
    let space = family.param_space(topo, collective);
    let Some(params) = space.iter().copied().min_by_key(|&p| {
        family
            .estimated_steps(topo, collective, p)
            .unwrap_or(u64::MAX)
    }) else {
        return Vec::new();
    };
    if family
        .estimated_steps(topo, collective, params)
        .is_some_and(|steps| steps > FALLBACK_CANDIDATE_STEPS)
    {
        return Vec::new();
    }
    let out: Vec<Candidate> = family
        .generate(topo, collective, params)
        .into_iter()
        .filter(|c| {
            c.schedule.step_count() as u64 <= FALLBACK_CANDIDATE_STEPS
                && hccl_ir::verify::check_limits_claimed(&c.schedule, c.symmetry.as_ref()).is_ok()
        })
        .collect();
    if tracing() {
        eprintln!(
            "trace: fallback {} {collective} {params:?}: {} candidates",
            family.name(),
            out.len()
        );
    }
    out
}

/// The family's candidates for `collective` within [`MAX_CANDIDATE_STEPS`]: parameter sets
/// whose [`estimated_steps`](crate::families::Family::estimated_steps) exceed the cap are
/// not generated, and generated schedules over it, or over the verifier's size limits
/// ([`hccl_ir::verify::check_limits`]), are dropped.
fn generate_capped(family: &dyn Family, topo: &Topology, collective: Collective) -> Generated {
    let mut out = Generated {
        candidates: Vec::new(),
        max_channels: 1,
        capped: false,
    };
    let started = std::time::Instant::now();
    let space = family.param_space(topo, collective);
    // From TEMPLATE_RANKS on, symmetric families are built, costed and verified as
    // templates: the cap then applies to one rank's program.
    let templated = topo.nranks() >= TEMPLATE_RANKS
        && space
            .first()
            .is_some_and(|&p| family.template_steps(topo, collective, p).is_some());
    // Parameter sets are generated on all cores; results are taken in parameter order.
    let generated = par_map(&space, |&params| {
        let estimate = if templated {
            family.template_steps(topo, collective, params)
        } else {
            family.estimated_steps(topo, collective, params)
        };
        if estimate.is_some_and(|steps| steps > MAX_CANDIDATE_STEPS) {
            return None;
        }
        let made = if templated {
            family
                .template(topo, collective, params)
                .unwrap_or_default()
        } else {
            family.generate(topo, collective, params)
        };
        Some(
            made.into_iter()
                .map(|c| {
                    // Over the step cap, or too large for the verifier to model (which would
                    // only reject it after it had been costed).
                    let fits = c.work_steps() <= MAX_CANDIDATE_STEPS && c.fits_verifier();
                    fits.then_some(c)
                })
                .collect::<Vec<_>>(),
        )
    });
    for (params, made) in space.iter().zip(generated) {
        out.max_channels = out.max_channels.max(params.channels);
        let Some(made) = made else {
            out.capped = true;
            continue;
        };
        for c in made {
            match c {
                Some(c) => out.candidates.push(c),
                None => out.capped = true,
            }
        }
    }
    if tracing() {
        let steps: u64 = out.candidates.iter().map(Candidate::step_count).sum();
        eprintln!(
            "trace: generate {} {}: {} candidates, {steps} steps, {:.3} s{}",
            family.name(),
            collective,
            out.candidates.len(),
            started.elapsed().as_secs_f64(),
            if out.capped {
                " (some over the step cap)"
            } else {
                ""
            }
        );
    }
    out
}

/// Whether `HCCL_SEARCH_TRACE` is set: the search then prints, on stderr, what each family
/// generated and how long each candidate took to screen and to cost (for finding where
/// compile time goes; the plan is unaffected).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HCCL_SEARCH_TRACE").is_some())
}

/// Wall time of the search's phases for one collective, printed when [`tracing`].
struct Phase {
    kind: CollectiveKind,
    since: std::time::Instant,
}

impl Phase {
    fn start(kind: CollectiveKind) -> Phase {
        Phase {
            kind,
            since: std::time::Instant::now(),
        }
    }

    /// Prints the time since the previous phase ended and starts the next.
    fn done(&mut self, what: &str) {
        if tracing() {
            eprintln!(
                "trace: {} phase {what}: {:.3} s wall",
                self.kind,
                self.since.elapsed().as_secs_f64()
            );
        }
        self.since = std::time::Instant::now();
    }
}

/// Prints one candidate's screening or costing time when [`tracing`].
fn trace_candidate(what: &str, c: &Candidate, started: std::time::Instant, extra: &str) {
    if tracing() {
        eprintln!(
            "trace: {what} {} (channels {}, pipeline {}): {} steps, {:.3} s{extra}",
            c.algorithm,
            c.params.channels,
            c.params.pipeline,
            c.step_count(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// The baseline's time for NCCL's `choice` and whether it is NCCL's own predicted time:
/// that when its family is `modelled` ([`modelled_baselines`]), else `simulated` (the best
/// schedule of its family in our model) when there is one, else NCCL's own predicted time
/// when the family's schedules were over the step cap (`capped`) and so not simulated.
fn baseline_time(
    choice: &NcclChoice,
    simulated: f64,
    capped: &[&str],
    modelled: &[&str],
) -> Option<(f64, bool)> {
    let family = choice.algo.family();
    let model = choice
        .nccl_model_us
        .is_finite()
        .then_some((choice.nccl_model_us, true));
    if modelled.contains(&family) {
        model
    } else if simulated.is_finite() {
        Some((simulated, false))
    } else if capped.contains(&family) {
        model
    } else {
        None
    }
}

/// Fewest sizes the cheapest schedule of a baseline family must be simulated at within the
/// per-candidate budget (or every size, when fewer are compiled) for the baseline to be our
/// simulation of NCCL's algorithm ([`modelled_baselines`]).
pub const BASELINE_MIN_SAMPLES: usize = 3;

/// The baseline families among `candidates` whose time is NCCL's own tuning formula instead
/// of our simulation: those whose cheapest schedule the per-candidate `budget` affords at
/// fewer than [`BASELINE_MIN_SAMPLES`] of `sizes` (and not at all of them). Their simulated
/// baseline would be a chord between the range's two ends, and it cost most of a large
/// compile: at 4096 ranks the double binary tree's 8 schedules (up to 393k steps, each
/// simulated at both ends under three protocols) took three quarters of the CPU time, for
/// times within 6% of NCCL's formula from 16 MiB up (1.5× it at 1 KiB). Such a family's
/// schedules still compete, screened like any other's; only the baseline changes, and rows
/// say so ([`Row::baseline_modelled`]). With the default budget this is the tree from about
/// 2048 ranks (the ring is over the step cap from about 512).
pub fn modelled_baselines<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
    sizes: &[u64],
    options: &Options,
    budget: usize,
) -> Vec<&'static str> {
    // Per baseline family seen: whether one of its schedules is affordable.
    let mut seen: Vec<(&'static str, bool)> = Vec::new();
    for c in candidates {
        let Some(&name) = BASELINE_FAMILIES.iter().find(|&&b| b == c.algorithm) else {
            continue;
        };
        // Templates cost one rank class, with the full budget (as `cost_sampled` does).
        let budget = if c.template.is_some() {
            budget.max(options.sim_budget)
        } else {
            budget
        };
        let n = sizes.len() - sizes.partition_point(|&s| s < c.min_bytes);
        let afforded = sample_indices(n, c.work_steps() as usize, budget).len();
        let enough = afforded >= n.min(BASELINE_MIN_SAMPLES);
        match seen.iter_mut().find(|(f, _)| *f == name) {
            Some(entry) => entry.1 |= enough,
            None => seen.push((name, enough)),
        }
    }
    seen.into_iter()
        .filter(|&(_, enough)| !enough)
        .map(|(name, _)| name)
        .collect()
}

/// The screen's verdict on one candidate.
struct Probe {
    /// Whether to cost the candidate at every size.
    keep: bool,
    /// Times already simulated: `(size index, protocol index, µs)`.
    known: Vec<(usize, usize, f64)>,
    /// The schedule as the screen prepared it (flattened and routed), when it was kept.
    ready: Option<Ready>,
}

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
/// each probe ([`Simulator::run_within`]): a run past that limit would not be kept whatever
/// the second wave finds (the best only gets lower), so it stops there. The verdicts are
/// those of running every candidate in full; only the losers' runs are shorter (a k-ary
/// tree on 4096 ranks stops after a small part of its run).
fn screen(
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
                known: Vec::new(),
                ready: None,
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
    let probe = |c: &Candidate, limits: [f64; 2]| -> ([f64; 2], Option<Ready>) {
        let started = std::time::Instant::now();
        let lost = ([f64::INFINITY; 2], None);
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
                return lost;
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
        (times, keep_ready.then_some(prep))
    };
    let wave = |first: bool| -> Vec<usize> {
        (0..n)
            .filter(|&i| first_wave(&candidates[i].0) == first)
            .collect()
    };
    let mut probes = vec![[f64::INFINITY; 2]; n];
    let mut readies: Vec<Option<Ready>> = (0..n).map(|_| None).collect();
    let first = wave(true);
    for (&i, (times, ready)) in first.iter().zip(par_map(&first, |&i| {
        probe(&candidates[i].0, [f64::INFINITY; 2])
    })) {
        probes[i] = times;
        readies[i] = ready;
    }
    let best =
        |probes: &[[f64; 2]], k: usize| probes.iter().map(|p| p[k]).fold(f64::INFINITY, f64::min);
    let limits = [
        best(&probes, 0) * SCREEN_FACTOR,
        best(&probes, 1) * SCREEN_FACTOR,
    ];
    let second = wave(false);
    for (&i, (times, ready)) in second
        .iter()
        .zip(par_map(&second, |&i| probe(&candidates[i].0, limits)))
    {
        probes[i] = times;
        readies[i] = ready;
    }
    let (b0, b1) = (best(&probes, 0), best(&probes, 1));
    candidates
        .iter()
        .zip(&probes)
        .zip(readies)
        .map(|(((c, _), p), ready)| {
            let keep = kept_anyway(c) || p[0] <= b0 * SCREEN_FACTOR || p[1] <= b1 * SCREEN_FACTOR;
            Probe {
                keep,
                known: [(0, 0, p[0]), (last_size, last_proto, p[1])]
                    .into_iter()
                    .filter(|k| k.2.is_finite())
                    .collect(),
                ready: if keep { ready } else { None },
            }
        })
        .collect()
}

/// `f` applied to every item on up to [`std::thread::available_parallelism`] threads (each
/// takes the next unclaimed item), results in item order: the outcome does not depend on
/// the thread count. A panic in `f` is propagated.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        out.push((i, f(item)));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Predicted times of one candidate at every size, per protocol, simulating at most
/// `budget` steps per protocol (see [`sample_indices`]); what the screen found (`screened`:
/// the times it simulated, used instead of simulating again, and the schedule as it prepared
/// it) is reused. Sizes below the candidate's
/// [`Candidate::min_bytes`] are not simulated and get an infinite time.
/// Also returns, per size, whether its times were simulated (or are known, or cannot be
/// had: below the candidate's least size) rather than interpolated.
fn cost_sampled(
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
fn interpolate(sizes: &[u64], at: &[(usize, f64)]) -> Vec<f64> {
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
    fn budget_shrinks_only_beyond_scale_ranks() {
        assert_eq!(sim_budget(400_000, 8), 400_000);
        assert_eq!(sim_budget(400_000, SCALE_RANKS), 400_000);
        assert_eq!(sim_budget(400_000, 1024), 25_000);
    }

    #[test]
    fn par_map_keeps_item_order() {
        let items: Vec<u64> = (0..100).collect();
        assert_eq!(
            par_map(&items, |&x| x * x),
            items.iter().map(|x| x * x).collect::<Vec<_>>()
        );
        assert!(par_map(&[] as &[u64], |&x| x).is_empty());
    }

    /// On 1024 ranks the ranks²-step families are not generated at all; trees are.
    #[test]
    fn quadratic_families_are_capped_on_many_ranks() {
        let text = hccl_topologies::shipped_text("dgx-h100").expect("shipped");
        let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("parses");
        let topo =
            hccl_topologies::build(hccl_topologies::generate::cluster(128, &spec), "cluster")
                .expect("builds");
        assert_eq!(topo.nranks(), 1024);
        for family in all_families() {
            let name = family.name();
            if !["ring", "double_ring", "mesh", "tree"].contains(&name) {
                continue;
            }
            let g = generate_capped(family.as_ref(), &topo, Collective::AllReduce);
            if name == "tree" {
                assert!(!g.capped && !g.candidates.is_empty());
            } else {
                assert!(g.capped && g.candidates.is_empty(), "{name}");
            }
            assert!(
                g.candidates
                    .iter()
                    .all(|c| c.schedule.step_count() as u64 <= MAX_CANDIDATE_STEPS)
            );
        }
        assert_eq!(
            baseline_time(
                &NcclChoice {
                    algo: crate::cost::NcclAlgo::Ring,
                    protocol: Protocol::Simple,
                    nccl_model_us: 42.0
                },
                f64::INFINITY,
                &["ring"],
                &[]
            ),
            Some((42.0, true))
        );
    }

    #[test]
    fn baselines_too_large_to_sample_are_nccls_formula() {
        let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
        let tree = all_families()
            .into_iter()
            .find(|f| f.name() == "tree")
            .expect("registered");
        let candidates: Vec<Candidate> = tree
            .param_space(&topo, Collective::AllReduce)
            .into_iter()
            .flat_map(|p| tree.generate(&topo, Collective::AllReduce, p))
            .collect();
        let least = candidates.iter().map(Candidate::work_steps).min().unwrap() as usize;
        let sizes = geometric_sizes(1 << 10, 1 << 30, 2);
        let options = Options::default();
        let modelled = |budget| modelled_baselines(&candidates, &sizes, &options, budget);
        // The cheapest tree simulated at 3 sizes: the baseline is simulated; at 2, NCCL's.
        assert!(modelled(3 * least).is_empty());
        assert_eq!(modelled(3 * least - 1), vec!["tree"]);
        // Every size affordable (one or two sizes compiled): simulated.
        assert!(modelled_baselines(&candidates, &sizes[..2], &options, 2 * least).is_empty());
        // Other families never are.
        let other: Vec<Candidate> = all_families()
            .into_iter()
            .filter(|f| f.name() == "hierarchical_hd")
            .flat_map(|f| {
                f.generate(
                    &topo,
                    Collective::AllReduce,
                    FamilyParams {
                        channels: 1,
                        pipeline: 1,
                    },
                )
            })
            .collect();
        assert!(modelled_baselines(&other, &sizes, &options, 1).is_empty());
        // A modelled family's baseline is NCCL's formula even where it was simulated.
        let choice = NcclChoice {
            algo: crate::cost::NcclAlgo::Tree,
            protocol: Protocol::LL,
            nccl_model_us: 105.0,
        };
        assert_eq!(
            baseline_time(&choice, 157.0, &[], &["tree"]),
            Some((105.0, true))
        );
        assert_eq!(
            baseline_time(&choice, 157.0, &[], &[]),
            Some((157.0, false))
        );
        assert_eq!(baseline_time(&choice, f64::INFINITY, &[], &[]), None);
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
        // A candidate with no time below its least size: its one point, all bandwidth.
        let times = [f64::INFINITY, f64::INFINITY, 14.0];
        let h = fit(&sizes, &times, 2, 3).unwrap();
        assert_eq!(h.latency_us, 0.0);
        assert!((h.predict_us(4000) - 14.0).abs() < 1e-9);
    }
}
