//! The NCCL baseline itself: NCCL's algorithm and protocol choice and its cost formula
//! (`cost/baseline.rs`, after NCCL's `src/graph/tuning.cc`) on cases worked out by hand from
//! NCCL's tables, and the inputs the formula reads off a shipped machine. (The search's
//! choice is never slower than the baseline by construction, since NCCL's families are
//! candidates; what can be wrong is the baseline, which is what these tests check.)

use hccl_compiler::cost::{self, LinkClass, NcclAlgo, NcclTopo, Network};
use hccl_compiler::search;
use hccl_ir::{Collective, CollectiveKind, Protocol};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Equal to 1e-9 relative (the formula is a handful of floating-point operations).
fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs(),
        "{what}: {got} µs, worked out by hand {want} µs"
    );
}

/// One box of 8 Hopper GPUs on NVLink, 450 GB/s of bus bandwidth, 16 channels.
fn hopper_box() -> NcclTopo {
    NcclTopo {
        nranks: 8,
        nnodes: 1,
        arch: 2,
        bus_bw: 450.0,
        intra: LinkClass::NvLink,
    }
}

#[test]
fn allreduce_formula_on_one_hopper_box() {
    let t = hopper_box();
    let predict = |algo, proto, bytes| {
        t.predict(CollectiveKind::AllReduce, algo, proto, bytes, 16)
            .expect("NCCL offers it")
    };
    // Ring: 2(n-1) = 14 steps, none across nodes. Latency = base + 14 × NVLink hop latency;
    // algorithm bandwidth = bus × n / steps = bus × 8/14.
    //   LL:     6.6 + 14 × 0.6 = 15.0 µs;  bus min(0.5 × 450, llMaxBw 141) = 141
    //   LL128: 14.0 + 14 × 1.9 = 40.6 µs;  bus min(0.92 × 450, 16 ch × 36.7) = 414
    //   Simple: 8.4 + 14 × 3.4 = 56.0 µs;  bus 450
    let ring = [
        (Protocol::LL, 15.0, 141.0 * 8.0 / 14.0),
        (Protocol::LL128, 40.6, 414.0 * 8.0 / 14.0),
        (Protocol::Simple, 56.0, 450.0 * 8.0 / 14.0),
    ];
    // Tree: latency = base + 2 × (ppn - 1) × NVLink hop latency (log2(1 node) = 0 hops
    // across nodes); algorithm bandwidth = bus / 2.
    //   LL:     6.8 + 2 × 7 × 0.6  = 15.2 µs; bus min(450 / 3.8, 141) = 118.42…
    //   LL128: 14.0 + 2 × 7 × 1.25 = 31.5 µs; bus min(450 × 7/9, 16 × 36.7) = 350
    //   Simple: 8.4 + 2 × 7 × 4.0  = 64.4 µs; bus min(0.92 × 450, 16 × 38.7) × 0.85
    //                                            = 414 × 0.85 = 351.9
    let tree = [
        (Protocol::LL, 15.2, 450.0 / 3.8 / 2.0),
        (Protocol::LL128, 31.5, 350.0 / 2.0),
        (Protocol::Simple, 64.4, 351.9 / 2.0),
    ];
    for bytes in [0, KIB, 4 * MIB, GIB] {
        for (algo, rows) in [(NcclAlgo::Ring, &ring), (NcclAlgo::Tree, &tree)] {
            for &(proto, lat, algbw) in rows {
                // time = latency + bytes / (1000 × algbw GB/s) in µs.
                let want = lat + bytes as f64 / (1000.0 * algbw);
                assert_close(
                    predict(algo, proto, bytes),
                    want,
                    &format!("{algo:?}/{proto:?} at {bytes} B"),
                );
            }
        }
    }
    let choose = |bytes| {
        t.choose(CollectiveKind::AllReduce, bytes, 16, |_| true)
            .expect("a choice")
    };
    // 1 KiB: ring LL 15.0 + 1024 / 80 571.4 = 15.0127 beats tree LL 15.2 + 1024 / 59 210.5
    // = 15.2173 (and every higher-latency protocol).
    let c = choose(KIB);
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Ring, Protocol::LL));
    assert_close(
        c.nccl_model_us,
        15.0 + 1024.0 / (1000.0 * 141.0 * 8.0 / 14.0),
        "1 KiB",
    );
    // 4 MiB: tree LL128 31.5 + 4 194 304 / 175 000 = 55.467 beats ring LL128 40.6 + 17.730
    // = 58.330, ring LL 15.0 + 52.057 = 67.057 and ring Simple 56.0 + 16.311 = 72.311.
    let c = choose(4 * MIB);
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Tree, Protocol::LL128));
    assert_close(c.nccl_model_us, 31.5 + 4_194_304.0 / 175_000.0, "4 MiB");
    // 1 GiB: ring Simple 56.0 + 1 073 741 824 / 257 142.9 = 4231.66 beats ring LL128
    // 40.6 + 4538.76 = 4579.36 and tree LL128 31.5 + 6135.67.
    let c = choose(GIB);
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Ring, Protocol::Simple));
    assert_close(
        c.nccl_model_us,
        56.0 + GIB as f64 / (1000.0 * 450.0 * 8.0 / 14.0),
        "1 GiB",
    );
    // Where the tree family is missing, NCCL's choice is among the rings only: at 4 MiB ring
    // LL128 (58.330) beats ring LL (67.057) and ring Simple (72.311).
    let c = t
        .choose(CollectiveKind::AllReduce, 4 * MIB, 16, |f| f == "ring")
        .unwrap();
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Ring, Protocol::LL128));
    assert_close(
        c.nccl_model_us,
        40.6 + 4_194_304.0 / (1000.0 * 414.0 * 8.0 / 14.0),
        "rings only",
    );
}

#[test]
fn allgather_across_two_nodes_pays_one_network_hop() {
    // 2 nodes × 8 Hopper GPUs, 50 GB/s of bus bandwidth (the NICs), 4 channels.
    let t = NcclTopo {
        nranks: 16,
        nnodes: 2,
        arch: 2,
        bus_bw: 50.0,
        intra: LinkClass::NvLink,
    };
    // Ring AllGather: n - 1 = 15 steps, 1 of them across the nodes (nnodes - 1).
    //   LL:     6.6 + 14 × 0.6 + 1 × 2.7 = 17.7 µs; bus min(0.5 × 50, llMaxBw(2 nodes) 39) = 25
    //   LL128: 14.0 + 14 × 1.9 + 1 × 4.0 = 44.6 µs; bus min(0.92 × 50, 4 × 36.7) = 46
    //   Simple: 8.4 + 14 × 3.4 + 1 × 14.0 = 70.0 µs; bus 50
    // algorithm bandwidth = bus × 16/15.
    for (proto, lat, bus) in [
        (Protocol::LL, 17.7, 25.0),
        (Protocol::LL128, 44.6, 46.0),
        (Protocol::Simple, 70.0, 50.0),
    ] {
        let got = t
            .predict(CollectiveKind::AllGather, NcclAlgo::Ring, proto, MIB, 4)
            .unwrap();
        assert_close(
            got,
            lat + MIB as f64 / (1000.0 * bus * 16.0 / 15.0),
            &format!("{proto:?}"),
        );
    }
    // NCCL has no tree AllGather.
    assert_eq!(
        t.predict(
            CollectiveKind::AllGather,
            NcclAlgo::Tree,
            Protocol::LL,
            MIB,
            4
        ),
        None
    );
    // 1 MiB: LL 17.7 + 39.32 = 57.02 beats LL128 44.6 + 21.37 = 65.97 and Simple 70 + 19.66.
    let c = t
        .choose(CollectiveKind::AllGather, MIB, 4, |_| true)
        .unwrap();
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Ring, Protocol::LL));
    assert_close(
        c.nccl_model_us,
        17.7 + 1_048_576.0 / (1000.0 * 25.0 * 16.0 / 15.0),
        "choice",
    );
}

#[test]
fn alltoall_is_point_to_point_with_the_ll_threshold() {
    let t = hopper_box();
    // 64 KiB over 8 ranks is 8 KiB per peer, under NCCL_P2P_LL_THRESHOLD (16 KiB): LL only.
    // Latency 6.6 + 0.6 = 7.2 µs (base + one NVLink hop); bus 0.5 × 450 = 225; algorithm
    // bandwidth = bus × n/(n-1) = 225 × 8/7.
    let c = t
        .choose(CollectiveKind::AllToAll, 64 * KIB, 1, |_| true)
        .unwrap();
    assert_eq!((c.algo, c.protocol), (NcclAlgo::P2p, Protocol::LL));
    assert_close(
        c.nccl_model_us,
        7.2 + 65_536.0 / (1000.0 * 225.0 * 8.0 / 7.0),
        "64 KiB",
    );
    assert_eq!(
        t.predict(
            CollectiveKind::AllToAll,
            NcclAlgo::P2p,
            Protocol::Simple,
            64 * KIB,
            1
        ),
        None
    );
    // 1 MiB is 128 KiB per peer: Simple, 8.4 + 3.4 = 11.8 µs, bus 450 × 8/7.
    let c = t
        .choose(CollectiveKind::AllToAll, MIB, 1, |_| true)
        .unwrap();
    assert_eq!((c.algo, c.protocol), (NcclAlgo::P2p, Protocol::Simple));
    assert_close(
        c.nccl_model_us,
        11.8 + 1_048_576.0 / (1000.0 * 450.0 * 8.0 / 7.0),
        "1 MiB",
    );
}

/// What the formula reads off the shipped DGX-1, by hand from `machines/dgx1-v100.ron`, and
/// the choice the baseline then costs.
#[test]
fn dgx1_inputs_and_choices() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let t = NcclTopo::new(&Network::new(&topo), &cost::device_models(&topo));
    // Each V100 has 6 NVLinks of 25 GB/s (pairs of 2, 1, 1, 2 bonds) and a 15.75 GB/s PCIe
    // link to its switch: 165.75 GB/s leave every GPU; one node; the Volta row.
    assert_eq!(
        t,
        NcclTopo {
            nranks: 8,
            nnodes: 1,
            arch: 0,
            bus_bw: 6.0 * 25.0 + 15.75,
            intra: LinkClass::NvLink,
        }
    );
    // The 6 NVLink ports hold 3 link-disjoint Hamiltonian cycles, each used both ways.
    let channels = search::nccl_channels(&topo, Collective::AllReduce);
    assert_eq!(channels, 6);
    // 1 MiB (Volta: llMaxBw 39, perChMaxRingLL128 20, perChMaxTreeLL128 20, perChMaxTree 26.5):
    //   ring LL     15.0 + 1 048 576 / (1000 × 39 × 8/14 = 22 285.7)      = 62.05
    //   ring LL128  40.6 + 1 048 576 / (1000 × min(152.49, 6 × 20) × 8/14) = 55.89
    //   ring Simple 56.0 + 1 048 576 / (1000 × 165.75 × 8/14)              = 67.07
    //   tree LL     15.2 + 1 048 576 / (1000 × min(43.62, 39) / 2)         = 68.97
    //   tree LL128  31.5 + 1 048 576 / (1000 × min(128.92, 6 × 20) / 2)    = 48.98
    //   tree Simple 64.4 + 1 048 576 / (1000 × min(152.49, 159) × 0.85 / 2) = 80.58
    let c = t
        .choose(CollectiveKind::AllReduce, MIB, channels, |_| true)
        .unwrap();
    assert_eq!((c.algo, c.protocol), (NcclAlgo::Tree, Protocol::LL128));
    assert_close(c.nccl_model_us, 31.5 + 1_048_576.0 / 60_000.0, "1 MiB");
    // 1 KiB: ring LL 15.0 + 0.046 beats tree LL 15.2 + 0.053; 1 GiB: ring Simple
    // 56.0 + 11 336.6 beats ring LL128 40.6 + 15 658.7 and tree LL128 31.5 + 17 895.7.
    for (bytes, algo, proto) in [
        (KIB, NcclAlgo::Ring, Protocol::LL),
        (GIB, NcclAlgo::Ring, Protocol::Simple),
    ] {
        let c = t
            .choose(CollectiveKind::AllReduce, bytes, channels, |_| true)
            .unwrap();
        assert_eq!((c.algo, c.protocol), (algo, proto), "{bytes} B");
    }
    // The baseline the search reports costs exactly that choice in the simulator.
    for (bytes, family, proto) in [
        (KIB, "ring", Protocol::LL),
        (MIB, "tree", Protocol::LL128),
        (GIB, "ring", Protocol::Simple),
    ] {
        let b = search::baseline(&topo, Collective::AllReduce, bytes)
            .unwrap()
            .expect("NCCL's family exists");
        assert_eq!(
            (b.algorithm.as_str(), b.protocol),
            (family, proto),
            "{bytes} B"
        );
    }
}
