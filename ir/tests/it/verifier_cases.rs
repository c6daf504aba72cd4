//! One small hand-made schedule per class of error: each must be rejected with the expected
//! kind at the expected place, and nothing else may panic.

use crate::common;

use common::{Builder, direct_allgather, ring_allreduce, ring_broadcast};
use hccl_ir::verify::{ErrorKind, MAX_ERRORS, verify};
use hccl_ir::{Collective, Dep, Loc, Op, Schedule, Step, StepRef, Stream};

/// Two ranks exchanging `sends` messages each way on one stream per rank: every send first,
/// then every receive.
fn burst(sends: u32) -> Schedule {
    let mut b = Builder::new(Collective::AllGather, 2, 2 * sends, false);
    for r in 0..2 {
        let peer = 1 - r;
        for i in 0..sends {
            b.op(
                r,
                0,
                Op::Copy {
                    src: Loc::input(i),
                    dst: Loc::output(r * sends + i),
                },
                1,
            );
        }
        for i in 0..sends {
            b.op(
                r,
                0,
                Op::Send {
                    to: peer,
                    src: Loc::input(i),
                },
                1,
            );
        }
        for i in 0..sends {
            b.op(
                r,
                0,
                Op::Recv {
                    from: peer,
                    dst: Loc::output(peer * sends + i),
                },
                1,
            );
        }
    }
    b.finish()
}

fn at(rank: u32, stream: u32, step: u32) -> Option<StepRef> {
    Some(StepRef { rank, stream, step })
}

type Case = (&'static str, Schedule, ErrorKind, Option<StepRef>);

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let ring = || ring_allreduce(4, 1, 1, false);

    let mut s = ring();
    s.nranks = 5;
    cases.push(("nranks disagrees with programs", s, ErrorKind::Header, None));
    let mut s = ring_broadcast(4, 0, 1, 1, 2, false);
    s.collective = Collective::Broadcast { root: 4 };
    cases.push(("root out of range", s, ErrorKind::Header, None));
    let mut s = ring();
    s.output_chunks = 3;
    cases.push((
        "extent disagrees with the collective",
        s,
        ErrorKind::Header,
        None,
    ));
    let mut s = direct_allgather(3, 1, 1, false);
    s.chunks = 4;
    cases.push((
        "allgather chunks not a multiple of nranks",
        s,
        ErrorKind::Header,
        None,
    ));

    let mut s = ring();
    s.ranks[1].streams[0].steps[2].count = 0;
    cases.push(("count 0", s, ErrorKind::Bounds, at(1, 0, 2)));
    let mut s = ring();
    s.ranks[2].streams[0].steps[0].op = Op::Send {
        to: 3,
        src: Loc::input(u32::MAX),
    };
    cases.push(("offset overflows u32", s, ErrorKind::Bounds, at(2, 0, 0)));
    let mut s = ring();
    s.ranks[0].streams[0].steps[0].op = Op::Send {
        to: 1,
        src: Loc::scratch(0),
    };
    cases.push(("scratch not allocated", s, ErrorKind::Bounds, at(0, 0, 0)));

    let mut s = ring();
    s.ranks[3].streams[0].steps[0].op = Op::Send {
        to: 3,
        src: Loc::input(3),
    };
    cases.push(("send to self", s, ErrorKind::Peer, at(3, 0, 0)));
    let mut s = ring();
    s.ranks[3].streams[0].steps[1].op = Op::Recv {
        from: 9,
        dst: Loc::output(0),
    };
    cases.push(("peer out of range", s, ErrorKind::Peer, at(3, 0, 1)));

    let mut s = ring();
    s.ranks[1].streams[0].steps[1]
        .deps
        .push(Dep { stream: 1, step: 0 });
    cases.push((
        "dependency on a missing stream",
        s,
        ErrorKind::Dependency,
        at(1, 0, 1),
    ));
    let mut s = ring();
    s.ranks[1].streams[0].steps[3]
        .deps
        .push(Dep { stream: 0, step: 1 });
    cases.push((
        "dependency on its own stream",
        s,
        ErrorKind::Dependency,
        at(1, 0, 3),
    ));

    // A second stream on rank 0 that also sends to rank 1 on channel 0.
    let mut s = ring();
    s.ranks[0].streams.push(Stream {
        channel: 0,
        steps: vec![Step::new(
            Op::Send {
                to: 1,
                src: Loc::input(0),
            },
            1,
        )],
    });
    cases.push((
        "two streams share a connection",
        s,
        ErrorKind::Connection,
        at(0, 1, 0),
    ));

    let mut s = ring();
    s.ranks[2].streams[0].steps[0].count = 2;
    cases.push(("count mismatch", s, ErrorKind::Matching, at(3, 0, 1)));

    cases.push(("two slots suffice", burst(2), ErrorKind::Header, None));
    cases.push((
        "three sends before a receive deadlock",
        burst(3),
        ErrorKind::Deadlock,
        at(0, 0, 5),
    ));

    let mut s = ring();
    s.ranks[1].scratch_chunks = 1;
    s.ranks[1].streams[0].steps[0].op = Op::Send {
        to: 2,
        src: Loc::scratch(0),
    };
    cases.push((
        "sending uninitialised scratch",
        s,
        ErrorKind::Uninitialized,
        at(1, 0, 0),
    ));

    let mut s = direct_allgather(3, 1, 1, false);
    s.ranks[0].streams[0].steps[3].op = Op::RecvReduceCopy {
        from: 1,
        src: Loc::output(1),
        dst: Loc::output(1),
    };
    cases.push((
        "reduction in allgather",
        s,
        ErrorKind::BadReduction,
        at(0, 0, 3),
    ));

    let mut s = ring();
    let Op::RecvReduceCopySend { src, .. } = &mut s.ranks[2].streams[0].steps[1].op else {
        unreachable!("ring step 1 reduces")
    };
    src.off = (src.off + 1) % 4;
    cases.push((
        "reducing different chunks",
        s,
        ErrorKind::BadReduction,
        at(2, 0, 1),
    ));

    let mut b = Builder::new(Collective::AllReduce, 1, 4, false);
    b.op(
        0,
        0,
        Op::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
        },
        4,
    );
    b.op(
        0,
        0,
        Op::Copy {
            src: Loc::output(0),
            dst: Loc::output(1),
        },
        2,
    );
    cases.push((
        "partly overlapping copy",
        b.finish(),
        ErrorKind::Overlap,
        at(0, 0, 1),
    ));

    // Two streams on one rank, the second overwrites what the first copies, unordered.
    let mut b = Builder::new(Collective::AllReduce, 1, 2, false);
    b.op(
        0,
        0,
        Op::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
        },
        2,
    );
    b.op(
        0,
        1,
        Op::Copy {
            src: Loc::input(1),
            dst: Loc::output(1),
        },
        1,
    );
    cases.push((
        "unordered streams race",
        b.finish(),
        ErrorKind::Race,
        at(0, 1, 0),
    ));

    // Broadcast where the last rank never receives the second piece.
    let mut s = ring_broadcast(3, 0, 1, 1, 2, false);
    s.ranks[2].streams[0].steps.pop();
    s.ranks[1].streams[0].steps[1].op = Op::Recv {
        from: 0,
        dst: Loc::output(1),
    };
    cases.push((
        "broadcast output missing",
        s,
        ErrorKind::Postcondition,
        None,
    ));

    let mut s = ring();
    s.chunks = 1 << 30;
    s.input_chunks = 1 << 30;
    s.output_chunks = 1 << 30;
    cases.push(("too large to model", s, ErrorKind::Limit, None));

    let mut s = ring();
    // 12000² clock entries are over MAX_CLOCKS (2^27).
    s.ranks[0].streams.extend((0..12000).map(|_| Stream {
        channel: 0,
        steps: Vec::new(),
    }));
    cases.push((
        "too many streams for the race check",
        s,
        ErrorKind::Limit,
        None,
    ));

    let mut s = ring_allreduce(16, 1, 1, false);
    for p in &mut s.ranks {
        for st in &mut p.streams {
            for step in &mut st.steps {
                step.count = 0;
            }
        }
    }
    cases.push(("errors are capped", s, ErrorKind::Truncated, None));
    cases
}

#[test]
fn each_fault_is_reported_where_it_is() {
    for (name, schedule, kind, place) in cases() {
        let result = verify(&schedule);
        if name == "two slots suffice" {
            assert_eq!(result, Ok(()), "{name}");
            continue;
        }
        let errors = result.expect_err(name);
        assert!(
            errors.iter().any(|e| e.kind == kind && e.at == place),
            "{name}: expected {kind} at {place:?}, got {errors:#?}"
        );
        assert!(errors.len() <= MAX_ERRORS + 1, "{name}");
        for e in &errors {
            if let Some(at) = e.at {
                let stream = &schedule.ranks[at.rank as usize].streams[at.stream as usize];
                assert_eq!(e.channel, Some(stream.channel), "{name}: {e}");
                assert!(
                    e.to_string()
                        .starts_with(&format!("rank {} stream {} ", at.rank, at.stream))
                );
            }
        }
    }
}

#[test]
fn valid_single_rank_and_empty_schedules() {
    // In place on one rank nothing needs to happen; out of place a copy does it.
    for collective in [
        Collective::AllReduce,
        Collective::AllToAll,
        Collective::Reduce { root: 0 },
    ] {
        assert_eq!(
            verify(&Schedule::empty(collective, 1, 3, true).unwrap()),
            Ok(())
        );
        assert!(verify(&Schedule::empty(collective, 1, 3, false).unwrap()).is_err());
        assert_eq!(verify(&common::single_rank(collective, 3, false)), Ok(()));
    }
    // Two ranks with no steps cannot implement anything.
    let errors = verify(&Schedule::empty(Collective::AllGather, 2, 2, true).unwrap()).unwrap_err();
    assert!(errors.iter().all(|e| e.kind == ErrorKind::Postcondition));
    assert_eq!(errors.len(), 2);
}

#[test]
fn rank_sets_beyond_one_word() {
    // 130 ranks: rank sets span three 64-bit words.
    let s = ring_allreduce(130, 1, 2, true);
    let report = hccl_ir::verify::verify_report(&s).expect("the big ring verifies");
    assert_eq!(report.ranks, 130);
    assert_eq!(common::oracle(&s, 5), Ok(()));
    let mut bad = s.clone();
    // Rank 100 reduces its own contribution in a second time on channel 1.
    let st = &mut bad.ranks[100].streams[1].steps;
    let first = st[1].clone();
    st.insert(
        2,
        Step::new(
            Op::Reduce {
                src: Loc::input(0),
                dst: Loc::input(0),
            },
            1,
        ),
    );
    assert!(matches!(first.op, Op::RecvReduceCopySend { .. }));
    let errors = verify(&bad).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.kind == ErrorKind::BadReduction && e.at == at(100, 1, 2)),
        "{errors:#?}"
    );
}
