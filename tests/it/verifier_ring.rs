//! The stored hand-written ring AllReduce plan loads through the facade and verifies; a
//! corrupted copy of it is rejected with located errors.

use hccl::ir::verify::{ErrorKind, verify_plan, verify_report};
use hccl::ir::{Collective, PlanFile};
use std::path::Path;

fn load() -> PlanFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ring_allreduce_8.plan.ron");
    PlanFile::load(&path).expect("the stored ring plan parses")
}

#[test]
fn stored_ring_plan_verifies() {
    let plan = load();
    assert_eq!(plan.entries.len(), 1);
    let schedule = &plan.entries[0].schedule;
    assert_eq!(schedule.collective, Collective::AllReduce);
    assert_eq!(schedule.nranks, 8);
    assert!(verify_plan(&plan).is_ok());
    let report = verify_report(schedule).expect("verifies");
    assert_eq!(report.messages, 8 * 14);
}

#[test]
fn corrupted_ring_plan_is_rejected_with_located_errors() {
    let mut plan = load();
    // Rank 5 reduces the chunk it should only store in the allgather phase.
    let step = &mut plan.entries[0].schedule.ranks[5].streams[1].steps[9];
    let hccl::ir::Op::Recv { from, dst } = step.op else {
        panic!(
            "rank 5 stream 1 step 9 is an allgather receive, found {:?}",
            step.op
        )
    };
    step.op = hccl::ir::Op::RecvReduceCopy {
        from,
        src: dst,
        dst,
    };
    let failures = verify_plan(&plan).expect_err("a double reduction must be caught");
    assert_eq!(failures.len(), 1);
    let (entry, errors) = &failures[0];
    assert_eq!(*entry, 0);
    let first = &errors[0];
    assert_eq!(first.kind, ErrorKind::BadReduction);
    assert_eq!(
        first.to_string().split(':').next(),
        Some("rank 5 stream 1 (channel 0) step 9")
    );
}
