//! Unit tests of the search's helpers: sizes, sampling, budgets, the step cap and the
//! baseline's source.

use super::costing::{SCALE_RANKS, sample_indices, sim_budget};
use super::emit::fit;
use super::generate::{MAX_CANDIDATE_STEPS, drop_duplicates, generate_capped};
use super::nccl::{baseline_time, modelled_baselines};
use super::options::{Options, geometric_sizes};
use super::par::par_map;
use super::registry::all_families;
use crate::cost::NcclChoice;
use crate::families::{Candidate, FamilyParams};
use hccl_ir::{Collective, Protocol};

#[test]
fn geometric_sizes_include_both_ends() {
    assert_eq!(geometric_sizes(1024, 8192, 2), vec![1024, 2048, 4096, 8192]);
    assert_eq!(geometric_sizes(1024, 1000, 2), vec![1024]);
    assert_eq!(geometric_sizes(1, u64::MAX, 2).len(), 64);
}

#[test]
fn subsampling_keeps_the_ends() {
    assert_eq!(sample_indices(5, 10, 1000), vec![0, 1, 2, 3, 4]);
    let s = sample_indices(23, 100_000, 400_000);
    assert_eq!(s.first(), Some(&0));
    assert_eq!(s.last(), Some(&22));
    assert_eq!(s.len(), 4);
    assert_eq!(sample_indices(23, usize::MAX, 1).len(), 2);
}

#[test]
fn budget_shrinks_only_beyond_scale_ranks() {
    assert_eq!(sim_budget(400_000, 8), 400_000);
    assert_eq!(sim_budget(400_000, SCALE_RANKS), 400_000);
    assert_eq!(sim_budget(400_000, 1024), 25_000);
}

#[test]
fn par_map_keeps_item_order() {
    let items: Vec<u64> = (0..100).collect();
    assert_eq!(
        par_map(&items, |&x| x * x),
        items.iter().map(|x| x * x).collect::<Vec<_>>()
    );
    assert!(par_map(&[] as &[u64], |&x| x).is_empty());
}

/// On 1024 ranks the ranks²-step families are not generated at all; trees are.
#[test]
fn quadratic_families_are_capped_on_many_ranks() {
    let text = hccl_topologies::shipped_text("dgx-h100").expect("shipped");
    let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("parses");
    let topo = hccl_topologies::build(hccl_topologies::generate::cluster(128, &spec), "cluster")
        .expect("builds");
    assert_eq!(topo.nranks(), 1024);
    for family in all_families() {
        let name = family.name();
        if !["ring", "double_ring", "mesh", "tree"].contains(&name) {
            continue;
        }
        let g = generate_capped(family.as_ref(), &topo, Collective::AllReduce);
        if name == "tree" {
            assert!(!g.capped && !g.candidates.is_empty());
        } else {
            assert!(g.capped && g.candidates.is_empty(), "{name}");
        }
        assert!(
            g.candidates
                .iter()
                .all(|c| c.schedule.step_count() as u64 <= MAX_CANDIDATE_STEPS)
        );
    }
    assert_eq!(
        baseline_time(
            &NcclChoice {
                algo: crate::cost::NcclAlgo::Ring,
                protocol: Protocol::Simple,
                nccl_model_us: 42.0
            },
            f64::INFINITY,
            &["ring"],
            &[]
        ),
        Some((42.0, true))
    );
}

#[test]
fn baselines_too_large_to_sample_are_nccls_formula() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let tree = all_families()
        .into_iter()
        .find(|f| f.name() == "tree")
        .expect("registered");
    let candidates: Vec<Candidate> = tree
        .param_space(&topo, Collective::AllReduce)
        .into_iter()
        .flat_map(|p| tree.generate(&topo, Collective::AllReduce, p))
        .collect();
    let least = candidates.iter().map(Candidate::work_steps).min().unwrap() as usize;
    let sizes = geometric_sizes(1 << 10, 1 << 30, 2);
    let options = Options::default();
    let modelled = |budget| modelled_baselines(&candidates, &sizes, &options, budget);
    // The cheapest tree simulated at 3 sizes: the baseline is simulated; at 2, NCCL's.
    assert!(modelled(3 * least).is_empty());
    assert_eq!(modelled(3 * least - 1), vec!["tree"]);
    // Every size affordable (one or two sizes compiled): simulated.
    assert!(modelled_baselines(&candidates, &sizes[..2], &options, 2 * least).is_empty());
    // Other families never are.
    let other: Vec<Candidate> = all_families()
        .into_iter()
        .filter(|f| f.name() == "hierarchical_hd")
        .flat_map(|f| {
            f.generate(
                &topo,
                Collective::AllReduce,
                FamilyParams {
                    channels: 1,
                    pipeline: 1,
                },
            )
        })
        .collect();
    assert!(modelled_baselines(&other, &sizes, &options, 1).is_empty());
    // A modelled family's baseline is NCCL's formula even where it was simulated.
    let choice = NcclChoice {
        algo: crate::cost::NcclAlgo::Tree,
        protocol: Protocol::LL,
        nccl_model_us: 105.0,
    };
    assert_eq!(
        baseline_time(&choice, 157.0, &[], &["tree"]),
        Some((105.0, true))
    );
    assert_eq!(
        baseline_time(&choice, 157.0, &[], &[]),
        Some((157.0, false))
    );
    assert_eq!(baseline_time(&choice, f64::INFINITY, &[], &[]), None);
}

#[test]
fn fit_passes_through_the_range_ends() {
    let sizes = [1000, 2000, 4000];
    let times = [11.0, 12.0, 14.0];
    let f = fit(&sizes, &times, 0, 3).unwrap();
    assert!((f.latency_us - 10.0).abs() < 1e-9);
    assert!((f.predict_us(4000) - 14.0).abs() < 1e-9);
    // One-size last range uses the previous point.
    let g = fit(&sizes, &times, 2, 3).unwrap();
    assert!((g.predict_us(2000) - 12.0).abs() < 1e-9);
    // A candidate with no time below its least size: its one point, all bandwidth.
    let times = [f64::INFINITY, f64::INFINITY, 14.0];
    let h = fit(&sizes, &times, 2, 3).unwrap();
    assert_eq!(h.latency_us, 0.0);
    assert!((h.predict_us(4000) - 14.0).abs() < 1e-9);
}

/// A schedule two parameter sets lowered alike is costed once: later repeats of a family's
/// candidate go, the first stays; a different least size, selectability or schedule keeps a
/// candidate, and NCCL's families are left whole.
#[test]
fn repeated_schedules_are_dropped_but_the_first() {
    let topo = hccl_topologies::build(hccl_topologies::generate::host(4, 10.0), "t").unwrap();
    let family = all_families()
        .into_iter()
        .find(|f| f.name() == "double_ring")
        .expect("registered");
    let p = |channels, pipeline| FamilyParams { channels, pipeline };
    let made = family.generate(&topo, Collective::AllReduce, p(1, 1));
    let first = made.first().expect("a candidate").clone();
    let other = family
        .generate(&topo, Collective::AllReduce, p(1, 2))
        .remove(0);
    assert_ne!(first.schedule, other.schedule);
    let with = |c: &Candidate, params: FamilyParams, min_bytes: u64| Candidate {
        params,
        min_bytes,
        ..c.clone()
    };
    let mut ring = first.clone();
    ring.algorithm = "ring".into();
    let mut list = vec![
        (first.clone(), true),
        (with(&first, p(2, 1), 0), true),  // repeat: dropped
        (with(&first, p(3, 1), 64), true), // another least size: kept
        (with(&first, p(4, 1), 0), false), // not selectable: kept
        (other.clone(), true),             // another schedule: kept
        (with(&first, p(5, 1), 0), true),  // repeat: dropped
        (ring.clone(), true),
        (with(&ring, p(2, 1), 0), true), // NCCL's family: kept
    ];
    assert_eq!(drop_duplicates(&mut list), 2);
    let left: Vec<(u32, u64, bool)> = list
        .iter()
        .map(|(c, s)| (c.params.channels, c.min_bytes, *s))
        .collect();
    assert_eq!(
        left,
        vec![
            (1, 0, true),
            (3, 64, true),
            (4, 0, false),
            (1, 0, true),
            (1, 0, true),
            (2, 0, true)
        ]
    );
    assert_eq!(list[3].0.schedule, other.schedule);
}

/// The cost phase's output for `collective` on `topo` under `options`, with the search it
/// ran in and the per-candidate budget; with `unlimited`, every candidate the cost phase's
/// limits stopped or left out of reach costed again without them (as when a winner fails
/// verification, [`costing::complete`](super::costing::complete)).
fn costed_on<'a>(
    topo: &'a hccl_topologies::Topology,
    options: &'a Options,
    (collective, unlimited): (Collective, bool),
) -> (
    super::context::Search<'a>,
    Vec<super::context::Costed>,
    usize,
) {
    use super::context::Search;
    use super::costing::{self, Tick};
    use super::registry::families_for;
    use super::{generate, screen};
    let search = Search::new(topo, options, families_for(options.synth));
    let generation = generate::generate(&search, collective).expect("generated");
    let simulated = ["ring", "tree", "pairwise"];
    let (probes, _) = screen::run(&search, &generation.candidates, &simulated);
    let budget = sim_budget(options.sim_budget, topo.nranks());
    let mut progress = |_| {};
    let tick = Tick {
        kind: collective.kind(),
        index: 0,
        progress: &mut progress,
    };
    let nccl = super::nccl::nccl_choices(
        &search,
        collective.kind(),
        (generation.channels_hint, &generation.capped),
        &generation.candidates,
    );
    let (mut costed, _) = costing::run(
        &search,
        generation.candidates,
        &probes,
        (&simulated, &nccl),
        budget,
        tick,
    )
    .expect("costed");
    if unlimited {
        let all: Vec<usize> = (0..costed.len()).collect();
        let whole =
            |c: &super::context::Costed| simulated.contains(&c.candidate.algorithm.as_str());
        costing::complete(
            &search,
            (&mut costed, &probes),
            (&all, &whole),
            None,
            budget,
        );
    }
    (search, costed, budget)
}

/// The default options for `topo`, with synthesis on.
fn synth_options(topo: &hccl_topologies::Topology) -> Options {
    use super::context::offered_options;
    use super::registry::families_for;
    let base = Options {
        model: crate::cost::CostModel::for_topology(topo),
        synth: crate::synth::SynthLevel::Auto,
        ..Options::default()
    };
    let families = families_for(base.synth);
    offered_options(&base, &families)
        .expect("options")
        .unwrap_or(base)
}

/// The refine phase's runs stop past their size's best time, and that changes nothing: on the
/// 2-node H100 cluster's AllGather costed without the cost phase's limits (with them, no
/// interpolated candidate is left for refine near the best), refining with stops and
/// refining every pair to its end give the same winner and time at every size, and the
/// stopped runs, run to their end by `uncut`, give the times the full runs gave.
#[test]
fn refine_runs_stopped_past_the_best_change_no_winner() {
    use super::context::Costed;
    use super::refine::{REFINE_BUDGET, refine, uncut};
    let topo = hccl_topologies::shipped_by_name("h100-cluster-2node").expect("shipped");
    let options = &synth_options(&topo);
    let simulated = ["ring", "tree", "pairwise"];
    let (search, costed, budget) = costed_on(&topo, options, (Collective::AllGather, true));
    let np = options.protocols.len();
    let run = |whole: &dyn Fn(&Costed) -> bool| {
        let mut costed = costed.clone();
        let refined = refine(
            &search.sim,
            &mut costed,
            &search.sizes,
            options,
            (REFINE_BUDGET * budget, whole),
            &mut |_| 0.0,
        );
        (costed, refined)
    };
    let (mut stopped, refined) = run(&|c| simulated.contains(&c.candidate.algorithm.as_str()));
    let (full, reference) = run(&|_| true);
    assert!(refined.cut > 0, "no refine run stopped early");
    assert_eq!(reference.cut, 0);
    assert_eq!(refined.simulated, reference.simulated);
    let winner = |costed: &[Costed], si: usize| {
        let mut best: Option<(f64, usize, usize)> = None;
        for (c, costed) in costed.iter().enumerate().filter(|(_, c)| c.selectable) {
            for p in 0..np {
                let t = costed.times[p].as_ref().map_or(f64::INFINITY, |t| t[si]);
                if t.is_finite() && best.is_none_or(|b| t < b.0) {
                    best = Some((t, c, p));
                }
            }
        }
        best
    };
    for si in 0..search.sizes.len() {
        assert_eq!(winner(&stopped, si), winner(&full, si), "size {si}");
    }
    let mut ran = 0;
    for c in stopped.iter_mut() {
        ran += uncut(&search.sim, c, &search.sizes, options, (None, None));
        assert!(c.cut.is_empty());
    }
    assert_eq!(ran, refined.cut);
    for (a, b) in stopped.iter().zip(&full) {
        assert_eq!(a.times, b.times, "{}", a.candidate.algorithm);
    }
}

/// A flow run's times are affine in the size while its course stays the same: on DGX-1 and
/// the 2-node Azure cluster (templates costed as one rank class among them), for
/// hand-written families' AllReduce and Broadcast at every protocol, wherever two sizes'
/// runs took the same course, every size between runs to the time on the line through
/// theirs. Courses do repeat (what the cost phase saves).
#[test]
fn runs_of_one_course_are_affine_between() {
    use super::ready::Ready;
    use crate::cost::{CostModel, Network, Simulator};
    let sizes = geometric_sizes(1 << 10, 16 << 20, 2);
    let (mut between, mut repeated) = (0, 0);
    for machine in ["dgx1-v100", "azure-ndv2-2node"] {
        let topo = hccl_topologies::shipped_by_name(machine).expect("shipped");
        let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
        for family in all_families() {
            if !["ring", "tree", "double_ring", "kary_tree", "hierarchical"]
                .contains(&family.name())
            {
                continue;
            }
            for collective in [Collective::AllReduce, Collective::Broadcast { root: 0 }] {
                for (channels, pipeline) in [(1, 1), (2, 4)] {
                    let params = FamilyParams { channels, pipeline };
                    for c in family.generate(&topo, collective, params) {
                        let Ok(ready) = Ready::new(&sim, &c) else {
                            continue;
                        };
                        for protocol in [Protocol::LL, Protocol::LL128, Protocol::Simple] {
                            let runs: Vec<(f64, u64)> = sizes
                                .iter()
                                .map(|&b| {
                                    let e = ready
                                        .run_within(&sim, (b, protocol), f64::INFINITY, true)
                                        .expect("runs")
                                        .expect("within an infinite limit");
                                    (e.time_us, e.course.expect("a flow run's course"))
                                })
                                .collect();
                            for i in 0..runs.len() {
                                for j in i + 2..runs.len() {
                                    if runs[i].1 != runs[j].1 {
                                        continue;
                                    }
                                    repeated += 1;
                                    let (x0, x1) = (sizes[i] as f64, sizes[j] as f64);
                                    for k in i + 1..j {
                                        let x = sizes[k] as f64;
                                        let line = runs[i].0
                                            + (runs[j].0 - runs[i].0) * (x - x0) / (x1 - x0);
                                        let t = runs[k].0;
                                        assert!(
                                            (line - t).abs() <= 1e-9 * t,
                                            "{machine} {} {params:?} {protocol:?} at {} B: \
                                             {t} µs, the line gives {line}",
                                            c.algorithm,
                                            sizes[k]
                                        );
                                        between += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        repeated > 100,
        "only {repeated} pairs of runs took one course"
    );
    assert!(between > 1000, "only {between} sizes between them");
}

/// Costing takes a size between two runs of one course from them ([`super::costing`]'s
/// `Courses`), not from a run, and the times are those of running every size: on DGX-1's
/// AllReduce, every candidate's times match `run`'s at every size and protocol (to
/// rounding), and the bisection order visits every position once.
#[test]
fn costing_between_runs_of_one_course_gives_the_runs_times() {
    use super::costing::{bisection_order, cost_sampled};
    use super::ready::Ready;
    use crate::cost::{CostModel, Network, Simulator};
    for n in 0..40 {
        let mut order = bisection_order(n);
        order.sort_unstable();
        assert_eq!(order, (0..n).collect::<Vec<_>>());
    }
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let options = Options {
        model: CostModel::for_topology(&topo),
        sizes: geometric_sizes(1 << 10, 64 << 20, 2),
        ..Options::default()
    };
    let sim = Simulator::new(Network::new(&topo), options.model.clone());
    let mut checked = 0;
    for family in all_families() {
        if !["ring", "tree", "double_ring", "kary_tree"].contains(&family.name()) {
            continue;
        }
        for pipeline in [1, 4] {
            let params = FamilyParams {
                channels: 2,
                pipeline,
            };
            for c in family.generate(&topo, Collective::AllReduce, params) {
                let budget = usize::MAX / 2;
                let out = cost_sampled(
                    &sim,
                    &c,
                    &options.sizes,
                    &options,
                    budget,
                    None,
                    (false, super::costing::Limits::None),
                );
                let ready = Ready::new(&sim, &c).expect("prepares");
                for (p, &protocol) in options.protocols.iter().enumerate() {
                    let times = out.times[p].as_ref().expect("costed");
                    for (si, &bytes) in options.sizes.iter().enumerate() {
                        let t = ready.run(&sim, bytes, protocol).expect("runs").time_us;
                        assert!(
                            (times[si] - t).abs() <= 1e-9 * t,
                            "{} {params:?} {protocol:?} at {bytes} B: costed {}, ran {t}",
                            c.algorithm,
                            times[si]
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 300, "only {checked} times checked");
}

/// `carry_down` simulates candidates just below their least size where they may win: on
/// DGX-1's AllToAll the synthesized flow schedules (costed from about 1 MiB up) take
/// 512 KiB from the mesh, at the times a run gives; nothing is simulated more than
/// `CARRY_SPAN` below a least size, and a second pass has nothing left to do.
#[test]
fn carry_down_simulates_just_below_the_least_sizes() {
    use super::ready::Ready;
    use super::refine::carry_down;
    use super::select::winner_at;
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let options = &synth_options(&topo);
    let (search, mut costed, budget) = costed_on(&topo, options, (Collective::AllToAll, false));
    let sizes = &search.sizes;
    let np = options.protocols.len();
    let half = sizes.iter().position(|&s| s == 512 << 10).expect("a size");
    let before = costed.clone();
    let (t, c, _) = winner_at(&costed, half, np).expect("a winner");
    assert_ne!(costed[c].candidate.algorithm, "flow_alltoall");

    let carried = carry_down(&search.sim, &mut costed, sizes, options, budget);
    assert!(carried > 0);
    let (t_after, c, _) = winner_at(&costed, half, np).expect("a winner");
    assert_eq!(costed[c].candidate.algorithm, "flow_alltoall");
    assert!(t_after < t, "{t_after} µs, was {t} µs");
    // Every time it changed is a run's, and none lies below a quarter of the least size.
    let mut changed = 0;
    for (new, old) in costed.iter().zip(&before) {
        let ready = Ready::new(&search.sim, &new.candidate).expect("prepares");
        for (p, (a, b)) in new.times.iter().zip(&old.times).enumerate() {
            let (Some(a), Some(b)) = (a, b) else {
                continue;
            };
            for si in (0..sizes.len()).filter(|&si| a[si] != b[si]) {
                changed += 1;
                assert!(sizes[si] * 4 >= new.candidate.min_bytes);
                let run = ready.run(&search.sim, sizes[si], options.protocols[p]);
                let run = run.expect("runs").time_us;
                if new.cut.contains(&(si, p)) {
                    // Stopped past the best there: it could not have won.
                    let best = winner_at(&costed, si, np).expect("a winner").0;
                    assert!(a[si].is_infinite() && run >= best);
                } else {
                    assert_eq!(a[si], run, "{} at {} B", new.candidate.algorithm, sizes[si]);
                }
            }
        }
    }
    assert!(changed >= carried);
    assert_eq!(
        carry_down(&search.sim, &mut costed, sizes, options, budget),
        0
    );
}

/// The cost phase samples an interpolated candidate only at the sizes a lower bound leaves
/// within its limit (`in_reach`), and that changes no winner: on the 2-node H100 cluster's
/// AllGather, the winners after refine and `carry_down` are those of costing every
/// candidate at every size without limits, at the same times; and interpolated candidates
/// were left out of reach at some size (else the check would prove nothing).
#[test]
fn sizes_out_of_reach_change_no_winner() {
    use super::costing::sample_indices;
    use super::refine::{CARRY_BUDGET, REFINE_BUDGET, carry_down, refine};
    use super::select::winner_at;
    let topo = hccl_topologies::shipped_by_name("h100-cluster-2node").expect("shipped");
    let options = &synth_options(&topo);
    let np = options.protocols.len();
    let collective = Collective::AllGather;
    let winners = |unlimited: bool| {
        let (search, mut costed, budget) = costed_on(&topo, options, (collective, unlimited));
        // Interpolated candidates (whole schedules sampled at fewer sizes than they have)
        // infinite at a size from their least one on.
        let left_out = costed
            .iter()
            .filter(|c| {
                let least = c.candidate.min_bytes;
                let from = search.sizes.partition_point(|&s| s < least);
                let n = search.sizes.len() - from;
                let steps = c.candidate.work_steps() as usize;
                c.candidate.template.is_none()
                    && sample_indices(n, steps, budget).len() < n
                    && (from..search.sizes.len())
                        .any(|si| c.times.iter().flatten().all(|t| t[si].is_infinite()))
            })
            .count();
        let whole = |_: &super::context::Costed| false;
        refine(
            &search.sim,
            &mut costed,
            &search.sizes,
            options,
            (REFINE_BUDGET * budget, &whole),
            &mut |_| 0.0,
        );
        carry_down(
            &search.sim,
            &mut costed,
            &search.sizes,
            options,
            CARRY_BUDGET * budget,
        );
        let winners: Vec<_> = (0..search.sizes.len())
            .map(|si| {
                winner_at(&costed, si, np).map(|(t, c, p)| {
                    let c = &costed[c].candidate;
                    (t, c.algorithm.clone(), c.params, p)
                })
            })
            .collect();
        (left_out, winners)
    };
    let (left_out, limited) = winners(false);
    let (unlimited_left_out, full) = winners(true);
    assert!(
        left_out > 0,
        "no interpolated candidate was left out of reach"
    );
    assert_eq!(unlimited_left_out, 0);
    for (si, (a, b)) in limited.iter().zip(&full).enumerate() {
        let (Some(a), Some(b)) = (a, b) else {
            assert_eq!(a.is_some(), b.is_some(), "size {si}");
            continue;
        };
        assert!(
            (a.0 - b.0).abs() <= 1e-9 * b.0 && a.1 == b.1 && a.2 == b.2 && a.3 == b.3,
            "size {si}: {a:?} with limits, {b:?} without"
        );
    }
}

/// The first wave's limits (NCCL's families, [`costing::run`](super::costing::run)) change
/// neither the baseline nor a winner: on DGX-1's AllReduce (NCCL's choice moves between the
/// ring and the tree and across protocols) and the 2-node H100 cluster's AllGather, the
/// family's best time under NCCL's protocol and the best time at every size are those of
/// costing without limits (to rounding), and some of the first wave's runs were stopped
/// (else the check would prove nothing).
#[test]
fn first_wave_limits_change_no_baseline_and_no_winner() {
    use super::select::winner_at;
    for (machine, collective) in [
        ("dgx1-v100", Collective::AllReduce),
        ("h100-cluster-2node", Collective::AllGather),
    ] {
        let topo = hccl_topologies::shipped_by_name(machine).expect("shipped");
        let options = &synth_options(&topo);
        let np = options.protocols.len();
        let simulated = ["ring", "tree", "pairwise"];
        let outcome = |unlimited: bool| {
            let (search, costed, _) = costed_on(&topo, options, (collective, unlimited));
            let generation = super::generate::generate(&search, collective).expect("generated");
            let nccl = super::nccl::nccl_choices(
                &search,
                collective.kind(),
                (generation.channels_hint, &generation.capped),
                &generation.candidates,
            );
            let stopped = costed
                .iter()
                .filter(|c| simulated.contains(&c.candidate.algorithm.as_str()) && c.limited)
                .count();
            let per_size: Vec<(f64, f64)> = (0..search.sizes.len())
                .map(|si| {
                    let chosen = nccl[si].and_then(|ch| {
                        let p = options.protocols.iter().position(|&q| q == ch.protocol)?;
                        Some((ch.algo.family(), p))
                    });
                    let baseline = chosen.map_or(f64::INFINITY, |(family, p)| {
                        costed
                            .iter()
                            .filter(|c| c.candidate.algorithm == family)
                            .filter_map(|c| c.times[p].as_ref().map(|t| t[si]))
                            .fold(f64::INFINITY, f64::min)
                    });
                    let best = winner_at(&costed, si, np).map_or(f64::INFINITY, |w| w.0);
                    (baseline, best)
                })
                .collect();
            (stopped, per_size, nccl.iter().flatten().count())
        };
        let (stopped, limited, chosen) = outcome(false);
        let (unstopped, full, _) = outcome(true);
        assert!(
            stopped > 0,
            "{machine}: no run of NCCL's families was stopped"
        );
        assert_eq!(unstopped, 0, "{machine}");
        assert!(chosen > 0, "{machine}: NCCL made no choice");
        // To rounding: a size between two runs of one course takes its time from them
        // (`Courses`), and stopped runs leave other pairs.
        let same = |a: f64, b: f64| a == b || (a - b).abs() <= 1e-9 * b;
        for (si, (a, b)) in limited.iter().zip(&full).enumerate() {
            assert!(
                same(a.0, b.0) && same(a.1, b.1),
                "{machine}, size {si}: {a:?} with limits, {b:?} without"
            );
        }
    }
}
