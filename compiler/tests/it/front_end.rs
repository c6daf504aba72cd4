//! The library API front ends (hcclc, the Python package) build on: the builder's origins,
//! one schedule's rows, cancellation, imported candidates.

use hccl_compiler::builder::{BuildError, ScheduleBuilder};
use hccl_compiler::cost::CostModel;
use hccl_compiler::families::Candidate;
use hccl_compiler::search::{self, Options, SearchError};
use hccl_ir::verify::verify_report;
use hccl_ir::{Collective, CollectiveKind, Loc, PlanEntry, PlanFile, PlanMeta, Protocol, StepRef};
use hccl_topologies::shipped_by_name;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A ring AllGather over `n` ranks; returns it with, per rank, the recorded index of each
/// op in recording order.
fn ring(n: u32) -> ScheduleBuilder {
    let mut b = ScheduleBuilder::new(Collective::AllGather, n, n, false);
    for r in 0..n {
        b.copy((r, Loc::input(0)), (r, Loc::output(r)), 1, 0);
    }
    for hop in 0..n - 1 {
        for owner in 0..n {
            let from = (owner + hop) % n;
            let src = if hop == 0 {
                Loc::input(0)
            } else {
                Loc::output(owner)
            };
            b.copy((from, src), ((from + 1) % n, Loc::output(owner)), 1, 0);
        }
    }
    b
}

#[test]
fn origins_name_the_recorded_ops_of_every_step() {
    let n = 4;
    let b = ring(n);
    let recorded: Vec<usize> = (0..n).map(|r| b.ops_on(r)).collect();
    let plain = ring(n).build().unwrap();
    let (schedule, origins) = b.build_traced().unwrap();
    assert_eq!(schedule, plain, "tracing changes nothing");
    for (r, prog) in schedule.ranks.iter().enumerate() {
        let mut seen = Vec::new();
        for (si, st) in prog.streams.iter().enumerate() {
            for (k, step) in st.steps.iter().enumerate() {
                let at = StepRef {
                    rank: r as u32,
                    stream: si as u32,
                    step: k as u32,
                };
                let ops = origins.of(at);
                // A fused receive-and-forward came from two recorded ops, anything else one.
                let fused = matches!(step.op.mnemonic(), "rcs" | "rrcs" | "rrs");
                assert_eq!(ops.len(), if fused { 2 } else { 1 }, "{at}: {ops:?}");
                seen.extend(ops);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..recorded[r]).collect::<Vec<_>>(), "rank {r}");
    }
    assert!(
        origins
            .of(StepRef {
                rank: 9,
                stream: 0,
                step: 0
            })
            .is_empty()
    );
}

#[test]
fn a_bad_op_is_reported_as_it_is_recorded() {
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, true);
    b.copy((0, Loc::input(0)), (1, Loc::input(0)), 1, 0);
    assert!(b.error().is_none());
    b.send(1, 1, Loc::input(0), 1, 0);
    assert_eq!(b.error(), Some(&BuildError::SelfPeer { rank: 1, index: 1 }));
}

#[test]
fn one_schedules_rows_agree_with_its_plan_explained() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let schedule = ring(8).build().unwrap();
    verify_report(&schedule).unwrap();
    let options = Options {
        sizes: search::geometric_sizes(1 << 10, 1 << 20, 4),
        model: CostModel::for_topology(&topo),
        ..Options::default()
    };
    let rows =
        search::evaluate_schedule(&topo, "ring", &schedule, &[Protocol::LL128], &options).unwrap();
    let mut plan = PlanFile::new(PlanMeta {
        topology: topo.name.clone(),
        topology_hash: topo.hash.clone(),
        compiler: "test".into(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "ring".into(),
        protocol: Protocol::LL128,
        cost: None,
        schedule: schedule.clone(),
        symmetry: None,
        synthesis: None,
        template: None,
    });
    let explained = search::evaluate_plan(&topo, &plan, &options).unwrap();
    assert_eq!(rows, explained);
    // The fastest protocol per size is never slower than any one protocol.
    let best =
        search::evaluate_schedule(&topo, "ring", &schedule, &Protocol::ALL, &options).unwrap();
    for (b, one) in best.iter().zip(&rows) {
        assert!(b.predicted_us <= one.predicted_us);
        assert!(b.baseline_us.is_some() && b.bound_us > 0.0);
    }
    let ring4 = ring(4).build().unwrap();
    assert!(matches!(
        search::evaluate_schedule(&topo, "ring", &ring4, &Protocol::ALL, &options),
        Err(SearchError::BadOptions(_))
    ));
}

#[test]
fn a_cancelled_compile_stops_and_says_so() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let options = Options {
        cancel: Some(Arc::new(AtomicBool::new(true))),
        ..Options::default()
    };
    assert_eq!(
        search::compile(&topo, &options).unwrap_err(),
        SearchError::Cancelled
    );
}

#[test]
fn an_imported_candidate_competes_under_its_name() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let entry = PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "my_ring".into(),
        protocol: Protocol::Simple,
        cost: None,
        schedule: ring(8).build().unwrap(),
        symmetry: None,
        synthesis: None,
        template: None,
    };
    let options = Options {
        collectives: vec![CollectiveKind::AllGather],
        sizes: vec![1 << 10, 1 << 20],
        algorithms: Some(vec!["my_ring".into()]),
        extra: vec![Candidate::imported(entry)],
        model: CostModel::for_topology(&topo),
        ..Options::default()
    };
    let compiled = search::compile(&topo, &options).unwrap();
    assert!(compiled.rows.iter().all(|r| r.algorithm == "my_ring"));
}
