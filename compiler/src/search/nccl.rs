//! The NCCL baseline assembled from the family registry: NCCL's channel count (the ring
//! family's widest parameter set) and what NCCL would run, costed in our simulator.
//! [`crate::cost::baseline`] holds NCCL's tuning formula itself.

use super::registry::all_families;
use crate::cost::{Baseline, CostError, CostModel, NcclTopo, Network, Simulator, device_models};
use crate::families::Candidate;
use hccl_ir::Collective;
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
