//! Simulator tests with hand-computed expectations.

use crate::cost_common;

use cost_common::*;
use hccl_compiler::cost::{CostError, CostModel, Network, Simulator, simulate};
use hccl_ir::{Dep, Loc, Op, Protocol, Step};

const MIB: u64 = 1 << 20;

/// A model without protocol latencies: times are pure link latency + bytes / bandwidth.
fn bare() -> CostModel {
    CostModel {
        base_us: [0.0; 3],
        message_us: [[0.0; 3]; 3],
        ..CostModel::default()
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-6 * b.abs().max(1.0), "{a} != {b}");
}

fn two_gpus() -> hccl_topologies::Topology {
    topo(2, &[], &[("g0", "g1", 25.0, 1.0)])
}

#[test]
fn one_transfer_is_latency_plus_bytes_over_bandwidth() {
    let t = two_gpus();
    let mut s = skeleton(2, 1);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    let est = simulate(&t, &s, MIB, Protocol::Simple, &bare()).unwrap();
    // 1 µs + 1048576 B / 25e3 B/µs = 1 + 41.94304.
    close(est.time_us, 1.0 + 41.943_04);
    assert_eq!(est.messages, 1);
    close(est.payload_bytes, MIB as f64);
}

#[test]
fn protocol_costs_follow_the_table() {
    let t = two_gpus();
    let mut s = skeleton(2, 1);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    let m = CostModel::default();
    let simple = simulate(&t, &s, MIB, Protocol::Simple, &m).unwrap();
    close(simple.time_us, 8.4 + 3.4 + 1.0 + 41.943_04);
    let ll = simulate(&t, &s, MIB, Protocol::LL, &m).unwrap();
    close(ll.time_us, 6.6 + 0.6 + 1.0 + 2.0 * 41.943_04);
    let ll128 = simulate(&t, &s, MIB, Protocol::LL128, &m).unwrap();
    close(ll128.time_us, 14.0 + 1.9 + 1.0 + 41.943_04 * 128.0 / 120.0);
    // Tiny messages: LL wins, as in NCCL.
    let tiny_ll = simulate(&t, &s, 1024, Protocol::LL, &m).unwrap();
    let tiny_simple = simulate(&t, &s, 1024, Protocol::Simple, &m).unwrap();
    assert!(tiny_ll.time_us < tiny_simple.time_us);
}

#[test]
fn two_transfers_sharing_a_link_take_twice_as_long() {
    let t = two_gpus();
    let mut s = skeleton(2, 2);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(&mut s, 0, 1, vec![send(1, 1, 1)]);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    stream(&mut s, 1, 1, vec![recv(0, 1, 1)]);
    // Each message is one chunk of 1 MiB: 2 MiB over one 25 GB/s link.
    let est = simulate(&t, &s, 2 * MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 1.0 + 2.0 * 41.943_04);
}

#[test]
fn opposite_directions_do_not_share() {
    let t = two_gpus();
    let mut s = skeleton(2, 2);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(&mut s, 0, 1, vec![recv(1, 1, 1)]);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    stream(&mut s, 1, 1, vec![send(0, 1, 1)]);
    let est = simulate(&t, &s, 2 * MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 1.0 + 41.943_04);
}

#[test]
fn max_min_fair_share_over_different_routes() {
    // Star: g0 -> sw at 30 GB/s, every other link 25 GB/s, 0.5 µs per hop.
    let t = topo(
        3,
        &["sw"],
        &[
            ("g0", "sw", 30.0, 0.5),
            ("g1", "sw", 25.0, 0.5),
            ("g2", "sw", 25.0, 0.5),
        ],
    );
    // A: 0→2 (1 MiB), B: 1→2 (1 MiB), C: 0→1 (2 MiB); chunk = 1 MiB.
    let mut s = skeleton(3, 4);
    stream(&mut s, 0, 0, vec![send(2, 0, 1)]);
    stream(&mut s, 1, 0, vec![send(2, 1, 1)]);
    stream(&mut s, 0, 1, vec![send(1, 2, 2)]);
    stream(&mut s, 2, 0, vec![recv(0, 0, 1)]);
    stream(&mut s, 2, 0, vec![recv(1, 1, 1)]);
    stream(&mut s, 1, 1, vec![recv(0, 2, 2)]);
    let est = simulate(&t, &s, 4 * MIB, Protocol::Simple, &bare()).unwrap();
    // sw→g2 is the bottleneck of A and B: 12.5 GB/s each. C gets what A leaves on g0→sw:
    // 30 − 12.5 = 17.5 GB/s, until A and B finish; then the 25 GB/s of sw→g1.
    let phase1 = MIB as f64 / 12_500.0;
    let moved = 17_500.0 * phase1;
    let rest = (2.0 * MIB as f64 - moved) / 25_000.0;
    close(est.time_us, phase1 + rest + 1.0);
}

#[test]
fn equivalent_switches_are_striped() {
    // Two switches with the same neighbours: traffic uses both (25 + 25 GB/s).
    let t = topo(
        2,
        &["s0", "s1"],
        &[
            ("g0", "s0", 25.0, 0.5),
            ("g0", "s1", 25.0, 0.5),
            ("g1", "s0", 25.0, 0.5),
            ("g1", "s1", 25.0, 0.5),
        ],
    );
    let mut s = skeleton(2, 1);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    let est = simulate(&t, &s, MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 1.0 + MIB as f64 / 50_000.0);
}

#[test]
fn local_work_costs_memory_bandwidth() {
    let t = two_gpus();
    let mut s = skeleton(2, 1);
    // mem_bw 100 GB/s: reduce = 3 passes, copy = 2 passes.
    stream(
        &mut s,
        0,
        0,
        vec![
            Step::new(
                Op::Reduce {
                    src: Loc::input(0),
                    dst: Loc::output(0),
                },
                1,
            ),
            Step::new(
                Op::Copy {
                    src: Loc::output(0),
                    dst: Loc::scratch(0),
                },
                1,
            ),
        ],
    );
    let est = simulate(&t, &s, MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 5.0 * MIB as f64 / 100_000.0);
}

#[test]
fn fused_reduction_overlaps_the_transfer() {
    let t = two_gpus();
    let mut s = skeleton(2, 1);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(
        &mut s,
        1,
        0,
        vec![Step::new(
            Op::RecvReduceCopy {
                from: 0,
                src: Loc::input(0),
                dst: Loc::output(0),
            },
            1,
        )],
    );
    // 2 passes at 100 GB/s (20.97 µs) hide under the 41.94 µs transfer.
    let est = simulate(&t, &s, MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 1.0 + 41.943_04);
}

#[test]
fn dependencies_across_streams_serialise() {
    let t = two_gpus();
    let mut s = skeleton(2, 2);
    stream(&mut s, 0, 0, vec![send(1, 0, 1)]);
    stream(
        &mut s,
        0,
        1,
        vec![send(1, 1, 1).with_deps([Dep { stream: 0, step: 0 }])],
    );
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    stream(&mut s, 1, 1, vec![recv(0, 1, 1)]);
    // The second send starts when the first has left: back to back, full bandwidth each.
    let est = simulate(&t, &s, 2 * MIB, Protocol::Simple, &bare()).unwrap();
    close(est.time_us, 1.0 + 2.0 * 41.943_04);
}

#[test]
fn connection_slots_limit_messages_in_flight() {
    let t = two_gpus();
    // Three sends on one connection; the receiver first waits for a slow local copy.
    let mut s = skeleton(2, 3);
    stream(
        &mut s,
        0,
        0,
        vec![send(1, 0, 1), send(1, 1, 1), send(1, 2, 1)],
    );
    let copy = Step::new(
        Op::Copy {
            src: Loc::input(0),
            dst: Loc::scratch(0),
        },
        6,
    );
    stream(
        &mut s,
        1,
        0,
        vec![copy, recv(0, 0, 1), recv(0, 1, 1), recv(0, 2, 1)],
    );
    let chunk = MIB as f64;
    let xfer = chunk / 25_000.0;
    let copy_us = 2.0 * 6.0 * chunk / 100_000.0;
    let est = simulate(&t, &s, 3 * MIB, Protocol::Simple, &bare()).unwrap();
    // Messages 0 and 1 stream back to back; message 2 waits until message 0 is received,
    // which happens when the copy ends (125.8 µs > 2 × 41.9 + 1).
    assert!(copy_us > 2.0 * xfer + 1.0);
    close(est.time_us, copy_us + xfer + 1.0);
}

#[test]
fn ring_allreduce_on_a_ring_matches_the_alpha_beta_formula() {
    let n = 4;
    let t = ring_topo(n, 25.0, 1.0);
    let s = ring_allreduce(n, 1);
    let bytes = 64 * MIB;
    let est = simulate(&t, &s, bytes, Protocol::Simple, &bare()).unwrap();
    // 2(n-1) sequential hops of one chunk (M/n) each: 6 × (16 MiB / 25e3 + 1 µs); the
    // fused reductions (2 × 16 MiB / 100e3 = 335 µs) overlap the 671 µs transfers.
    let chunk = bytes as f64 / f64::from(n);
    close(est.time_us, 6.0 * (chunk / 25_000.0 + 1.0));
}

#[test]
fn errors_are_reported_not_panicked() {
    let t = two_gpus();
    let mut s = skeleton(2, 1);
    stream(&mut s, 1, 0, vec![recv(0, 0, 1)]);
    match simulate(&t, &s, MIB, Protocol::Simple, &bare()) {
        Err(CostError::Deadlock { at }) => assert_eq!((at.rank, at.stream, at.step), (1, 0, 0)),
        other => panic!("expected a deadlock, got {other:?}"),
    }
    let s3 = skeleton(3, 1);
    assert!(matches!(
        simulate(&t, &s3, MIB, Protocol::Simple, &bare()),
        Err(CostError::RankMismatch { .. })
    ));
    let mut bad = skeleton(2, 1);
    stream(&mut bad, 0, 0, vec![send(7, 0, 1)]);
    assert!(matches!(
        simulate(&t, &bad, MIB, Protocol::Simple, &bare()),
        Err(CostError::BadPeer { .. })
    ));
    let mut dep = skeleton(2, 1);
    stream(
        &mut dep,
        0,
        0,
        vec![Step::new(Op::Nop, 0).with_deps([Dep { stream: 4, step: 0 }])],
    );
    assert!(matches!(
        simulate(&t, &dep, MIB, Protocol::Simple, &bare()),
        Err(CostError::BadDep { .. })
    ));
    // A dependency cycle between two streams never completes.
    let mut cyc = skeleton(2, 1);
    stream(
        &mut cyc,
        0,
        0,
        vec![Step::new(Op::Nop, 0).with_deps([Dep { stream: 1, step: 0 }])],
    );
    stream(
        &mut cyc,
        0,
        1,
        vec![Step::new(Op::Nop, 0).with_deps([Dep { stream: 0, step: 0 }])],
    );
    assert!(matches!(
        simulate(&t, &cyc, MIB, Protocol::Simple, &bare()),
        Err(CostError::Deadlock { .. })
    ));
    // The critical-path bound of a schedule that deadlocks is infinite, its second walk (of
    // the order the first one found) as much as its first, and it does not put a run past a
    // limit: the run is made, and says it deadlocks.
    let sim = Simulator::new(Network::new(&t), bare());
    for deadlocked in [&s, &cyc] {
        let prepared = sim.prepare(deadlocked).expect("prepares");
        for _ in 0..2 {
            assert_eq!(
                sim.routed_bound_us(&prepared, MIB, Protocol::Simple),
                f64::INFINITY
            );
        }
        assert!(!sim.path_bound_past(&prepared, (MIB, Protocol::Simple), 1.0));
        assert!(matches!(
            sim.run_within(&prepared, MIB, Protocol::Simple, 1.0),
            Err(CostError::Deadlock { .. })
        ));
    }
}

#[test]
fn prepared_schedules_cost_at_many_sizes() {
    let t = ring_topo(8, 25.0, 0.7);
    let sim = Simulator::new(Network::new(&t), CostModel::default());
    let p = sim.prepare(&ring_allreduce(8, 4)).unwrap();
    let mut last = 0.0;
    for shift in 10..28 {
        let est = sim.run(&p, 1 << shift, Protocol::Simple).unwrap();
        assert!(est.time_us > last, "time grows with size");
        last = est.time_us;
    }
}

#[test]
fn the_protocol_lower_bound_never_exceeds_the_simulated_time() {
    // The search skips simulating a protocol whose lower bound exceeds the candidate's best
    // time at that size: the bound must hold for every protocol, size and link speed.
    let cases = [
        (ring_topo(8, 25.0, 0.7), ring_allreduce(8, 4)),
        (ring_topo(4, 100.0, 2.0), ring_allreduce(4, 2)),
    ];
    for (t, s) in &cases {
        let sim = Simulator::new(Network::new(t), CostModel::default());
        let p = sim.prepare(s).unwrap();
        for shift in [10, 16, 20, 24, 28] {
            let simple = sim.run(&p, 1 << shift, Protocol::Simple).unwrap();
            for proto in [Protocol::LL, Protocol::LL128, Protocol::Simple] {
                let est = sim.run(&p, 1 << shift, proto).unwrap();
                let lb = sim
                    .lower_bound_us(&simple.resource_bytes, 1 << shift, proto)
                    .expect("a GPU model has link bounds");
                assert!(
                    lb <= est.time_us * (1.0 + 1e-9),
                    "{proto:?} 2^{shift}: {lb} > {}",
                    est.time_us
                );
                // Not vacuous at large sizes, where the ring keeps its links busy.
                if shift == 28 {
                    assert!(
                        lb >= est.time_us * 0.5,
                        "{proto:?}: {lb} vs {}",
                        est.time_us
                    );
                }
            }
        }
    }
    // A CPU host model's times do not come from link capacities: no bound.
    let sim = Simulator::new(
        Network::new(&ring_topo(4, 100.0, 2.0)),
        CostModel::cpu_host(),
    );
    assert_eq!(
        sim.lower_bound_us(&[1e6; 64], 1 << 20, Protocol::Simple),
        None
    );
}

#[test]
fn a_traced_run_records_each_resources_rate_over_time() {
    // The star of `max_min_fair_share_over_different_routes`: A 0→2, B 1→2, C 0→1.
    let t = topo(
        3,
        &["sw"],
        &[
            ("g0", "sw", 30.0, 0.5),
            ("g1", "sw", 25.0, 0.5),
            ("g2", "sw", 25.0, 0.5),
        ],
    );
    let mut s = skeleton(3, 4);
    stream(&mut s, 0, 0, vec![send(2, 0, 1)]);
    stream(&mut s, 1, 0, vec![send(2, 1, 1)]);
    stream(&mut s, 0, 1, vec![send(1, 2, 2)]);
    stream(&mut s, 2, 0, vec![recv(0, 0, 1)]);
    stream(&mut s, 2, 0, vec![recv(1, 1, 1)]);
    stream(&mut s, 1, 1, vec![recv(0, 2, 2)]);
    let sim = Simulator::new(Network::new(&t), bare());
    let p = sim.prepare(&s).unwrap();
    let timeline = sim.timeline(&p, 4 * MIB, Protocol::Simple).unwrap();
    // Tracing changes nothing.
    assert_eq!(
        timeline.estimate,
        sim.run(&p, 4 * MIB, Protocol::Simple).unwrap()
    );
    let phase1 = MIB as f64 / 12_500.0;
    let end_c = phase1 + (2.0 * MIB as f64 - 17_500.0 * phase1) / 25_000.0;
    let rates = |name: &str| -> Vec<(f64, f64)> {
        let u = timeline
            .resources
            .iter()
            .find(|u| sim.network.resource_name(&t, u.resource) == name)
            .unwrap_or_else(|| panic!("{name} carried nothing"));
        u.rates.clone()
    };
    let same = |got: Vec<(f64, f64)>, want: &[(f64, f64)]| {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            close(g.0, w.0);
            close(g.1, w.1);
        }
    };
    // g0→sw carries A and C (30 GB/s), then C alone at sw→g1's 25 GB/s.
    same(
        rates("NVLink g0→sw"),
        &[(0.0, 30.0), (phase1, 25.0), (end_c, 0.0)],
    );
    same(rates("NVLink sw→g2"), &[(0.0, 25.0), (phase1, 0.0)]);
    same(
        rates("NVLink sw→g1"),
        &[(0.0, 17.5), (phase1, 25.0), (end_c, 0.0)],
    );
    // Every resource's rate integrates to the bytes the estimate puts on it.
    for u in &timeline.resources {
        let moved: f64 = u
            .rates
            .windows(2)
            .map(|w| (w[1].0 - w[0].0) * w[0].1 * 1e3)
            .sum();
        close(moved, timeline.estimate.resource_bytes[u.resource as usize]);
        assert_eq!(u.rates.last().map(|p| p.1), Some(0.0));
    }
}

#[test]
fn resources_are_named_by_link_kind_and_ends_and_nic_direction() {
    let t = hccl_topologies::shipped_by_name("h100-cluster-2node").unwrap();
    let net = Network::new(&t);
    let names: Vec<String> = (0..net.capacity.len() as u32)
        .map(|r| net.resource_name(&t, r))
        .collect();
    let mut distinct = names.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        names.len(),
        "every resource has its own name"
    );
    for want in [
        "NIC n0.nic0 out",
        "NIC n1.nic7 in",
        "InfiniBand n0.nic0→rail0",
        "InfiniBand rail0→n1.nic0",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // The four NVSwitches of a host are merged into one vertex, named as such.
    assert!(
        names.iter().any(|n| n == "NVLink n0.gpu0→n0.nvswitch0×4"),
        "{names:?}"
    );
}
