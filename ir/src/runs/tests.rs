//! Tests of the written form of templates (and, for other modules' tests, [`deep`]).

use super::*;
use crate::schedule::Loc;

fn send(to: u32, off: u32, count: u32) -> Step {
    Step::new(
        Op::Send {
            to,
            src: Loc::input(off),
        },
        count,
    )
}

fn rrc(from: u32, off: u32, count: u32) -> Step {
    Step::new(
        Op::RecvReduceCopy {
            from,
            src: Loc::output(off),
            dst: Loc::output(off),
        },
        count,
    )
}

/// A deep pipelined template: strided step runs inside streams, and streams that repeat
/// every second one with peers, offsets and dependencies moving.
pub(crate) fn deep() -> RankProgram {
    let mut streams = vec![
        Stream {
            channel: 0,
            steps: (0..12).map(|k| send(1, 16 + 32 * k, 16)).collect(),
        },
        Stream {
            channel: 0,
            steps: (0..12)
                .map(|k| rrc(7, 32 * k, 16).with_deps([Dep { stream: 0, step: k }]))
                .collect(),
        },
    ];
    for j in 0..4u32 {
        streams.push(Stream {
            channel: 1,
            steps: vec![send(1 + j, 16 * j, 1)],
        });
        streams.push(Stream {
            channel: 1,
            steps: vec![rrc(7 - j, 0, 1).with_deps([Dep {
                stream: 2 + 2 * j,
                step: 0,
            }])],
        });
    }
    RankProgram {
        scratch_chunks: 3,
        streams,
    }
}

/// Steps that differ by strides only in runs shorter than [`MIN_TIMES`], or by
/// non-constant strides, or in count, buffer or op.
fn irregular() -> RankProgram {
    RankProgram {
        scratch_chunks: 0,
        streams: vec![
            Stream {
                channel: 0,
                steps: vec![
                    send(1, 0, 4),
                    send(1, 3, 4),
                    send(1, 7, 4),
                    send(1, 12, 4),
                    send(1, 16, 2),
                    send(1, 20, 4),
                    rrc(1, 24, 4),
                    Step::new(
                        Op::Send {
                            to: 1,
                            src: Loc::output(28),
                        },
                        4,
                    ),
                    send(1, 32, 4),
                    send(1, 36, 4),
                ],
            },
            Stream {
                channel: 0,
                steps: vec![rrc(2, 0, 1)],
            },
            Stream {
                channel: 1,
                steps: vec![rrc(3, 0, 1), rrc(3, 1, 1)],
            },
        ],
    }
}

fn written_steps(w: &WProgram) -> usize {
    w.streams.iter().map(|s| s.steps.len()).sum()
}

fn round_trip(p: &RankProgram) -> WProgram {
    let w = encode(p);
    let text = ron::to_string(&w).expect("serialises");
    let back: WProgram = ron::from_str(&text).expect("parses");
    assert_eq!(back, w, "{text}");
    assert_eq!(back.expand().expect("expands"), *p, "{text}");
    w
}

#[test]
fn deep_templates_compress_and_round_trip() {
    let p = deep();
    let w = round_trip(&p);
    // Two step runs, and two interleaved stream runs of one step each.
    assert_eq!(w.streams.len(), 4, "{w:?}");
    assert_eq!(written_steps(&w), 4);
    let r = w.streams[1].steps[0].repeat.as_ref().expect("a run");
    assert_eq!((r.times, r.src, r.dst), (12, 32, 32));
    assert_eq!(r.deps, vec![DepStride { stream: 0, step: 1 }]);
    let s = w.streams[3].repeat.as_ref().expect("a stream run");
    assert_eq!((s.times, s.every), (4, 2));
    assert_eq!(s.steps[0].from, -1);
    assert_eq!(s.steps[0].deps, vec![DepStride { stream: 2, step: 0 }]);
    let text = ron::to_string(&w).expect("serialises");
    assert!(text.contains("repeat:(times:12,src:32)"), "{text}");
    assert!(
        text.contains("repeat:(times:4,every:2,steps:[(from:-1,deps:[(stream:2,step:0)])])"),
        "{text}"
    );
}

#[test]
fn irregular_steps_are_written_as_before() {
    let p = irregular();
    let w = round_trip(&p);
    assert!(
        w.streams
            .iter()
            .all(|s| s.repeat.is_none() && s.steps.iter().all(|x| x.repeat.is_none())),
        "{w:?}"
    );
    assert_eq!(
        ron::to_string(&w).expect("serialises"),
        ron::to_string(&p).expect("serialises"),
        "a template without runs is written exactly as format 4 wrote it"
    );
}

fn expand_text(text: &str) -> Result<RankProgram, String> {
    let w: WProgram = ron::from_str(text).map_err(|e| e.to_string())?;
    w.expand()
}

#[test]
fn malformed_repeats_are_errors() {
    let step = |repeat: &str| {
        format!(
            "(streams: [(channel: 0, steps: [(op: Send(to: 1, src: (buf: Input, off: 8)), count: 1, deps: [(stream: 1, step: 0)], repeat: ({repeat}))])])"
        )
    };
    assert_eq!(
        expand_text(&step("times: 3, src: 2"))
            .expect("valid")
            .streams[0]
            .steps
            .len(),
        3
    );
    for (repeat, fragment) in [
        ("times: 0", "times is 0"),
        ("times: 1, src: 2", "times is 1"),
        ("times: 2, every: 0", "every is 0"),
        ("times: 3, src: -5", "src 8 moved 2 times by -5"),
        ("times: 3, src: 4294967295", "leaves 0..2^32"),
        ("times: 3, to: -1", "to 1 moved 2 times by -1"),
        ("times: 3, from: 1", "stride for `from` on a send step"),
        ("times: 3, dst: 1", "stride for `dst` on a send step"),
        (
            "times: 3, deps: [(stream: 0, step: -1)]",
            "dependency (stream: 1, step: 0) moved 1 times",
        ),
        (
            "times: 3, deps: [(stream: 0, step: 1), (stream: 0, step: 1)]",
            "2 dependency strides for 1 dependencies",
        ),
        ("times: 3, every: 2", "past the 3 steps"),
        ("times: 4294967295", "at most"),
        ("times: 3, offset: 1", "Unexpected field named `offset`"),
        (
            "times: 3, deps: [(stream: 0)]",
            "Unexpected missing field named `step`",
        ),
    ] {
        let err = expand_text(&step(repeat)).expect_err(repeat);
        assert!(err.contains(fragment), "{repeat}: {err}");
    }
    // Copies that land on another step, or leave a gap.
    let two = |a: &str, b: &str| {
        format!(
            "(streams: [(channel: 0, steps: [(op: Nop, count: 0, repeat: ({a})), (op: Nop, count: 0, repeat: ({b}))])])"
        )
    };
    let ok = expand_text(&two("times: 2, every: 2", "times: 2, every: 2")).expect("valid");
    assert_eq!(ok.streams[0].steps.len(), 4);
    for (a, b, fragment) in [
        (
            "times: 3, every: 2",
            "times: 2, every: 1",
            "which another step fills",
        ),
        ("times: 2, every: 4", "times: 2", "past the 4 steps"),
    ] {
        let err = expand_text(&two(a, b)).expect_err(fragment);
        assert!(err.contains(fragment), "{a} / {b}: {err}");
    }
    // Stream repeats.
    let stream = |repeat: &str| {
        format!(
            "(streams: [(channel: 2, steps: [(op: Send(to: 1, src: (buf: Input, off: 8)), count: 1)], repeat: ({repeat}))])"
        )
    };
    let ok = expand_text(&stream("times: 3, channel: -1, steps: [(to: 1)]")).expect("valid");
    assert_eq!(
        ok.streams.iter().map(|s| s.channel).collect::<Vec<_>>(),
        [2, 1, 0]
    );
    for (repeat, fragment) in [
        ("times: 1", "stream 0: repeat: times is 1"),
        ("times: 4, channel: -1", "channel 2 moved 3 times by -1"),
        (
            "times: 3, steps: [(), ()]",
            "2 step strides for a stream of 1",
        ),
        ("times: 3, steps: [(to: -1)]", "to 1 moved 2 times by -1"),
        ("times: 3, every: 5", "past the 3 streams"),
        ("times: 3, stride: 1", "Unexpected field named `stride`"),
    ] {
        let err = expand_text(&stream(repeat)).expect_err(repeat);
        assert!(err.contains(fragment), "{repeat}: {err}");
    }
    // Too many steps in all, though each repeat is small enough.
    let big = "(streams: [(channel: 0, steps: [(op: Nop, count: 0, repeat: (times: 65536))], repeat: (times: 65536))])";
    let err = expand_text(big).expect_err("too large");
    assert!(err.contains("at most"), "{err}");
}

fn read_symmetry(text: &str) -> Result<Symmetry, String> {
    ron::from_str::<ReadSymmetry>(text)
        .map(|s| s.0)
        .map_err(|e| e.to_string())
}

#[test]
fn rank_runs_round_trip_and_refuse_malformed_runs() {
    use crate::symmetric::Action;
    let n = 64u32;
    for ranks in [
        (0..n).collect::<Vec<_>>(),
        (0..n).rev().collect(),
        (0..n).map(|p| (p % 8) * 8 + p / 8).collect(),
        (0..n).map(|p| (p * 37) % n).collect(),
    ] {
        let sym = Symmetry {
            dims: vec![n],
            actions: vec![Action::Cyclic],
            ranks,
            chunks: None,
        };
        let text = ron::to_string(&SymmetryOut::of(&sym)).expect("serialises");
        assert_eq!(read_symmetry(&text), Ok(sym.clone()), "{text}");
        let runs = rank_runs(&sym.ranks);
        assert_eq!(expand_rank_runs(&runs), Ok(sym.ranks.clone()));
        assert_eq!(
            text.contains("rank_runs"),
            runs.len() * 8 <= sym.ranks.len()
        );
    }
    let identity = Symmetry::ring((0..n).collect(), None);
    assert_eq!(
        ron::to_string(&SymmetryOut::of(&identity)).expect("serialises"),
        "(dims:[64],actions:[Cyclic],rank_runs:[(first:0,times:64)],chunks:None)"
    );
    let with = |field: &str| format!("(dims: [4], actions: [Cyclic], {field} chunks: None)");
    assert_eq!(
        read_symmetry(&with("rank_runs: [(first: 3, times: 4, step: -1)],"))
            .expect("valid")
            .ranks,
        [3, 2, 1, 0]
    );
    for (field, fragment) in [
        ("rank_runs: [(first: 0, times: 0)],", "times is 0"),
        (
            "rank_runs: [(first: 2, times: 4, step: -1)],",
            "leaves 0..2^32",
        ),
        ("rank_runs: [(first: 0, times: 4294967295)],", "at most"),
        ("", "neither `ranks` nor `rank_runs`"),
        (
            "ranks: [0, 1, 2, 3], rank_runs: [(first: 0, times: 4)],",
            "both `ranks` and `rank_runs`",
        ),
        (
            "rank_runs: [(first: 0, times: 4, stride: 1)],",
            "Unexpected field named `stride`",
        ),
    ] {
        let err = read_symmetry(&with(field)).expect_err(field);
        assert!(err.contains(fragment), "{field}: {err}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Any list of ranks round-trips through rank runs.
    #[test]
    fn rank_runs_round_trip(ranks in proptest::collection::vec(0u32..6, 0..40)) {
        proptest::prop_assert_eq!(expand_rank_runs(&rank_runs(&ranks)), Ok(ranks));
    }

    /// Streams of steps drawn from a few strided families (so that runs of every kind
    /// occur, interleaved or not) round-trip through the written form.
    #[test]
    fn random_templates_round_trip(
        streams in proptest::collection::vec(
            (0u32..3, proptest::collection::vec((0u32..3, 0u32..4, 0u32..3), 0..24)),
            0..12,
        ),
    ) {
        let program = RankProgram {
            scratch_chunks: 1,
            streams: streams
                .into_iter()
                .enumerate()
                .map(|(si, (channel, steps))| Stream {
                    channel: channel + si as u32 % 2,
                    steps: steps
                        .into_iter()
                        .enumerate()
                        .map(|(k, (kind, peer, stride))| {
                            let k = k as u32;
                            let off = stride * k + kind;
                            let step = match kind {
                                0 => send(peer, off, 2),
                                1 => rrc(peer + k % 2, off, 2),
                                _ => Step::new(Op::Nop, 0),
                            };
                            if stride == 2 {
                                step.with_deps([Dep { stream: si as u32, step: k / 2 }])
                            } else {
                                step
                            }
                        })
                        .collect(),
                })
                .collect(),
        };
        let w = encode(&program);
        let text = ron::to_string(&w).expect("serialises");
        let back: WProgram = ron::from_str(&text).expect("parses");
        proptest::prop_assert_eq!(back.expand(), Ok(program));
    }
}
