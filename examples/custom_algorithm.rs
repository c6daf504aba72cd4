//! Writing a new collective algorithm with the schedule builder, verifying it, and comparing
//! its predicted time with the built-in families.
//!
//! The algorithm: a two-hop "quad relay" AllGather for the DGX-1 hybrid cube-mesh. GPUs 0-3
//! and 4-7 form fully connected quads and GPU `i` is wired to GPU `i + 4`. Every rank sends
//! its block straight to its three quad mates and to its partner across; the partner relays
//! it to its own quad mates. Every transfer uses a direct NVLink, and each block is cut into
//! `pieces` so the relay of one piece overlaps the arrival of the next.
//!
//! Run with `cargo run --example custom_algorithm`.

use hccl::compiler::builder::{BuildError, ScheduleBuilder};
use hccl::compiler::cost::{CostModel, Network, Simulator};
use hccl::compiler::search::all_families;
use hccl::ir::verify::verify_report;
use hccl::ir::{Collective, Loc, Protocol, Rank, Schedule};
use hccl::topologies::{Topology, shipped_by_name};

/// Ranks per quad on the DGX-1.
const QUAD: Rank = 4;
/// Ranks on the DGX-1.
const RANKS: Rank = 2 * QUAD;

/// The quad-relay AllGather over 8 ranks, each block cut into `pieces` chunks.
pub fn quad_relay_allgather(pieces: u32, in_place: bool) -> Result<Schedule, BuildError> {
    let mut b = ScheduleBuilder::new(Collective::AllGather, RANKS, RANKS * pieces, in_place);
    // Each rank's own block into its slot of the output (nothing to do when in place).
    for r in 0..RANKS {
        let own = b.input_loc(r, 0);
        b.copy((r, own), (r, Loc::output(r * pieces)), pieces, 0);
    }
    let mates = |r: Rank| {
        let first = r / QUAD * QUAD;
        (first..first + QUAD).filter(move |&m| m != r)
    };
    // Ops are recorded piece-major, so pieces pipeline through the two hops.
    for q in 0..pieces {
        for r in 0..RANKS {
            let k = Loc::output(r * pieces + q);
            let across = (r + QUAD) % RANKS;
            // Hop 1: straight to the quad mates and across.
            for m in mates(r) {
                b.copy((r, k), (m, k), 1, 0);
            }
            b.copy((r, k), (across, k), 1, 0);
            // Hop 2: the partner across relays to its quad mates.
            for m in mates(across) {
                b.copy((across, k), (m, k), 1, 0);
            }
        }
    }
    b.build()
}

/// Pairs of ranks that exchange messages in `s` without a direct link in `topo`.
pub fn indirect_pairs(topo: &Topology, s: &Schedule) -> Vec<(Rank, Rank)> {
    let mut out = Vec::new();
    for (r, prog) in s.ranks.iter().enumerate() {
        for step in prog.streams.iter().flat_map(|st| &st.steps) {
            if let Some(p) = step.op.send_peer()
                && topo.direct_edge(r as Rank, p).is_none()
            {
                out.push((r as Rank, p));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// One line of the comparison: predicted times (µs) at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Collective size in bytes.
    pub bytes: u64,
    /// The custom algorithm, best protocol.
    pub custom_us: f64,
    /// The fastest built-in family schedule, best protocol.
    pub builtin_us: f64,
    /// Which family and parameters that was.
    pub builtin: String,
}

const PROTOCOLS: [Protocol; 3] = [Protocol::LL, Protocol::LL128, Protocol::Simple];

/// Predicts `custom` and every built-in AllGather schedule for `topo` at each size.
pub fn compare(topo: &Topology, custom: &Schedule, sizes: &[u64]) -> Vec<Row> {
    let sim = Simulator::new(Network::new(topo), CostModel::default());
    let best_time = |s: &Schedule, bytes: u64| {
        PROTOCOLS
            .iter()
            .filter_map(|&p| sim.simulate(s, bytes, p).ok())
            .map(|e| e.time_us)
            .fold(f64::INFINITY, f64::min)
    };
    let mut builtins = Vec::new();
    for fam in all_families() {
        if !fam.supports(custom.collective.kind()) {
            continue;
        }
        for params in fam.param_space(topo, custom.collective) {
            for cand in fam.generate(topo, custom.collective, params) {
                let label = format!(
                    "{} (channels {}, pipeline {})",
                    cand.algorithm, params.channels, params.pipeline
                );
                builtins.push((label, cand.schedule));
            }
        }
    }
    sizes
        .iter()
        .map(|&bytes| {
            let (builtin, builtin_us) = builtins
                .iter()
                .map(|(label, s)| (label.clone(), best_time(s, bytes)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or_else(|| ("none".to_string(), f64::INFINITY));
            Row {
                bytes,
                custom_us: best_time(custom, bytes),
                builtin_us,
                builtin,
            }
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topo = shipped_by_name("dgx1-v100").ok_or("dgx1-v100 is a shipped topology")?;
    let pieces = 4;
    let schedule = quad_relay_allgather(pieces, false)?;

    let indirect = indirect_pairs(&topo, &schedule);
    println!(
        "quad-relay AllGather on {}: {} pieces per block",
        topo.name, pieces
    );
    println!("  transfers without a direct link: {}", indirect.len());
    match verify_report(&schedule) {
        Ok(report) => println!(
            "  verified: {} streams, {} steps, {} messages carrying {} chunks, depth {}",
            report.streams, report.steps, report.messages, report.chunks_sent, report.depth
        ),
        Err(errors) => {
            for e in &errors {
                println!("  verifier: {e}");
            }
            return Err("the schedule does not verify".into());
        }
    }

    println!();
    println!("predicted time (µs, best protocol) vs the best built-in family:");
    println!(
        "{:>12} {:>12} {:>12}  best built-in",
        "bytes", "quad-relay", "built-in"
    );
    let sizes = [64 << 10, 1 << 20, 16 << 20, 256 << 20];
    for row in compare(&topo, &schedule, &sizes) {
        println!(
            "{:>12} {:>12.1} {:>12.1}  {}",
            row.bytes, row.custom_us, row.builtin_us, row.builtin
        );
    }
    Ok(())
}
