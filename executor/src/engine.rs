//! The replay engine, shared by every backend.
//!
//! # Streams and threads
//!
//! Each rank replays its own program on one thread (the caller's thread, or a worker for
//! non-blocking calls). The streams of the rank are interleaved cooperatively: the engine
//! sweeps over the streams, and on each one runs steps in order for as long as the next step
//! can complete without blocking (its dependencies are done, its incoming message has
//! arrived, a slot on its outgoing connection is free). Steps that both receive and send
//! (`rcs`, `rrcs`, `rrs`) run in two phases, receive then send, exactly as two concurrent
//! threads would, so the connection semantics of the IR (FIFO per connection,
//! [`hccl_ir::CONNECTION_SLOTS`] buffered messages) hold and a schedule the verifier proves
//! deadlock-free cannot deadlock here. This keeps one runnable thread per rank, which is what
//! a 2-core machine running 8 ranks needs, and no thread is ever created per call.
//!
//! # Signalling
//!
//! Connections are the single-producer single-consumer rings of [`crate::arena`]: one
//! Release store publishes a message, one Release store frees a slot, and each side caches
//! the other's counter so that polling touches the peer's cache line only when the cached
//! value says "blocked". When a sweep makes no progress the engine backs off: spin-loop
//! hints, then `yield_now` (so oversubscribed ranks hand the core to the peer they wait
//! for), then short sleeps after 10 ms. How long it spins adapts to what yields show
//! (see `Waiter`): a rank that shares its core with its peer yields almost at once, a rank
//! whose core is shared with unrelated work keeps spinning rather than give its share away.
//! Spinning also ends after 15 µs whatever the budget: a poll of a rank with network
//! connections reads its sockets, and a budget sized for shared-memory polls would hold the
//! core for hundreds of microseconds.
//! While waiting it watches the abort word (another rank failed) and the timeout, and, once
//! a wait passes 5 ms, whether the peer it waits for is still alive (a file
//! read in the process backend: far too slow for every short wait). A wait that got as far
//! as reading the clock is charged, when it ends, to the peer it named ([`crate::waits`]:
//! the straggler report).
//!
//! # Single copy
//!
//! Where ranks share an address space (the threads backend), a single-chunk message of at
//! least 16 KiB is published as a pointer to the sender's memory and the receiver copies or
//! reduces straight out of it — one memory pass instead of two. The sender keeps a list of
//! such outstanding messages; before it writes memory one of them covers, and before a call
//! returns, it settles each: consumed already, or copied into its slot (materialized) when
//! the receiver has not started, or awaited when the receiver is reading it right now (see
//! [`crate::arena`]). So a send still never waits for its receiver, and the caller's
//! buffers are never read after the call returns.
//!
//! # Chunks, elements and segments
//!
//! A call of `N` elements is replayed in one or more *segments*. Rank-blocked collectives
//! (AllGather, ReduceScatter, AllToAll) have `n` blocks of `N/n` elements with `C/n` chunks
//! each; the others one block of `N` elements and `C` chunks. A segment covers the same
//! element range `[lo, lo+len)` of every block, and chunk `k` (block `b = k / cpb`, index
//! `j = k % cpb`) covers `b·stride + lo + [j·len/cpb, (j+1)·len/cpb)`. With one segment this
//! is exactly the IR's `[k·N/C, (k+1)·N/C)`; more segments are used when one message would
//! not fit a connection slot (`count · max_chunk · elem_size ≤ slot_bytes`, `count` the
//! largest chunk count of any step with a peer: local copies never pass through a slot), or
//! when the rank's scratch would exceed its budget (32 MiB, `program::SCRATCH_BUDGET`), so
//! slots and scratch stay small and memory does not grow with the message size. Scratch chunks
//! are sized to the largest chunk of the segment; messages lay chunk `i` at `i · max_chunk`
//! elements of the slot, and a step moves as many elements as its user-buffer side holds
//! (the full padded chunk between scratch locations).

use crate::arena::{Arena, INLINE, LL_SLOTS, MATERIALIZING, POINTER, READING};
use crate::dtype::Kernels;
use crate::error::{ExecError, Result};
use crate::program::{Instr, Kind, Program};
use crate::transport::{Dir, Seg, Transport};
use hccl_ir::{Buf, CONNECTION_SLOTS, Loc};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Per-block extents of an AllToAllv call (see [`Geometry::var`]): for each block `b`, its
/// first element and element count in the input and in the output, and the number of
/// segments the call is replayed in.
#[derive(Debug, Clone, Default)]
pub(crate) struct VarBlocks {
    pub input: Vec<(u64, u64)>,
    pub output: Vec<(u64, u64)>,
    pub segs: u64,
}

/// Element geometry of one segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry<'a> {
    pub esize: usize,
    /// Chunks per block.
    pub cpb: u64,
    /// Elements between blocks.
    pub stride: u64,
    pub lo: u64,
    pub len: u64,
    /// Largest chunk of the segment, in elements.
    pub maxc: usize,
    /// Messages on this host's connections travel in LL slots (the entry's protocol is LL
    /// and a message fits one, see [`crate::arena`]).
    pub ll: bool,
    /// Blocks of their own sizes (AllToAllv): block `b` of the input (output) is
    /// `[d, d + c)` for `(d, c) = input[b]` (`output[b]`), segment `seg` of `segs` covers its
    /// `[seg·c/segs, (seg+1)·c/segs)`, and chunk `j` of the block `[j·l/cpb, (j+1)·l/cpb)`
    /// of that (`l` elements). `stride`, `lo` and `len` are then unused; `maxc` bounds every
    /// chunk of every block (it is computed from the largest block of the job, so that
    /// sender and receiver lay a message out alike).
    pub var: Option<&'a VarBlocks>,
    /// The segment this geometry describes (with [`Geometry::var`]).
    pub seg: u64,
}

impl Geometry<'_> {
    #[inline]
    fn range(&self, buf: Buf, k: u32) -> (usize, usize) {
        let k = u64::from(k);
        let (b, j) = (k / self.cpb, k % self.cpb);
        let (base, len) = match self.var {
            None => (b * self.stride + self.lo, self.len),
            Some(v) => {
                let table = if buf == Buf::Input {
                    &v.input
                } else {
                    &v.output
                };
                // `b` is in range: the program's locations were checked against the
                // buffer extents (`program::compile`).
                let (d, c) = table.get(b as usize).copied().unwrap_or((0, 0));
                let cut = |s: u64| (u128::from(s) * u128::from(c) / u128::from(v.segs)) as u64;
                let lo = cut(self.seg);
                (d + lo, cut(self.seg + 1) - lo)
            }
        };
        let cut = |j: u64| (u128::from(j) * u128::from(len) / u128::from(self.cpb)) as u64;
        ((base + cut(j)) as usize, (base + cut(j + 1)) as usize)
    }
}

/// Base pointers of one rank's three buffers for a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bufs {
    pub input: *mut u8,
    pub output: *mut u8,
    pub scratch: *mut u8,
}

/// How a rank checks on its peers while waiting.
pub(crate) struct Ctx<'a> {
    pub rank: u32,
    pub arena: &'a Arena,
    pub timeout: Duration,
    /// `None` while the peer lives, else what happened to it.
    pub failure: &'a dyn Fn(u32) -> Option<String>,
    /// Called whenever a sweep made no progress (the network writes credits it owes).
    pub on_wait: &'a dyn Fn(),
    /// Polls to spin before yielding: many when every rank has a core, few when ranks
    /// outnumber cores (spinning would only burn the time slice the peer needs).
    pub spin_polls: u32,
    /// Whether large messages may travel by pointer (ranks share an address space).
    pub single_copy: bool,
    /// This call's number and fingerprint when calls are compared (see [`crate::calls`]):
    /// checked against the peer this rank waits for at each liveness check.
    pub call: Option<(u64, u64)>,
    /// Messages carry checksums (`HCCL_CHECKSUM=1`, see [`EngineState::seal`]).
    pub checksum: bool,
    /// How large messages are written into slots (`HCCL_STREAM_WRITES`).
    pub stream_writes: crate::StreamWrites,
}

/// Memory aligned for every element type.
#[derive(Debug, Default)]
pub(crate) struct AlignedBuf {
    words: Vec<u128>,
}

impl AlignedBuf {
    /// Grows to at least `bytes` (zero-filled); never shrinks.
    pub(crate) fn reserve(&mut self, bytes: usize) {
        let words = bytes.div_ceil(16);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
    }
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }
}

/// Per-rank replay state that persists across calls (connection sequence numbers).
pub(crate) struct EngineState {
    send_seq: Vec<u64>,
    recv_seq: Vec<u64>,
    peer_consumed: Vec<u64>,
    peer_sent: Vec<u64>,
    pc: Vec<u32>,
    phase: Vec<u8>,
    hold: Vec<AlignedBuf>,
    outstanding: Vec<Outstanding>,
    progressed: bool,
    /// Adaptive spin budget (polls before yielding), see [`Waiter`]; 0 until first used.
    spin: u32,
    /// How large messages are written into slots: through the cache or past it.
    peer: crate::copy::PeerWrites,
    /// Connections to and from ranks on other hosts (process backend across hosts).
    net: Option<std::sync::Arc<dyn Transport>>,
    /// Per connection: [`LOCAL`], [`NET_OUT`] or [`NET_IN`].
    remote: Vec<u8>,
    /// Messages a network connection may have in flight ([`Transport::window`]).
    net_window: u64,
    /// Per connection from another host: 1 + the message whose receiving step last offered
    /// its destinations ([`Transport::post`]), and whether the transport took the offer.
    offered: Vec<(u64, bool)>,
    /// This call's [`Ctx::checksum`], [`Ctx::rank`] and [`Ctx::call`].
    checksum: bool,
    me: u32,
    call: Option<(u64, u64)>,
    /// Why the next message of a connection was refused (the step that received it reports
    /// it).
    refused: Option<Refused>,
    /// How long this rank waited for whom ([`crate::waits`]).
    pub(crate) waits: crate::waits::Waits,
    /// The step recorder when the communicator traces (`HCCL_TRACE`, see [`crate::trace`]).
    pub(crate) trace: Option<Box<crate::trace::Recorder>>,
}

/// Why a received message was refused.
enum Refused {
    /// It failed its checksum: its number on the connection and what was found.
    Corrupt(u64, String),
    /// It came from another call than this rank's: the sender's call number and
    /// fingerprint.
    Call(u64, u64),
}

/// Both ends of the connection share this host's region.
const LOCAL: u8 = 0;
/// This rank sends over the network.
const NET_OUT: u8 = 1;
/// This rank receives over the network.
const NET_IN: u8 = 2;

/// Why a step cannot run now: the peer and what it waits for.
type Blocked = (u32, &'static str);

fn overlaps(a: *const u8, la: usize, b: *const u8, lb: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    la > 0 && lb > 0 && a < b + lb && b < a + la
}

/// `dst ← a ⊕ b`, `a` being a message slot (never overlapping `dst` or `b`).
///
/// # Safety
/// Pointers valid for `n` elements.
#[inline]
unsafe fn reduce_msg(k: &Kernels, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    let bytes = n * k.esize;
    // SAFETY: forwarded contract; the overlap checks pick a kernel whose contract holds.
    unsafe {
        if std::ptr::eq(dst, b) {
            (k.in_place)(dst, a, n);
        } else if !overlaps(dst, bytes, b, bytes) {
            (k.three_way)(dst, a, b, n);
        } else {
            (k.scalar)(dst, a, b, n);
        }
    }
}

impl EngineState {
    /// State for `nconns` connections and programs of at most `nstreams` streams.
    pub(crate) fn new(nconns: usize) -> EngineState {
        EngineState {
            send_seq: vec![0; nconns],
            recv_seq: vec![0; nconns],
            peer_consumed: vec![0; nconns],
            peer_sent: vec![0; nconns],
            pc: Vec::new(),
            phase: Vec::new(),
            hold: Vec::new(),
            outstanding: Vec::with_capacity(64),
            progressed: false,
            spin: 0,
            peer: Default::default(),
            net: None,
            remote: vec![LOCAL; nconns],
            net_window: CONNECTION_SLOTS as u64,
            offered: vec![(0, false); nconns],
            checksum: false,
            me: 0,
            call: None,
            refused: None,
            waits: Default::default(),
            trace: None,
        }
    }

    /// Routes the connections `net` carries over the network.
    pub(crate) fn attach_net(&mut self, net: std::sync::Arc<dyn Transport>) {
        for (r, d) in self.remote.iter_mut().zip(net.dirs()) {
            *r = match d {
                Dir::Local => LOCAL,
                Dir::Out(_) => NET_OUT,
                Dir::In(_) => NET_IN,
            };
        }
        self.net_window = net.window().max(CONNECTION_SLOTS as u64);
        self.net = Some(net);
    }

    /// Sends message `segs` on network connection `c` and counts it as published.
    #[inline(never)]
    fn publish_net(&mut self, c: u32, segs: &[Seg]) {
        let seq = self.send_seq[c as usize];
        if let Some(net) = &self.net {
            net.send(c, seq, segs, self.call);
        }
        self.send_seq[c as usize] += 1;
        self.progressed = true;
    }

    /// Sizes per-stream state for `prog` (allocates only the first time a program is run).
    pub(crate) fn prepare(&mut self, prog: &Program, slot_bytes: usize) {
        let ns = prog.streams.len();
        if self.pc.len() < ns {
            self.pc.resize(ns, 0);
            self.phase.resize(ns, 0);
        }
        if self.hold.len() < ns {
            self.hold.resize_with(ns, AlignedBuf::default);
        }
        for (s, need) in prog.needs_hold.iter().enumerate() {
            if *need {
                self.hold[s].reserve(slot_bytes);
            }
        }
    }

    /// Whether messages of connection `c` travel in LL slots in segment `geo`.
    #[inline]
    fn ll(&self, geo: &Geometry, c: u32) -> bool {
        geo.ll && self.remote.get(c as usize) == Some(&LOCAL)
    }

    #[inline]
    fn can_send(&mut self, arena: &Arena, c: u32, ll: bool) -> bool {
        let c_ = c as usize;
        let depth = if ll {
            LL_SLOTS as u64
        } else if self.remote[c_] == NET_OUT {
            self.net_window
        } else {
            CONNECTION_SLOTS as u64
        };
        if self.send_seq[c_] - self.peer_consumed[c_] < depth {
            return true;
        }
        self.peer_consumed[c_] = arena.consumed(c).load(Ordering::Acquire);
        if self.send_seq[c_] - self.peer_consumed[c_] >= depth
            && self.remote[c_] == NET_OUT
            && let Some(net) = &self.net
        {
            net.poll(c);
            self.peer_consumed[c_] = arena.consumed(c).load(Ordering::Acquire);
        }
        self.send_seq[c_] - self.peer_consumed[c_] < depth
    }

    #[inline]
    fn can_recv(&mut self, arena: &Arena, c: u32, ll: bool) -> bool {
        let c_ = c as usize;
        if self.recv_seq[c_] < self.peer_sent[c_] {
            return true;
        }
        if ll {
            let seq = self.recv_seq[c_];
            return arena.ll_flag(c, seq).load(Ordering::Acquire) == seq + 1;
        }
        self.peer_sent[c_] = arena.sent(c).load(Ordering::Acquire);
        if self.recv_seq[c_] >= self.peer_sent[c_]
            && self.remote[c_] == NET_IN
            && let Some(net) = &self.net
        {
            net.poll(c);
            self.peer_sent[c_] = arena.sent(c).load(Ordering::Acquire);
        }
        self.recv_seq[c_] < self.peer_sent[c_]
    }

    #[inline]
    fn publish(&mut self, arena: &Arena, c: u32) {
        let c_ = c as usize;
        arena
            .sent_call(c, self.send_seq[c_])
            .store(self.call_word(), Ordering::Relaxed);
        self.send_seq[c_] += 1;
        arena.sent(c).store(self.send_seq[c_], Ordering::Release);
        self.progressed = true;
    }

    #[inline]
    fn consume(&mut self, arena: &Arena, c: u32) {
        let c_ = c as usize;
        self.recv_seq[c_] += 1;
        arena
            .consumed(c)
            .store(self.recv_seq[c_], Ordering::Release);
        self.progressed = true;
        if self.remote[c_] == NET_IN
            && let Some(net) = &self.net
        {
            net.credit(c, self.recv_seq[c_]);
        }
    }

    /// Replays `prog` once over the segment `geo`.
    pub(crate) fn run_segment(
        &mut self,
        ctx: &Ctx<'_>,
        prog: &Program,
        geo: &Geometry,
        bufs: &Bufs,
        k: &Kernels,
    ) -> Result<()> {
        let ns = prog.streams.len();
        let mut remaining = 0usize;
        for s in 0..ns {
            self.pc[s] = 0;
            self.phase[s] = 0;
            if !prog.streams[s].is_empty() {
                remaining += 1;
            }
        }
        self.checksum = ctx.checksum;
        self.peer.how = ctx.stream_writes;
        self.me = ctx.rank;
        self.call = ctx.call;
        if self.spin == 0 || (self.spin != SPIN_ONLY && self.spin > ctx.spin_polls) {
            self.spin = ctx.spin_polls.max(MIN_SPIN);
        }
        let mut waiter = Waiter::new(self.spin);
        if let Some(t) = self.trace.as_deref_mut() {
            t.segment(geo.seg);
        }
        while remaining > 0 {
            self.progressed = false;
            let mut blocked: Option<(u32, u32, u32, &'static str)> = None;
            for s in 0..ns {
                let steps = &prog.streams[s];
                loop {
                    let pc = self.pc[s] as usize;
                    let Some(ins) = steps.get(pc) else { break };
                    let (d0, d1) = ins.deps;
                    let dep_wait = prog.deps[d0 as usize..d1 as usize]
                        .iter()
                        .find(|&&(ds, dt)| self.pc[ds as usize] <= dt);
                    if let Some(&(ds, _)) = dep_wait {
                        if blocked.is_none() {
                            blocked = Some((s as u32, pc as u32, ctx.rank, dep_what(ds)));
                        }
                        break;
                    }
                    // SAFETY: the program was bounds-checked against the buffer extents and
                    // `bufs`/`geo` describe buffers of those extents.
                    match unsafe { self.try_step(ctx.arena, ctx.single_copy, s, ins, geo, bufs, k) }
                    {
                        None => {
                            if let Some(t) = self.trace.as_deref_mut() {
                                t.step(prog, s, pc);
                            }
                            self.pc[s] += 1;
                            self.phase[s] = 0;
                            self.progressed = true;
                            if self.pc[s] as usize == steps.len() {
                                remaining -= 1;
                            }
                        }
                        Some((peer, what)) => {
                            if let Some(why) = self.refused.take() {
                                waiter.unpublish(ctx);
                                return Err(match why {
                                    Refused::Corrupt(seq, detail) => ExecError::Corrupt {
                                        rank: ctx.rank,
                                        sender: peer,
                                        channel: prog.channels.get(s).copied().unwrap_or(0),
                                        stream: s as u32,
                                        step: pc as u32,
                                        seq,
                                        detail,
                                    },
                                    Refused::Call(num, print) => {
                                        // Every other rank fails too, naming the calls that
                                        // differ (see `abort_error`).
                                        raise_abort(ctx.arena, ctx.rank, peer);
                                        crate::calls::mismatch_with(
                                            ctx.rank,
                                            peer,
                                            ctx.call.unwrap_or_default(),
                                            (num, print),
                                        )
                                    }
                                });
                            }
                            let better = blocked.is_none_or(|(_, _, p, _)| p == ctx.rank);
                            if better {
                                blocked = Some((s as u32, pc as u32, peer, what));
                            }
                            break;
                        }
                    }
                }
            }
            if remaining == 0 {
                break;
            }
            if self.progressed {
                // The wait's record first, then the wait cleared: a peer whose own wait
                // for this rank ends meanwhile sees one or the other.
                waiter.reset(&mut self.spin, ctx.spin_polls, &mut self.waits, Some(ctx));
                waiter.unpublish(ctx);
            } else {
                if let Err(e) = waiter.pause(ctx, blocked.unwrap_or((0, 0, ctx.rank, "nothing"))) {
                    waiter.unpublish(ctx);
                    self.spin = waiter.budget;
                    return Err(e);
                }
            }
        }
        waiter.reset(&mut self.spin, ctx.spin_polls, &mut self.waits, Some(ctx));
        waiter.unpublish(ctx);
        Ok(())
    }

    #[inline]
    fn loc(geo: &Geometry, bufs: &Bufs, loc: Loc, i: u32) -> (*mut u8, usize) {
        let k = loc.off + i;
        match loc.buf {
            Buf::Scratch => (
                bufs.scratch.wrapping_add(k as usize * geo.maxc * geo.esize),
                geo.maxc,
            ),
            Buf::Input | Buf::Output => {
                let base = if loc.buf == Buf::Input {
                    bufs.input
                } else {
                    bufs.output
                };
                let (s, e) = geo.range(loc.buf, k);
                (base.wrapping_add(s * geo.esize), e - s)
            }
        }
    }

    /// Runs what of step `ins` can run now; `None` when the step completed.
    ///
    /// # Safety
    /// `ins` is in bounds of the buffers `bufs` describes under `geo`, and slot capacity
    /// covers `ins.count · geo.maxc` elements.
    #[allow(clippy::too_many_arguments)]
    unsafe fn try_step(
        &mut self,
        arena: &Arena,
        sc: bool,
        s: usize,
        ins: &Instr,
        geo: &Geometry,
        bufs: &Bufs,
        k: &Kernels,
    ) -> Option<Blocked> {
        let es = geo.esize;
        let stride = geo.maxc * es;
        let n = ins.count;
        let (ll_in, ll_out) = (self.ll(geo, ins.rconn), self.ll(geo, ins.sconn));
        const SEND: &str = "a free slot on its connection to";
        const RECV: &str = "a message from";
        const CORRUPT: &str = "an intact message from";
        let writes = matches!(
            ins.kind,
            Kind::Recv
                | Kind::RecvReduceCopy
                | Kind::RecvCopySend
                | Kind::RecvReduceCopySend
                | Kind::Copy
                | Kind::Reduce
        );
        if writes && self.phase[s] == 0 && !self.outstanding.is_empty() && n > 0 {
            let (first, _) = Self::loc(geo, bufs, ins.dst, 0);
            let (last, len) = Self::loc(geo, bufs, ins.dst, n - 1);
            self.clear_hazards(arena, first as usize, last as usize + len * es);
        }
        // SAFETY (whole body): every pointer comes from `loc` (in bounds by the caller's
        // contract), from a slot/hold buffer of at least `n · stride` bytes, or from a
        // pointer message of the advertised length.
        unsafe {
            match ins.kind {
                Kind::Nop => None,
                Kind::Copy => {
                    for i in 0..n {
                        let (sp, sl) = Self::loc(geo, bufs, ins.src, i);
                        let (dp, dl) = Self::loc(geo, bufs, ins.dst, i);
                        crate::copy::copy_overlapping(dp, sp, sl.min(dl) * es);
                    }
                    None
                }
                Kind::Reduce => {
                    for i in 0..n {
                        let (sp, sl) = Self::loc(geo, bufs, ins.src, i);
                        let (dp, dl) = Self::loc(geo, bufs, ins.dst, i);
                        let len = sl.min(dl);
                        if len == 0 {
                            continue;
                        }
                        if overlaps(dp, len * es, sp, len * es) {
                            (k.scalar)(dp, dp, sp, len);
                        } else {
                            (k.in_place)(dp, sp, len);
                        }
                    }
                    None
                }
                Kind::Send => {
                    if !self.can_send(arena, ins.sconn, ll_out) {
                        return Some((ins.send_peer, SEND));
                    }
                    self.send_from(arena, sc, ins, ins.src, None, geo, bufs);
                    None
                }
                Kind::Recv | Kind::RecvReduceCopy => {
                    if ins.kind == Kind::Recv && self.remote[ins.rconn as usize] == NET_IN {
                        self.offer(ins, geo, bufs);
                    }
                    if !self.can_recv(arena, ins.rconn, ll_in) {
                        return Some((ins.recv_peer, RECV));
                    }
                    if self.checks() && !self.check(arena, ins.rconn, ll_in, n as usize * stride) {
                        return Some((ins.recv_peer, CORRUPT));
                    }
                    self.recv_into(arena, sc, ins, geo, bufs, k);
                    None
                }
                Kind::RecvCopySend | Kind::RecvReduceCopySend => {
                    if self.phase[s] == 0 {
                        if ins.kind == Kind::RecvCopySend
                            && self.remote[ins.rconn as usize] == NET_IN
                        {
                            self.offer(ins, geo, bufs);
                        }
                        if !self.can_recv(arena, ins.rconn, ll_in) {
                            return Some((ins.recv_peer, RECV));
                        }
                        if self.checks()
                            && !self.check(arena, ins.rconn, ll_in, n as usize * stride)
                        {
                            return Some((ins.recv_peer, CORRUPT));
                        }
                        self.recv_into(arena, sc, ins, geo, bufs, k);
                        self.phase[s] = 1;
                    }
                    if !self.can_send(arena, ins.sconn, ll_out) {
                        return Some((ins.send_peer, SEND));
                    }
                    let clamp = (ins.kind == Kind::RecvReduceCopySend).then_some(ins.src);
                    self.send_from(arena, sc, ins, ins.dst, clamp, geo, bufs);
                    None
                }
                Kind::RecvReduceSend => {
                    if self.phase[s] == 0 {
                        if !self.can_recv(arena, ins.rconn, ll_in) {
                            return Some((ins.recv_peer, RECV));
                        }
                        if self.checks()
                            && !self.check(arena, ins.rconn, ll_in, n as usize * stride)
                        {
                            return Some((ins.recv_peer, CORRUPT));
                        }
                        let direct = self.can_send(arena, ins.sconn, ll_out);
                        let out = if direct {
                            self.out_slot(arena, ins.sconn, ll_out)
                        } else {
                            self.hold[s].ptr()
                        };
                        let (msg, avail) = self.message(arena, sc, ins.rconn, ll_in, es);
                        for i in 0..n {
                            let (sp, sl) = Self::loc(geo, bufs, ins.src, i);
                            let off = i as usize * stride;
                            reduce_msg(k, out.add(off), msg.add(off), sp, sl.min(avail));
                        }
                        self.consume(arena, ins.rconn);
                        if direct {
                            self.publish_slot(arena, sc, ins.sconn, ll_out, n as usize * stride);
                            return None;
                        }
                        self.phase[s] = 1;
                    }
                    if !self.can_send(arena, ins.sconn, ll_out) {
                        return Some((ins.send_peer, SEND));
                    }
                    let slot = self.out_slot(arena, ins.sconn, ll_out);
                    self.peer
                        .copy(slot, self.hold[s].ptr(), n as usize * stride);
                    self.publish_slot(arena, sc, ins.sconn, ll_out, n as usize * stride);
                    None
                }
            }
        }
    }

    /// Publishes the chunks at `from` (clamped to the sizes at `clamp`) on `ins.sconn`: by
    /// pointer when allowed and worth it, else copied into the slot.
    ///
    /// # Safety
    /// As [`EngineState::try_step`], and the connection has a free slot.
    #[allow(clippy::too_many_arguments)]
    unsafe fn send_from(
        &mut self,
        arena: &Arena,
        sc: bool,
        ins: &Instr,
        from: Loc,
        clamp: Option<Loc>,
        geo: &Geometry,
        bufs: &Bufs,
    ) {
        let es = geo.esize;
        let c = ins.sconn;
        let seq = self.send_seq[c as usize];
        let chunk = |i: u32| {
            let (p, mut l) = Self::loc(geo, bufs, from, i);
            if let Some(other) = clamp {
                l = l.min(Self::loc(geo, bufs, other, i).1);
            }
            (p, l)
        };
        if self.remote[c as usize] == NET_OUT {
            // Straight from the chunks to the socket: no copy into the local slot.
            let segs: Vec<Seg> = (0..ins.count)
                .map(|i| {
                    let (p, l) = chunk(i);
                    Seg {
                        off: i as usize * geo.maxc * es,
                        ptr: p,
                        len: l * es,
                    }
                })
                .collect();
            self.publish_net(c, &segs);
            return;
        }
        let ll = self.ll(geo, c);
        if sc && !ll && ins.count == 1 {
            let (p, l) = chunk(0);
            if l * es >= SINGLE_COPY_MIN {
                let (state, ptr, len) = arena.desc(c, seq);
                ptr.store(p as u64, Ordering::Relaxed);
                len.store((l * es) as u64, Ordering::Relaxed);
                state.store(POINTER, Ordering::Relaxed);
                self.outstanding.push(Outstanding {
                    conn: c,
                    seq,
                    ptr: p as usize,
                    bytes: l * es,
                });
                self.publish(arena, c);
                return;
            }
        }
        let slot = self.out_slot(arena, c, ll);
        for i in 0..ins.count {
            let (p, l) = chunk(i);
            // SAFETY: per the caller's contract.
            unsafe {
                self.peer
                    .copy(slot.add(i as usize * geo.maxc * es), p, l * es)
            };
        }
        self.publish_slot(arena, sc, c, ll, ins.count as usize * geo.maxc * es);
    }

    /// Where the next message of `c` is written: its LL slot or its regular slot.
    #[inline]
    fn out_slot(&self, arena: &Arena, c: u32, ll: bool) -> *mut u8 {
        let seq = self.send_seq[c as usize];
        if ll {
            arena.ll_data(c, seq)
        } else {
            arena.slot(c, seq)
        }
    }

    /// Publishes the next message of `c`, written at [`EngineState::out_slot`] (its first
    /// `bytes`): an LL flag, or the slot marked as holding the data (`sc`: descriptors are
    /// in use) and `sent` advanced.
    #[inline]
    fn publish_slot(&mut self, arena: &Arena, sc: bool, c: u32, ll: bool, bytes: usize) {
        if self.checksum && self.remote[c as usize] == LOCAL {
            self.seal(arena, c, ll, bytes);
        }
        if bytes > 0 && crate::fault::corrupt(crate::fault::Site::Slot, self.me) {
            // SAFETY: the message's first byte, in the slot this rank owns until it publishes.
            unsafe { *self.out_slot(arena, c, ll) ^= 0x20 };
        }
        if ll {
            let c_ = c as usize;
            let seq = self.send_seq[c_];
            self.send_seq[c_] = seq + 1;
            arena
                .ll_call(c, seq)
                .store(self.call_word(), Ordering::Relaxed);
            arena.ll_flag(c, seq).store(seq + 1, Ordering::Release);
            self.progressed = true;
            return;
        }
        self.publish_inline(arena, sc, c, bytes);
    }

    /// Stores the CRC32C of the next message of `c` (the first `bytes` of its slot, padding
    /// between chunks included: the receiver reads the same memory) in the slot's checksum
    /// word, before the message is published. Messages to other hosts are checked by the
    /// network instead (each part carries its own CRC32C).
    #[inline(never)]
    fn seal(&mut self, arena: &Arena, c: u32, ll: bool, bytes: usize) {
        let seq = self.send_seq[c as usize];
        let data = self.out_slot(arena, c, ll);
        // SAFETY: the slot holds at least `bytes` (a message never exceeds its slot), and
        // this rank owns it until it publishes the message.
        let crc = crc32c::crc32c(unsafe { std::slice::from_raw_parts(data, bytes) });
        let word = if ll {
            arena.ll_crc(c, seq)
        } else {
            arena.crc(c, seq)
        };
        word.store(crate::arena::seal(seq, crc), Ordering::Relaxed);
    }

    /// The fingerprint this rank's messages carry: its call's, or 0 when it compares none.
    #[inline]
    fn call_word(&self) -> u64 {
        self.call.map_or(0, |(_, print)| print)
    }

    /// Whether received messages are checked before they are read: with checksums, and when
    /// calls are compared (every message carries its sender's call).
    #[inline]
    fn checks(&self) -> bool {
        self.checksum || self.call.is_some()
    }

    /// Whether the next message of `c` (`bytes` long in its slot) may be read: it belongs to
    /// this rank's call (when calls are compared); on this host its CRC32C matches the
    /// sender's, from another host no part of it failed the network's check (with
    /// checksums). When not, records why for the step to report.
    #[inline(never)]
    fn check(&mut self, arena: &Arena, c: u32, ll: bool, bytes: usize) -> bool {
        let seq = self.recv_seq[c as usize];
        if self.remote[c as usize] == NET_IN {
            let landed = self.net.as_ref().and_then(|n| n.landed(c, seq));
            let (crc, (num, print)) = match &landed {
                Some(l) => (l.crc, l.call),
                None => (arena.crc(c, seq), arena.peer_call(c, seq)),
            };
            if self.checksum && crc.load(Ordering::Acquire) == crate::arena::corrupt_mark(seq) {
                self.refused = Some(Refused::Corrupt(
                    seq,
                    "a part failed its CRC32C on arrival from the network".into(),
                ));
                return false;
            }
            if let Some(mine) = self.call {
                let theirs = (num.load(Ordering::Relaxed), print.load(Ordering::Relaxed));
                // A sender that compares no calls sends none (number 0).
                if theirs.0 != 0 && theirs != mine {
                    self.refused = Some(Refused::Call(theirs.0, theirs.1));
                    return false;
                }
            }
            return true;
        }
        if let Some((num, mine)) = self.call {
            let word = if ll {
                arena.ll_call(c, seq)
            } else {
                arena.sent_call(c, seq)
            };
            let theirs = word.load(Ordering::Relaxed);
            // A sender that compares no calls stamps 0.
            if theirs != 0 && theirs != mine {
                self.refused = Some(Refused::Call(num, theirs));
                return false;
            }
        }
        if !self.checksum {
            return true;
        }
        let (data, word) = if ll {
            (arena.ll_data(c, seq), arena.ll_crc(c, seq))
        } else {
            (arena.slot(c, seq), arena.crc(c, seq))
        };
        // SAFETY: the message is published (its slot holds `bytes` written by the sender,
        // whose Release store this rank acquired) and not yet consumed.
        let crc = crc32c::crc32c(unsafe { std::slice::from_raw_parts(data, bytes) });
        let want = word.load(Ordering::Relaxed);
        if want == crate::arena::seal(seq, crc) {
            return true;
        }
        let detail = match crate::arena::sealed_crc(seq, want) {
            Some(sent) => format!("CRC32C {crc:08x} of its {bytes} bytes, sent with {sent:08x}"),
            None => {
                format!("CRC32C {crc:08x} of its {bytes} bytes, but it came without a checksum")
            }
        };
        self.refused = Some(Refused::Corrupt(seq, detail));
        false
    }

    /// Marks the next message of `c` as held in its slot (its first `bytes`) and publishes
    /// it.
    #[inline]
    fn publish_inline(&mut self, arena: &Arena, sc: bool, c: u32, bytes: usize) {
        if self.remote[c as usize] == NET_OUT {
            let seg = Seg {
                off: 0,
                ptr: arena.slot(c, self.send_seq[c as usize]),
                len: bytes,
            };
            self.publish_net(c, &[seg]);
            return;
        }
        if sc {
            // Without single copy no descriptor ever leaves INLINE: neither side touches it.
            let (state, _, _) = arena.desc(c, self.send_seq[c as usize]);
            state.store(INLINE, Ordering::Relaxed);
        }
        self.publish(arena, c);
    }

    /// Where the next message of `c` can be read, and how many elements it holds at most
    /// (`usize::MAX` for a padded slot).
    fn message(&self, arena: &Arena, sc: bool, c: u32, ll: bool, es: usize) -> (*const u8, usize) {
        let seq = self.recv_seq[c as usize];
        if ll {
            return (arena.ll_data(c, seq), usize::MAX);
        }
        if self.remote[c as usize] == NET_IN
            && let Some(l) = self.net.as_ref().and_then(|n| n.landed(c, seq))
        {
            return (l.data, usize::MAX);
        }
        if !sc {
            return (arena.slot(c, seq), usize::MAX);
        }
        let (state, ptr, len) = arena.desc(c, seq);
        let mut spins = 0u32;
        loop {
            match state.load(Ordering::Acquire) {
                INLINE => return (arena.slot(c, seq), usize::MAX),
                POINTER => {
                    if state
                        .compare_exchange(POINTER, READING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        let p = ptr.load(Ordering::Relaxed) as usize as *const u8;
                        return (p, len.load(Ordering::Relaxed) as usize / es);
                    }
                }
                // The sender is moving the data into the slot: a bounded copy.
                _ => backoff(&mut spins),
            }
        }
    }

    /// Settles every outstanding pointer message overlapping `[lo, hi)` (and forgets those
    /// already consumed) so that this rank may write there.
    fn clear_hazards(&mut self, arena: &Arena, lo: usize, hi: usize) {
        let mut i = 0;
        while i < self.outstanding.len() {
            let o = self.outstanding[i];
            if arena.consumed(o.conn).load(Ordering::Acquire) > o.seq {
                self.outstanding.swap_remove(i);
            } else if o.ptr < hi && lo < o.ptr + o.bytes {
                settle(arena, o);
                self.outstanding.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Settles every outstanding pointer message (at the end of a call, also a failed one),
    /// after which the caller's buffers are free again.
    pub(crate) fn settle_all(&mut self, arena: &Arena) {
        for o in self.outstanding.drain(..) {
            settle(arena, o);
        }
    }

    /// Offers the destinations of copying receive step `ins` (its chunks at `ins.dst`) for
    /// the next message of its connection from another host, once per message and only
    /// while the message is not known to be here: the transport may then write it there
    /// straight from the socket ([`Transport::post`]), and the step copies nothing. The step
    /// is at the head of its stream with its dependencies done, so its destination is its
    /// own to write from now on, exactly as if it ran now.
    #[inline(never)]
    fn offer(&mut self, ins: &Instr, geo: &Geometry, bufs: &Bufs) {
        let c = ins.rconn as usize;
        let seq = self.recv_seq[c];
        let stride = geo.maxc * geo.esize;
        if seq < self.peer_sent[c]
            || self.offered[c].0 == seq + 1
            || (ins.count as usize) * stride < POST_MIN
        {
            return;
        }
        let Some(net) = &self.net else { return };
        let ranges: Vec<Seg> = (0..ins.count)
            .map(|i| {
                let (p, l) = Self::loc(geo, bufs, ins.dst, i);
                Seg {
                    off: i as usize * stride,
                    ptr: p,
                    len: l * geo.esize,
                }
            })
            .collect();
        let taken = net.post(ins.rconn, seq, ranges);
        self.offered[c] = (seq + 1, taken);
    }

    /// Receives the next message of `ins.rconn` into `ins.dst` (reducing with `ins.src` for
    /// the reducing kinds) and frees the slot.
    ///
    /// # Safety
    /// As [`EngineState::try_step`], and a message is available.
    unsafe fn recv_into(
        &mut self,
        arena: &Arena,
        sc: bool,
        ins: &Instr,
        geo: &Geometry,
        bufs: &Bufs,
        k: &Kernels,
    ) {
        let c = ins.rconn as usize;
        if self.offered[c] == (self.recv_seq[c] + 1, true) {
            self.offered[c].1 = false;
            if let Some(net) = &self.net
                && net.take_post(ins.rconn, self.recv_seq[c])
            {
                // The transport wrote the message to the step's destinations.
                self.consume(arena, ins.rconn);
                return;
            }
        }
        let es = geo.esize;
        let stride = geo.maxc * es;
        let ll = self.ll(geo, ins.rconn);
        let (msg, avail) = self.message(arena, sc, ins.rconn, ll, es);
        let reduces = matches!(ins.kind, Kind::RecvReduceCopy | Kind::RecvReduceCopySend);
        for i in 0..ins.count {
            let (dp, dl) = Self::loc(geo, bufs, ins.dst, i);
            // SAFETY: per the caller's contract.
            unsafe {
                let m = msg.add(i as usize * stride);
                if reduces {
                    let (sp, sl) = Self::loc(geo, bufs, ins.src, i);
                    reduce_msg(k, dp, m, sp, dl.min(sl).min(avail));
                } else {
                    crate::copy::copy(dp, m, dl.min(avail) * es);
                }
            }
        }
        self.consume(arena, ins.rconn);
    }
}

/// Messages from other hosts smaller than this (at most) are not posted for (see
/// [`EngineState::offer`]): the copy they save costs less than the offer.
const POST_MIN: usize = 16 * 1024;

/// Pointer messages smaller than this are copied into the slot (the bookkeeping would cost
/// more than the copy).
const SINGLE_COPY_MIN: usize = 16 * 1024;

/// A pointer message this rank published and whose memory it must not change yet.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    conn: u32,
    seq: u64,
    ptr: usize,
    bytes: usize,
}

/// Makes sure `o`'s memory is no longer needed: consumed, or materialized into its slot, or
/// (when the receiver is reading it right now) consumed after a bounded wait.
fn settle(arena: &Arena, o: Outstanding) {
    if arena.consumed(o.conn).load(Ordering::Acquire) > o.seq {
        return;
    }
    let (state, _, _) = arena.desc(o.conn, o.seq);
    if state
        .compare_exchange(POINTER, MATERIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        // SAFETY: the receiver has not started reading; the slot is reserved for this
        // message and holds at least `bytes` (one chunk of at most `maxc` elements).
        unsafe { crate::copy::copy(arena.slot(o.conn, o.seq), o.ptr as *const u8, o.bytes) };
        state.store(INLINE, Ordering::Release);
        return;
    }
    let mut spins = 0u32;
    while arena.consumed(o.conn).load(Ordering::Acquire) <= o.seq {
        backoff(&mut spins);
    }
}

/// Waits a little while another thread finishes a bounded copy.
fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn dep_what(_stream: u32) -> &'static str {
    "a step of another stream of its own"
}

/// The rank at the end of the chain of published waits from `peer` (which `me` waits
/// for): the first rank on it that is not waiting. `None` when `peer` is `me` or not a rank
/// of the region, when the chain comes back to a rank already on it (a cycle names no single
/// culprit), or when a published value is not a rank of the region (the words are shared
/// with other processes: never trusted as an index).
fn chain_end(arena: &Arena, me: u32, peer: u32) -> Option<u32> {
    let ranks = arena.ranks();
    if peer == me || peer as usize >= ranks {
        return None;
    }
    let mut chain = vec![me, peer];
    let mut at = peer;
    loop {
        let word = arena.waiting_on(at as usize).load(Ordering::Acquire);
        let Some((next, _, _)) = crate::arena::read_wait_word(word, 0) else {
            return Some(at);
        };
        if next as usize >= ranks || chain.contains(&next) {
            return None;
        }
        chain.push(next);
        at = next;
    }
}

/// Who a timed wait of rank `me` for `peer`, from `start` to `end` ([`crate::arena::now_us`]),
/// is charged to: not `peer` when `peer` was itself waiting for most of that time, but the
/// cause of that wait, along the chain of waits. A peer's wait is read from its published
/// wait if it still shows one (it ends the wait that held it up in the sweep that sends what
/// `me` waited for, and clears it after), else from its last finished wait, whose cause that
/// peer already worked out the same way. The chain stops at a rank that was not waiting for
/// most of the time (it is the cause), at `me` (ranks that wait for each other: the peer is
/// charged) and after [`MAX_HOPS`] hops. A stopped or descheduled rank publishes nothing new,
/// so it is never passed over for the rank it last waited for.
fn charge_to(arena: &Arena, me: u32, peer: u32, start: u32, end: u32) -> u32 {
    let ranks = arena.ranks();
    if peer == me || peer as usize >= ranks {
        return peer;
    }
    let len = i64::from(end.wrapping_sub(start));
    if len <= 0 || len > i64::from(u32::MAX / 2) {
        return peer;
    }
    // Stamps relative to `end` (negative: before it), and the part of [s, e] within the wait.
    let rel = |x: u32| i64::from(x.wrapping_sub(end) as i32);
    let most = |s: i64, e: i64| 2 * (e.min(0) - s.max(-len)) >= len;
    let mut at = peer;
    for _ in 0..MAX_HOPS {
        let word = arena.waiting_on(at as usize).load(Ordering::Acquire);
        // Still polling (a rank stopped or descheduled outside its wait stops refreshing
        // its word), and waiting while running for most of this wait.
        if let Some((next, age, on)) = crate::arena::read_wait_word(word, end)
            && age <= STALE_US
            && 2 * on.min(len as u64) >= len as u64
        {
            if next == me || next as usize >= ranks {
                return at;
            }
            at = next;
            continue;
        }
        let record = arena
            .last_wait(at as usize)
            .map(|w| w.load(Ordering::Acquire))
            .and_then(crate::arena::read_wait_record);
        return match record {
            Some((e, l, cause))
                if most(rel(e) - i64::from(l), rel(e))
                    && cause != me
                    && (cause as usize) < ranks =>
            {
                cause
            }
            _ => at,
        };
    }
    at
}

/// A published wait last refreshed longer ago than this is not a wait any more: its rank
/// stopped running while it waited.
const STALE_US: u32 = 2_000;

/// Longest chain of waits [`charge_to`] follows.
const MAX_HOPS: usize = 8;

/// The rank that holds this one up when it waits for `peer` too long: the end of the chain
/// of published waits from `peer` ([`chain_end`]), when that is not `peer` itself.
fn blocked_by(ctx: &Ctx<'_>, peer: u32) -> Option<u32> {
    chain_end(ctx.arena, ctx.rank, peer).filter(|&r| r != peer)
}

/// Encodes an abort record.
pub(crate) fn abort_word(reporter: u32, culprit: u32) -> u64 {
    1 + ((u64::from(reporter) << 32) | u64::from(culprit))
}

/// Turns a non-zero abort word into the error this rank reports. When calls are compared
/// (`call`: this rank's number and fingerprint) and this rank's call differs from the
/// culprit's or the reporter's, the error names both calls: an abort raised for a call
/// mismatch reads as one on every rank.
pub(crate) fn abort_error(
    arena: &Arena,
    rank: u32,
    word: u64,
    call: Option<(u64, u64)>,
) -> ExecError {
    let v = word - 1;
    let (reporter, culprit) = ((v >> 32) as u32, v as u32);
    if let Some((seq, print)) = call {
        for peer in [culprit, reporter] {
            if peer != rank
                && let Some(e) = crate::calls::compare(arena, rank, peer, seq, print)
            {
                return e;
            }
        }
    }
    ExecError::PeerFailed {
        rank,
        failed: culprit,
        reason: if reporter == culprit {
            "it aborted the communicator".to_string()
        } else {
            format!("reported by rank {reporter}")
        },
    }
}

/// Records a failure in the abort word (first writer wins) and returns it.
pub(crate) fn raise_abort(arena: &Arena, reporter: u32, culprit: u32) {
    let _ = arena.abort().compare_exchange(
        0,
        abort_word(reporter, culprit),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

/// Spin polls when every rank has a core of its own.
pub(crate) const SPIN_POLLS: u32 = 256;
const YIELD_FOR: Duration = Duration::from_millis(10);
const SLEEP: Duration = Duration::from_micros(50);
const LIVENESS_EVERY: Duration = Duration::from_millis(5);
/// A yield that takes longer than this ran another thread.
const SWITCHED: Duration = Duration::from_micros(3);
/// A yield that takes longer than this ran a thread for a whole time slice: not a peer
/// doing its part of the collective, but other work sharing the core.
const HOGGED: Duration = Duration::from_micros(200);
/// In spin-only mode, how long a wait spins before it yields after all.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// A gap this long between two polls of a wait (a poll sleeps at most [`SLEEP`] or yields
/// once) means the rank did not run: it is not charged to the peer ([`crate::waits`]).
const OFF_CPU: Duration = Duration::from_millis(5);
/// The longest a wait spins within its poll budget before it yields (see [`Waiter::pause`]).
const SPIN_CAP: Duration = Duration::from_micros(15);
/// Polls between two clock reads while spinning.
const CAP_EVERY: u32 = 8;
/// Smallest adaptive spin budget.
const MIN_SPIN: u32 = 2;
/// Budget value meaning "spin-only mode".
const SPIN_ONLY: u32 = u32::MAX;

/// Backoff and failure detection while a rank cannot make progress.
///
/// A waiting rank spins (polls) for a while, then yields its core, and after
/// [`YIELD_FOR`] sleeps between polls. How long it spins adapts per rank, across calls, to
/// what the last yield showed:
///
/// - the wait ended while spinning, or the yield returned at once (nothing else wanted the
///   core): spinning is cheap here, so the budget doubles (up to [`Ctx::spin_polls`]);
/// - the yield ran another thread briefly (the peer shares this core and did its part):
///   spinning only delays the peer, so the budget halves;
/// - the yield ran another thread for a whole time slice (unrelated work shares this core,
///   the peer is elsewhere): yielding gives this rank's share of the core away, so the rank
///   switches to spin-only mode, spinning for up to [`SPIN_FOR`] before it yields.
///
/// Where ranks outnumber cores the budget stays at a couple of polls (spinning would burn
/// the slice a peer needs) and spin-only mode is never entered.
struct Waiter {
    polls: u32,
    /// When this wait's spinning began (read every [`CAP_EVERY`] polls).
    spin_started: Option<Instant>,
    budget: u32,
    /// The longest yield of this wait ran another thread briefly / for a whole slice.
    switched: bool,
    hogged: bool,
    since: Option<Instant>,
    last_liveness: Option<Instant>,
    /// A peer found failed at the last liveness check: it is reported only if a whole
    /// sweep after that check still makes no progress (its last messages may have landed
    /// between the sweep and the check).
    suspect: Option<u32>,
    /// This rank's wait is published in [`Arena::waiting_on`].
    published: bool,
    /// A timed wait is charged to the cause of the wait for the peer it names
    /// ([`charge_to`]), less the time this rank did not run: gaps of [`OFF_CPU`] or more
    /// between its clock reads (`last`). `start_us`: when it began, on the host's clock
    /// ([`crate::arena::now_us`]).
    peer: u32,
    start_us: u32,
    last: Option<Instant>,
    off_cpu: Duration,
}

impl Waiter {
    fn new(budget: u32) -> Waiter {
        Waiter {
            polls: 0,
            spin_started: None,
            budget,
            switched: false,
            hogged: false,
            since: None,
            last_liveness: None,
            suspect: None,
            published: false,
            peer: 0,
            start_us: 0,
            last: None,
            off_cpu: Duration::ZERO,
        }
    }

    /// Clears this rank's published wait ([`Arena::waiting_on`]), if it published one.
    fn unpublish(&mut self, ctx: &Ctx<'_>) {
        if self.published {
            ctx.arena
                .waiting_on(ctx.rank as usize)
                .store(0, Ordering::Release);
            self.published = false;
        }
    }

    /// Progress was made: adapt the budget to how this wait ended, charge it to the peer it
    /// named when it got as far as reading the clock, and start afresh.
    fn reset(
        &mut self,
        spin: &mut u32,
        max: u32,
        waits: &mut crate::waits::Waits,
        ctx: Option<&Ctx<'_>>,
    ) {
        if let Some(since) = self.since {
            let end = Instant::now();
            self.note_gap(end);
            let culprit = match ctx {
                Some(ctx) => {
                    let end_us = crate::arena::now_us();
                    let culprit = charge_to(ctx.arena, ctx.rank, self.peer, self.start_us, end_us);
                    if let Some(w) = ctx.arena.last_wait(ctx.rank as usize) {
                        let len = end_us.wrapping_sub(self.start_us);
                        // A wait this rank mostly did not run for is its own doing, to whoever
                        // waited for it meanwhile.
                        let off = u32::try_from(self.off_cpu.as_micros()).unwrap_or(u32::MAX);
                        let cause = if off.saturating_mul(2) >= len {
                            ctx.rank
                        } else {
                            culprit
                        };
                        w.store(
                            crate::arena::wait_record(end_us, len, cause),
                            Ordering::Release,
                        );
                    }
                    culprit
                }
                None => self.peer,
            };
            waits.record(culprit, (end - since).saturating_sub(self.off_cpu));
            self.last = None;
            self.off_cpu = Duration::ZERO;
        }
        let max = max.max(MIN_SPIN);
        if self.hogged {
            self.budget = if max >= SPIN_POLLS { SPIN_ONLY } else { max };
        } else if self.switched {
            self.budget = if self.budget == SPIN_ONLY {
                max
            } else {
                (self.budget / 2).max(MIN_SPIN)
            };
        } else if self.polls > 0 && self.budget != SPIN_ONLY {
            self.budget = self.budget.saturating_mul(2).min(max);
        }
        *spin = self.budget;
        self.polls = 0;
        self.spin_started = None;
        self.switched = false;
        self.hogged = false;
        self.since = None;
        self.suspect = None;
    }

    /// Counts the time since the last clock read of this wait as off the CPU when it is
    /// [`OFF_CPU`] or more (the rank was descheduled or stopped, not held up by its peer).
    #[inline]
    fn note_gap(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now - last;
            if gap >= OFF_CPU {
                self.off_cpu += gap;
            }
        }
        self.last = Some(now);
    }

    fn pause(&mut self, ctx: &Ctx<'_>, blocked: (u32, u32, u32, &'static str)) -> Result<()> {
        let word = ctx.arena.abort().load(Ordering::Acquire);
        if word != 0 {
            return Err(abort_error(ctx.arena, ctx.rank, word, ctx.call));
        }
        (ctx.on_wait)();
        self.polls = self.polls.saturating_add(1);
        if self.polls < self.budget.min(SPIN_POLLS) {
            // The budget counts polls, and a poll of a rank with network connections reads
            // sockets (system calls, some 100 times a shared-memory poll): spinning also
            // ends after SPIN_CAP, so that such a rank does not hold a core its local peer
            // needs for the whole budget. The clock is read every few polls only.
            if self.polls % CAP_EVERY != 1 {
                std::hint::spin_loop();
                return Ok(());
            }
            let now = Instant::now();
            let started = *self.spin_started.get_or_insert(now);
            if now - started < SPIN_CAP {
                std::hint::spin_loop();
                return Ok(());
            }
            // Spent: yield from now on, as past the budget.
            self.polls = self.budget.min(SPIN_POLLS);
        }
        let now = Instant::now();
        let first = self.since.is_none();
        let since = *self.since.get_or_insert(now);
        self.note_gap(now);
        self.peer = blocked.2;
        if first {
            self.start_us = crate::arena::now_us();
        }
        let waited = now - since;
        if self.budget == SPIN_ONLY && waited < SPIN_FOR {
            std::hint::spin_loop();
            return Ok(());
        }
        let (stream, step, peer, what) = blocked;
        // The first liveness check comes one period into the wait: it costs a file read
        // in the process backend, far more than a short wait itself.
        let last = *self.last_liveness.get_or_insert(now);
        if now - last >= LIVENESS_EVERY || self.suspect.is_some() {
            self.last_liveness = Some(now);
            let failed = if peer != ctx.rank {
                (ctx.failure)(peer)
            } else {
                None
            };
            if failed.is_some() && self.suspect != Some(peer) {
                self.suspect = Some(peer);
                return Ok(());
            }
            self.suspect = None;
            if let Some((seq, print)) = ctx.call
                && peer != ctx.rank
                && let Some(e) = crate::calls::compare(ctx.arena, ctx.rank, peer, seq, print)
            {
                raise_abort(ctx.arena, ctx.rank, peer);
                return Err(e);
            }
            if let Some(why) = failed {
                raise_abort(ctx.arena, ctx.rank, peer);
                return Err(ExecError::PeerFailed {
                    rank: ctx.rank,
                    failed: peer,
                    reason: format!("{why} while stream {stream} step {step} waited for {what} it"),
                });
            }
        }
        if waited >= ctx.timeout {
            let blocked_by = blocked_by(ctx, peer);
            raise_abort(ctx.arena, ctx.rank, blocked_by.unwrap_or(peer));
            self.unpublish(ctx);
            return Err(ExecError::Timeout {
                rank: ctx.rank,
                peer,
                stream,
                step,
                secs: waited.as_secs_f64(),
                what,
                blocked_by,
            });
        }
        if peer != ctx.rank {
            ctx.arena.waiting_on(ctx.rank as usize).store(
                crate::arena::wait_word(
                    peer,
                    crate::arena::now_us(),
                    waited
                        .saturating_sub(self.off_cpu)
                        .as_micros()
                        .try_into()
                        .unwrap_or(u64::MAX),
                ),
                Ordering::Release,
            );
            self.published = true;
        }
        if waited < YIELD_FOR {
            std::thread::yield_now();
            let took = now.elapsed();
            if took >= HOGGED {
                self.hogged = true;
            } else if took >= SWITCHED {
                self.switched = true;
            }
        } else {
            std::thread::sleep(SLEEP);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits are charged along chains of waits: to a peer's own cause when it was waiting
    /// (and running) for most of the wait, to the peer itself otherwise.
    #[test]
    fn waits_are_charged_to_the_end_of_the_chain() {
        use crate::arena::{Layout, wait_record, wait_word};
        let arena = Arena::heap(Layout::new(4, 1, 64)).unwrap();
        let (start, end) = (1_000_000u32, 1_010_000u32); // rank 0 waited 10 ms for rank 1
        let record = |r: usize, w: u64| arena.last_wait(r).unwrap().store(w, Ordering::Relaxed);
        let waiting = |r: usize, w: u64| arena.waiting_on(r).store(w, Ordering::Relaxed);
        // Rank 1 was not waiting: it is the cause.
        assert_eq!(charge_to(&arena, 0, 1, start, end), 1);
        // Its last wait, charged to rank 3, covered most of rank 0's: rank 3.
        record(1, wait_record(end - 100, 9_000, 3));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 3);
        // ... but only a quarter of it: rank 1.
        record(1, wait_record(end - 100, 2_500, 3));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 1);
        // It still shows a wait for rank 2, polled just now, 9 of the 10 ms while running,
        // and rank 2 shows none: rank 2.
        waiting(1, wait_word(2, end - 100, 9_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 2);
        // ... but it ran for only 2 ms of its wait: rank 1 itself.
        waiting(1, wait_word(2, end - 100, 2_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 1);
        // ... or it stopped polling 5 ms ago (stopped outside its wait): rank 1 itself.
        waiting(1, wait_word(2, end - 5_000, 9_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 1);
        // Rank 1 waited for rank 0 itself: ranks that wait for each other charge the peer.
        waiting(1, wait_word(0, end - 100, 9_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 1);
        // A chain 1 → 2 → 3 ends at 3; a published peer out of range stops it.
        waiting(1, wait_word(2, end - 100, 9_000));
        waiting(2, wait_word(3, end - 100, 9_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 3);
        waiting(3, wait_word(9, end - 100, 9_000));
        assert_eq!(charge_to(&arena, 0, 1, start, end), 3);
        // A wait on another stream of this rank stays with it.
        assert_eq!(charge_to(&arena, 0, 0, start, end), 0);
    }

    /// Ends a wait of `polls` polls whose yield (if any) was classified as given, and
    /// returns the budget the next wait starts with.
    fn end_wait(budget: u32, max: u32, polls: u32, switched: bool, hogged: bool) -> u32 {
        let mut w = Waiter::new(budget);
        w.polls = polls;
        w.switched = switched;
        w.hogged = hogged;
        let mut spin = 0;
        w.reset(&mut spin, max, &mut crate::waits::Waits::default(), None);
        assert_eq!(spin, w.budget);
        assert_eq!((w.polls, w.switched, w.hogged), (0, false, false));
        spin
    }

    #[test]
    fn spin_budget_adapts_to_how_waits_end() {
        // (start, max, polls, switched, hogged) -> next budget
        let cases = [
            // Ended while spinning: doubles, capped at the maximum.
            (2, SPIN_POLLS, 5, false, false, 4),
            (SPIN_POLLS, SPIN_POLLS, 5, false, false, SPIN_POLLS),
            // No wait at all: unchanged.
            (8, SPIN_POLLS, 0, false, false, 8),
            // A brief switch (the peer shares the core): halves, not below the minimum.
            (SPIN_POLLS, SPIN_POLLS, 300, true, false, SPIN_POLLS / 2),
            (MIN_SPIN, SPIN_POLLS, 300, true, false, MIN_SPIN),
            // A whole slice elsewhere: spin-only, unless ranks outnumber cores.
            (16, SPIN_POLLS, 300, false, true, SPIN_ONLY),
            (MIN_SPIN, MIN_SPIN, 300, false, true, MIN_SPIN),
            // Spin-only stays until a brief switch shows the peer needs this core.
            (SPIN_ONLY, SPIN_POLLS, 9000, false, false, SPIN_ONLY),
            (SPIN_ONLY, SPIN_POLLS, 9000, true, false, SPIN_POLLS),
        ];
        for (start, max, polls, switched, hogged, want) in cases {
            assert_eq!(
                end_wait(start, max, polls, switched, hogged),
                want,
                "start {start} max {max} polls {polls} switched {switched} hogged {hogged}"
            );
        }
    }
}
