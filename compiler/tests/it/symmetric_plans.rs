//! Rank-symmetric plan entries end to end: the families that claim a symmetry really have it,
//! compiled plans store those entries as templates, and reading them back (whole, or one
//! rank's part) gives exactly the schedules that were compiled and verified.

use hccl_compiler::families::FamilyParams;
use hccl_compiler::search::all_families;
use hccl_compiler::search::{self, Options, collective_of};
use hccl_ir::{CollectiveKind, PlanFile};
use hccl_topologies::Topology;

fn shipped(name: &str) -> Topology {
    hccl_topologies::shipped_by_name(name).expect("shipped machine")
}

/// Families whose every AllReduce/AllGather/ReduceScatter/AllToAll schedule is invariant under
/// its claimed symmetry, on any topology they apply to.
const ALWAYS_SYMMETRIC: [&str; 6] = [
    "double_ring",
    "mesh",
    "pairwise",
    "hierarchical",
    "hierarchical_hd",
    "hierarchical_rd",
];

#[test]
fn claimed_symmetries_hold() {
    for machine in ["dgx-h100", "h100-cluster-2node"] {
        let topo = shipped(machine);
        for family in all_families() {
            for kind in [
                CollectiveKind::AllReduce,
                CollectiveKind::AllGather,
                CollectiveKind::ReduceScatter,
                CollectiveKind::AllToAll,
            ] {
                if !family.supports(kind) {
                    continue;
                }
                let collective = collective_of(kind);
                let params = FamilyParams {
                    channels: 1,
                    pipeline: 2,
                };
                for c in family.generate(&topo, collective, params) {
                    let Some(sym) = &c.symmetry else {
                        assert!(
                            !ALWAYS_SYMMETRIC.contains(&family.name()),
                            "{machine}: {} {kind} claims no symmetry",
                            family.name()
                        );
                        continue;
                    };
                    let compact = c.schedule.compress(sym);
                    // One ring (one channel) and the cube AllReduce on one channel are
                    // symmetric too.
                    let must = ALWAYS_SYMMETRIC.contains(&family.name())
                        || family.name() == "ring"
                        || family.name() == "hybrid_cube";
                    if must {
                        let compact = compact.unwrap_or_else(|| {
                            panic!("{machine}: {} {kind} does not compress", family.name())
                        });
                        assert_eq!(
                            compact.expand().expect("expands"),
                            c.schedule,
                            "{machine}: {} {kind}",
                            family.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn compiled_plans_store_symmetric_entries_losslessly() {
    let topo = shipped("h100-cluster-2node");
    let opts = Options {
        collectives: vec![
            CollectiveKind::AllReduce,
            CollectiveKind::AllGather,
            CollectiveKind::AllToAll,
        ],
        sizes: search::geometric_sizes(1 << 10, 1 << 30, 64),
        ..Options::default()
    };
    let plan = search::compile(&topo, &opts).expect("compiles").plan;
    let compact = plan.entries.iter().filter(|e| e.is_compact()).count();
    assert!(
        compact * 2 >= plan.entries.len(),
        "only {compact} of {} entries are symmetric",
        plan.entries.len()
    );
    let text = plan.to_ron();
    assert_eq!(text.matches("symmetric:").count(), compact);
    let back = PlanFile::from_ron(&text, "plan").expect("reads back");
    assert_eq!(back.entries.len(), plan.entries.len());
    for (a, b) in plan.entries.iter().zip(&back.entries) {
        assert_eq!(a.schedule, b.schedule, "{} {}", a.algorithm, a.min_bytes);
        hccl_ir::verify::verify(&b.schedule).expect("a read-back schedule verifies");
    }
    for rank in 0..topo.nranks() {
        let part = PlanFile::from_ron_for_rank(&text, "plan", rank).expect("one rank reads");
        for (full, one) in plan.entries.iter().zip(&part.entries) {
            assert_eq!(
                one.schedule.ranks[rank as usize], full.schedule.ranks[rank as usize],
                "rank {rank}, {} from {}",
                full.algorithm, full.min_bytes
            );
        }
    }
}

/// Every family's templates (deep pipelines included) are written with strided runs and read
/// back equal: the format-5 written form loses nothing.
#[test]
fn every_familys_template_round_trips_through_runs() {
    let mut compressed = 0;
    for machine in ["dgx-h100", "h100-cluster-2node"] {
        let topo = shipped(machine);
        for family in all_families() {
            for kind in [
                CollectiveKind::AllReduce,
                CollectiveKind::AllGather,
                CollectiveKind::ReduceScatter,
                CollectiveKind::AllToAll,
            ] {
                if !family.supports(kind) {
                    continue;
                }
                for (channels, pipeline) in [(1, 1), (2, 4), (1, 16)] {
                    let params = FamilyParams { channels, pipeline };
                    for c in family.generate(&topo, collective_of(kind), params) {
                        let Some(sym) = c.symmetry.as_ref() else {
                            continue;
                        };
                        let Some(compact) = c.schedule.compress(sym) else {
                            continue;
                        };
                        let written = hccl_ir::runs::encode(&compact.template);
                        let text = ron::to_string(&written).expect("serialises");
                        let back: hccl_ir::runs::WProgram = ron::from_str(&text).expect("parses");
                        assert_eq!(
                            back.expand().as_ref(),
                            Ok(&compact.template),
                            "{machine}: {} {kind} {channels}x{pipeline}",
                            family.name()
                        );
                        if text.contains("repeat") {
                            compressed += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(compressed > 0, "some deep template has runs");
}
