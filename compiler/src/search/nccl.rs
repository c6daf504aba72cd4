//! The NCCL baseline assembled from the family registry: NCCL's channel count (the ring
//! family's widest parameter set) and what NCCL would run, costed in our simulator; and
//! which time a search's rows give for it (simulated, or NCCL's own formula).
//! [`crate::cost::baseline`] holds NCCL's tuning formula itself.

use super::context::Search;
use super::costing::sample_indices;
use super::generate::BASELINE_FAMILIES;
use super::options::Options;
use super::registry::all_families;
use crate::cost::{
    Baseline, CostError, CostModel, NcclChoice, NcclTopo, Network, Simulator, device_models,
};
use crate::families::Candidate;
use hccl_ir::{Collective, CollectiveKind};
use hccl_topologies::Topology;

/// The channel count NCCL would use: the most channels the `ring` family offers.
pub fn nccl_channels(topo: &Topology, collective: Collective) -> u32 {
    all_families()
        .iter()
        .find(|f| f.name() == "ring")
        .and_then(|f| {
            f.param_space(topo, collective)
                .iter()
                .map(|p| p.channels)
                .max()
        })
        .unwrap_or(1)
}

/// What NCCL would run for `collective` of `bytes` on `topo`, costed in our simulator at its
/// best channel/pipeline parameters. `None` when the family NCCL would use is not available
/// or generates nothing for this topology.
pub fn baseline(
    topo: &Topology,
    collective: Collective,
    bytes: u64,
) -> Result<Option<Baseline>, CostError> {
    let sim = Simulator::new(Network::new(topo), CostModel::default());
    let families = all_families();
    let ntopo = NcclTopo::new(&sim.network, &device_models(topo));
    let channels = nccl_channels(topo, collective);
    let Some(choice) = ntopo.choose(collective.kind(), bytes, channels, |name| {
        families
            .iter()
            .any(|f| f.name() == name && f.supports(collective.kind()))
    }) else {
        return Ok(None);
    };
    let name = choice.algo.family();
    let Some(family) = families.iter().find(|f| f.name() == name) else {
        return Ok(None);
    };
    let mut best: Option<f64> = None;
    for params in family.param_space(topo, collective) {
        for Candidate { schedule, .. } in family.generate(topo, collective, params) {
            let est = sim.simulate(&schedule, bytes, choice.protocol)?;
            if best.is_none_or(|b| est.time_us < b) {
                best = Some(est.time_us);
            }
        }
    }
    Ok(best.map(|time_us| Baseline {
        algorithm: name.to_string(),
        protocol: choice.protocol,
        time_us,
    }))
}

/// NCCL's choice at each of the search's sizes for `kind` (`None` where it has none), made
/// once for the cost phase (whose limits keep the baseline, [`NcclChoice::algo`]'s best time
/// under its protocol) and the rows (`emit::rows`). `channels` and `capped` are what the
/// generate phase found; a family is available when it is capped or has a candidate.
pub(super) fn nccl_choices(
    search: &Search<'_>,
    kind: CollectiveKind,
    (channels, capped): (u32, &[&str]),
    candidates: &[(Candidate, bool)],
) -> Vec<Option<NcclChoice>> {
    let available =
        |name: &str| capped.contains(&name) || candidates.iter().any(|(c, _)| c.algorithm == name);
    search
        .sizes
        .iter()
        .map(|&bytes| search.nccl.choose(kind, bytes, channels, available))
        .collect()
}

/// The baseline's time for NCCL's `choice` and whether it is NCCL's own predicted time:
/// that when its family is `modelled` ([`modelled_baselines`]), else `simulated` (the best
/// schedule of its family in our model) when there is one, else NCCL's own predicted time
/// when the family's schedules were over the step cap (`capped`) and so not simulated.
pub(super) fn baseline_time(
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
/// say so ([`Row::baseline_modelled`](super::Row::baseline_modelled)). With the default budget this is the tree from about
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
