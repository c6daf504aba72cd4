//! Communicators: buffer validation, placement adaptation, segmenting, and the typed
//! blocking and non-blocking collective calls; what a backend provides a group
//! ([`Backend`]). The checks a plan passes first are `plan_checks.rs`.

use crate::arena::Arena;
use crate::config::{Config, PlanOrigin, PlanSource};
use crate::dtype::{Element, Kernels, ReduceOp};
use crate::engine::{AlignedBuf, Bufs, Ctx, EngineState, Geometry, VarBlocks, raise_abort};
use crate::error::{ExecError, Result};
use crate::program::{self, ConnTable, Entry};
use crate::transport::Transport;
use hccl_ir::{Collective, CollectiveKind, PlanFile, Protocol};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

/// What every rank of a group shares.
pub(crate) struct Shared {
    pub arena: Arc<Arena>,
    /// Connections to ranks on other hosts (process backend), if any.
    pub net: Option<Arc<dyn Transport>>,
    pub world: u32,
    pub config: Config,
    pub plan_hash: String,
    /// Whether ranks are processes (which cannot read each other's buffers: no single-copy
    /// sends).
    pub check_pids: bool,
    /// See [`Ctx::spin_polls`].
    pub spin_polls: u32,
    /// Where a shrink of this group looks for a plan ([`PlanSource::for_world`]).
    pub origin: PlanSource,
    /// Where the plan this group runs came from.
    pub plan_origin: PlanOrigin,
    /// What the backend the group runs on provides: where ranks are, whether a rank's
    /// process lives, how the survivors meet to shrink the group.
    pub backend: Box<dyn Backend>,
}

impl Shared {
    /// The host identity of `rank` ([`Backend::host_of`]).
    pub(crate) fn host_of(&self, rank: u32) -> String {
        self.backend.host_of(rank)
    }
}

/// What differs between the backends a group of ranks runs on, besides its region (which
/// every backend provides as an [`Arena`]) and the transport between hosts
/// ([`Transport`]). None of it is on the path of a step or a call: the communicator asks
/// when it names a failed rank's host, when a wait checks a peer's liveness, and to shrink.
pub(crate) trait Backend: Send + Sync {
    /// The host identity of `rank`: the rendezvous's table for processes, this machine's
    /// for threads.
    fn host_of(&self, rank: u32) -> String;

    /// Whether rank `p`'s process is gone (ranks that are processes publish their pid in the
    /// region); never for ranks that are threads of this process.
    fn process_gone(&self, arena: &Arena, p: u32) -> bool;

    /// Rank `me` of this group joins the group of `alive` (the survivors of `failed`, in
    /// increasing order), whose plan comes from `chosen` (`from`: the source it was chosen
    /// from), with `config` ([`Communicator::shrink`]): the survivors meet as the backend
    /// lets them, and each gets its communicator of the new group.
    fn shrink(
        &self,
        me: u32,
        failed: &[u32],
        alive: &[u32],
        chosen: PlanSource,
        from: PlanSource,
        config: Config,
    ) -> Result<Communicator>;
}

/// The ranks of a `world`-rank group that survive `failed`, in increasing order (their new
/// ranks are their positions), and `failed` sorted without repeats; `me` must survive.
pub(crate) fn survivors(me: u32, world: u32, failed: &[u32]) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut failed = failed.to_vec();
    failed.sort_unstable();
    failed.dedup();
    if let Some(bad) = failed.iter().find(|&&r| r >= world) {
        return Err(ExecError::Invalid(format!(
            "rank {me}: shrink: rank {bad} is not a rank of this {world}-rank communicator"
        )));
    }
    if failed.contains(&me) {
        return Err(ExecError::Invalid(format!(
            "rank {me}: shrink: this rank is among the failed ranks {failed:?}; only survivors shrink"
        )));
    }
    let alive = (0..world).filter(|r| !failed.contains(r)).collect();
    Ok((alive, failed))
}

/// The source a shrunk group's own shrinks draw from: what loading its plan left (`rest`),
/// or, when it runs the built-in plan, the source it was shrunk from (`from`).
pub(crate) fn next_origin(rest: PlanSource, from: PlanSource) -> PlanSource {
    match rest {
        PlanSource::Builtin => from,
        other => other,
    }
}

/// Aborts a [`Communicator`] from another thread ([`Communicator::abort_handle`]): cheap to
/// clone, `Send` and `Sync`.
#[derive(Clone)]
pub struct AbortHandle {
    rank: u32,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("rank", &self.rank)
            .finish()
    }
}

impl AbortHandle {
    /// Aborts the communicator: a call this rank is blocked in returns an error naming this
    /// rank within milliseconds (its waits check the abort word), as do the other ranks'
    /// calls (the word is shared on the host and forwarded to the other hosts); the
    /// communicator is poisoned by that error. The first abort of a job wins; later ones
    /// change nothing.
    pub fn abort(&self) {
        raise_abort(&self.shared.arena, self.rank, self.rank);
        if let Some(net) = &self.shared.net {
            net.forward_abort();
        }
    }
}

/// Spin budget for `ranks` busy ranks on this host.
///
/// A rank whose thread is bound to a single CPU was placed by a launcher that gives each
/// rank a core of its own (as `mpirun` binds only when ranks do not outnumber cores), so it
/// spins; otherwise ranks are compared with the CPUs this thread may use.
pub(crate) fn spin_polls_for(ranks: u32) -> u32 {
    let allowed = crate::affinity::allowed_cpus().len();
    if allowed == 1 {
        return crate::engine::SPIN_POLLS;
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if ranks as usize > cores {
        2
    } else {
        crate::engine::SPIN_POLLS
    }
}

/// One rank's private state.
pub(crate) struct RankState {
    /// Calls started (see [`crate::calls`]).
    pub(crate) calls: u64,
    pub(crate) entries: Vec<Entry>,
    pub(crate) engine: EngineState,
    pub(crate) scratch: AlignedBuf,
    stage: AlignedBuf,
    /// AllToAllv's padded blocks (input, output) when it replays a relaying entry.
    pub(crate) vstage: (AlignedBuf, AlignedBuf),
    /// AllToAllv said on INFO that it pads its blocks.
    pub(crate) vpadded_said: bool,
}

impl RankState {
    /// `limits`: per plan entry, the largest message count and scratch over all ranks
    /// ([`program::rank_limits`]), when the plan holds only some ranks' programs.
    pub(crate) fn new(
        plan: &PlanFile,
        keep: &[usize],
        conns: &ConnTable,
        rank: u32,
        config: &Config,
        limits: Option<&[(u32, u32)]>,
    ) -> Result<RankState> {
        let mut entries = Vec::with_capacity(keep.len());
        let mut scratch_bytes = 0usize;
        let mut engine = EngineState::new(conns.len());
        for &i in keep {
            let mut e = program::compile(i, &plan.entries[i], rank, conns)?;
            if let Some(&(count, scratch)) = limits.and_then(|l| l.get(i)) {
                e.max_count = e.max_count.max(count);
                e.max_scratch = e.max_scratch.max(scratch);
            }
            // The largest chunk of a segment: at most this many bytes, or one element.
            let per_chunk = (config.slot_bytes / e.geometry_count(config.slot_bytes) as usize)
                .max(crate::dtype::MAX_ELEMENT_BYTES);
            scratch_bytes = scratch_bytes.max(e.program.scratch_chunks as usize * per_chunk);
            engine.prepare(&e.program, config.slot_bytes);
            entries.push(e);
        }
        let mut scratch = AlignedBuf::default();
        scratch.reserve(scratch_bytes);
        if let Some(cfg) = &config.trace {
            let world = plan.entries.first().map_or(0, |e| e.schedule.nranks);
            let rec = crate::trace::Recorder::new(cfg, rank, world)?;
            engine.trace = Some(Box::new(rec));
        }
        Ok(RankState {
            calls: 0,
            entries,
            engine,
            scratch,
            stage: AlignedBuf::default(),
            vstage: Default::default(),
            vpadded_said: false,
        })
    }
}

impl RankState {
    /// Routes this rank's network connections through `net`.
    pub(crate) fn attach_net(&mut self, net: Arc<dyn Transport>) {
        self.engine.attach_net(net);
    }
}

/// The caller's buffers for one call.
#[derive(Debug)]
pub enum Buffers<'a, T> {
    /// One buffer is both input and output (NCCL's in-place convention, see
    /// [`hccl_ir::schedule`]).
    InPlace(&'a mut [T]),
    /// Separate input and output.
    OutOfPlace { input: &'a [T], output: &'a mut [T] },
}

/// Owned buffers for a non-blocking call, handed back by [`Request::wait`].
#[derive(Debug)]
pub enum OwnedBuffers<T> {
    /// One buffer is both input and output.
    InPlace(Vec<T>),
    /// Separate input and output.
    OutOfPlace { input: Vec<T>, output: Vec<T> },
}

/// What the plan chose for a call (for tools and logs).
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    /// Index of the entry in the plan file.
    pub index: usize,
    pub algorithm: String,
    pub protocol: Protocol,
    pub chunks: u32,
    pub in_place: bool,
}

/// A raw call: pointers and element counts.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    pub collective: Collective,
    pub kernels: Kernels,
    pub dtype: crate::dtype::DataType,
    pub op: ReduceOp,
    pub input: *const u8,
    pub in_len: usize,
    pub output: *mut u8,
    pub out_len: usize,
    pub in_place: bool,
    /// The fingerprint to publish instead of the call's own (the rounds of an AllToAllv;
    /// its placement is still that of the entry that runs).
    pub print: Option<crate::calls::CallPrint>,
}

// SAFETY: the pointers refer to buffers the call's owner keeps alive and exclusively lent
// until the call completes (borrowed for the blocking call, owned by the request otherwise).
unsafe impl Send for Call {}

/// The entry for a call: one whose size range covers `bytes` (preferring the requested
/// placement); failing that, the entry of the collective whose range lies nearest (a
/// schedule is correct at any size; ranges only say where it is fastest).
pub(crate) fn lookup(
    entries: &[Entry],
    coll: Collective,
    bytes: u64,
    in_place: bool,
) -> Option<usize> {
    lookup_where(entries, coll, bytes, in_place, |_| true)
}

/// [`lookup`] among the entries `keep` accepts (by index).
pub(crate) fn lookup_where(
    entries: &[Entry],
    coll: Collective,
    bytes: u64,
    in_place: bool,
    keep: impl Fn(usize) -> bool,
) -> Option<usize> {
    let mut best: Option<(u64, bool, usize)> = None;
    for (i, e) in entries.iter().enumerate() {
        if e.collective != coll || !keep(i) {
            continue;
        }
        let distance = if e.covers(bytes) {
            0
        } else if bytes < e.min_bytes {
            e.min_bytes - bytes
        } else {
            bytes - e.max_bytes.unwrap_or(u64::MAX).saturating_sub(1)
        };
        let key = (distance, e.in_place != in_place, i);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best.map(|(_, _, i)| i)
}

/// The most elements a chunk of `entry` may hold with `es`-byte elements, and whether its
/// messages travel in LL slots. The same on every rank (it depends on the entry, the slot
/// size and the element size only).
///
/// LL entries run in segments whose messages fit an LL slot (when a chunk of at least one
/// element does); no message ever exceeds `slot_bytes`, which sizes scratch, hold buffers
/// and what the network accepts.
pub(crate) fn chunk_cap(config: &Config, entry: &Entry, es: usize) -> Result<(usize, bool)> {
    let per_step = es * entry.max_count.max(1) as usize;
    let ll_bytes = crate::arena::LL_BYTES.min(config.slot_bytes);
    let ll = entry.protocol == Protocol::LL && ll_bytes >= per_step;
    let cap = if ll { ll_bytes } else { config.slot_bytes } / per_step;
    // Chunks small enough for the scratch budget too (at least one element: scratch chunks
    // are sized for that, see `RankState::new`).
    let geometry = es * entry.geometry_count(config.slot_bytes) as usize;
    let cap = cap.min((config.slot_bytes / geometry).max(1));
    if cap == 0 {
        return Err(ExecError::Invalid(format!(
            "plan entry {}: steps of {} chunks do not fit a {}-byte slot",
            entry.index, entry.max_count, config.slot_bytes
        )));
    }
    Ok((cap, ll))
}

/// Runs one call on `rank`. Errors leave the caller's output undefined but reported.
///
/// Phases: the buffers checked ([`call_elements`]); the call's fingerprint published; its
/// entry found; the schedule's buffers placed ([`place`]); the segments replayed
/// ([`replay`]); the call finished ([`finish_call`]).
pub(crate) fn execute(shared: &Shared, rank: u32, st: &mut RankState, call: &Call) -> Result<()> {
    let coll = call.collective;
    let es = call.kernels.esize;
    let (total, blocked) = call_elements(shared, rank, call)?;
    let n = shared.world as usize;
    // The call's number and fingerprint, published before anything can make this rank wait
    // (an empty call included: its peers may wait for a non-empty one). Its placement is
    // that of the schedule the rank runs: ranks may place their buffers differently as long
    // as they run the same schedule (the executor adapts each rank's buffers to it).
    st.calls += 1;
    let seq = st.calls;
    let check = shared.config.check_calls;
    let publish = |in_place: bool| {
        (check != crate::config::CallCheck::Off).then(|| {
            let print = match call.print {
                Some(p) => crate::calls::CallPrint { in_place, ..p },
                None => crate::calls::CallPrint {
                    collective: coll,
                    vary: false,
                    dtype: call.dtype,
                    op: call.op,
                    count: total as u64,
                    in_place,
                },
            }
            .pack();
            crate::calls::publish(&shared.arena, rank, seq, print);
            (seq, print)
        })
    };
    // What is compared when the call ends (`HCCL_CHECK_CALLS=1`).
    let at_end = |print: Option<(u64, u64)>| {
        if check == crate::config::CallCheck::EveryCall {
            check_calls(shared, rank, print)
        } else {
            Ok(())
        }
    };
    if total == 0 {
        return at_end(publish(false));
    }
    let count = if blocked { total / n } else { total };
    let bytes = (total * es) as u64;
    let Some(ei) = lookup(&st.entries, coll, bytes, call.in_place) else {
        return Err(no_entry(&shared.config, coll, bytes));
    };
    let print = publish(st.entries[ei].in_place);
    if let Some(t) = st.engine.trace.as_deref_mut() {
        t.note_call(seq, bytes);
    }
    let RankState {
        calls: _,
        entries,
        engine,
        scratch,
        stage,
        ..
    } = st;
    let entry = &entries[ei];
    let cpb = u64::from(if blocked {
        entry.chunks / shared.world
    } else {
        entry.chunks
    })
    .max(1);
    let (cap, ll) = chunk_cap(&shared.config, entry, es)?;
    let stride = count as u64;
    let segmax = cap as u64 * cpb;
    let segs = stride.div_ceil(segmax).max(1);
    let seglen = stride.div_ceil(segs);

    // SAFETY: the buffers hold the lengths `call_elements` checked; `count` and `total` are
    // what it computed.
    let (in_ptr, out_ptr, post_copy) = unsafe { place(call, entry, stage, rank, count, total) };
    let bufs = Bufs {
        input: in_ptr,
        output: out_ptr,
        scratch: scratch.ptr(),
    };
    tracing::trace!(
        rank,
        %coll,
        bytes,
        entry = entry.index,
        algorithm = %entry.algorithm,
        segments = segs,
        "collective start"
    );
    replay(
        shared,
        rank,
        engine,
        entry,
        &bufs,
        &call.kernels,
        print,
        Segments {
            segs,
            seglen,
            stride,
            cpb,
            ll,
            var: None,
        },
    )?;
    // SAFETY: as for `place`; `post_copy` is what it returned.
    unsafe { finish_call(shared, rank, call, post_copy, count, total) };
    Ok(())
}

/// The elements of `call`'s whole collective buffer (N), once its root and the lengths of
/// its buffers are checked against each other, and whether the collective is blocked
/// (AllGather, ReduceScatter, AllToAll: N divides into one block per rank).
#[inline]
fn call_elements(shared: &Shared, rank: u32, call: &Call) -> Result<(usize, bool)> {
    let n = shared.world as usize;
    let coll = call.collective;
    let bad = |message: String| ExecError::BadBuffers {
        rank,
        collective: coll,
        message,
    };
    if let Some(root) = coll.root()
        && root >= shared.world
    {
        return Err(ExecError::Invalid(format!(
            "{coll}: root {root} is not a rank of this {}-rank communicator",
            shared.world
        )));
    }
    let kind = coll.kind();
    let blocked = matches!(
        kind,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll
    );
    // N: elements of the whole collective buffer; count: elements of one block.
    let total = if call.in_place {
        call.out_len
    } else {
        match kind {
            CollectiveKind::AllGather => {
                if call.in_len.checked_mul(n) != Some(call.out_len) {
                    return Err(bad(format!(
                        "output has {} elements, expected input ({}) × {n} ranks",
                        call.out_len, call.in_len
                    )));
                }
                call.out_len
            }
            CollectiveKind::ReduceScatter => {
                if call.out_len.checked_mul(n) != Some(call.in_len) {
                    return Err(bad(format!(
                        "input has {} elements, expected output ({}) × {n} ranks",
                        call.in_len, call.out_len
                    )));
                }
                call.in_len
            }
            _ => {
                if call.in_len != call.out_len {
                    return Err(bad(format!(
                        "input has {} elements but output {}",
                        call.in_len, call.out_len
                    )));
                }
                call.in_len
            }
        }
    };
    if blocked && total % n != 0 {
        return Err(bad(format!(
            "buffer of {total} elements does not divide into {n} ranks"
        )));
    }
    Ok((total, blocked))
}

/// The error for a call no entry of the plan serves, naming the entry filters in force.
#[cold]
fn no_entry(cfg: &Config, collective: Collective, bytes: u64) -> ExecError {
    let mut filter = String::new();
    if let Some(algo) = &cfg.algo {
        filter += &format!(" (HCCL_ALGO={algo})");
    }
    if let Some(proto) = cfg.proto {
        filter += &format!(" (HCCL_PROTO={proto})");
    }
    ExecError::NoEntry {
        collective,
        bytes,
        filter,
    }
}

/// Placement adaptation: where the schedule's Input and Output point for `call` replayed
/// by `entry` (an in-place call on an out-of-place schedule and vice versa), after copying
/// into `stage` or the output what that placement needs first; and the copy that ends the
/// call, if any (source, destination, bytes). `count` and `total` are the elements of a
/// block and of the whole buffer.
///
/// # Safety
///
/// `call`'s buffers hold the elements [`call_elements`] checked, `count` and `total` being
/// what it computed.
#[inline]
#[allow(clippy::type_complexity)]
unsafe fn place(
    call: &Call,
    entry: &Entry,
    stage: &mut AlignedBuf,
    rank: u32,
    count: usize,
    total: usize,
) -> (*mut u8, *mut u8, Option<(*const u8, *mut u8, usize)>) {
    let kind = call.collective.kind();
    let es = call.kernels.esize;
    let r_off = rank as usize * count * es;
    let input = call.input.cast_mut();
    let output = call.output;
    let mut post_copy: Option<(*const u8, *mut u8, usize)> = None;
    // SAFETY: all pointer arithmetic stays inside the caller's buffers (lengths checked by
    // `call_elements`) or the stage buffer reserved right before it is used.
    let (in_ptr, out_ptr) = unsafe {
        match (call.in_place, entry.in_place) {
            (false, false) => {
                if entry.program.writes_input {
                    stage.reserve(call.in_len * es);
                    crate::copy::copy(stage.ptr(), call.input, call.in_len * es);
                    (stage.ptr(), output)
                } else {
                    (input, output)
                }
            }
            (true, true) => match kind {
                CollectiveKind::AllGather => (output.add(r_off), output),
                CollectiveKind::ReduceScatter => (output, output.add(r_off)),
                _ => (output, output),
            },
            (false, true) => match kind {
                CollectiveKind::AllGather => {
                    crate::copy::copy(output.add(r_off), call.input, count * es);
                    (output.add(r_off), output)
                }
                CollectiveKind::ReduceScatter => {
                    stage.reserve(total * es);
                    crate::copy::copy(stage.ptr(), call.input, total * es);
                    post_copy = Some((stage.ptr().add(r_off), output, count * es));
                    (stage.ptr(), stage.ptr().add(r_off))
                }
                _ => {
                    crate::copy::copy(output, call.input, total * es);
                    (output, output)
                }
            },
            (true, false) => match kind {
                CollectiveKind::AllGather => {
                    stage.reserve(count * es);
                    crate::copy::copy(stage.ptr(), output.add(r_off), count * es);
                    (stage.ptr(), output)
                }
                CollectiveKind::ReduceScatter => {
                    stage.reserve(total * es);
                    crate::copy::copy(stage.ptr(), output, total * es);
                    (stage.ptr(), output.add(r_off))
                }
                // Every input read of a chunk comes before its output is written.
                _ if entry.program.alias_in_place => (output, output),
                _ => {
                    stage.reserve(total * es);
                    crate::copy::copy(stage.ptr(), output, total * es);
                    (stage.ptr(), output)
                }
            },
        }
    };
    (in_ptr, out_ptr, post_copy)
}

/// The end of a call: the copy [`place`] left (`post_copy`), then the finishing pass of
/// `avg` (a division by the world size) over what this rank's output holds of the result.
///
/// # Safety
///
/// As for [`place`], `post_copy` being what it returned.
#[inline]
unsafe fn finish_call(
    shared: &Shared,
    rank: u32,
    call: &Call,
    post_copy: Option<(*const u8, *mut u8, usize)>,
    count: usize,
    total: usize,
) {
    let coll = call.collective;
    let kind = coll.kind();
    let output = call.output;
    let r_off = rank as usize * count * call.kernels.esize;
    // SAFETY: see the function's contract.
    unsafe {
        if let Some((src, dst, len)) = post_copy {
            crate::copy::copy(dst, src, len);
        }
        if let Some(div) = call.kernels.finish {
            let final_out = if call.in_place && kind == CollectiveKind::ReduceScatter {
                output.add(r_off)
            } else {
                output
            };
            match coll {
                Collective::AllReduce => div(final_out, total, shared.world),
                Collective::ReduceScatter => div(final_out, count, shared.world),
                Collective::Reduce { root } if root == rank => div(final_out, total, shared.world),
                _ => {}
            }
        }
    }
}

/// How a call is cut into segments (see [`crate::engine`]).
#[derive(Clone, Copy)]
pub(crate) struct Segments<'a> {
    pub segs: u64,
    pub seglen: u64,
    pub stride: u64,
    pub cpb: u64,
    pub ll: bool,
    /// An AllToAllv's blocks, with the largest chunk of any of its segments, in elements.
    pub var: Option<(&'a VarBlocks, usize)>,
}

/// Runs `entry` over the call's segments, under the call fingerprint `print`: the waits'
/// context, the network's call boundaries, and the end-of-call comparison
/// (`HCCL_CHECK_CALLS=1`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn replay(
    shared: &Shared,
    rank: u32,
    engine: &mut EngineState,
    entry: &Entry,
    bufs: &Bufs,
    kernels: &Kernels,
    print: Option<(u64, u64)>,
    seg: Segments<'_>,
) -> Result<()> {
    let failure = |p: u32| peer_failure(shared, p);
    let on_wait = || {
        if let Some(net) = &shared.net {
            net.on_wait();
        }
    };
    let ctx = Ctx {
        rank,
        arena: &shared.arena,
        timeout: shared.config.timeout,
        failure: &failure,
        on_wait: &on_wait,
        spin_polls: shared.spin_polls,
        single_copy: !shared.check_pids && !shared.config.checksum,
        checksum: shared.config.checksum,
        stream_writes: shared.config.stream_writes,
        call: print,
    };
    if let Some(net) = &shared.net {
        net.begin_call();
    }
    if let Some(t) = engine.trace.as_deref_mut() {
        t.begin(entry, seg.segs);
    }
    // Time in calls for `Communicator::stats`, sampled (see `waits::TIME_EVERY`).
    let started = engine.waits.time_replay().then(std::time::Instant::now);
    let res = run_segments(shared, engine, &ctx, entry, bufs, kernels, seg);
    if let Some(t) = started {
        engine.waits.timed_replay(t.elapsed());
    }
    let res = res.and_then(|()| {
        if shared.config.check_calls == crate::config::CallCheck::EveryCall {
            check_calls(shared, rank, print)
        } else {
            Ok(())
        }
    });
    if let Some(t) = engine.trace.as_deref_mut() {
        t.end(res.is_ok());
    }
    if let Some(net) = &shared.net {
        net.end_call();
        if res.is_err() {
            net.forward_abort();
        }
    }
    res
}

/// Replays `entry` over every segment of a call.
fn run_segments(
    shared: &Shared,
    engine: &mut EngineState,
    ctx: &Ctx<'_>,
    entry: &Entry,
    bufs: &Bufs,
    kernels: &Kernels,
    Segments {
        segs,
        seglen,
        stride,
        cpb,
        ll,
        var,
    }: Segments<'_>,
) -> Result<()> {
    let rank = ctx.rank;
    for s in 0..segs {
        let lo = s * seglen;
        let len = seglen.min(stride - lo);
        let geo = Geometry {
            esize: kernels.esize,
            cpb,
            stride,
            lo,
            len,
            maxc: var.map_or(len.div_ceil(cpb) as usize, |(_, maxc)| maxc),
            ll,
            var: var.map(|(v, _)| v),
            seg: s,
        };
        if let Err(e) = engine.run_segment(ctx, &entry.program, &geo, bufs, kernels) {
            engine.settle_all(&shared.arena);
            return Err(with_host(shared, e));
        }
    }
    if let Some(net) = &shared.net {
        // A send that failed is noticed by no wait of this rank: report it here.
        if let Some((failed, reason)) = net.take_send_failure() {
            raise_abort(&shared.arena, rank, failed);
            return Err(with_host(
                shared,
                ExecError::PeerFailed {
                    rank,
                    failed,
                    reason,
                },
            ));
        }
        let word = shared.arena.abort().load(Ordering::Acquire);
        if word != 0 {
            return Err(with_host(
                shared,
                crate::engine::abort_error(&shared.arena, rank, word, ctx.call),
            ));
        }
    }
    // Peers may still read this rank's buffers through pointer messages: settle them
    // before the buffers go back to the caller.
    engine.settle_all(&shared.arena);
    Ok(())
}

/// Compares this rank's call (`print`: its number and fingerprint) with the same call of
/// every rank that shares the region and shows it; a difference aborts the communicator.
fn check_calls(shared: &Shared, rank: u32, print: Option<(u64, u64)>) -> Result<()> {
    let Some((seq, print)) = print else {
        return Ok(());
    };
    for peer in (0..shared.world).filter(|&p| p != rank) {
        if let Some(e) = crate::calls::compare(&shared.arena, rank, peer, seq, print) {
            raise_abort(&shared.arena, rank, peer);
            return Err(e);
        }
    }
    Ok(())
}

/// `None` while rank `p` lives, else what happened to it.
fn peer_failure(shared: &Shared, p: u32) -> Option<String> {
    if let Some(net) = &shared.net
        && let Some(why) = net.peer_failure(p)
    {
        return Some(why);
    }
    if shared.arena.gone(p as usize).load(Ordering::Acquire) != 0 {
        return Some("it left the communicator".into());
    }
    if shared.backend.process_gone(&shared.arena, p) {
        return Some("it died".into());
    }
    None
}

/// Adds the failed rank's host to errors of multi-host jobs.
fn with_host(shared: &Shared, e: ExecError) -> ExecError {
    let Some(net) = &shared.net else { return e };
    match e {
        ExecError::PeerFailed {
            rank,
            failed,
            reason,
        } if !reason.contains("on host") => ExecError::PeerFailed {
            rank,
            failed,
            reason: format!("{reason}; rank {failed} is on host {}", net.host_of(failed)),
        },
        other => other,
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One rank's handle on a group: runs collectives over typed buffers.
///
/// Use each communicator from one thread at a time (`&mut self`); ranks of a group run
/// concurrently. After a failed call the communicator is poisoned: later calls return
/// [`ExecError::Poisoned`].
pub struct Communicator {
    pub(crate) rank: u32,
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: Option<Box<RankState>>,
    poisoned: Option<String>,
    worker: Option<Worker>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.shared.world)
            .field("plan_hash", &self.shared.plan_hash)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    pub(crate) fn new(rank: u32, shared: Arc<Shared>, state: RankState) -> Communicator {
        Communicator {
            rank,
            shared,
            state: Some(Box::new(state)),
            poisoned: None,
            worker: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.shared.world
    }

    /// The host identity of `rank` in this group: ranks with the same one share a
    /// shared-memory region, the others talk over the network. For processes, what the rank
    /// claimed at the rendezvous (`HCCL_HOST_ID`, else host name and boot id), made
    /// distinct where ranks that claim one host cannot share memory (different machines, or
    /// different shared-memory directories: `+shm:DEV:INO`); for threads, this machine's.
    pub fn host_of(&self, rank: u32) -> String {
        self.shared.host_of(rank)
    }

    /// Content hash of the plan all ranks agreed on.
    pub fn plan_hash(&self) -> &str {
        &self.shared.plan_hash
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The entry a call of `bytes` would use.
    pub fn entry_for(
        &self,
        collective: Collective,
        bytes: u64,
        in_place: bool,
    ) -> Option<EntryInfo> {
        let st = self.state.as_ref()?;
        let i = lookup(&st.entries, collective, bytes, in_place)?;
        let e = &st.entries[i];
        Some(EntryInfo {
            index: e.index,
            algorithm: e.algorithm.clone(),
            protocol: e.protocol,
            chunks: e.chunks,
            in_place: e.in_place,
        })
    }

    /// Writes this rank's trace now (`HCCL_TRACE=DIR`, [`Config::trace`]): `DIR/rank-<r>.json`,
    /// atomically, holding every call recorded so far; its path, or `None` when the
    /// communicator does not trace. The file is written again when the communicator is
    /// dropped (if calls were recorded since).
    pub fn flush_trace(&mut self) -> Result<Option<std::path::PathBuf>> {
        let rank = self.rank;
        let st = self.state.as_mut().ok_or_else(|| {
            ExecError::Invalid(format!(
                "rank {rank}: a non-blocking call is in flight; wait for it before flushing the trace"
            ))
        })?;
        match st.engine.trace.as_deref_mut() {
            Some(t) => t.flush().map(Some),
            None => Ok(None),
        }
    }

    /// Where the plan this communicator runs came from: a plan file or directory, the
    /// built-in plans, or a plan the program passed in memory.
    pub fn plan_origin(&self) -> &PlanOrigin {
        &self.shared.plan_origin
    }

    /// The communicator of the survivors when ranks `failed` are lost (NCCL's
    /// `ncclCommShrink` with excluded ranks). Every survivor calls it with the same failed
    /// ranks; their new ranks are their old ranks in increasing order, renumbered from 0.
    ///
    /// This communicator is aborted first (a survivor still blocked in a call returns) and
    /// stays poisoned. The plan of the new world size comes from where this communicator's
    /// plan came from when that has entries for it (a plan directory holding plans for
    /// several world sizes, a plan file or an in-memory plan with such entries), else from
    /// the built-in plans; one INFO line says which. It is checked, verified and agreed on
    /// exactly as at init. The survivors meet within the configured timeout: a survivor that
    /// does not come, or survivors that pass different failed ranks, make the others return
    /// an error naming them. Threads of one process meet in memory; processes rendezvous
    /// again at the lowest survivor's address, port `MASTER_PORT + k` for the `k`-th shrink
    /// (see the README).
    ///
    /// `failed` may be empty: the same ranks then build a fresh group, e.g. after an abort.
    pub fn shrink(&mut self, failed: &[u32]) -> Result<Communicator> {
        let source = self.shared.origin.clone();
        self.shrink_with(failed, source)
    }

    /// [`Communicator::shrink`] with the new plan from `source` (`HCCL_PLAN` does not
    /// override it): its entries for the new world size, or the built-in plan when it has
    /// none.
    pub fn shrink_with(&mut self, failed: &[u32], source: PlanSource) -> Result<Communicator> {
        let me = self.rank;
        let world = self.shared.world;
        let (alive, failed) = survivors(me, world, failed)?;
        // The old group is over: a survivor still blocked in a call returns now.
        raise_abort(
            &self.shared.arena,
            me,
            failed.first().copied().unwrap_or(me),
        );
        if let Some(net) = &self.shared.net {
            net.forward_abort();
        }
        self.poisoned = Some(format!(
            "it was shrunk to the survivors of ranks {failed:?}; use the new communicator"
        ));
        let n = alive.len() as u32;
        let (chosen, why) = source.clone().for_world(n);
        let started = std::time::Instant::now();
        let mut config = self.shared.config.clone();
        // `HCCL_ALGO` was checked against the communicator's plan; the built-in plan a shrink
        // falls back to need not have that family, and then the filter does not apply there.
        if matches!(chosen, PlanSource::Builtin)
            && let Some(algo) = &config.algo
            && !crate::fallback::plan(n)
                .entries
                .iter()
                .any(|e| e.algorithm.eq_ignore_ascii_case(algo))
        {
            tracing::warn!("shrink: the built-in plan has no {algo} entries; HCCL_ALGO ignored");
            config.algo = None;
        }
        // The survivors are renumbered: their group traces into a directory of its own.
        if let Some(t) = &mut config.trace {
            let without: Vec<String> = failed.iter().map(u32::to_string).collect();
            let without = if without.is_empty() {
                "none".to_string()
            } else {
                without.join("-")
            };
            t.dir = t.dir.join(format!("shrink-without-{without}"));
        }
        let comm = self
            .shared
            .backend
            .shrink(me, &failed, &alive, chosen, source, config)?;
        tracing::info!(
            rank = comm.rank(),
            was = me,
            world = n,
            of = world,
            plan = %comm.plan_hash(),
            secs = started.elapsed().as_secs_f64(),
            "shrunk communicator without ranks {failed:?} uses {why}"
        );
        Ok(comm)
    }

    /// How long this rank waited for which ranks, and the calls it made (see
    /// [`crate::waits`]): numbers since the communicator was made, kept by the engine
    /// without reading the clock in calls that do not wait (but one in 64, timed for the time
    /// in calls). `None` only while a leaked non-blocking request holds this rank's state.
    pub fn stats(&self) -> Option<crate::waits::WaitStats> {
        let st = self.state.as_ref()?;
        Some(st.engine.waits.stats(self.rank, st.calls))
    }

    /// The group's view of who held everyone up: the ranks the others waited for most, with
    /// each one's host, share of all waiting and wait percentiles. Collective: every rank
    /// calls it, after the same calls, and gets the same report. It sums every rank's
    /// [`Communicator::stats`] with two AllReduces of `u64` through this communicator (about
    /// `930 · ranks` bytes), which count as calls but not in the report; a plan without an
    /// AllReduce entry makes it fail with [`ExecError::NoEntry`] on every rank.
    pub fn straggler_report(&mut self) -> Result<crate::waits::StragglerReport> {
        let world = self.shared.world;
        let st = self.state.as_ref().ok_or_else(|| ExecError::Poisoned {
            rank: self.rank,
            reason: "a non-blocking request was leaked".into(),
        })?;
        let (mut sums, mut maxes) = st.engine.waits.group_rows(self.rank, world);
        // The report's own calls are not the program's: they stay out of its trace.
        let trace = self.state.as_mut().and_then(|st| st.engine.trace.take());
        let ran = self
            .run(
                Collective::AllReduce,
                ReduceOp::Sum,
                Buffers::InPlace(&mut sums),
            )
            .and_then(|()| {
                self.run(
                    Collective::AllReduce,
                    ReduceOp::Max,
                    Buffers::InPlace(&mut maxes),
                )
            });
        if let Some(st) = self.state.as_mut()
            && trace.is_some()
        {
            st.engine.trace = trace;
        }
        ran?;
        Ok(crate::waits::report(&sums, &maxes, world, |r| {
            crate::waits::host_name(&self.shared.host_of(r))
        }))
    }

    /// Ends this rank's use of the communicator: collective, like NCCL's `ncclCommFinalize`
    /// (every rank calls it). A communicator in good standing first computes the group's
    /// [`Communicator::straggler_report`], which rank 0 logs at `HCCL_DEBUG=INFO` and every
    /// rank returns; a poisoned or aborted one (a failure, [`Communicator::shrink`]) runs no
    /// collective and returns `None`, as do ranks whose report failed (the error is logged
    /// at WARN). The communicator is dropped either way.
    pub fn finalize(mut self) -> Option<crate::waits::StragglerReport> {
        if self.poisoned.is_some() {
            return None;
        }
        match self.straggler_report() {
            Ok(report) => {
                if self.rank == 0 {
                    tracing::info!(ranks = report.ranks, "straggler report: {report}");
                }
                Some(report)
            }
            Err(e) => {
                tracing::warn!(rank = self.rank, "no straggler report at finalize: {e}");
                None
            }
        }
    }

    /// Marks the communicator failed and tells the other ranks.
    pub fn abort(&mut self) {
        self.abort_handle().abort();
        self.poisoned = Some("aborted by the caller".into());
    }

    /// A handle that aborts this communicator from any thread, also while a call blocks in
    /// it (see [`AbortHandle::abort`]).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            rank: self.rank,
            shared: Arc::clone(&self.shared),
        }
    }

    pub(crate) fn take_state(&mut self) -> Result<Box<RankState>> {
        if let Some(reason) = &self.poisoned {
            return Err(ExecError::Poisoned {
                rank: self.rank,
                reason: reason.clone(),
            });
        }
        self.state.take().ok_or_else(|| ExecError::Poisoned {
            rank: self.rank,
            reason: "a non-blocking request was leaked".into(),
        })
    }

    pub(crate) fn finish(&mut self, state: Box<RankState>, res: Result<()>) -> Result<()> {
        self.state = Some(state);
        if let Err(e) = &res
            && !matches!(
                e,
                ExecError::BadBuffers { .. } | ExecError::Invalid(_) | ExecError::NoEntry { .. }
            )
        {
            self.poisoned = Some(e.to_string());
        }
        res
    }

    /// Runs `collective` over `buffers`; `op` is ignored by collectives that do not reduce.
    pub fn run<T: Element>(
        &mut self,
        collective: Collective,
        op: ReduceOp,
        mut buffers: Buffers<'_, T>,
    ) -> Result<()> {
        let call = make_call(collective, op, &mut buffers);
        let mut state = self.take_state()?;
        let res = execute(&self.shared, self.rank, &mut state, &call);
        self.finish(state, res)
    }

    /// Runs `collective` like [`Communicator::run`] and returns how long this rank spent in
    /// it (for perf tools; the clock starts when this rank enters the call).
    pub fn run_timed<T: Element>(
        &mut self,
        collective: Collective,
        op: ReduceOp,
        buffers: Buffers<'_, T>,
    ) -> Result<std::time::Duration> {
        let start = std::time::Instant::now();
        self.run(collective, op, buffers)?;
        Ok(start.elapsed())
    }

    /// Starts `collective` on a worker thread; the buffers come back from [`Request::wait`].
    pub fn start<T: Element>(
        &mut self,
        collective: Collective,
        op: ReduceOp,
        mut buffers: OwnedBuffers<T>,
    ) -> Result<Request<'_, T>> {
        let mut state = self.take_state()?;
        if self.worker.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let handle = std::thread::Builder::new()
                .name(format!("hccl-rank{}", self.rank))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|source| ExecError::Io {
                    rank: self.rank,
                    what: "spawning the non-blocking worker".into(),
                    source,
                });
            let handle = match handle {
                Ok(h) => h,
                Err(e) => {
                    self.state = Some(state);
                    return Err(e);
                }
            };
            self.worker = Some(Worker {
                tx: Some(tx),
                handle: Some(handle),
            });
        }
        let (done_tx, done_rx) = mpsc::channel();
        let shared = Arc::clone(&self.shared);
        let rank = self.rank;
        let job: Job = Box::new(move || {
            let mut borrowed = match &mut buffers {
                OwnedBuffers::InPlace(b) => Buffers::InPlace(b.as_mut_slice()),
                OwnedBuffers::OutOfPlace { input, output } => Buffers::OutOfPlace {
                    input: input.as_slice(),
                    output: output.as_mut_slice(),
                },
            };
            let call = make_call(collective, op, &mut borrowed);
            let res = execute(&shared, rank, &mut state, &call);
            let _ = done_tx.send((state, res, buffers));
        });
        let sent = self
            .worker
            .as_ref()
            .and_then(|w| w.tx.as_ref())
            .map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            self.poisoned = Some("the non-blocking worker stopped".into());
            return Err(ExecError::Internal {
                rank: self.rank,
                message: "the non-blocking worker stopped".into(),
            });
        }
        Ok(Request {
            comm: self,
            rx: Some(done_rx),
        })
    }
}

fn make_call<T: Element>(collective: Collective, op: ReduceOp, b: &mut Buffers<'_, T>) -> Call {
    let op = if collective.kind().reduces() {
        op
    } else {
        ReduceOp::Sum
    };
    let kernels = Kernels::new(T::DTYPE, op);
    match b {
        Buffers::InPlace(buf) => Call {
            collective,
            kernels,
            dtype: T::DTYPE,
            op,
            input: buf.as_ptr().cast(),
            in_len: buf.len(),
            output: buf.as_mut_ptr().cast(),
            out_len: buf.len(),
            in_place: true,
            print: None,
        },
        Buffers::OutOfPlace { input, output } => Call {
            collective,
            kernels,
            dtype: T::DTYPE,
            op,
            input: input.as_ptr().cast(),
            in_len: input.len(),
            output: output.as_mut_ptr().cast(),
            out_len: output.len(),
            in_place: false,
            print: None,
        },
    }
}

type Done<T> = (Box<RankState>, Result<()>, OwnedBuffers<T>);

/// A collective in flight; [`Request::wait`] returns its buffers. Dropping it waits too.
pub struct Request<'c, T> {
    comm: &'c mut Communicator,
    rx: Option<mpsc::Receiver<Done<T>>>,
}

impl<T> std::fmt::Debug for Request<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("rank", &self.comm.rank)
            .finish_non_exhaustive()
    }
}

impl<T> Request<'_, T> {
    fn complete(&mut self) -> Result<OwnedBuffers<T>> {
        let rank = self.comm.rank;
        let rx = self.rx.take().ok_or_else(|| ExecError::Internal {
            rank,
            message: "request already completed".into(),
        })?;
        match rx.recv() {
            Ok((state, res, bufs)) => self.comm.finish(state, res).map(|()| bufs),
            Err(_) => {
                self.comm.poisoned = Some("the non-blocking worker stopped".into());
                Err(ExecError::Internal {
                    rank,
                    message: "the non-blocking worker stopped".into(),
                })
            }
        }
    }

    /// Waits for completion and hands the buffers back.
    pub fn wait(mut self) -> Result<OwnedBuffers<T>> {
        self.complete()
    }
}

impl<T> Drop for Request<'_, T> {
    fn drop(&mut self) {
        if self.rx.is_some() {
            let _ = self.complete();
        }
    }
}

impl Drop for Communicator {
    /// Marks this rank gone. With `HCCL_DEBUG=INFO` it first logs this rank's own waits
    /// ([`Communicator::stats`]): dropping is not collective (ranks of a thread group may be
    /// dropped one after another by one thread), so the group's view is logged by
    /// [`Communicator::finalize`] only.
    fn drop(&mut self) {
        self.worker.take();
        if tracing::enabled!(tracing::Level::INFO)
            && let Some(stats) = self.stats()
            && stats.calls > 0
        {
            tracing::info!(rank = self.rank, "waits: {stats}");
        }
        self.shared
            .arena
            .gone(self.rank as usize)
            .store(1, Ordering::Release);
    }
}

macro_rules! typed {
    ($(#[$m:meta])* $name:ident, $name_ip:ident, $coll:expr, reduce) => {
        $(#[$m])*
        pub fn $name<T: Element>(&mut self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
            self.run($coll, op, Buffers::OutOfPlace { input, output })
        }
        /// In-place variant (see [`Buffers::InPlace`]).
        pub fn $name_ip<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
            self.run($coll, op, Buffers::InPlace(buf))
        }
    };
    ($(#[$m:meta])* $name:ident, $name_ip:ident, $coll:expr, plain) => {
        $(#[$m])*
        pub fn $name<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
            self.run($coll, ReduceOp::Sum, Buffers::OutOfPlace { input, output })
        }
        /// In-place variant (see [`Buffers::InPlace`]).
        pub fn $name_ip<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
            self.run($coll, ReduceOp::Sum, Buffers::InPlace(buf))
        }
    };
}

impl Communicator {
    typed!(
        /// AllReduce: every output is `⊕` over the ranks' inputs (equal lengths).
        all_reduce, all_reduce_in_place, Collective::AllReduce, reduce
    );
    typed!(
        /// ReduceScatter: the input holds `n` blocks; rank `r` gets the reduction of block `r`.
        /// In place, the result lands in block `r` of the buffer.
        reduce_scatter, reduce_scatter_in_place, Collective::ReduceScatter, reduce
    );
    typed!(
        /// AllGather: the output is the concatenation of every rank's input. In place, the
        /// buffer's block `r` is this rank's input.
        all_gather, all_gather_in_place, Collective::AllGather, plain
    );
    typed!(
        /// AllToAll: block `b` of this rank's input goes to block `r` of rank `b`'s output.
        all_to_all, all_to_all_in_place, Collective::AllToAll, plain
    );

    /// Broadcast: every output becomes the root's input (which only the root reads).
    pub fn broadcast<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: u32,
    ) -> Result<()> {
        self.run(
            Collective::Broadcast { root },
            ReduceOp::Sum,
            Buffers::OutOfPlace { input, output },
        )
    }

    /// In-place Broadcast.
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &mut [T], root: u32) -> Result<()> {
        self.run(
            Collective::Broadcast { root },
            ReduceOp::Sum,
            Buffers::InPlace(buf),
        )
    }

    /// Reduce: the root's output becomes `⊕` over the inputs; other outputs are unspecified.
    pub fn reduce<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        self.run(
            Collective::Reduce { root },
            op,
            Buffers::OutOfPlace { input, output },
        )
    }

    /// In-place Reduce.
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        self.run(Collective::Reduce { root }, op, Buffers::InPlace(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_bound_to_one_cpu_spins_whatever_the_rank_count() {
        std::thread::spawn(|| {
            crate::affinity::bind_current_thread(0).expect("bind to the first allowed CPU");
            assert_eq!(spin_polls_for(64), crate::engine::SPIN_POLLS);
        })
        .join()
        .expect("the bound thread");
        // Unbound, ranks that outnumber the CPUs spin only briefly.
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        if crate::affinity::allowed_cpus().len() > 1 {
            assert!(spin_polls_for(cpus as u32 + 1) < crate::engine::SPIN_POLLS);
            assert_eq!(spin_polls_for(1), crate::engine::SPIN_POLLS);
        }
    }
}
