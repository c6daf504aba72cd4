//! The CPU-host cost model (`cost::cpu`): calls segmented as the executor segments them,
//! sizes ordered, and never a prediction below the lower bound, calibrated or not.

use hccl_compiler::cost::{CostModel, EXECUTOR_SLOT_BYTES, Network, Simulator, bounds};
use hccl_compiler::search::all_families;
use hccl_ir::{Collective, Protocol, Schedule};
use hccl_topologies::{Calibration, Topology};

fn host(n: u32) -> Topology {
    hccl_topologies::build(hccl_topologies::generate::host(n, 6.0), "host").unwrap()
}

/// Every family's candidates for `coll` on `topo` (all parameters).
fn candidates(topo: &Topology, coll: Collective) -> Vec<(String, Schedule)> {
    let mut out = Vec::new();
    for f in all_families() {
        if !f.supports(coll.kind()) {
            continue;
        }
        for p in f.param_space(topo, coll) {
            for c in f.generate(topo, coll, p) {
                out.push((f.name().to_string(), c.schedule));
            }
        }
    }
    out
}

const COLLECTIVES: [Collective; 6] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::Broadcast { root: 0 },
    Collective::Reduce { root: 1 },
];

#[test]
fn host_topologies_get_the_cpu_model() {
    assert!(CostModel::for_topology(&host(2)).cpu.is_some());
    let nic = hccl_topologies::generate::host_with_nic(2, 6.0, 1.25, 25.0);
    let cluster = hccl_topologies::build(hccl_topologies::generate::cluster(2, &nic), "c").unwrap();
    assert!(
        CostModel::for_topology(&cluster).cpu.is_none(),
        "clusters keep the flow model"
    );
}

/// A call larger than the slots allow runs in segments, one after the other.
#[test]
fn calls_beyond_the_slot_run_in_sequential_segments() {
    let topo = host(2);
    let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
    let (_, oneshot) = candidates(&topo, Collective::AllReduce)
        .into_iter()
        .find(|(n, s)| n == "oneshot" && s.chunks == 1)
        .expect("a one-chunk oneshot");
    let one = sim
        .simulate(&oneshot, EXECUTOR_SLOT_BYTES, Protocol::Simple)
        .unwrap();
    let four = sim
        .simulate(&oneshot, 4 * EXECUTOR_SLOT_BYTES, Protocol::Simple)
        .unwrap();
    let per = one.time_us - one.base_us;
    let ratio = (four.time_us - four.base_us) / per;
    assert!(
        (ratio - 4.0).abs() < 1e-6,
        "four segments cost {ratio}x one"
    );
    assert_eq!(four.messages, 4 * one.messages);
}

/// No candidate of any collective beats the lower bound, uncalibrated or under a
/// calibration that makes bandwidth, latencies and CPU work cheaper or dearer.
#[test]
fn no_candidate_beats_the_bound_on_cpu_hosts() {
    let cals = [
        None,
        Some(Calibration {
            base_scale: 0.05,
            message_scale: [0.2, 1.0, 1.0],
            step_scale: 0.1,
            send_scale: 0.1,
            recv_scale: 0.1,
            local_scale: 0.05,
            bandwidth: vec![(8, 20.0), (1 << 20, 8.0), (64 << 20, 0.5)],
            ..Calibration::identity("cheap")
        }),
        Some(Calibration {
            base_scale: 4.0,
            message_scale: [6.0, 1.0, 1.0],
            step_scale: 5.0,
            send_scale: 3.0,
            recv_scale: 3.0,
            local_scale: 2.0,
            ..Calibration::identity("dear")
        }),
    ];
    for n in [2, 3, 4] {
        let topo = host(n);
        for cal in &cals {
            let model = match cal {
                Some(c) => CostModel::for_topology(&topo).calibrated(c),
                None => CostModel::for_topology(&topo),
            };
            let sim = Simulator::new(Network::new(&topo), model.clone());
            for coll in COLLECTIVES {
                for (name, s) in candidates(&topo, coll) {
                    for bytes in [8u64, 4096, 1 << 20, 64 << 20] {
                        let t = sim.simulate(&s, bytes, Protocol::Simple).unwrap().time_us;
                        let b = bounds::bound(&sim.network, &model, coll, bytes).total_us;
                        assert!(
                            t >= b * (1.0 - 1e-9),
                            "{n} ranks, {coll}, {name} ({} chunks), {bytes} B: {t} < bound {b} ({:?})",
                            s.chunks,
                            cal.as_ref().map(|c| &c.source)
                        );
                    }
                }
            }
        }
    }
}

/// Without a calibration, more bytes never take less time.
#[test]
fn time_grows_with_size() {
    let topo = host(3);
    let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
    for coll in COLLECTIVES {
        for (name, s) in candidates(&topo, coll) {
            let mut last = 0.0;
            for k in 3..28 {
                let t = sim
                    .simulate(&s, 1u64 << k, Protocol::Simple)
                    .unwrap()
                    .time_us;
                assert!(t >= last, "{coll} {name}: {t} at 2^{k} after {last}");
                last = t;
            }
        }
    }
}

/// A CPU cluster of two hosts with `per_host` ranks each (ranks 0.. on host 0).
fn cpu_cluster(per_host: u32) -> Topology {
    let nic = hccl_topologies::generate::host_with_nic(per_host, 6.0, 1.25, 25.0);
    hccl_topologies::build(hccl_topologies::generate::cluster(2, &nic), "c").unwrap()
}

/// `k` one-chunk messages from `from` to `to`, each on a stream (and channel) of its own, so
/// that nothing in the schedule orders them.
fn fan(n: u32, from: u32, to: u32, k: u32) -> Schedule {
    use super::cost_common::{recv, send, skeleton, stream};
    let mut s = skeleton(n, k);
    for c in 0..k {
        stream(&mut s, from, c, vec![send(to, c, 1)]);
        stream(&mut s, to, c, vec![recv(from, c, 1)]);
    }
    s
}

/// The CPU executor's engine writes each message to another host into its socket itself, so
/// a rank's network messages start `net_gap_us` apart; messages inside a host, and models
/// without the gap (GPUs), overlap them as before.
#[test]
fn a_ranks_messages_to_other_hosts_start_a_gap_apart() {
    assert_eq!(CostModel::default().net_gap_us, 0.0);
    let two = cpu_cluster(1);
    let model = CostModel::for_topology(&two);
    let gap = model.net_gap_us;
    assert!(gap > 0.0, "the CPU cluster model has a gap");
    let without = CostModel {
        net_gap_us: 0.0,
        ..model.clone()
    };
    let time = |topo: &Topology, m: &CostModel, s: &Schedule| {
        let sim = Simulator::new(Network::new(topo), m.clone());
        sim.simulate(s, 64, Protocol::Simple).unwrap().time_us
    };
    // Four 16-byte messages from host 0 to host 1 against one: three gaps more, where the
    // bandwidth alone accounts for well under 0.1 µs.
    let (one, four) = (fan(2, 0, 1, 1), fan(2, 0, 1, 4));
    let spread = time(&two, &model, &four) - time(&two, &model, &one);
    assert!(
        (spread - 3.0 * gap).abs() < 0.1,
        "{spread} µs for 3 gaps of {gap}"
    );
    let spread = time(&two, &without, &four) - time(&two, &without, &one);
    assert!(spread.abs() < 0.1, "{spread} µs without the gap");
    // Inside a host: no gap.
    let four_local = cpu_cluster(2);
    let local =
        time(&four_local, &model, &fan(4, 0, 1, 4)) - time(&four_local, &model, &fan(4, 0, 1, 1));
    assert!(local.abs() < 0.1, "{local} µs between ranks of one host");
    // Calibration scales it with the network's per-message latencies.
    let cal = Calibration {
        message_scale: [1.0, 1.0, 0.5],
        ..Calibration::identity("half")
    };
    let halved = model.calibrated(&cal);
    assert_eq!(halved.net_gap_us, 0.5 * gap);
    let back = halved.calibrated(&Calibration::identity("none"));
    assert_eq!(back.net_gap_us, gap);
}
