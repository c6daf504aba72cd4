//! Schedule quality on the shipped single-node machines: at 1 GiB the chosen AllReduce,
//! AllGather and ReduceScatter schedules are within 10% of the lower bound, and no choice
//! beats its bound. (Whether the choice beats the NCCL baseline is not checked here: NCCL's
//! families are candidates of the search, so it cannot lose; `nccl_baseline.rs` checks the
//! baseline itself.)

use hccl_compiler::search::{self, Options};
use hccl_ir::CollectiveKind;

/// Single-node shipped machines (all of them reach the 10% target).
const MACHINES: [&str; 4] = ["dgx1-v100", "dgx-a100", "dgx-h100", "ascend910-8"];
/// Largest allowed predicted time / lower bound at 1 GiB.
const MAX_RATIO: f64 = 1.10;
const GIB: u64 = 1 << 30;

fn options() -> Options {
    // Eight sizes from 1 KiB (×4 apart) and 1 GiB.
    let mut sizes: Vec<u64> = (0..8).map(|i| 1u64 << (10 + 2 * i)).collect();
    sizes.push(GIB);
    Options {
        collectives: vec![
            CollectiveKind::AllReduce,
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
        ],
        sizes,
        ..Options::default()
    }
}

#[test]
fn large_sizes_are_near_the_bound() {
    let opts = options();
    for name in MACHINES {
        let topo = hccl_topologies::shipped_by_name(name).expect("shipped machine");
        assert_eq!(topo.nhosts(), 1, "{name} is a single-node machine");
        let compiled = search::compile(&topo, &opts).expect("compiles");
        assert_eq!(
            compiled.rows.len(),
            opts.collectives.len() * opts.sizes.len()
        );
        for row in &compiled.rows {
            let what = format!(
                "{name} {} {} B ({})",
                row.collective, row.bytes, row.algorithm
            );
            assert!(
                row.predicted_us >= row.bound_us * (1.0 - 1e-9),
                "{what} beats its bound"
            );
            if row.bytes == GIB {
                assert!(
                    row.bound_ratio() <= MAX_RATIO,
                    "{what}: {} µs is {:.3}× the bound {} µs",
                    row.predicted_us,
                    row.bound_ratio(),
                    row.bound_us
                );
            }
        }
    }
}

#[test]
fn groups_and_packed_rings_verify_on_the_machines_they_are_for() {
    use hccl_compiler::families::FamilyParams;
    use hccl_compiler::search::generate_with;
    use hccl_ir::{Collective, verify::verify};
    let ascend = hccl_topologies::shipped_by_name("ascend910-8").unwrap();
    let groups = hccl_compiler::families::groups::link_groups(&ascend).expect("two HCCS meshes");
    assert_eq!(groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    let dgx1 = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    // DGX-1's six NVLink ports per GPU hold three link-disjoint Hamiltonian cycles: six rings.
    let rings = hccl_compiler::families::ring::link_rings(&dgx1, 6);
    let mut used = std::collections::HashMap::new();
    for ring in &rings {
        for i in 0..ring.len() {
            *used
                .entry((ring[i], ring[(i + 1) % ring.len()]))
                .or_insert(0u32) += 1;
        }
    }
    for (&(a, b), &k) in &used {
        let links = dgx1.graph[dgx1.direct_edge(a, b).expect("ring hop is a direct link")].count;
        assert!(k <= links, "{a}->{b} used by {k} rings over {links} links");
    }
    assert_eq!(used.values().sum::<u32>(), 48, "6 rings × 8 hops");
    let params = FamilyParams {
        channels: 2,
        pipeline: 2,
    };
    for (family, topo) in [("groups", &ascend), ("ring", &dgx1)] {
        let params = FamilyParams {
            channels: if family == "ring" { 6 } else { params.channels },
            ..params
        };
        for coll in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
        ] {
            for in_place in [false, true] {
                let cands = generate_with(family, topo, coll, params, in_place).unwrap();
                assert!(!cands.is_empty(), "{family} {coll} on {}", topo.name);
                for c in cands {
                    verify(&c.schedule).unwrap_or_else(|e| {
                        panic!("{family} {coll} in_place={in_place}: {:?}", &e[..1])
                    });
                }
            }
        }
    }
}
