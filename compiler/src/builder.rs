//! A builder for writing chunk-level schedules by hand, in the spirit of MSCCLang.
//!
//! Ops are recorded per rank in call order. [`ScheduleBuilder::build`] then
//!
//! 1. optionally fuses a receive that is immediately forwarded into one op
//!    (`Recv`+`Send` → `RecvCopySend`, `RecvReduceCopy`+`Send` → `RecvReduceCopySend`, and
//!    `RecvReduceCopySend` whose stored result is never read again → `RecvReduceSend`);
//! 2. assigns streams so that on every rank all ops using one connection direction
//!    `(peer, channel)` share one stream (the IR rule), and ops joined by a fused op share
//!    one stream — otherwise connections get streams of their own, for concurrency;
//! 3. derives cross-stream dependencies from read/write hazards (RAW, WAR, WAW) on
//!    `(rank, chunk)`, honouring in-place buffer aliasing;
//! 4. turns every [`ScheduleBuilder::fence`] that follows some op into a `Nop` step of one
//!    fence stream that waits for the streams used since the previous fence; later steps
//!    wait for that `Nop` (one dependency each, so fenced rounds stay linear in size).
//!
//! The order in which ops are recorded is the program order of each rank, so write ops
//! step-major (all ranks' step 0, then step 1, …) to get pipelined schedules.
//!
//! ```
//! use hccl_compiler::builder::ScheduleBuilder;
//! use hccl_ir::{Collective, Loc};
//!
//! // A 3-rank ring AllGather: every rank's block walks around the ring.
//! let n = 3;
//! let mut b = ScheduleBuilder::new(Collective::AllGather, n, n, false);
//! for r in 0..n {
//!     b.copy((r, Loc::input(0)), (r, Loc::output(r)), 1, 0);
//! }
//! for hop in 0..n - 1 {
//!     for owner in 0..n {
//!         let from = (owner + hop) % n;
//!         let to = (from + 1) % n;
//!         let src = if hop == 0 { Loc::input(0) } else { Loc::output(owner) };
//!         b.copy((from, src), (to, Loc::output(owner)), 1, 0);
//!     }
//! }
//! let schedule = b.build().unwrap();
//! assert_eq!(schedule.nranks, 3);
//! // The middle hop was fused into receive-copy-send.
//! assert!(schedule.ranks.iter().flat_map(|r| &r.streams).flat_map(|s| &s.steps)
//!     .any(|s| s.op.mnemonic() == "rcs"));
//! ```

use hccl_ir::{Buf, Collective, Dep, Loc, Op, Rank, RankProgram, Schedule, Step, StepRef, Stream};
use rustc_hash::FxHashMap;
use thiserror::Error;

/// Why a builder could not produce a schedule. Op indices count the ops recorded on the rank.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BuildError {
    /// The chunk count does not fit the collective (see [`Collective::buffer_chunks`]).
    #[error("{collective} over {nranks} ranks cannot be cut into {chunks} chunks")]
    BadChunks {
        collective: Collective,
        nranks: u32,
        chunks: u32,
    },
    /// A rank (the op's own or a peer) outside `0..nranks`.
    #[error("op #{index} on rank {rank}: rank {bad} is out of range (nranks {nranks})")]
    RankOutOfRange {
        rank: Rank,
        index: usize,
        bad: Rank,
        nranks: u32,
    },
    /// A location plus count beyond its buffer.
    #[error("op #{index} on rank {rank}: {loc} + {count} chunks exceeds the buffer extent {len}")]
    OutOfBounds {
        rank: Rank,
        index: usize,
        loc: Loc,
        count: u32,
        len: u32,
    },
    /// More chunks on one rank (input, output and scratch together) than a schedule may
    /// have: [`MAX_CHUNKS`], what the verifier models at most.
    #[error(
        "rank {rank}: {chunks} chunks of input, output and scratch, more than the {} a schedule may have (the most the verifier models)",
        MAX_CHUNKS
    )]
    TooLarge { rank: Rank, chunks: u64 },
    /// An op that moves no data.
    #[error("op #{index} on rank {rank}: count must be at least 1")]
    ZeroCount { rank: Rank, index: usize },
    /// A send or receive addressed to the rank itself.
    #[error("op #{index} on rank {rank}: sends to or receives from itself")]
    SelfPeer { rank: Rank, index: usize },
}

/// The most chunks of one rank's buffers together: the verifier's limit
/// ([`hccl_ir::verify::MAX_SLOTS`]), which also keeps every canonical address within `u32`.
pub const MAX_CHUNKS: u64 = hccl_ir::verify::MAX_SLOTS;

/// Channel marker of a fence (a `Nop` that is not emitted).
const FENCE: u32 = u32::MAX;

/// No op (an [`Origins`] slot a step does not use).
const NO_OP: u32 = u32::MAX;

/// The end of a segment's readers' list (`Buffers::reads`).
const NO_READ: u32 = u32::MAX;

/// One recorded op.
#[derive(Debug, Clone, Copy)]
struct BOp {
    op: Op,
    count: u32,
    channel: u32,
    /// Its index in its rank's recording order.
    origin: u32,
    /// For a fused op, the recorded index of the send folded into it; else [`NO_OP`].
    fused: u32,
}

/// Which recorded ops made each step of a built schedule ([`ScheduleBuilder::build_traced`]):
/// what lets a front end that records ops point a verifier error, which names a step, back at
/// the line of its own code that recorded the op.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins {
    /// `ranks[r][stream][step]`: recorded indices on rank `r` ([`NO_OP`] in unused slots).
    ranks: Vec<Vec<Vec<[u32; 2]>>>,
}

impl Origins {
    /// The indices, in rank `at.rank`'s recording order, of the ops that made step `at`: one,
    /// or two for a fused receive-and-forward (the receive first). Empty for a step this
    /// builder did not make.
    pub fn of(&self, at: StepRef) -> Vec<usize> {
        self.ranks
            .get(at.rank as usize)
            .and_then(|r| r.get(at.stream as usize))
            .and_then(|s| s.get(at.step as usize))
            .map(|pair| {
                pair.iter()
                    .filter(|&&i| i != NO_OP)
                    .map(|&i| i as usize)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Builds a [`Schedule`] from chunk-level ops. See the module docs.
#[derive(Debug, Clone)]
pub struct ScheduleBuilder {
    collective: Collective,
    nranks: u32,
    chunks: u32,
    in_place: bool,
    input_chunks: u32,
    output_chunks: u32,
    ops: Vec<Vec<BOp>>,
    scratch: Vec<u32>,
    fusion: bool,
    error: Option<BuildError>,
    /// Record only this rank's ops ([`ScheduleBuilder::keep_only`]).
    only: Option<Rank>,
}

impl ScheduleBuilder {
    /// A builder for `collective` over `nranks` ranks with the buffer cut into `chunks` chunks.
    /// A `chunks` that does not fit the collective is reported by [`ScheduleBuilder::build`].
    pub fn new(collective: Collective, nranks: u32, chunks: u32, in_place: bool) -> Self {
        let (extents, error) = match collective.buffer_chunks(nranks, chunks) {
            Some(e) => (e, None),
            None => (
                (0, 0),
                Some(BuildError::BadChunks {
                    collective,
                    nranks,
                    chunks,
                }),
            ),
        };
        ScheduleBuilder {
            collective,
            nranks,
            chunks,
            in_place,
            input_chunks: extents.0,
            output_chunks: extents.1,
            ops: vec![Vec::new(); nranks as usize],
            scratch: vec![0; nranks as usize],
            fusion: true,
            error,
            only: None,
        }
    }

    /// Records only `rank`'s ops from now on; the others are dropped as they are recorded, so
    /// [`ScheduleBuilder::build`] gives a schedule whose other programs are empty. What a
    /// rank-symmetric family needs to build its template alone: fusion, streams and
    /// dependencies are each rank's own affair, so `rank`'s program comes out as in the
    /// whole schedule.
    pub fn keep_only(&mut self, rank: Rank) -> &mut Self {
        self.only = Some(rank);
        self
    }

    /// The collective being built.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Chunks the collective buffer is cut into.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Whether the schedule is in-place.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Input buffer extent in chunks.
    pub fn input_chunks(&self) -> u32 {
        self.input_chunks
    }

    /// Output buffer extent in chunks.
    pub fn output_chunks(&self) -> u32 {
        self.output_chunks
    }

    /// Enables or disables the fusion pass (on by default). Schedules written with the
    /// explicit fused ops gain nothing from it.
    pub fn set_fusion(&mut self, on: bool) -> &mut Self {
        self.fusion = on;
        self
    }

    /// Allocates `count` fresh scratch chunks on `rank` and returns their location.
    pub fn scratch(&mut self, rank: Rank, count: u32) -> Loc {
        match self.scratch.get_mut(rank as usize) {
            Some(top) => {
                let off = *top;
                *top = top.saturating_add(count);
                Loc::scratch(off)
            }
            None => {
                self.fail(BuildError::RankOutOfRange {
                    rank,
                    index: 0,
                    bad: rank,
                    nranks: self.nranks,
                });
                Loc::scratch(0)
            }
        }
    }

    /// Allocates `count` scratch chunks at the same offset on every rank (the offset is the
    /// highest current scratch top) and returns the offset.
    pub fn scratch_all(&mut self, count: u32) -> u32 {
        let off = self.scratch.iter().copied().max().unwrap_or(0);
        for top in &mut self.scratch {
            *top = off.saturating_add(count);
        }
        off
    }

    /// The location the caller's data of input chunk `k` lives at for an in-place schedule
    /// of this collective on `rank` (AllGather: the rank's slice of the output).
    pub fn input_loc(&self, rank: Rank, k: u32) -> Loc {
        match (self.in_place, self.collective) {
            (true, Collective::AllGather) => Loc::output(rank * self.input_chunks + k),
            _ => Loc::input(k),
        }
    }

    /// The location output chunk `k` of `rank` is stored at (in-place ReduceScatter: the
    /// rank's slice of the input; in-place AllReduce etc.: the input, which is the output).
    pub fn output_loc(&self, rank: Rank, k: u32) -> Loc {
        match (self.in_place, self.collective) {
            (true, Collective::ReduceScatter) => Loc::input(rank * self.output_chunks + k),
            _ => Loc::output(k),
        }
    }

    // ----- chunk-oriented ops -----

    /// Copies `count` chunks from `from` to `to`: a local `Copy` on one rank, else a `Send`
    /// on the source and a `Recv` on the destination over `channel`.
    pub fn copy(&mut self, from: (Rank, Loc), to: (Rank, Loc), count: u32, channel: u32) {
        if from.0 == to.0 {
            if from.1 != to.1 {
                self.push(
                    from.0,
                    Op::Copy {
                        src: from.1,
                        dst: to.1,
                    },
                    count,
                    channel,
                );
            }
        } else {
            self.send(from.0, to.0, from.1, count, channel);
            self.recv(to.0, from.0, to.1, count, channel);
        }
    }

    /// `dst ← dst ⊕ src`: a local `Reduce`, or a `Send` and a `RecvReduceCopy`.
    pub fn reduce(&mut self, src: (Rank, Loc), dst: (Rank, Loc), count: u32, channel: u32) {
        self.reduce_to(src, dst.1, dst, count, channel);
    }

    /// `dst ← acc ⊕ src` where `acc` and `dst` are locations on the rank `dst.0` (useful for
    /// out-of-place schedules that must not overwrite their input).
    pub fn reduce_to(
        &mut self,
        src: (Rank, Loc),
        acc: Loc,
        dst: (Rank, Loc),
        count: u32,
        channel: u32,
    ) {
        if src.0 == dst.0 {
            if acc != dst.1 {
                self.push(
                    dst.0,
                    Op::Copy {
                        src: acc,
                        dst: dst.1,
                    },
                    count,
                    channel,
                );
            }
            self.push(
                dst.0,
                Op::Reduce {
                    src: src.1,
                    dst: dst.1,
                },
                count,
                channel,
            );
        } else {
            self.send(src.0, dst.0, src.1, count, channel);
            self.push(
                dst.0,
                Op::RecvReduceCopy {
                    from: src.0,
                    src: acc,
                    dst: dst.1,
                },
                count,
                channel,
            );
        }
    }

    // ----- connection-level ops (one side of a transfer each) -----

    /// Records an arbitrary op on `rank`.
    pub fn push(&mut self, rank: Rank, op: Op, count: u32, channel: u32) {
        if self.only.is_some_and(|o| o != rank) {
            return;
        }
        let Some(list) = self.ops.get(rank as usize) else {
            self.fail(BuildError::RankOutOfRange {
                rank,
                index: 0,
                bad: rank,
                nranks: self.nranks,
            });
            return;
        };
        let index = list.len();
        if let Some(err) = self.check(rank, index, &op, count) {
            self.fail(err);
            return;
        }
        self.ops[rank as usize].push(BOp {
            op,
            count,
            channel,
            origin: index as u32,
            fused: NO_OP,
        });
    }

    /// `rank` sends `src` to `to`.
    pub fn send(&mut self, rank: Rank, to: Rank, src: Loc, count: u32, channel: u32) {
        self.push(rank, Op::Send { to, src }, count, channel);
    }

    /// `rank` receives from `from` into `dst`.
    pub fn recv(&mut self, rank: Rank, from: Rank, dst: Loc, count: u32, channel: u32) {
        self.push(rank, Op::Recv { from, dst }, count, channel);
    }

    /// `rank`: `dst ← received ⊕ src`.
    pub fn recv_reduce_copy(
        &mut self,
        rank: Rank,
        from: Rank,
        src: Loc,
        dst: Loc,
        count: u32,
        channel: u32,
    ) {
        self.push(rank, Op::RecvReduceCopy { from, src, dst }, count, channel);
    }

    /// `rank`: send `received ⊕ src` to `to`, storing nothing.
    pub fn recv_reduce_send(
        &mut self,
        rank: Rank,
        from: Rank,
        to: Rank,
        src: Loc,
        count: u32,
        channel: u32,
    ) {
        self.push(rank, Op::RecvReduceSend { from, to, src }, count, channel);
    }

    /// `rank`: `dst ← received ⊕ src`, then send `dst` to `to`.
    #[allow(clippy::too_many_arguments)]
    pub fn recv_reduce_copy_send(
        &mut self,
        rank: Rank,
        from: Rank,
        to: Rank,
        src: Loc,
        dst: Loc,
        count: u32,
        channel: u32,
    ) {
        self.push(
            rank,
            Op::RecvReduceCopySend { from, to, src, dst },
            count,
            channel,
        );
    }

    /// `rank`: `dst ← received`, and forward it to `to`.
    pub fn recv_copy_send(
        &mut self,
        rank: Rank,
        from: Rank,
        to: Rank,
        dst: Loc,
        count: u32,
        channel: u32,
    ) {
        self.push(rank, Op::RecvCopySend { from, to, dst }, count, channel);
    }

    /// Orders `rank`: every op recorded on it after the fence waits for every op recorded
    /// before it (used to run rounds one after another, e.g. pairwise exchanges).
    pub fn fence(&mut self, rank: Rank) {
        if self.only.is_some_and(|o| o != rank) {
            return;
        }
        if let Some(list) = self.ops.get_mut(rank as usize) {
            let origin = list.len() as u32;
            list.push(BOp {
                op: Op::Nop,
                count: 0,
                channel: FENCE,
                origin,
                fused: NO_OP,
            });
        }
    }

    /// Number of ops recorded so far on all ranks.
    pub fn op_count(&self) -> usize {
        self.ops.iter().map(Vec::len).sum()
    }

    /// The first error an op recorded so far made (what [`ScheduleBuilder::build`] will
    /// return), if any: lets a front end name the op that caused it as it is recorded.
    pub fn error(&self) -> Option<&BuildError> {
        self.error.as_ref()
    }

    /// Number of ops (fences included) recorded so far on `rank`: the index the next op
    /// recorded there gets, as [`BuildError`] and [`Origins`] count them.
    pub fn ops_on(&self, rank: Rank) -> usize {
        self.ops.get(rank as usize).map_or(0, Vec::len)
    }

    fn fail(&mut self, err: BuildError) {
        if self.error.is_none() {
            self.error = Some(err);
        }
    }

    /// Where `rank`'s input and output start in its canonical address space, and how many
    /// chunks they take together (in-place aliasing resolved; the scratch buffer follows).
    fn data_chunks(&self, rank: Rank) -> (u32, u32, u64) {
        let (i, o) = (self.input_chunks, self.output_chunks);
        match (self.in_place, self.collective) {
            (false, _) => (0, i, u64::from(i) + u64::from(o)),
            (true, Collective::AllGather) => (rank * i, 0, u64::from(o)),
            (true, Collective::ReduceScatter) => (0, rank * o, u64::from(i)),
            (true, _) => (0, 0, u64::from(i.max(o))),
        }
    }

    fn extent(&self, rank: Rank, buf: Buf) -> u32 {
        match buf {
            Buf::Input => self.input_chunks,
            Buf::Output => self.output_chunks,
            Buf::Scratch => self.scratch.get(rank as usize).copied().unwrap_or(0),
        }
    }

    fn check(&self, rank: Rank, index: usize, op: &Op, count: u32) -> Option<BuildError> {
        if count == 0 && !matches!(op, Op::Nop) {
            return Some(BuildError::ZeroCount { rank, index });
        }
        for peer in [op.send_peer(), op.recv_peer()].into_iter().flatten() {
            if peer >= self.nranks {
                return Some(BuildError::RankOutOfRange {
                    rank,
                    index,
                    bad: peer,
                    nranks: self.nranks,
                });
            }
            if peer == rank {
                return Some(BuildError::SelfPeer { rank, index });
            }
        }
        for loc in [op.src(), op.dst()].into_iter().flatten() {
            // Scratch grows on demand, up to the most a schedule may have.
            let len = match loc.buf {
                Buf::Scratch => MAX_CHUNKS as u32,
                _ => self.extent(rank, loc.buf),
            };
            if u64::from(loc.off) + u64::from(count) > u64::from(len) {
                return Some(BuildError::OutOfBounds {
                    rank,
                    index,
                    loc,
                    count,
                    len,
                });
            }
        }
        None
    }

    /// Finishes the schedule: fusion, stream assignment, dependencies.
    pub fn build(self) -> Result<Schedule, BuildError> {
        self.finish(None)
    }

    /// [`ScheduleBuilder::build`], also saying which recorded ops made each step.
    pub fn build_traced(self) -> Result<(Schedule, Origins), BuildError> {
        let mut origins = Origins {
            ranks: vec![Vec::new(); self.nranks as usize],
        };
        let schedule = self.finish(Some(&mut origins))?;
        Ok((schedule, origins))
    }

    fn finish(mut self, mut origins: Option<&mut Origins>) -> Result<Schedule, BuildError> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        // Scratch used beyond what was allocated grows the scratch buffer.
        for (r, ops) in self.ops.iter().enumerate() {
            for b in ops {
                for loc in [b.op.src(), b.op.dst()].into_iter().flatten() {
                    if loc.buf == Buf::Scratch {
                        let top = &mut self.scratch[r];
                        *top = (*top).max(loc.off.saturating_add(b.count));
                    }
                }
            }
        }
        let mut schedule =
            Schedule::empty(self.collective, self.nranks, self.chunks, self.in_place).ok_or(
                BuildError::BadChunks {
                    collective: self.collective,
                    nranks: self.nranks,
                    chunks: self.chunks,
                },
            )?;
        for rank in 0..self.nranks {
            let chunks = self.data_chunks(rank).2 + u64::from(self.scratch[rank as usize]);
            if chunks > MAX_CHUNKS {
                return Err(BuildError::TooLarge { rank, chunks });
            }
        }
        let ops = std::mem::take(&mut self.ops);
        let mut bufs = Buffers::default();
        for (r, mut list) in ops.into_iter().enumerate() {
            if list.is_empty() {
                // Nothing to fuse or order (every rank but one of a template): skip the
                // work arrays, whose cuts cost the whole buffer per rank.
                schedule.ranks[r].scratch_chunks = self.scratch[r];
                continue;
            }
            let space = AddrSpace::new(&self, r as Rank, &list, &mut bufs);
            if self.fusion {
                list = fuse(list, &space, &mut bufs);
            }
            let slot = origins.as_deref_mut().map(|o| &mut o.ranks[r]);
            schedule.ranks[r] = RankProgram {
                scratch_chunks: self.scratch[r],
                streams: assign_streams(&list, &space, &mut bufs, slot),
            };
            space.recycle(&mut bufs);
        }
        Ok(schedule)
    }
}

/// Work arrays, per segment (see [`AddrSpace`]) but for the cuts', reused from rank to rank.
#[derive(Debug, Default)]
struct Buffers {
    /// [`AddrSpace::new`]'s cuts, one bit per canonical address.
    marks: Vec<u64>,
    /// [`AddrSpace::bounds`]' allocation.
    bounds: Vec<u32>,
    /// [`AddrSpace::segment_at`]'s allocation.
    segment_at: Vec<u32>,
    cover: Vec<u32>,
    live: Vec<bool>,
    last_writer_stream: Vec<u32>,
    writer: Vec<Option<(u32, u32)>>,
    /// Per segment, the newest entry of its readers' list in `reads` ([`NO_READ`]: none).
    readers: Vec<u32>,
    /// The readers' lists, newest first: `(stream, step, older entry)`. One arena for all
    /// segments (a `Vec` per segment cost one allocation per segment per schedule).
    reads: Vec<(u32, u32, u32)>,
}

/// Clears `v` and fills it with `len` copies of `val`, keeping its allocation.
fn reset<T: Clone>(v: &mut Vec<T>, len: u32, val: T) {
    v.clear();
    v.resize(len as usize, val);
}

/// Canonical per-rank chunk addresses with in-place aliasing resolved, numbered by
/// *segment*: the rank's ops' ranges cut the canonical space at their ends (and at the
/// scratch buffer's start), and every address of one segment is read and written by the
/// same ops. So the passes below keep one entry per segment instead of one per chunk,
/// with the same results: a schedule of 150k chunks per rank in a few thousand ranges
/// (packed trees) costs its ranges, not its chunks.
struct AddrSpace {
    input_base: u32,
    output_base: u32,
    scratch_base: u32,
    /// Segments.
    len: u32,
    /// Each segment's first canonical address, then the end of the space.
    bounds: Vec<u32>,
    /// The segment starting at each address of `bounds` (other entries are stale).
    segment_at: Vec<u32>,
}

impl AddrSpace {
    /// The space of `rank`'s `ops`, in the allocations of `bufs`' `marks`, `bounds` and
    /// `segment_at`.
    fn new(b: &ScheduleBuilder, rank: Rank, ops: &[BOp], bufs: &mut Buffers) -> AddrSpace {
        // (At most `MAX_CHUNKS` in all: `finish` checked.)
        let (input_base, output_base, data) = b.data_chunks(rank);
        let (data, s) = (data as u32, b.scratch[rank as usize]);
        let mut space = AddrSpace {
            input_base,
            output_base,
            scratch_base: data,
            len: 0,
            bounds: std::mem::take(&mut bufs.bounds),
            segment_at: std::mem::take(&mut bufs.segment_at),
        };
        // The cuts, as bits over the canonical space (and its end), read out in order.
        let end = data + s;
        let marks = &mut bufs.marks;
        reset(marks, end / 64 + 1, 0u64);
        let mut mark = |a: u32| marks[(a / 64) as usize] |= 1 << (a % 64);
        mark(0);
        mark(data);
        mark(end);
        for op in ops.iter().filter(|b| b.channel != FENCE) {
            for loc in [op.op.src(), op.op.dst()].into_iter().flatten() {
                let a = space.canonical(loc);
                mark(a);
                mark(a + op.count);
            }
        }
        let (bounds, segment_at) = (&mut space.bounds, &mut space.segment_at);
        bounds.clear();
        if segment_at.len() <= end as usize {
            segment_at.resize(end as usize + 1, 0);
        }
        for (w, &word) in marks.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let a = w as u32 * 64 + bits.trailing_zeros();
                segment_at[a as usize] = bounds.len() as u32;
                bounds.push(a);
                bits &= bits - 1;
            }
        }
        space.len = bounds.len() as u32 - 1;
        space
    }

    /// Hands the allocations back to `bufs`.
    fn recycle(self, bufs: &mut Buffers) {
        bufs.bounds = self.bounds;
        bufs.segment_at = self.segment_at;
    }

    /// The canonical address of `loc`.
    fn canonical(&self, loc: Loc) -> u32 {
        let base = match loc.buf {
            Buf::Input => self.input_base,
            Buf::Output => self.output_base,
            Buf::Scratch => self.scratch_base,
        };
        base + loc.off
    }

    /// The segment that starts at `loc` (every op's locations start one, see [`Self::new`]).
    fn addr(&self, loc: Loc) -> u32 {
        self.segment_at[self.canonical(loc) as usize]
    }

    /// `loc` and the `count` chunks after it, as segments.
    fn range(&self, loc: Loc, count: u32) -> Range {
        let a = self.canonical(loc);
        let first = self.segment_at[a as usize];
        (first, self.segment_at[(a + count) as usize] - first)
    }

    fn is_scratch(&self, segment: u32) -> bool {
        self.bounds[segment as usize] >= self.scratch_base
    }
}

/// A range of segments `(first, count)`.
type Range = (u32, u32);

fn reads_writes(b: &BOp, space: &AddrSpace) -> ([Option<Range>; 2], Option<Range>) {
    let range = |loc: Loc| space.range(loc, b.count);
    let mut reads = [b.op.src().map(range), None];
    if let Op::Reduce { dst, .. } = b.op {
        reads[1] = Some(range(dst));
    }
    (reads, b.op.dst().map(range))
}

/// The fusion pass over one rank's ops (see the module docs).
fn fuse(list: Vec<BOp>, space: &AddrSpace, bufs: &mut Buffers) -> Vec<BOp> {
    let n = list.len();
    let mut out: Vec<Option<BOp>> = list.into_iter().map(Some).collect();
    // Candidate receive op covering each segment.
    let cover = &mut bufs.cover;
    reset(cover, space.len, u32::MAX);
    // Whether a candidate's stored data is still intact, and the fence epoch it was made
    // valid in (a fence invalidates every candidate by starting a new epoch).
    let mut valid: Vec<bool> = vec![false; n];
    let mut valid_epoch: Vec<u32> = vec![0; n];
    let mut epoch = 0u32;
    // Last op index that sent on each (peer, channel).
    let mut last_send: FxHashMap<(Rank, u32), usize> = FxHashMap::default();
    let mut any = false;
    for i in 0..n {
        let Some(b) = out[i] else { continue };
        if b.channel == FENCE {
            epoch += 1;
            continue;
        }
        // A plain send that forwards exactly what a candidate receive stored.
        if let Op::Send { to, src } = b.op {
            let a = space.addr(src);
            let cand = cover.get(a as usize).copied().unwrap_or(u32::MAX);
            if cand != u32::MAX {
                let j = cand as usize;
                if let (Some(x), true) = (out[j], valid[j] && valid_epoch[j] == epoch) {
                    let dst_ok = x.op.dst().map(|d| space.addr(d)) == Some(a);
                    let conn_ok = last_send.get(&(to, b.channel)).is_none_or(|&k| k < j);
                    if dst_ok && x.count == b.count && x.channel == b.channel && conn_ok {
                        let fused = match x.op {
                            Op::Recv { from, dst } => Some(Op::RecvCopySend { from, to, dst }),
                            Op::RecvReduceCopy { from, src, dst } => {
                                Some(Op::RecvReduceCopySend { from, to, src, dst })
                            }
                            _ => None,
                        };
                        if let Some(op) = fused {
                            out[j] = Some(BOp {
                                op,
                                fused: b.origin,
                                ..x
                            });
                            out[i] = None;
                            last_send.insert((to, b.channel), j);
                            valid[j] = false;
                            any = true;
                            continue;
                        }
                    }
                }
            }
        }
        let (_, write) = reads_writes(&b, space);
        if let Some((a, c)) = write {
            for k in a..a + c {
                let j = cover[k as usize];
                if j != u32::MAX {
                    valid[j as usize] = false;
                }
                cover[k as usize] = u32::MAX;
            }
            if matches!(b.op, Op::Recv { .. } | Op::RecvReduceCopy { .. }) {
                valid[i] = true;
                valid_epoch[i] = epoch;
                for k in a..a + c {
                    cover[k as usize] = i as u32;
                }
            }
        }
        if let Some(p) = b.op.send_peer() {
            last_send.insert((p, b.channel), i);
        }
    }
    let mut list: Vec<BOp> = out.into_iter().flatten().collect();
    if !any {
        return list;
    }
    // Backward liveness: a stored result nobody reads again need not be stored.
    // live[a]: the value at a is read before being overwritten (or survives to the end).
    let live = &mut bufs.live;
    live.clear();
    live.extend((0..space.len).map(|a| !space.is_scratch(a)));
    for b in list.iter_mut().rev() {
        if let Op::RecvReduceCopySend { from, to, src, dst } = b.op {
            let (d, c) = space.range(dst, b.count);
            if (d..d + c).all(|a| !live[a as usize]) {
                b.op = Op::RecvReduceSend { from, to, src };
            }
        }
        let (reads, write) = reads_writes(b, space);
        if let Some((a, c)) = write {
            for k in a..a + c {
                live[k as usize] = false;
            }
        }
        for (a, c) in reads.into_iter().flatten() {
            for k in a..a + c {
                live[k as usize] = true;
            }
        }
    }
    list
}

/// Union-find root.
fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// Assigns one rank's ops to streams and adds cross-stream hazard dependencies: the ops of
/// connections that relaying ops join share a stream, local ops join the stream that
/// produced their data (else their channel's local stream), streams are ordered by
/// (channel, first op), and every op waits for the latest conflicting step of other streams.
fn assign_streams(
    list: &[BOp],
    space: &AddrSpace,
    bufs: &mut Buffers,
    origins: Option<&mut Vec<Vec<[u32; 2]>>>,
) -> Vec<Stream> {
    let (mut parent, op_node) = connection_components(list);
    let (group_of_op, groups) = group_ops(list, space, bufs, &mut parent, &op_node);
    // Order groups by (channel, first op index).
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g]);
    let mut stream_id = vec![0u32; groups.len()];
    for (sid, &g) in order.iter().enumerate() {
        stream_id[g] = sid as u32;
    }
    let mut streams: Vec<Stream> = order
        .iter()
        .map(|&g| Stream {
            channel: groups[g].0,
            steps: Vec::new(),
        })
        .collect();
    add_hazards(
        list,
        space,
        bufs,
        (&group_of_op, &stream_id),
        &mut streams,
        origins,
    );
    streams
}

/// Union-find over connection directions `(is_send, peer, channel)`: an op that both
/// receives and sends joins its two directions. Returns the forest and each op's node (its
/// send direction, else its receive direction; `None` for local ops).
fn connection_components(list: &[BOp]) -> (Vec<usize>, Vec<Option<usize>>) {
    // Connection directions: (is_send, peer, channel) → union-find node.
    let mut conn: FxHashMap<(bool, Rank, u32), usize> = FxHashMap::default();
    let mut parent: Vec<usize> = Vec::new();
    let mut node_of = |key: (bool, Rank, u32), parent: &mut Vec<usize>| -> usize {
        *conn.entry(key).or_insert_with(|| {
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    let mut op_node: Vec<Option<usize>> = vec![None; list.len()];
    for (i, b) in list.iter().enumerate() {
        let s =
            b.op.send_peer()
                .map(|p| node_of((true, p, b.channel), &mut parent));
        let r =
            b.op.recv_peer()
                .map(|p| node_of((false, p, b.channel), &mut parent));
        if let (Some(s), Some(r)) = (s, r) {
            let (a, c) = (find(&mut parent, s), find(&mut parent, r));
            if a != c {
                parent[a.max(c)] = a.min(c);
            }
        }
        op_node[i] = s.or(r);
    }
    (parent, op_node)
}

/// Each op's stream group, and per group its `(channel, first op)`: comm ops by their
/// connection component, local ops with their data's producer or their channel's local
/// stream, fences that follow some op in one fence group (`usize::MAX`: a fence that does
/// not).
fn group_ops(
    list: &[BOp],
    space: &AddrSpace,
    bufs: &mut Buffers,
    parent: &mut [usize],
    op_node: &[Option<usize>],
) -> (Vec<usize>, Vec<(u32, usize)>) {
    // Stream ids: components and per-channel local streams, ordered by (channel, first op).
    let last_writer_stream = &mut bufs.last_writer_stream;
    reset(last_writer_stream, space.len, u32::MAX);
    let mut group_of_op: Vec<usize> = Vec::with_capacity(list.len());
    // Group keys: component root for comm ops; usize::MAX - channel for local streams.
    let mut comp_group: FxHashMap<usize, usize> = FxHashMap::default();
    let mut groups: Vec<(u32, usize)> = Vec::new(); // (channel, first op)
    // Fences that follow some op become `Nop` steps of one fence stream (on channel 0).
    let mut fence_group: Option<usize> = None;
    let mut since_fence = false;
    for (i, b) in list.iter().enumerate() {
        let (reads, write) = reads_writes(b, space);
        if b.channel == FENCE {
            let g = if since_fence {
                *fence_group.get_or_insert_with(|| {
                    groups.push((0, i));
                    groups.len() - 1
                })
            } else {
                usize::MAX
            };
            since_fence = false;
            group_of_op.push(g);
            continue;
        }
        since_fence = true;
        let g = match op_node[i] {
            Some(node) => {
                let root = find(parent, node);
                *comp_group.entry(root).or_insert_with(|| {
                    groups.push((b.channel, i));
                    groups.len() - 1
                })
            }
            None => {
                // Join the stream that produced the data, else the channel's local stream.
                let producer = reads[0]
                    .map(|(a, _)| last_writer_stream[a as usize])
                    .filter(|&g| g != u32::MAX && groups[g as usize].0 == b.channel);
                match producer {
                    Some(g) => g as usize,
                    None => *comp_group
                        .entry(usize::MAX - b.channel as usize)
                        .or_insert_with(|| {
                            groups.push((b.channel, i));
                            groups.len() - 1
                        }),
                }
            }
        };
        if let Some((a, c)) = write {
            for k in a..a + c {
                last_writer_stream[k as usize] = g as u32;
            }
        }
        group_of_op.push(g);
    }
    (group_of_op, groups)
}

/// Appends every op to its stream with the dependencies its hazards need: the latest
/// conflicting step (read after write, write after read or write) of each other stream not
/// already waited for, and the latest fence; fences become `Nop` steps waiting for every
/// stream used since the previous one. Records the ops' origins when asked.
fn add_hazards(
    list: &[BOp],
    space: &AddrSpace,
    bufs: &mut Buffers,
    (group_of_op, stream_id): (&[usize], &[u32]),
    streams: &mut [Stream],
    mut origins: Option<&mut Vec<Vec<[u32; 2]>>>,
) {
    // Hazards.
    let writer = &mut bufs.writer;
    reset(writer, space.len, None);
    let readers = &mut bufs.readers;
    reset(readers, space.len, NO_READ);
    let reads_of = &mut bufs.reads;
    reads_of.clear();
    if let Some(o) = origins.as_deref_mut() {
        *o = vec![Vec::new(); streams.len()];
    }
    let mut waited: Vec<FxHashMap<u32, u32>> = vec![FxHashMap::default(); streams.len()];
    // The latest fence's `Nop` step, and the streams that got steps since it.
    let mut fence: Option<(u32, u32)> = None;
    let mut touched: Vec<u32> = Vec::new();
    let mut need: Vec<(u32, u32)> = Vec::new();
    let mut is_touched: Vec<bool> = vec![false; streams.len()];
    for (i, b) in list.iter().enumerate() {
        if b.channel == FENCE {
            // The `Nop` waits for the last step of every stream used since the previous
            // fence (earlier steps are covered through that fence's `Nop`).
            let Some(&g) = group_of_op.get(i).filter(|&&g| g != usize::MAX) else {
                continue;
            };
            let sid = stream_id[g];
            let mut deps: Vec<Dep> = touched
                .iter()
                .filter(|&&s| s != sid)
                .map(|&s| Dep {
                    stream: s,
                    step: streams[s as usize].steps.len() as u32 - 1,
                })
                .collect();
            deps.sort_unstable();
            for &s in &touched {
                is_touched[s as usize] = false;
            }
            touched.clear();
            let step = streams[sid as usize].steps.len() as u32;
            streams[sid as usize].steps.push(Step {
                op: Op::Nop,
                count: 0,
                deps,
            });
            if let Some(o) = origins.as_deref_mut() {
                o[sid as usize].push([b.origin, NO_OP]);
            }
            fence = Some((sid, step));
            continue;
        }
        let sid = stream_id[group_of_op[i]];
        if !is_touched[sid as usize] {
            is_touched[sid as usize] = true;
            touched.push(sid);
        }
        let step = streams[sid as usize].steps.len() as u32;
        need.clear();
        let mut want = |d: (u32, u32)| {
            if d.0 != sid {
                need.push(d);
            }
        };
        if let Some(f) = fence {
            want(f);
        }
        let (reads, write) = reads_writes(b, space);
        for (a, c) in reads.iter().flatten() {
            for k in *a..a + c {
                if let Some(w) = writer[k as usize] {
                    want(w);
                }
            }
        }
        if let Some((a, c)) = write {
            for k in a..a + c {
                if let Some(w) = writer[k as usize] {
                    want(w);
                }
                let mut at = readers[k as usize];
                while at != NO_READ {
                    let (s, st, older) = reads_of[at as usize];
                    want((s, st));
                    at = older;
                }
            }
        }
        // The latest step wanted of each other stream, in stream order.
        need.sort_unstable();
        let mut deps = Vec::new();
        let known = &mut waited[sid as usize];
        for (i, &(s, st)) in need.iter().enumerate() {
            if need.get(i + 1).is_some_and(|next| next.0 == s) {
                continue;
            }
            if known.get(&s).is_none_or(|&k| k < st) {
                known.insert(s, st);
                deps.push(Dep {
                    stream: s,
                    step: st,
                });
            }
        }
        // Record accesses: reads first, then the write supersedes.
        for (a, c) in reads.iter().flatten() {
            for k in *a..a + c {
                // Repeated reads by one stream update its entry when it is the latest one
                // (a full search would be quadratic when many streams read one chunk);
                // duplicates are harmless, the latest step per stream wins above.
                let head = &mut readers[k as usize];
                match reads_of.get_mut(*head as usize) {
                    Some(e) if e.0 == sid => e.1 = step,
                    _ => {
                        reads_of.push((sid, step, *head));
                        *head = (reads_of.len() - 1) as u32;
                    }
                }
            }
        }
        if let Some((a, c)) = write {
            for k in a..a + c {
                writer[k as usize] = Some((sid, step));
                readers[k as usize] = NO_READ;
            }
        }
        streams[sid as usize].steps.push(Step {
            op: b.op,
            count: b.count,
            deps,
        });
        if let Some(o) = origins.as_deref_mut() {
            o[sid as usize].push([b.origin, b.fused]);
        }
    }
}
