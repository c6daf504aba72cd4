//! [`CudaGroup`]: all ranks of a group in this process, on one or several GPUs.

use super::call::{Call, DeviceMap, VCall};
use super::device::{Dev, DeviceBuf, enable_peer_access};
use super::kernels::{self, THREADS};
use super::lower::{self, Cmd, Lowered, Mem, Placement, Span};
use super::{CudaError, drv, probe};
use crate::config::Config;
use crate::dtype::{DataType, Element, ReduceOp};
use crate::program::{self, ConnTable, Entry};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaStream, LaunchConfig, PushKernelArg, result, sys,
};
use hccl_ir::{Collective, PlanFile};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A call of either kind, as the cache and the launch path see it.
#[derive(Clone, Copy)]
enum Which<'a> {
    Plain(&'a Call),
    V(&'a VCall),
}

/// A lowered call with everything its replay needs.
struct Prepared {
    lowered: Lowered,
    staging: Vec<DeviceBuf>,
    events: Vec<CudaEvent>,
    fork: CudaEvent,
    joins: Vec<CudaEvent>,
    graph: Option<CudaGraph>,
    /// Device buffer pointers, resolved per command, checked in bounds.
    dtype: DataType,
    op: ReduceOp,
}

#[derive(Default)]
struct RankBufs {
    send: Option<DeviceBuf>,
    recv: Option<DeviceBuf>,
    scratch: Option<DeviceBuf>,
    temp: Option<DeviceBuf>,
}

/// Direct access between the group's devices (by device index).
struct Access<'a> {
    rank_dev: &'a [usize],
    direct: &'a [Vec<bool>],
}

impl Placement for Access<'_> {
    fn direct(&self, reader: u32, owner: u32) -> bool {
        let (a, b) = (
            self.rank_dev[reader as usize],
            self.rank_dev[owner as usize],
        );
        a == b || self.direct[a][b]
    }
}

/// Every rank of a group in this process, each with device buffers, replaying a plan.
///
/// Typical use: [`CudaGroup::new`], then per call [`CudaGroup::write_input`] for each rank,
/// [`CudaGroup::run`], [`CudaGroup::read_output`].
pub struct CudaGroup {
    nranks: u32,
    plan: PlanFile,
    keep: Vec<usize>,
    conns: ConnTable,
    compiled: HashMap<usize, Vec<Entry>>,
    devs: Vec<Dev>,
    rank_dev: Vec<usize>,
    direct: Vec<Vec<bool>>,
    rank_streams: Vec<Vec<Arc<CudaStream>>>,
    bufs: Vec<RankBufs>,
    cache: HashMap<Call, Prepared>,
    vcache: HashMap<VCall, Prepared>,
    /// The built-in pairwise AllToAll (verified) that AllToAllv runs on when no AllToAll
    /// entry of the plan moves blocks straight to their ranks.
    v_fallback: Option<Vec<Entry>>,
}

impl CudaGroup {
    /// A group of `nranks` ranks placed by `devices`, replaying `plan` (verified first; the
    /// `HCCL_ALGO`/`HCCL_PROTO` filters of [`Config::from_env`] apply).
    pub fn new(plan: &PlanFile, nranks: u32, devices: DeviceMap) -> Result<CudaGroup, CudaError> {
        Self::with_config(plan, nranks, devices, &Config::default())
    }

    /// As [`CudaGroup::new`] with explicit entry filters.
    pub fn with_config(
        plan: &PlanFile,
        nranks: u32,
        devices: DeviceMap,
        config: &Config,
    ) -> Result<CudaGroup, CudaError> {
        if devices.ordinals.len() != nranks as usize {
            return Err(CudaError::Invalid(format!(
                "device map names {} devices for {nranks} ranks",
                devices.ordinals.len()
            )));
        }
        let info = probe()?;
        let (keep, conns) = crate::plan_checks::prepare_plan(plan, nranks, config)?;
        let mut devs: Vec<Dev> = Vec::new();
        let mut ordinal_dev: HashMap<usize, usize> = HashMap::new();
        let mut rank_dev = Vec::with_capacity(nranks as usize);
        for &ord in &devices.ordinals {
            if ord >= info.count {
                return Err(CudaError::Invalid(format!(
                    "device {ord} does not exist ({} devices)",
                    info.count
                )));
            }
            let idx = match ordinal_dev.get(&ord) {
                Some(&i) => i,
                None => {
                    let ctx = drv(
                        || format!("creating the context of device {ord}"),
                        CudaContext::new(ord),
                    )?;
                    // SAFETY: the group orders all its work itself with events (see `lower`)
                    // and synchronizes before freeing memory, which is what cudarc's tracking
                    // would otherwise provide.
                    unsafe { ctx.disable_event_tracking() };
                    let main = drv(|| "creating a stream".into(), ctx.new_stream())?;
                    let (maj, min) = drv(|| "compute capability".into(), ctx.compute_capability())?;
                    let sms = drv(
                        || "multiprocessor count".into(),
                        ctx.attribute(
                            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                        ),
                    )?;
                    devs.push(Dev {
                        ctx,
                        main,
                        sms: sms.max(1) as u32,
                        arch: format!("compute_{maj}{min}"),
                        kernels: OnceLock::new(),
                    });
                    ordinal_dev.insert(ord, devs.len() - 1);
                    devs.len() - 1
                }
            };
            rank_dev.push(idx);
        }
        let direct = enable_peer_access(&devs)?;
        Ok(CudaGroup {
            nranks,
            plan: plan.clone(),
            keep,
            conns,
            compiled: HashMap::new(),
            devs,
            rank_dev,
            direct,
            rank_streams: vec![Vec::new(); nranks as usize],
            bufs: (0..nranks).map(|_| RankBufs::default()).collect(),
            cache: HashMap::new(),
            vcache: HashMap::new(),
            v_fallback: None,
        })
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Names of the devices in use, by device index.
    pub fn device_names(&self) -> Vec<String> {
        self.devs
            .iter()
            .map(|d| d.ctx.name().unwrap_or_else(|_| "?".into()))
            .collect()
    }

    /// Compiles (once) and loads the kernels on every device; returns the time it took.
    pub fn warm_kernels(&self) -> Result<std::time::Duration, CudaError> {
        let t = std::time::Instant::now();
        for d in &self.devs {
            d.kernels()?;
        }
        Ok(t.elapsed())
    }

    fn entry_for(&mut self, call: &Call) -> Result<&Vec<Entry>, CudaError> {
        let bytes = call.bytes();
        let mut found = None;
        for &i in &self.keep {
            let e = &self.plan.entries[i];
            if e.schedule.collective == call.collective && e.covers(bytes) {
                if e.schedule.in_place == call.in_place {
                    found = Some(i);
                    break;
                }
                found.get_or_insert(i);
            }
        }
        let i = found.ok_or(crate::error::ExecError::NoEntry {
            collective: call.collective,
            bytes,
            filter: String::new(),
        })?;
        if !self.compiled.contains_key(&i) {
            let per_rank = (0..self.nranks)
                .map(|r| program::compile(i, &self.plan.entries[i], r, &self.conns))
                .collect::<Result<Vec<_>, _>>()?;
            self.compiled.insert(i, per_rank);
        }
        self.compiled
            .get(&i)
            .ok_or_else(|| CudaError::Internal("compiled entry vanished".into()))
    }

    fn synchronize_all(&self) -> Result<(), CudaError> {
        for d in &self.devs {
            drv(|| "synchronizing the device".into(), d.ctx.synchronize())?;
        }
        Ok(())
    }

    /// Lowers `call`, sizes buffers and streams for it, and caches the result. Growing a
    /// buffer drops every cached call (their pointers change) and clears the buffers.
    pub fn prepare(&mut self, call: &Call) -> Result<(), CudaError> {
        if self.cache.contains_key(call) {
            return Ok(());
        }
        if let Some(root) = call.collective.root()
            && root >= self.nranks
        {
            return Err(CudaError::Invalid(format!(
                "{}: root {root} is not a rank of this {}-rank group",
                call.collective, self.nranks
            )));
        }
        if call.count == 0 {
            return Err(CudaError::Invalid(
                "a call needs at least one element".into(),
            ));
        }
        let shape = call.shape();
        let entries = self.entry_for(call)?.clone();
        let access = Access {
            rank_dev: &self.rank_dev,
            direct: &self.direct,
        };
        let lowered = lower::lower(&entries, &shape, &access)?;
        tracing::debug!(
            call = ?call,
            queues = lowered.queues.len(),
            commands = lowered.cmds.len(),
            staged_for_order = lowered.staged_for_order,
            "cuda: lowered call"
        );
        let prepared = self.install(lowered, call.dtype, shape.op)?;
        self.cache.insert(*call, prepared);
        Ok(())
    }

    /// The AllToAll entry (compiled per rank) an AllToAllv of `call` replays: of the plan's
    /// out-of-place AllToAll entries that move blocks straight to their ranks on every rank,
    /// the one for blocks of the call's largest size, or the nearest; else the built-in
    /// pairwise AllToAll.
    fn entry_for_v(&mut self, call: &VCall) -> Result<Vec<Entry>, CudaError> {
        let n = self.nranks;
        let bytes = (call.layout.largest() * n as usize * call.dtype.size()) as u64;
        let mut best: Option<(u64, usize)> = None;
        for k in 0..self.keep.len() {
            let i = self.keep[k];
            let e = &self.plan.entries[i];
            if e.schedule.collective != Collective::AllToAll || e.schedule.in_place {
                continue;
            }
            if !self.compiled.contains_key(&i) {
                let per_rank = (0..n)
                    .map(|r| program::compile(i, &self.plan.entries[i], r, &self.conns))
                    .collect::<Result<Vec<_>, _>>()?;
                self.compiled.insert(i, per_rank);
            }
            let compiled = &self.compiled[&i];
            if !(0..n).all(|r| crate::alltoallv::blockwise(&compiled[r as usize], r, n)) {
                continue;
            }
            let e = &self.plan.entries[i];
            let distance = if e.covers(bytes) {
                0
            } else if bytes < e.min_bytes {
                e.min_bytes - bytes
            } else {
                bytes.saturating_sub(e.max_bytes.unwrap_or(u64::MAX))
            };
            if best.is_none_or(|(d, _)| distance < d) {
                best = Some((distance, i));
            }
        }
        if let Some((_, i)) = best {
            return Ok(self.compiled[&i].clone());
        }
        if self.v_fallback.is_none() {
            let plan = crate::fallback::alltoall_plan(n, 2, 1);
            let (keep, conns) = crate::plan_checks::prepare_plan(&plan, n, &Config::default())?;
            let i = *keep.first().ok_or_else(|| {
                CudaError::Internal("the built-in AllToAll plan has no entry".into())
            })?;
            let per_rank = (0..n)
                .map(|r| program::compile(i, &plan.entries[i], r, &conns))
                .collect::<Result<Vec<_>, _>>()?;
            tracing::info!(
                "cuda: alltoallv: no AllToAll entry of the plan moves blocks straight to their \
                 ranks; using the built-in pairwise AllToAll"
            );
            self.v_fallback = Some(per_rank);
        }
        self.v_fallback
            .clone()
            .ok_or_else(|| CudaError::Internal("fallback entry vanished".into()))
    }

    /// Lowers an AllToAllv, sizes buffers and streams for it, and caches the result (see
    /// [`CudaGroup::prepare`]). The layout is checked first: every pair's two ends must
    /// agree on the count, and no output blocks may overlap.
    pub fn prepare_v(&mut self, call: &VCall) -> Result<(), CudaError> {
        if self.vcache.contains_key(call) {
            return Ok(());
        }
        call.layout.check(self.nranks as usize)?;
        let entries = self.entry_for_v(call)?;
        let access = Access {
            rank_dev: &self.rank_dev,
            direct: &self.direct,
        };
        let lowered = lower::lower_v(&entries, &call.layout, call.dtype.size(), &access)?;
        tracing::debug!(
            entry = entries.first().map_or(0, |e| e.index),
            queues = lowered.queues.len(),
            commands = lowered.cmds.len(),
            "cuda: lowered alltoallv"
        );
        let prepared = self.install(lowered, call.dtype, ReduceOp::Sum)?;
        self.vcache.insert(call.clone(), prepared);
        Ok(())
    }

    /// Sizes buffers (growing one drops every cached call: their pointers change) and
    /// streams for `lowered`, and creates its staging areas and events.
    fn install(
        &mut self,
        lowered: Lowered,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Prepared, CudaError> {
        // buffers
        let mut grow = false;
        for r in 0..self.nranks as usize {
            let b = &self.bufs[r];
            let need = [
                (&b.send, lowered.send_bytes),
                (&b.recv, lowered.recv_bytes),
                (&b.scratch, lowered.scratch_bytes[r]),
                (&b.temp, lowered.temp_bytes),
            ];
            grow |= need
                .iter()
                .any(|(have, want)| *want > 0 && have.as_ref().is_none_or(|h| h.bytes < *want));
        }
        if grow {
            self.synchronize_all()?;
            self.cache.clear();
            self.vcache.clear();
            for r in 0..self.nranks as usize {
                let ctx = self.devs[self.rank_dev[r]].ctx.clone();
                let b = &mut self.bufs[r];
                let fit = |slot: &mut Option<DeviceBuf>, want: usize| -> Result<(), CudaError> {
                    if want > 0 && slot.as_ref().is_none_or(|h| h.bytes < want) {
                        *slot = None;
                        *slot = Some(DeviceBuf::new(&ctx, want)?);
                    }
                    Ok(())
                };
                fit(&mut b.send, lowered.send_bytes)?;
                fit(&mut b.recv, lowered.recv_bytes)?;
                fit(&mut b.scratch, lowered.scratch_bytes[r])?;
                fit(&mut b.temp, lowered.temp_bytes)?;
            }
        }
        // streams
        for q in &lowered.queues {
            let r = q.rank as usize;
            while self.rank_streams[r].len() <= q.stream as usize {
                let ctx = &self.devs[self.rank_dev[r]].ctx;
                let s = drv(
                    || format!("creating a stream for rank {r}"),
                    ctx.new_stream(),
                )?;
                self.rank_streams[r].push(s);
            }
        }
        let mut staging = Vec::with_capacity(lowered.staging.len());
        for &(owner, bytes) in &lowered.staging {
            let ctx = &self.devs[self.rank_dev[owner as usize]].ctx;
            staging.push(DeviceBuf::new(ctx, bytes)?);
        }
        let mut events = Vec::with_capacity(lowered.events as usize);
        let event_queue = event_queues(&lowered);
        for &q in &event_queue {
            let ctx = self.queue_ctx(&lowered, q);
            events.push(drv(|| "creating an event".into(), ctx.new_event(None))?);
        }
        let origin = &self.devs[self.rank_dev[0]];
        let fork = drv(|| "creating an event".into(), origin.ctx.new_event(None))?;
        let mut joins = Vec::with_capacity(lowered.queues.len());
        for q in 0..lowered.queues.len() as u32 {
            let ctx = self.queue_ctx(&lowered, q);
            joins.push(drv(|| "creating an event".into(), ctx.new_event(None))?);
        }
        Ok(Prepared {
            lowered,
            staging,
            events,
            fork,
            joins,
            graph: None,
            dtype,
            op,
        })
    }

    fn prepared(&self, w: Which<'_>) -> Option<&Prepared> {
        match w {
            Which::Plain(c) => self.cache.get(c),
            Which::V(v) => self.vcache.get(v),
        }
    }

    fn prepare_which(&mut self, w: Which<'_>) -> Result<(), CudaError> {
        match w {
            Which::Plain(c) => self.prepare(c),
            Which::V(v) => self.prepare_v(v),
        }
    }

    fn queue_ctx(&self, lowered: &Lowered, q: u32) -> Arc<CudaContext> {
        let r = lowered.queues[q as usize].rank as usize;
        self.devs[self.rank_dev[r]].ctx.clone()
    }

    fn stream_of(&self, lowered: &Lowered, q: u32) -> &Arc<CudaStream> {
        let qq = lowered.queues[q as usize];
        &self.rank_streams[qq.rank as usize][qq.stream as usize]
    }

    /// Device pointer and device index of a span, checked against its allocation.
    fn resolve(&self, prep: &Prepared, s: &Span) -> Result<(sys::CUdeviceptr, usize), CudaError> {
        let (buf, dev) = match s.mem {
            Mem::Send(r) => (
                self.bufs[r as usize].send.as_ref(),
                self.rank_dev[r as usize],
            ),
            Mem::Recv(r) => (
                self.bufs[r as usize].recv.as_ref(),
                self.rank_dev[r as usize],
            ),
            Mem::Scratch(r) => (
                self.bufs[r as usize].scratch.as_ref(),
                self.rank_dev[r as usize],
            ),
            Mem::Temp(r) => (
                self.bufs[r as usize].temp.as_ref(),
                self.rank_dev[r as usize],
            ),
            Mem::Staging(i) => (
                prep.staging.get(i as usize),
                prep.lowered
                    .staging
                    .get(i as usize)
                    .map_or(0, |&(o, _)| self.rank_dev[o as usize]),
            ),
        };
        let buf =
            buf.ok_or_else(|| CudaError::Internal(format!("{:?} is not allocated", s.mem)))?;
        if s.off.checked_add(s.len).is_none_or(|end| end > buf.bytes) {
            return Err(CudaError::Internal(format!(
                "{:?} bytes {}..+{} outside its {}-byte buffer",
                s.mem, s.off, s.len, buf.bytes
            )));
        }
        Ok((buf.ptr + s.off as u64, dev))
    }

    /// Issues the commands of a prepared call: fork from the origin stream, every command,
    /// join back.
    fn issue(&self, prep: &Prepared) -> Result<(), CudaError> {
        let low = &prep.lowered;
        let origin = &self.devs[self.rank_dev[0]].main;
        let d = |what: &'static str| move || what.to_string();
        drv(d("recording the fork event"), prep.fork.record(origin))?;
        for q in 0..low.queues.len() as u32 {
            drv(
                d("waiting on the fork event"),
                self.stream_of(low, q).wait(&prep.fork),
            )?;
        }
        let es = prep.dtype.size();
        for cmd in &low.cmds {
            let q = cmd.queue();
            let stream = self.stream_of(low, q);
            match *cmd {
                Cmd::Wait { event, .. } => {
                    let ev = prep
                        .events
                        .get(event as usize)
                        .ok_or_else(|| CudaError::Internal("event out of range".into()))?;
                    drv(d("waiting on an event"), stream.wait(ev))?;
                }
                Cmd::Record { event, .. } => {
                    let ev = prep
                        .events
                        .get(event as usize)
                        .ok_or_else(|| CudaError::Internal("event out of range".into()))?;
                    drv(d("recording an event"), ev.record(stream))?;
                }
                Cmd::Copy { dst, src, .. } => {
                    if dst.len != src.len || (dst.mem == src.mem && dst.overlaps_pub(&src)) {
                        return Err(CudaError::Internal(format!("bad copy {dst:?} <- {src:?}")));
                    }
                    let (dp, dd) = self.resolve(prep, &dst)?;
                    let (sp, sd) = self.resolve(prep, &src)?;
                    drv(d("binding the context"), stream.context().bind_to_thread())?;
                    if dd == sd {
                        // SAFETY: both ranges were checked inside live allocations of this
                        // group and do not overlap; ordering is the lowering's.
                        drv(d("cuMemcpyDtoDAsync"), unsafe {
                            result::memcpy_dtod_async(dp, sp, dst.len, stream.cu_stream())
                        })?;
                    } else {
                        // SAFETY: as above, across two contexts.
                        drv(d("cuMemcpyPeerAsync"), unsafe {
                            result::memcpy_peer_async(
                                self.devs[dd].ctx.cu_ctx(),
                                dp,
                                self.devs[sd].ctx.cu_ctx(),
                                sp,
                                dst.len,
                                stream.cu_stream(),
                            )
                        })?;
                    }
                }
                Cmd::Reduce { dst, a, b, .. } => {
                    for x in [&a, &b] {
                        if x.len != dst.len || (*x != dst && x.overlaps_pub(&dst)) {
                            return Err(CudaError::Internal(format!("bad reduce {dst:?}")));
                        }
                    }
                    let (dp, _) = self.resolve(prep, &dst)?;
                    let (ap, _) = self.resolve(prep, &a)?;
                    let (bp, _) = self.resolve(prep, &b)?;
                    let dev = &self.devs[self.rank_dev[low.queues[q as usize].rank as usize]];
                    let ks = dev.kernels()?;
                    let name = kernels::reduce_name(prep.dtype, prep.op);
                    let f = ks
                        .funcs
                        .get(&name)
                        .ok_or_else(|| CudaError::Internal(format!("kernel {name} missing")))?;
                    let n = (dst.len / es) as u64;
                    let cfg = LaunchConfig {
                        grid_dim: (kernels::blocks_for(n as usize, es, dev.sms), 1, 1),
                        block_dim: (THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    let mut lb = stream.launch_builder(f);
                    lb.arg(&dp).arg(&ap).arg(&bp).arg(&n);
                    // SAFETY: the kernel takes (T*, const T*, const T*, u64) and touches
                    // `n` elements of each pointer, all checked inside live allocations; the
                    // output equals an input or overlaps neither (checked above).
                    drv(d("launching a reduce kernel"), unsafe { lb.launch(cfg) })?;
                }
                Cmd::Divide { span, .. } => {
                    let (xp, _) = self.resolve(prep, &span)?;
                    let dev = &self.devs[self.rank_dev[low.queues[q as usize].rank as usize]];
                    let ks = dev.kernels()?;
                    let name = kernels::divide_name(prep.dtype);
                    let f = ks
                        .funcs
                        .get(&name)
                        .ok_or_else(|| CudaError::Internal(format!("kernel {name} missing")))?;
                    let n = (span.len / es) as u64;
                    let cfg = LaunchConfig {
                        grid_dim: (kernels::blocks_for(n as usize, es, dev.sms), 1, 1),
                        block_dim: (THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    let nranks = self.nranks;
                    let mut lb = stream.launch_builder(f);
                    lb.arg(&xp).arg(&n).arg(&nranks);
                    // SAFETY: (T*, u64, u32) over `n` checked elements.
                    drv(d("launching the avg kernel"), unsafe { lb.launch(cfg) })?;
                }
            }
        }
        for q in 0..low.queues.len() as u32 {
            let j = &prep.joins[q as usize];
            drv(
                d("recording a join event"),
                j.record(self.stream_of(low, q)),
            )?;
            drv(d("joining a stream"), origin.wait(j))?;
        }
        Ok(())
    }

    /// Enqueues `call` on the origin stream (device of rank 0) without waiting for it. With
    /// `graph`, the replay is captured into a CUDA Graph the first time and relaunched after
    /// (all ranks must share one device).
    pub fn launch(&mut self, call: &Call, graph: bool) -> Result<(), CudaError> {
        self.launch_which(Which::Plain(call), graph)
    }

    /// Enqueues an AllToAllv (see [`CudaGroup::launch`]).
    pub fn launch_v(&mut self, call: &VCall, graph: bool) -> Result<(), CudaError> {
        self.launch_which(Which::V(call), graph)
    }

    fn launch_which(&mut self, call: Which<'_>, graph: bool) -> Result<(), CudaError> {
        self.prepare_which(call)?;
        if graph && self.devs.len() > 1 {
            return Err(CudaError::Invalid(
                "CUDA graphs are supported when all ranks share one device".into(),
            ));
        }
        let prep = self
            .prepared(call)
            .ok_or_else(|| CudaError::Internal("prepared call vanished".into()))?;
        if !graph {
            return self.issue(prep);
        }
        if let Some(g) = &prep.graph {
            return drv(|| "launching the graph".into(), g.launch());
        }
        let origin = self.devs[self.rank_dev[0]].main.clone();
        drv(
            || "beginning the capture".into(),
            origin.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        let issued = self.issue(prep);
        let ended = origin.end_capture(CUgraphInstantiate_flags(0));
        issued?;
        let g = drv(|| "ending the capture".into(), ended)?
            .ok_or_else(|| CudaError::Internal("the capture produced no graph".into()))?;
        drv(|| "uploading the graph".into(), g.upload())?;
        drv(|| "launching the graph".into(), g.launch())?;
        let slot = match call {
            Which::Plain(c) => self.cache.get_mut(c),
            Which::V(v) => self.vcache.get_mut(v),
        };
        if let Some(p) = slot {
            p.graph = Some(g);
        }
        Ok(())
    }

    /// Waits for everything launched so far.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        for d in &self.devs {
            drv(
                || "synchronizing the main stream".into(),
                d.main.synchronize(),
            )?;
        }
        self.synchronize_all()
    }

    /// Runs `call` to completion (see [`CudaGroup::launch`]).
    pub fn run(&mut self, call: &Call, graph: bool) -> Result<(), CudaError> {
        self.launch(call, graph)?;
        self.synchronize()
    }

    /// Runs an AllToAllv to completion (see [`CudaGroup::launch_v`]).
    pub fn run_v(&mut self, call: &VCall, graph: bool) -> Result<(), CudaError> {
        self.launch_v(call, graph)?;
        self.synchronize()
    }

    /// Copies `data` into `rank`'s input of an AllToAllv ([`BlockLayout::send_len`] elements).
    pub fn write_input_v<T: Element>(
        &mut self,
        call: &VCall,
        rank: u32,
        data: &[T],
    ) -> Result<(), CudaError> {
        self.check_rank_type::<T>(call.dtype, rank)?;
        self.prepare_v(call)?;
        let len = call.layout.send_len(rank as usize);
        if data.len() != len {
            return Err(CudaError::Invalid(format!(
                "rank {rank}: alltoallv input has {} elements, its blocks need {len}",
                data.len()
            )));
        }
        let span = Span {
            mem: Mem::Send(rank),
            off: 0,
            len: len * call.dtype.size(),
        };
        self.copy_in(rank, &span, data)
    }

    /// Reads `rank`'s output of the last AllToAllv of `call` ([`BlockLayout::recv_len`]
    /// elements; what lies between its blocks is unspecified).
    pub fn read_output_v<T: Element>(
        &mut self,
        call: &VCall,
        rank: u32,
    ) -> Result<Vec<T>, CudaError> {
        self.check_rank_type::<T>(call.dtype, rank)?;
        self.prepare_v(call)?;
        let len = call.layout.recv_len(rank as usize);
        let span = Span {
            mem: Mem::Recv(rank),
            off: 0,
            len: len * call.dtype.size(),
        };
        self.copy_out(rank, &span, len)
    }

    /// Mean time per AllToAllv in microseconds (see [`CudaGroup::time_call`]).
    pub fn time_call_v(&mut self, call: &VCall, graph: bool, iters: u32) -> Result<f64, CudaError> {
        self.time_which(Which::V(call), graph, iters)
    }

    /// The lowered form of an AllToAllv, for tools and tests.
    pub fn lowered_v(&mut self, call: &VCall) -> Result<&Lowered, CudaError> {
        self.prepare_v(call)?;
        self.vcache
            .get(call)
            .map(|p| &p.lowered)
            .ok_or_else(|| CudaError::Internal("prepared call vanished".into()))
    }

    fn copy_in<T: Element>(&self, rank: u32, span: &Span, data: &[T]) -> Result<(), CudaError> {
        if span.len == 0 {
            return Ok(());
        }
        let ptr = self.plain_ptr(span)?;
        self.synchronize()?;
        let ctx = &self.devs[self.rank_dev[rank as usize]].ctx;
        drv(|| "binding the context".into(), ctx.bind_to_thread())?;
        // SAFETY: `ptr` is valid for `span.len` bytes (checked), which the caller sized to
        // `data`, and `T` is a plain number type (sealed `Element`), so its bytes can be
        // copied as they are.
        drv(|| "copying input to the device".into(), unsafe {
            result::memcpy_htod_sync(ptr, data)
        })
    }

    fn copy_out<T: Element>(
        &self,
        rank: u32,
        span: &Span,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); len];
        if span.len == 0 {
            return Ok(out);
        }
        let ptr = self.plain_ptr(span)?;
        self.synchronize()?;
        let ctx = &self.devs[self.rank_dev[rank as usize]].ctx;
        drv(|| "binding the context".into(), ctx.bind_to_thread())?;
        // SAFETY: as in `copy_in`, in the other direction.
        drv(|| "copying output from the device".into(), unsafe {
            result::memcpy_dtoh_sync(&mut out, ptr)
        })?;
        Ok(out)
    }

    /// Copies `data` into `rank`'s input of `call` (sized for it first).
    pub fn write_input<T: Element>(
        &mut self,
        call: &Call,
        rank: u32,
        data: &[T],
    ) -> Result<(), CudaError> {
        self.check_type::<T>(call, rank)?;
        self.prepare(call)?;
        let (in_recv, off, len, _, _) = call.layout(rank, self.nranks);
        if data.len() != len {
            return Err(CudaError::Invalid(format!(
                "rank {rank}: input has {} elements, the call needs {len}",
                data.len()
            )));
        }
        let es = call.dtype.size();
        let span = Span {
            mem: if in_recv {
                Mem::Recv(rank)
            } else {
                Mem::Send(rank)
            },
            off: off * es,
            len: len * es,
        };
        self.copy_in(rank, &span, data)
    }

    /// Reads `rank`'s output of the last `call`.
    pub fn read_output<T: Element>(&mut self, call: &Call, rank: u32) -> Result<Vec<T>, CudaError> {
        self.check_type::<T>(call, rank)?;
        self.prepare(call)?;
        let (_, _, _, off, len) = call.layout(rank, self.nranks);
        let es = call.dtype.size();
        let span = Span {
            mem: Mem::Recv(rank),
            off: off * es,
            len: len * es,
        };
        self.copy_out(rank, &span, len)
    }

    /// Sets every byte of every rank's input of `call` to `byte` on the device (fast fill
    /// for benchmarks).
    pub fn fill_inputs(&mut self, call: &Call, byte: u8) -> Result<(), CudaError> {
        self.prepare(call)?;
        self.synchronize()?;
        let es = call.dtype.size();
        for rank in 0..self.nranks {
            let (in_recv, off, len, _, _) = call.layout(rank, self.nranks);
            let span = Span {
                mem: if in_recv {
                    Mem::Recv(rank)
                } else {
                    Mem::Send(rank)
                },
                off: off * es,
                len: len * es,
            };
            let ptr = self.plain_ptr(&span)?;
            let ctx = &self.devs[self.rank_dev[rank as usize]].ctx;
            drv(|| "binding the context".into(), ctx.bind_to_thread())?;
            // SAFETY: `ptr` is valid for `span.len` bytes (checked).
            drv(|| "filling input".into(), unsafe {
                sys::cuMemsetD8_v2(ptr, byte, span.len).result()
            })?;
        }
        self.synchronize_all()
    }

    /// Mean time per call in microseconds over `iters` back-to-back launches, measured
    /// with CUDA events on the origin stream after one warm-up launch.
    pub fn time_call(&mut self, call: &Call, graph: bool, iters: u32) -> Result<f64, CudaError> {
        self.time_which(Which::Plain(call), graph, iters)
    }

    fn time_which(&mut self, call: Which<'_>, graph: bool, iters: u32) -> Result<f64, CudaError> {
        self.launch_which(call, graph)?;
        self.synchronize()?;
        let origin = self.devs[self.rank_dev[0]].main.clone();
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let ctx = self.devs[self.rank_dev[0]].ctx.clone();
        let start = drv(|| "creating a timing event".into(), ctx.new_event(flags))?;
        let end = drv(|| "creating a timing event".into(), ctx.new_event(flags))?;
        drv(|| "recording".into(), start.record(&origin))?;
        for _ in 0..iters.max(1) {
            self.launch_which(call, graph)?;
        }
        drv(|| "recording".into(), end.record(&origin))?;
        drv(|| "waiting for the timed calls".into(), end.synchronize())?;
        let ms = drv(|| "reading the timer".into(), start.elapsed_ms(&end))?;
        Ok(f64::from(ms) * 1e3 / f64::from(iters.max(1)))
    }

    /// The lowered form of `call` (commands, queues, staging), for tools and tests.
    pub fn lowered(&mut self, call: &Call) -> Result<&Lowered, CudaError> {
        self.prepare(call)?;
        self.cache
            .get(call)
            .map(|p| &p.lowered)
            .ok_or_else(|| CudaError::Internal("prepared call vanished".into()))
    }

    fn check_type<T: Element>(&self, call: &Call, rank: u32) -> Result<(), CudaError> {
        self.check_rank_type::<T>(call.dtype, rank)
    }

    fn check_rank_type<T: Element>(&self, dtype: DataType, rank: u32) -> Result<(), CudaError> {
        if T::DTYPE != dtype {
            return Err(CudaError::Invalid(format!(
                "element type {} does not match the call's {}",
                T::DTYPE,
                dtype
            )));
        }
        if rank >= self.nranks {
            return Err(CudaError::Invalid(format!(
                "rank {rank} is not in this {}-rank group",
                self.nranks
            )));
        }
        Ok(())
    }

    fn plain_ptr(&self, span: &Span) -> Result<sys::CUdeviceptr, CudaError> {
        let buf = match span.mem {
            Mem::Send(r) => self.bufs[r as usize].send.as_ref(),
            Mem::Recv(r) => self.bufs[r as usize].recv.as_ref(),
            _ => None,
        }
        .ok_or_else(|| CudaError::Internal(format!("{:?} is not allocated", span.mem)))?;
        if span.off + span.len > buf.bytes {
            return Err(CudaError::Internal(format!(
                "{:?} {}..+{} outside the buffer",
                span.mem, span.off, span.len
            )));
        }
        Ok(buf.ptr + span.off as u64)
    }
}

impl Drop for CudaGroup {
    fn drop(&mut self) {
        // Work in flight may still use the buffers freed below.
        let _ = self.synchronize();
        self.cache.clear();
    }
}

/// The queue each event is recorded on (events belong to that queue's context).
fn event_queues(low: &Lowered) -> Vec<u32> {
    let mut v = vec![0; low.events as usize];
    for c in &low.cmds {
        if let Cmd::Record { queue, event } = *c
            && let Some(slot) = v.get_mut(event as usize)
        {
            *slot = queue;
        }
    }
    v
}
