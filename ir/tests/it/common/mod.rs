//! Shared test support: generators of valid schedules for every collective and a concrete
//! reference interpreter (the oracle the symbolic verifier is checked against).
#![allow(dead_code)]

pub mod mutate;

use hccl_ir::{
    Buf, Collective, Dep, Loc, Op, PlanEntry, PlanFile, PlanMeta, Protocol, Schedule, Step, Stream,
    Symmetry,
};

/// An entry for every size (algorithm `hand`, Simple) holding `schedule`, with `symmetry`
/// claimed.
pub fn entry(schedule: Schedule, symmetry: Option<Symmetry>) -> PlanEntry {
    PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "hand".into(),
        protocol: Protocol::Simple,
        cost: None,
        schedule,
        symmetry,
        synthesis: None,
        template: None,
    }
}

/// A plan of one [`entry`].
pub fn plan_of(schedule: Schedule, symmetry: Option<Symmetry>) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: "t".into(),
        topology_hash: String::new(),
        compiler: "test".into(),
    });
    plan.entries.push(entry(schedule, symmetry));
    plan
}

/// Builds schedules stream by stream: one stream per (rank, channel).
pub struct Builder {
    pub s: Schedule,
}

impl Builder {
    pub fn new(collective: Collective, n: u32, chunks: u32, in_place: bool) -> Builder {
        Builder {
            s: Schedule::empty(collective, n, chunks, in_place).expect("chunks fit the collective"),
        }
    }

    /// The stream of `rank` on `channel`, created on first use.
    pub fn stream(&mut self, rank: u32, channel: u32) -> u32 {
        let streams = &mut self.s.ranks[rank as usize].streams;
        if let Some(i) = streams.iter().position(|s| s.channel == channel) {
            return i as u32;
        }
        streams.push(Stream {
            channel,
            steps: Vec::new(),
        });
        streams.len() as u32 - 1
    }

    /// Appends a step on `rank`'s stream for `channel`; returns where it is.
    pub fn push(&mut self, rank: u32, channel: u32, step: Step) -> Dep {
        let st = self.stream(rank, channel);
        let steps = &mut self.s.ranks[rank as usize].streams[st as usize].steps;
        steps.push(step);
        Dep {
            stream: st,
            step: steps.len() as u32 - 1,
        }
    }

    pub fn op(&mut self, rank: u32, channel: u32, op: Op, count: u32) -> Dep {
        self.push(rank, channel, Step::new(op, count))
    }

    pub fn finish(self) -> Schedule {
        self.s
    }
}

fn md(a: i64, n: u32) -> u32 {
    a.rem_euclid(i64::from(n)) as u32
}

/// One rank's ops of a pipelined ring AllReduce pass between `prev` and `next`: send the
/// rank's own segment, reduce and forward the next `n − 2`, keep and forward the `n − 1`
/// reduced ones, receive the last. Step `k` addresses chunk `chunk(k)` (`count` chunks),
/// reading contributions with `src` and writing results with `dst`.
pub fn ring_allreduce_ops(
    n: u32,
    prev: u32,
    next: u32,
    count: u32,
    chunk: &dyn Fn(u32) -> u32,
    src: fn(u32) -> Loc,
    dst: fn(u32) -> Loc,
) -> Vec<(Op, u32)> {
    let mut ops = vec![(
        Op::Send {
            to: next,
            src: src(chunk(0)),
        },
        count,
    )];
    for k in 1..=(2 * n - 2) {
        let at = chunk(k);
        let op = if k < n {
            Op::RecvReduceCopySend {
                from: prev,
                to: next,
                src: src(at),
                dst: dst(at),
            }
        } else if k < 2 * n - 2 {
            Op::RecvCopySend {
                from: prev,
                to: next,
                dst: dst(at),
            }
        } else {
            Op::Recv {
                from: prev,
                dst: dst(at),
            }
        };
        ops.push((op, count));
    }
    ops
}

/// Ring direction of a channel: even channels go up, odd ones down (a double ring).
fn dir(ch: u32) -> i64 {
    if ch.is_multiple_of(2) { 1 } else { -1 }
}

/// Ring AllReduce: `n` segments of `nch * q` chunks; channel `c` runs its own ring over
/// the `q`-chunk slice `c` of every segment (odd channels in the opposite direction).
pub fn ring_allreduce(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let m = nch * q;
    let mut b = Builder::new(Collective::AllReduce, n, n * m, in_place);
    for ch in 0..nch {
        let d = dir(ch);
        for r in 0..n {
            let next = md(i64::from(r) + d, n);
            let prev = md(i64::from(r) - d, n);
            let seg = |k: u32| md(i64::from(r) - d * i64::from(k), n) * m + ch * q;
            for (op, count) in ring_allreduce_ops(n, prev, next, q, &seg, Loc::input, Loc::output) {
                b.op(r, ch, op, count);
            }
        }
    }
    b.finish()
}

/// Ring AllGather: each rank contributes `nch * q` chunks.
pub fn ring_allgather(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let mut b = Builder::new(Collective::AllGather, n, n * k, in_place);
    for ch in 0..nch {
        let d = dir(ch);
        for r in 0..n {
            let next = md(i64::from(r) + d, n);
            let prev = md(i64::from(r) - d, n);
            let seg = |t: u32| md(i64::from(r) - d * i64::from(t), n) * k + ch * q;
            if !in_place {
                b.op(
                    r,
                    ch,
                    Op::Copy {
                        src: Loc::input(ch * q),
                        dst: Loc::output(seg(0)),
                    },
                    q,
                );
            }
            b.op(
                r,
                ch,
                Op::Send {
                    to: next,
                    src: Loc::input(ch * q),
                },
                q,
            );
            for t in 1..n {
                let op = if t < n - 1 {
                    Op::RecvCopySend {
                        from: prev,
                        to: next,
                        dst: Loc::output(seg(t)),
                    }
                } else {
                    Op::Recv {
                        from: prev,
                        dst: Loc::output(seg(t)),
                    }
                };
                b.op(r, ch, op, q);
            }
        }
    }
    b.finish()
}

/// Ring ReduceScatter: each rank ends with `nch * q` chunks.
pub fn ring_reducescatter(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let mut b = Builder::new(Collective::ReduceScatter, n, n * k, in_place);
    for ch in 0..nch {
        let d = dir(ch);
        for r in 0..n {
            let next = md(i64::from(r) + d, n);
            let prev = md(i64::from(r) - d, n);
            let seg = |t: u32| md(i64::from(r) + d * i64::from(n - 1 - t), n) * k + ch * q;
            b.op(
                r,
                ch,
                Op::Send {
                    to: next,
                    src: Loc::input(seg(0)),
                },
                q,
            );
            for t in 1..n {
                let op = if t < n - 1 {
                    Op::RecvReduceSend {
                        from: prev,
                        to: next,
                        src: Loc::input(seg(t)),
                    }
                } else {
                    Op::RecvReduceCopy {
                        from: prev,
                        src: Loc::input(seg(t)),
                        dst: Loc::output(ch * q),
                    }
                };
                b.op(r, ch, op, q);
            }
        }
    }
    b.finish()
}

/// Pipelined chain Broadcast from `root`: `pieces` runs of `q` chunks per channel.
pub fn ring_broadcast(
    n: u32,
    root: u32,
    q: u32,
    nch: u32,
    pieces: u32,
    in_place: bool,
) -> Schedule {
    let chunks = nch * q * pieces;
    let mut b = Builder::new(Collective::Broadcast { root }, n, chunks, in_place);
    for ch in 0..nch {
        let d = dir(ch);
        for r in 0..n {
            let next = md(i64::from(r) + d, n);
            let prev = md(i64::from(r) - d, n);
            let pos = md((i64::from(r) - i64::from(root)) * d, n);
            for p in 0..pieces {
                let off = (p * nch + ch) * q;
                let op = if pos == 0 {
                    if !in_place {
                        b.op(
                            r,
                            ch,
                            Op::Copy {
                                src: Loc::input(off),
                                dst: Loc::output(off),
                            },
                            q,
                        );
                    }
                    Op::Send {
                        to: next,
                        src: Loc::input(off),
                    }
                } else if pos < n - 1 {
                    Op::RecvCopySend {
                        from: prev,
                        to: next,
                        dst: Loc::output(off),
                    }
                } else {
                    Op::Recv {
                        from: prev,
                        dst: Loc::output(off),
                    }
                };
                b.op(r, ch, op, q);
            }
        }
    }
    b.finish()
}

/// Pipelined chain Reduce into `root`.
pub fn ring_reduce(n: u32, root: u32, q: u32, nch: u32, pieces: u32, in_place: bool) -> Schedule {
    let chunks = nch * q * pieces;
    let mut b = Builder::new(Collective::Reduce { root }, n, chunks, in_place);
    for ch in 0..nch {
        let d = dir(ch);
        for r in 0..n {
            let next = md(i64::from(r) + d, n);
            let prev = md(i64::from(r) - d, n);
            let pos = md((i64::from(r) - i64::from(root)) * d - 1, n);
            for p in 0..pieces {
                let off = (p * nch + ch) * q;
                let op = if pos == 0 {
                    Op::Send {
                        to: next,
                        src: Loc::input(off),
                    }
                } else if pos < n - 1 {
                    Op::RecvReduceSend {
                        from: prev,
                        to: next,
                        src: Loc::input(off),
                    }
                } else {
                    Op::RecvReduceCopy {
                        from: prev,
                        src: Loc::input(off),
                        dst: Loc::output(off),
                    }
                };
                b.op(r, ch, op, q);
            }
        }
    }
    b.finish()
}

/// The peers of `r` in the order a direct schedule visits them.
fn others(r: u32, n: u32) -> impl Iterator<Item = u32> {
    (1..n).map(move |i| (r + i) % n)
}

/// Direct AllToAll; in place it first copies the whole input to scratch on channel 0, and the
/// other channels depend on that copy.
pub fn direct_alltoall(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let c = n * k;
    let mut b = Builder::new(Collective::AllToAll, n, c, in_place);
    for r in 0..n {
        let copy = if in_place {
            b.s.ranks[r as usize].scratch_chunks = c;
            Some(b.op(
                r,
                0,
                Op::Copy {
                    src: Loc::input(0),
                    dst: Loc::scratch(0),
                },
                c,
            ))
        } else {
            None
        };
        for ch in 0..nch {
            let off = |j: u32| j * k + ch * q;
            if !in_place {
                b.op(
                    r,
                    ch,
                    Op::Copy {
                        src: Loc::input(off(r)),
                        dst: Loc::output(off(r)),
                    },
                    q,
                );
            }
            let src_buf = if in_place { Buf::Scratch } else { Buf::Input };
            for (i, j) in others(r, n).enumerate() {
                let mut step = Step::new(
                    Op::Send {
                        to: j,
                        src: Loc::new(src_buf, off(j)),
                    },
                    q,
                );
                if i == 0
                    && ch > 0
                    && let Some(dep) = copy
                {
                    step.deps.push(dep);
                }
                b.push(r, ch, step);
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Recv {
                        from: j,
                        dst: Loc::output(off(j)),
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// Direct AllGather.
pub fn direct_allgather(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let mut b = Builder::new(Collective::AllGather, n, n * k, in_place);
    for r in 0..n {
        for ch in 0..nch {
            if !in_place {
                b.op(
                    r,
                    ch,
                    Op::Copy {
                        src: Loc::input(ch * q),
                        dst: Loc::output(r * k + ch * q),
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Send {
                        to: j,
                        src: Loc::input(ch * q),
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Recv {
                        from: j,
                        dst: Loc::output(j * k + ch * q),
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// Direct ReduceScatter.
pub fn direct_reducescatter(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let mut b = Builder::new(Collective::ReduceScatter, n, n * k, in_place);
    for r in 0..n {
        for ch in 0..nch {
            let out = Loc::output(ch * q);
            if !in_place {
                b.op(
                    r,
                    ch,
                    Op::Copy {
                        src: Loc::input(r * k + ch * q),
                        dst: out,
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Send {
                        to: j,
                        src: Loc::input(j * k + ch * q),
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::RecvReduceCopy {
                        from: j,
                        src: out,
                        dst: out,
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// Direct AllReduce: a direct ReduceScatter into the output, then a direct AllGather.
pub fn direct_allreduce(n: u32, q: u32, nch: u32, in_place: bool) -> Schedule {
    let k = nch * q;
    let mut b = Builder::new(Collective::AllReduce, n, n * k, in_place);
    for r in 0..n {
        for ch in 0..nch {
            let mine = Loc::output(r * k + ch * q);
            if !in_place {
                b.op(
                    r,
                    ch,
                    Op::Copy {
                        src: Loc::input(r * k + ch * q),
                        dst: mine,
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Send {
                        to: j,
                        src: Loc::input(j * k + ch * q),
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::RecvReduceCopy {
                        from: j,
                        src: mine,
                        dst: mine,
                    },
                    q,
                );
            }
            for j in others(r, n) {
                b.op(r, ch, Op::Send { to: j, src: mine }, q);
            }
            for j in others(r, n) {
                b.op(
                    r,
                    ch,
                    Op::Recv {
                        from: j,
                        dst: Loc::output(j * k + ch * q),
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// Direct Broadcast from `root`.
pub fn direct_broadcast(
    n: u32,
    root: u32,
    q: u32,
    nch: u32,
    pieces: u32,
    in_place: bool,
) -> Schedule {
    let mut b = Builder::new(
        Collective::Broadcast { root },
        n,
        nch * q * pieces,
        in_place,
    );
    for ch in 0..nch {
        for p in 0..pieces {
            let off = (p * nch + ch) * q;
            if !in_place {
                b.op(
                    root,
                    ch,
                    Op::Copy {
                        src: Loc::input(off),
                        dst: Loc::output(off),
                    },
                    q,
                );
            }
            for j in others(root, n) {
                b.op(
                    root,
                    ch,
                    Op::Send {
                        to: j,
                        src: Loc::input(off),
                    },
                    q,
                );
                b.op(
                    j,
                    ch,
                    Op::Recv {
                        from: root,
                        dst: Loc::output(off),
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// Direct Reduce into `root`.
pub fn direct_reduce(n: u32, root: u32, q: u32, nch: u32, pieces: u32, in_place: bool) -> Schedule {
    let mut b = Builder::new(Collective::Reduce { root }, n, nch * q * pieces, in_place);
    for ch in 0..nch {
        for p in 0..pieces {
            let off = (p * nch + ch) * q;
            let out = Loc::output(off);
            if !in_place {
                b.op(
                    root,
                    ch,
                    Op::Copy {
                        src: Loc::input(off),
                        dst: out,
                    },
                    q,
                );
            }
            for j in others(root, n) {
                b.op(
                    j,
                    ch,
                    Op::Send {
                        to: root,
                        src: Loc::input(off),
                    },
                    q,
                );
                b.op(
                    root,
                    ch,
                    Op::RecvReduceCopy {
                        from: j,
                        src: out,
                        dst: out,
                    },
                    q,
                );
            }
        }
    }
    b.finish()
}

/// A one-rank schedule: a copy out of place, nothing in place.
pub fn single_rank(collective: Collective, chunks: u32, in_place: bool) -> Schedule {
    let mut b = Builder::new(collective, 1, chunks, in_place);
    b.stream(0, 0);
    if !in_place {
        b.op(
            0,
            0,
            Op::Copy {
                src: Loc::input(0),
                dst: Loc::output(0),
            },
            chunks,
        );
    }
    b.finish()
}

/// Parameters of a generated schedule.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub family: usize,
    pub n: u32,
    pub q: u32,
    pub nch: u32,
    pub pieces: u32,
    pub root: u32,
    pub in_place: bool,
}

/// Number of generator families [`generate`] knows.
pub const FAMILIES: usize = 12;

/// Generates schedule `family` (0..FAMILIES) with the given parameters.
pub fn generate(p: Params) -> Schedule {
    let Params {
        n,
        q,
        nch,
        pieces,
        in_place,
        ..
    } = p;
    let root = p.root % n;
    match p.family {
        0 => ring_allreduce(n, q, nch, in_place),
        1 => ring_allgather(n, q, nch, in_place),
        2 => ring_reducescatter(n, q, nch, in_place),
        3 => ring_broadcast(n, root, q, nch, pieces, in_place),
        4 => ring_reduce(n, root, q, nch, pieces, in_place),
        5 => direct_alltoall(n, q, nch, in_place),
        6 => direct_allgather(n, q, nch, in_place),
        7 => direct_reducescatter(n, q, nch, in_place),
        8 => direct_allreduce(n, q, nch, in_place),
        9 => direct_broadcast(n, root, q, nch, pieces, in_place),
        10 => direct_reduce(n, root, q, nch, pieces, in_place),
        _ => {
            let colls = [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
                Collective::Broadcast { root: 0 },
                Collective::Reduce { root: 0 },
                Collective::AllToAll,
            ];
            single_rank(
                colls[(n as usize + q as usize) % colls.len()],
                q * nch,
                in_place,
            )
        }
    }
}

// ---------------------------------------------------------------------------------------
// The concrete oracle.

/// Mixes two numbers into a pseudo-random 64-bit value.
pub fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0x632B_E59B_D9B4_E019);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// Runs `s` on concrete values (`⊕` = wrapping add; uninitialised memory holds garbage) in a
/// round-robin interleaving and checks the outputs against the collective's definition.
/// Returns `Err` with a reason on malformed steps, deadlock or wrong results.
pub fn oracle(s: &Schedule, seed: u64) -> Result<(), String> {
    use std::collections::{HashMap, VecDeque};
    let n = s.nranks as usize;
    if n == 0 || s.ranks.len() != n || s.chunks == 0 {
        return Err("bad header".into());
    }
    let (ic, oc) = s
        .collective
        .buffer_chunks(s.nranks, s.chunks)
        .ok_or("chunks do not fit")?;
    if (ic, oc) != (s.input_chunks, s.output_chunks) {
        return Err("bad extents".into());
    }
    if s.collective.root().is_some_and(|r| r as usize >= n) {
        return Err("bad root".into());
    }
    let k = s.chunks as usize / n;
    let input = |r: usize, c: usize| mix(seed, (r * 1_000_003 + c) as u64);
    // Memory per rank: separate input, output, scratch, aliased per the schedule docs.
    let mut mem: Vec<[Vec<u64>; 3]> = (0..n)
        .map(|r| {
            let garbage = |b: usize, len: u32| {
                (0..len as usize)
                    .map(|i| mix(seed ^ 0xdead, (r * 7919 + b * 104_729 + i) as u64))
                    .collect::<Vec<_>>()
            };
            let mut m = [
                (0..ic as usize).map(|c| input(r, c)).collect(),
                garbage(1, oc),
                garbage(2, s.ranks[r].scratch_chunks),
            ];
            if s.in_place && s.collective == Collective::AllGather {
                for c in 0..ic as usize {
                    m[1][r * k + c] = m[0][c];
                }
            }
            m
        })
        .collect();
    let place = |r: usize, buf: Buf, i: usize| -> (usize, usize) {
        match (buf, s.in_place, s.collective) {
            (Buf::Scratch, _, _) => (2, i),
            (Buf::Input, true, Collective::AllGather) => (1, r * k + i),
            (Buf::Input, _, _) => (0, i),
            (Buf::Output, true, Collective::ReduceScatter) => (0, r * k + i),
            (Buf::Output, true, Collective::AllGather) | (Buf::Output, false, _) => (1, i),
            (Buf::Output, true, _) => (0, i),
        }
    };
    let len = |r: usize, b: Buf| -> usize {
        match b {
            Buf::Input => ic as usize,
            Buf::Output => oc as usize,
            Buf::Scratch => s.ranks[r].scratch_chunks as usize,
        }
    };
    let mut queues: HashMap<(u32, u32, u32), VecDeque<Vec<u64>>> = HashMap::new();
    let mut pcs: Vec<Vec<usize>> = s.ranks.iter().map(|p| vec![0; p.streams.len()]).collect();
    loop {
        let mut progress = false;
        let mut unfinished = false;
        for r in 0..n {
            for si in 0..s.ranks[r].streams.len() {
                let st = &s.ranks[r].streams[si];
                let Some(step) = st.steps.get(pcs[r][si]) else {
                    continue;
                };
                unfinished = true;
                if step.deps.iter().any(|d| {
                    pcs[r]
                        .get(d.stream as usize)
                        .is_none_or(|&pc| pc <= d.step as usize)
                }) {
                    continue;
                }
                let cnt = step.count as usize;
                let ch = st.channel;
                let rk = r as u32;
                for l in [step.op.src(), step.op.dst()].into_iter().flatten() {
                    if l.off as usize + cnt > len(r, l.buf) {
                        return Err("out of bounds".into());
                    }
                }
                for p in [step.op.send_peer(), step.op.recv_peer()]
                    .into_iter()
                    .flatten()
                {
                    if p as usize >= n || p == rk {
                        return Err("bad peer".into());
                    }
                }
                if let Some(from) = step.op.recv_peer()
                    && queues.get(&(from, rk, ch)).is_none_or(|q| q.is_empty())
                {
                    continue;
                }
                if let Some(to) = step.op.send_peer()
                    && queues
                        .get(&(rk, to, ch))
                        .is_some_and(|q| q.len() >= hccl_ir::CONNECTION_SLOTS)
                {
                    continue;
                }
                let received = step
                    .op
                    .recv_peer()
                    .and_then(|from| queues.get_mut(&(from, rk, ch)).and_then(|q| q.pop_front()));
                if let Some(m) = &received
                    && m.len() != cnt
                {
                    return Err("count mismatch".into());
                }
                let get = |mem: &Vec<[Vec<u64>; 3]>, l: Loc| -> Vec<u64> {
                    (0..cnt)
                        .map(|i| {
                            let (b, j) = place(r, l.buf, l.off as usize + i);
                            mem[r][b][j]
                        })
                        .collect()
                };
                let add = |a: &[u64], b: &[u64]| {
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| x.wrapping_add(*y))
                        .collect::<Vec<_>>()
                };
                let recv = || received.clone().unwrap_or_default();
                type Effect = (Option<(Loc, Vec<u64>)>, Option<Vec<u64>>);
                let (store, send): Effect = match step.op {
                    Op::Send { src, .. } => (None, Some(get(&mem, src))),
                    Op::Recv { dst, .. } => (Some((dst, recv())), None),
                    Op::RecvReduceCopy { src, dst, .. } => {
                        (Some((dst, add(&recv(), &get(&mem, src)))), None)
                    }
                    Op::RecvReduceSend { src, .. } => (None, Some(add(&recv(), &get(&mem, src)))),
                    Op::RecvReduceCopySend { src, dst, .. } => {
                        let v = add(&recv(), &get(&mem, src));
                        (Some((dst, v.clone())), Some(v))
                    }
                    Op::RecvCopySend { dst, .. } => (Some((dst, recv())), Some(recv())),
                    Op::Copy { src, dst } => (Some((dst, get(&mem, src))), None),
                    Op::Reduce { src, dst } => {
                        (Some((dst, add(&get(&mem, dst), &get(&mem, src)))), None)
                    }
                    Op::Nop => (None, None),
                };
                if let Some((dst, vals)) = store {
                    for (i, v) in vals.into_iter().enumerate() {
                        let (b, j) = place(r, dst.buf, dst.off as usize + i);
                        mem[r][b][j] = v;
                    }
                }
                if let (Some(to), Some(v)) = (step.op.send_peer(), send) {
                    queues.entry((rk, to, ch)).or_default().push_back(v);
                }
                pcs[r][si] += 1;
                progress = true;
            }
        }
        if !unfinished {
            break;
        }
        if !progress {
            return Err("deadlock".into());
        }
    }
    if queues.values().any(|q| !q.is_empty()) {
        return Err("unreceived messages".into());
    }
    let inputs: Vec<Vec<u64>> = (0..n)
        .map(|r| (0..ic as usize).map(|c| input(r, c)).collect())
        .collect();
    let add = |acc: &mut [u64], x: &[u64]| {
        for (a, b) in acc.iter_mut().zip(x) {
            *a = a.wrapping_add(*b);
        }
    };
    let wanted = hccl_ir::reference::expected(s.collective, &inputs, add, |_| {});
    for (r, rank_mem) in mem.iter().enumerate() {
        let Some(want) = &wanted[r] else { continue };
        for (i, &want) in want.iter().enumerate() {
            let (b, j) = place(r, Buf::Output, i);
            if rank_mem[b][j] != want {
                return Err(format!("rank {r} output chunk {i} is wrong"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Mutations.

/// A small deterministic generator (splitmix64) for mutation sweeps.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0, 0)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Names of the mutation kinds [`mutate`] applies.
pub const MUTATIONS: [&str; 10] = [
    "drop step",
    "change peer",
    "shift offset",
    "duplicate step",
    "cut dependency",
    "swap adjacent steps",
    "change count",
    "change op",
    "change buffer",
    "change channel",
];

fn shift_loc(l: &mut Loc, up: bool) {
    l.off = if up {
        l.off.wrapping_add(1)
    } else {
        l.off.wrapping_sub(1)
    };
}

/// Applies mutation `kind` at a random place; returns a description, or `None` when the
/// schedule has no place for this kind (e.g. no dependencies to cut).
pub fn mutate(s: &mut Schedule, kind: usize, rng: &mut Rng) -> Option<String> {
    let places: Vec<(usize, usize, usize)> = s
        .ranks
        .iter()
        .enumerate()
        .flat_map(|(r, p)| {
            p.streams
                .iter()
                .enumerate()
                .flat_map(move |(si, st)| (0..st.steps.len()).map(move |i| (r, si, i)))
        })
        .collect();
    if kind == 4 {
        let with_deps: Vec<_> = places
            .iter()
            .filter(|&&(r, si, i)| !s.ranks[r].streams[si].steps[i].deps.is_empty())
            .copied()
            .collect();
        let &(r, si, i) = with_deps.get(rng.below(with_deps.len()))?;
        s.ranks[r].streams[si].steps[i].deps.pop();
        return Some(format!("cut a dependency of rank {r} stream {si} step {i}"));
    }
    let &(r, si, i) = places.get(rng.below(places.len()))?;
    let n = s.nranks;
    let steps = &mut s.ranks[r].streams[si].steps;
    let at = format!("rank {r} stream {si} step {i}");
    match kind {
        0 => {
            steps.remove(i);
            return Some(format!("drop {at}"));
        }
        3 => {
            let copy = steps[i].clone();
            steps.insert(i, copy);
            return Some(format!("duplicate {at}"));
        }
        5 => {
            if i + 1 >= steps.len() {
                return None;
            }
            steps.swap(i, i + 1);
            return Some(format!("swap {at} with the next"));
        }
        _ => {}
    }
    let step = &mut steps[i];
    let desc = match kind {
        1 => {
            let delta = 1 + rng.below(n.max(2) as usize) as u32;
            match &mut step.op {
                Op::Send { to, .. }
                | Op::RecvReduceSend { to, .. }
                | Op::RecvReduceCopySend { to, .. }
                | Op::RecvCopySend { to, .. }
                    if rng.below(2) == 0 =>
                {
                    *to = (*to + delta) % (n + 1);
                }
                Op::Recv { from, .. }
                | Op::RecvReduceCopy { from, .. }
                | Op::RecvReduceSend { from, .. }
                | Op::RecvReduceCopySend { from, .. }
                | Op::RecvCopySend { from, .. } => {
                    *from = (*from + delta) % (n + 1);
                }
                Op::Send { to, .. } => *to = (*to + delta) % (n + 1),
                _ => return None,
            }
            format!("change a peer of {at}")
        }
        2 => {
            let up = rng.below(2) == 0;
            let src_first = rng.below(2) == 0;
            match &mut step.op {
                Op::Send { src, .. } | Op::RecvReduceSend { src, .. } => shift_loc(src, up),
                Op::Recv { dst, .. } | Op::RecvCopySend { dst, .. } => shift_loc(dst, up),
                Op::RecvReduceCopy { src, dst, .. }
                | Op::RecvReduceCopySend { src, dst, .. }
                | Op::Copy { src, dst }
                | Op::Reduce { src, dst } => shift_loc(if src_first { src } else { dst }, up),
                Op::Nop => return None,
            }
            format!("shift an offset of {at}")
        }
        6 => {
            step.count = if rng.below(2) == 0 {
                step.count + 1
            } else {
                step.count.saturating_sub(1)
            };
            format!("change the count of {at}")
        }
        7 => {
            step.op = match step.op {
                Op::Recv { from, dst } => Op::RecvReduceCopy {
                    from,
                    src: dst,
                    dst,
                },
                Op::RecvReduceCopy { from, dst, .. } => Op::Recv { from, dst },
                Op::RecvCopySend { from, to, dst } => Op::RecvReduceCopySend {
                    from,
                    to,
                    src: dst,
                    dst,
                },
                Op::RecvReduceCopySend { from, to, dst, .. } => Op::RecvCopySend { from, to, dst },
                Op::RecvReduceSend { from, to, src } => Op::RecvCopySend { from, to, dst: src },
                Op::Copy { src, dst } => Op::Reduce { src, dst },
                Op::Reduce { src, dst } => Op::Copy { src, dst },
                Op::Send { to, src } => Op::Recv { from: to, dst: src },
                Op::Nop => return None,
            };
            format!("change the op of {at}")
        }
        8 => {
            let next = |b: Buf| match b {
                Buf::Input => Buf::Output,
                Buf::Output => Buf::Scratch,
                Buf::Scratch => Buf::Input,
            };
            match &mut step.op {
                Op::Send { src, .. } | Op::RecvReduceSend { src, .. } => src.buf = next(src.buf),
                Op::Recv { dst, .. } | Op::RecvCopySend { dst, .. } => dst.buf = next(dst.buf),
                Op::RecvReduceCopy { src, dst, .. }
                | Op::RecvReduceCopySend { src, dst, .. }
                | Op::Copy { src, dst }
                | Op::Reduce { src, dst } => {
                    if rng.below(2) == 0 {
                        src.buf = next(src.buf)
                    } else {
                        dst.buf = next(dst.buf)
                    }
                }
                Op::Nop => return None,
            }
            format!("change a buffer of {at}")
        }
        9 => {
            let st = &mut s.ranks[r].streams[si];
            st.channel += 1;
            format!("change the channel of rank {r} stream {si}")
        }
        _ => return None,
    };
    Some(desc)
}
