//! A hand-written ring AllReduce for 8 ranks (two streams per rank, MSCCL style: one sends,
//! one receives, ordered by dependencies) and the classic mutations, each of which must be
//! rejected with errors that name steps.

use hccl_ir::verify::{ErrorKind, VerifyError, verify, verify_report};
use hccl_ir::{
    Collective, Dep, Loc, Op, PlanEntry, PlanFile, PlanMeta, Protocol, RankProgram, Schedule, Step,
    StepRef, Stream,
};

const N: u32 = 8;

fn dep(stream: u32, step: u32) -> Dep {
    Dep { stream, step }
}

/// Ring AllReduce, out of place, one chunk per rank.
///
/// Stream 0 (sends to `r+1`): copy input to output, 7 reduce-scatter sends, 7 allgather sends.
/// Stream 1 (receives from `r-1`): 7 receive-reduce steps, 7 receives.
fn ring_allreduce_8() -> Schedule {
    let seg = |x: i64| Loc::output(x.rem_euclid(i64::from(N)) as u32);
    let ranks = (0..N)
        .map(|r| {
            let ri = i64::from(r);
            let next = (r + 1) % N;
            let prev = (r + N - 1) % N;
            let mut sends = vec![Step::new(
                Op::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(0),
                },
                N,
            )];
            let mut recvs = Vec::new();
            for s in 0..7 {
                let si = i64::from(s);
                let mut send = Step::new(
                    Op::Send {
                        to: next,
                        src: seg(ri - si),
                    },
                    1,
                );
                if s > 0 {
                    send.deps.push(dep(1, s - 1));
                }
                sends.push(send);
                let d = seg(ri - si - 1);
                let mut rrc = Step::new(
                    Op::RecvReduceCopy {
                        from: prev,
                        src: d,
                        dst: d,
                    },
                    1,
                );
                if s == 0 {
                    rrc.deps.push(dep(0, 0));
                }
                recvs.push(rrc);
            }
            for s in 0..7 {
                let si = i64::from(s);
                sends.push(
                    Step::new(
                        Op::Send {
                            to: next,
                            src: seg(ri + 1 - si),
                        },
                        1,
                    )
                    .with_deps([dep(1, 6 + s)]),
                );
                recvs.push(
                    Step::new(
                        Op::Recv {
                            from: prev,
                            dst: seg(ri - si),
                        },
                        1,
                    )
                    .with_deps([dep(0, 1 + s)]),
                );
            }
            RankProgram {
                scratch_chunks: 0,
                streams: vec![
                    Stream {
                        channel: 0,
                        steps: sends,
                    },
                    Stream {
                        channel: 0,
                        steps: recvs,
                    },
                ],
            }
        })
        .collect();
    Schedule {
        collective: Collective::AllReduce,
        nranks: N,
        chunks: N,
        input_chunks: N,
        output_chunks: N,
        in_place: false,
        ranks,
    }
}

fn ring_plan() -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: "ring8".to_string(),
        topology_hash: String::new(),
        compiler: "hand-written".to_string(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "ring".to_string(),
        protocol: Protocol::Simple,
        cost: None,
        symmetry: None,
        synthesis: None,
        schedule: ring_allreduce_8(),
        template: None,
    });
    plan
}

fn data_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/ring_allreduce_8.plan.ron")
}

#[test]
fn ring_verifies_with_expected_statistics() {
    let report = verify_report(&ring_allreduce_8()).expect("the ring verifies");
    assert_eq!(report.steps, 8 * 29);
    assert_eq!(report.messages, 8 * 14);
    assert_eq!(report.reductions, 8 * 7);
    assert_eq!(report.connections, 8);
    // The copy, then 14 hops around the ring of one send and one receive each.
    assert_eq!(report.depth, 1 + 2 * 14);
}

#[test]
fn stored_plan_file_matches_the_builder() {
    if std::env::var_os("HCCL_REGEN_DATA").is_some() {
        ring_plan().save(&data_path()).expect("write the data file");
    }
    let text = std::fs::read_to_string(data_path()).expect("tests/data/ring_allreduce_8.plan.ron");
    let plan = PlanFile::from_ron(&text, "ring_allreduce_8.plan.ron").expect("parses");
    assert_eq!(
        plan,
        ring_plan(),
        "regenerate the file from ring_plan().to_ron()"
    );
    assert!(hccl_ir::verify::verify_plan(&plan).is_ok());
}

fn render(errors: &[VerifyError]) -> String {
    errors
        .iter()
        .map(|e| format!("[{}] {e}", e.kind))
        .collect::<Vec<_>>()
        .join("\n")
}

fn step_mut(s: &mut Schedule, rank: u32, stream: u32, step: u32) -> &mut Step {
    &mut s.ranks[rank as usize].streams[stream as usize].steps[step as usize]
}

fn at(rank: u32, stream: u32, step: u32) -> Option<StepRef> {
    Some(StepRef { rank, stream, step })
}

/// Runs a mutation; asserts rejection with an error of `kind` located at `where_`.
fn rejects(
    name: &str,
    mutate: impl FnOnce(&mut Schedule),
    kind: ErrorKind,
    where_: Option<StepRef>,
) {
    let mut s = ring_allreduce_8();
    mutate(&mut s);
    let errors = verify(&s).expect_err(name);
    assert!(
        errors
            .iter()
            .any(|e| e.kind == kind && e.at == where_ && e.channel == Some(0)),
        "{name}: expected a {kind} error at {where_:?}, got:\n{}",
        render(&errors)
    );
    insta::assert_snapshot!(name, render(&errors));
}

#[test]
fn dropped_step_is_rejected() {
    // Rank 3 forgets its third reduce-scatter receive: rank 2's last send is never received.
    rejects(
        "drop_step",
        |s| {
            s.ranks[3].streams[1].steps.remove(2);
        },
        ErrorKind::Matching,
        at(2, 0, 14),
    );
}

#[test]
fn changed_peer_is_rejected() {
    rejects(
        "change_peer",
        |s| {
            step_mut(s, 3, 0, 3).op = Op::Send {
                to: 5,
                src: Loc::output(1),
            }
        },
        ErrorKind::Matching,
        at(3, 0, 3),
    );
}

#[test]
fn shifted_offset_is_rejected() {
    // Rank 4 reduces what it receives into the wrong chunk.
    rejects(
        "shift_offset",
        |s| {
            let Op::RecvReduceCopy { src, dst, .. } = &mut step_mut(s, 4, 1, 2).op else {
                unreachable!("step 2 of stream 1 is a receive-reduce")
            };
            src.off += 1;
            dst.off += 1;
        },
        ErrorKind::BadReduction,
        at(4, 1, 2),
    );
}

#[test]
fn duplicated_reduce_is_rejected() {
    // Rank 0 reduces its own input into the output a second time: rank 0 counted twice.
    rejects(
        "duplicate_reduce",
        |s| {
            s.ranks[0].streams[0].steps.insert(
                1,
                Step::new(
                    Op::Reduce {
                        src: Loc::input(0),
                        dst: Loc::output(0),
                    },
                    N,
                ),
            );
            // Keep the dependency indices of stream 1 pointing at the same steps.
            for step in &mut s.ranks[0].streams[1].steps {
                for d in &mut step.deps {
                    d.step += 1;
                }
            }
        },
        ErrorKind::BadReduction,
        at(0, 0, 1),
    );
}

#[test]
fn duplicated_receive_reduce_is_rejected() {
    rejects(
        "duplicate_recv_reduce",
        |s| {
            let step = step_mut(s, 5, 1, 3).clone();
            s.ranks[5].streams[1].steps.insert(3, step);
        },
        ErrorKind::Matching,
        at(5, 1, 14),
    );
}

#[test]
fn cut_dependency_is_rejected() {
    // Rank 6's allgather receive no longer waits for the send that reads the same chunk.
    rejects(
        "cut_dep",
        |s| step_mut(s, 6, 1, 9).deps.clear(),
        ErrorKind::Race,
        at(6, 1, 9),
    );
}

#[test]
fn swapped_sends_are_rejected() {
    // Rank 1 sends its allgather chunks in the wrong order: rank 2 stores them in the wrong
    // places, and the postcondition fails at the receive that wrote them.
    rejects(
        "swap_sends",
        |s| s.ranks[1].streams[0].steps.swap(10, 11),
        ErrorKind::Postcondition,
        at(2, 1, 10),
    );
}

#[test]
fn swapped_reduce_scatter_sends_deadlock() {
    // The second send waits for a receive that waits for the neighbour's first send, which
    // now waits the same way: a cycle around the ring.
    rejects(
        "swap_rs_sends_deadlock",
        |s| {
            for r in 0..N {
                s.ranks[r as usize].streams[0].steps.swap(1, 2);
            }
        },
        ErrorKind::Deadlock,
        at(0, 0, 1),
    );
}

#[test]
fn dependency_cycle_is_reported_as_such() {
    rejects(
        "dep_cycle",
        |s| step_mut(s, 2, 0, 0).deps.push(dep(1, 0)),
        ErrorKind::Dependency,
        at(2, 0, 0),
    );
}
