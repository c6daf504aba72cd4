//! The command list of a lowering as it is emitted: event records and waits (a wait a queue
//! already passed is skipped), and copies and reductions merged with the previous command of
//! their queue when they continue it.

use super::cmds::{Cmd, Span};
use std::collections::BTreeMap;

pub(super) struct Emitter {
    pub(super) cmds: Vec<Cmd>,
    pub(super) events: u32,
    /// Work commands issued per queue so far (positions for wait deduplication).
    pub(super) queue_len: Vec<u32>,
    /// Per queue: for each other queue, the highest position already waited for.
    pub(super) waited: Vec<BTreeMap<u32, u32>>,
}

impl Emitter {
    pub(super) fn record(&mut self, q: u32) -> u32 {
        let e = self.events;
        self.events += 1;
        self.cmds.push(Cmd::Record { queue: q, event: e });
        e
    }

    /// `q` waits on event `ev` recorded on `src` at position `pos` (`u32::MAX`: never skip).
    pub(super) fn wait(&mut self, q: u32, ev: u32, src: u32, pos: u32) {
        let w = &mut self.waited[q as usize];
        if pos != u32::MAX && w.get(&src).is_some_and(|&p| p >= pos) {
            return;
        }
        if pos != u32::MAX {
            w.insert(src, pos);
        }
        self.cmds.push(Cmd::Wait {
            queue: q,
            event: ev,
        });
    }

    pub(super) fn copy(&mut self, q: u32, dst: Span, src: Span) {
        if dst.len == 0 || dst == src {
            return;
        }
        // Merge with the previous copy on the same queue when both sides continue it.
        if let Some(Cmd::Copy {
            queue,
            dst: pd,
            src: ps,
        }) = self.cmds.last_mut()
            && *queue == q
            && pd.mem == dst.mem
            && ps.mem == src.mem
            && pd.off + pd.len == dst.off
            && ps.off + ps.len == src.off
            && !(pd.with_len(pd.len + dst.len)).overlaps(&ps.with_len(ps.len + src.len))
        {
            pd.len += dst.len;
            ps.len += src.len;
            return;
        }
        self.cmds.push(Cmd::Copy { queue: q, dst, src });
        self.queue_len[q as usize] += 1;
    }

    pub(super) fn reduce(&mut self, q: u32, dst: Span, a: Span, b: Span) {
        if dst.len == 0 {
            return;
        }
        if let Some(Cmd::Reduce {
            queue,
            dst: pd,
            a: pa,
            b: pb,
        }) = self.cmds.last_mut()
            && *queue == q
            && [(&*pd, &dst), (&*pa, &a), (&*pb, &b)]
                .iter()
                .all(|(p, c)| p.mem == c.mem && p.off + p.len == c.off)
        {
            let (nd, na, nb) = (pd.at(0), pa.at(0), pb.at(0));
            let grow = |s: Span, by: usize| Span {
                len: s.len + by,
                ..s
            };
            let (gd, ga, gb) = (grow(nd, dst.len), grow(na, a.len), grow(nb, b.len));
            let ok = |x: &Span| *x == gd || !x.overlaps(&gd);
            if ok(&ga) && ok(&gb) {
                *pd = gd;
                *pa = ga;
                *pb = gb;
                return;
            }
        }
        self.cmds.push(Cmd::Reduce {
            queue: q,
            dst,
            a,
            b,
        });
        self.queue_len[q as usize] += 1;
    }
}
