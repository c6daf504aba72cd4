//! One-rank plan loading of plans mixing explicit and symmetric entries: every rank's view
//! equals the full load with the other ranks' programs emptied, also with comments, strings
//! and struct names around and inside the rank lists, and under random byte edits.

use crate::common;

use hccl_ir::{BlockLabel, BlockLayout, ChunkMap, PlanFile, PlanMeta, RankProgram, Symmetry};
use proptest::prelude::*;

/// An explicit chain Broadcast, a symmetric ring AllReduce and an explicit AllToAll.
fn mixed(n: u32) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: "ranks: [ ( ] \" //".to_string(),
        topology_hash: String::new(),
        compiler: "t".to_string(),
    });
    let symmetry = Symmetry::ring(
        (0..n).collect(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        }),
    );
    plan.entries.push(common::entry(
        common::ring_broadcast(n, 0, 1, 2, 2, false),
        None,
    ));
    plan.entries.push(common::entry(
        common::ring_allreduce(n, 1, 1, false),
        Some(symmetry),
    ));
    plan.entries
        .push(common::entry(common::direct_alltoall(n, 1, 1, true), None));
    assert!(
        plan.entries[1].is_compact(),
        "the ring is written symmetric"
    );
    plan
}

/// The full plan as seen by `rank`: the other ranks' programs empty.
fn view(plan: &PlanFile, rank: u32) -> PlanFile {
    let mut plan = plan.clone();
    for e in &mut plan.entries {
        for (r, p) in e.schedule.ranks.iter_mut().enumerate() {
            if r as u32 != rank {
                *p = RankProgram {
                    scratch_chunks: 0,
                    streams: Vec::new(),
                };
            }
        }
    }
    plan
}

/// `text` with comments and odd whitespace between and inside the rank programs.
fn decorate(text: &str) -> String {
    // Struct names on the first three rank programs.
    let mut text = text.to_string();
    for n in 0..3 {
        let field = text
            .match_indices("scratch_chunks:")
            .nth(n)
            .map(|(i, _)| i)
            .expect("a rank program");
        let open = text[..field].rfind('(').expect("its parenthesis");
        text.insert_str(open, "RankProgram ");
    }
    text.replace("ranks: [", "ranks: /* ranks: [ ( */ [ // ] )\n")
        .replace("steps: [", "steps: /* ) ] /* nested */ */ [ // \"\n")
}

#[test]
fn every_rank_sees_its_part_of_a_mixed_plan() {
    let plan = mixed(5);
    let text = plan.to_ron();
    assert!(text.contains("symmetric: (") && text.contains("schedule: ("));
    for text in [text.clone(), decorate(&text)] {
        let full = PlanFile::from_ron(&text, "m").expect("parses");
        assert_eq!(full.entries[0].schedule, plan.entries[0].schedule);
        for rank in 0..5 {
            let part = PlanFile::from_ron_for_rank(&text, "m", rank).expect("parses");
            assert_eq!(part, view(&full, rank), "rank {rank}");
        }
        let err = PlanFile::from_ron_for_rank(&text, "m", 5).expect_err("rank 5 of 5");
        assert!(err.to_string().contains("rank 5 is out of range"), "{err}");
    }
}

#[test]
fn errors_in_the_wanted_program_keep_their_location() {
    let text = mixed(4).to_ron();
    // Break rank 3's program of the first (explicit) entry: its first `channel: 0`.
    let programs = text.find("ranks: [").expect("explicit rank list");
    let third = text[programs..]
        .match_indices("scratch_chunks:")
        .nth(3)
        .map(|(i, _)| programs + i)
        .expect("rank 3");
    let at = third + text[third..].find("channel: ").expect("a stream");
    let bad = format!(
        "{}channel: -1{}",
        &text[..at],
        &text[at + "channel: 0".len()..]
    );
    let line = text[..at].lines().count();
    let err = PlanFile::from_ron_for_rank(&bad, "m", 3).expect_err("negative channel");
    match err {
        hccl_ir::PlanError::Parse(loc) => assert_eq!(loc.line, line, "{loc}"),
        other => panic!("expected a parse error, got {other:?}"),
    }
    // Rank 0 does not read rank 3's program.
    assert_eq!(
        PlanFile::from_ron_for_rank(&bad, "m", 0).expect("parses"),
        view(&mixed(4), 0)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random byte edits never panic, and when the full load accepts the text, every rank's
    /// load is its view of that plan.
    #[test]
    fn edited_plans_load_consistently(
        decorated in any::<bool>(),
        edits in proptest::collection::vec((0.0f64..1.0, 0usize..20, 0usize..3), 1..4),
        rank in 0u32..5,
    ) {
        const BYTES: &[u8] = b"()[]{}\",'/*#r\\: bn0\n";
        let text = mixed(4).to_ron();
        let mut bytes = if decorated { decorate(&text) } else { text }.into_bytes();
        for (at, b, kind) in edits {
            let at = ((bytes.len() as f64) * at) as usize;
            let b = BYTES[b % BYTES.len()];
            match kind {
                0 => bytes.insert(at, b),
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ if at < bytes.len() => bytes[at] = b,
                _ => bytes.push(b),
            }
        }
        let text = String::from_utf8(bytes).expect("ASCII edits of ASCII text");
        let part = PlanFile::from_ron_for_rank(&text, "e", rank);
        let fewest = |plan: &PlanFile| plan.entries.iter().map(|e| e.schedule.ranks.len()).min();
        if let Ok(full) = PlanFile::from_ron(&text, "e")
            && fewest(&full).is_none_or(|n| (rank as usize) < n)
        {
            prop_assert_eq!(part.ok(), Some(view(&full, rank)));
        }
    }
}

/// A sealed copy of [`mixed`], with a second AllToAll entry (another size range) whose
/// schedule has the same header as the first but other programs.
fn sealed_mixed(n: u32) -> PlanFile {
    let mut plan = mixed(n);
    let mut other = common::entry(common::direct_alltoall(n, 1, 1, true), None);
    other.min_bytes = 1 << 20;
    // The same exchange on channel 1: another schedule.
    for prog in &mut other.schedule.ranks {
        for st in &mut prog.streams {
            st.channel += 1;
        }
    }
    hccl_ir::verify::verify(&other.schedule).expect("the exchange verifies on channel 1");
    plan.entries.push(other);
    hccl_ir::verify::verify_plan(&plan).expect("verifies");
    plan.seal();
    plan
}

#[test]
fn each_rank_checks_its_own_programs_against_the_seals() {
    let n = 5;
    let plan = sealed_mixed(n);
    let text = plan.to_ron();
    let whole = PlanFile::from_ron(&text, "s").expect("parses");
    let identity = whole.identity();
    for rank in 0..n {
        let part = PlanFile::from_ron_for_ranks(&text, "s", &[rank]).expect("sealed part");
        assert!(part.sealed().iter().all(|s| *s), "rank {rank}");
        assert_eq!(part.identity().as_deref(), Some(identity.as_str()));
        for (i, e) in part.plan.entries.iter().enumerate() {
            hccl_ir::verify::check_rank(&e.schedule, rank)
                .unwrap_or_else(|errs| panic!("entry {i} rank {rank}: {errs:?}"));
        }
    }
    // Several ranks at once (a host's ranks): the same seals cover them all.
    let part = PlanFile::from_ron_for_ranks(&text, "s", &[3, 1, 3]).expect("two ranks");
    assert_eq!(part.ranks, vec![1, 3]);
    assert_eq!(
        part.plan.entries[0].schedule.ranks[3],
        plan.entries[0].schedule.ranks[3]
    );
    assert!(part.plan.entries[0].schedule.ranks[2].streams.is_empty());
    assert_eq!(part.identity().as_deref(), Some(identity.as_str()));
    // An unsealed plan loads; nothing is sealed and no identity comes from a part.
    let unsealed = PlanFile::from_ron_for_ranks(&mixed(n).to_ron(), "u", &[2]).expect("loads");
    assert!(unsealed.sealed().iter().all(|s| !s));
    assert_eq!(unsealed.identity(), None);
}

/// Rank `rank`'s program of entry `entry` in the plan text: its byte range.
fn program_span(text: &str, entry: usize, rank: usize) -> std::ops::Range<usize> {
    let start = text
        .match_indices("schedule: (")
        .nth(entry)
        .map(|(i, _)| i)
        .expect("the explicit entry");
    let list = start + text[start..].find("ranks: [").expect("its ranks") + "ranks: [".len();
    let mut depth = 0;
    let mut begin = None;
    let mut index = 0;
    for (i, c) in text[list..].char_indices() {
        match c {
            '(' | '[' => {
                if depth == 0 {
                    begin = Some(list + i);
                }
                depth += 1;
            }
            ')' | ']' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    if index == rank {
                        return begin.expect("opened")..list + i + 1;
                    }
                    index += 1;
                }
            }
            _ => {}
        }
    }
    panic!("no rank {rank}")
}

#[test]
fn an_edited_rank_program_is_caught_by_that_rank() {
    let n = 5;
    let text = sealed_mixed(n).to_ron();
    // Entry 0 (explicit): rank 2 sends a chunk further along.
    let span = program_span(&text, 0, 2);
    let program = &text[span.clone()];
    let edited_program = program.replacen("off: 0", "off: 1", 1);
    assert_ne!(program, edited_program, "{program}");
    let edited = format!(
        "{}{}{}",
        &text[..span.start],
        edited_program,
        &text[span.end..]
    );
    let err = PlanFile::from_ron_for_ranks(&edited, "e.plan", &[2]).expect_err("rank 2 edited");
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            hccl_ir::PlanError::EditedRank {
                rank: 2,
                entry: 0,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("e.plan") && msg.contains("rank 2's program"),
        "{msg}"
    );
    // Another rank's part does not read rank 2's program: it loads, and so would its run,
    // but rank 2 refuses to start, so the job does. The whole plan is refused.
    assert!(PlanFile::from_ron_for_ranks(&edited, "e.plan", &[0]).is_ok());
    assert!(PlanFile::from_ron(&edited, "e.plan").is_err());
    // Putting the edited program's digest into the seal breaks the seal's root instead.
    let plan = PlanFile::from_ron_for_ranks(&text, "s", &[0])
        .expect("loads")
        .plan;
    let seal = plan
        .verified
        .iter()
        .find(|s| s.ranks.is_some())
        .expect("an explicit entry's seal");
    let list = seal.ranks.clone().expect("digests");
    let forged_digest = {
        let edited_plan = PlanFile::from_ron_for_ranks(
            &edited.replace(hccl_ir::verify::VERIFIER, "someone else"),
            "f",
            &[2],
        )
        .expect("no seal of this verifier left");
        let d = hccl_ir::rank_digest(&edited_plan.plan.entries[0].schedule.ranks[2]);
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let mut forged_list = list.clone();
    forged_list.replace_range(2 * 32..3 * 32, &forged_digest);
    let forged = edited.replace(&list, &forged_list);
    assert!(matches!(
        PlanFile::from_ron_for_ranks(&forged, "f", &[2]),
        Err(hccl_ir::PlanError::EditedRank { rank: 2, .. })
    ));
}

#[test]
fn programs_swapped_between_sealed_entries_change_the_identity() {
    let n = 5;
    let text = sealed_mixed(n).to_ron();
    // Entries 2 and 3 share their header; give rank 1 entry 3's program in entry 2.
    let (a, b) = (program_span(&text, 1, 1), program_span(&text, 2, 1));
    assert!(a.end < b.start);
    let swapped = format!("{}{}{}", &text[..a.start], &text[b.clone()], &text[a.end..]);
    let part = PlanFile::from_ron_for_ranks(&swapped, "w", &[1]).expect("each program is sealed");
    let others = PlanFile::from_ron_for_ranks(&swapped, "w", &[0]).expect("untouched");
    assert!(part.sealed().iter().all(|s| *s));
    assert_ne!(
        part.identity(),
        others.identity(),
        "rank 1 matched another seal: the job sees two plans"
    );
}

#[test]
fn a_rank_checks_its_own_program_locally() {
    let mut s = common::direct_alltoall(4, 1, 1, true);
    assert!(hccl_ir::verify::check_rank(&s, 1).is_ok());
    assert!(hccl_ir::verify::check_rank(&s, 4).is_err(), "no rank 4");
    s.ranks[1].streams[0].steps[0].count = 99;
    let errs = hccl_ir::verify::check_rank(&s, 1).expect_err("out of bounds");
    assert!(errs[0].to_string().contains("rank 1"), "{errs:?}");
    // Another rank's broken program is not this rank's concern.
    assert!(hccl_ir::verify::check_rank(&s, 0).is_ok());
}

#[test]
fn a_rank_index_gives_the_same_parts_and_survives_edits() {
    let n = 5;
    let plan = sealed_mixed(n);
    let plain = plan.to_ron();
    let indexed = plan.to_ron_indexed();
    assert!(indexed.contains("rank_index: \"") && !plain.contains("rank_index"));
    assert_eq!(PlanFile::from_ron(&indexed, "i").expect("full load"), plan);
    let path = std::env::temp_dir().join(format!("hccl-index-{}.plan.ron", std::process::id()));
    std::fs::write(&path, &indexed).expect("written");
    let sets: Vec<Vec<u32>> = (0..n)
        .map(|r| vec![r])
        .chain([vec![0, 3], vec![]])
        .collect();
    for ranks in &sets {
        let want = PlanFile::from_ron_for_ranks(&plain, "p", ranks).expect("scan");
        for got in [
            PlanFile::from_ron_for_ranks(&indexed, "i", ranks).expect("index"),
            PlanFile::load_for_ranks(&path, ranks).expect("index in a file"),
        ] {
            assert_eq!(got.plan, want.plan, "{ranks:?}");
            assert_eq!(got.ranks, want.ranks);
            assert_eq!(got.identity(), want.identity());
        }
    }
    // An edited program is caught through the index too.
    let span = program_span(&indexed, 0, 2);
    let edited_program = indexed[span.clone()].replacen("off: 0", "off: 1", 1);
    let edited = format!(
        "{}{}{}",
        &indexed[..span.start],
        edited_program,
        &indexed[span.end..]
    );
    std::fs::write(&path, &edited).expect("written");
    assert!(matches!(
        PlanFile::load_for_ranks(&path, &[2]),
        Err(hccl_ir::PlanError::EditedRank { rank: 2, .. })
    ));
    // Text added after the index makes it stale: the scan takes over, with the same result.
    let stale = indexed.replacen("  meta: (", "  // a note\n  meta: (", 1);
    std::fs::write(&path, &stale).expect("written");
    for ranks in &sets {
        let want = PlanFile::from_ron_for_ranks(&plain, "p", ranks).expect("scan");
        let got = PlanFile::load_for_ranks(&path, ranks).expect("stale index");
        assert_eq!(got.plan, want.plan, "{ranks:?}");
    }
    let _ = std::fs::remove_file(&path);
}
