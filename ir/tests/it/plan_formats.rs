//! Plan files across formats: explicit programs written with strided runs (format 6), and
//! files of format 5 (written by an earlier hcclc) read, checked against their seals and held
//! as the current format.

use hccl_ir::{
    Buf, Collective, Dep, Loc, Op, PlanError, PlanFile, RankProgram, Schedule, Step, Stream,
    seal_of,
};
use proptest::prelude::*;
use std::path::Path;

/// A pipelined Broadcast down the chain 0 → 1 → 2 → 3 in `pieces` chunks: deep, regular
/// programs of the kind the compiler writes as explicit entries.
fn chain_broadcast(pieces: u32) -> Schedule {
    let mut s = Schedule::empty(Collective::Broadcast { root: 0 }, 4, pieces, false).expect("fits");
    for (r, prog) in s.ranks.iter_mut().enumerate() {
        let r = r as u32;
        let steps = (0..pieces)
            .map(|k| {
                let at = |buf| Loc { buf, off: k };
                let op = match r {
                    0 => Op::Send {
                        to: 1,
                        src: at(Buf::Input),
                    },
                    3 => Op::Recv {
                        from: 2,
                        dst: at(Buf::Output),
                    },
                    _ => Op::RecvCopySend {
                        from: r - 1,
                        to: r + 1,
                        dst: at(Buf::Output),
                    },
                };
                Step::new(op, 1)
            })
            .collect();
        *prog = RankProgram {
            scratch_chunks: 0,
            streams: vec![Stream { channel: 0, steps }],
        };
    }
    s
}

/// A Broadcast from rank 0 relayed down the chain 0 → 1 → 2 in `pieces` chunks, the
/// middle rank on two streams: one receives each piece into scratch, the other forwards it
/// once received (a dependency that advances with the piece), then copies it out. The
/// piece at `odd` (none when `odd == pieces`) goes to the end of the scratch buffer, which
/// breaks the runs there.
fn relay(pieces: u32, odd: u32) -> Schedule {
    let mut s = Schedule::empty(Collective::Broadcast { root: 0 }, 3, pieces, false).expect("fits");
    let at = |buf, off| Loc { buf, off };
    let slot = |k: u32| if k == odd { pieces + k } else { k };
    let stream = |channel, steps| Stream { channel, steps };
    s.ranks[0].streams = vec![stream(
        0,
        (0..pieces)
            .map(|k| {
                Step::new(
                    Op::Send {
                        to: 1,
                        src: at(Buf::Input, k),
                    },
                    1,
                )
            })
            .collect(),
    )];
    s.ranks[1].scratch_chunks = 2 * pieces;
    s.ranks[1].streams = vec![
        stream(
            0,
            (0..pieces)
                .map(|k| {
                    Step::new(
                        Op::Recv {
                            from: 0,
                            dst: at(Buf::Scratch, slot(k)),
                        },
                        1,
                    )
                })
                .collect(),
        ),
        stream(
            1,
            (0..pieces)
                .map(|k| {
                    let mut step = Step::new(
                        Op::Send {
                            to: 2,
                            src: at(Buf::Scratch, slot(k)),
                        },
                        1,
                    );
                    step.deps.push(Dep { stream: 0, step: k });
                    step
                })
                .chain((0..pieces).map(|k| {
                    let copy = Op::Copy {
                        src: at(Buf::Scratch, slot(k)),
                        dst: at(Buf::Output, k),
                    };
                    Step::new(copy, 1)
                }))
                .collect(),
        ),
    ];
    s.ranks[2].streams = vec![stream(
        1,
        (0..pieces)
            .map(|k| {
                Step::new(
                    Op::Recv {
                        from: 1,
                        dst: at(Buf::Output, k),
                    },
                    1,
                )
            })
            .collect(),
    )];
    s
}

/// A sealed plan of `schedule` alone.
fn sealed(schedule: Schedule) -> PlanFile {
    let mut plan = crate::common::plan_of(schedule, None);
    plan.seal();
    plan
}

#[test]
fn explicit_programs_are_written_as_runs_and_read_back_whole() {
    let plan = sealed(chain_broadcast(4096));
    let text = plan.to_ron();
    // One written step per rank stands for its 4096.
    assert_eq!(text.matches("op:").count(), 4, "{text}");
    assert!(text.contains("repeat: (times: 4096"), "{text}");
    assert!(text.len() < 4096, "{} bytes", text.len());
    let back = PlanFile::from_ron(&text, "p").expect("loads");
    assert_eq!(back, plan);
    assert!(back.sealed().iter().all(|&s| s));
    for rank in 0..4u32 {
        let part = PlanFile::from_ron_for_ranks(&text, "p", &[rank]).expect("loads");
        assert!(part.sealed().iter().all(|&s| s), "rank {rank}");
        assert_eq!(
            part.plan.entries[0].schedule.ranks[rank as usize],
            plan.entries[0].schedule.ranks[rank as usize]
        );
        assert_eq!(part.identity(), Some(plan.identity()), "rank {rank}");
    }
    // An edit of a run edits every step it stands for, and the seal catches it.
    let edited = text.replacen("times: 4096", "times: 4095", 1);
    assert_ne!(edited, text);
    assert!(PlanFile::from_ron(&edited, "e").is_err());
}

#[test]
fn runs_in_explicit_programs_are_held_to_the_expansion_limit() {
    let text = sealed(chain_broadcast(8)).to_ron();
    let huge = text.replacen("times: 8", "times: 4000000000", 1);
    assert_ne!(huge, text);
    let err = PlanFile::from_ron(&huge, "h").expect_err("past every limit");
    let msg = err.to_string();
    assert!(
        msg.starts_with("h:") && msg.contains("rank program"),
        "{msg}"
    );
    let err = PlanFile::from_ron_within(&text, "w", 20).expect_err("past the limit set");
    assert!(err.to_string().contains("expansion limit"), "{err}");
}

/// A plan written by hcclc before format 6 (e923f24: `hcclc compile dgx1-v100 -c broadcast
/// --sizes 64K..128K`): explicit programs step by step, sealed by the digests of their RON.
fn v5_file() -> (String, String) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/dgx1_broadcast_v5.plan.ron");
    let text = std::fs::read_to_string(&path).expect("stored format-5 plan");
    assert!(text.contains("format_version: 5") && text.contains("ranks: Some("));
    (path.display().to_string(), text)
}

#[test]
fn format_5_plans_load_sealed_and_are_held_as_the_current_format() {
    let (origin, text) = v5_file();
    let plan = PlanFile::from_ron(&text, &origin).expect("loads");
    assert_eq!(plan.format_version, hccl_ir::FORMAT_VERSION);
    assert!(!plan.entries.is_empty() && plan.sealed().iter().all(|&s| s));
    // Held under the current digests: its seals are those sealing it now gives.
    let resealed: Vec<_> = plan.entries.iter().map(seal_of).collect();
    assert_eq!(plan.verified, resealed);
    // Written back as format 6 (shorter), it reads back the same.
    let written = plan.to_ron();
    assert!(
        written.len() < text.len(),
        "{} ≥ {}",
        written.len(),
        text.len()
    );
    assert_eq!(PlanFile::from_ron(&written, "w").expect("loads"), plan);
    // Each rank's part checks its program against the digest the old seal lists.
    for rank in 0..8u32 {
        let part = PlanFile::from_ron_for_ranks(&text, &origin, &[rank]).expect("loads");
        assert!(part.sealed().iter().all(|&s| s), "rank {rank}");
        assert_eq!(
            part.plan.entries[0].schedule.ranks[rank as usize],
            plan.entries[0].schedule.ranks[rank as usize]
        );
    }
}

#[test]
fn edits_of_format_5_plans_are_still_caught() {
    let (origin, text) = v5_file();
    // The first `off: 0` of a send is in rank 0's program (the root's).
    let at = text.find("off: 0)").expect("an offset");
    let edited = format!("{}off: 1){}", &text[..at], &text[at + "off: 0)".len()..]);
    assert!(matches!(
        PlanFile::from_ron(&edited, &origin),
        Err(PlanError::Edited { .. })
    ));
    let part = PlanFile::from_ron_for_ranks(&edited, &origin, &[0]);
    assert!(
        matches!(part, Err(PlanError::EditedRank { rank: 0, .. })),
        "{part:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Generated schedules (half of them mutated) and a relay with advancing dependencies
    /// travel through format-6 text as they were: runs found and expanded, seals kept.
    #[test]
    fn explicit_programs_round_trip_through_runs(
        // Deeper than the verifier's tests take them: pipelines of up to 8 pieces on up to
        // 3 channels, whose long runs the writer compresses.
        p in crate::verifier_gen::params_below(5, 4, 9),
        kind in 0..crate::common::MUTATIONS.len(),
        seed in any::<u64>(),
        (pieces, odd) in (3u32..40).prop_flat_map(|n| (Just(n), 0..n + 1)),
    ) {
        let mut schedule = crate::common::generate(p);
        if seed % 2 == 1 {
            let mut rng = crate::common::Rng(seed);
            let _ = crate::common::mutate(&mut schedule, kind, &mut rng);
        }
        let mut plan = crate::common::plan_of(schedule, None);
        plan.entries.push(crate::common::entry(relay(pieces, odd), None));
        plan.seal();
        let text = plan.to_ron();
        let back = PlanFile::from_ron(&text, "p").map_err(|e| e.to_string());
        prop_assert_eq!(back.as_ref(), Ok(&plan));
        prop_assert!(plan.sealed().iter().all(|&s| s));
        // A rank both entries have (one generator family is a single rank).
        let ranks = plan.entries.iter().map(|e| e.schedule.nranks).min().unwrap_or(1);
        let rank = (seed % u64::from(ranks)) as u32;
        let part = PlanFile::from_ron_for_ranks(&text, "p", &[rank]).map_err(|e| e.to_string());
        let part = part.expect("a rank's part loads");
        prop_assert!(part.sealed().iter().all(|&s| s));
        for (e, want) in part.plan.entries.iter().zip(&plan.entries) {
            prop_assert_eq!(
                &e.schedule.ranks[rank as usize],
                &want.schedule.ranks[rank as usize]
            );
        }
    }
}
