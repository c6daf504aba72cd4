//! Plans compiled for execution: each entry's program for one rank, flattened into
//! instructions with resolved connection indices and dependency lists.
//!
//! Compilation also re-checks everything memory safety depends on (buffer bounds, peers,
//! dependency targets), so a plan that slipped past the verifier can make a call fail or time
//! out but never read or write outside a buffer.

use crate::error::{ExecError, Result};
use hccl_ir::{Buf, Collective, Loc, Op, PlanEntry, Protocol, Schedule};
use std::collections::BTreeMap;

/// A connection `(from, to, channel)`.
pub(crate) type ConnKey = (u32, u32, u32);

/// Every connection any entry of the plan uses, numbered densely (the arena layout index).
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnTable {
    index: BTreeMap<ConnKey, u32>,
}

impl ConnTable {
    /// Collects the connections of every schedule (identical on all ranks for the same plan).
    pub(crate) fn build<'a>(schedules: impl IntoIterator<Item = &'a Schedule>) -> ConnTable {
        ConnTable::build_for(schedules, |_| true)
    }

    /// Collects the connections with an end at a rank `local` accepts: a host's table (its
    /// shared region holds a ring for each), which every rank of the host builds alike from
    /// the programs of the host's ranks. Other ranks' programs may be missing (empty).
    pub(crate) fn build_for<'a>(
        schedules: impl IntoIterator<Item = &'a Schedule>,
        local: impl Fn(u32) -> bool,
    ) -> ConnTable {
        let mut index = BTreeMap::new();
        for sched in schedules {
            for (rank, prog) in sched.ranks.iter().enumerate() {
                let rank = rank as u32;
                for stream in &prog.streams {
                    for step in &stream.steps {
                        if let Some(to) = step.op.send_peer()
                            && (local(rank) || local(to))
                        {
                            index.insert((rank, to, stream.channel), 0);
                        }
                        if let Some(from) = step.op.recv_peer()
                            && (local(rank) || local(from))
                        {
                            index.insert((from, rank, stream.channel), 0);
                        }
                    }
                }
            }
        }
        for (i, v) in index.values_mut().enumerate() {
            *v = i as u32;
        }
        ConnTable { index }
    }

    /// Number of connections.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Every connection with its index.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ConnKey, u32)> + '_ {
        self.index.iter().map(|(k, v)| (*k, *v))
    }

    fn get(&self, key: ConnKey) -> Option<u32> {
        self.index.get(&key).copied()
    }
}

/// What an instruction does (the IR op without its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Recv,
    RecvReduceCopy,
    RecvReduceSend,
    RecvReduceCopySend,
    RecvCopySend,
    Copy,
    Reduce,
    Nop,
}

/// One step, ready to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Instr {
    pub kind: Kind,
    pub count: u32,
    pub src: Loc,
    pub dst: Loc,
    /// Incoming connection index (valid when the op receives).
    pub rconn: u32,
    /// Outgoing connection index (valid when the op sends).
    pub sconn: u32,
    pub recv_peer: u32,
    pub send_peer: u32,
    /// Range into [`Program::deps`].
    pub deps: (u32, u32),
}

/// One rank's program of one entry.
#[derive(Debug, Clone, Default)]
pub(crate) struct Program {
    pub streams: Vec<Vec<Instr>>,
    /// Each stream's channel.
    pub channels: Vec<u32>,
    /// Dependencies as `(stream, step)`.
    pub deps: Vec<(u32, u32)>,
    pub scratch_chunks: u32,
    /// Per stream: whether it holds a receive-reduce-send (needs a holding buffer).
    pub needs_hold: Vec<bool>,
    /// Whether any step writes the input buffer (then an out-of-place call stages the
    /// caller's input, which it must not modify).
    pub writes_input: bool,
    /// An out-of-place AllReduce program that computes the same result when its input and
    /// output are one buffer ([`aliases_safely`]): an in-place call runs it on the caller's
    /// buffer instead of staging a copy of it.
    pub alias_in_place: bool,
}

/// A plan entry prepared for one rank.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub index: usize,
    pub collective: Collective,
    pub min_bytes: u64,
    pub max_bytes: Option<u64>,
    pub in_place: bool,
    pub chunks: u32,
    pub algorithm: String,
    pub protocol: Protocol,
    /// Largest count of a message (a step with a peer) over all ranks (identical everywhere:
    /// it sizes the segments).
    pub max_count: u32,
    /// Largest scratch buffer over all ranks, in chunks (identical everywhere).
    pub max_scratch: u32,
    pub program: Program,
}

/// Most bytes of scratch a rank's entry may need at the largest chunk of a segment; beyond
/// it the segments are cut smaller (see [`Entry::geometry_count`]).
pub(crate) const SCRATCH_BUDGET: usize = 32 << 20;

impl Entry {
    /// The chunk count that sizes the segments for `slot_bytes`-byte slots: a chunk holds
    /// at most `slot_bytes / geometry_count` bytes, so the largest message fits a slot and
    /// the largest scratch fits [`SCRATCH_BUDGET`] (schedules forwarding through a lot of
    /// scratch, such as the flow AllToAll's, would otherwise need gigabytes). The same on
    /// every rank: it depends only on the schedule and the slot size.
    pub(crate) fn geometry_count(&self, slot_bytes: usize) -> u32 {
        let scratch = (self.max_scratch as usize)
            .saturating_mul(slot_bytes)
            .div_ceil(SCRATCH_BUDGET);
        self.max_count
            .max(u32::try_from(scratch).unwrap_or(u32::MAX))
            .max(1)
    }

    /// Whether the entry serves `bytes`.
    pub(crate) fn covers(&self, bytes: u64) -> bool {
        self.min_bytes <= bytes && self.max_bytes.is_none_or(|m| bytes < m)
    }
}

const NO_CONN: u32 = u32::MAX;

/// Rank `rank`'s share of what sizes an entry's segments on every rank ([`Entry::max_count`],
/// [`Entry::max_scratch`]): its largest message count and its scratch extent. The entry's
/// values are the largest over all ranks; a rank that holds only its host's programs gets
/// them from the job's rendezvous.
pub(crate) fn rank_limits(s: &Schedule, rank: u32) -> (u32, u32) {
    let Some(prog) = s.ranks.get(rank as usize) else {
        return (0, 0);
    };
    // Only messages pass through connection slots; local copies and reductions work chunk
    // by chunk in the caller's buffers and scratch (see `compile`).
    let count = prog
        .streams
        .iter()
        .flat_map(|st| &st.steps)
        .filter(|st| st.op.recv_peer().is_some() || st.op.send_peer().is_some())
        .map(|st| st.count)
        .max()
        .unwrap_or(0);
    (count, prog.scratch_chunks)
}

/// Compiles entry `index` of a plan for `rank`.
pub(crate) fn compile(
    index: usize,
    entry: &PlanEntry,
    rank: u32,
    conns: &ConnTable,
) -> Result<Entry> {
    let s = &entry.schedule;
    let n = s.nranks;
    let bad = |stream: usize, step: usize, message: String| ExecError::BadStep {
        entry: index,
        rank,
        stream: stream as u32,
        step: step as u32,
        message,
    };
    check_shape(s, |message| bad(0, 0, message))?;
    // Only messages pass through connection slots; local copies and reductions work chunk
    // by chunk in the caller's buffers and scratch, so a whole-buffer local copy (the root's
    // Input to Output of an out-of-place Broadcast of many chunks) must not shrink the
    // segments, nor make an entry unrunnable when its chunk count times the element size
    // exceeds a slot.
    let (max_count, max_scratch) = (0..n)
        .map(|r| rank_limits(s, r))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let prog = &s.ranks[rank as usize];
    let mut out = Program {
        scratch_chunks: prog.scratch_chunks,
        ..Program::default()
    };
    for (si, stream) in prog.streams.iter().enumerate() {
        let mut instrs = Vec::with_capacity(stream.steps.len());
        let mut hold = false;
        for (ti, step) in stream.steps.iter().enumerate() {
            let check_loc = |loc: Loc| -> Result<()> {
                let len = s.buffer_len(rank, loc.buf);
                if u64::from(loc.off) + u64::from(step.count) > u64::from(len) {
                    return Err(bad(
                        si,
                        ti,
                        format!(
                            "{loc} with count {} is outside the {}-chunk buffer",
                            step.count, len
                        ),
                    ));
                }
                Ok(())
            };
            let check_peer = |p: u32| -> Result<()> {
                if p >= n || p == rank {
                    return Err(bad(si, ti, format!("invalid peer {p}")));
                }
                Ok(())
            };
            let (kind, src, dst) = parts(step.op);
            if kind == Kind::RecvReduceSend {
                hold = true;
            }
            if dst.is_some_and(|d| d.buf == Buf::Input) {
                out.writes_input = true;
            }
            for loc in src.iter().chain(dst.iter()) {
                check_loc(*loc)?;
            }
            let mut rconn = NO_CONN;
            let mut sconn = NO_CONN;
            let recv_peer = step.op.recv_peer().unwrap_or(rank);
            let send_peer = step.op.send_peer().unwrap_or(rank);
            if let Some(p) = step.op.recv_peer() {
                check_peer(p)?;
                rconn = conns
                    .get((p, rank, stream.channel))
                    .ok_or_else(|| bad(si, ti, "connection missing".into()))?;
            }
            if let Some(p) = step.op.send_peer() {
                check_peer(p)?;
                sconn = conns
                    .get((rank, p, stream.channel))
                    .ok_or_else(|| bad(si, ti, "connection missing".into()))?;
            }
            let start = out.deps.len() as u32;
            for d in &step.deps {
                let ok = prog
                    .streams
                    .get(d.stream as usize)
                    .is_some_and(|st| (d.step as usize) < st.steps.len());
                if !ok {
                    return Err(bad(
                        si,
                        ti,
                        format!("dependency on missing step {}:{}", d.stream, d.step),
                    ));
                }
                out.deps.push((d.stream, d.step));
            }
            let unused = Loc::new(Buf::Scratch, 0);
            instrs.push(Instr {
                kind,
                count: step.count,
                src: src.unwrap_or(unused),
                dst: dst.unwrap_or(unused),
                rconn,
                sconn,
                recv_peer,
                send_peer,
                deps: (start, out.deps.len() as u32),
            });
        }
        out.streams.push(instrs);
        out.channels.push(stream.channel);
        out.needs_hold.push(hold);
    }
    out.alias_in_place = !s.in_place
        && matches!(s.collective, Collective::AllReduce)
        && s.input_chunks == s.output_chunks
        && (aliases_safely(prog, s.input_chunks) || aliases_through_peers(s, rank));
    Ok(Entry {
        index,
        collective: s.collective,
        min_bytes: entry.min_bytes,
        max_bytes: entry.max_bytes,
        in_place: s.in_place,
        chunks: s.chunks,
        algorithm: entry.algorithm.clone(),
        protocol: entry.protocol,
        max_count,
        max_scratch,
        program: out,
    })
}

/// Checks a schedule's shape before its steps: a program per rank, buffer extents that fit
/// its collective and chunks, a root among its ranks. `header` makes the error.
fn check_shape(s: &Schedule, header: impl Fn(String) -> ExecError) -> Result<()> {
    let n = s.nranks;
    if s.ranks.len() != n as usize {
        return Err(header(format!(
            "schedule lists {} rank programs for {n} ranks",
            s.ranks.len()
        )));
    }
    match s.collective.buffer_chunks(n, s.chunks) {
        Some((i, o)) if i == s.input_chunks && o == s.output_chunks && s.chunks > 0 => {}
        _ => {
            return Err(header(format!(
                "buffer extents {}/{} do not fit {} with {} chunks",
                s.input_chunks, s.output_chunks, s.collective, s.chunks
            )));
        }
    }
    if let Some(root) = s.collective.root()
        && root >= n
    {
        return Err(header(format!("root {root} out of range")));
    }
    Ok(())
}

/// Whether a rank's out-of-place program leaves every result as it is when input chunk `i`
/// and output chunk `i` are the same memory (an AllReduce's buffers share their geometry):
/// for every chunk, the steps that read it from the input and those that write it to the
/// output are in one stream, and no input read comes after the chunk's first output write.
/// A step may read and write the same chunk only where it works element by element on the
/// same index (its source and destination ranges start at the same chunk) and reads the
/// destination's old value nowhere (not a local reduction `dst ⊕= src`). A copy of input
/// chunks to the same output chunks is no write at all on one buffer. Writes to the input
/// disqualify the program. The engine's kernels take exactly aliased operands (a copy onto
/// itself, a reduction into one of its operands); messages sent by pointer out of the input
/// are settled by address before anything writes there, whatever buffer the write names.
fn aliases_safely(prog: &hccl_ir::RankProgram, chunks: u32) -> bool {
    let chunks = chunks as usize;
    // Per chunk: the stream that touches it, and whether its output was written yet.
    let mut owner: Vec<Option<usize>> = vec![None; chunks];
    let mut written = vec![false; chunks];
    for (si, stream) in prog.streams.iter().enumerate() {
        for step in &stream.steps {
            let Some((reads, writes)) = alias_access(step) else {
                return false;
            };
            // Reads first: a step writing what it reads does so element by element.
            for (range, write) in [(reads, false), (writes, true)] {
                for i in range {
                    let ours = match owner.get_mut(i) {
                        Some(o) => *o.get_or_insert(si) == si,
                        None => false,
                    };
                    if !ours || (!write && written[i]) {
                        return false;
                    }
                    written[i] |= write;
                }
            }
        }
    }
    true
}

/// The input chunks `step` reads and the output chunks it writes when both buffers are one,
/// as chunk ranges; `None` when the step cannot run on one buffer: it writes the input, or
/// it reads and writes overlapping chunks other than element by element on the same index
/// (shifted ranges, or a local reduction `dst ⊕= src`, which reads its destination's old
/// value). A copy of input chunks to the same output chunks writes nothing.
fn alias_access(step: &hccl_ir::Step) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let (kind, src, dst) = parts(step.op);
    let range = |l: Loc| l.off as usize..l.off as usize + step.count as usize;
    if dst.is_some_and(|d| d.buf == Buf::Input) {
        return None;
    }
    let reads = src.filter(|l| l.buf == Buf::Input).map_or(0..0, range);
    let writes = dst.filter(|l| l.buf == Buf::Output).map_or(0..0, range);
    if reads.start < writes.end && writes.start < reads.end {
        if reads.start != writes.start || kind == Kind::Reduce {
            return None;
        }
        if kind == Kind::Copy {
            return Some((reads, 0..0));
        }
    }
    Some((reads, writes))
}

/// Per rank and stream the id of its first step; per step its successors.
type StepGraph = (Vec<Vec<usize>>, Vec<Vec<u32>>);

/// The happens-before graph of a schedule's `total` steps: per rank and stream the id of
/// its first step, and each step's successors (the next step of its stream, the steps that
/// depend on it, the step receiving its message). `None` when a dependency names a missing
/// step or two streams of a rank share a connection (their messages' order is the run's).
fn step_graph(s: &Schedule, total: usize) -> Option<StepGraph> {
    // Global step ids: per rank and stream, the id of its first step.
    let mut base: Vec<Vec<usize>> = Vec::with_capacity(s.ranks.len());
    let mut next = 0usize;
    for p in &s.ranks {
        base.push(
            p.streams
                .iter()
                .map(|st| {
                    let b = next;
                    next += st.steps.len();
                    b
                })
                .collect(),
        );
    }
    // Successors: the next step of the stream, dependents, the receiving step of a message.
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); total];
    let mut sends: BTreeMap<ConnKey, (usize, Vec<u32>)> = BTreeMap::new();
    let mut recvs: BTreeMap<ConnKey, (usize, Vec<u32>)> = BTreeMap::new();
    for (r, p) in s.ranks.iter().enumerate() {
        for (si, st) in p.streams.iter().enumerate() {
            for (pc, step) in st.steps.iter().enumerate() {
                let id = base[r][si] + pc;
                if pc + 1 < st.steps.len() {
                    succ[id].push((id + 1) as u32);
                }
                for d in &step.deps {
                    let (ds, dt) = (d.stream as usize, d.step as usize);
                    if p.streams.get(ds).is_none_or(|t| dt >= t.steps.len()) {
                        return None;
                    }
                    succ[base[r][ds] + dt].push(id as u32);
                }
                let on = |list: &mut BTreeMap<ConnKey, (usize, Vec<u32>)>, key| {
                    let (owner, ids) = list.entry(key).or_insert((si, Vec::new()));
                    ids.push(id as u32);
                    // Two streams on one connection: their messages' order is the run's.
                    *owner == si
                };
                let r = r as u32;
                if let Some(to) = step.op.send_peer()
                    && !on(&mut sends, (r, to, st.channel))
                {
                    return None;
                }
                if let Some(from) = step.op.recv_peer()
                    && !on(&mut recvs, (from, r, st.channel))
                {
                    return None;
                }
            }
        }
    }
    for (key, (_, out)) in &sends {
        if let Some((_, into)) = recvs.get(key) {
            for (&a, &b) in out.iter().zip(into) {
                succ[a as usize].push(b);
            }
        }
    }
    Some((base, succ))
}

/// Most steps over all ranks [`aliases_through_peers`] follows messages through.
const ALIAS_PROOF_STEPS: usize = 50_000;

/// Whether `rank`'s out-of-place program keeps its results with input and output as one
/// buffer, its order proven through the whole schedule: every step that reads input chunk
/// `i` happens before every step that writes output chunk `i` (other than a copy from input
/// `i`, or the reading step itself working element by element), following stream order,
/// dependencies and messages (the `k`-th send on a connection before its `k`-th receive).
/// Ranks' programs this rank does not hold (empty) only take paths away: then the proof
/// fails and the call stages. `false` beyond [`ALIAS_PROOF_STEPS`] steps.
fn aliases_through_peers(s: &Schedule, rank: u32) -> bool {
    let Some(prog) = s.ranks.get(rank as usize) else {
        return false;
    };
    let total: usize = s
        .ranks
        .iter()
        .flat_map(|p| &p.streams)
        .map(|st| st.steps.len())
        .sum();
    if total > ALIAS_PROOF_STEPS {
        return false;
    }
    let Some((base, succ)) = step_graph(s, total) else {
        return false;
    };
    // This rank's reads of input chunks and writes of output chunks.
    let chunks = s.input_chunks as usize;
    let mut reads: Vec<Vec<u32>> = vec![Vec::new(); chunks];
    let mut writes: Vec<Vec<u32>> = vec![Vec::new(); chunks];
    for (si, st) in prog.streams.iter().enumerate() {
        for (pc, step) in st.steps.iter().enumerate() {
            let id = (base[rank as usize][si] + pc) as u32;
            let Some((r, w)) = alias_access(step) else {
                return false;
            };
            for (range, list) in [(r, &mut reads), (w, &mut writes)] {
                for i in range {
                    match list.get_mut(i) {
                        Some(v) => v.push(id),
                        None => return false,
                    }
                }
            }
        }
    }
    // Each reading step must reach every write of the chunks it reads (or be that write:
    // `alias_access` admits a step writing what it reads only element by element).
    let mut readers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, rd) in reads.iter().enumerate() {
        for &r in rd {
            readers.entry(r).or_default().push(i);
        }
    }
    let mut seen = vec![u32::MAX; total];
    let mut stack = Vec::new();
    for (mark, (&from, read)) in readers.iter().enumerate() {
        let mark = mark as u32;
        stack.push(from);
        seen[from as usize] = mark;
        while let Some(v) = stack.pop() {
            for &w in &succ[v as usize] {
                if seen[w as usize] != mark {
                    seen[w as usize] = mark;
                    stack.push(w);
                }
            }
        }
        if !read
            .iter()
            .all(|&i| writes[i].iter().all(|&w| seen[w as usize] == mark))
        {
            return false;
        }
    }
    true
}

/// The instruction kind of `op`, and the locations it reads and writes.
#[inline]
fn parts(op: Op) -> (Kind, Option<Loc>, Option<Loc>) {
    match op {
        Op::Send { src, .. } => (Kind::Send, Some(src), None),
        Op::Recv { dst, .. } => (Kind::Recv, None, Some(dst)),
        Op::RecvReduceCopy { src, dst, .. } => (Kind::RecvReduceCopy, Some(src), Some(dst)),
        Op::RecvReduceSend { src, .. } => (Kind::RecvReduceSend, Some(src), None),
        Op::RecvReduceCopySend { src, dst, .. } => (Kind::RecvReduceCopySend, Some(src), Some(dst)),
        Op::RecvCopySend { dst, .. } => (Kind::RecvCopySend, None, Some(dst)),
        Op::Copy { src, dst } => (Kind::Copy, Some(src), Some(dst)),
        Op::Reduce { src, dst } => (Kind::Reduce, Some(src), Some(dst)),
        Op::Nop => (Kind::Nop, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hccl_ir::{RankProgram, Schedule, Step, Stream};

    fn input(off: u32) -> Loc {
        Loc::new(Buf::Input, off)
    }
    fn output(off: u32) -> Loc {
        Loc::new(Buf::Output, off)
    }
    fn program(streams: Vec<Vec<Step>>) -> RankProgram {
        RankProgram {
            scratch_chunks: 0,
            streams: streams
                .into_iter()
                .enumerate()
                .map(|(c, steps)| Stream {
                    channel: c as u32,
                    steps,
                })
                .collect(),
        }
    }

    /// The rings and all-pairs schedules read each input chunk before they write its output.
    #[test]
    fn the_built_in_allreduces_alias_safely() {
        for n in 1..=5 {
            for (channels, parts) in [(1, 1), (2, 1), (2, 3)] {
                let s = crate::fallback::ring_allreduce(n, channels, parts, false);
                for (r, prog) in s.ranks.iter().enumerate() {
                    assert!(aliases_safely(prog, s.input_chunks), "ring n={n} rank {r}");
                }
            }
            let s = crate::fallback::allpairs_allreduce(n, false);
            for prog in &s.ranks {
                assert!(aliases_safely(prog, s.input_chunks), "allpairs n={n}");
            }
        }
    }

    #[test]
    fn an_output_written_before_its_input_is_read_does_not_alias() {
        let send = |src| Step::new(Op::Send { to: 1, src }, 1);
        let recv = |dst| Step::new(Op::Recv { from: 1, dst }, 1);
        // Read then write: safe; write then read: not.
        assert!(aliases_safely(
            &program(vec![vec![send(input(0)), recv(output(0))]]),
            1
        ));
        assert!(!aliases_safely(
            &program(vec![vec![recv(output(0)), send(input(0))]]),
            1
        ));
        // The same chunk read in one stream and written in another: no order, not safe.
        assert!(!aliases_safely(
            &program(vec![vec![send(input(0))], vec![recv(output(0))]]),
            1
        ));
        // Other chunks in other streams are independent.
        assert!(aliases_safely(
            &program(vec![vec![send(input(0))], vec![recv(output(1))]]),
            2
        ));
    }

    /// Two ranks, one chunk, every stream on channel 0.
    fn two_ranks(rank0: Vec<Vec<Step>>, rank1: Vec<Vec<Step>>) -> Schedule {
        let mut s = Schedule::empty(Collective::AllReduce, 2, 1, false).expect("schedule");
        for (r, streams) in [rank0, rank1].into_iter().enumerate() {
            s.ranks[r] = RankProgram {
                scratch_chunks: 1,
                streams: streams
                    .into_iter()
                    .map(|steps| Stream { channel: 0, steps })
                    .collect(),
            };
        }
        s
    }

    /// Rank 0 sends its input from one stream and receives the result into its output on
    /// another: safe only when the result it receives follows from what it sent.
    #[test]
    fn the_order_of_other_streams_is_proven_through_the_peers() {
        let send = |to, src| Step::new(Op::Send { to, src }, 1);
        let recv = |from, dst| Step::new(Op::Recv { from, dst }, 1);
        let rank0 = || vec![vec![send(1, input(0))], vec![recv(1, output(0))]];
        // Rank 1 reduces rank 0's chunk into its own and sends the sum back.
        let reduce_back = vec![vec![
            Step::new(
                Op::RecvReduceCopy {
                    from: 0,
                    src: input(0),
                    dst: output(0),
                },
                1,
            ),
            send(0, output(0)),
        ]];
        let s = two_ranks(rank0(), reduce_back);
        assert!(!aliases_safely(&s.ranks[0], 1), "no order within rank 0");
        assert!(aliases_through_peers(&s, 0));
        assert!(aliases_through_peers(&s, 1));
        // Rank 1 sends before it receives: rank 0's output may land before it sent.
        let independent = vec![
            vec![send(0, input(0))],
            vec![recv(0, Loc::new(Buf::Scratch, 0))],
        ];
        let s = two_ranks(rank0(), independent);
        assert!(!aliases_through_peers(&s, 0));
        // Without rank 1's program (another host's) nothing is proven.
        let s = two_ranks(rank0(), Vec::new());
        assert!(!aliases_through_peers(&s, 0));
        // A peer's dependency on a step it does not have proves nothing, and panics nowhere.
        let mut bad = send(0, input(0));
        bad.deps.push(hccl_ir::Dep {
            stream: 0,
            step: 99,
        });
        let s = two_ranks(rank0(), vec![vec![bad]]);
        assert!(!aliases_through_peers(&s, 0));
    }

    #[test]
    fn a_step_reads_and_writes_one_chunk_only_element_by_element() {
        let rrc = |src, dst, count| Step::new(Op::RecvReduceCopy { from: 1, src, dst }, count);
        // dst = msg ⊕ src on the same chunks: element by element, safe.
        assert!(aliases_safely(
            &program(vec![vec![rrc(input(0), output(0), 2)]]),
            2
        ));
        // Shifted by one chunk: chunk 1's output is written before its input is read.
        assert!(!aliases_safely(
            &program(vec![vec![rrc(input(0), output(1), 2)]]),
            3
        ));
        // A local reduction reads its destination: `out ⊕= in` on one chunk would double it.
        let reduce = Step::new(
            Op::Reduce {
                src: input(0),
                dst: output(0),
            },
            1,
        );
        assert!(!aliases_safely(&program(vec![vec![reduce]]), 1));
        // A copy onto itself is a no-op.
        let copy = Step::new(
            Op::Copy {
                src: input(0),
                dst: output(0),
            },
            1,
        );
        assert!(aliases_safely(&program(vec![vec![copy]]), 1));
        // Writing the input disqualifies the program.
        let scribble = Step::new(
            Op::Copy {
                src: output(0),
                dst: input(0),
            },
            1,
        );
        assert!(!aliases_safely(&program(vec![vec![scribble]]), 1));
    }
}
