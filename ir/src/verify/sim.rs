//! The simulation: runs a structurally valid schedule under the executor semantics of
//! [`crate::schedule`] on symbolic values, finding deadlocks, reads of uninitialised data,
//! wrong reductions and, at the end, postcondition violations.

use super::structure::{Layout, step_error};
use super::value::{Ranks, Sets, Value};
use super::{ErrorKind, Sink, VerifyError};
use crate::schedule::{Buf, CONNECTION_SLOTS, Collective, Loc, Op, Rank, Schedule, StepRef};
use crate::symmetric::{SymmetryTable, Translation};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// A run over a rank-symmetric schedule's quotient (see [`super::quotient`]): only `rank`'s
/// program (the template) runs, every connection's two ends are template streams, and a
/// message received from a peer is what that peer sent, translated to the receiver.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quot<'a> {
    pub table: &'a SymmetryTable,
    /// The rank at grid position 0, whose program the template is.
    pub rank: Rank,
}

/// How the caller's buffers overlap (see the module docs of [`crate::schedule`]).
#[derive(Debug, Clone, Copy)]
enum Alias {
    /// Input and output are separate.
    None,
    /// Output is input (AllReduce, Broadcast, Reduce, AllToAll in place).
    OutputIsInput,
    /// Input is output[`r·k` ..] (AllGather in place).
    InputInOutput { k: u32 },
    /// Output is input[`r·k` ..] (ReduceScatter in place).
    OutputInInput { k: u32 },
}

const IN: usize = 0;
const OUT: usize = 1;
const SCRATCH: usize = 2;
/// "No step": a slot never written, or no read since the last write. Global step indices
/// are below `2^31` ([`super::MAX_WORK`] bounds the steps), so the top bit is free.
const NONE: u32 = u32::MAX;
/// Marks [`Access::read`] as an index into [`Sim::reads`] (several streams read the slot).
const MULTI: u32 = 1 << 31;

/// One rank's memory: the storage behind input, output and scratch, and the last writer
/// (global step index) of the slots the postcondition looks at.
struct Mem {
    vals: [Vec<Value>; 3],
    /// Last writer of each slot of the store the output lives in, on ranks with a single
    /// stream (empty elsewhere; ranks with several streams find it in `acc`).
    writer: [Vec<u32>; 3],
    /// Access history for the race check; empty on ranks with a single stream.
    acc: [Vec<Access>; 3],
}

/// Who touched a slot last, as global step indices: the last write and the reads since
/// (the latest read of each stream, in the order the streams last read).
#[derive(Debug, Clone, Copy)]
pub(super) struct Access {
    /// The last write, or [`NONE`].
    write: u32,
    /// [`NONE`] (no read since the write), the step of the only stream that read since, or
    /// `MULTI | i`: the reads are `Sim::reads[i]`.
    read: u32,
}

impl Default for Access {
    fn default() -> Access {
        Access {
            write: NONE,
            read: NONE,
        }
    }
}

/// The step being executed, for the race check.
#[derive(Debug, Clone, Copy, Default)]
struct Cur {
    gs: usize,
    /// Global step index.
    g: u32,
    /// Whether a race was already reported for this step.
    raced: bool,
}

/// What a blocked stream waits on.
#[derive(Debug, Clone, Copy)]
enum Blocker {
    /// Step `step` of global stream `target` (same rank) to complete.
    Dep { target: usize, step: u32 },
    /// A message on connection `conn`.
    Recv { conn: usize },
    /// A free slot on connection `conn`.
    Send { conn: usize },
}

struct StreamState {
    pc: usize,
    depth: u32,
    queued: bool,
    blocked: Option<Blocker>,
    /// (pc the waiter needs this stream to reach, waiting global stream).
    waiters: Vec<(usize, usize)>,
}

struct Msg {
    vals: Vec<Value>,
    depth: u32,
    /// The sender's run the message was read from (or written to, for a relay without a
    /// source): in a quotient run, how a sender translated to another rank orders its lanes.
    lane: Option<Loc>,
}

/// Counters gathered while simulating.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SimStats {
    pub messages: u64,
    pub chunks_sent: u64,
    pub reductions: u64,
    pub depth: u32,
}

struct Sim<'a> {
    s: &'a Schedule,
    layout: &'a Layout,
    alias: Alias,
    mem: Vec<Mem>,
    streams: Vec<StreamState>,
    queues: Vec<VecDeque<Msg>>,
    step_depth: Vec<u32>,
    work: Vec<usize>,
    stats: SimStats,
    /// Vector clock (over the streams of its rank) of each global stream; empty on ranks with
    /// a single stream.
    vc: Vec<Vec<u32>>,
    /// Global steps that some dependency names, with their clocks once they ran.
    snapshots: FxHashMap<usize, Option<Vec<u32>>>,
    cur: Cur,
    /// Global stream of each global step (for the race check).
    step_stream: Vec<u32>,
    /// Read lists of slots read by several streams since their last write ([`MULTI`]).
    reads: Vec<Vec<u32>>,
    /// Unused entries of `reads`.
    free_reads: Vec<u32>,
    /// The contributor sets.
    sets: Sets,
    /// Set when the contributor sets outgrew [`super::MAX_SET_WORDS`]: the run stopped.
    aborted: bool,
    /// The symmetry, in a quotient run.
    quot: Option<Quot<'a>>,
    /// Translated sets, keyed by (set, translating position), in a quotient run.
    set_memo: FxHashMap<(u32, u32), u32>,
}

/// Collections run so far (tests check the eager mode really collects).
#[cfg(test)]
pub(crate) static COLLECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where a step is, for errors: (rank, stream, step, channel).
type Place = (u32, u32, usize, u32);

/// Runs the schedule; `eager` collects unreferenced contributor sets whenever their arena
/// doubled (for tests) instead of once it also outgrew the slot count.
/// In a quotient run (`quot`), `s` holds the template as `quot.rank`'s program and empty
/// programs elsewhere, and `layout` pairs the template's own sends and receives.
pub(crate) fn simulate(
    s: &Schedule,
    layout: &Layout,
    sink: &mut Sink,
    eager: bool,
    quot: Option<Quot<'_>>,
) -> SimStats {
    let n = s.nranks;
    let alias = match (s.in_place, s.collective) {
        (false, _) => Alias::None,
        (true, Collective::AllGather) => Alias::InputInOutput { k: s.input_chunks },
        (true, Collective::ReduceScatter) => Alias::OutputInInput { k: s.output_chunks },
        (true, _) => Alias::OutputIsInput,
    };
    let out_store = resolve(alias, 0, Buf::Output, 0).0;
    let mem: Vec<Mem> = (0..n)
        .map(|r| {
            if quot.is_some_and(|q| q.rank != r) {
                return Mem {
                    vals: [Vec::new(), Vec::new(), Vec::new()],
                    writer: [Vec::new(), Vec::new(), Vec::new()],
                    acc: [Vec::new(), Vec::new(), Vec::new()],
                };
            }
            let (ni, no) = match alias {
                Alias::None => (s.input_chunks, s.output_chunks),
                Alias::OutputIsInput | Alias::OutputInInput { .. } => (s.input_chunks, 0),
                Alias::InputInOutput { .. } => (0, s.output_chunks),
            };
            let ns = super::structure::scratch_used(&s.ranks[r as usize]);
            let tracked = s.ranks[r as usize].streams.len() > 1;
            let acc = |len: u32| {
                if tracked {
                    super::kept::accesses(len as usize, Access::default())
                } else {
                    Vec::new()
                }
            };
            let lens = [ni, no, ns];
            let mut m = Mem {
                acc: [acc(ni), acc(no), acc(ns)],
                vals: lens.map(|len| super::kept::values(len as usize, Value::UNINIT)),
                writer: [IN, OUT, SCRATCH].map(|store| {
                    if store == out_store && !tracked {
                        vec![NONE; lens[store] as usize]
                    } else {
                        Vec::new()
                    }
                }),
            };
            for i in 0..s.input_chunks {
                let origin = match s.collective {
                    Collective::AllGather => r * s.input_chunks + i,
                    _ => i,
                };
                let (store, idx) = resolve(alias, r, Buf::Input, i);
                m.vals[store][idx] = Value::one(origin, r);
            }
            m
        })
        .collect();
    let nstreams = layout.streams.stream_count();
    let slots: usize = mem
        .iter()
        .map(|m| m.vals.iter().map(Vec::len).sum::<usize>())
        .sum();
    let mut sim = Sim {
        s,
        layout,
        alias,
        mem,
        streams: (0..nstreams)
            .map(|_| StreamState {
                pc: 0,
                depth: 0,
                queued: true,
                blocked: None,
                waiters: Vec::new(),
            })
            .collect(),
        queues: layout.conns.iter().map(|_| VecDeque::new()).collect(),
        step_depth: vec![0; layout.streams.step_count()],
        work: (0..nstreams).rev().collect(),
        stats: SimStats::default(),
        vc: (0..nstreams)
            .map(|g| {
                let r = layout.streams.stream_owner(g).0;
                let streams = s.ranks[r as usize].streams.len();
                if streams > 1 {
                    vec![0; streams]
                } else {
                    Vec::new()
                }
            })
            .collect(),
        snapshots: s
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(r, p)| {
                p.streams.iter().flat_map(move |st| {
                    st.steps.iter().flat_map(move |step| {
                        step.deps.iter().map(move |d| {
                            let g = layout.streams.stream_base(r as u32) + d.stream as usize;
                            (layout.streams.step_base(g) + d.step as usize, None)
                        })
                    })
                })
            })
            .collect(),
        cur: Cur::default(),
        step_stream: (0..nstreams)
            .flat_map(|g| {
                let len = layout.streams.step_base(g + 1) - layout.streams.step_base(g);
                std::iter::repeat_n(g as u32, len)
            })
            .collect(),
        reads: Vec::new(),
        free_reads: Vec::new(),
        sets: Sets::new(n, if eager { 0 } else { slots.max(1 << 16) }),
        aborted: false,
        quot,
        set_memo: FxHashMap::default(),
    };
    while let Some(gs) = sim.work.pop() {
        sim.streams[gs].queued = false;
        sim.run_stream(gs, sink);
        if sim.aborted {
            break;
        }
    }
    if !sim.aborted && !sim.report_deadlock(sink) {
        sim.check_postcondition(sink);
    }
    let (values, accesses): (Vec<_>, Vec<_>) = std::mem::take(&mut sim.mem)
        .into_iter()
        .map(|m| (m.vals, m.acc))
        .unzip();
    super::kept::give_back(values.into_iter().flatten(), accesses.into_iter().flatten());
    sim.stats
}

fn resolve(alias: Alias, rank: Rank, buf: Buf, i: u32) -> (usize, usize) {
    match (buf, alias) {
        (Buf::Scratch, _) => (SCRATCH, i as usize),
        (Buf::Input, Alias::InputInOutput { k }) => (OUT, (rank * k + i) as usize),
        (Buf::Output, Alias::OutputIsInput) => (IN, i as usize),
        (Buf::Output, Alias::OutputInInput { k }) => (IN, (rank * k + i) as usize),
        (Buf::Input, _) => (IN, i as usize),
        (Buf::Output, _) => (OUT, i as usize),
    }
}

impl Sim<'_> {
    fn wake(&mut self, gs: usize) {
        if gs < self.streams.len() && !self.streams[gs].queued {
            self.streams[gs].queued = true;
            self.work.push(gs);
        }
    }

    fn conn(&self, key: (u32, u32, u32)) -> usize {
        self.layout
            .conn_index
            .get(&key)
            .map_or(usize::MAX, |&c| c as usize)
    }

    fn run_stream(&mut self, gs: usize, sink: &mut Sink) {
        let (rank, ls) = self.layout.streams.stream_owner(gs);
        let stream = &self.s.ranks[rank as usize].streams[ls as usize];
        let base = self.layout.streams.stream_base(rank);
        loop {
            let pc = self.streams[gs].pc;
            let Some(step) = stream.steps.get(pc) else {
                break;
            };
            let mut depth = self.streams[gs].depth;
            // Dependencies.
            let mut blocker = None;
            for dep in &step.deps {
                let target = base + dep.stream as usize;
                if self.streams[target].pc <= dep.step as usize {
                    blocker = Some(Blocker::Dep {
                        target,
                        step: dep.step,
                    });
                    self.streams[target]
                        .waiters
                        .push((dep.step as usize + 1, gs));
                    break;
                }
                let g = self.layout.streams.step_base(target) + dep.step as usize;
                depth = depth.max(self.step_depth[g]);
            }
            let recv_conn = step
                .op
                .recv_peer()
                .map(|from| self.conn((from, rank, stream.channel)));
            let send_conn = step
                .op
                .send_peer()
                .map(|to| self.conn((rank, to, stream.channel)));
            if blocker.is_none()
                && let Some(c) = recv_conn
                && self.queues[c].is_empty()
            {
                blocker = Some(Blocker::Recv { conn: c });
            }
            if blocker.is_none()
                && let Some(c) = send_conn
                && self.queues[c].len() >= CONNECTION_SLOTS
            {
                blocker = Some(Blocker::Send { conn: c });
            }
            if let Some(b) = blocker {
                self.streams[gs].blocked = Some(b);
                return;
            }
            self.streams[gs].blocked = None;
            let gstep = self.layout.streams.step_base(gs) + pc;
            let place: Place = (rank, ls, pc, stream.channel);
            self.cur = Cur {
                gs,
                g: gstep as u32,
                raced: false,
            };
            if !self.vc[gs].is_empty() {
                self.vc[gs][ls as usize] = pc as u32 + 1;
                for dep in &step.deps {
                    let g = self.layout.streams.step_base(base + dep.stream as usize)
                        + dep.step as usize;
                    if let Some(Some(snap)) = self.snapshots.get(&g) {
                        for (mine, theirs) in self.vc[gs].iter_mut().zip(snap) {
                            *mine = (*mine).max(*theirs);
                        }
                    }
                }
            }
            let received = recv_conn.map(|c| {
                let msg = self.queues[c].pop_front().map_or(
                    Msg {
                        vals: Vec::new(),
                        depth: 0,
                        lane: None,
                    },
                    |m| m,
                );
                let sender = self.layout.conns[c].sender;
                self.wake(sender);
                msg
            });
            let received = match (received, step.op.recv_peer()) {
                (Some(m), Some(from)) if self.quot.is_some() => Some(self.lift(m, from)),
                (m, _) => m,
            };
            if let Some(m) = &received {
                depth = depth.max(m.depth);
            }
            depth += 1;
            let out = self.execute(rank, step.op, step.count, received, gstep, place, sink);
            if let (Some(c), Some(vals)) = (send_conn, out) {
                self.stats.messages += 1;
                self.stats.chunks_sent += u64::from(step.count);
                let lane = step.op.src().or(step.op.dst());
                self.queues[c].push_back(Msg { vals, depth, lane });
                let receiver = self.layout.conns[c].receiver;
                self.wake(receiver);
            }
            self.step_depth[gstep] = depth;
            if let Some(snap) = self.snapshots.get_mut(&gstep) {
                *snap = Some(self.vc[gs].clone());
            }
            self.stats.depth = self.stats.depth.max(depth);
            let st = &mut self.streams[gs];
            st.depth = depth;
            st.pc = pc + 1;
            if !st.waiters.is_empty() {
                let reached = st.pc;
                let mut woken = Vec::new();
                st.waiters.retain(|&(need, w)| {
                    if need <= reached {
                        woken.push(w);
                        false
                    } else {
                        true
                    }
                });
                for w in woken {
                    self.wake(w);
                }
            }
            if self.sets.wants_collect() && !self.collect_sets(sink) {
                return;
            }
        }
    }

    /// Reclaims contributor sets nothing refers to any more; reports [`ErrorKind::Limit`]
    /// and stops the run (returns false) when the live ones still exceed
    /// [`super::MAX_SET_WORDS`].
    fn collect_sets(&mut self, sink: &mut Sink) -> bool {
        #[cfg(test)]
        COLLECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mem, queues) = (&mut self.mem, &mut self.queues);
        self.set_memo.clear();
        let live = self.sets.collect(|f| {
            for m in mem.iter_mut() {
                m.vals.iter_mut().flatten().for_each(&mut *f);
            }
            for q in queues.iter_mut() {
                q.iter_mut().flat_map(|m| &mut m.vals).for_each(&mut *f);
            }
        });
        if live as u64 > super::MAX_SET_WORDS {
            self.aborted = true;
            self.work.clear();
            sink.push(VerifyError {
                at: None,
                channel: None,
                kind: ErrorKind::Limit,
                message: format!(
                    "the distinct contributor sets held by buffers and messages take {live} words of 64 bits, more than the verifier keeps ({})",
                    super::MAX_SET_WORDS
                ),
            });
            return false;
        }
        true
    }

    /// In a quotient run: the message the template's receive from `from` gets, from what the
    /// template sent. The sender is the template translated by `from`'s position, so each
    /// value is translated (origin and contributors) and the lanes are put in the order
    /// that translated sender reads them: its run is the least image of the template's, in
    /// buffer order.
    fn lift(&mut self, m: Msg, from: Rank) -> Msg {
        let Some(q) = self.quot else {
            return m;
        };
        let Some(pos) = q.table.position_of(from) else {
            return m;
        };
        let Some(t) = q.table.translation(pos) else {
            return m;
        };
        let n = m.vals.len();
        let lanes = m.lane.filter(|run| q.table.maps(run.buf)).map(|run| {
            let least = t.loc(run, n as u32).off;
            (run, least)
        });
        let mut out = vec![Value::POISON; n];
        for (i, v) in m.vals.into_iter().enumerate() {
            let j = match lanes {
                Some((run, least)) => t
                    .slot(run.buf, run.off.wrapping_add(i as u32))
                    .wrapping_sub(least) as usize,
                None => i,
            };
            let v = self.translate(v, t, pos as u32);
            if let Some(o) = out.get_mut(j) {
                *o = v;
            }
        }
        Msg {
            vals: out,
            depth: m.depth,
            lane: None,
        }
    }

    /// `v` as the rank at position `pos` holds it (translation `t`).
    fn translate(&mut self, v: Value, t: Translation<'_>, pos: u32) -> Value {
        if !v.is_data() {
            return v;
        }
        let set = match self.set_memo.get(&(v.set, pos)) {
            Some(&set) => set,
            None => {
                let set = self.sets.map(v.set, |r| t.rank(r));
                self.set_memo.insert((v.set, pos), set);
                set
            }
        };
        Value {
            origin: t.origin(v.origin),
            set,
        }
    }

    /// Reads `count` slots at `loc`, reporting (once) and poisoning uninitialised ones.
    fn read(
        &mut self,
        rank: Rank,
        loc: Loc,
        count: u32,
        place: Place,
        sink: &mut Sink,
    ) -> Vec<Value> {
        self.track(rank, loc, count, false, place, sink);
        let m = &self.mem[rank as usize];
        let mut uninit: Option<(u32, u32)> = None;
        let vals = (0..count)
            .map(|i| {
                let (store, idx) = resolve(self.alias, rank, loc.buf, loc.off + i);
                let v = m.vals[store][idx];
                if v == Value::UNINIT {
                    let u = uninit.get_or_insert((loc.off + i, 0));
                    u.1 += 1;
                    Value::POISON
                } else {
                    v
                }
            })
            .collect();
        if let Some((first, n)) = uninit {
            let first = Loc::new(loc.buf, first);
            step_error(
                sink,
                place,
                ErrorKind::Uninitialized,
                format!(
                    "reads uninitialised data: {first} was never written ({n} of the {count} chunks read from {loc} are uninitialised)"
                ),
            );
        }
        vals
    }

    /// The race check: the access must be ordered after the slot's last write (and, for a
    /// write, after the reads since) by program order or dependencies.
    fn track(
        &mut self,
        rank: Rank,
        loc: Loc,
        count: u32,
        write: bool,
        place: Place,
        sink: &mut Sink,
    ) {
        let cur = self.cur;
        let vc = &self.vc[cur.gs];
        if vc.is_empty() {
            return;
        }
        let layout = self.layout;
        let step_stream = &self.step_stream;
        let base = layout.streams.stream_base(rank);
        // (local stream, epoch) of global step `g`, where the epoch of step `k` is `k + 1`.
        let who = |g: u32| {
            let gs = step_stream[g as usize] as usize;
            (
                (gs - base) as u32,
                (g as usize - layout.streams.step_base(gs)) as u32 + 1,
            )
        };
        let ordered = |g: u32| {
            if g == NONE {
                return true;
            }
            let gs = step_stream[g as usize] as usize;
            let (st, epoch) = who(g);
            gs == cur.gs || vc.get(st as usize).is_some_and(|&e| e >= epoch)
        };
        let mut race: Option<(u32, (u32, u32), bool)> = None;
        let m = &mut self.mem[rank as usize];
        for i in 0..count {
            let (store, idx) = resolve(self.alias, rank, loc.buf, loc.off + i);
            let Some(a) = m.acc[store].get_mut(idx) else {
                continue;
            };
            if race.is_none() {
                if !ordered(a.write) {
                    race = Some((loc.off + i, who(a.write), true));
                } else if write {
                    let bad = match a.read {
                        NONE => None,
                        r if r & MULTI != 0 => self.reads[(r & !MULTI) as usize]
                            .iter()
                            .copied()
                            .find(|&r| !ordered(r)),
                        r => (!ordered(r)).then_some(r),
                    };
                    if let Some(r) = bad {
                        race = Some((loc.off + i, who(r), false));
                    }
                }
            }
            if write {
                a.write = cur.g;
                if a.read != NONE && a.read & MULTI != 0 {
                    let i = a.read & !MULTI;
                    self.reads[i as usize].clear();
                    self.free_reads.push(i);
                }
                a.read = NONE;
            } else {
                match a.read {
                    NONE => a.read = cur.g,
                    r if r & MULTI != 0 => {
                        let list = &mut self.reads[(r & !MULTI) as usize];
                        list.retain(|&g| step_stream[g as usize] as usize != cur.gs);
                        list.push(cur.g);
                    }
                    r if step_stream[r as usize] as usize == cur.gs => a.read = cur.g,
                    r => {
                        let i = match self.free_reads.pop() {
                            Some(i) => {
                                self.reads[i as usize].extend([r, cur.g]);
                                i
                            }
                            None => {
                                self.reads.push(vec![r, cur.g]);
                                (self.reads.len() - 1) as u32
                            }
                        };
                        a.read = MULTI | i;
                    }
                }
            }
        }
        if let Some((chunk, (st, epoch), other_wrote)) = race
            && !self.cur.raced
        {
            self.cur.raced = true;
            let here = Loc::new(loc.buf, chunk);
            step_error(
                sink,
                place,
                ErrorKind::Race,
                format!(
                    "{} {here}, which stream {st} step {} of this rank {} with no dependency ordering the two",
                    if write { "writes" } else { "reads" },
                    epoch - 1,
                    if other_wrote { "writes" } else { "reads" }
                ),
            );
        }
    }

    fn write(
        &mut self,
        rank: Rank,
        loc: Loc,
        vals: Vec<Value>,
        gstep: usize,
        place: Place,
        sink: &mut Sink,
    ) {
        self.track(rank, loc, vals.len() as u32, true, place, sink);
        let alias = self.alias;
        let m = &mut self.mem[rank as usize];
        for (i, v) in vals.into_iter().enumerate() {
            let (store, idx) = resolve(alias, rank, loc.buf, loc.off + i as u32);
            m.vals[store][idx] = v;
            if let Some(w) = m.writer[store].get_mut(idx) {
                *w = gstep as u32;
            }
        }
    }

    /// `a ⊕ b` element-wise, reporting the first bad pair once.
    fn reduce(
        &mut self,
        received: Vec<Value>,
        local: Vec<Value>,
        what: (&str, Loc),
        place: Place,
        sink: &mut Sink,
    ) -> Vec<Value> {
        self.stats.reductions += 1;
        if !self.s.collective.kind().reduces() {
            step_error(
                sink,
                place,
                ErrorKind::BadReduction,
                format!(
                    "applies the reduction operator, but {} does not reduce",
                    self.s.collective.kind()
                ),
            );
            return vec![Value::POISON; local.len()];
        }
        let mut reported = false;
        received
            .into_iter()
            .zip(local)
            .enumerate()
            .map(|(i, (a, b))| {
                if !a.is_data() || !b.is_data() {
                    return Value::POISON;
                }
                let problem = if a.origin != b.origin {
                    Err(format!(
                        "combines {} with {}: different chunks",
                        self.sets.describe(a),
                        self.sets.describe(b)
                    ))
                } else {
                    self.sets.disjoint_union(a.set, b.set).map_err(|twice| {
                        format!(
                            "counts ranks {} twice: combines {} with {}",
                            Ranks(&twice),
                            self.sets.describe(a),
                            self.sets.describe(b)
                        )
                    })
                };
                match problem {
                    Ok(set) => Value {
                        origin: a.origin,
                        set,
                    },
                    Err(msg) => {
                        if !reported {
                            reported = true;
                            let loc = Loc::new(what.1.buf, what.1.off + i as u32);
                            step_error(
                                sink,
                                place,
                                ErrorKind::BadReduction,
                                format!("reduction at {} {loc} {msg}", what.0),
                            );
                        }
                        Value::POISON
                    }
                }
            })
            .collect()
    }

    /// Reports a copy or reduction whose source and destination partly overlap.
    fn check_overlap(
        &self,
        rank: Rank,
        src: Loc,
        dst: Loc,
        count: u32,
        place: Place,
        sink: &mut Sink,
    ) {
        let (ss, si) = resolve(self.alias, rank, src.buf, src.off);
        let (ds, di) = resolve(self.alias, rank, dst.buf, dst.off);
        let c = count as usize;
        if ss == ds && si != di && si < di + c && di < si + c {
            step_error(
                sink,
                place,
                ErrorKind::Overlap,
                format!("source {src} and destination {dst} of {count} chunks partly overlap"),
            );
        }
    }

    /// Runs one step's data movement; returns the message to send, if any.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &mut self,
        rank: Rank,
        op: Op,
        count: u32,
        received: Option<Msg>,
        gstep: usize,
        place: Place,
        sink: &mut Sink,
    ) -> Option<Vec<Value>> {
        let recv = || received.map(|m| m.vals).unwrap_or_default();
        match op {
            Op::Send { src, .. } => Some(self.read(rank, src, count, place, sink)),
            Op::Recv { dst, .. } => {
                self.write(rank, dst, recv(), gstep, place, sink);
                None
            }
            Op::RecvReduceCopy { src, dst, .. } => {
                self.check_overlap(rank, src, dst, count, place, sink);
                let local = self.read(rank, src, count, place, sink);
                let vals = self.reduce(recv(), local, ("source", src), place, sink);
                self.write(rank, dst, vals, gstep, place, sink);
                None
            }
            Op::RecvReduceSend { src, .. } => {
                let local = self.read(rank, src, count, place, sink);
                Some(self.reduce(recv(), local, ("source", src), place, sink))
            }
            Op::RecvReduceCopySend { src, dst, .. } => {
                self.check_overlap(rank, src, dst, count, place, sink);
                let local = self.read(rank, src, count, place, sink);
                let vals = self.reduce(recv(), local, ("source", src), place, sink);
                self.write(rank, dst, vals.clone(), gstep, place, sink);
                Some(vals)
            }
            Op::RecvCopySend { dst, .. } => {
                let vals = recv();
                self.write(rank, dst, vals.clone(), gstep, place, sink);
                Some(vals)
            }
            Op::Copy { src, dst } => {
                self.check_overlap(rank, src, dst, count, place, sink);
                let vals = self.read(rank, src, count, place, sink);
                self.write(rank, dst, vals, gstep, place, sink);
                None
            }
            Op::Reduce { src, dst } => {
                self.check_overlap(rank, src, dst, count, place, sink);
                let a = self.read(rank, src, count, place, sink);
                let b = self.read(rank, dst, count, place, sink);
                let vals = self.reduce(a, b, ("destination", dst), place, sink);
                self.write(rank, dst, vals, gstep, place, sink);
                None
            }
            Op::Nop => None,
        }
    }

    fn describe_blocker(&self, b: Blocker) -> (String, usize, bool) {
        let stuck_at = |g: usize| {
            let (r, st) = self.layout.streams.stream_owner(g);
            let pc = self.streams[g].pc;
            let len = self.s.ranks[r as usize].streams[st as usize].steps.len();
            if pc >= len {
                format!("rank {r} stream {st} has finished")
            } else {
                format!("rank {r} stream {st} is blocked at step {pc}")
            }
        };
        match b {
            Blocker::Dep { target, step } => {
                let st = self.layout.streams.stream_owner(target).1;
                (
                    format!(
                        "waits for step {step} of stream {st} of this rank ({})",
                        stuck_at(target)
                    ),
                    target,
                    true,
                )
            }
            Blocker::Recv { conn } => {
                let c = &self.layout.conns[conn];
                let (_, _, ch) = c.key;
                let from = c.recv_from;
                (
                    format!(
                        "waits for a message from rank {from} on channel {ch} ({})",
                        stuck_at(c.sender)
                    ),
                    c.sender,
                    false,
                )
            }
            Blocker::Send { conn } => {
                let c = &self.layout.conns[conn];
                let (_, to, ch) = c.key;
                (
                    format!(
                        "waits for a free slot to rank {to} on channel {ch}: {} messages are unreceived ({})",
                        self.queues[conn].len(),
                        stuck_at(c.receiver)
                    ),
                    c.receiver,
                    false,
                )
            }
        }
    }

    /// Reports a deadlock when some stream did not finish; returns whether one did not.
    fn report_deadlock(&self, sink: &mut Sink) -> bool {
        let unfinished = |g: usize| {
            let (r, st) = self.layout.streams.stream_owner(g);
            self.streams[g].pc < self.s.ranks[r as usize].streams[st as usize].steps.len()
        };
        let stuck: Vec<usize> = (0..self.streams.len()).filter(|&g| unfinished(g)).collect();
        let Some(&start) = stuck.first() else {
            return false;
        };
        let never_run: usize = stuck
            .iter()
            .map(|&g| {
                let (r, st) = self.layout.streams.stream_owner(g);
                self.s.ranks[r as usize].streams[st as usize].steps.len() - self.streams[g].pc
            })
            .sum();
        // Follow the wait-for graph from the first stuck stream until it closes a cycle.
        let mut seen = FxHashMap::default();
        let mut path = Vec::new();
        let mut cur = start;
        let cycle_start = loop {
            if let Some(&i) = seen.get(&cur) {
                break Some(i);
            }
            if !unfinished(cur) {
                break None;
            }
            let Some(b) = self.streams[cur].blocked else {
                break None;
            };
            seen.insert(cur, path.len());
            path.push((cur, b));
            cur = self.describe_blocker(b).1;
        };
        let chain = match cycle_start {
            Some(i) => &path[i..],
            None => &path[..],
        };
        let all_deps = chain.iter().all(|&(_, b)| matches!(b, Blocker::Dep { .. }));
        let kind = if cycle_start.is_some() && all_deps {
            ErrorKind::Dependency
        } else {
            ErrorKind::Deadlock
        };
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind,
            message: format!(
                "deadlock: {} of {} streams are blocked and {never_run} steps never run; {}",
                stuck.len(),
                self.streams.len(),
                match cycle_start {
                    Some(_) if all_deps => format!(
                        "the dependencies form a cycle of {} steps (listed below)",
                        chain.len()
                    ),
                    Some(_) => format!(
                        "the steps below wait on each other in a cycle of {}",
                        chain.len()
                    ),
                    None => "the blocked steps below wait on a finished stream".to_string(),
                }
            ),
        });
        for &(g, b) in chain.iter().take(32) {
            let (r, st) = self.layout.streams.stream_owner(g);
            let ch = self.s.ranks[r as usize].streams[st as usize].channel;
            step_error(
                sink,
                (r, st, self.streams[g].pc, ch),
                kind,
                format!("blocked: {}", self.describe_blocker(b).0),
            );
        }
        true
    }

    fn check_postcondition(&self, sink: &mut Sink) {
        let s = self.s;
        let n = s.nranks;
        let c = s.chunks;
        let k = c / n.max(1);
        let ranks = match self.quot {
            Some(q) => q.rank..q.rank + 1,
            None => 0..n,
        };
        for r in ranks {
            for i in 0..s.output_chunks {
                let expected: Option<(u32, Option<Rank>)> = match s.collective {
                    Collective::AllReduce => Some((i, None)),
                    Collective::AllGather => Some((i, Some(i / k.max(1)))),
                    Collective::ReduceScatter => Some((r * k + i, None)),
                    Collective::Broadcast { root } => Some((i, Some(root))),
                    Collective::Reduce { root } => (r == root).then_some((i, None)),
                    Collective::AllToAll => Some((r * k + i % k.max(1), Some(i / k.max(1)))),
                };
                let Some((origin, ranks)) = expected else {
                    continue;
                };
                let (store, idx) = resolve(self.alias, r, Buf::Output, i);
                let got = self.mem[r as usize].vals[store][idx];
                let ok = match got {
                    Value::POISON => true,
                    Value::UNINIT => false,
                    Value { origin: o, set } => {
                        o == origin
                            && match ranks {
                                None => self.sets.len(set) == n,
                                Some(j) => self.sets.single(set) == Some(j),
                            }
                    }
                };
                if ok {
                    continue;
                }
                let want = match ranks {
                    None if n > 1 => format!("chunk {origin} reduced over all {n} ranks"),
                    None => format!("chunk {origin} of rank 0"),
                    Some(j) => format!("chunk {origin} of rank {j}"),
                };
                let m = &self.mem[r as usize];
                let writer = match (m.writer[store].get(idx), m.acc[store].get(idx)) {
                    (Some(&w), _) => w,
                    (None, Some(a)) => a.write,
                    (None, None) => NONE,
                };
                let (at, channel, by) = if writer == NONE {
                    (None, None, String::new())
                } else {
                    let at: StepRef = self.layout.streams.step_ref(writer as usize);
                    let ch = s.ranks[at.rank as usize].streams[at.stream as usize].channel;
                    (
                        Some(at),
                        Some(ch),
                        " (last written by this step)".to_string(),
                    )
                };
                sink.push(VerifyError {
                    at,
                    channel,
                    kind: ErrorKind::Postcondition,
                    message: format!(
                        "{}: rank {r} output chunk {i} holds {}, expected {want}{by}",
                        s.collective,
                        self.sets.describe(got)
                    ),
                });
            }
        }
    }
}
