//! Rank-symmetric schedules: hand-built ring, hierarchical and hypercube schedules compress
//! under their symmetry, expand back exactly, and travel through plan files in the symmetric
//! form; malformed symmetric entries fail cleanly.

use crate::common;

use common::mutate::{Edit, apply};
use common::plan_of;
use hccl_ir::verify::{verify, verify_plan};
use hccl_ir::{
    Action, BlockLabel, BlockLayout, ChunkMap, Collective, Loc, Op, PlanError, PlanFile, Rank,
    RankProgram, Schedule, Step, Stream, Symmetry,
};
use proptest::prelude::*;

fn md(a: i64, n: u32) -> u32 {
    a.rem_euclid(i64::from(n)) as u32
}

/// One stream on channel 0 per rank, built from `(rank, ops)`.
fn one_stream(
    collective: Collective,
    n: u32,
    chunks: u32,
    in_place: bool,
    program: impl Fn(Rank) -> Vec<(Op, u32)>,
) -> Schedule {
    let mut s = Schedule::empty(collective, n, chunks, in_place).expect("chunks fit");
    for r in 0..n {
        s.ranks[r as usize].streams.push(Stream {
            channel: 0,
            steps: program(r)
                .into_iter()
                .map(|(op, count)| Step::new(op, count))
                .collect(),
        });
    }
    s
}

/// Ring AllReduce around the ring `order` (position p holds rank order[p]), `q` chunks per
/// segment. Segments are labelled by ring position (`by_rank == false`) or by the rank at
/// that position.
fn ring_allreduce(order: &[Rank], q: u32, by_rank: bool) -> (Schedule, Symmetry) {
    let n = order.len() as u32;
    let mut pos = vec![0u32; order.len()];
    for (p, &r) in order.iter().enumerate() {
        pos[r as usize] = p as u32;
    }
    let schedule = one_stream(Collective::AllReduce, n, n * q, false, |r| {
        let p = i64::from(pos[r as usize]);
        let next = order[md(p + 1, n) as usize];
        let prev = order[md(p - 1, n) as usize];
        let seg = |k: u32| {
            let at = md(p - i64::from(k), n);
            (if by_rank { order[at as usize] } else { at }) * q
        };
        common::ring_allreduce_ops(n, prev, next, q, &seg, Loc::input, Loc::output)
    });
    let label = if by_rank {
        BlockLabel::Rank
    } else {
        BlockLabel::Grid { order: vec![0] }
    };
    let symmetry = Symmetry::ring(
        order.to_vec(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label,
        }),
    );
    (schedule, symmetry)
}

/// Ring AllGather around `order`: rank r's `q` chunks go to output block r.
fn ring_allgather(order: &[Rank], q: u32, in_place: bool) -> (Schedule, Symmetry) {
    let n = order.len() as u32;
    let mut pos = vec![0u32; order.len()];
    for (p, &r) in order.iter().enumerate() {
        pos[r as usize] = p as u32;
    }
    let schedule = one_stream(Collective::AllGather, n, n * q, in_place, |r| {
        let p = i64::from(pos[r as usize]);
        let next = order[md(p + 1, n) as usize];
        let prev = order[md(p - 1, n) as usize];
        let block = |k: u32| order[md(p - i64::from(k), n) as usize] * q;
        let mut ops = Vec::new();
        if !in_place {
            ops.push((
                Op::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(block(0)),
                },
                q,
            ));
        }
        ops.push((
            Op::Send {
                to: next,
                src: Loc::output(block(0)),
            },
            q,
        ));
        for k in 1..n {
            let op = if k < n - 1 {
                Op::RecvCopySend {
                    from: prev,
                    to: next,
                    dst: Loc::output(block(k)),
                }
            } else {
                Op::Recv {
                    from: prev,
                    dst: Loc::output(block(k)),
                }
            };
            ops.push((op, q));
        }
        ops
    });
    let symmetry = Symmetry::ring(
        order.to_vec(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        }),
    );
    (schedule, symmetry)
}

/// Hierarchical AllReduce on an `h × l` grid (position (x, y) holds `ranks[x·l + y]`), done
/// once per piece `o` of `pieces`: a ring ReduceScatter among the locals of a host (shards
/// of `h` chunks), a ring AllReduce of each shard among the hosts, a ring AllGather among
/// the locals. Chunk `o·n + y·h + x` is piece `o` of the block labelled by grid (x, y)
/// written local-major: PieceMajor with `Grid { order: [1, 0] }`.
fn hierarchical_allreduce(h: u32, l: u32, pieces: u32, ranks: Vec<Rank>) -> (Schedule, Symmetry) {
    let n = h * l;
    let mut pos = vec![0u32; ranks.len()];
    for (p, &r) in ranks.iter().enumerate() {
        pos[r as usize] = p as u32;
    }
    let at = |x: i64, y: i64| ranks[(md(x, h) * l + md(y, l)) as usize];
    let schedule = one_stream(Collective::AllReduce, n, n * pieces, false, |r| {
        let (x, y) = (
            i64::from(pos[r as usize] / l),
            i64::from(pos[r as usize] % l),
        );
        let (lnext, lprev) = (at(x, y + 1), at(x, y - 1));
        let (hnext, hprev) = (at(x + 1, y), at(x - 1, y));
        let mut ops = Vec::new();
        for o in 0..pieces {
            let base = o * n;
            // Shard of local index s: labels s·h .. s·h + h.
            let shard = |k: u32| base + md(y - i64::from(k), l) * h;
            ops.push((
                Op::Send {
                    to: lnext,
                    src: Loc::input(shard(0)),
                },
                h,
            ));
            for k in 1..l {
                let op = if k < l - 1 {
                    Op::RecvReduceCopySend {
                        from: lprev,
                        to: lnext,
                        src: Loc::input(shard(k)),
                        dst: Loc::output(shard(k)),
                    }
                } else {
                    Op::RecvReduceCopy {
                        from: lprev,
                        src: Loc::input(shard(k)),
                        dst: Loc::output(shard(k)),
                    }
                };
                ops.push((op, h));
            }
            // This rank now holds local shard s = y + 1 reduced over its host.
            let s = md(y + 1, l);
            let piece = |k: u32| base + s * h + md(x - i64::from(k), h);
            if h > 1 {
                ops.extend(common::ring_allreduce_ops(
                    h,
                    hprev,
                    hnext,
                    1,
                    &piece,
                    Loc::output,
                    Loc::output,
                ));
            }
            // AllGather of the shards among the locals: local y' holds shard y' + 1.
            let gathered = |k: u32| base + md(y + 1 - i64::from(k), l) * h;
            ops.push((
                Op::Send {
                    to: lnext,
                    src: Loc::output(gathered(0)),
                },
                h,
            ));
            for k in 1..l {
                let op = if k < l - 1 {
                    Op::RecvCopySend {
                        from: lprev,
                        to: lnext,
                        dst: Loc::output(gathered(k)),
                    }
                } else {
                    Op::Recv {
                        from: lprev,
                        dst: Loc::output(gathered(k)),
                    }
                };
                ops.push((op, h));
            }
        }
        ops
    });
    let symmetry = Symmetry {
        dims: vec![h, l],
        actions: vec![Action::Cyclic, Action::Cyclic],
        ranks,
        chunks: Some(ChunkMap {
            layout: BlockLayout::PieceMajor,
            label: BlockLabel::Grid { order: vec![1, 0] },
        }),
    };
    (schedule, symmetry)
}

/// Recursive-doubling AllGather on `2^k` ranks, position p holding rank `p ^ mask`: in round
/// j a rank swaps its aligned `2^j` blocks with the rank at position `p ^ 2^j`.
fn doubling_allgather(k: u32, mask: u32) -> (Schedule, Symmetry) {
    let n = 1u32 << k;
    let schedule = one_stream(Collective::AllGather, n, n, false, |r| {
        let p = r ^ mask;
        let mut ops = vec![(
            Op::Copy {
                src: Loc::input(0),
                dst: Loc::output(r),
            },
            1,
        )];
        for j in 0..k {
            let partner = p ^ (1 << j);
            // Ranks of the aligned position range [(p >> j) << j, +2^j) form the aligned
            // rank range starting at ((p >> j) << j) ^ mask with the low j bits cleared.
            let mine = (((p >> j) << j) ^ mask) >> j << j;
            let theirs = (((partner >> j) << j) ^ mask) >> j << j;
            ops.push((
                Op::Send {
                    to: partner ^ mask,
                    src: Loc::output(mine),
                },
                1 << j,
            ));
            ops.push((
                Op::Recv {
                    from: partner ^ mask,
                    dst: Loc::output(theirs),
                },
                1 << j,
            ));
        }
        ops
    });
    let symmetry = Symmetry::xor(
        (0..n).map(|p| p ^ mask).collect(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        }),
    );
    (schedule, symmetry)
}

/// Halving-doubling AllReduce on `2^k` ranks (identity placement, blocks labelled by
/// position): recursive halving ReduceScatter, then recursive doubling AllGather.
fn halving_doubling_allreduce(k: u32) -> (Schedule, Symmetry) {
    let n = 1u32 << k;
    let schedule = one_stream(Collective::AllReduce, n, n, false, |p| {
        let mut ops = vec![(
            Op::Copy {
                src: Loc::input(0),
                dst: Loc::output(0),
            },
            n,
        )];
        // Halving: in round j (from the top bit down) keep the half containing p.
        for j in (0..k).rev() {
            let partner = p ^ (1 << j);
            let keep = (p >> j) << j;
            let give = (partner >> j) << j;
            ops.push((
                Op::Send {
                    to: partner,
                    src: Loc::output(give),
                },
                1 << j,
            ));
            ops.push((
                Op::RecvReduceCopy {
                    from: partner,
                    src: Loc::output(keep),
                    dst: Loc::output(keep),
                },
                1 << j,
            ));
        }
        for j in 0..k {
            let partner = p ^ (1 << j);
            ops.push((
                Op::Send {
                    to: partner,
                    src: Loc::output((p >> j) << j),
                },
                1 << j,
            ));
            ops.push((
                Op::Recv {
                    from: partner,
                    dst: Loc::output((partner >> j) << j),
                },
                1 << j,
            ));
        }
        ops
    });
    let symmetry = Symmetry {
        dims: vec![n],
        actions: vec![Action::Xor],
        ranks: (0..n).collect(),
        chunks: Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Grid { order: vec![0] },
        }),
    };
    (schedule, symmetry)
}

fn cases() -> Vec<(&'static str, Schedule, Symmetry)> {
    let order = [0, 3, 1, 5, 2, 4];
    let mut out = Vec::new();
    let (s, y) = ring_allreduce(&order, 2, false);
    out.push(("ring_allreduce_by_position", s, y));
    let (s, y) = ring_allreduce(&order, 1, true);
    out.push(("ring_allreduce_by_rank", s, y));
    let (s, y) = ring_allgather(&order, 2, false);
    out.push(("ring_allgather", s, y));
    let (s, y) = ring_allgather(&order, 1, true);
    out.push(("ring_allgather_in_place", s, y));
    let (s, y) = hierarchical_allreduce(3, 4, 2, (0..12).map(|p| (p * 5) % 12).collect());
    out.push(("hierarchical_3x4", s, y));
    let (s, y) = hierarchical_allreduce(2, 2, 1, vec![3, 2, 1, 0]);
    out.push(("hierarchical_2x2", s, y));
    let (s, y) = doubling_allgather(3, 5);
    out.push(("doubling_allgather_8", s, y));
    let (s, y) = halving_doubling_allreduce(3);
    out.push(("halving_doubling_allreduce_8", s, y));
    out
}

fn empty_program() -> RankProgram {
    RankProgram {
        scratch_chunks: 0,
        streams: Vec::new(),
    }
}

#[test]
fn symmetric_schedules_compress_and_expand_exactly() {
    for (name, schedule, symmetry) in cases() {
        verify(&schedule).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        common::oracle(&schedule, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
        let compact = schedule
            .compress(&symmetry)
            .unwrap_or_else(|| panic!("{name} compresses"));
        assert_eq!(compact.symmetry, symmetry, "{name}");
        assert_eq!(compact.expand().expect("expands"), schedule, "{name}");
        let table = compact.table().expect("valid");
        for r in 0..schedule.nranks {
            assert_eq!(
                compact.program(r).expect("in range"),
                schedule.ranks[r as usize],
                "{name} rank {r}"
            );
            assert_eq!(
                compact.program_with(&table, r).expect("in range"),
                schedule.ranks[r as usize]
            );
        }
        assert!(compact.program(schedule.nranks).is_err(), "{name}");
    }
}

#[test]
fn symmetric_entries_round_trip_through_plan_files() {
    for (name, schedule, symmetry) in cases() {
        let explicit = plan_of(schedule.clone(), None);
        let plan = plan_of(schedule.clone(), Some(symmetry));
        assert!(plan.entries[0].is_compact(), "{name}");
        assert!(!explicit.entries[0].is_compact(), "{name}");
        let (text, explicit_text) = (plan.to_ron(), explicit.to_ron());
        assert!(text.contains("symmetric: ("), "{name}");
        assert!(!text.contains("schedule: ("), "{name}");
        assert!(explicit_text.contains("schedule: ("), "{name}");
        assert!(!explicit_text.contains("symmetric"), "{name}");
        let factor = if schedule.nranks >= 8 { 4 } else { 2 };
        assert!(
            text.len() * factor < explicit_text.len(),
            "{name}: {} vs {} bytes",
            text.len(),
            explicit_text.len()
        );
        assert_eq!(PlanFile::from_ron(&text, name).expect("parses"), plan);
        assert_eq!(
            PlanFile::from_ron(&explicit_text, name).expect("parses"),
            explicit
        );
        verify_plan(&PlanFile::from_ron(&text, name).expect("parses")).expect("verifies");
        for r in 0..schedule.nranks {
            let part = PlanFile::from_ron_for_rank(&text, name, r).expect("parses");
            let entry = &part.entries[0];
            assert_eq!(entry.symmetry, plan.entries[0].symmetry);
            for (q, program) in entry.schedule.ranks.iter().enumerate() {
                let expected = if q as u32 == r {
                    &schedule.ranks[q]
                } else {
                    &empty_program()
                };
                assert_eq!(program, expected, "{name}: rank {r}'s view of rank {q}");
            }
            assert_eq!(
                entry.schedule.ranks.len(),
                schedule.nranks as usize,
                "{name}"
            );
        }
        let err = PlanFile::from_ron_for_rank(&text, name, schedule.nranks).expect_err("no rank");
        assert!(err.to_string().contains("is out of range"), "{err}");
        // Deterministic output.
        assert_eq!(plan.to_ron(), text);
        assert_eq!(plan.content_hash(), plan.clone().content_hash());
    }
}

#[test]
fn a_schedule_broken_on_one_rank_does_not_compress() {
    let (mut schedule, symmetry) = ring_allreduce(&[0, 3, 1, 5, 2, 4], 2, false);
    let last = schedule.ranks[4].streams[0]
        .steps
        .last_mut()
        .expect("steps");
    if let Op::Recv { dst, .. } = &mut last.op {
        dst.off ^= 1;
    }
    assert!(schedule.compress(&symmetry).is_none());
    // Another placement of the same schedule is not a symmetry of it either.
    let (ring, _) = ring_allreduce(&[0, 3, 1, 5, 2, 4], 2, false);
    assert!(
        ring.compress(&Symmetry::ring(
            (0..6).collect(),
            Some(ChunkMap {
                layout: BlockLayout::BlockMajor,
                label: BlockLabel::Rank
            })
        ))
        .is_none()
    );
    assert!(
        ring.compress(&Symmetry::ring(vec![0, 3, 1, 5, 2, 4], None))
            .is_none()
    );
    let plan = plan_of(schedule.clone(), Some(symmetry));
    assert!(!plan.entries[0].is_compact());
    let text = plan.to_ron();
    assert!(text.contains("schedule: (") && !text.contains("symmetric"));
    let back = PlanFile::from_ron(&text, "p").expect("parses");
    assert_eq!(back.entries[0].schedule, schedule);
    assert_eq!(back.entries[0].symmetry, None);
}

#[test]
fn version_one_plans_still_load() {
    let (schedule, symmetry) = ring_allgather(&[0, 3, 1, 5, 2, 4], 1, false);
    let explicit = plan_of(schedule.clone(), None).to_ron();
    let current = format!("format_version: {}", hccl_ir::FORMAT_VERSION);
    assert!(explicit.contains(&current));
    let v1 = explicit.replacen(&current, "format_version: 1", 1);
    let plan = PlanFile::from_ron(&v1, "v1").expect("v1 loads");
    assert_eq!(plan.format_version, hccl_ir::FORMAT_VERSION);
    assert_eq!(plan, plan_of(schedule.clone(), None));
    assert!(PlanFile::from_ron_for_rank(&v1, "v1", 2).is_ok());
    let stored = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/ring_allreduce_8.plan.ron");
    let text = std::fs::read_to_string(stored).expect("stored v1 plan");
    assert!(text.contains("format_version: 1"));
    assert!(PlanFile::from_ron(&text, "stored").is_ok());
    let symmetric = plan_of(schedule, Some(symmetry)).to_ron();
    for (version, ok) in [
        (0, false),
        (1, true),
        (2, true),
        (3, true),
        (4, true),
        (5, true),
        (6, true),
        (7, false),
    ] {
        let text = symmetric.replacen(&current, &format!("format_version: {version}"), 1);
        let result = PlanFile::from_ron(&text, "v");
        assert_eq!(result.is_ok(), ok, "version {version}");
        if !ok {
            assert!(matches!(result, Err(PlanError::Version { found, .. }) if found == version));
            assert!(PlanFile::from_ron_for_rank(&text, "v", 0).is_err());
        }
    }
    // A version hidden past the text check is refused after the parse.
    let hidden = format!(
        "(meta: (topology: \"{}\", compiler: \"c\"), format_version: 9, entries: [])",
        " ".repeat(5000)
    );
    for result in [
        PlanFile::from_ron(&hidden, "h"),
        PlanFile::from_ron_for_rank(&hidden, "h", 0),
    ] {
        assert!(matches!(result, Err(PlanError::Version { found: 9, .. })));
    }
}

/// Mini entries: a one-rank AllReduce, explicit and symmetric.
const EXPLICIT_ONE: &str = "schedule: (collective: AllReduce, nranks: 1, chunks: 1, \
    input_chunks: 1, output_chunks: 1, in_place: true, ranks: [(streams: [])])";
const SYMMETRIC_ONE: &str = "symmetric: (collective: AllReduce, nranks: 1, chunks: 1, \
    input_chunks: 1, output_chunks: 1, in_place: true, symmetry: (dims: [1], \
    actions: [Cyclic], ranks: [0], chunks: None), template: (streams: []))";

fn plan_text(entry_body: &str) -> String {
    format!(
        "(format_version: 2, meta: (topology: \"t\", compiler: \"c\"), entries: [\n\
         (min_bytes: 0, max_bytes: None, algorithm: \"a\", protocol: Simple, {entry_body})])"
    )
}

/// Loads `text` both ways; both must fail with a located parse error mentioning `fragment`.
fn rejects(name: &str, text: &str, fragment: &str) {
    for result in [
        PlanFile::from_ron(text, name),
        PlanFile::from_ron_for_rank(text, name, 0),
    ] {
        match result {
            Err(PlanError::Parse(loc)) => {
                assert!(loc.line >= 1 && loc.col >= 1, "{name}: {loc}");
                assert!(
                    loc.message.contains(fragment),
                    "{name}: `{loc}` lacks `{fragment}`"
                );
            }
            other => panic!("{name}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn malformed_symmetric_entries_fail_with_located_errors() {
    assert!(PlanFile::from_ron(&plan_text(EXPLICIT_ONE), "ok").is_ok());
    assert!(PlanFile::from_ron(&plan_text(SYMMETRIC_ONE), "ok").is_ok());
    rejects(
        "both",
        &plan_text(&format!("{EXPLICIT_ONE}, {SYMMETRIC_ONE}")),
        "both `schedule` and `symmetric`",
    );
    rejects("neither", &plan_text("cost: None"), "neither");
    rejects(
        "unknown field",
        &plan_text(&SYMMETRIC_ONE.replace("template:", "templat:")),
        "templat",
    );

    let (schedule, symmetry) =
        hierarchical_allreduce(3, 4, 2, (0..12).map(|p| (p * 5) % 12).collect());
    let text = plan_of(schedule, Some(symmetry)).to_ron();
    let edit = |from: &str, to: &str| {
        assert!(text.contains(from), "`{from}` in\n{text}");
        text.replacen(from, to, 1)
    };
    rejects(
        "dims product",
        &edit("dims: [3, 4]", "dims: [3, 5]"),
        "multiply to 15",
    );
    rejects(
        "overflowing dims",
        &edit("dims: [3, 4]", "dims: [4294967295, 4294967295, 4294967295]").replacen(
            "actions: [Cyclic, Cyclic]",
            "actions: [Cyclic, Cyclic, Cyclic]",
            1,
        ),
        "more than 2^64",
    );
    rejects(
        "not a permutation",
        &edit("ranks: [0, 5, 10, 3", "ranks: [0, 5, 5, 3"),
        "repeated",
    );
    rejects(
        "rank out of range",
        &edit("ranks: [0, 5, 10, 3", "ranks: [0, 5, 12, 3"),
        "out of range",
    );
    rejects(
        "xor on three",
        &edit("actions: [Cyclic, Cyclic]", "actions: [Xor, Cyclic]"),
        "not a power of two",
    );
    rejects(
        "action count",
        &edit("actions: [Cyclic, Cyclic]", "actions: [Cyclic]"),
        "actions",
    );
    rejects(
        "bad order",
        &edit("order: [1, 0]", "order: [1, 1]"),
        "order",
    );
    rejects(
        "chunks not divisible",
        &edit("chunks: 24,", "chunks: 25,"),
        "not a multiple",
    );
    rejects(
        "huge nranks",
        &edit("nranks: 12,", "nranks: 4294967295,"),
        "multiply to 12",
    );
    rejects(
        "peer out of range",
        &edit("to: 5,", "to: 4000000000,"),
        "peer 4000000000 is out of range",
    );
    rejects(
        "run out of range",
        &edit("off: 3)", "off: 4294967295)"),
        "run past",
    );

    // Enormous expansions are refused instead of allocated; one rank's load still works.
    let n = 1u32 << 14;
    let big = format!(
        "symmetric: (collective: AllReduce, nranks: {n}, chunks: {n}, input_chunks: {n}, \
         output_chunks: {n}, in_place: true, symmetry: (dims: [{n}], actions: [Cyclic], \
         ranks: [{}], chunks: None), template: (streams: [(channel: 0, steps: [{}])]))",
        (0..n).map(|r| r.to_string()).collect::<Vec<_>>().join(","),
        vec!["(op:Nop,count:0)"; n as usize + 1].join(",")
    );
    match PlanFile::from_ron(&plan_text(&big), "big") {
        Err(PlanError::TooLarge {
            entry: 0,
            nranks,
            template_steps,
            expanded,
            ..
        }) => {
            assert_eq!((nranks, template_steps), (n, u64::from(n) + 1));
            assert_eq!(expanded, u64::from(n) * (u64::from(n) + 1));
        }
        other => panic!("too large: expected PlanError::TooLarge, got {other:?}"),
    }
    let part = PlanFile::from_ron_for_rank(&plan_text(&big), "big", n - 1).expect("one rank");
    assert_eq!(
        part.entries[0].schedule.ranks[n as usize - 1].streams[0]
            .steps
            .len(),
        n as usize + 1
    );
}

#[test]
fn symmetry_helpers_agree_with_the_table() {
    let (_, symmetry) = hierarchical_allreduce(3, 4, 1, (0..12).map(|p| (p * 5) % 12).collect());
    let table = hccl_ir::SymmetryTable::new(&symmetry, 12, 12, 12, 12).expect("valid");
    for by in 0..12 {
        let t = table.translation(by).expect("in range");
        for rank in 0..12 {
            assert_eq!(symmetry.translate_rank(rank, by), Some(t.rank(rank)));
        }
        // Translating rank_at(0) by position p lands on rank_at(p).
        assert_eq!(
            t.rank(table.rank_at(0).expect("0")),
            table.rank_at(by).expect("p")
        );
    }
    for rank in 0..12 {
        assert_eq!(symmetry.position_of(rank), table.position_of(rank));
    }
}

/// Byte edits of a symmetric plan text, inserting values the symmetry checks must refuse.
fn edit() -> impl Strategy<Value = Edit> {
    common::mutate::edit(vec![
        "99999999999999999999".to_string(),
        "4294967295".to_string(),
        "Xor".to_string(),
        "Grid(order: [])".to_string(),
        ",".to_string(),
    ])
}

fn symmetric_texts() -> Vec<String> {
    let (s, y) = hierarchical_allreduce(2, 2, 1, vec![3, 2, 1, 0]);
    let (s2, y2) = doubling_allgather(2, 1);
    vec![plan_of(s, Some(y)).to_ron(), plan_of(s2, Some(y2)).to_ron()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_symmetric_plans_never_panic(
        which in 0usize..2,
        rank in 0u32..5,
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let text = apply(&symmetric_texts()[which], &edits);
        if let Ok(plan) = PlanFile::from_ron(&text, "fuzz") {
            let _ = verify_plan(&plan);
            let _ = plan.to_ron();
        }
        let _ = PlanFile::from_ron_for_rank(&text, "fuzz", rank);
    }
}

/// Digit mutations of the symmetric text reach the symmetry checks: some parse, some are
/// refused by validation, none panic.
#[test]
fn digit_mutations_reach_validation() {
    let text = &symmetric_texts()[0];
    let (mut parsed, mut refused) = (0, 0);
    for i in (0..text.len()).step_by(5) {
        for digits in ["0", "1", "3", "7", "4294967295"] {
            match PlanFile::from_ron(&apply(text, &[Edit::Digits(i, digits.to_string())]), "m") {
                Ok(_) => parsed += 1,
                Err(PlanError::Parse(loc)) if loc.message.contains("symmetric schedule") => {
                    refused += 1
                }
                Err(_) => {}
            }
        }
    }
    assert!(parsed > 20, "only {parsed} mutants parsed");
    assert!(refused > 20, "only {refused} mutants refused by validation");
}

/// A plan of `entries` symmetric entries written in a few hundred bytes: `nranks` ranks
/// (one rank run) whose template is one step repeated `steps` times.
fn hostile_plan(nranks: u32, steps: u32, entries: usize) -> String {
    let entry = format!(
        "(min_bytes: 0, max_bytes: None, algorithm: \"a\", protocol: Simple, symmetric: \
         (collective: AllGather, nranks: {nranks}, chunks: {nranks}, input_chunks: 1, \
         output_chunks: {nranks}, in_place: false, symmetry: (dims: [{nranks}], actions: \
         [Cyclic], rank_runs: [(first: 0, times: {nranks})], chunks: None), template: \
         (streams: [(channel: 0, steps: [(op: Nop, count: 0, repeat: (times: {steps}))])])))"
    );
    format!(
        "(format_version: 5, meta: (topology: \"t\", compiler: \"c\"), entries: [{}])",
        vec![entry; entries].join(",\n")
    )
}

/// A small file whose symmetric entry stands for 2^27 steps (7 GB expanded, under the
/// former fixed limit of 2^28) is refused before it is expanded, with the entry, its
/// collective and the numbers; the one-rank and template loads of it still work.
#[test]
fn a_small_plan_that_expands_hugely_is_refused_with_the_numbers() {
    let text = hostile_plan(4096, 32768, 1);
    assert!(text.len() < 1000, "{} bytes", text.len());
    let err = PlanFile::from_ron(&text, "hostile.plan.ron").unwrap_err();
    let PlanError::TooLarge {
        entry,
        collective,
        nranks,
        template_steps,
        expanded,
        before,
        limit,
        ..
    } = &err
    else {
        panic!("expected PlanError::TooLarge, got {err:?}");
    };
    assert_eq!(
        (*entry, collective.kind()),
        (0, hccl_ir::CollectiveKind::AllGather)
    );
    assert_eq!((*nranks, *template_steps, *before), (4096, 32768, 0));
    assert_eq!(*expanded, 1 << 27);
    assert_eq!(*limit, hccl_ir::plan::MIN_EXPANSION_LIMIT);
    let message = err.to_string();
    for fragment in [
        "hostile.plan.ron: entry 0 (allgather)",
        "4096 ranks × 32768 template steps expand to 134217728 steps",
        "limit of 67108864 steps",
        "HCCL_PLAN_MAX_STEPS",
    ] {
        assert!(message.contains(fragment), "`{fragment}` not in: {message}");
    }
    let part = PlanFile::from_ron_for_rank(&text, "hostile", 4095).expect("one rank");
    assert_eq!(
        part.entries[0].schedule.ranks[4095].streams[0].steps.len(),
        32768
    );
}

/// Found by review while writing the plan loader's fuzz target (`fuzz/`, `plan`): the limit was
/// checked only once a template was built, so a template of one step repeated 2^24 − 1
/// times made a loader limited to 1000 steps allocate about 1 GB first. The template is
/// refused as it is read now, located in the file and naming the limit.
#[test]
fn a_template_past_the_expansion_limit_is_refused_before_it_is_built() {
    let text = hostile_plan(1, (1 << 24) - 1, 1);
    let err = PlanFile::from_ron_within(&text, "hostile.plan.ron", 1000).unwrap_err();
    let PlanError::Parse(located) = &err else {
        panic!("expected a located refusal while reading, got {err:?}");
    };
    assert_eq!(located.path, "hostile.plan.ron");
    assert!(located.line >= 1 && located.col > 1, "{err}");
    let message = err.to_string();
    for fragment in ["template's steps expand to 16777215", "1000 steps of"] {
        assert!(message.contains(fragment), "`{fragment}` not in: {message}");
    }
    // Within the limit the same template reads.
    let small = hostile_plan(1, 1000, 1);
    let plan = PlanFile::from_ron_within(&small, "small", 1000).expect("within the limit");
    assert_eq!(
        plan.entries[0].schedule.ranks[0].streams[0].steps.len(),
        1000
    );
}

/// The limit holds for the plan's entries together: the entry that crosses it is named,
/// with what the entries before it expanded to; within the limit every entry expands.
#[test]
fn the_expansion_limit_counts_every_entry_of_the_plan() {
    let text = hostile_plan(8, 10, 3);
    match PlanFile::from_ron_within(&text, "three", 200) {
        Err(PlanError::TooLarge {
            entry: 2,
            expanded: 80,
            before: 160,
            limit: 200,
            ..
        }) => {}
        other => panic!("expected entry 2 refused, got {other:?}"),
    }
    let plan = PlanFile::from_ron_within(&text, "three", 240).expect("within the limit");
    assert_eq!(plan.entries.len(), 3);
    for e in &plan.entries {
        assert!(e.template.is_none() && e.symmetry.is_some());
        assert_eq!(e.schedule.ranks.len(), 8);
        assert!(
            e.schedule
                .ranks
                .iter()
                .all(|r| r.streams[0].steps.len() == 10)
        );
    }
    // The same as the default full load of so small a plan.
    assert_eq!(PlanFile::from_ron(&text, "three").unwrap(), plan);
}

/// The plans the repository ships load in full as before.
#[test]
fn shipped_plans_load_in_full() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let mut loaded = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/data") {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".plan.ron") {
            let plan = PlanFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!plan.entries.is_empty(), "{}", path.display());
            loaded += 1;
        }
    }
    assert!(loaded >= 3, "{loaded} plans in {}", dir.display());
}

/// A full load's limit on expanded steps covers the explicit entries too (from format 6 they
/// are written as runs, so they may stand for many steps): a symmetric entry that fits the
/// limit alone is refused once the explicit entries' steps take the plan past it.
#[test]
fn explicit_steps_count_toward_the_expansion_limit() {
    let (schedule, symmetry) = ring_allgather(&[0, 3, 1, 5, 2, 4], 2, false);
    let symmetric_steps = schedule.step_count() as u64;
    let mut plan = plan_of(common::ring_allgather(6, 8, 2, false), None);
    let explicit_steps = plan.entries[0].schedule.step_count() as u64;
    plan.entries
        .extend(plan_of(schedule, Some(symmetry)).entries);
    assert!(plan.entries[1].is_compact() && !plan.entries[0].is_compact());
    let text = plan.to_ron();
    let enough = explicit_steps + symmetric_steps;
    assert!(PlanFile::from_ron_within(&text, "p", enough).is_ok());
    match PlanFile::from_ron_within(&text, "p", enough - 1) {
        Err(PlanError::TooLarge {
            entry: 1, before, ..
        }) => assert_eq!(before, explicit_steps),
        other => panic!("expected TooLarge at entry 1, got {other:?}"),
    }
    // Alone, the symmetric entry fits the smaller limit.
    assert!(symmetric_steps < enough - 1);
}
