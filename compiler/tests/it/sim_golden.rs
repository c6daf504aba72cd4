//! Golden results of the simulator: the exact bits of every estimate for a fixed set of
//! schedules, sizes and protocols. Any change to the simulator's arithmetic or event order
//! shows up here; optimisations must keep this snapshot unchanged.

use hccl_compiler::cost::{CostModel, Estimate, Network, Simulator};
use hccl_compiler::search::all_families;
use hccl_ir::{Collective, Protocol};
use std::fmt::Write;

const MACHINES: [&str; 4] = [
    "dgx1-v100",
    "dgx-h100",
    "h100-cluster-2node",
    "h100-cluster-4node",
];

const COLLECTIVES: [Collective; 5] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast { root: 0 },
    Collective::AllToAll,
];

const SIZES: [u64; 3] = [1 << 10, 1 << 20, 1 << 30];

const PROTOCOLS: [Protocol; 3] = [Protocol::LL, Protocol::LL128, Protocol::Simple];

/// FNV-1a over the bit patterns of `xs`.
fn hash_bits(xs: &[f64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in xs {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn line(e: &Estimate) -> String {
    format!(
        "t={:016x} ({:e}) base={:016x} msgs={} payload={:016x} res={:016x}",
        e.time_us.to_bits(),
        e.time_us,
        e.base_us.to_bits(),
        e.messages,
        e.payload_bytes.to_bits(),
        hash_bits(&e.resource_bytes)
    )
}

/// Estimates of every family's first candidate, at its first and last parameter set, on
/// `machine`.
fn golden(machine: &str) -> String {
    let topo = hccl_topologies::shipped_by_name(machine).expect("shipped machine");
    let sim = Simulator::new(Network::new(&topo), CostModel::default());
    let mut out = String::new();
    // The MILP frontier (in the default search since issue 37) stays out: the snapshot is
    // the simulator's, over the families it had; `synth_pareto.rs` tests the frontier.
    for family in all_families().into_iter().filter(|f| f.name() != "milp") {
        for collective in COLLECTIVES {
            if !family.supports(collective.kind()) {
                continue;
            }
            // The 32-rank cluster's single-root tree selection is a MILP that gives way to
            // the greedy choice past 4.5 s (`synth::packing`), which a loaded 2-core machine
            // reaches: its schedule, not the simulator, then differs. The other machines'
            // packed trees stay in the snapshot.
            if machine == "h100-cluster-4node"
                && family.name() == "packed_trees"
                && matches!(collective, Collective::Broadcast { .. })
            {
                continue;
            }
            let space = family.param_space(&topo, collective);
            let mut params = Vec::new();
            params.extend(space.first().copied());
            params.extend(space.last().copied().filter(|p| Some(p) != space.first()));
            for p in params {
                let cands = family.generate(&topo, collective, p);
                let Some(cand) = cands.first() else {
                    continue;
                };
                let prep = match sim.prepare(&cand.schedule) {
                    Ok(prep) => prep,
                    Err(e) => {
                        writeln!(out, "{} {collective:?} {p:?}: {e}", family.name()).unwrap();
                        continue;
                    }
                };
                writeln!(
                    out,
                    "{} {collective:?} c{} p{} ({} steps)",
                    family.name(),
                    p.channels,
                    p.pipeline,
                    prep.step_count()
                )
                .unwrap();
                for bytes in SIZES {
                    for proto in PROTOCOLS {
                        let r = match sim.run(&prep, bytes, proto) {
                            Ok(e) => line(&e),
                            Err(e) => format!("error: {e}"),
                        };
                        writeln!(out, "  {bytes} {proto:?}: {r}").unwrap();
                    }
                }
            }
        }
    }
    out
}

#[test]
fn simulator_results_are_unchanged() {
    for machine in MACHINES {
        insta::assert_snapshot!(machine, golden(machine));
    }
}
