//! Verification on merged chunks: a schedule is run with each *segment* of chunks that no
//! op ever splits as one chunk.
//!
//! # Segments
//! Chunk positions live in *spaces*: the origins (the chunks of the collective buffer, which
//! the symbolic values name), and each rank's input, output and scratch buffers. Positions
//! are *tied* where the run must treat them alike: an op that reads `count` chunks at `src`
//! and writes them at `dst` ties `src.off + t` to `dst.off + t` for every `t < count`; a
//! message ties the position it leaves from to the one it lands at; the collective ties each
//! input chunk to the origin it holds and each output chunk to the origin it must end up
//! holding (AllGather: rank `r`'s input to origins `r·k..`; ReduceScatter: its output to
//! origins `r·k..`; AllToAll: its output block `q` to origins `r·k..`; the others: chunk `j`
//! to origin `j`), an in-place schedule ties the aliased buffers, and where ranks hold blocks
//! of `k` chunks every block of origins is tied to the first. A set of *cut points* per space,
//! holding both ends of every tied or addressed range and closed under the ties (a cut
//! strictly inside a tied range is carried to the other side, until nothing changes), splits
//! every space into segments such that every tie maps whole segments onto whole segments,
//! chunk `t` of a segment onto chunk `t` of its image, and all blocks alike.
//!
//! # Why the verdict is the same
//! Fix `t` and look at chunk `t` of every segment (those long enough to have one): the full
//! run moves, reduces and checks these chunks exactly as the merged run, in which each segment
//! is one chunk, moves its segments: the same steps touch them in the same order, with the
//! same messages and contributor sets, and origin `k + t` (`k` the first chunk of an origin
//! segment) plays the part of the merged run's origin "that segment", in the inputs as in
//! the outputs' postcondition. So the full run reads uninitialised data, reduces mismatched or
//! overlapping contributions, races, overlaps a copy's source and destination, or misses the
//! postcondition at some chunk exactly where the merged run does at its segment; deadlock
//! depends on steps and connections alone, which merging keeps as they are. The header, the
//! size limits and the structure are checked on the schedule itself first; a merged run that
//! finds any error is thrown away and the schedule runs whole, so that errors name its own
//! chunks. (A run over fewer chunks holds fewer contributor sets: a schedule so large that
//! its full run would stop at [`super::MAX_SET_WORDS`] can verify merged.)
//!
//! The packed trees that win Broadcast and Reduce at large sizes move pieces of dozens of
//! chunks (DGX-1: 131k to 161k chunks a buffer, one or two thousand segments), as does the
//! flow AllToAll (131k chunks, 6k segments); the verifier would otherwise model them chunk by
//! chunk. Pipelines that move one chunk per step (the rail schedules) gain nothing and are
//! run whole.

use super::Report;
use super::Sink;
use super::sim;
use super::structure::Layout;
use crate::dag::ConnKey;
use crate::schedule::{Buf, Collective, Loc, Schedule, Step};
use rustc_hash::FxHashMap;

/// Whether merging must at least halve the chunks modelled to be worth a copy of the schedule.
const LEAST_GAIN: u64 = 2;
/// Rounds of carrying cuts across ties after which merging is given up (each round that
/// changes something adds a cut; real schedules settle in a few).
const MAX_ROUNDS: usize = 8;

/// The verdict of the merged run of `schedule` (already checked for its header, limits and
/// structure, whose `layout` the merged schedule shares: the same ranks, streams, steps and
/// connections): `Some` when merging applies, halves the chunks and finds no error; `None`
/// otherwise (the caller then runs the schedule whole).
pub(super) fn verified(schedule: &Schedule, layout: &Layout) -> Option<Report> {
    let (merged, chunks_sent) = merge(schedule)?;
    let mut sink = Sink::default();
    let stats = sim::simulate(&merged, layout, &mut sink, false, None);
    (sink.total() == 0).then(|| Report {
        ranks: schedule.nranks,
        streams: layout.streams.stream_count(),
        steps: schedule.step_count(),
        connections: layout.conns.len(),
        messages: stats.messages,
        chunks_sent,
        reductions: stats.reductions,
        depth: stats.depth,
    })
}

/// A range tied to another: `count` positions from `a` in space `sa` and from `b` in `sb`.
#[derive(Clone, Copy)]
struct Tie {
    sa: usize,
    a: u32,
    sb: usize,
    b: u32,
    count: u32,
}

/// Space 0: the origins (chunks of the collective buffer); rank `r`'s input, output and
/// scratch: `1 + 3r`, `2 + 3r`, `3 + 3r`.
fn space(r: usize, buf: Buf) -> usize {
    1 + 3 * r
        + match buf {
            Buf::Input => 0,
            Buf::Output => 1,
            Buf::Scratch => 2,
        }
}

/// The spaces of a schedule: each one's extent, and the ties between them.
struct Spaces {
    extent: Vec<u32>,
    ties: Vec<Tie>,
}

impl Spaces {
    fn tie(&mut self, (sa, a): (usize, u32), (sb, b): (usize, u32), count: u32) {
        if (sa, a) != (sb, b) && count > 0 {
            self.ties.push(Tie {
                sa,
                a,
                sb,
                b,
                count,
            });
        }
    }

    /// The spaces with what the collective ties: where inputs come from and outputs must end
    /// up (in origins), the in-place aliases, and (where ranks hold blocks of `k` chunks)
    /// every block of origins to the first, so that all blocks merge alike.
    fn of_collective(s: &Schedule) -> Spaces {
        let (n, chunks) = (s.nranks, s.chunks);
        let mut sp = Spaces {
            extent: vec![0; 1 + 3 * s.ranks.len()],
            ties: Vec::new(),
        };
        sp.extent[0] = chunks;
        let k = chunks / n.max(1);
        for r in 0..s.ranks.len() {
            let (i, o, rk) = (space(r, Buf::Input), space(r, Buf::Output), r as u32 * k);
            sp.extent[i] = s.input_chunks;
            sp.extent[o] = s.output_chunks;
            match s.collective {
                Collective::AllGather => {
                    sp.tie((i, 0), (0, rk), k);
                    sp.tie((o, 0), (0, 0), chunks);
                }
                Collective::ReduceScatter => {
                    sp.tie((i, 0), (0, 0), chunks);
                    sp.tie((o, 0), (0, rk), k);
                }
                Collective::AllToAll => {
                    sp.tie((i, 0), (0, 0), chunks);
                    for q in 0..n {
                        sp.tie((o, q * k), (0, rk), k);
                    }
                }
                Collective::AllReduce
                | Collective::Broadcast { .. }
                | Collective::Reduce { .. } => {
                    sp.tie((i, 0), (0, 0), chunks);
                    sp.tie((o, 0), (0, 0), chunks);
                }
            }
            if s.in_place {
                match s.collective {
                    Collective::AllGather => sp.tie((i, 0), (o, rk), k),
                    Collective::ReduceScatter => sp.tie((o, 0), (i, rk), k),
                    _ => sp.tie((o, 0), (i, 0), s.output_chunks),
                }
            }
        }
        if matches!(
            s.collective,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll
        ) {
            for q in 1..n {
                sp.tie((0, q * k), (0, 0), k);
            }
        }
        sp
    }

    /// Adds what the ops tie (each op's source and destination; each message's two ends);
    /// returns the chunks the messages carry.
    fn add_ops(&mut self, s: &Schedule) -> u64 {
        // Per connection, where its messages leave and land (space, offset, count), in order.
        type End = (usize, u32, u32);
        let mut ends: FxHashMap<ConnKey, (Vec<End>, Vec<End>)> = FxHashMap::default();
        let mut chunks_sent = 0u64;
        for (r, prog) in s.ranks.iter().enumerate() {
            for stream in &prog.streams {
                for step in &stream.steps {
                    let (src, dst) = (step.op.src(), step.op.dst());
                    let Some(l) = src.or(dst) else { continue };
                    if let (Some(a), Some(b)) = (src, dst) {
                        self.tie(
                            (space(r, a.buf), a.off),
                            (space(r, b.buf), b.off),
                            step.count,
                        );
                    }
                    let end = (space(r, l.buf), l.off, step.count);
                    if let Some(to) = step.op.send_peer() {
                        ends.entry((r as u32, to, stream.channel))
                            .or_default()
                            .0
                            .push(end);
                        chunks_sent += u64::from(step.count);
                    }
                    if let Some(from) = step.op.recv_peer() {
                        ends.entry((from, r as u32, stream.channel))
                            .or_default()
                            .1
                            .push(end);
                    }
                }
            }
        }
        for (sent, received) in ends.values() {
            // The structure check paired them one to one with equal counts.
            for (&(sa, a, count), &(sb, b, _)) in sent.iter().zip(received) {
                self.tie((sa, a), (sb, b), count);
            }
        }
        chunks_sent
    }

    /// The scratch each rank addresses, and the cut points at both ends of every op's range;
    /// `None` where these alone leave too many segments to pay ([`pays`]): cuts only grow, so
    /// pipelines that move one chunk per step are given up before any tie is built.
    fn op_cuts(&mut self, s: &Schedule) -> Option<Vec<Cuts>> {
        for (r, step) in steps(s) {
            for (x, _, end) in ranges(r, step) {
                if x == space(r, Buf::Scratch) {
                    // Inside its buffer: the structure check has seen to it.
                    self.extent[x] = self.extent[x].max(end);
                }
            }
        }
        let mut cuts: Vec<Cuts> = self.extent.iter().map(|&e| Cuts::new(e)).collect();
        for (r, step) in steps(s) {
            for (x, a, z) in ranges(r, step) {
                cuts[x].set(a);
                cuts[x].set(z);
            }
        }
        pays(&cuts).then_some(cuts)
    }

    /// `cuts` with both ends of every tied range, closed under the ties ([`settle`]), ready
    /// for [`Cuts::rank`]; `None` where they do not settle or stop paying.
    fn settle_cuts(&self, mut cuts: Vec<Cuts>) -> Option<Vec<Cuts>> {
        for t in &self.ties {
            for (x, p) in [(t.sa, t.a), (t.sb, t.b)] {
                cuts[x].set(p);
                cuts[x].set(p + t.count);
            }
        }
        settle(&mut cuts, &self.ties)?;
        for c in &mut cuts {
            c.rank_words();
        }
        Some(cuts)
    }
}

/// Every step of `s` with its rank.
fn steps(s: &Schedule) -> impl Iterator<Item = (usize, &Step)> {
    s.ranks.iter().enumerate().flat_map(|(r, prog)| {
        prog.streams
            .iter()
            .flat_map(|st| &st.steps)
            .map(move |step| (r, step))
    })
}

/// The ranges `step` of rank `r` addresses: (space, first position, end).
fn ranges(r: usize, step: &Step) -> impl Iterator<Item = (usize, u32, u32)> + '_ {
    [step.op.src(), step.op.dst()]
        .into_iter()
        .flatten()
        .map(move |l| (space(r, l.buf), l.off, l.off + step.count))
}

/// Whether the segments of `cuts` at least halve ([`LEAST_GAIN`]) the chunks a run models
/// (every rank's buffers; the origins are not modelled).
fn pays(cuts: &[Cuts]) -> bool {
    let (before, after) = cuts[1..].iter().fold((0u64, 0u64), |(b, a), c| {
        (b + u64::from(c.extent), a + c.count())
    });
    after * LEAST_GAIN <= before
}

/// `schedule` (structurally valid) with every segment merged into one chunk (see the module
/// docs), and the chunks its messages carry; `None` where merging does not settle, would not
/// halve the chunks modelled, or leaves blocks of unequal length.
pub(super) fn merge(schedule: &Schedule) -> Option<(Schedule, u64)> {
    let mut spaces = Spaces::of_collective(schedule);
    let cuts = spaces.op_cuts(schedule)?;
    let chunks_sent = spaces.add_ops(schedule);
    let cuts = spaces.settle_cuts(cuts)?;
    if !pays(&cuts) {
        return None;
    }
    let extent = &spaces.extent;
    let index = |s: usize, p: u32| cuts[s].rank(p);
    let merged_chunks = index(0, schedule.chunks);
    let (input, output) = schedule
        .collective
        .buffer_chunks(schedule.nranks, merged_chunks)?;
    let mut merged = schedule.clone();
    merged.chunks = merged_chunks;
    merged.input_chunks = input;
    merged.output_chunks = output;
    for (r, prog) in merged.ranks.iter_mut().enumerate() {
        let length = |buf: Buf| index(space(r, buf), extent[space(r, buf)]);
        if (length(Buf::Input), length(Buf::Output)) != (input, output) {
            return None;
        }
        // What it addresses of its scratch (the rest is never touched).
        prog.scratch_chunks = length(Buf::Scratch);
        for step in prog.streams.iter_mut().flat_map(|st| &mut st.steps) {
            let Some(l) = step.op.src().or(step.op.dst()) else {
                continue;
            };
            let s = space(r, l.buf);
            step.count = index(s, l.off + step.count) - index(s, l.off);
            let moved = |l: Loc| Loc::new(l.buf, index(space(r, l.buf), l.off));
            step.op = step.op.map_locs(moved, moved);
        }
    }
    Some((merged, chunks_sent))
}

/// Carries cuts across `ties` until none adds one. `None` (merging given up) once the cuts
/// stop paying ([`pays`]; they only grow), or after [`MAX_ROUNDS`]: so it
/// costs at most that many passes over the ties' ranges, a word of 64 positions at a time,
/// plus the cuts it finds, each below half the positions.
fn settle(cuts: &mut [Cuts], ties: &[Tie]) -> Option<()> {
    let mut inside: Vec<u32> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let mut changed = false;
        for t in ties {
            for (from, a, to, b) in [(t.sa, t.a, t.sb, t.b), (t.sb, t.b, t.sa, t.a)] {
                inside.clear();
                cuts[from].within(a + 1, a + t.count, &mut inside);
                for &p in &inside {
                    changed |= cuts[to].set(b + (p - a));
                }
            }
        }
        if !changed {
            return Some(());
        }
        if !pays(cuts) {
            return None;
        }
    }
    None
}

/// The cut points of one space, `0..=extent`, as a bitset (0 and the extent always cut).
struct Cuts {
    words: Vec<u64>,
    extent: u32,
    /// Per word, the cuts in the words before it ([`Cuts::rank_words`]).
    before: Vec<u32>,
}

impl Cuts {
    fn new(extent: u32) -> Cuts {
        let mut c = Cuts {
            words: vec![0; extent as usize / 64 + 1],
            extent,
            before: Vec::new(),
        };
        c.set(0);
        c.set(extent);
        c
    }

    /// Cuts at `p`; whether it was not cut before.
    fn set(&mut self, p: u32) -> bool {
        let (w, bit) = ((p / 64) as usize, 1u64 << (p % 64));
        let new = self.words[w] & bit == 0;
        self.words[w] |= bit;
        new
    }

    /// The cuts below the extent: the segments of the space.
    fn count(&self) -> u64 {
        let all: u32 = self.words.iter().map(|w| w.count_ones()).sum();
        u64::from(all) - 1
    }

    /// Appends the cuts in `lo..hi` to `out`.
    fn within(&self, lo: u32, hi: u32, out: &mut Vec<u32>) {
        if lo >= hi {
            return;
        }
        let (first, last) = ((lo / 64) as usize, ((hi - 1) / 64) as usize);
        for w in first..=last {
            let mut bits = self.words[w];
            if w == first {
                bits &= !0u64 << (lo % 64);
            }
            if w == last && !hi.is_multiple_of(64) {
                bits &= !(!0u64 << (hi % 64));
            }
            while bits != 0 {
                out.push(w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
    }

    /// Counts the cuts before each word, for [`Cuts::rank`] (once the cuts are final).
    fn rank_words(&mut self) {
        let mut before = 0u32;
        self.before = self
            .words
            .iter()
            .map(|w| {
                let b = before;
                before += w.count_ones();
                b
            })
            .collect();
    }

    /// The segments that start before position `p` (at a cut: the index of the segment it
    /// starts; at the extent: every segment).
    fn rank(&self, p: u32) -> u32 {
        let (w, bit) = ((p / 64) as usize, p % 64);
        self.before[w] + (self.words[w] & ((1u64 << bit) - 1)).count_ones()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Op, RankProgram, Step, Stream};
    use crate::verify::{verify_report, verify_report_unmerged};

    fn step(op: Op, count: u32) -> Step {
        Step {
            op,
            count,
            deps: Vec::new(),
        }
    }

    /// Two ranks' AllReduce over 12 chunks: rank 1 sends chunks 0..8 to rank 0, which reduces
    /// them into its scratch at 2..10, copies the sums to its output and sends them back;
    /// chunks 8..12 go the same way unstaged. `cut_at`: also copy one scratch chunk back over
    /// itself through the output, cutting a segment in two across the shifted tie.
    fn staged(cut_at: Option<u32>) -> Schedule {
        let (i, o, s) = (
            Loc::new(Buf::Input, 0),
            Loc::new(Buf::Output, 0),
            Loc::scratch(0),
        );
        let at = |l: Loc, off: u32| Loc::new(l.buf, off);
        let mut zero = vec![
            step(
                Op::RecvReduceCopy {
                    from: 1,
                    src: i,
                    dst: at(s, 2),
                },
                8,
            ),
            step(
                Op::Copy {
                    src: at(s, 2),
                    dst: o,
                },
                8,
            ),
            step(Op::Send { to: 1, src: o }, 8),
            step(
                Op::RecvReduceCopy {
                    from: 1,
                    src: at(i, 8),
                    dst: at(o, 8),
                },
                4,
            ),
            step(
                Op::Send {
                    to: 1,
                    src: at(o, 8),
                },
                4,
            ),
        ];
        if let Some(c) = cut_at {
            zero.insert(
                2,
                step(
                    Op::Copy {
                        src: at(o, c),
                        dst: at(s, c + 2),
                    },
                    1,
                ),
            );
        }
        let one = vec![
            step(Op::Send { to: 0, src: i }, 8),
            step(Op::Recv { from: 0, dst: o }, 8),
            step(
                Op::Send {
                    to: 0,
                    src: at(i, 8),
                },
                4,
            ),
            step(
                Op::Recv {
                    from: 0,
                    dst: at(o, 8),
                },
                4,
            ),
        ];
        let mut s = Schedule::empty(Collective::AllReduce, 2, 12, false).unwrap();
        s.ranks = [(10, zero), (0, one)]
            .into_iter()
            .map(|(scratch_chunks, steps)| RankProgram {
                scratch_chunks,
                streams: vec![Stream { channel: 0, steps }],
            })
            .collect();
        s
    }

    #[test]
    fn segments_follow_cuts_across_shifted_ties() {
        // Collective buffer: cuts 0, 8, 12; scratch 2, 10: two segments each (rank 0's
        // scratch 0..2 is never touched).
        let s = staged(None);
        let (merged, sent) = merge(&s).expect("merges");
        assert_eq!(
            (merged.chunks, merged.ranks[0].scratch_chunks, sent),
            (2, 2, 24)
        );
        // A cut at 3 in the buffer is carried to 5 in the scratch and back: segments 0..3,
        // 3..4, 4..8, 8..12.
        let s = staged(Some(3));
        let (merged, _) = merge(&s).expect("merges");
        assert_eq!(merged.chunks, 4);
        let first = &merged.ranks[0].streams[0].steps[0];
        assert_eq!((first.count, first.op.dst().map(|l| l.off)), (3, Some(1)));
        for s in [staged(None), staged(Some(3)), staged(Some(6))] {
            assert!(verify_report(&s).is_ok());
            assert_eq!(verify_report(&s), verify_report_unmerged(&s));
        }
    }

    #[test]
    fn errors_are_those_of_every_chunk() {
        // The reply lands one chunk off: output chunks 1..9 of rank 1 hold sums of 0..8.
        let mut s = staged(None);
        s.ranks[1].streams[0].steps[1].op = Op::Recv {
            from: 0,
            dst: Loc::new(Buf::Output, 1),
        };
        s.ranks[1].streams[0].steps[1].count = 7;
        s.ranks[0].streams[0].steps[2].count = 7;
        let errors = verify_report(&s).expect_err("misplaced");
        assert_eq!(Err(errors), verify_report_unmerged(&s));
    }

    #[test]
    fn blocks_merge_alike() {
        // An AllGather of 2 ranks × 6 chunks whose rank 1 sends its block in pieces of 2 and
        // 4 and rank 0 in one: every block is cut like rank 1's (origins 0, 2, 6, 8, 12).
        let (i, o) = (Loc::new(Buf::Input, 0), Loc::new(Buf::Output, 0));
        let at = |l: Loc, off: u32| Loc::new(l.buf, off);
        let zero = vec![
            step(Op::Copy { src: i, dst: o }, 6),
            step(Op::Send { to: 1, src: i }, 6),
            step(
                Op::Recv {
                    from: 1,
                    dst: at(o, 6),
                },
                2,
            ),
            step(
                Op::Recv {
                    from: 1,
                    dst: at(o, 8),
                },
                4,
            ),
        ];
        let one = vec![
            step(
                Op::Copy {
                    src: i,
                    dst: at(o, 6),
                },
                6,
            ),
            step(Op::Send { to: 0, src: i }, 2),
            step(
                Op::Send {
                    to: 0,
                    src: at(i, 2),
                },
                4,
            ),
            step(Op::Recv { from: 0, dst: o }, 6),
        ];
        let mut s = Schedule::empty(Collective::AllGather, 2, 12, false).unwrap();
        s.ranks = [zero, one]
            .into_iter()
            .map(|steps| RankProgram {
                scratch_chunks: 0,
                streams: vec![Stream { channel: 0, steps }],
            })
            .collect();
        let (merged, _) = merge(&s).expect("merges");
        assert_eq!((merged.chunks, merged.input_chunks), (4, 2));
        assert!(verify_report(&s).is_ok());
        assert_eq!(verify_report(&s), verify_report_unmerged(&s));
    }
}
