//! Rows for schedules the search did not choose: an existing plan's ([`evaluate_plan`],
//! `hcclc explain`) or one schedule's ([`evaluate_schedule`], the Python `Algorithm.cost`),
//! from the same simulator, NCCL baseline and lower bound as a compile.

use super::costing::{Limits, cost_sampled, sim_budget};
use super::generate::{BASELINE_FAMILIES, generate_capped};
use super::nccl::{baseline_time, modelled_baselines};
use super::options::{Options, SearchError};
use super::registry::all_families;
use super::row::Row;
use crate::cost::bounds::bound;
use crate::cost::{NcclTopo, Network, Prepared, Simulator, device_models};
use crate::families::FamilyParams;
use hccl_ir::{Collective, PlanFile, Protocol, Synthesis};
use hccl_topologies::Topology;

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
/// [`compile`](super::compile) and [`evaluate_plan`]; NCCL's choice picks its protocol among
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
                let times = cost_sampled(
                    &sim,
                    &c,
                    &sizes,
                    options,
                    budget,
                    None,
                    (false, Limits::None),
                )
                .times;
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
