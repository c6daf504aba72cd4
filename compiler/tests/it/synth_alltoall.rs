//! AllToAll from the multi-commodity flow LP: the path decomposition carries exactly the LP's
//! rate within every resource's capacity, its pruned forms stay within capacity too, the
//! lowered schedules verify in both placements on every machine, and at 1 GiB the search
//! with the flow family is never slower and closer to the flow bound than without it.

use crate::synth_common;
use synth_common::machines;

use hccl_compiler::cost::{Network, mcf};
use hccl_compiler::families::Family;
use hccl_compiler::search::all_families;
use hccl_compiler::search::{self, Options};
use hccl_compiler::synth::alltoall::{
    self, A2A_MAX_RANKS, Flow, FlowAllToAll, MAX_PATHS, RESOLUTION,
};
use hccl_ir::{Collective, CollectiveKind, verify::verify};

const GIB: u64 = 1 << 30;

/// Every pair's paths are simple, run from the pair's source to its destination and sum to
/// the flow's rate; the load on every resource is within its capacity.
fn check_flow(name: &str, net: &Network, flow: &Flow, max_paths: usize) {
    let n = flow.nranks;
    for s in 0..n {
        for d in (0..n).filter(|&d| d != s) {
            let mine: Vec<_> = flow.paths_of(s, d).collect();
            assert!(
                !mine.is_empty() && mine.len() <= max_paths,
                "{name}: pair {s} → {d} has {} paths",
                mine.len()
            );
            for p in &mine {
                let mut seen = p.ranks.clone();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), p.ranks.len(), "{name}: {p:?} revisits a rank");
                assert!(p.rate > 0.0, "{name}: {p:?}");
            }
            let sum: f64 = mine.iter().map(|p| p.rate).sum();
            assert!(
                (sum - flow.rate).abs() <= 1e-6 * flow.rate,
                "{name}: pair {s} → {d} gets {sum} GB/s of {}",
                flow.rate
            );
        }
    }
    let load = flow.load(net).expect("routes");
    for (r, (&l, &cap)) in load.iter().zip(&net.capacity).enumerate() {
        assert!(
            l <= cap * (1.0 + 1e-6) + 1e-9,
            "{name}: resource {r} carries {l} GB/s over its {cap}"
        );
    }
}

/// The decomposition carries the LP optimum (the bound's rate) within every capacity; the
/// pruned flows keep at most their path limit per pair, stay within capacity and never
/// exceed the optimum.
#[test]
fn flow_paths_respect_capacities_and_carry_the_lp_rate() {
    for (name, topo) in machines() {
        let net = Network::new(&topo);
        let n = topo.nranks();
        if n > A2A_MAX_RANKS {
            assert!(alltoall::flow_for(&topo).is_none(), "{name}");
            assert!(
                FlowAllToAll
                    .param_space(&topo, Collective::AllToAll)
                    .is_empty(),
                "{name}"
            );
            continue;
        }
        let flow = alltoall::flow_for(&topo).expect("the flow LP solves");
        let optimum = mcf::alltoall_rate(&net).expect("the bound's LP solves");
        assert!(
            (flow.lp_rate - optimum).abs() <= 1e-9 * optimum,
            "{name}: {} vs {optimum}",
            flow.lp_rate
        );
        assert!(
            flow.rate <= optimum && flow.rate >= optimum * (1.0 - 1e-5),
            "{name}: decomposed {} GB/s, LP {optimum}",
            flow.rate
        );
        check_flow(&name, &net, &flow, usize::MAX);
        let mut line = format!(
            "{name:>20}: λ* {optimum:.3} GB/s, {} paths (≤ {} per pair)",
            flow.paths.len(),
            flow.max_paths_per_pair()
        );
        for k in [MAX_PATHS, 2] {
            let pruned = alltoall::pruned_for(&topo, k).expect("the path LP solves");
            check_flow(&name, &net, &pruned, k);
            assert!(pruned.rate <= optimum * (1.0 + 1e-6), "{name} {k}");
            assert_eq!(pruned.lp_rate, flow.lp_rate);
            line += &format!(
                "; ≤{k} per pair: {} paths, {:.3} GB/s ({:.4} of λ*)",
                pruned.paths.len(),
                pruned.rate,
                pruned.rate / optimum
            );
        }
        println!("{line}");
    }
}

/// Every schedule of the family verifies, in place and out of place, at every parameter set,
/// with one block of `pipeline × RESOLUTION` chunks per pair; its step estimate is exact.
#[test]
fn flow_alltoall_schedules_verify() {
    let family = FlowAllToAll;
    for (name, topo) in machines() {
        let n = topo.nranks();
        if n > A2A_MAX_RANKS {
            continue;
        }
        let space = family.param_space(&topo, Collective::AllToAll);
        assert!(!space.is_empty(), "{name}: no parameters");
        assert!(family.param_space(&topo, Collective::AllGather).is_empty());
        for params in space {
            for in_place in [false, true] {
                let cands = family.schedules(&topo, Collective::AllToAll, params, in_place);
                assert_eq!(cands.len(), 1, "{name} {params:?}");
                let c = &cands[0];
                let s = &c.schedule;
                assert_eq!(s.in_place, in_place);
                assert_eq!(s.chunks, n * params.pipeline * RESOLUTION);
                assert!(c.min_bytes > 0);
                if !in_place {
                    assert_eq!(
                        family.estimated_steps(&topo, Collective::AllToAll, params),
                        Some(s.step_count() as u64),
                        "{name} {params:?}"
                    );
                }
                if let Err(e) = verify(s) {
                    panic!(
                        "{name} {params:?} in_place={in_place}: {:?}",
                        &e[..e.len().min(3)]
                    );
                }
            }
        }
    }
}

/// At 1 GiB, with the flow family competing, AllToAll is never slower than without it, and
/// within the ratio to the lower bound it reached when this test was written (issue 11
/// asks for 1.03; see `CEILINGS`).
#[test]
fn flow_alltoall_at_one_gib_approaches_the_bound() {
    // Largest predicted time / lower bound at 1 GiB per machine, with the flow family, a
    // little above what it reached (dgx1-v100 1.004, ring-8 1.007, torus-4x4 1.018, the
    // others 1.000-1.001). Without it: dgx1-v100 4.32, ring-8 1.25, torus-4x4 3.37 (all
    // mesh); the switched machines were at their bound already and stay with mesh or flow
    // schedules of the same time; h100-cluster-4node (32 ranks) is beyond the LP.
    const CEILINGS: [(&str, f64); 11] = [
        ("dgx1-v100", 1.01),
        ("dgx-a100", 1.005),
        ("dgx-h100", 1.005),
        ("ascend910-8", 1.005),
        ("azure-ndv2-2node", 1.005),
        ("h100-cluster-2node", 1.005),
        ("h100-cluster-4node", 1.005),
        ("ring-8", 1.01),
        ("torus-4x4", 1.025),
        ("fat-tree-16", 1.005),
        ("mixed-6", 1.02),
    ];
    let families: Vec<String> = all_families()
        .iter()
        .map(|f| f.name().to_string())
        .filter(|n| n != "flow_alltoall")
        .collect();
    for (name, topo) in machines() {
        let base = Options {
            collectives: vec![CollectiveKind::AllToAll],
            sizes: vec![GIB],
            model: hccl_compiler::cost::CostModel::for_topology(&topo),
            ..Options::default()
        };
        let with = search::compile(&topo, &base).expect("compiles");
        let without = search::compile(
            &topo,
            &Options {
                algorithms: Some(families.clone()),
                ..base.clone()
            },
        )
        .expect("compiles");
        let (_, ceiling) = CEILINGS
            .iter()
            .find(|c| c.0 == name)
            .expect("a ceiling for every machine");
        // HiGHS (feature `highs`) lands on another optimal vertex of the least-load LP, whose
        // paths share links less evenly in the simulator (dgx1-v100 1.014): 1% more room.
        let ceiling = if hccl_compiler::lp::NAME == "highs" {
            ceiling + 0.01
        } else {
            *ceiling
        };
        let (row, old) = (&with.rows[0], &without.rows[0]);
        let (ratio, before) = (row.bound_ratio(), old.bound_ratio());
        println!(
            "{name:>20} alltoall {before:.3} ({}) -> {ratio:.3} ({} {:?})",
            old.algorithm, row.algorithm, row.params
        );
        assert!(
            row.predicted_us <= old.predicted_us * (1.0 + 1e-9),
            "{name}: worse with the flow family"
        );
        assert!(
            ratio <= ceiling,
            "{name} ({}) is {ratio:.3}× its bound, above {ceiling}",
            row.algorithm
        );
    }
}
