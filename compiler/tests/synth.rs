//! Synthesis by LP: the tree packing reaches the max-flow bound on the shipped machines, its
//! schedules verify, and Broadcast and Reduce at 1 GiB come within 3% of the lower bound.

use hccl_compiler::cost::{Network, bounds};
use hccl_compiler::search::{self, Options};
use hccl_compiler::synth::{Direction, PackedTrees, pack};
use hccl_compiler::families::Family;
use hccl_ir::{Collective, CollectiveKind, verify::verify};
use hccl_topologies::Topology;

const GIB: u64 = 1 << 30;
/// Largest allowed predicted time / lower bound at 1 GiB.
const MAX_RATIO: f64 = 1.03;

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
    out.push(generated("ring-8", hccl_topologies::generate::ring(8, 100.0, 1.0)));
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

/// Broadcast and Reduce at 1 GiB within 3% of the lower bound on every machine.
#[test]
fn broadcast_and_reduce_at_one_gib_are_near_the_bound() {
    let opts = Options {
        collectives: vec![CollectiveKind::Broadcast, CollectiveKind::Reduce],
        sizes: vec![GIB],
        ..Options::default()
    };
    let mut worst = (0.0f64, String::new());
    for (name, topo) in machines() {
        let opts = Options {
            model: hccl_compiler::cost::CostModel::for_topology(&topo),
            ..opts.clone()
        };
        let compiled = search::compile(&topo, &opts).expect("compiles");
        for row in &compiled.rows {
            let ratio = row.bound_ratio();
            println!(
                "{name:>20} {:>10} {:>14} {ratio:.3}",
                row.collective.name(),
                row.algorithm
            );
            if ratio > worst.0 {
                worst = (ratio, format!("{name} {} ({})", row.collective.name(), row.algorithm));
            }
        }
    }
    assert!(
        worst.0 <= MAX_RATIO,
        "{} is {:.3}× its bound",
        worst.1,
        worst.0
    );
}
