//! Lower bounds: no schedule beats them, and good schedules get close to them.

use crate::cost_common;

use cost_common::*;
use hccl_compiler::cost::{self, CostModel, Network, Simulator, bounds::bound, bounds::max_flow};
use hccl_compiler::search::collective_of;
use hccl_compiler::search::{all_families, baseline};
use hccl_ir::{Collective, CollectiveKind, Protocol};
use hccl_topologies::{Topology, generate as tgen};

const SIZES: [u64; 4] = [1 << 10, 1 << 16, 1 << 22, 1 << 28];

fn topologies() -> Vec<Topology> {
    let mut out: Vec<Topology> = hccl_topologies::shipped()
        .iter()
        .map(|(name, _)| hccl_topologies::shipped_by_name(name).expect("shipped builds"))
        .collect();
    out.push(hccl_topologies::build(tgen::ring(6, 25.0, 0.7), "ring6").unwrap());
    out.push(hccl_topologies::build(tgen::torus(&[2, 3], 20.0, 0.5), "torus").unwrap());
    out
}

#[test]
fn no_builtin_candidate_beats_the_bound() {
    let model = CostModel::default();
    let checked = std::sync::atomic::AtomicUsize::new(0);
    // Largest machines first, so that no long case starts last.
    let mut cases: Vec<(Topology, CollectiveKind)> = topologies()
        .into_iter()
        .flat_map(|t| CollectiveKind::ALL.map(|k| (t.clone(), k)))
        .collect();
    cases.sort_by_key(|(t, _)| std::cmp::Reverse(t.nranks()));
    par_each(&cases, |(topo, kind)| {
        let kind = *kind;
        let sim = Simulator::new(Network::new(topo), model.clone());
        let collective = collective_of(kind);
        let bounds: Vec<f64> = SIZES
            .iter()
            .map(|&b| bound(&sim.network, &model, collective, b).total_us)
            .collect();
        for family in all_families().iter().filter(|f| f.supports(kind)) {
            for params in family.param_space(topo, collective) {
                for cand in family.generate(topo, collective, params) {
                    let Ok(prepared) = sim.prepare(&cand.schedule) else {
                        continue;
                    };
                    for p in Protocol::ALL {
                        // Only the sizes the search costs the candidate at: the deep
                        // pipelines (100k steps and more on the H100 clusters) from their
                        // least size up.
                        for (i, &bytes) in SIZES.iter().enumerate() {
                            if bytes < cand.min_bytes {
                                continue;
                            }
                            // A run that passes the bound stops there (`run_within`: its
                            // clock only moves forward), which decides the check as surely
                            // as running to the end.
                            let floor = bounds[i] * (1.0 - 1e-9);
                            let within = sim.run_within(&prepared, bytes, p, floor).unwrap();
                            if let Some(e) = within {
                                panic!(
                                    "{} {kind} {} {params:?} {p} at {bytes} B: {} µs < bound {} µs",
                                    topo.name, cand.algorithm, e.time_us, bounds[i]
                                );
                            }
                            checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    });
    let checked = checked.into_inner();
    assert!(checked > 1000, "only {checked} checks ran");
}

#[test]
fn ring_on_two_gpus_reaches_the_bound_at_large_sizes() {
    // Two GPUs, one 25 GB/s link: ring AllReduce moves M/2 each way twice = M / 25 GB/s,
    // exactly the gossip bound 2(N-1)M / ΣB_in.
    let t = topo(2, &[], &[("g0", "g1", 25.0, 0.7)]);
    let s = ring_allreduce(2, 8);
    let bytes = 1u64 << 30;
    let est = cost::simulate(&t, &s, bytes, Protocol::Simple, &CostModel::default()).unwrap();
    let b = cost::bounds(&t, Collective::AllReduce, bytes);
    assert!((b.bandwidth_us - bytes as f64 / 25e3).abs() < 1e-6);
    let ratio = est.time_us / b.total_us;
    assert!((1.0..1.02).contains(&ratio), "ratio {ratio}");
}

#[test]
fn cut_bounds_by_collective() {
    // Uniform ring of 4, 25 GB/s links: every GPU has 50 GB/s in and out.
    let t = ring_topo(4, 25.0, 1.0);
    let m = 1u64 << 30;
    let mf = m as f64;
    let ag = cost::bounds(&t, Collective::AllGather, m);
    // Complement of a singleton: 3/4 M must enter one GPU through 50 GB/s.
    assert!((ag.bandwidth_us - 0.75 * mf / 50e3).abs() < 1e-6, "{ag:?}");
    let rs = cost::bounds(&t, Collective::ReduceScatter, m);
    assert!((rs.bandwidth_us - ag.bandwidth_us).abs() < 1e-6);
    let ar = cost::bounds(&t, Collective::AllReduce, m);
    // Gossip: 2·3·M over 4 × 50 GB/s = 1.5 M / 50 GB/s; the cut M / 50 GB/s is weaker.
    assert!((ar.bandwidth_us - 1.5 * mf / 50e3).abs() < 1e-6, "{ar:?}");
    let bc = cost::bounds(&t, Collective::Broadcast { root: 0 }, m);
    assert!((bc.bandwidth_us - mf / 50e3).abs() < 1e-6, "{bc:?}");
    let a2a = cost::bounds(&t, Collective::AllToAll, m);
    // Two neighbours send 2·2·M/4 = M to the other two through the 2 × 25 GB/s leaving
    // them (a single GPU's 3M/4 through 50 GB/s is weaker).
    assert!((a2a.bandwidth_us - mf / 50e3).abs() < 1e-6, "{a2a:?}");
    // Latency grows with distance; the total is at least both terms.
    assert!(ar.total_us >= ar.latency_us && ar.total_us >= ar.bandwidth_us);
}

#[test]
fn max_flow_counts_parallel_paths() {
    let t = ring_topo(4, 25.0, 1.0);
    let net = Network::new(&t);
    assert!((max_flow(&net, 0, 2) - 50.0).abs() < 1e-9);
    let h = hccl_topologies::shipped_by_name("dgx-h100").unwrap();
    let net = Network::new(&h);
    // 18 NVLink4 × 25 GB/s to the (merged) NVSwitch plane.
    assert!(
        (max_flow(&net, 0, 5) - 450.0).abs() < 1e-6,
        "{}",
        max_flow(&net, 0, 5)
    );
}

#[test]
fn bounds_for_one_rank_are_the_launch_latency() {
    let t = topo(1, &[], &[]);
    let b = cost::bounds(&t, Collective::AllReduce, 1 << 20);
    assert_eq!(b.bandwidth_us, 0.0);
    assert_eq!(b.total_us, CostModel::default().min_base_us());
}

#[test]
fn baseline_is_ring_or_tree_and_costed() {
    let t = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    for (bytes, coll) in [
        (1u64 << 10, Collective::AllReduce),
        (1 << 28, Collective::AllReduce),
        (1 << 20, Collective::AllGather),
    ] {
        let b = baseline(&t, coll, bytes)
            .unwrap()
            .expect("ring family exists");
        assert!(["ring", "tree"].contains(&b.algorithm.as_str()), "{b:?}");
        let lb = cost::bounds(&t, coll, bytes);
        assert!(b.time_us >= lb.total_us, "{b:?} vs {lb:?}");
    }
    let large = baseline(&t, Collective::AllReduce, 1 << 28)
        .unwrap()
        .unwrap();
    assert_eq!(large.protocol, Protocol::Simple);
    let small = baseline(&t, Collective::AllReduce, 1 << 10)
        .unwrap()
        .unwrap();
    assert_eq!(small.protocol, Protocol::LL);
}

#[test]
fn mirrored_routes_match_the_simulator_routes() {
    // The route-aware bounds enumerate the routes the simulator may use; they must be the
    // simulator's own, whether a source asks for one peer at a time or all at once.
    for topo in topologies() {
        let n = topo.nranks();
        let possible = hccl_compiler::cost::bounds::possible_routes(&Network::new(&topo));
        let one_by_one = Network::new(&topo);
        let all_at_once = Network::new(&topo);
        let pairs: Vec<(u32, u32)> = (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect();
        let batch = all_at_once.routes(&pairs).unwrap();
        for (i, &(a, b)) in pairs.iter().enumerate() {
            let single = one_by_one.routes(&[(a, b)]).unwrap();
            for route in [&single[0], &batch[i]] {
                assert!(
                    possible
                        .iter()
                        .any(|(x, y, r)| (*x, *y) == (a, b) && *r == route.resources),
                    "{}: route {a}->{b} {:?} not enumerated",
                    topo.name,
                    route.resources
                );
            }
        }
    }
}

#[test]
fn route_aware_bounds_on_shipped_machines() {
    let gib = 1u64 << 30;
    let mf = gib as f64;
    let close = |got: f64, want: f64| (got - want).abs() < 1e-6 * want;
    // DGX H100: the GPU's PCIe link to its NIC leads nowhere on one host, so a GPU receives
    // at its 18 × 25 GB/s NVLink only: (7/8)·M / 450 GB/s.
    let h100 = hccl_topologies::shipped_by_name("dgx-h100").unwrap();
    let ag = cost::bounds(&h100, Collective::AllGather, gib);
    assert!(close(ag.bandwidth_us, 0.875 * mf / 450e3), "{ag:?}");
    // Atlas 800: everything between the two HCCS meshes crosses one 31.5 GB/s PCIe bridge;
    // AllReduce moves M each way over it, AllGather half of that.
    let ascend = hccl_topologies::shipped_by_name("ascend910-8").unwrap();
    let ar = cost::bounds(&ascend, Collective::AllReduce, gib);
    assert!(close(ar.bandwidth_us, mf / 31.5e3), "{ar:?}");
    let ag = cost::bounds(&ascend, Collective::AllGather, gib);
    assert!(close(ag.bandwidth_us, 0.5 * mf / 31.5e3), "{ag:?}");
    // DGX-1: GPUs receive over 8 × 6 NVLink2 (1200 GB/s) plus PCIe routes, all of which
    // cross the four 15.75 GB/s switch uplinks: AllReduce delivers 2·7·M over 1263 GB/s.
    let dgx1 = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let ar = cost::bounds(&dgx1, Collective::AllReduce, gib);
    assert!(close(ar.bandwidth_us, 14.0 * mf / 1263e3), "{ar:?}");
}

/// `Simulator::path_bound_past` settles most questions from the walks it took at other sizes
/// (`cost/path_points.rs`), and every answer is the one a walk at that size gives: limits
/// far from the path, a few ulps either side of the margin, and exactly on it, asked in an
/// order that jumps between sizes, under every protocol.
#[test]
fn critical_path_questions_settled_from_walks_agree_with_walks() {
    let model = CostModel::default();
    let sizes: Vec<u64> = (0..24).map(|k| 1u64 << (8 + k)).collect();
    // Sizes out of order: ends, the middle, then every other one down, then the rest.
    let n = sizes.len();
    let mut order: Vec<usize> = vec![n - 1, 0, n / 2];
    let odd: Vec<usize> = (1..n - 1)
        .rev()
        .step_by(2)
        .filter(|&i| i != n / 2)
        .collect();
    order.extend(&odd);
    let rest: Vec<usize> = (0..n).filter(|i| !order.contains(i)).collect();
    order.extend(rest);
    let factors = [
        0.5,
        0.99,
        1.0 - 1e-9,
        1.0 - 1e-12,
        1.0,
        1.0 + 1e-12,
        1.0 + 1e-9,
        1.01,
        2.0,
    ];
    let (mut asked, mut walked, mut schedules) = (0usize, 0usize, 0usize);
    for name in ["dgx1-v100", "h100-cluster-2node"] {
        let topo = hccl_topologies::shipped_by_name(name).unwrap();
        let sim = Simulator::new(Network::new(&topo), model.clone());
        for kind in [CollectiveKind::AllReduce, CollectiveKind::Broadcast] {
            let collective = collective_of(kind);
            for family in all_families().iter().filter(|f| f.supports(kind)) {
                for params in family.param_space(&topo, collective).into_iter().take(3) {
                    for cand in family.generate(&topo, collective, params) {
                        if cand.schedule.step_count() > 20_000 {
                            continue;
                        }
                        let Ok(prepared) = sim.prepare(&cand.schedule) else {
                            continue;
                        };
                        schedules += 1;
                        for p in Protocol::ALL {
                            for &i in &order {
                                let bytes = sizes[i];
                                let path = sim.routed_bound_us(&prepared, bytes, p);
                                for f in factors {
                                    // Limits whose margin lands near the path, and the path.
                                    let limit = path * f / (1.0 + 1e-9);
                                    for limit in [limit, path * f] {
                                        let want = path.is_finite() && path > limit * (1.0 + 1e-9);
                                        let got = sim.path_bound_past(&prepared, (bytes, p), limit);
                                        assert_eq!(
                                            got, want,
                                            "{name} {kind} {} {p} at {bytes} B: path {path} µs, limit {limit} µs",
                                            cand.algorithm
                                        );
                                        asked += 1;
                                    }
                                }
                            }
                        }
                        walked += prepared.path_walks();
                    }
                }
            }
        }
    }
    assert!(schedules > 20, "only {schedules} schedules");
    // Each question near the path walks; most others are settled.
    assert!(walked * 3 < asked, "{walked} walks for {asked} questions");
}
