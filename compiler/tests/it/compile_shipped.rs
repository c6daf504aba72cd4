//! The search on every shipped machine and every collective: plans verify, cover every size,
//! never lose to the NCCL baseline, never beat the lower bound, and are deterministic.

use crate::cost_common;

use cost_common::par_each;
use hccl_compiler::families::{Candidate, FamilyParams};
use hccl_compiler::search::{self, Options, SearchError, collective_of};
use hccl_ir::{CollectiveKind, PlanFile, verify::verify_plan};
use hccl_topologies::{Topology, generate};

/// A small size range keeps the debug-mode test fast.
fn options() -> Options {
    Options {
        sizes: vec![1 << 10, 1 << 14, 1 << 20, 1 << 24],
        ..Options::default()
    }
}

fn shipped() -> Vec<Topology> {
    hccl_topologies::shipped()
        .iter()
        .map(|(name, _)| hccl_topologies::shipped_by_name(name).expect("shipped builds"))
        .collect()
}

fn check_plan(topo: &Topology, plan: &PlanFile, opts: &Options) {
    verify_plan(plan)
        .unwrap_or_else(|errs| panic!("{}: plan does not verify: {errs:?}", topo.name));
    // The text written with the entries side by side is the one-pass text.
    assert!(
        plan.to_ron() == plan.to_ron_one_pass(),
        "{}: the spliced plan text differs from the one-pass text",
        topo.name
    );
    // Every entry is sealed as verified (a job loading the plan skips verifying it).
    assert!(
        plan.sealed().iter().all(|s| *s),
        "{}: unsealed entries",
        topo.name
    );
    for &kind in &opts.collectives {
        let entries: Vec<_> = plan
            .entries
            .iter()
            .filter(|e| e.schedule.collective == collective_of(kind))
            .collect();
        assert!(!entries.is_empty(), "{} {kind}: no entry", topo.name);
        // Contiguous cover of [0, ∞).
        assert_eq!(entries[0].min_bytes, 0);
        for w in entries.windows(2) {
            assert_eq!(w[0].max_bytes, Some(w[1].min_bytes), "{} {kind}", topo.name);
        }
        assert_eq!(entries.last().unwrap().max_bytes, None);
        for e in &entries {
            assert_eq!(e.schedule.nranks, topo.nranks());
            let fit = e.cost.expect("entries carry a cost fit");
            assert!(fit.latency_us >= 0.0 && fit.algbw_gbps > 0.0, "{fit:?}");
        }
        for &bytes in &opts.sizes {
            assert!(plan.lookup(collective_of(kind), bytes, false).is_some());
        }
    }
}

#[test]
fn every_shipped_machine_and_collective_compiles() {
    let opts = options();
    // The machines side by side (the search's own threads leave a core idle while it
    // verifies and fits), the largest first.
    let mut machines = shipped();
    machines.sort_by_key(|t| std::cmp::Reverse(t.nranks()));
    par_each(&machines, |topo| {
        let topo = topo.clone();
        let compiled = search::compile(&topo, &opts).unwrap();
        check_plan(&topo, &compiled.plan, &opts);
        assert_eq!(
            compiled.rows.len(),
            opts.collectives.len() * opts.sizes.len()
        );
        for row in &compiled.rows {
            assert!(
                row.predicted_us >= row.bound_us * (1.0 - 1e-9),
                "{}: {row:?} beats its bound",
                topo.name
            );
            if let Some(b) = row.baseline_us {
                assert!(
                    row.predicted_us <= b * (1.0 + 1e-12),
                    "{}: {row:?} slower than NCCL",
                    topo.name
                );
            }
            assert!(row.busbw_gbps() > 0.0);
        }
        // Allreduce always has NCCL's ring (or tree) as a baseline.
        assert!(
            compiled
                .rows
                .iter()
                .filter(|r| r.collective == CollectiveKind::AllReduce)
                .all(|r| r.baseline_algorithm.is_some())
        );
        // The explain path re-simulates the same entries: same predictions.
        let rows = search::evaluate_plan(&topo, &compiled.plan, &opts).unwrap();
        assert_eq!(rows.len(), compiled.rows.len());
        for (a, b) in rows.iter().zip(&compiled.rows) {
            assert_eq!((a.collective, a.bytes), (b.collective, b.bytes));
            assert!((a.predicted_us - b.predicted_us).abs() <= 1e-9 * b.predicted_us);
        }
    });
}

#[test]
fn compiling_twice_gives_identical_plans() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let opts = Options {
        collectives: vec![CollectiveKind::AllReduce, CollectiveKind::AllToAll],
        ..options()
    };
    let a = search::compile(&topo, &opts).unwrap().plan.to_ron();
    let b = search::compile(&topo, &opts).unwrap().plan.to_ron();
    assert_eq!(a, b);
}

/// On a small machine the collectives compile side by side on the cores: the plan, rows and
/// report's collectives are those of compiling each collective alone, in the options' order,
/// progress counts the collectives finished, and the text written beside the search is the
/// plan's text.
#[test]
fn collectives_side_by_side_give_the_plan_of_one_at_a_time() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let opts = Options {
        collectives: vec![
            CollectiveKind::Broadcast,
            CollectiveKind::AllReduce,
            CollectiveKind::AllToAll,
        ],
        ..options()
    };
    let mut seen = Vec::new();
    let (together, text) = search::compile_to_text(&topo, &opts, &mut |p| seen.push(p)).unwrap();
    let mut alone = hccl_ir::PlanFile::new(together.plan.meta.clone());
    let mut rows = Vec::new();
    for &kind in &opts.collectives {
        let one = search::compile(
            &topo,
            &Options {
                collectives: vec![kind],
                ..opts.clone()
            },
        )
        .unwrap();
        for seal in one.plan.verified {
            alone.add_seal(seal);
        }
        alone.entries.extend(one.plan.entries);
        rows.extend(one.rows);
    }
    assert_eq!(together.plan.to_ron(), alone.to_ron());
    assert!(
        text == alone.to_ron(),
        "the text written beside the search differs"
    );
    assert_eq!(format!("{:?}", together.rows), format!("{rows:?}"));
    let kinds: Vec<_> = together
        .report
        .collectives
        .iter()
        .map(|c| c.collective)
        .collect();
    assert_eq!(kinds, opts.collectives);
    // Every collective reports its end (done == total); the count of finished collectives
    // never falls and ends at all of them.
    for &kind in &opts.collectives {
        assert!(
            seen.iter()
                .any(|p| p.collective == kind && p.done == p.total && p.collectives_total == 3),
            "{kind}: no final progress in {seen:?}"
        );
    }
    assert!(
        seen.windows(2)
            .all(|w| w[0].collectives_done <= w[1].collectives_done),
        "{seen:?}"
    );
    assert_eq!(seen.last().map(|p| p.collectives_done), Some(3));
}

#[test]
fn ring_reaches_the_bound_on_a_ring() {
    let topo = hccl_topologies::build(generate::ring(8, 25.0, 0.7), "ring8").unwrap();
    let opts = Options {
        collectives: vec![CollectiveKind::AllReduce, CollectiveKind::AllGather],
        sizes: vec![1 << 30],
        ..Options::default()
    };
    for row in search::compile(&topo, &opts).unwrap().rows {
        assert!(row.bound_ratio() < 1.02, "{row:?}");
    }
}

#[test]
fn algo_filter_and_extra_candidates() {
    let topo = hccl_topologies::shipped_by_name("dgx-h100").unwrap();
    let opts = Options {
        collectives: vec![CollectiveKind::AllReduce],
        algorithms: Some(vec!["ring".into()]),
        ..options()
    };
    let compiled = search::compile(&topo, &opts).unwrap();
    assert!(compiled.rows.iter().all(|r| r.algorithm == "ring"));
    assert!(compiled.plan.entries.iter().all(|e| e.algorithm == "ring"));

    let unknown = Options {
        algorithms: Some(vec!["warp_drive".into()]),
        ..opts.clone()
    };
    assert!(matches!(
        search::compile(&topo, &unknown),
        Err(SearchError::BadOptions(_))
    ));

    // An external candidate (here: a ring schedule under another name) competes and can
    // be selected by name.
    let ring = compiled.plan.entries[0].schedule.clone();
    let extra = Options {
        algorithms: Some(vec!["imported".into()]),
        extra: vec![Candidate {
            algorithm: "imported".into(),
            params: FamilyParams {
                channels: ring.channel_count(),
                pipeline: 1,
            },
            schedule: ring,
            symmetry: None,
            min_bytes: 0,
            synthesis: None,
            template: None,
        }],
        ..opts
    };
    let compiled = search::compile(&topo, &extra).unwrap();
    assert!(
        compiled
            .plan
            .entries
            .iter()
            .all(|e| e.algorithm == "imported")
    );
}

#[test]
fn a_cluster_compiles_and_uses_the_network() {
    let spec = hccl_topologies::parse_spec(
        hccl_topologies::shipped_text("dgx-h100").unwrap(),
        "dgx-h100",
    )
    .unwrap();
    let topo = hccl_topologies::build(generate::cluster(2, &spec), "cluster").unwrap();
    let opts = Options {
        collectives: vec![CollectiveKind::AllReduce, CollectiveKind::Broadcast],
        sizes: vec![1 << 12, 1 << 26],
        ..Options::default()
    };
    let compiled = search::compile(&topo, &opts).unwrap();
    check_plan(&topo, &compiled.plan, &opts);
    for row in &compiled.rows {
        assert!(row.bound_ratio() >= 1.0 - 1e-9, "{row:?}");
    }
}

/// Where every family is over the step cap (here the ring alone, on 800 ranks: about
/// 800·799 steps), the search falls back to each capped family's smallest parameter set
/// instead of failing; the fallback is verified like any candidate.
#[test]
fn capped_families_fall_back_to_their_smallest_schedule() {
    let topo = hccl_topologies::build(generate::ring(800, 25.0, 0.7), "ring800").unwrap();
    let opts = Options {
        collectives: vec![CollectiveKind::AllGather],
        sizes: vec![1 << 30],
        algorithms: Some(vec!["ring".into()]),
        ..Options::default()
    };
    let compiled = search::compile(&topo, &opts).expect("the fallback compiles");
    assert_eq!(compiled.rows.len(), 1);
    assert_eq!(compiled.rows[0].algorithm, "ring");
    let steps = compiled.plan.entries[0].schedule.step_count() as u64;
    assert!(
        steps > search::MAX_CANDIDATE_STEPS && steps <= search::FALLBACK_CANDIDATE_STEPS,
        "{steps} steps"
    );
    assert!(compiled.plan.sealed().iter().all(|s| *s));
}

/// The search's report follows the pipeline: per collective the six phases in order, each
/// phase taking what the one before handed on (where they count the same thing), and the
/// emit phase's entries those of the plan.
#[test]
fn the_report_follows_the_phases() {
    use search::{Phase, StopReason};
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let opts = Options {
        collectives: vec![CollectiveKind::AllReduce, CollectiveKind::Broadcast],
        ..options()
    };
    let compiled = search::compile(&topo, &opts).unwrap();
    let report = &compiled.report;
    assert_eq!(report.collectives.len(), 2);
    for (c, kind) in report.collectives.iter().zip(&opts.collectives) {
        assert_eq!(c.collective, *kind);
        assert_eq!(c.skipped, None);
        let phases: Vec<Phase> = c.phases.iter().map(|p| p.phase).collect();
        assert_eq!(
            phases,
            [
                Phase::Generate,
                Phase::Screen,
                Phase::Cost,
                Phase::Refine,
                Phase::SelectAndVerify,
                Phase::Emit
            ]
        );
        let [generate, screen, cost, _, select, emit] = &c.phases[..] else {
            unreachable!()
        };
        assert_eq!(screen.candidates_in, generate.candidates_out);
        // Eight ranks are not screened.
        assert_eq!(screen.candidates_out, screen.candidates_in);
        assert_eq!(cost.candidates_in, screen.candidates_out);
        assert!(cost.candidates_out <= cost.candidates_in);
        assert!(select.candidates_out <= select.candidates_in && select.candidates_out >= 1);
        assert_eq!(emit.candidates_in, opts.sizes.len());
        let entries = compiled
            .plan
            .entries
            .iter()
            .filter(|e| e.schedule.collective.kind() == *kind)
            .count();
        assert_eq!(emit.candidates_out, entries);
        for p in &c.phases {
            assert!(p.wall_s >= 0.0);
            assert!(p.stops.iter().all(|s| s.count > 0));
        }
        assert!(
            !cost
                .stops
                .iter()
                .any(|s| s.reason == StopReason::ScreenedOut)
        );
        // Candidates left without a time because the limits stopped them at every size are
        // counted apart from those that cannot be costed, and neither goes on.
        let count = |r: StopReason| {
            cost.stops
                .iter()
                .filter(|s| s.reason == r)
                .map(|s| s.count)
                .sum::<usize>()
        };
        let hopeless = count(StopReason::PastEverywhere);
        assert!(hopeless > 0 && hopeless <= count(StopReason::PastBaseline));
        assert_eq!(
            cost.candidates_out,
            cost.candidates_in - hopeless - count(StopReason::NotCostable)
        );
    }
    assert!(report.wall_s >= report.collectives[0].phases[0].wall_s);
    // Its text has a heading per collective and a line per phase.
    let text = report.to_string();
    assert_eq!(text.lines().count(), 1 + 2 * 7, "{text}");
}
