//! Properties of the generators: link counts, degrees, sizes, and that every generated spec
//! round-trips through `to_ron` / `from_ron` and builds.

use hccl_topologies::{
    TopologySpec, build, from_ron, generate, parse_spec, shipped_by_name, to_ron,
};
use proptest::prelude::*;

fn round_trips(spec: &TopologySpec) {
    let text = to_ron(spec);
    assert_eq!(
        &parse_spec(&text, "gen").unwrap(),
        spec,
        "to_ron/from_ron round trip"
    );
    let built = from_ron(&text, "gen").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.hash, build(spec.clone(), "gen").unwrap().hash);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn ring_has_n_links_and_degree_two(n in 3u32..40, bw in 0.5f64..500.0) {
        let spec = generate::ring(n, bw, 1.0);
        prop_assert_eq!(spec.links.len(), n as usize);
        let topo = build(spec.clone(), "ring").unwrap();
        prop_assert_eq!(topo.nranks(), n);
        for &v in &topo.ranks {
            prop_assert_eq!(topo.graph.neighbors(v).count(), 2);
        }
        round_trips(&spec);
    }

    #[test]
    fn torus_degrees_follow_the_dimensions(dims in prop::collection::vec(1u32..6, 2..=3)) {
        prop_assume!(dims.iter().product::<u32>() >= 2);
        let spec = generate::torus(&dims, 10.0, 0.5);
        let want: usize = dims.iter().map(|&d| match d { 1 => 0, 2 => 1, _ => 2 }).sum();
        let topo = build(spec.clone(), "torus").unwrap();
        prop_assert_eq!(topo.nranks(), dims.iter().product::<u32>());
        for &v in &topo.ranks {
            prop_assert_eq!(topo.graph.neighbors(v).count(), want);
        }
        round_trips(&spec);
    }

    #[test]
    fn fat_tree_builds(ranks in 1u32..40, per_leaf in 1u32..9) {
        let spec = generate::fat_tree(ranks, per_leaf, 25.0, 1.0);
        let topo = build(spec.clone(), "ft").unwrap();
        prop_assert_eq!(topo.nranks(), ranks);
        prop_assert_eq!(topo.nhosts(), ranks as usize);
        round_trips(&spec);
    }

    #[test]
    fn host_builds(ranks in 1u32..64, mem_bw in 1.0f64..100.0) {
        let spec = generate::host(ranks, mem_bw);
        let topo = build(spec.clone(), "host").unwrap();
        prop_assert_eq!(topo.nranks(), ranks);
        prop_assert_eq!(topo.nhosts(), 1);
        prop_assert_eq!(topo.mem_bw(0), mem_bw);
        round_trips(&spec);
    }
}

#[test]
fn clusters_of_k_boxes_have_k_times_the_ranks() {
    for name in ["dgx1-v100", "dgx-a100", "dgx-h100", "ascend910-8"] {
        let b = shipped_by_name(name).unwrap();
        for k in 1..=3u32 {
            let spec = generate::cluster(k, &b.spec);
            let topo = build(spec.clone(), name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(topo.nranks(), k * b.nranks(), "{name} × {k}");
            assert_eq!(topo.nhosts(), k as usize * b.nhosts());
            for r in 0..topo.nranks() {
                assert_eq!(topo.host_of[r as usize], r as usize / b.nranks() as usize);
            }
            round_trips(&spec);
        }
    }
}

#[test]
fn small_rings() {
    assert!(build(generate::ring(0, 1.0, 1.0), "r").is_err());
    assert_eq!(build(generate::ring(1, 1.0, 1.0), "r").unwrap().nranks(), 1);
    assert_eq!(generate::ring(2, 1.0, 1.0).links.len(), 1);
}
