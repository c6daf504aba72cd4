//! One-rank plan loading of plans mixing explicit and symmetric entries: every rank's view
//! equals the full load with the other ranks' programs emptied, also with comments, strings
//! and struct names around and inside the rank lists, and under random byte edits.

mod common;

use hccl_ir::{
    BlockLabel, BlockLayout, ChunkMap, PlanEntry, PlanFile, PlanMeta, Protocol, RankProgram,
    Schedule, Symmetry,
};
use proptest::prelude::*;

fn entry(schedule: Schedule, symmetry: Option<Symmetry>) -> PlanEntry {
    PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "a".to_string(),
        protocol: Protocol::Simple,
        cost: None,
        schedule,
        symmetry,
        synthesis: None,
    }
}

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
    plan.entries
        .push(entry(common::ring_broadcast(n, 0, 1, 2, 2, false), None));
    plan.entries.push(entry(
        common::ring_allreduce(n, 1, 1, false),
        Some(symmetry),
    ));
    plan.entries
        .push(entry(common::direct_alltoall(n, 1, 1, true), None));
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
