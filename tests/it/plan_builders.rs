//! Plans of one family's schedules for the tests that run them: the facade's
//! `synthesized_plans` (threads and processes) and hccl-perf's (`hccl-perf --check`, which
//! includes this file by its path).

use hccl_compiler::families::{Candidate, FamilyParams, families_for};
use hccl_compiler::synth::SynthLevel;
use hccl_ir::{Collective, PlanEntry, PlanFile, PlanMeta, Protocol};
use hccl_topologies::Topology;

/// The shipped machine `name`.
pub fn shipped(name: &str) -> Topology {
    hccl_topologies::shipped_by_name(name).unwrap_or_else(|| panic!("{name} is shipped"))
}

/// What `hcclc topo gen ring --ranks 4 --bw 25 --latency 1` makes.
pub fn ring4() -> Topology {
    hccl_topologies::build(hccl_topologies::generate::ring(4, 25.0, 1.0), "ring4")
        .expect("a 4-ring builds")
}

/// The parameter sets `family` offers for `collective` on `topo` (the search's space).
pub fn params_of(family: &str, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
    families_for(SynthLevel::Full)
        .into_iter()
        .find(|f| f.name() == family)
        .unwrap_or_else(|| panic!("no family {family}"))
        .param_space(topo, collective)
}

/// The schedules of `family` at `params`, out of place and (where it has them) in place.
pub fn candidates(
    family: &str,
    topo: &Topology,
    collective: Collective,
    params: FamilyParams,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for in_place in [false, true] {
        let got =
            hccl_compiler::families::generate_with(family, topo, collective, params, in_place)
                .unwrap_or_else(|| panic!("no family {family}"));
        out.extend(got);
    }
    out
}

/// A plan whose entries are `cands` (every size, protocol `proto`), for `topo`.
pub fn plan_of(topo: &Topology, cands: &[&Candidate], proto: Protocol) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: topo.name.clone(),
        topology_hash: topo.hash.clone(),
        compiler: "tests/it/synthesized_plans.rs".into(),
    });
    for c in cands {
        plan.entries.push(PlanEntry {
            min_bytes: 0,
            max_bytes: None,
            algorithm: c.algorithm.clone(),
            protocol: proto,
            cost: None,
            symmetry: c.symmetry.clone(),
            synthesis: c.synthesis.clone(),
            schedule: c.schedule.clone(),
            template: None,
        });
    }
    plan
}
