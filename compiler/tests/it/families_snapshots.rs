//! RON snapshots of small schedules, for review and to pin determinism; plus builder checks.

use hccl_compiler::builder::{BuildError, ScheduleBuilder};
use hccl_compiler::families::FamilyParams;
use hccl_compiler::search::generate_with;
use hccl_ir::verify::verify;
use hccl_ir::{Collective, Loc, Op};
use hccl_topologies::{build, generate};

fn ron_of(name: &str, n: u32) -> String {
    let topo = build(generate::host(n, 10.0), "t").unwrap();
    let p = FamilyParams {
        channels: 1,
        pipeline: 1,
    };
    let cands = generate_with(name, &topo, Collective::AllReduce, p, false).unwrap();
    let s = &cands[0].schedule;
    verify(s).unwrap();
    let cfg = ron::ser::PrettyConfig::new().struct_names(false);
    ron::ser::to_string_pretty(s, cfg).unwrap()
}

#[test]
fn ring_allreduce_4_ranks() {
    let text = ron_of("ring", 4);
    // The reduce-scatter / all-gather junction is one fused receive-reduce-copy-send.
    assert!(text.contains("RecvReduceCopySend"));
    assert!(text.contains("RecvReduceSend"));
    insta::assert_snapshot!(text);
}

#[test]
fn double_binary_tree_allreduce_8_ranks() {
    insta::assert_snapshot!(ron_of("tree", 8));
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(ron_of("kary_tree", 8), ron_of("kary_tree", 8));
}

#[test]
fn builder_fuses_forwarding_and_tracks_hazards() {
    // Chain reduce 0 → 1 → 2 written with chunk-level ops; rank 1's partial is dead.
    let mut b = ScheduleBuilder::new(Collective::Reduce { root: 2 }, 3, 1, false);
    b.reduce_to(
        (0, Loc::input(0)),
        Loc::input(0),
        (1, Loc::scratch(0)),
        1,
        0,
    );
    b.reduce_to(
        (1, Loc::scratch(0)),
        Loc::input(0),
        (2, Loc::output(0)),
        1,
        0,
    );
    let s = b.build().unwrap();
    verify(&s).unwrap();
    let ops: Vec<&str> = s.ranks[1]
        .streams
        .iter()
        .flat_map(|st| &st.steps)
        .map(|st| st.op.mnemonic())
        .collect();
    assert_eq!(ops, ["rrs"]);
    // Without fusion: recv-reduce-copy then a send in one stream (no cross-stream deps).
    let mut b = ScheduleBuilder::new(Collective::Reduce { root: 2 }, 3, 1, false);
    b.set_fusion(false);
    b.reduce_to(
        (0, Loc::input(0)),
        Loc::input(0),
        (1, Loc::scratch(0)),
        1,
        0,
    );
    b.reduce_to(
        (1, Loc::scratch(0)),
        Loc::input(0),
        (2, Loc::output(0)),
        1,
        0,
    );
    let s = b.build().unwrap();
    verify(&s).unwrap();
    assert_eq!(s.ranks[1].scratch_chunks, 1);
    assert_eq!(s.ranks[1].streams.len(), 2);
    let send = &s.ranks[1].streams[1].steps[0];
    assert!(matches!(send.op, Op::Send { to: 2, .. }));
    assert_eq!(send.deps.len(), 1, "RAW dependency on the receive");
}

#[test]
fn builder_reports_bad_ops() {
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, false);
    b.copy((0, Loc::input(1)), (1, Loc::output(1)), 2, 0);
    assert!(matches!(
        b.build(),
        Err(BuildError::OutOfBounds { rank: 0, .. })
    ));
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, false);
    b.send(0, 5, Loc::input(0), 1, 0);
    assert!(matches!(
        b.build(),
        Err(BuildError::RankOutOfRange { bad: 5, .. })
    ));
    let b = ScheduleBuilder::new(Collective::AllGather, 3, 4, false);
    assert!(matches!(b.build(), Err(BuildError::BadChunks { .. })));
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, false);
    b.send(1, 1, Loc::input(0), 1, 0);
    assert!(matches!(
        b.build(),
        Err(BuildError::SelfPeer { rank: 1, .. })
    ));
}

#[test]
fn builder_refuses_buffers_past_what_the_verifier_models() {
    use hccl_compiler::builder::MAX_CHUNKS;
    // Scratch at the far end of `u32`: the op is refused where it is recorded.
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, false);
    b.copy((0, Loc::input(0)), (1, Loc::scratch(u32::MAX - 3)), 2, 0);
    assert!(matches!(
        b.error(),
        Some(BuildError::OutOfBounds { rank: 1, index: 0, len, .. }) if u64::from(*len) == MAX_CHUNKS
    ));
    // Scratch allocated past it, and buffers cut into more chunks than that.
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, 2, false);
    let far = b.scratch(1, u32::MAX);
    b.scratch(1, u32::MAX);
    b.copy((0, Loc::input(0)), (1, Loc::output(0)), 1, 0);
    assert_eq!(far, Loc::scratch(0));
    assert!(matches!(
        b.build(),
        Err(BuildError::TooLarge { rank: 1, chunks }) if chunks == 4 + u64::from(u32::MAX)
    ));
    let mut b = ScheduleBuilder::new(Collective::AllReduce, 2, u32::MAX, false);
    b.copy((0, Loc::input(0)), (1, Loc::output(0)), 1, 0);
    let err = b.build().unwrap_err();
    assert!(matches!(err, BuildError::TooLarge { rank: 0, .. }), "{err}");
    assert!(
        err.to_string().contains("the most the verifier models"),
        "{err}"
    );
}

fn random_loc((buf, off): (u8, u32)) -> Loc {
    match buf {
        0 => Loc::input(off),
        1 => Loc::output(off),
        _ => Loc::scratch(off),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Whatever ranges a program's ops take, partly overlapping ones included, on several
    /// channels (so several streams per rank), the builder orders every two accesses of a
    /// chunk one of which writes, and pairs every message: the verifier finds no race,
    /// deadlock or broken structure (its checks of the collective's result and of unwritten
    /// reads do not apply to random programs).
    #[test]
    fn builder_orders_every_overlap(
        ops in proptest::collection::vec(
            (0u8..5, 0u32..3, 0u32..3, (0u8..3, 0u32..8), (0u8..3, 0u32..8), 1u32..5, 0u32..3),
            1..16,
        ),
        fusion in proptest::bool::ANY,
    ) {
        const CHUNKS: u32 = 12;
        let mut b = ScheduleBuilder::new(Collective::AllReduce, 3, CHUNKS, false);
        b.set_fusion(fusion);
        for &(kind, from, to, src, dst, count, channel) in &ops {
            let (s, d) = (random_loc(src), random_loc(dst));
            let fits = |(buf, off): (u8, u32)| buf == 2 || off + count <= CHUNKS;
            let overlap = from == to && src.0 == dst.0 && src.1 < dst.1 + count && dst.1 < src.1 + count;
            if !fits(src) || !fits(dst) || overlap {
                continue;
            }
            match kind {
                0 => b.fence(from),
                1 | 2 => b.copy((from, s), (to, d), count, channel),
                _ => b.reduce((from, s), (to, d), count, channel),
            }
        }
        let schedule = b.build().expect("in-bounds ops build");
        let errors = hccl_ir::verify::verify_report(&schedule).err().unwrap_or_default();
        use hccl_ir::verify::ErrorKind as K;
        let broken: Vec<_> = errors
            .iter()
            .filter(|e| {
                !matches!(
                    e.kind,
                    K::Postcondition | K::Uninitialized | K::BadReduction | K::Truncated
                )
            })
            .collect();
        proptest::prop_assert!(broken.is_empty(), "{broken:#?}");
    }
}
