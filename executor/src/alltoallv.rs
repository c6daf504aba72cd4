//! AllToAllv: AllToAll with a count and a displacement per peer on both sides
//! (`MPI_Alltoallv`), on the threads and process backends (one host or many, TCP or RDMA),
//! replayed from the plan's AllToAll schedules. The CUDA backend lowers AllToAllv itself
//! (`cuda::lower::lower_v`), with [`blockwise`] choosing the entries it can take.
//!
//! # Rounds
//!
//! A call is two rounds on the plan's AllToAll entries, each under the call's own
//! fingerprint (an AllToAllv is never mistaken for an AllToAll, see `calls.rs`):
//!
//! 1. **Count exchange**: an AllToAll of six `u64` per peer. Rank `r` tells rank `p`
//!    what it sends it, what it expects from it (none when the caller leaves the receive
//!    counts to the exchange), its largest and total send count, its element type and which
//!    AllToAll entries it can replay with blocks of their own sizes. So every rank learns
//!    from the exchange alone what every rank needs to agree on: the largest block `G` and
//!    the total `T` of the job, the element type, the entries all ranks can replay block by
//!    block; and each end of every pair learns both sides' counts.
//! 2. **Data**: blocks move as the counts say. Where a sender's and its receiver's counts
//!    disagree, both ends move the smaller count (so nothing is read or written outside
//!    the blocks the caller described, and every rank runs the same schedule), and both
//!    ends return [`ExecError::BadBuffers`] naming the two ranks and their counts once the
//!    call completes; ranks whose pairs agree get their results.
//!
//! # Replay with per-block sizes
//!
//! An AllToAll entry is replayed *block by block* when its out-of-place program on every
//! rank only sends chunks of input block `b` to rank `b`, receives chunks from rank `p`
//! into output block `p`, and copies its own block, every step's chunk range inside one
//! block, with no scratch (pairwise and mesh schedules are). Chunk `j` of block `b`
//! (`cpb` chunks per block) then covers `[d_b + j·c_b/cpb, d_b + (j+1)·c_b/cpb)` of the
//! caller's buffer, `d_b` and `c_b` the block's displacement and count on that side
//! (`engine::Geometry::var`); the segments cut every block into the same number
//! of pieces, enough for the largest block of the job to fit a slot. Sender and receiver
//! compute a message's chunks from the same count, so they agree on its size. Of the
//! entries every rank replays block by block, the call takes the one the plan has for an
//! AllToAll whose blocks are all `G` elements (the largest block sets the segments and
//! whether messages fit LL slots), or the nearest one.
//!
//! Entries that relay blocks through scratch or other ranks (bruck, two-phase,
//! hierarchical, flow schedules) are replayed on blocks padded to `G` elements: the input
//! is gathered into `n` blocks of `G` elements, the entry runs as a plain AllToAll, and
//! each received block's first elements are copied out. Correct with any AllToAll
//! schedule, it moves `n·G` elements per rank, so a plan with a block-by-block entry uses
//! it at every size; `HCCL_DEBUG=INFO` says once per communicator when padding is used.
//! The built-in pairwise schedule ([`crate::fallback`]) is not substituted instead: its
//! connections (every pair of ranks) are not among a relaying plan's, for which the
//! region holds no ring and the network opened no socket.
//!
//! Either way the schedule that runs is one of the plan's AllToAll entries, verified (or
//! covered by a seal) before the communicator was built.

use crate::calls::CallPrint;
use crate::comm::{
    Call, Communicator, EntryInfo, RankState, Segments, Shared, chunk_cap, execute, lookup,
    lookup_where, replay,
};
use crate::dtype::{DataType, Element, Kernels, ReduceOp};
use crate::engine::{Bufs, VarBlocks};
use crate::error::{ExecError, Result};
use crate::program::{Entry, Kind};
use hccl_ir::{Buf, Collective};
use std::sync::Arc;

/// `u64` words each rank sends each peer in the count exchange.
const WORDS: usize = 6;
/// "No expectation": the receiver takes what the sender sends.
const ANY: u64 = u64::MAX;

/// One side of a call: per peer, a count and a displacement into a buffer of `len`
/// elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side<'a> {
    pub counts: &'a [usize],
    pub displs: &'a [usize],
    pub len: usize,
}

/// What the count exchange told this rank.
#[derive(Debug)]
pub(crate) struct Exchanged {
    /// Per peer: what it sends this rank.
    pub from: Vec<u64>,
    /// Per peer: what it expects from this rank ([`ANY`] when it takes what comes).
    pub expects: Vec<u64>,
    /// The largest block any rank sends.
    pub max: u64,
    /// Elements all ranks send together.
    pub total: u64,
    /// Entries (by index in the rank's entry list, below 64) every rank replays block by
    /// block.
    pub blockwise: u64,
}

fn bad(rank: u32, message: String) -> ExecError {
    ExecError::BadBuffers {
        rank,
        collective: Collective::AllToAll,
        message: format!("alltoallv: {message}"),
    }
}

/// Checks one side's counts and displacements against its buffer; `what` is "send" or
/// "receive". With `disjoint`, non-empty blocks must not overlap (an output).
pub(crate) fn check_side(
    rank: u32,
    n: u32,
    side: Side<'_>,
    what: &str,
    disjoint: bool,
) -> Result<()> {
    let n = n as usize;
    for (name, v) in [("counts", side.counts), ("displacements", side.displs)] {
        if v.len() != n {
            return Err(bad(
                rank,
                format!("{} {what} {name} for {n} ranks", v.len()),
            ));
        }
    }
    let buffer = if what == "send" { "input" } else { "output" };
    for b in 0..n {
        let (d, c) = (side.displs[b], side.counts[b]);
        // An empty block's displacement is never used (as in MPI).
        if c > 0 && d.checked_add(c).is_none_or(|end| end > side.len) {
            return Err(bad(
                rank,
                format!(
                    "{what} block {b} (displacement {d}, count {c}) ends past the {}-element {buffer}",
                    side.len
                ),
            ));
        }
    }
    if disjoint {
        let mut blocks: Vec<(usize, usize, usize)> = (0..n)
            .filter(|&b| side.counts[b] > 0)
            .map(|b| (side.displs[b], side.displs[b] + side.counts[b], b))
            .collect();
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            if w[1].0 < w[0].1 {
                let (a, b) = (w[0].2.min(w[1].2), w[0].2.max(w[1].2));
                return Err(bad(
                    rank,
                    format!("{what} blocks {a} and {b} overlap in the {buffer}"),
                ));
            }
        }
    }
    Ok(())
}

/// Whether this rank's program of `e` moves every chunk straight from input block `b` to
/// rank `b`'s output block of the sender (see the module doc), so that it can be replayed
/// with per-block sizes.
pub(crate) fn blockwise(e: &Entry, rank: u32, n: u32) -> bool {
    if e.collective != Collective::AllToAll
        || e.in_place
        || e.program.writes_input
        || e.max_scratch > 0
        || e.program.scratch_chunks > 0
        || n == 0
        || !e.chunks.is_multiple_of(n)
    {
        return false;
    }
    let cpb = e.chunks / n;
    // The block of a step's chunk range, when the range lies inside one block.
    let block = |buf: Buf, off: u32, count: u32| -> Option<(Buf, u32, u32)> {
        let first = off / cpb;
        let last = (off + count.max(1) - 1) / cpb;
        (first == last).then_some((buf, first, off % cpb))
    };
    e.program
        .streams
        .iter()
        .flatten()
        .all(|ins| match ins.kind {
            Kind::Nop => true,
            Kind::Send => block(ins.src.buf, ins.src.off, ins.count)
                .is_some_and(|(buf, b, _)| buf == Buf::Input && b == ins.send_peer),
            Kind::Recv => block(ins.dst.buf, ins.dst.off, ins.count)
                .is_some_and(|(buf, b, _)| buf == Buf::Output && b == ins.recv_peer),
            Kind::Copy => {
                let s = block(ins.src.buf, ins.src.off, ins.count);
                let d = block(ins.dst.buf, ins.dst.off, ins.count);
                s == Some((Buf::Input, rank, ins.src.off % cpb))
                    && d == Some((Buf::Output, rank, ins.src.off % cpb))
            }
            _ => false,
        })
}

/// The fingerprint of an AllToAllv's rounds: `count` 0 for the exchange, else the
/// elements all ranks send.
fn print(dtype: DataType, count: u64) -> CallPrint {
    CallPrint {
        collective: Collective::AllToAll,
        vary: true,
        dtype,
        op: ReduceOp::Sum,
        count,
        in_place: false,
    }
}

/// Round 1: tells every peer what this rank sends it and expects from it (`expect`:
/// `None` takes what comes), and learns the same of them.
pub(crate) fn exchange(
    shared: &Shared,
    rank: u32,
    st: &mut RankState,
    dtype: DataType,
    send: &[usize],
    expect: Option<&[usize]>,
) -> Result<Exchanged> {
    let n = shared.world as usize;
    let code = DataType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as u64;
    let mut mask = 0u64;
    for (i, e) in st.entries.iter().enumerate().take(64) {
        if blockwise(e, rank, shared.world) {
            mask |= 1 << i;
        }
    }
    let max = send.iter().copied().max().unwrap_or(0) as u64;
    let total = send
        .iter()
        .map(|&c| c as u64)
        .fold(0u64, u64::saturating_add);
    let mut words = vec![0u64; WORDS * n];
    for (p, w) in words.chunks_exact_mut(WORDS).enumerate() {
        let want = expect.map_or(ANY, |e| e[p] as u64);
        w.copy_from_slice(&[send[p] as u64, want, max, total, code, mask]);
    }
    let mut got = vec![0u64; WORDS * n];
    let call = Call {
        collective: Collective::AllToAll,
        kernels: Kernels::new(DataType::U64, ReduceOp::Sum),
        dtype: DataType::U64,
        op: ReduceOp::Sum,
        input: words.as_ptr().cast(),
        in_len: words.len(),
        output: got.as_mut_ptr().cast(),
        out_len: got.len(),
        in_place: false,
        // Of any element type: ranks that disagree on it learn so from the exchange.
        print: Some(print(DataType::U64, 0)),
    };
    execute(shared, rank, st, &call)?;
    let mut x = Exchanged {
        from: Vec::with_capacity(n),
        expects: Vec::with_capacity(n),
        max: 0,
        total: 0,
        blockwise: u64::MAX,
    };
    for (p, w) in got.chunks_exact(WORDS).enumerate() {
        if w[4] != code {
            let theirs = DataType::ALL
                .get(w[4] as usize)
                .map_or_else(|| format!("type #{}", w[4]), |d| d.to_string());
            return Err(ExecError::Invalid(format!(
                "rank {rank}: alltoallv: rank {p} passes {theirs} elements but rank {rank} \
                 passes {dtype}: all ranks must use one element type"
            )));
        }
        x.from.push(w[0]);
        x.expects.push(w[1]);
        x.max = x.max.max(w[2]);
        x.total = x.total.saturating_add(w[3]);
        x.blockwise &= w[5];
    }
    Ok(x)
}

/// What moves: per peer, the elements this rank sends it and receives from it (the
/// smaller count where the two ends disagree), and the disagreements, as messages.
pub(crate) fn agree(
    rank: u32,
    x: &Exchanged,
    send: &[usize],
    recv: Option<&[usize]>,
) -> (Vec<u64>, Vec<u64>, Vec<String>) {
    let mut errs = Vec::new();
    let mut sends = Vec::with_capacity(send.len());
    let mut recvs = Vec::with_capacity(send.len());
    for p in 0..send.len() {
        let mine = send[p] as u64;
        let theirs = x.expects[p];
        if theirs != ANY && theirs != mine {
            errs.push(format!(
                "rank {rank} sends {mine} elements to rank {p}, which expects {theirs}"
            ));
        }
        sends.push(if theirs == ANY {
            mine
        } else {
            mine.min(theirs)
        });
        let coming = x.from[p];
        let want = recv.map_or(coming, |r| r[p] as u64);
        if want != coming && p != rank as usize {
            errs.push(format!(
                "rank {p} sends {coming} elements to rank {rank}, which expects {want}"
            ));
        }
        recvs.push(coming.min(want));
    }
    (sends, recvs, errs)
}

/// The error for the disagreements [`agree`] found, if any.
pub(crate) fn disagreement(rank: u32, errs: Vec<String>) -> Result<()> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(bad(
        rank,
        format!(
            "send and receive counts disagree: {}; the blocks of those pairs were cut to the \
             smaller count",
            errs.join("; ")
        ),
    ))
}

/// The caller's buffers for round 2.
pub(crate) struct Data<'a> {
    pub kernels: Kernels,
    pub dtype: DataType,
    pub input: *const u8,
    pub send_displs: &'a [usize],
    pub output: *mut u8,
    pub recv_displs: &'a [usize],
}

/// Round 2: moves `sends[p]` elements from `send_displs[p]` to every rank `p`, and
/// `recvs[p]` elements from every rank `p` to `recv_displs[p]` (the blocks
/// [`check_side`] accepted, cut to [`agree`]'s counts).
///
/// # Safety
/// `data`'s pointers hold every block described, for the whole call.
pub(crate) unsafe fn move_blocks(
    shared: &Shared,
    rank: u32,
    st: &mut RankState,
    x: &Exchanged,
    data: &Data<'_>,
    sends: &[u64],
    recvs: &[u64],
) -> Result<()> {
    let n = u64::from(shared.world);
    let es = data.kernels.esize;
    if x.total == 0 {
        // Every rank sees the same total: none of them moves anything.
        return Ok(());
    }
    // The entry is chosen for the AllToAll whose every block is as large as the job's
    // largest: that block sets how many segments the call runs (and whether its messages
    // fit LL slots), as it would for that AllToAll; the average would pick LL for calls
    // whose largest block needs many LL segments.
    let bytes = x.max.saturating_mul(n).saturating_mul(es as u64);
    let blockwise = |i: usize| i < 64 && x.blockwise >> i & 1 == 1;
    if let Some(ei) = lookup_where(&st.entries, Collective::AllToAll, bytes, false, blockwise) {
        // SAFETY: forwarded.
        return unsafe { by_block(shared, rank, st, ei, x, data, sends, recvs) };
    }
    // SAFETY: forwarded.
    unsafe { padded(shared, rank, st, x, data, sends, recvs, bytes) }
}

/// Replays entry `ei` (block by block on every rank) with per-block sizes.
///
/// # Safety
/// As [`move_blocks`].
#[allow(clippy::too_many_arguments)]
unsafe fn by_block(
    shared: &Shared,
    rank: u32,
    st: &mut RankState,
    ei: usize,
    x: &Exchanged,
    data: &Data<'_>,
    sends: &[u64],
    recvs: &[u64],
) -> Result<()> {
    let n = u64::from(shared.world);
    let es = data.kernels.esize;
    let entry = &st.entries[ei];
    let cpb = (u64::from(entry.chunks) / n).max(1);
    let (cap, ll) = chunk_cap(&shared.config, entry, es)?;
    // Every block is cut into the same number of segments, enough for the largest block of
    // the job: `maxc` bounds every chunk, on every rank alike.
    let segmax = (cap as u64).saturating_mul(cpb);
    let segs = x.max.div_ceil(segmax).max(1);
    let maxc = x.max.div_ceil(segs).div_ceil(cpb) as usize;
    let table = |displs: &[usize], counts: &[u64]| -> Vec<(u64, u64)> {
        displs
            .iter()
            .zip(counts)
            // Empty blocks anywhere (their displacement is unchecked).
            .map(|(&d, &c)| (if c == 0 { 0 } else { d as u64 }, c))
            .collect()
    };
    let vb = VarBlocks {
        input: table(data.send_displs, sends),
        output: table(data.recv_displs, recvs),
        segs,
    };
    st.calls += 1;
    let seq = st.calls;
    let fp = (shared.config.check_calls != crate::config::CallCheck::Off).then(|| {
        let p = print(data.dtype, x.total).pack();
        crate::calls::publish(&shared.arena, rank, seq, p);
        (seq, p)
    });
    if let Some(t) = st.engine.trace.as_deref_mut() {
        t.note_call(seq, sends.iter().sum::<u64>().saturating_mul(es as u64));
    }
    tracing::trace!(
        rank,
        total = x.total,
        entry = entry.index,
        algorithm = %entry.algorithm,
        segments = segs,
        "alltoallv start (block by block)"
    );
    let RankState {
        entries,
        engine,
        scratch,
        ..
    } = st;
    let bufs = Bufs {
        input: data.input.cast_mut(),
        output: data.output,
        scratch: scratch.ptr(),
    };
    replay(
        shared,
        rank,
        engine,
        &entries[ei],
        &bufs,
        &data.kernels,
        fp,
        Segments {
            segs,
            seglen: 0,
            stride: 0,
            cpb,
            ll,
            var: Some((&vb, maxc)),
        },
    )
}

/// Replays the plan's AllToAll entry for `bytes` on blocks padded to the job's largest.
///
/// # Safety
/// As [`move_blocks`].
#[allow(clippy::too_many_arguments)]
unsafe fn padded(
    shared: &Shared,
    rank: u32,
    st: &mut RankState,
    x: &Exchanged,
    data: &Data<'_>,
    sends: &[u64],
    recvs: &[u64],
    bytes: u64,
) -> Result<()> {
    let n = shared.world as usize;
    let es = data.kernels.esize;
    let g = usize::try_from(x.max).ok();
    let Some(block) = g.and_then(|g| g.checked_mul(es)) else {
        return Err(ExecError::Invalid(format!(
            "rank {rank}: alltoallv: a block of {} elements is too large to pad",
            x.max
        )));
    };
    let Some(len) = block.checked_mul(n) else {
        return Err(ExecError::Invalid(format!(
            "rank {rank}: alltoallv: {n} blocks of {block} bytes are too large to pad"
        )));
    };
    if !st.vpadded_said {
        st.vpadded_said = true;
        let algo =
            crate::comm::lookup_where(&st.entries, Collective::AllToAll, bytes, false, |_| true)
                .map_or("none", |i| st.entries[i].algorithm.as_str());
        tracing::info!(
            rank,
            algorithm = algo,
            "alltoallv: no AllToAll entry of the plan moves blocks directly (it relays them); \
             replaying AllToAll on blocks padded to the largest count ({} elements now)",
            x.max
        );
    }
    let (mut sin, mut sout) = std::mem::take(&mut st.vstage);
    sin.reserve(len);
    sout.reserve(len);
    let (pin, pout) = (sin.ptr(), sout.ptr());
    // SAFETY: the caller's blocks are in bounds (checked), the stage blocks hold `block`
    // bytes each and every count is at most the largest block.
    unsafe {
        for (b, &c) in sends.iter().enumerate().filter(|(_, c)| **c > 0) {
            let src = data.input.add(data.send_displs[b] * es);
            crate::copy::copy(pin.add(b * block), src, c as usize * es);
        }
    }
    let call = Call {
        collective: Collective::AllToAll,
        kernels: data.kernels,
        dtype: data.dtype,
        op: ReduceOp::Sum,
        input: pin,
        in_len: len / es,
        output: pout,
        out_len: len / es,
        in_place: false,
        print: Some(print(data.dtype, x.total)),
    };
    let res = execute(shared, rank, st, &call);
    if res.is_ok() {
        // SAFETY: as above.
        unsafe {
            for (b, &c) in recvs.iter().enumerate().filter(|(_, c)| **c > 0) {
                let dst = data.output.add(data.recv_displs[b] * es);
                crate::copy::copy(dst, pout.add(b * block), c as usize * es);
            }
        }
    }
    st.vstage = (sin, sout);
    res
}

/// The AllToAllv calls (see the module's docs).
impl Communicator {
    /// The entry an AllToAllv would replay, as this rank sees the plan (see
    /// [this module](self)), `bytes` being `n` times its largest block (in bytes): the
    /// nearest entry it can replay block by block, else the AllToAll entry for `bytes`, whose
    /// algorithm is then marked `(padded)`.
    pub fn all_to_all_v_entry(&self, bytes: u64) -> Option<EntryInfo> {
        let st = self.state.as_ref()?;
        let n = self.shared.world;
        let direct = |i: usize| blockwise(&st.entries[i], self.rank, n);
        let (i, padded) =
            match lookup_where(&st.entries, Collective::AllToAll, bytes, false, direct) {
                Some(i) => (i, false),
                None => (
                    lookup(&st.entries, Collective::AllToAll, bytes, false)?,
                    true,
                ),
            };
        let e = &st.entries[i];
        Some(EntryInfo {
            index: e.index,
            algorithm: if padded {
                format!("{} (padded)", e.algorithm)
            } else {
                e.algorithm.clone()
            },
            protocol: e.protocol,
            chunks: e.chunks,
            in_place: e.in_place,
        })
    }

    /// AllToAllv (`MPI_Alltoallv`): `send_counts[p]` elements from `send_displs[p]` of this
    /// rank's input go to rank `p`, which receives them at its `recv_displs[r]`
    /// (`recv_counts[r]` elements, `r` this rank). Every slice has one entry per rank; counts
    /// may be zero; send blocks may overlap, receive blocks with elements may not.
    ///
    /// Every call first exchanges the counts (a small AllToAll), so counts that disagree
    /// between a sender and its receiver are an error, [`ExecError::BadBuffers`] naming both
    /// ranks and their counts, returned by both ranks once the call completes (the blocks of
    /// that pair move the smaller count; ranks whose pairs agree get their results). See
    /// [this module](self) for how the plan's AllToAll entries carry blocks of their own
    /// sizes.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<T: Element>(
        &mut self,
        input: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let mut state = self.take_state()?;
        let (rank, n) = (self.rank, self.shared.world);
        let shared = Arc::clone(&self.shared);
        let res = (|| {
            let send = Side {
                counts: send_counts,
                displs: send_displs,
                len: input.len(),
            };
            let recv = Side {
                counts: recv_counts,
                displs: recv_displs,
                len: output.len(),
            };
            check_side(rank, n, send, "send", false)?;
            check_side(rank, n, recv, "receive", true)?;
            let x = exchange(
                &shared,
                rank,
                &mut state,
                T::DTYPE,
                send_counts,
                Some(recv_counts),
            )?;
            let (sends, recvs, errs) = agree(rank, &x, send_counts, Some(recv_counts));
            let data = Data {
                kernels: Kernels::new(T::DTYPE, ReduceOp::Sum),
                dtype: T::DTYPE,
                input: input.as_ptr().cast(),
                send_displs,
                output: output.as_mut_ptr().cast(),
                recv_displs,
            };
            // SAFETY: the blocks were checked against the slices, which this call borrows.
            unsafe { move_blocks(&shared, rank, &mut state, &x, &data, &sends, &recvs)? };
            disagreement(rank, errs)
        })();
        self.finish(state, res)
    }

    /// AllToAllv whose receive counts come from the senders: `send_counts[p]` elements from
    /// `send_displs[p]` of this rank's input go to rank `p`. Returns the received blocks
    /// packed in rank order (rank `p`'s at the sum of the counts of the ranks before it) and
    /// the count received from each rank. Peers may pass either form
    /// ([`Communicator::all_to_all_v`] checks its receive counts against what comes).
    pub fn all_to_all_v_exchanged<T: Element>(
        &mut self,
        input: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
    ) -> Result<(Vec<T>, Vec<usize>)> {
        let mut state = self.take_state()?;
        let (rank, n) = (self.rank, self.shared.world);
        let shared = Arc::clone(&self.shared);
        let mut output = Vec::new();
        let res = (|| {
            let send = Side {
                counts: send_counts,
                displs: send_displs,
                len: input.len(),
            };
            check_side(rank, n, send, "send", false)?;
            let x = exchange(&shared, rank, &mut state, T::DTYPE, send_counts, None)?;
            let counts: Vec<usize> = x
                .from
                .iter()
                .map(|&c| usize::try_from(c).unwrap_or(usize::MAX))
                .collect();
            let mut displs = Vec::with_capacity(counts.len());
            let mut total = 0usize;
            for &c in &counts {
                displs.push(total);
                total = total.checked_add(c).ok_or_else(|| {
                    ExecError::Invalid(format!(
                        "rank {rank}: alltoallv: the blocks sent to it exceed the address space"
                    ))
                })?;
            }
            output = vec![T::default(); total];
            let (sends, recvs, errs) = agree(rank, &x, send_counts, None);
            let data = Data {
                kernels: Kernels::new(T::DTYPE, ReduceOp::Sum),
                dtype: T::DTYPE,
                input: input.as_ptr().cast(),
                send_displs,
                output: output.as_mut_ptr().cast(),
                recv_displs: &displs,
            };
            // SAFETY: the send blocks were checked against `input`, which this call borrows;
            // the receive blocks tile `output`.
            unsafe { move_blocks(&shared, rank, &mut state, &x, &data, &sends, &recvs)? };
            disagreement(rank, errs)?;
            Ok(counts)
        })();
        let res = match res {
            Ok(counts) => self.finish(state, Ok(())).map(|()| counts),
            Err(e) => self.finish(state, Err(e)).map(|()| Vec::new()),
        };
        res.map(|counts| (output, counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_are_checked() {
        let ok = Side {
            counts: &[2, 0, 3],
            displs: &[0, 9, 2],
            len: 5,
        };
        assert!(check_side(0, 3, ok, "receive", true).is_ok());
        let short = Side {
            counts: &[2, 0],
            ..ok
        };
        let e = check_side(0, 3, short, "send", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 send counts for 3 ranks"), "{e}");
        let past = Side {
            counts: &[2, 0, 4],
            ..ok
        };
        let e = check_side(1, 3, past, "send", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("send block 2 (displacement 2, count 4) ends past the 5-element input"),
            "{e}"
        );
        let overlap = Side {
            counts: &[3, 0, 2],
            ..ok
        };
        assert!(check_side(0, 3, overlap, "send", false).is_ok());
        let e = check_side(0, 3, overlap, "receive", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("receive blocks 0 and 2 overlap"), "{e}");
        let huge = Side {
            counts: &[usize::MAX, 0, 0],
            displs: &[1, 0, 0],
            len: 5,
        };
        assert!(check_side(0, 3, huge, "send", false).is_err());
    }

    #[test]
    fn disagreeing_counts_move_the_smaller_and_name_both_ranks() {
        let x = Exchanged {
            from: vec![4, 5, 0],
            expects: vec![ANY, 3, 7],
            max: 9,
            total: 20,
            blockwise: 1,
        };
        let (sends, recvs, errs) = agree(0, &x, &[4, 5, 7], Some(&[4, 2, 0]));
        assert_eq!(sends, [4, 3, 7]);
        assert_eq!(recvs, [4, 2, 0]);
        assert_eq!(
            errs,
            [
                "rank 0 sends 5 elements to rank 1, which expects 3",
                "rank 1 sends 5 elements to rank 0, which expects 2",
            ]
        );
    }
}
