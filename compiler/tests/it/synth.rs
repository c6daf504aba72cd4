//! Synthesis by LP: the tree packing never exceeds the max-flow bound nor its own proven LP
//! bound (and column generation proves it optimal on the shipped machines), its schedules
//! verify for every packed collective, and at 1 GiB the packed trees bring Broadcast, Reduce,
//! AllGather and ReduceScatter closer to the lower bound than the hand-written families.

use crate::synth_common;
use synth_common::machines;

use hccl_compiler::cost::{Network, bounds};
use hccl_compiler::families::Family;
use hccl_compiler::search::{self, Options};
use hccl_compiler::synth::{self, Direction, PackedTrees, pack};
use hccl_ir::{Collective, CollectiveKind, verify::verify};

const GIB: u64 = 1 << 30;

/// The rate of the packing never exceeds the max-flow from the root, nor the bound the LP's
/// dual proves; the pool is optimal (bound reached) on every machine here.
#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn packings_reach_the_max_flow_from_the_root() {
    for (name, topo) in machines() {
        let net = Network::new(&topo);
        let n = net.nranks();
        for direction in [Direction::FromRoot, Direction::ToRoot] {
            let packing = pack(&net, 0, direction).expect("packs");
            let flow = (1..n)
                .map(|v| match direction {
                    Direction::FromRoot | Direction::Both => bounds::max_flow(&net, 0, v),
                    Direction::ToRoot => bounds::max_flow(&net, v, 0),
                })
                .fold(f64::INFINITY, f64::min);
            let sum: f64 = packing.trees.iter().map(|t| t.rate).sum();
            assert!((sum - packing.rate).abs() <= 1e-9 * sum);
            assert!(packing.trees.iter().all(|t| t.root == 0));
            assert!(
                packing.pool_rate <= flow * (1.0 + 1e-6),
                "{name} {direction:?}: pool {} GB/s above the max-flow {flow} GB/s",
                packing.pool_rate
            );
            assert!(
                packing.rate <= packing.pool_rate * (1.0 + 1e-9)
                    && packing.pool_rate <= packing.bound * (1.0 + 1e-6),
                "{name} {direction:?}: kept {} <= pool {} <= bound {} fails",
                packing.rate,
                packing.pool_rate,
                packing.bound
            );
            // Column generation closes the gap: the pool's rate is the LP optimum.
            assert!(
                packing.pool_rate >= packing.bound * (1.0 - 1e-3),
                "{name} {direction:?}: pool {} GB/s short of the LP bound {}",
                packing.pool_rate,
                packing.bound
            );
            println!(
                "{name:>20} {direction:?}: {} trees, {:.1} GB/s of {:.1} (pool of {}: {:.1}; LP bound {:.1})",
                packing.trees.len(),
                packing.rate,
                flow,
                packing.pool,
                packing.pool_rate,
                packing.bound
            );
        }
    }
}

/// AllGather and ReduceScatter pack one set of trees per root on shared links: every root's
/// trees span all ranks from that root, the rate per root stays within the LP bound and the
/// cut bound (a rank's links must carry the n-1 blocks it receives), and the bound is what
/// `packing_bound` reports to the cost model.
#[test]
fn all_root_packings_respect_the_cut() {
    for (name, topo) in machines() {
        let net = Network::new(&topo);
        let n = net.nranks();
        if n > synth::SYNTH_MAX_RANKS_ALL {
            continue;
        }
        for (collective, direction) in [
            (Collective::AllGather, Direction::FromRoot),
            (Collective::ReduceScatter, Direction::ToRoot),
        ] {
            let roots: Vec<u32> = (0..n).collect();
            let pool = synth::grow_pool(&net, &roots, direction).expect("packs");
            let packing = synth::prune(&pool, 4).expect("prunes");
            assert_eq!(packing.roots, roots);
            for &r in &roots {
                let mine: Vec<_> = packing.trees_of(r).collect();
                assert!(!mine.is_empty() && mine.len() <= 4, "{name}: root {r}");
                for t in mine {
                    assert_eq!(t.parents[r as usize], None);
                    assert_eq!(t.parents.iter().filter(|p| p.is_none()).count(), 1);
                }
            }
            // Every rank receives n-1 blocks at `rate` each through its own links.
            let cut = (0..n)
                .map(|v| {
                    let links: f64 = (0..n)
                        .filter(|&u| u != v)
                        .map(|u| match direction {
                            Direction::FromRoot | Direction::Both => bounds::max_flow(&net, u, v),
                            Direction::ToRoot => bounds::max_flow(&net, v, u),
                        })
                        .fold(f64::INFINITY, f64::min);
                    links
                })
                .fold(f64::INFINITY, f64::min);
            assert!(packing.rate <= pool.bound * (1.0 + 1e-6), "{name}");
            assert!(
                pool.rate() <= cut * (1.0 + 1e-6),
                "{name} {collective}: {} GB/s per root above one root's max-flow {cut}",
                pool.rate()
            );
            assert_eq!(synth::packing_bound(&net, collective), Some(pool.bound));
            println!(
                "{name:>20} {collective}: {:.2} GB/s per root kept, pool {:.2}, LP bound {:.2} ({} rounds, optimal {})",
                packing.rate,
                pool.rate(),
                pool.bound,
                pool.rounds,
                pool.optimal()
            );
        }
    }
}

/// Every packed-tree schedule verifies, both placements, for every collective packed.
#[test]
fn packed_tree_schedules_verify() {
    let family = PackedTrees::default();
    for (name, topo) in machines() {
        let n = topo.nranks();
        let mut collectives = vec![
            Collective::Broadcast { root: 0 },
            Collective::Broadcast { root: n - 1 },
            Collective::Reduce { root: 0 },
            Collective::Reduce { root: n / 2 },
        ];
        if n <= synth::SYNTH_MAX_RANKS_ALL {
            collectives.extend([Collective::AllGather, Collective::ReduceScatter]);
        }
        for collective in collectives {
            let space = family.param_space(&topo, collective);
            assert!(!space.is_empty(), "{name} {collective}: no parameters");
            let roots = if collective.root().is_some() { 1 } else { n };
            for params in space.into_iter().take(2) {
                for in_place in [false, true] {
                    let cands = family.schedules(&topo, collective, params, in_place);
                    assert!(
                        (1..=2).contains(&cands.len()),
                        "{name} {collective} {params:?}"
                    );
                    for c in &cands {
                        let s = &c.schedule;
                        // Rooted: the pieces of all channels shared by the copies run.
                        let pieces = c.params.pipeline;
                        if roots == 1 {
                            assert!(pieces >= params.pipeline, "{pieces} pieces");
                            assert!(
                                pieces * c.params.channels <= params.pipeline * params.channels
                            );
                        } else {
                            assert_eq!(pieces, params.pipeline);
                        }
                        let units = s.chunks / (roots * pieces);
                        assert_eq!(s.chunks, roots * pieces * units);
                        assert!(synth::RESOLUTIONS.contains(&units), "{units} units");
                        assert!(c.min_bytes > 0);
                        if let Err(e) = verify(s) {
                            panic!("{name} {collective} {params:?} in_place={in_place}: {e:?}");
                        }
                    }
                }
            }
        }
    }
}

/// Lowering: every tree kept gets a piece width in proportion to its rate (the widths fill
/// the resolution), the copies fill the channel budget, and each copy is a channel.
#[test]
fn lowering_shares_pieces_by_rate() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let net = Network::new(&topo);
    let packing = pack(&net, 0, Direction::FromRoot).unwrap();
    let rates: Vec<f64> = packing.trees.iter().map(|t| t.rate).collect();
    let units = synth::resolution(&packing);
    let widths = synth::piece_widths(&rates, units);
    assert_eq!(widths.iter().sum::<u32>(), units);
    // The resolution rounds the shares within the allowed loss (or is the finest), and is
    // the least that does; finer never rounds worse here.
    let finest = *synth::RESOLUTIONS.last().unwrap();
    assert!(synth::rounding_loss(&rates, units) <= synth::ROUNDING_LOSS || units == finest);
    assert!(synth::rounding_loss(&rates, finest) <= synth::rounding_loss(&rates, 64));
    for &coarser in synth::RESOLUTIONS.iter().filter(|&&r| r < units) {
        assert!(synth::rounding_loss(&rates, coarser) > synth::ROUNDING_LOSS);
    }
    for (i, j) in (0..rates.len()).flat_map(|i| (0..rates.len()).map(move |j| (i, j))) {
        if rates[i] > rates[j] {
            assert!(widths[i] >= widths[j], "{rates:?} -> {widths:?}");
        }
    }
    let used = widths.iter().filter(|&&w| w > 0).count() as u32;
    for budget in [used, used + 3, 2 * used] {
        let copies = synth::copy_counts(&widths, budget);
        let total = copies.iter().sum::<u32>();
        assert!(used <= total && total <= budget, "{copies:?} for {budget}");
        // Every tree kept runs, and its copies carry nearly equal rates: the spread of the
        // copies' rates is within the allowed one, or the least the budget allows.
        let spread = |copies: &[u32]| {
            let per: Vec<f64> = widths
                .iter()
                .zip(copies)
                .filter(|(w, _)| **w > 0)
                .map(|(&w, &c)| f64::from(w) / f64::from(c))
                .collect();
            per.iter().copied().fold(0.0, f64::max)
                / per.iter().copied().fold(f64::INFINITY, f64::min)
        };
        for (&w, &c) in widths.iter().zip(&copies) {
            assert_eq!(w > 0, c > 0, "{widths:?} -> {copies:?}");
            assert!(c <= w.max(1));
        }
        let ones: Vec<u32> = widths.iter().map(|&w| u32::from(w > 0)).collect();
        assert!(spread(&copies) <= spread(&ones));
        if budget >= 2 * used {
            assert!(spread(&copies) < spread(&ones) || spread(&ones) <= synth::COPY_SPREAD);
        }
        assert_eq!(synth::channels_for(&packing, budget), total);
        let cands = synth::lower(
            "packed_trees",
            &packing,
            Collective::Broadcast { root: 0 },
            4,
            budget,
            false,
        );
        assert_eq!(cands.len(), 1);
        assert_eq!(cands[0].params.channels, total);
        verify(&cands[0].schedule).expect("verifies");
    }
    // A packing lowered for the wrong collective gives nothing rather than a wrong schedule.
    assert!(
        synth::lower(
            "packed_trees",
            &packing,
            Collective::Reduce { root: 0 },
            4,
            8,
            false
        )
        .is_empty()
    );
}

/// At 1 GiB, with the packed trees competing, the chosen plan is never slower than without
/// them, and its ratio to the lower bound is the figure docs/synthesis.md's table gives (rounded to
/// two decimals, and never above issue 11's 1.03); AllReduce, which the packed trees do not
/// run, too.
#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn packed_collectives_at_one_gib_approach_the_bound() {
    // Predicted time / lower bound at 1 GiB, per machine (Broadcast, Reduce, AllGather,
    // ReduceScatter, AllReduce): the figures of docs/synthesis.md's table ("auto" column, two
    // decimals), which each ratio must round to or below (< figure + 0.005), and never
    // above the 1.03. Held in the dev profile on the 2-core machine loaded by other
    // builds (2026-12-04), where the selection MILP stops at its time limit sooner. The
    // hand-written families alone gave 1.94/1.87 for Broadcast and Reduce on dgx1-v100,
    // 1.63/1.63 on the DGX-A100 and H100, 1.21/1.22 on ascend910-8, 1.17/1.18 on
    // azure-ndv2-2node, 1.89/1.80 and 2.68/2.60 on the H100 clusters and 1.75/1.75 on the
    // 8-ring.
    const CEILINGS: [(&str, [f64; 5]); 11] = [
        // Chains and rings over the NVLink packing plus a spare ring over PCIe and QPI
        // (`synth::rings`, deterministic) (1.11/1.03/1.06/1.06 before).
        ("dgx1-v100", [1.02, 1.02, 1.01, 1.02, 1.01]),
        // Broadcast and Reduce: equal-rate trees at the LP's rate (`synth::disjoint::
        // equal_rate_trees`, deterministic) beside the LP's; 1.05/1.03 with the LP's alone.
        ("dgx-a100", [1.02, 1.02, 1.00, 1.01, 1.00]),
        ("dgx-h100", [1.02, 1.02, 1.00, 1.01, 1.00]),
        ("ascend910-8", [1.00, 1.00, 1.02, 1.02, 1.02]),
        // AllGather and ReduceScatter: 1.0052 and 1.0053 (the table said 1.00 until
        // 2026-12-04).
        ("azure-ndv2-2node", [1.00, 1.00, 1.01, 1.01, 1.01]),
        // Broadcast and Reduce: `rail_chains`, 1.024 and 1.013; AllGather and ReduceScatter:
        // the split hierarchy (`families::split`), 1.017 and 1.022 (1.05 and 1.05 before).
        ("h100-cluster-2node", [1.02, 1.01, 1.02, 1.02, 1.02]),
        // Broadcast and Reduce: `rail_trees`, two NIC hops through a relay host (1.025/1.026;
        // 1.056/1.050 with `rail_chains`' three, 1.22/1.29 with the LP's trees); AllGather and
        // ReduceScatter: `hierarchical` with 64 pieces (1.024/1.021).
        ("h100-cluster-4node", [1.03, 1.03, 1.02, 1.02, 1.00]),
        ("ring-8", [1.01, 1.01, 1.00, 1.00, 1.01]),
        // The link-disjoint trees of `synth::disjoint` (no MILP involved: deterministic):
        // Broadcast and Reduce 4 trees at the max-flow rate (1.25/1.24 with the LP's support
        // pruned to 16 trees), AllGather and ReduceScatter every rank's 4, carried over the
        // torus's automorphisms, at the cut bound (1.16/1.17 with hybrid_cube before).
        ("torus-4x4", [1.02, 1.02, 1.02, 1.02, 1.00]),
        // Broadcast and Reduce: two equal-rate chains (1.17/1.07 with the LP's).
        ("fat-tree-16", [1.03, 1.03, 1.00, 1.01, 1.00]),
        // AllReduce: trees carrying blocks as large as their rates both ways
        // (`synth::allreduce`), 1.014 (the ring's 1.088 before: equal blocks leave the two
        // ranks without a chord short of ingress).
        ("mixed-6", [1.02, 1.02, 1.00, 1.01, 1.01]),
    ];
    // The table's figure, rounded: below figure + 0.005, and at most 1.03.
    let ceiling = |figure: f64| (figure + 0.005).min(1.03);
    let kinds = [
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
    ];
    let families: Vec<String> = hccl_compiler::families::all_families()
        .iter()
        .map(|f| f.name().to_string())
        .filter(|n| n != "packed_trees")
        .collect();
    for (name, topo) in machines() {
        let base = Options {
            collectives: kinds.to_vec(),
            sizes: vec![GIB],
            model: hccl_compiler::cost::CostModel::for_topology(&topo),
            ..Options::default()
        };
        let mut all = base.clone();
        all.collectives.push(CollectiveKind::AllReduce);
        let with = search::compile(&topo, &all).expect("compiles");
        // Without the packed trees: only where they won (elsewhere the search's least time
        // over the same candidates less a loser is the same row, at the one size compiled).
        let won: Vec<CollectiveKind> = with
            .rows
            .iter()
            .filter(|r| r.algorithm == "packed_trees")
            .map(|r| r.collective)
            .collect();
        let without = if won.is_empty() {
            Vec::new()
        } else {
            search::compile(
                &topo,
                &Options {
                    algorithms: Some(families.clone()),
                    collectives: won,
                    ..base.clone()
                },
            )
            .expect("compiles")
            .rows
        };
        let (_, ceilings) = CEILINGS
            .iter()
            .find(|c| c.0 == name)
            .expect("a ceiling for every machine");
        let allreduce = with.rows.last().expect("an AllReduce row");
        assert_eq!(allreduce.collective, CollectiveKind::AllReduce);
        println!(
            "{name:>20} {:>14} {:.3} ({})",
            "AllReduce",
            allreduce.bound_ratio(),
            allreduce.algorithm
        );
        assert!(
            allreduce.bound_ratio() < ceiling(ceilings[4]),
            "{name} AllReduce ({}) is {:.4}× its bound: docs/synthesis.md says {} (update both)",
            allreduce.algorithm,
            allreduce.bound_ratio(),
            ceilings[4]
        );
        for row in with.rows.iter().filter(|r| kinds.contains(&r.collective)) {
            let old = without
                .iter()
                .find(|o| o.collective == row.collective)
                .unwrap_or(row);
            let (ratio, before) = (row.bound_ratio(), old.bound_ratio());
            println!(
                "{name:>20} {:>14} {before:.3} ({}) -> {ratio:.3} ({})",
                row.collective.name(),
                old.algorithm,
                row.algorithm
            );
            assert!(
                row.predicted_us <= old.predicted_us * (1.0 + 1e-9),
                "{name} {}: worse with synthesis",
                row.collective.name()
            );
            let k = kinds.iter().position(|&k| k == row.collective).unwrap();
            assert!(
                ratio < ceiling(ceilings[k]),
                "{name} {} ({}) is {ratio:.4}× its bound: docs/synthesis.md says {} (update both)",
                row.collective.name(),
                row.algorithm,
                ceilings[k]
            );
        }
    }
}

/// Routed rings on the DGX-1: its six NVLink rings and one spare ring over PCIe and QPI,
/// through the GPU pairs that share no NVLink, at half a PCIe switch's uplink (two GPUs send
/// through each): 150 + 7.875 GB/s, the rate the compiler's bound counts. Every schedule
/// they lower to verifies, and AllReduce at 1 GiB (the ring family's 1.06 before) comes
/// within 1.03 of its bound. Machines whose rings already use every route get none.
#[test]
fn routed_rings_add_the_dgx1s_pcie_ring() {
    use hccl_compiler::synth::rings::{RoutedRings, routed_rings};
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let set = routed_rings(&topo).expect("a spare ring on the DGX-1");
    assert_eq!((set.rings.len(), set.spare), (7, 1));
    let spare = &set.rings[6];
    for i in 0..8 {
        let (a, b) = (spare[i], spare[(i + 1) % 8]);
        assert!(topo.direct_edge(a, b).is_none(), "{a}->{b} has an NVLink");
    }
    for &r in &set.rates[..6] {
        assert!((r - 25.0).abs() < 1e-9, "{:?}", set.rates);
    }
    assert!((set.rates[6] - 7.875).abs() < 1e-9, "{:?}", set.rates);
    assert!((set.rate() - 157.875).abs() < 1e-9);
    assert!(synth::rounding_loss(&set.rates, set.widths.iter().sum()) <= synth::ROUNDING_LOSS);

    let family = RoutedRings;
    for collective in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
        Collective::Broadcast { root: 3 },
        Collective::Reduce { root: 5 },
    ] {
        let space = family.param_space(&topo, collective);
        assert!(!space.is_empty(), "{collective}");
        // The shallowest and the deepest pipeline, both placements.
        for params in [space[0], space[space.len() - 1]] {
            for in_place in [false, true] {
                let cands = family.schedules(&topo, collective, params, in_place);
                assert_eq!(cands.len(), 1, "{collective} {params:?}");
                let c = &cands[0];
                assert_eq!(c.params.channels, 7);
                assert!(
                    c.synthesis
                        .as_ref()
                        .is_some_and(|s| s.method == "routed-rings")
                );
                if let Err(e) = verify(&c.schedule) {
                    panic!("{collective} {params:?} in_place={in_place}: {e:?}");
                }
            }
        }
    }

    let options = Options {
        collectives: vec![CollectiveKind::AllReduce],
        sizes: vec![GIB],
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Options::default()
    };
    let row = &search::compile(&topo, &options).expect("compiles").rows[0];
    assert_eq!(row.algorithm, "routed_rings");
    assert!(row.bound_ratio() <= 1.03, "{}", row.bound_ratio());

    for name in ["dgx-a100", "h100-cluster-2node", "ascend910-8"] {
        let topo = hccl_topologies::shipped_by_name(name).unwrap();
        assert!(routed_rings(&topo).is_none(), "{name}");
    }
}

/// AllReduce on the mixed-speed machine: equal blocks leave the two ranks without a chord
/// (200 GB/s of ingress, the others 225) short, 1.083 of the bound at best; trees carrying
/// blocks as large as their rates both ways reach the gossip bound's rate
/// `Σ B_in / 2(n − 1)` = 1300 / 10 = 130 GB/s, every lowered schedule verifies in both
/// placements, and the compiled AllReduce at 1 GiB is within 1.03 of the bound. Machines
/// whose ranks all have the same ingress are not offered the trees.
#[test]
fn allreduce_trees_reach_the_gossip_bound_on_mixed_speeds() {
    use hccl_compiler::synth::SynthLevel;
    use hccl_compiler::synth::allreduce::{PackedAllReduce, allreduce_packing};
    let (_, topo) = machines()
        .into_iter()
        .find(|(n, _)| n == "mixed-6")
        .expect("the mixed machine");
    let packing = allreduce_packing(&topo, SynthLevel::Auto).expect("trees on mixed speeds");
    assert_eq!(packing.direction, Direction::Both);
    assert!((packing.bound - 130.0).abs() < 0.1, "{}", packing.bound);
    assert!(packing.rate >= 130.0 * 0.999, "{}", packing.rate);
    let family = PackedAllReduce::at(SynthLevel::Auto);
    let space = family.param_space(&topo, Collective::AllReduce);
    assert!(!space.is_empty());
    for params in [space[0], space[space.len() - 1]] {
        for in_place in [false, true] {
            let cands = family.schedules(&topo, Collective::AllReduce, params, in_place);
            assert_eq!(cands.len(), 1, "{params:?}");
            if let Err(e) = verify(&cands[0].schedule) {
                panic!("{params:?} in_place={in_place}: {e:?}");
            }
        }
    }
    let options = Options {
        collectives: vec![CollectiveKind::AllReduce],
        sizes: vec![GIB],
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Options::default()
    };
    let row = &search::compile(&topo, &options).expect("compiles").rows[0];
    assert_eq!(row.algorithm, "packed_allreduce");
    assert!(row.bound_ratio() <= 1.03, "{}", row.bound_ratio());

    for name in ["dgx1-v100", "dgx-a100", "h100-cluster-2node"] {
        let topo = hccl_topologies::shipped_by_name(name).unwrap();
        assert!(
            allreduce_packing(&topo, SynthLevel::Auto).is_none(),
            "{name}"
        );
    }
}

/// A compile of the whole size range picks, at 1 GiB, what a compile of 1 GiB alone picks:
/// the deepest candidates are simulated at a few sizes only and interpolated in between,
/// and the search simulates the close ones where it decides (`search::refine`). Before, the
/// 2-node H100 cluster's whole-range Broadcast and Reduce took packed trees at 1 GiB (1.029
/// and 1.022 of the bound) where `rail_chains` reaches 1.024 and 1.013.
#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn whole_range_compiles_decide_one_gib_as_one_size_does() {
    let topo = hccl_topologies::shipped_by_name("h100-cluster-2node").expect("shipped");
    let kinds = vec![CollectiveKind::Broadcast, CollectiveKind::Reduce];
    let whole = Options {
        collectives: kinds.clone(),
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Options::default()
    };
    let one = Options {
        sizes: vec![GIB],
        ..whole.clone()
    };
    let at = |plan: &search::CompiledPlan, kind| {
        plan.rows
            .iter()
            .find(|r| r.collective == kind && r.bytes == GIB)
            .map(|r| r.predicted_us)
            .expect("a row at 1 GiB")
    };
    let (w, o) = (
        search::compile(&topo, &whole).expect("compiles"),
        search::compile(&topo, &one).expect("compiles"),
    );
    for kind in kinds {
        let (tw, to) = (at(&w, kind), at(&o, kind));
        assert!(
            tw <= to * 1.002,
            "{kind} at 1 GiB: {tw:.1} µs over the whole range, {to:.1} µs alone"
        );
    }
}
