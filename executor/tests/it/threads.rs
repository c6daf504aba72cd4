//! The threads backend against a sequential reference: every collective × dtype × op ×
//! placement over a range of element counts and rank counts, plus segmenting, non-blocking
//! calls, plan checks and failure reporting.

use crate::common;

use common::{Case, collectives, config, count_for, run_cases};
use hccl_executor::{
    CallCheck, Communicator, Config, DataType, ExecError, OwnedBuffers, ReduceOp, ThreadGroup,
    fallback,
};
use hccl_ir::{Collective, PlanFile};
use std::time::Duration;

const COUNTS: [usize; 6] = [0, 1, 2, 7, 13, 1000];

fn cases_for(n: u32, counts: &[usize], dtypes: &[DataType]) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut seed = 1u64;
    for coll in collectives(n) {
        let ops: &[ReduceOp] = if coll.kind().reduces() {
            &ReduceOp::ALL
        } else {
            &[ReduceOp::Sum]
        };
        for &dtype in dtypes {
            for &op in ops {
                for in_place in [false, true] {
                    for &base in counts {
                        seed += 1;
                        cases.push(Case {
                            collective: coll,
                            dtype,
                            op,
                            in_place,
                            count: count_for(coll, n, base),
                            seed,
                        });
                    }
                }
            }
        }
    }
    cases
}

fn full_matrix(n: u32) {
    let mut cases = cases_for(n, &COUNTS, &DataType::ALL);
    if n <= 4 {
        cases.extend(cases_for(n, &[65537], &[DataType::F32, DataType::I32]));
    } else {
        for in_place in [false, true] {
            cases.push(Case {
                collective: Collective::AllReduce,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                in_place,
                count: 65537,
                seed: 7,
            });
        }
    }
    let errors = run_cases(fallback::plan(n), n, config(), &cases);
    assert!(
        errors.is_empty(),
        "{} failures: {:#?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
}

#[test]
fn matrix_1_rank() {
    full_matrix(1);
}

#[test]
fn matrix_2_ranks() {
    full_matrix(2);
}

#[test]
fn matrix_3_ranks() {
    full_matrix(3);
}

#[test]
fn matrix_4_ranks() {
    full_matrix(4);
}

#[test]
fn matrix_8_ranks() {
    full_matrix(8);
}

/// Other schedule shapes: more channels and pipelined parts, chunk counts that do not divide
/// the element counts, and tiny slots that force many segments.
#[test]
fn shapes_and_segments() {
    let shapes = [
        (3u32, 1u32, 1usize << 20),
        (1, 3, 1 << 20),
        (2, 2, 256),
        (3, 2, 64 * 5),
    ];
    for n in [2u32, 3, 4] {
        for (channels, parts, slot) in shapes {
            let cases = cases_for(n, &[1, 5, 13, 100, 1001], &[DataType::F32, DataType::U8]);
            let cfg = config().with_slot_bytes(slot);
            let errors = run_cases(fallback::plan_with(n, channels, parts), n, cfg, &cases);
            assert!(
                errors.is_empty(),
                "n={n} channels={channels} parts={parts} slot={slot}: {:#?}",
                &errors[..errors.len().min(5)]
            );
        }
    }
}

/// Entries of protocol LL (small calls, in LL slots) and Simple (larger calls, in regular
/// slots) of the same schedules share every connection; calls alternate between them, and
/// LL calls larger than an LL slot run in segments. Every result matches the reference.
#[test]
fn ll_and_simple_entries_share_connections() {
    use hccl_executor::arena::LL_BYTES;
    use hccl_ir::Protocol;
    for n in [2u32, 3, 4] {
        for (channels, parts) in [(1u32, 1u32), (2, 2)] {
            let mut plan = fallback::plan_with(n, channels, parts);
            let split = 3 * LL_BYTES as u64;
            let mut entries = Vec::new();
            for e in plan.entries.drain(..) {
                let mut ll = e.clone();
                ll.protocol = Protocol::LL;
                ll.max_bytes = Some(split);
                let mut simple = e;
                simple.protocol = Protocol::Simple;
                simple.min_bytes = split;
                entries.extend([ll, simple]);
            }
            plan.entries = entries;
            // Element counts that switch protocol on every call for 4-byte elements (LL up
            // to 6144) and that make 1-byte LL calls of several segments.
            let counts = [1, 9000, 5, 3000 + 7, 13];
            let cases = cases_for(n, &counts, &[DataType::F32, DataType::U8]);
            let errors = run_cases(plan, n, config(), &cases);
            assert!(
                errors.is_empty(),
                "n={n} channels={channels} parts={parts}: {} failures: {:#?}",
                errors.len(),
                &errors[..errors.len().min(5)]
            );
        }
    }
}

#[test]
fn large_counts() {
    for n in [2u32, 4] {
        let mut cases = Vec::new();
        for (coll, count) in [
            (Collective::AllReduce, 2_000_003usize),
            (Collective::AllGather, 1_048_576 * n as usize),
            (
                Collective::ReduceScatter,
                3_000_000 / n as usize * n as usize,
            ),
        ] {
            for in_place in [false, true] {
                cases.push(Case {
                    collective: coll,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                    in_place,
                    count,
                    seed: 42,
                });
            }
        }
        let errors = run_cases(fallback::plan(n), n, config(), &cases);
        assert!(errors.is_empty(), "n={n}: {errors:#?}");
    }
}

/// Plans whose entries only exist for the other placement still work (the executor adapts).
#[test]
fn placement_adaptation() {
    for n in [1u32, 2, 3] {
        for only_in_place in [false, true] {
            let mut plan = fallback::plan(n);
            plan.entries
                .retain(|e| e.schedule.in_place == only_in_place);
            let cases = cases_for(n, &[1, 6, 100], &[DataType::I64]);
            let errors = run_cases(plan, n, config(), &cases);
            assert!(
                errors.is_empty(),
                "n={n} in_place={only_in_place}: {errors:#?}"
            );
        }
    }
}

#[test]
fn non_blocking_calls() {
    let n = 3;
    let comms = ThreadGroup::with_config(fallback::plan(n), n, config()).unwrap();
    std::thread::scope(|s| {
        for mut comm in comms {
            s.spawn(move || {
                let r = comm.rank();
                for round in 0..3 {
                    let input: Vec<i32> = (0..1000).map(|i| i + r as i32 * round).collect();
                    let output = vec![0i32; 1000];
                    let req = comm
                        .start(
                            Collective::AllReduce,
                            ReduceOp::Sum,
                            OwnedBuffers::OutOfPlace { input, output },
                        )
                        .unwrap();
                    let OwnedBuffers::OutOfPlace { output, .. } = req.wait().unwrap() else {
                        panic!("placement changed");
                    };
                    let want: Vec<i32> = (0..1000).map(|i| 3 * i + 3 * round).collect();
                    assert_eq!(output, want);
                }
                // Blocking calls still work after non-blocking ones.
                let mut buf = vec![1u8; 10];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                assert_eq!(buf, vec![3u8; 10]);
            });
        }
    });
}

#[test]
fn plan_checks() {
    // World size mismatch.
    let err = ThreadGroup::with_config(fallback::plan(2), 3, config()).unwrap_err();
    assert!(
        matches!(
            err,
            ExecError::WorldSize {
                plan: 2,
                world: 3,
                ..
            }
        ),
        "{err}"
    );
    // Different plans on different ranks: every rank gets an error.
    let mut other = fallback::plan(3);
    other.meta.topology = "elsewhere".into();
    let plans: Vec<PlanFile> = vec![fallback::plan(3), fallback::plan(3), other];
    let results = ThreadGroup::with_plans(plans, config());
    assert_eq!(results.len(), 3);
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(ExecError::PlanMismatch { me, .. }) => assert_eq!(me, r as u32),
            other => panic!("rank {r}: expected a plan mismatch, got {other:?}"),
        }
    }
    // A structurally broken entry is refused before any data moves.
    let mut bad = fallback::plan(2);
    if let hccl_ir::Op::Send { src, .. } =
        &mut bad.entries[0].schedule.ranks[0].streams[0].steps[0].op
    {
        src.off = 1000;
    }
    let err = ThreadGroup::with_config(bad, 2, config()).unwrap_err();
    assert!(
        matches!(err, ExecError::BadStep { .. } | ExecError::Verify { .. }),
        "{err}"
    );
}

#[test]
fn bad_buffers_and_roots_are_errors() {
    let mut comms = ThreadGroup::with_config(fallback::plan(1), 1, config()).unwrap();
    let c = &mut comms[0];
    let err = c
        .all_reduce(&[1.0f32; 3], &mut [0.0f32; 4], ReduceOp::Sum)
        .unwrap_err();
    assert!(matches!(err, ExecError::BadBuffers { .. }), "{err}");
    let err = c.broadcast_in_place(&mut [0u8; 4], 5).unwrap_err();
    assert!(matches!(err, ExecError::Invalid(_)), "{err}");
    // The communicator still works after argument errors.
    let mut buf = [2u8; 4];
    c.all_reduce_in_place(&mut buf, ReduceOp::Prod).unwrap();
    assert_eq!(buf, [2u8; 4]);
}

fn short() -> Config {
    Config::default().with_timeout(Duration::from_millis(300))
}

/// A rank that never calls: the others report it after the timeout (or because a peer did).
#[test]
fn absent_rank_is_reported() {
    let n = 3;
    let comms = ThreadGroup::with_config(fallback::plan(n), n, short()).unwrap();
    let mut absent: Option<Communicator> = None;
    let results: Vec<(u32, ExecError)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for comm in comms {
            if comm.rank() == 2 {
                absent = Some(comm);
                continue;
            }
            handles.push(s.spawn(move || {
                let mut comm = comm;
                let mut buf = vec![1.0f32; 100_000];
                let err = comm
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap_err();
                // Poisoned afterwards.
                let again = comm
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap_err();
                assert!(matches!(again, ExecError::Poisoned { .. }), "{again}");
                (comm.rank(), err)
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, err) in results {
        // A rank that timed out waiting for a live rank that itself waited for rank 2 names
        // rank 2 at the end of that chain; the others learn it through the abort word.
        let named = match &err {
            ExecError::Timeout {
                peer, blocked_by, ..
            } => blocked_by.unwrap_or(*peer),
            ExecError::PeerFailed { failed, .. } => *failed,
            other => panic!("rank {rank}: unexpected {other}"),
        };
        assert_eq!(named, 2, "rank {rank}: {err}");
    }
    drop(absent);
}

/// A rank whose communicator is dropped (its thread ended) is reported as failed.
#[test]
fn departed_rank_is_reported() {
    let n = 2;
    let mut comms = ThreadGroup::with_config(fallback::plan(n), n, Config::default()).unwrap();
    drop(comms.pop());
    let mut c0 = comms.pop().unwrap();
    let mut buf = vec![1i32; 64];
    let err = c0.all_gather_in_place(&mut buf).unwrap_err();
    assert!(
        matches!(err, ExecError::PeerFailed { failed: 1, .. }),
        "{err}"
    );
}

/// Large single-chunk messages travel by pointer in this backend; ranks that arrive late
/// make senders finish while their messages are unread, so the data must be materialized
/// or waited for before the caller gets its buffers back (buffers are freed right after
/// each call here, so a premature return would corrupt a peer's result).
#[test]
fn single_copy_with_late_ranks() {
    let n = 3;
    let plan = fallback::plan_with(n, 1, 1);
    let comms = ThreadGroup::with_config(plan, n, config()).unwrap();
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for mut comm in comms {
            let errors = &errors;
            s.spawn(move || {
                let mut seed = 0;
                for round in 0..4u32 {
                    for coll in common::collectives(n) {
                        for in_place in [false, true] {
                            seed += 1;
                            if (round + seed as u32) % n == comm.rank() {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            let case = Case {
                                collective: coll,
                                dtype: DataType::F64,
                                op: ReduceOp::Sum,
                                in_place,
                                count: count_for(coll, n, 40_000),
                                seed,
                            };
                            if let Err(e) = common::check(&mut comm, &case) {
                                errors.lock().unwrap().push(e);
                                comm.abort();
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// `HCCL_ALGO` restricts the entries used; sizes outside the remaining entries' ranges use
/// the nearest one (and still compute the right result).
#[test]
fn algorithm_filter_and_nearest_entry() {
    for algo in ["ring", "allpairs"] {
        let cfg = Config {
            algo: Some(algo.to_string()),
            ..config()
        };
        let comms = ThreadGroup::with_config(fallback::plan(2), 2, cfg).unwrap();
        for bytes in [8u64, 1 << 20] {
            let info = comms[0]
                .entry_for(Collective::AllReduce, bytes, false)
                .unwrap();
            assert_eq!(info.algorithm, algo, "{bytes} bytes");
        }
        let cases: Vec<Case> = [2usize, 70_000]
            .into_iter()
            .map(|count| Case {
                collective: Collective::AllReduce,
                dtype: DataType::I32,
                op: ReduceOp::Sum,
                in_place: false,
                count,
                seed: 3,
            })
            .collect();
        drop(comms);
        let cfg = Config {
            algo: Some(algo.to_string()),
            ..config()
        };
        let errors = run_cases(fallback::plan(2), 2, cfg, &cases);
        assert!(errors.is_empty(), "{algo}: {errors:#?}");
    }
}

/// A whole-buffer local copy (the root's Input to Output of an out-of-place Broadcast, as
/// the packed-tree synthesizer lowers it) over more chunks than a slot holds elements: only
/// messages pass through slots, so the entry runs (it used to fail with "steps of 256 chunks
/// do not fit a 256-byte slot") and its one-chunk messages size the segments.
#[test]
fn local_copy_of_many_chunks_runs_in_small_slots() {
    use hccl_ir::{Loc, Op, PlanEntry, PlanMeta, Protocol, RankProgram, Schedule, Step, Stream};
    const C: u32 = 256;
    let root = 0;
    let coll = Collective::Broadcast { root };
    let mut schedule = Schedule::empty(coll, 2, C, false).expect("extents");
    let mut sends = vec![Step::new(
        Op::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
        },
        C,
    )];
    sends.extend((0..C).map(|k| {
        Step::new(
            Op::Send {
                to: 1,
                src: Loc::input(k),
            },
            1,
        )
    }));
    let recvs = (0..C)
        .map(|k| {
            Step::new(
                Op::Recv {
                    from: 0,
                    dst: Loc::output(k),
                },
                1,
            )
        })
        .collect();
    schedule.ranks = vec![
        RankProgram {
            scratch_chunks: 0,
            streams: vec![Stream {
                channel: 0,
                steps: sends,
            }],
        },
        RankProgram {
            scratch_chunks: 0,
            streams: vec![Stream {
                channel: 0,
                steps: recvs,
            }],
        },
    ];
    hccl_ir::verify::verify(&schedule).expect("the schedule verifies");
    let mut plan = PlanFile::new(PlanMeta {
        topology: "builtin-2".into(),
        topology_hash: String::new(),
        compiler: "test".into(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "copy_then_send".into(),
        protocol: Protocol::Simple,
        cost: None,
        schedule,
        symmetry: None,
        synthesis: None,
        template: None,
    });
    let mut cases = Vec::new();
    for (seed, count) in [1usize, 3, 255, 257, 5000].into_iter().enumerate() {
        for in_place in [false, true] {
            cases.push(Case {
                collective: coll,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                in_place,
                count,
                seed: seed as u64,
            });
        }
    }
    let errors = run_cases(plan, 2, config().with_slot_bytes(256), &cases);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// A schedule with a large scratch buffer (the flow AllToAll forwards through 190208
/// scratch chunks): segments are cut so that its scratch stays within the budget instead of
/// `scratch_chunks × slot_bytes / max_count` (here 1 TiB), and the data still arrives.
#[test]
fn large_scratch_is_bounded_by_smaller_segments() {
    use hccl_ir::{Loc, Op, PlanEntry, PlanMeta, Protocol, RankProgram, Schedule, Step, Stream};
    const C: u32 = 64;
    const SCRATCH: u32 = 1 << 22;
    let coll = Collective::Broadcast { root: 0 };
    let mut schedule = Schedule::empty(coll, 2, C, true).expect("extents");
    let sends = (0..C)
        .map(|k| {
            Step::new(
                Op::Send {
                    to: 1,
                    src: Loc::output(k),
                },
                1,
            )
        })
        .collect();
    let mut recvs = Vec::new();
    for k in 0..C {
        let far = SCRATCH - C + k;
        recvs.push(Step::new(
            Op::Recv {
                from: 0,
                dst: Loc::scratch(far),
            },
            1,
        ));
        recvs.push(Step::new(
            Op::Copy {
                src: Loc::scratch(far),
                dst: Loc::output(k),
            },
            1,
        ));
    }
    schedule.ranks = vec![
        RankProgram {
            scratch_chunks: 0,
            streams: vec![Stream {
                channel: 0,
                steps: sends,
            }],
        },
        RankProgram {
            scratch_chunks: SCRATCH,
            streams: vec![Stream {
                channel: 0,
                steps: recvs,
            }],
        },
    ];
    hccl_ir::verify::verify(&schedule).expect("the schedule verifies");
    let mut plan = PlanFile::new(PlanMeta {
        topology: "builtin-2".into(),
        topology_hash: String::new(),
        compiler: "test".into(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "through_scratch".into(),
        protocol: Protocol::Simple,
        cost: None,
        schedule,
        symmetry: None,
        synthesis: None,
        template: None,
    });
    let mut cases = Vec::new();
    for (seed, count) in [1usize, 63, 65, 5000].into_iter().enumerate() {
        for (dtype, in_place) in [(DataType::F32, true), (DataType::F64, false)] {
            cases.push(Case {
                collective: coll,
                dtype,
                op: ReduceOp::Sum,
                in_place,
                count,
                seed: seed as u64,
            });
        }
    }
    let errors = run_cases(plan, 2, config(), &cases);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Sealed entries (`hcclc compile` verified them) are not verified again when a group
/// starts, unless `HCCL_VERIFY=full`; unsealed ones always are. A seal is trusted: forged
/// over a wrong schedule it lets the schedule through, which `VerifyMode::Full` catches.
#[test]
fn sealed_entries_skip_verification_unless_full() {
    use hccl_executor::VerifyMode;
    // A schedule that is well formed but computes the wrong thing: one send reads another
    // of its input chunks.
    let mut wrong = fallback::plan(2);
    let mut broken = false;
    'entries: for e in &mut wrong.entries {
        let chunks = e.schedule.input_chunks;
        if chunks < 2 {
            continue;
        }
        for step in &mut e.schedule.ranks[0].streams[0].steps {
            if let hccl_ir::Op::Send { src, .. } = &mut step.op
                && src.buf == hccl_ir::Buf::Input
            {
                src.off = (src.off + 1) % chunks;
                broken = hccl_ir::verify::verify(&e.schedule).is_err();
                break 'entries;
            }
        }
    }
    assert!(broken, "no entry of the fallback plan could be broken");
    assert!(wrong.sealed().iter().all(|s| !s));
    let err = ThreadGroup::with_config(wrong.clone(), 2, config()).unwrap_err();
    assert!(matches!(err, ExecError::Verify { .. }), "{err}");

    // Forged seals: trusted by default, checked with HCCL_VERIFY=full.
    wrong.seal();
    assert!(wrong.sealed().iter().all(|s| *s));
    assert!(ThreadGroup::with_config(wrong.clone(), 2, config()).is_ok());
    let full = config().with_verify(VerifyMode::Full);
    let err = ThreadGroup::with_config(wrong, 2, full).unwrap_err();
    assert!(matches!(err, ExecError::Verify { .. }), "{err}");

    // A correct sealed plan runs either way.
    let mut good = fallback::plan(2);
    good.seal();
    for mode in [VerifyMode::Unsealed, VerifyMode::Full] {
        let mut comms = ThreadGroup::with_config(good.clone(), 2, config().with_verify(mode))
            .expect("a sealed, correct plan");
        std::thread::scope(|s| {
            for c in comms.iter_mut() {
                s.spawn(move || {
                    let mut buf = [3.0f32; 5];
                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                    assert_eq!(buf, [6.0f32; 5]);
                });
            }
        });
    }
}

/// `abort()` from another thread unblocks the ranks stuck in a call (their peer, rank 2,
/// never calls), long before the timeout; the communicators are poisoned afterwards.
#[test]
fn an_abort_handle_unblocks_ranks_stuck_in_a_call() {
    let cfg = Config::default().with_timeout(Duration::from_secs(60));
    let mut comms = ThreadGroup::with_config(fallback::plan(3), 3, cfg).unwrap();
    let _idle = comms.pop().expect("rank 2, which never calls");
    let handle = comms[0].abort_handle();
    let start = std::time::Instant::now();
    let stuck: Vec<_> = comms
        .into_iter()
        .map(|mut comm| {
            std::thread::spawn(move || {
                let mut buf = vec![1.0f32; 1000];
                let err = comm
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap_err();
                let again = comm
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap_err();
                (comm.rank(), err, again)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    handle.abort();
    handle.clone().abort(); // a second abort changes nothing
    for t in stuck {
        let (rank, err, again) = t.join().unwrap();
        assert!(err.to_string().contains("aborted"), "rank {rank}: {err}");
        assert!(
            matches!(again, ExecError::Poisoned { .. }),
            "rank {rank}: {again}"
        );
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Runs `call(rank, comm)` on every rank of an `n`-rank group whose calls are compared, with
/// a long timeout; returns each rank's result and how long the slowest took.
fn mismatched(
    n: u32,
    check: CallCheck,
    call: impl Fn(u32, &mut Communicator) -> hccl_executor::Result<()> + Sync,
) -> (Vec<hccl_executor::Result<()>>, Duration) {
    let cfg = config()
        .with_timeout(Duration::from_secs(60))
        .with_check_calls(check);
    let comms = ThreadGroup::with_config(fallback::plan(n), n, cfg).unwrap();
    let started = std::time::Instant::now();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let call = &call;
                s.spawn(move || call(comm.rank(), &mut comm))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (results, started.elapsed())
}

/// Ranks whose calls differ get an error naming both calls, within milliseconds (not at
/// the timeout), and no wrong result is returned as a success: a different count, a
/// different collective, a different element type of the same size, an empty call beside a
/// full one. Every message carries its sender's call, so the default catches all four at the
/// first message, and the abort it raises reads as the same mismatch on every rank; comparing
/// at the end of every call too (`HCCL_CHECK_CALLS=1`) changes nothing here.
#[test]
fn mismatched_calls_are_errors_naming_both_calls() {
    type Case = (&'static str, &'static [&'static str]);
    type Call = dyn Fn(u32, &mut Communicator) -> hccl_executor::Result<()> + Sync;
    let cases: [(Case, &Call); 4] = [
        (
            (
                "count",
                &[
                    "allreduce of 1000 float (sum)",
                    "allreduce of 2000 float (sum)",
                ],
            ),
            &|rank, c| {
                let mut buf = vec![1.0f32; 1000 * (rank as usize + 1)];
                c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
            },
        ),
        (
            (
                "collective",
                &["allreduce of 4096 float", "broadcast(root=0) of 4096 float"],
            ),
            &|rank, c| {
                let mut buf = vec![1.0f32; 4096];
                if rank == 1 {
                    c.broadcast_in_place(&mut buf, 0)
                } else {
                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                }
            },
        ),
        (("dtype", &["of 64 float", "of 64 int32"]), &|rank, c| {
            if rank == 2 {
                c.all_reduce_in_place(&mut [1i32; 64], ReduceOp::Sum)
            } else {
                c.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum)
            }
        }),
        (("empty", &["of 0 float", "of 512 float"]), &|rank, c| {
            let mut buf = vec![1.0f32; if rank == 0 { 0 } else { 512 }];
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        }),
    ];
    let runs = cases
        .iter()
        .map(|c| (c, CallCheck::EveryCall))
        .chain(cases.iter().map(|c| (c, CallCheck::default())));
    for (((name, parts), call), check) in runs {
        let (results, took) = mismatched(3, check, |rank, c| {
            // A matching call first: numbering starts equal and stays so.
            c.all_reduce_in_place(&mut [1u8; 8], ReduceOp::Sum)?;
            call(rank, c)
        });
        assert!(took < Duration::from_secs(10), "{name}: took {took:?}");
        // No rank returns a result (but the empty call, which has none), and every rank
        // that fails names two calls that differ.
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert!(
            ok == 0 || (*name == "empty" && ok == 1),
            "{name} {check:?}: a rank returned success: {results:?}"
        );
        for e in &errors {
            assert!(
                e.contains("call #2") && e.contains("but rank"),
                "{name} {check:?}: a rank did not name the calls: {errors:?}"
            );
        }
        let named = errors
            .iter()
            .find(|e| parts.iter().all(|p| e.contains(p)))
            .unwrap_or_else(|| panic!("{name} {check:?}: no rank named {parts:?}: {errors:?}"));
        assert!(named.contains("call #2"), "{named}");
    }
}

/// Ranks may place their buffers as they like while they run the same plan entry (the
/// executor adapts each rank's buffers to it): not a mismatch. A rank whose placement picks
/// the other placement's entry runs another schedule, which is.
#[test]
fn buffer_placement_is_a_rank_s_own_unless_it_picks_another_schedule() {
    let run = |plan: PlanFile| {
        let cfg = config()
            .with_timeout(Duration::from_secs(60))
            .with_check_calls(CallCheck::EveryCall);
        let comms = ThreadGroup::with_config(plan, 2, cfg).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let input = vec![1.0f32 + c.rank() as f32; 4096];
                        if c.rank() == 0 {
                            let mut buf = input;
                            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).map(|()| buf)
                        } else {
                            let mut out = vec![0.0f32; 4096];
                            c.all_reduce(&input, &mut out, ReduceOp::Sum).map(|()| out)
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    // In-place entries only: both ranks run the same schedule.
    let mut one = fallback::plan(2);
    one.entries.retain(|e| e.schedule.in_place);
    for out in run(one) {
        assert!(out.expect("same schedule").iter().all(|&x| x == 3.0));
    }
    // Both placements' entries: the ranks pick different schedules.
    let both = fallback::plan(2);
    assert!(both.entries.iter().any(|e| !e.schedule.in_place));
    let errors: Vec<String> = run(both)
        .into_iter()
        .map(|r| r.expect_err("different schedules").to_string())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("in-place schedule") && e.contains("out-of-place schedule")),
        "{errors:?}"
    );
}

/// A rank that sleeps before each call is the one the others waited for: in its peers'
/// `stats()` and, collectively, in the straggler report. It sleeps 100 ms a call: with 30 ms,
/// a CI run (three rank threads beside other tests on two cores) once held rank 0 off its
/// core for 70 ms and the report named it.
#[test]
fn a_late_rank_leads_the_straggler_report() {
    let comms = ThreadGroup::with_config(fallback::plan(3), 3, config()).expect("group");
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    for _ in 0..3 {
                        if comm.rank() == 1 {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        let mut buf = vec![1.0f32; 64];
                        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                    }
                    let stats = comm.stats().expect("stats");
                    let report = comm.straggler_report().expect("report");
                    (stats, report)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (stats, report)) in results.iter().enumerate() {
        assert_eq!((stats.rank, stats.calls), (r as u32, 3));
        assert!(stats.time_in_calls_s > 0.0);
        if r != 1 {
            let top = &stats.peers[0];
            // Three sleeps of 100 ms: most of them waited for rank 1.
            assert_eq!(top.peer, 1, "rank {r}: {stats}");
            assert!(top.total_s >= 0.1 && top.count >= 1, "rank {r}: {stats}");
            assert!(
                top.p50_s <= top.p99_s && top.p99_s <= top.max_s,
                "{stats:?}"
            );
        }
        assert_eq!(report, &results[0].1, "every rank gets the same report");
        let top = &report.culprits[0];
        assert_eq!((top.rank, top.waiters), (1, 2), "{report}");
        assert!(top.share > 0.5, "{report}");
        assert_eq!(report.dominant().map(|c| c.rank), Some(1), "{report}");
    }
}

/// Runs 300 AllReduces of 256 KiB (the ring) on 4 ranks, rank `late` sleeping 200 ms before
/// every 30th; returns the straggler report.
fn ring_report(late: Option<u32>) -> hccl_executor::StragglerReport {
    let comms = ThreadGroup::with_config(fallback::plan(4), 4, config()).expect("group");
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32; 64 << 10];
                    for i in 0..300 {
                        if Some(comm.rank()) == late && i % 30 == 0 {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        comm.all_reduce_in_place(&mut buf, ReduceOp::Max).unwrap();
                    }
                    comm.straggler_report().expect("report")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    reports[0].clone()
}

/// On the ring a late rank delays its successor, which delays the next: the report follows
/// the chains of waits to the late rank and names it first. (An undisturbed job of four
/// threads on two cores can still show one rank above the rest; the process backend's test
/// checks that a healthy job names nobody.) Four threads share two cores with the other
/// tests (and, in `scripts/test.sh`, with the Python package building beside them), which
/// can hold a healthy rank off its core for seconds in all: in one CI run, while PyTorch
/// installed beside the tests, the four ranks waited 10-25 s in all and one healthy rank
/// drew half of it, against the 300 ms that a late rank sleeping 30 ms ten times added, in
/// all five runs. So the late rank sleeps 200 ms ten times (2 s, about 6 s of its peers'
/// waiting), and one clean run of five is asked for.
#[test]
fn the_straggler_report_blames_the_late_rank_on_the_ring() {
    let mut reports = Vec::new();
    for _ in 0..5 {
        let report = ring_report(Some(2));
        if report.culprits[0].rank == 2 && report.dominant().is_none_or(|c| c.rank == 2) {
            return;
        }
        reports.push(report.to_string());
    }
    panic!(
        "five runs did not name rank 2 first:\n{}",
        reports.join("\n---\n")
    );
}

/// `HCCL_TRACE` through the configuration: every rank writes a trace file in the layout of
/// the predicted trace (`hcclc explain --trace`), bounded to the first calls, its slices in
/// step order on each stream, and the merge gives one process per rank.
#[test]
fn traced_calls_are_written_per_rank_in_the_predicted_layout() {
    use hccl_executor::trace::TraceConfig;
    use hccl_ir::trace::{CALLS_TID, TraceFile, merge_dir, rank_file, thread_name};
    let n = 4u32;
    let dir = std::env::temp_dir().join(format!("hccl-trace-threads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = config()
        .with_slot_bytes(16 << 10)
        .with_trace(Some(TraceConfig {
            dir: dir.clone(),
            calls: 2,
        }));
    let plan = fallback::plan(n);
    let count = 64 << 10; // 256 KiB of f32 in 16 KiB slots: several segments
    let bytes = (count * 4) as u64;
    let comms = ThreadGroup::with_config(plan.clone(), n, cfg).expect("group");
    let entry = comms[0]
        .entry_for(Collective::AllReduce, bytes, false)
        .expect("an entry");
    std::thread::scope(|s| {
        for mut comm in comms {
            s.spawn(move || {
                let input = vec![1.0f32; count];
                let mut output = vec![0.0f32; count];
                for _ in 0..3 {
                    comm.all_reduce(&input, &mut output, ReduceOp::Sum)
                        .expect("allreduce");
                }
                let path = comm.flush_trace().expect("flushed").expect("traced");
                assert!(path.ends_with(format!("rank-{}.json", comm.rank())));
            });
        }
    });
    let schedule = &plan.entries[entry.index].schedule;
    for r in 0..n {
        let doc = TraceFile::load(&rank_file(&dir, r)).expect("a rank file");
        let summary = doc.check().expect("trace-event format");
        assert_eq!(summary.processes, vec![r], "one process, its rank");
        assert!(doc.events.iter().all(|e| e.pid == r));
        let other = &doc.other;
        assert_eq!(other["source"], "measured");
        assert_eq!(
            other["calls_traced"], 2,
            "HCCL_TRACE_CALLS bounds the calls"
        );
        assert_eq!(other["calls_untraced"], 1);
        assert_eq!(other["steps_dropped"], 0);
        // Thread names are the predicted trace's for this plan's entry.
        let prog = &schedule.ranks[r as usize];
        for (i, st) in prog.streams.iter().enumerate() {
            let named = doc
                .events
                .iter()
                .find(|e| e.ph == "M" && e.name == "thread_name" && e.tid == Some(i as u32));
            assert_eq!(
                named.and_then(|e| e.args["name"].as_str()),
                Some(thread_name(i as u32, st.channel).as_str())
            );
        }
        let calls: Vec<_> = doc
            .events
            .iter()
            .filter(|e| e.ph == "X" && e.tid == Some(CALLS_TID))
            .collect();
        assert_eq!(calls.len(), 2);
        assert!(
            calls
                .iter()
                .all(|c| c.name == "allreduce" && c.args["bytes"] == bytes)
        );
        let segments = calls[0].args["segments"].as_u64().expect("segments");
        assert!(segments > 1, "{segments} segments");
        // Every step of every segment of both calls, named by its op, in step order on
        // its stream and never overlapping the previous slice of the stream.
        for (i, st) in prog.streams.iter().enumerate() {
            let slices: Vec<_> = doc
                .events
                .iter()
                .filter(|e| e.ph == "X" && e.tid == Some(i as u32))
                .collect();
            assert_eq!(slices.len() as u64, 2 * segments * st.steps.len() as u64);
            let mut prev_end = f64::NEG_INFINITY;
            let mut prev_key = None;
            for e in &slices {
                let key = (
                    e.args["call"].as_u64().unwrap(),
                    e.args["segment"].as_u64().unwrap(),
                    e.args["step"].as_u64().unwrap(),
                );
                assert!(prev_key.is_none_or(|p| p < key), "{e:?} out of order");
                prev_key = Some(key);
                let step = &st.steps[key.2 as usize];
                assert_eq!(e.name, step.op.name());
                assert_eq!(e.cat.as_deref(), Some("step"));
                assert_eq!(e.args["chunks"], step.count);
                let (ts, dur) = (e.ts.unwrap(), e.dur.unwrap());
                assert!(ts >= prev_end - 1e-3, "{e:?} overlaps the previous step");
                prev_end = ts + dur;
            }
        }
    }
    let merged = merge_dir(&dir).expect("merges");
    assert_eq!(merged.check().expect("valid").processes, vec![0, 1, 2, 3]);
    assert_eq!(merged.other["missing_ranks"], serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}
