//! Properties of the generators: link counts, degrees, sizes, and that every generated spec
//! round-trips through `to_ron` / `from_ron` and builds.

use hccl_topologies::{
    LinkKind, SwitchKind, TopologySpec, bandwidth_matrix, build, from_ron, generate, parse_spec,
    shipped_by_name, to_ron,
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

    #[test]
    fn host_with_nic_builds(
        ranks in 1u32..64,
        mem_bw in 1.0f64..100.0,
        nic_bw in 0.01f64..50.0,
        latency in 0.5f64..200.0,
    ) {
        let spec = generate::host_with_nic(ranks, mem_bw, nic_bw, latency);
        let topo = build(spec.clone(), "host").unwrap();
        prop_assert_eq!(topo.nranks(), ranks);
        prop_assert_eq!(topo.nhosts(), 1);
        let nics = &spec.hosts[0].nics;
        prop_assert_eq!(nics.len(), 1);
        prop_assert_eq!(nics[0].bw, nic_bw);
        prop_assert_eq!(nics[0].kind, Some(LinkKind::Ethernet));
        prop_assert_eq!(nics[0].latency, Some(latency / 2.0));
        round_trips(&spec);
    }
}

#[test]
fn host_with_nic_is_the_host_plus_one_nic_on_its_memory() {
    let plain = generate::host(3, 20.0);
    let spec = generate::host_with_nic(3, 20.0, 1.25, 25.0);
    assert_eq!(spec.name, "host3-nic");
    assert_eq!(spec.hosts[0].devices, plain.hosts[0].devices);
    assert_eq!(spec.switches, plain.switches);
    assert_eq!(spec.links[..plain.links.len()], plain.links[..]);
    let extra = &spec.links[plain.links.len()..];
    assert_eq!(extra.len(), 1);
    assert_eq!((extra[0].a.as_str(), extra[0].b.as_str()), ("mem", "nic0"));
    assert_eq!(extra[0].bw, 1.25);
    // The host alone: the NIC leads nowhere, ranks still talk through memory at mem_bw.
    let m = bandwidth_matrix(&build(spec, "h").unwrap());
    assert_eq!(m[0][1], 20.0);
}

#[test]
fn clusters_of_cpu_hosts_are_host_major_behind_one_ethernet_switch() {
    for per_host in 1..=3u32 {
        let b = generate::host_with_nic(per_host, 20.0, 1.25, 25.0);
        for k in 1..=4u32 {
            let spec = generate::cluster(k, &b);
            let topo = build(spec.clone(), "cpu cluster").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(topo.nranks(), k * per_host);
            assert_eq!(topo.nhosts(), k as usize);
            for r in 0..topo.nranks() {
                let (h, i) = (r / per_host, r % per_host);
                assert_eq!(topo.host_of[r as usize], h as usize);
                assert_eq!(
                    topo.graph[topo.ranks[r as usize]].id(),
                    format!("n{h}.cpu{i}")
                );
            }
            // One Ethernet switch, no spine: every host's NIC links to it.
            let net: Vec<_> = spec.links.iter().filter(|l| l.kind.is_network()).collect();
            assert_eq!(net.len(), k as usize);
            for (h, l) in net.iter().enumerate() {
                assert_eq!((l.a.clone(), l.b.as_str()), (format!("n{h}.nic0"), "rail0"));
                assert_eq!((l.kind, l.bw, l.latency), (LinkKind::Ethernet, 1.25, 12.5));
            }
            let leaves = spec.switches.iter().filter(|s| s.kind == SwitchKind::Leaf);
            assert_eq!(leaves.count(), 1);
            assert!(spec.switches.iter().all(|s| s.kind != SwitchKind::Spine));
            // Within a host memory bandwidth, across hosts the NIC's.
            let m = bandwidth_matrix(&topo);
            if per_host > 1 {
                assert_eq!(m[0][1], 20.0);
            }
            if k > 1 {
                assert!((m[0][per_host as usize] - 1.25).abs() < 1e-9, "{m:?}");
            }
            round_trips(&spec);
        }
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
