//! The family registry: every family the search enumerates, hand-written and synthesized,
//! in a fixed order (the search is deterministic).

use crate::families::{
    Bruck, Candidate, DoubleBinaryTree, DoubleRing, Family, FamilyParams, Groups, Hierarchical,
    HierarchicalHd, HierarchicalRd, HierarchicalSplit, HybridCube, KaryTree, Mesh, OneShot,
    Pairwise, RailChains, RailTrees, Ring, TwoPhase,
};
use crate::synth::SynthLevel;
use hccl_ir::Collective;
use hccl_topologies::Topology;

/// Every built-in family, in a fixed order (the search is deterministic), with the
/// synthesizers at their default level ([`SynthLevel::Auto`]).
pub fn all_families() -> Vec<Box<dyn Family>> {
    families_for(SynthLevel::Auto)
}

/// Every built-in family with the synthesizers at `level` (none when `Off`), in a fixed
/// order.
pub fn families_for(level: SynthLevel) -> Vec<Box<dyn Family>> {
    let mut families = hand_written();
    if level != SynthLevel::Off {
        families.push(Box::new(crate::synth::PackedTrees::at(level)));
        families.push(Box::new(crate::synth::alltoall::FlowAllToAll));
        families.push(Box::new(crate::synth::rings::RoutedRings));
        families.push(Box::new(crate::synth::allreduce::PackedAllReduce::at(
            level,
        )));
    }
    if level != SynthLevel::Off {
        families.push(Box::new(crate::synth::milp::MilpFrontier));
    }
    families
}

/// The hand-written families.
fn hand_written() -> Vec<Box<dyn Family>> {
    vec![
        Box::new(Ring),
        Box::new(DoubleRing),
        Box::new(DoubleBinaryTree),
        Box::new(KaryTree),
        Box::new(HybridCube),
        Box::new(Mesh),
        Box::new(OneShot),
        Box::new(Hierarchical),
        Box::new(HierarchicalHd),
        Box::new(HierarchicalRd),
        Box::new(HierarchicalSplit),
        Box::new(RailChains),
        Box::new(RailTrees),
        Box::new(Groups),
        Box::new(Pairwise),
        Box::new(Bruck),
        Box::new(TwoPhase),
    ]
}

/// The schedules of the family called `name` for either buffer arrangement
/// ([`Family::schedules`]); `None` for an unknown name.
pub fn generate_with(
    name: &str,
    topo: &Topology,
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Option<Vec<Candidate>> {
    families_for(SynthLevel::Full)
        .into_iter()
        .find(|f| f.name() == name)
        .map(|f| f.schedules(topo, collective, params, in_place))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hccl_ir::CollectiveKind;

    fn cluster(nodes: u32) -> Topology {
        let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
        let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
        hccl_topologies::build(hccl_topologies::generate::cluster(nodes, &spec), "cluster")
            .expect("cluster builds")
    }

    /// Every family's step estimate is within a factor of two of what it generates.
    #[test]
    fn step_estimates_match_generated_schedules() {
        let mut checked = 0;
        for topo in [cluster(1), cluster(2)] {
            for family in all_families() {
                for kind in CollectiveKind::ALL {
                    if !family.supports(kind) {
                        continue;
                    }
                    let collective = crate::search::collective_of(kind);
                    for params in family.param_space(&topo, collective) {
                        let Some(est) = family.estimated_steps(&topo, collective, params) else {
                            continue;
                        };
                        for c in family.generate(&topo, collective, params) {
                            let real = c.schedule.step_count() as u64;
                            assert!(
                                est <= 2 * real && real <= 2 * est,
                                "{} {kind} {params:?} on {} ranks: estimate {est}, real {real}",
                                family.name(),
                                topo.nranks()
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 50, "only {checked} schedules checked");
    }
}
