//! Synthesis by LP: the tree packing never exceeds the max-flow bound (and reaches it on most
//! machines), its schedules verify, and Broadcast and Reduce at 1 GiB come closer to the lower
//! bound than the hand-written families.

use hccl_compiler::cost::{Network, bounds};
use hccl_compiler::families::Family;
use hccl_compiler::search::{self, Options};
use hccl_compiler::synth::{Direction, PackedTrees, pack};
use hccl_ir::{Collective, CollectiveKind, verify::verify};
use hccl_topologies::Topology;

const GIB: u64 = 1 << 30;

/// Every shipped machine, plus generated ones of other shapes.
fn machines() -> Vec<(String, Topology)> {
    let mut out: Vec<(String, Topology)> = hccl_topologies::shipped()
        .iter()
        .map(|(name, _)| {
            (
                name.to_string(),
                hccl_topologies::shipped_by_name(name).expect("shipped machines build"),
            )
        })
        .collect();
    let generated = |name: &str, spec| {
        (
            name.to_string(),
            hccl_topologies::build(spec, name).expect("generated topology builds"),
        )
    };
    out.push(generated(
        "ring-8",
        hccl_topologies::generate::ring(8, 100.0, 1.0),
    ));
    out.push(generated(
        "torus-4x4",
        hccl_topologies::generate::torus(&[4, 4], 50.0, 1.0),
    ));
    out.push(generated(
        "fat-tree-16",
        hccl_topologies::generate::fat_tree(16, 4, 50.0, 1.0),
    ));
    out
}

/// The rate of the packing equals the bound's rate: the smallest max-flow from the root.
#[test]
fn packings_reach_the_max_flow_from_the_root() {
    for (name, topo) in machines() {
        let net = Network::new(&topo);
        let n = net.nranks();
        for direction in [Direction::FromRoot, Direction::ToRoot] {
            let packing = pack(&net, 0, direction).expect("packs");
            let flow = (1..n)
                .map(|v| match direction {
                    Direction::FromRoot => bounds::max_flow(&net, 0, v),
                    Direction::ToRoot => bounds::max_flow(&net, v, 0),
                })
                .fold(f64::INFINITY, f64::min);
            let sum: f64 = packing.trees.iter().map(|t| t.1).sum();
            assert!((sum - packing.rate).abs() <= 1e-9 * sum);
            assert!(
                packing.rate <= flow * (1.0 + 1e-6),
                "{name} {direction:?}: packing {} GB/s above the max-flow {flow} GB/s",
                packing.rate
            );
            println!(
                "{name:>20} {direction:?}: {} trees, {:.1} GB/s of {:.1} (pool of {}: {:.1})",
                packing.trees.len(),
                packing.rate,
                flow,
                packing.pool,
                packing.pool_rate
            );
        }
    }
}

/// Every packed-tree schedule verifies, both placements.
#[test]
fn packed_tree_schedules_verify() {
    let family = PackedTrees;
    for (name, topo) in machines() {
        let n = topo.nranks();
        for collective in [
            Collective::Broadcast { root: 0 },
            Collective::Broadcast { root: n - 1 },
            Collective::Reduce { root: 0 },
            Collective::Reduce { root: n / 2 },
        ] {
            for params in family.param_space(&topo, collective).into_iter().take(2) {
                for in_place in [false, true] {
                    let cands = family.schedules(&topo, collective, params, in_place);
                    assert_eq!(cands.len(), 1, "{name} {collective} {params:?}");
                    let s = &cands[0].schedule;
                    assert_eq!(s.chunks, params.pipeline);
                    if let Err(e) = verify(s) {
                        panic!("{name} {collective} {params:?} in_place={in_place}: {e:?}");
                    }
                }
            }
        }
    }
}

/// Broadcast and Reduce at 1 GiB: with the packed trees competing, the chosen plan is never
/// slower than without them, and within the ratio to the lower bound it reached when this
/// test was written (issue 11 asks for 1.03 everywhere; see `CEILINGS` for where it stands).
#[test]
fn broadcast_and_reduce_at_one_gib_approach_the_bound() {
    // Largest predicted time / lower bound at 1 GiB, per machine (Broadcast, Reduce); the
    // hand-written families alone gave 1.94/1.87 on dgx1-v100, 1.63/1.63 on the DGX-A100 and
    // H100, 1.21/1.22 on ascend910-8, 1.17/1.18 on azure-ndv2-2node, 1.89/1.80 and 2.68/2.60
    // on the H100 clusters and 1.75/1.75 on the 8-ring.
    const CEILINGS: [(&str, f64, f64); 10] = [
        ("dgx1-v100", 1.16, 1.16),
        ("dgx-a100", 1.28, 1.23),
        ("dgx-h100", 1.28, 1.23),
        ("ascend910-8", 1.06, 1.06),
        ("azure-ndv2-2node", 1.03, 1.03),
        ("h100-cluster-2node", 1.06, 1.04),
        ("h100-cluster-4node", 1.42, 1.37),
        ("ring-8", 1.03, 1.03),
        ("torus-4x4", 1.34, 1.38),
        ("fat-tree-16", 1.39, 1.26),
    ];
    let families: Vec<String> = hccl_compiler::families::all_families()
        .iter()
        .map(|f| f.name().to_string())
        .filter(|n| n != "packed_trees")
        .collect();
    for (name, topo) in machines() {
        let base = Options {
            collectives: vec![CollectiveKind::Broadcast, CollectiveKind::Reduce],
            sizes: vec![GIB],
            model: hccl_compiler::cost::CostModel::for_topology(&topo),
            ..Options::default()
        };
        let with = search::compile(&topo, &base).expect("compiles");
        let without = search::compile(
            &topo,
            &Options {
                algorithms: Some(families.clone()),
                ..base.clone()
            },
        )
        .expect("compiles");
        let &(_, bcast, reduce) = CEILINGS
            .iter()
            .find(|c| c.0 == name)
            .expect("a ceiling for every machine");
        for (row, old) in with.rows.iter().zip(&without.rows) {
            let (ratio, before) = (row.bound_ratio(), old.bound_ratio());
            println!(
                "{name:>20} {:>10} {before:.3} ({}) -> {ratio:.3} ({})",
                row.collective.name(),
                old.algorithm,
                row.algorithm
            );
            assert!(
                row.predicted_us <= old.predicted_us * (1.0 + 1e-9),
                "{name} {}: worse with synthesis",
                row.collective.name()
            );
            let ceiling = if row.collective == CollectiveKind::Broadcast {
                bcast
            } else {
                reduce
            };
            assert!(
                ratio <= ceiling,
                "{name} {} ({}) is {ratio:.3}× its bound, above {ceiling}",
                row.collective.name(),
                row.algorithm
            );
        }
    }
}
