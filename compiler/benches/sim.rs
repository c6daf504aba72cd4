//! Events per second of the flow simulator ([`Simulator::run`]) on representative plans.
//!
//! An *event* is one of the things a run must process, counted from the schedule alone so
//! that the count does not depend on how the simulator is written: every step completes once,
//! and every message starts its flow, ends its flow and arrives once. A run of a prepared
//! schedule with `S` steps and `M` messages is `S + 3 M` events (rate recomputations,
//! superseded flow ends and the like are the simulator's own business and not counted).
//!
//! Cases (each prepared once, then run at every size and protocol listed):
//! - `dgx1/ring`, `dgx1/tree`: AllReduce on DGX-1 (8 ranks), one channel, no pipelining;
//! - `dgx1/ring_c*p*`: the ring at the last parameter set of its space (most channels and
//!   pipeline pieces);
//! - `h100x8/hier_c2p2`: the hierarchical AllReduce on 8 × DGX H100 (64 ranks), two channels
//!   and two pipeline pieces;
//! - `h100x8/ring`: the ring AllReduce over the 64 ranks;
//! - `h100x2/pairwise`: AllToAll on the shipped 2-node H100 cluster (16 ranks);
//! - `h100x8/pairwise`: AllToAll on 8 × DGX H100 (64 ranks, 4,032 concurrent flows through
//!   shared switches: the simulator's approximate large-component path);
//! - `h100x4/hierarchical_hd_c1p32`, `h100x4/rail_trees_c2p32`: two schedules the shipped
//!   4-node H100 cluster's compile spends its time on;
//! - `h100x4/packed_trees_c31p66`: Reduce over 31 packed trees of 66 pieces on that cluster,
//!   the dearest candidate of its compile (110k steps; its flows start and end at distinct
//!   instants, so nearly every event recomputes a component of about 34 flows).
//!
//! Sizes: 4 KiB, 1 MiB, 64 MiB; protocols LL and Simple.
//!
//! `cargo bench -p hccl-compiler --bench sim [-- [--iters N] [--estimates] [FILTER]]`: each
//! case runs for at least 0.5 s (or exactly `N` rounds of its sizes and protocols with
//! `--iters`, for instruction counts under callgrind); prints per case the events of one
//! round, the rounds run, and events per second; last the total and the geometric mean over
//! cases. `--estimates` prints instead every run's simulated time to the bit (`{:?}` of the
//! `f64`), to check that a change to the simulator keeps its results: diff two builds'.

use hccl_compiler::cost::{CostModel, Network, Prepared, Simulator};
use hccl_compiler::families::FamilyParams;
use hccl_compiler::search::all_families;
use hccl_ir::{Collective, Protocol};
use hccl_topologies::Topology;
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZES: [u64; 3] = [4 << 10, 1 << 20, 64 << 20];
const PROTOCOLS: [Protocol; 2] = [Protocol::LL, Protocol::Simple];

fn cluster(nodes: u32) -> Topology {
    let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
    let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
    hccl_topologies::build(hccl_topologies::generate::cluster(nodes, &spec), "cluster")
        .expect("cluster builds")
}

/// `None`: the family's last parameter set.
fn prepared(
    sim: &Simulator,
    topo: &Topology,
    family: &str,
    collective: Collective,
    params: Option<FamilyParams>,
) -> (Prepared, FamilyParams) {
    let f = all_families()
        .into_iter()
        .find(|f| f.name() == family)
        .expect("family registered");
    let params = params.unwrap_or_else(|| {
        *f.param_space(topo, collective)
            .last()
            .expect("a parameter set")
    });
    let cand = f
        .generate(topo, collective, params)
        .into_iter()
        .next()
        .expect("a candidate");
    (sim.prepare(&cand.schedule).expect("prepares"), params)
}

struct Case {
    name: String,
    sim: std::sync::Arc<Simulator>,
    prep: Prepared,
}

/// Events of one round (every size and protocol), checking that the runs succeed.
fn events_per_round(c: &Case) -> u64 {
    let mut events = 0u64;
    for bytes in SIZES {
        for proto in PROTOCOLS {
            let e = c.sim.run(&c.prep, bytes, proto).expect("runs");
            events += c.prep.step_count() as u64 + 3 * e.messages as u64;
        }
    }
    events
}

fn round(c: &Case) {
    for bytes in SIZES {
        for proto in PROTOCOLS {
            black_box(c.sim.run(black_box(&c.prep), bytes, proto).ok());
        }
    }
}

fn cases() -> Vec<Case> {
    let one = Some(FamilyParams {
        channels: 1,
        pipeline: 1,
    });
    let dgx1 = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let h100x2 = hccl_topologies::shipped_by_name("h100-cluster-2node").expect("shipped");
    let h100x4 = hccl_topologies::shipped_by_name("h100-cluster-4node").expect("shipped");
    let h100x8 = cluster(8);
    let mut out = Vec::new();
    let ar = Collective::AllReduce;
    let a2a = Collective::AllToAll;
    type Spec<'a> = (
        &'a str,
        &'a Topology,
        &'a str,
        Collective,
        Option<FamilyParams>,
    );
    let c1p32 = Some(FamilyParams {
        channels: 1,
        pipeline: 32,
    });
    let c2p32 = Some(FamilyParams {
        channels: 2,
        pipeline: 32,
    });
    let specs: [Spec; 10] = [
        ("dgx1", &dgx1, "ring", ar, one),
        ("dgx1", &dgx1, "tree", ar, one),
        ("dgx1", &dgx1, "ring", ar, None),
        (
            "h100x8",
            &h100x8,
            "hierarchical",
            ar,
            Some(FamilyParams {
                channels: 2,
                pipeline: 2,
            }),
        ),
        ("h100x8", &h100x8, "ring", ar, one),
        ("h100x2", &h100x2, "pairwise", a2a, one),
        ("h100x8", &h100x8, "pairwise", a2a, one),
        ("h100x4", &h100x4, "hierarchical_hd", ar, c1p32),
        (
            "h100x4",
            &h100x4,
            "rail_trees",
            Collective::Broadcast { root: 0 },
            c2p32,
        ),
        (
            "h100x4",
            &h100x4,
            "packed_trees",
            Collective::Reduce { root: 0 },
            Some(FamilyParams {
                channels: 31,
                pipeline: 66,
            }),
        ),
    ];
    let mut sims: Vec<(*const Topology, std::sync::Arc<Simulator>)> = Vec::new();
    for (machine, topo, family, coll, params) in specs {
        let key = topo as *const Topology;
        let sim = match sims.iter().find(|(k, _)| *k == key) {
            Some((_, s)) => s.clone(),
            None => {
                let s =
                    std::sync::Arc::new(Simulator::new(Network::new(topo), CostModel::default()));
                sims.push((key, s.clone()));
                s
            }
        };
        let (prep, p) = prepared(&sim, topo, family, coll, params);
        let suffix = if params == one {
            String::new()
        } else {
            format!("_c{}p{}", p.channels, p.pipeline)
        };
        out.push(Case {
            name: format!("{machine}/{family}{suffix}"),
            sim,
            prep,
        });
    }
    out
}

fn main() {
    let mut iters: Option<u64> = None;
    let mut filter: Option<String> = None;
    let mut estimates = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().and_then(|n| n.parse().ok()),
            "--bench" => {}
            "--estimates" => estimates = true,
            _ if a.starts_with("--") => {}
            _ => filter = Some(a),
        }
    }
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filter.as_ref().is_none_or(|f| c.name.contains(f.as_str())))
        .collect();
    if estimates {
        for c in &cases {
            for bytes in SIZES {
                for proto in PROTOCOLS {
                    let e = c.sim.run(&c.prep, bytes, proto).expect("runs");
                    println!("{} {bytes} {proto:?} {:?} us", c.name, e.time_us);
                }
            }
        }
        return;
    }
    println!(
        "{:<22} {:>6} {:>7} {:>10} {:>7} {:>9} {:>12}",
        "case", "steps", "msgs", "events/rnd", "rounds", "secs", "events/s"
    );
    let (mut total_events, mut total_secs, mut log_sum) = (0u64, 0.0f64, 0.0f64);
    for c in &cases {
        let per_round = events_per_round(c);
        let start = Instant::now();
        let mut rounds = 0u64;
        loop {
            round(c);
            rounds += 1;
            match iters {
                Some(n) if rounds >= n => break,
                None if start.elapsed() >= Duration::from_millis(500) => break,
                _ => {}
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let events = per_round * rounds;
        let rate = events as f64 / secs;
        total_events += events;
        total_secs += secs;
        log_sum += rate.ln();
        let msgs =
            (per_round / (SIZES.len() * PROTOCOLS.len()) as u64 - c.prep.step_count() as u64) / 3;
        println!(
            "{:<22} {:>6} {:>7} {:>10} {:>7} {:>9.3} {:>12.0}",
            c.name,
            c.prep.step_count(),
            msgs,
            per_round,
            rounds,
            secs,
            rate
        );
    }
    if !cases.is_empty() {
        println!(
            "total: {} events in {:.3} s = {:.0} events/s; geometric mean over cases {:.0} events/s",
            total_events,
            total_secs,
            total_events as f64 / total_secs,
            (log_sum / cases.len() as f64).exp()
        );
    }
}
