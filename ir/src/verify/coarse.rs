//! Verification on merged chunks: a schedule is run with each *segment* of chunks that no
//! op ever splits as one chunk, when its collective lets chunk positions carry over.
//!
//! # Segments
//! Chunk positions live in *spaces*: the collective buffer (every rank's input and output:
//! input chunk `j` holds original chunk `j`, and output chunk `j` must end up holding it), and
//! each rank's scratch buffer. An op that reads `count` chunks at `src` and writes them at
//! `dst` ties position `src.off + t` of one space to `dst.off + t` of the other, for every
//! `t < count`; a message ties the position it left from to the one it lands at, the same way.
//! A set of *cut points* per space, holding both ends of every range and closed under these
//! ties (a cut strictly inside a tied range is carried to the other side, until nothing
//! changes), splits every space into segments such that every op and message maps whole
//! segments onto whole segments, chunk `t` of a segment onto chunk `t` of its image.
//!
//! # Why the verdict is the same
//! Fix `t` and look at chunk `t` of every segment (those long enough to have one): the full
//! run moves, reduces and checks these chunks exactly as the merged run, in which each segment
//! is one chunk, moves its segments: the same steps touch them in the same order, with the
//! same messages and contributor sets, and original chunk `k + t` of the collective buffer
//! (`k` a segment's first chunk) plays the part of the merged run's original chunk "that
//! segment". So the full run reads uninitialised data, reduces mismatched or overlapping
//! contributions, races, overlaps a copy's source and destination, or misses the
//! postcondition at some chunk exactly where the merged run does at its segment; deadlock
//! depends on steps and connections alone, which merging keeps as they are. The header, the
//! size limits and the structure are checked on the schedule itself first; a merged run that
//! finds any error is thrown away and the schedule runs whole, so that errors name its own
//! chunks. (A run over fewer chunks holds fewer contributor sets: a schedule so large that
//! its full run would stop at [`super::MAX_SET_WORDS`] can verify merged.)
//!
//! It applies to AllReduce, Broadcast and Reduce, whose output chunk `j` is made of input
//! chunk `j` (in AllGather, ReduceScatter and AllToAll a rank's chunks are other ranks'
//! shifted, which this does not model). The packed trees that win Broadcast and Reduce at
//! large sizes move pieces of dozens of chunks (DGX-1: 131k to 161k chunks a buffer, a few
//! thousand segments), which the verifier would otherwise model chunk by chunk.

use super::Report;
use super::Sink;
use super::sim;
use super::structure::Layout;
use crate::dag::ConnKey;
use crate::schedule::{Buf, Collective, Loc, Schedule};
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

/// `schedule` (structurally valid) with every segment merged into one chunk (see the module
/// docs), and the chunks its messages carry; `None` where merging does not apply, does not
/// settle, or would not halve the chunks modelled.
pub(super) fn merge(schedule: &Schedule) -> Option<(Schedule, u64)> {
    match schedule.collective {
        Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => {}
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => return None,
    }
    let chunks = schedule.chunks;
    if schedule.input_chunks != chunks || schedule.output_chunks != chunks {
        return None;
    }
    // Space 0: the collective buffer; space 1 + r: rank r's scratch.
    let space = |r: usize, l: Loc| match l.buf {
        Buf::Input | Buf::Output => 0,
        Buf::Scratch => 1 + r,
    };
    let mut extent = vec![0u32; 1 + schedule.ranks.len()];
    extent[0] = chunks;
    let mut ties: Vec<Tie> = Vec::new();
    // Per connection, where its messages leave and land (space, offset, count), in order.
    type End = (usize, u32, u32);
    let mut ends: FxHashMap<ConnKey, (Vec<End>, Vec<End>)> = FxHashMap::default();
    let mut chunks_sent = 0u64;
    for (r, prog) in schedule.ranks.iter().enumerate() {
        for stream in &prog.streams {
            for step in &stream.steps {
                let (src, dst) = (step.op.src(), step.op.dst());
                let Some(at) = src.or(dst) else { continue };
                for l in [src, dst].into_iter().flatten() {
                    let s = space(r, l);
                    // Inside its buffer: the structure check has seen to it.
                    extent[s] = extent[s].max(l.off + step.count);
                }
                if let (Some(s), Some(d)) = (src, dst) {
                    ties.push(Tie {
                        sa: space(r, s),
                        a: s.off,
                        sb: space(r, d),
                        b: d.off,
                        count: step.count,
                    });
                }
                let end = (space(r, at), at.off, step.count);
                if let Some(to) = step.op.send_peer() {
                    let key = (r as u32, to, stream.channel);
                    ends.entry(key).or_default().0.push(end);
                    chunks_sent += u64::from(step.count);
                }
                if let Some(from) = step.op.recv_peer() {
                    let key = (from, r as u32, stream.channel);
                    ends.entry(key).or_default().1.push(end);
                }
            }
        }
    }
    for (sent, received) in ends.values() {
        // The structure check paired them one to one with equal counts.
        for (&(sa, a, count), &(sb, b, _)) in sent.iter().zip(received) {
            ties.push(Tie {
                sa,
                a,
                sb,
                b,
                count,
            });
        }
    }
    ties.retain(|t| (t.sa, t.a) != (t.sb, t.b));
    let mut cuts: Vec<Cuts> = extent.iter().map(|&e| Cuts::new(e)).collect();
    for (r, prog) in schedule.ranks.iter().enumerate() {
        for step in prog.streams.iter().flat_map(|st| &st.steps) {
            for l in [step.op.src(), step.op.dst()].into_iter().flatten() {
                let c = &mut cuts[space(r, l)];
                c.set(l.off);
                c.set(l.off + step.count);
            }
        }
    }
    settle(&mut cuts, &ties)?;
    let index: Vec<Vec<u32>> = cuts.iter().map(Cuts::index).collect();
    let before: u64 = extent.iter().map(|&e| u64::from(e)).sum();
    let after: u64 = index
        .iter()
        .zip(&extent)
        .map(|(ix, &e)| u64::from(ix[e as usize]))
        .sum();
    if after * LEAST_GAIN > before {
        return None;
    }
    let mut merged = schedule.clone();
    let merged_chunks = index[0][chunks as usize];
    merged.chunks = merged_chunks;
    merged.input_chunks = merged_chunks;
    merged.output_chunks = merged_chunks;
    for (r, prog) in merged.ranks.iter_mut().enumerate() {
        // What it addresses of its scratch (the rest is never touched).
        prog.scratch_chunks = index[1 + r][extent[1 + r] as usize];
        for step in prog.streams.iter_mut().flat_map(|st| &mut st.steps) {
            let Some(at) = step.op.src().or(step.op.dst()) else {
                continue;
            };
            let ix = &index[space(r, at)];
            step.count = ix[(at.off + step.count) as usize] - ix[at.off as usize];
            let moved = |l: Loc| Loc::new(l.buf, index[space(r, l)][l.off as usize]);
            step.op = step.op.map_locs(moved, moved);
        }
    }
    Some((merged, chunks_sent))
}

/// Carries cuts across `ties` until none adds one. `None` (merging given up) once the cuts
/// are too many to merge by [`LEAST_GAIN`] (they only grow), or after [`MAX_ROUNDS`]: so it
/// costs at most that many passes over the ties' ranges, a word of 64 positions at a time,
/// plus the cuts it finds, each below half the positions.
fn settle(cuts: &mut [Cuts], ties: &[Tie]) -> Option<()> {
    let positions: u64 = cuts.iter().map(|c| u64::from(c.extent)).sum();
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
        let segments: u64 = cuts.iter().map(Cuts::count).sum();
        if segments * LEAST_GAIN > positions {
            return None;
        }
    }
    None
}

/// The cut points of one space, `0..=extent`, as a bitset (0 and the extent always cut).
struct Cuts {
    words: Vec<u64>,
    extent: u32,
}

impl Cuts {
    fn new(extent: u32) -> Cuts {
        let mut c = Cuts {
            words: vec![0; extent as usize / 64 + 1],
            extent,
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

    /// Per position `p` in `0..=extent`: the segments that start before it (at a cut `p` is
    /// the index of the segment it starts).
    fn index(&self) -> Vec<u32> {
        let mut ix = Vec::with_capacity(self.extent as usize + 1);
        let mut segments = 0u32;
        for p in 0..=self.extent {
            ix.push(segments);
            if p < self.extent && self.words[(p / 64) as usize] & (1 << (p % 64)) != 0 {
                segments += 1;
            }
        }
        ix
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
    fn collectives_that_move_chunks_between_ranks_are_not_merged() {
        let s = Schedule::empty(Collective::AllGather, 2, 4, false).unwrap();
        assert!(merge(&s).is_none());
    }
}
