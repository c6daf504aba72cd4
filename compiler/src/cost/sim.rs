//! Discrete-event simulation of a schedule on a [`Network`].
//!
//! Semantics follow `hccl_ir::schedule`: the steps of a stream run in order, a step also waits
//! for its dependencies, and the `(from, to, channel)` connections are FIFOs where the k-th
//! send pairs with the k-th receive and at most [`CONNECTION_SLOTS`] messages may be sent but
//! not yet received.
//!
//! Timing of one message of `b` payload bytes under protocol `p`:
//! 1. it *starts* when its send step (or the send half of a relaying receive) is ready and a
//!    slot is free;
//! 2. it *streams* over its route as a fluid flow: every resource (link, NIC direction) gives
//!    its flows a max-min fair share of `capacity × efficiency(p)`, recomputed whenever a flow
//!    starts or ends (only over the flows that share resources with it, transitively);
//! 3. when the last byte has left, the send step is done; the message *arrives*
//!    `message_us(class, p) + route latency` later, and the matching receive may consume it.
//!
//! Local work costs memory bandwidth of the rank: a copy `copy_passes × b / mem_bw`, a reduce
//! `reduce_passes × b / mem_bw`, a reduction fused into a receive `fused_reduce_passes × b /
//! mem_bw`, overlapped with the transfer (it may start once the data starts streaming and the
//! step is ready); a relaying receive starts its outgoing message as soon as it consumes the
//! incoming one, and neither the step nor that message ends before the local work does.
//! Receiving without reducing costs nothing beyond the transfer. The
//! collective's time is `base_us(p)` plus the time the last step completes.

use super::CostError;
use super::model::{CostModel, LinkClass};
use super::network::{Network, Route};
use hccl_ir::{CONNECTION_SLOTS, Collective, Op, Protocol, Schedule, StepRef};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

pub(super) const NONE: u32 = u32::MAX;

/// Largest set of interacting flows whose rates are recomputed exactly at every change.
pub const EXACT_COMPONENT: usize = 256;

/// What a simulation predicts.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Predicted time of the whole collective (µs), base latency included.
    pub time_us: f64,
    /// The protocol's once-per-collective latency included in `time_us`.
    pub base_us: f64,
    /// Number of messages transferred.
    pub messages: usize,
    /// Payload bytes moved over all messages.
    pub payload_bytes: f64,
    /// Payload bytes that crossed each resource, indexed by resource id (see [`Network`]).
    pub resource_bytes: Vec<f64>,
}

/// When each step of a simulated schedule ran: what `hcclc explain --trace` draws.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub estimate: Estimate,
    /// Per step: where it is in the schedule, and when it started and ended (µs from the
    /// start of the run, the protocol's base latency not included). A step starts when its
    /// dependencies are done (a receive then waits for its message, a send for a free
    /// slot); on a CPU host model, when a core starts it.
    pub steps: Vec<StepSpan>,
    /// The run covers one of this many segments (the CPU model runs a call whose chunks do
    /// not fit a slot as sequential segments, and simulates one); 1 otherwise.
    pub segments: u64,
    /// How fast every resource that carried data moved it, over time (resource order); empty
    /// on a CPU host model, whose times do not come from link capacities.
    pub resources: Vec<ResourceUse>,
}

/// The rate at which one resource (a link or a NIC direction) moved data during a traced
/// run: the sum of its flows' rates, a step function.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceUse {
    /// Resource id (see [`Network`]).
    pub resource: u32,
    /// `(time µs, GB/s)`: the rate from that time until the next point (the base latency not
    /// included, as in [`StepSpan`]); the first point is at the resource's first flow, the
    /// last one is 0 when its last flow ends.
    pub rates: Vec<(f64, f64)>,
}

impl ResourceUse {
    /// The highest rate reached (GB/s).
    pub fn peak_gbps(&self) -> f64 {
        self.rates.iter().map(|p| p.1).fold(0.0, f64::max)
    }
}

/// One step's place and time in a [`Timeline`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSpan {
    pub at: StepRef,
    pub start_us: f64,
    pub end_us: f64,
}

/// Per step: (start, end), recorded when a run is traced.
pub(super) type Spans = Option<Vec<(f64, f64)>>;

impl Estimate {
    /// Busy fraction of resource `r` over the collective: bytes / (capacity × time).
    pub fn utilisation(&self, network: &Network, r: u32) -> f64 {
        let cap = network.capacity.get(r as usize).copied().unwrap_or(0.0);
        let bytes = self.resource_bytes.get(r as usize).copied().unwrap_or(0.0);
        if cap.is_finite() && cap > 0.0 && self.time_us > 0.0 {
            bytes / (cap * 1e3 * self.time_us)
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Nop,
    /// Local copy or reduce: memory passes over `count` chunks.
    Local {
        passes: f64,
    },
    Send {
        msg: u32,
    },
    /// A receive of `msg`, with `passes` of fused local work, optionally forwarding as `out`.
    /// `cpu_local`: the passes over local memory a CPU rank makes for it besides reading the
    /// message (the local operand, the destination), see [`super::cpu`].
    Recv {
        msg: u32,
        passes: f64,
        out: u32,
        cpu_local: f64,
    },
}

#[derive(Debug, Clone)]
pub(super) struct FlatStep {
    pub(super) rank: u32,
    pub(super) count: u32,
    pub(super) kind: Kind,
}

/// A schedule flattened for repeated simulation (at several sizes and protocols).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(super) steps: Vec<FlatStep>,
    pub(super) step_ref: Vec<StepRef>,
    /// Dependents of each step (CSR).
    pub(super) succ_start: Vec<u32>,
    pub(super) succ: Vec<u32>,
    /// Unmet predecessors of each step at the start.
    pub(super) pending: Vec<u32>,
    /// Per message: connection, chunk count, send step, receive step (or NONE).
    pub(super) msg_conn: Vec<u32>,
    pub(super) msg_count: Vec<u32>,
    pub(super) msg_send: Vec<u32>,
    pub(super) msg_recv: Vec<u32>,
    /// Per connection: first message id, number of messages, route.
    pub(super) conn_base: Vec<u32>,
    pub(super) conn_len: Vec<u32>,
    pub(super) conn_route: Vec<Arc<Route>>,
    pub(super) chunks: u32,
    /// The collective, the largest message (in chunks) and the most scratch chunks of any
    /// rank: how the executor segments a call.
    pub(super) collective: Collective,
    pub(super) max_count: u32,
    pub(super) max_scratch: u32,
}

impl Prepared {
    /// Number of steps.
    pub fn step_count(&self) -> usize {
        self.steps.len()
    }

    /// Whether some message of the schedule travels a route whose slowest link is of `class`.
    pub fn uses_class(&self, class: LinkClass) -> bool {
        self.conn_route
            .iter()
            .zip(&self.conn_len)
            .any(|(r, &len)| len > 0 && r.class == class)
    }
}

/// A flattened schedule whose routes are not looked up yet ([`Simulator::unrouted`]).
#[derive(Debug, Clone)]
pub struct Unrouted {
    /// Everything but `conn_route`.
    prepared: Prepared,
    /// The ranks of every connection, in connection order.
    pairs: Vec<(u32, u32)>,
}

impl Unrouted {
    /// Looks up the routes: the [`Prepared`] schedule.
    pub fn route(mut self, sim: &Simulator) -> Result<Prepared, CostError> {
        self.prepared.conn_route = sim.network.routes(&self.pairs)?;
        Ok(self.prepared)
    }

    /// A lower bound on [`Simulator::run`]'s time (µs) for `bytes` under `protocol`, from the
    /// schedule's critical path alone, without routes (see [`super::reach`]); infinite for
    /// a schedule the simulator would find deadlocked, 0 on a CPU host model.
    pub fn bound_us(&self, sim: &Simulator, bytes: u64, protocol: Protocol) -> f64 {
        super::reach::critical_path_us(sim, &self.prepared, &self.pairs, bytes, protocol)
    }
}

/// Simulates schedules on one topology; reuses routes between runs.
#[derive(Debug)]
pub struct Simulator {
    /// The resource network.
    pub network: Network,
    /// The cost constants.
    pub model: CostModel,
    /// Contention constraints of symmetric templates, shared by the candidates of a family
    /// ([`Simulator::prepare_symmetric`]).
    pub(super) symmetric_cache: super::symmetric::ContentionCache,
    /// What [`Unrouted::bound_us`] knows of the ranks, computed on first use.
    reach: std::sync::OnceLock<super::reach::RankReach>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum EventKind {
    /// A local step (or a receive's fused work) finished.
    StepDone(u32),
    /// A flow may have finished (valid if the version matches).
    FlowDone(u32, u32),
    /// A message arrived at the receiver.
    Arrive(u32),
}

/// A timed event; ordered so that a `BinaryHeap` pops the earliest first, ties in push order
/// (`seq`). Shared by the flow simulator and the CPU one ([`super::cpu`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Event<K> {
    pub(super) time: f64,
    pub(super) seq: u64,
    pub(super) kind: K,
}

impl<K> PartialEq for Event<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K> Eq for Event<K> {}
impl<K> PartialOrd for Event<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Event<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

/// `x`'s position in the IEEE total order ([`f64::total_cmp`]) as an unsigned integer.
#[inline]
pub(super) fn total_order_key(x: f64) -> u64 {
    let mut b = x.to_bits() as i64;
    b ^= (((b >> 63) as u64) >> 1) as i64;
    (b as u64) ^ (1 << 63)
}

/// A candidate of progressive filling: resource `res` with fair share `rem / cnt` (as a
/// [`total_order_key`]) computed when its flow count was `stamp`. Filling order: smallest
/// share first, then lowest resource id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Share {
    key: u64,
    res: u32,
    stamp: u32,
}

/// The candidates of one progressive filling. Shares only rise during filling (up to
/// rounding), so each resource keeps one *representative* entry whose share is at most its
/// current one: the component's initial shares, sorted once, and a heap of shares recomputed
/// later (when a stale representative reaches the front, or when rounding lowered a share).
/// The smallest entry, once current, is exactly the resource whose share is the smallest.
#[derive(Debug, Default)]
struct Shares {
    sorted: Vec<Share>,
    cursor: usize,
    later: BinaryHeap<Reverse<Share>>,
    /// Per resource: the stamp and key of its representative entry.
    rep_stamp: Vec<u32>,
    rep_key: Vec<u64>,
    /// Per flow: the first of its single-flow resources (scratch of one filling).
    solo: Vec<Option<Share>>,
    solo_flows: Vec<u32>,
}

impl Shares {
    fn new(resources: usize, flows: usize) -> Shares {
        Shares {
            rep_stamp: vec![0; resources],
            rep_key: vec![0; resources],
            solo: vec![None; flows],
            ..Shares::default()
        }
    }

    /// Makes `share` the representative entry of its resource.
    #[inline]
    fn represent(&mut self, share: Share) {
        self.rep_stamp[share.res as usize] = share.stamp;
        self.rep_key[share.res as usize] = share.key;
    }

    /// Takes the smallest entry.
    #[inline]
    fn pop(&mut self) -> Option<Share> {
        let a = self.sorted.get(self.cursor).copied();
        match (a, self.later.peek()) {
            (Some(a), Some(&Reverse(b))) if b < a => self.later.pop().map(|Reverse(b)| b),
            (Some(a), _) => {
                self.cursor += 1;
                Some(a)
            }
            (None, _) => self.later.pop().map(|Reverse(b)| b),
        }
    }
}

impl Simulator {
    /// A simulator for `network` with `model`.
    pub fn new(network: Network, model: CostModel) -> Simulator {
        Simulator {
            network,
            model,
            symmetric_cache: Default::default(),
            reach: std::sync::OnceLock::new(),
        }
    }

    /// Per-rank capacities and link-class components (see [`super::reach`]).
    pub(super) fn reach(&self) -> &super::reach::RankReach {
        self.reach
            .get_or_init(|| super::reach::RankReach::new(&self.network))
    }

    /// Flattens `schedule`: checks peers and dependencies, pairs sends with receives and
    /// looks up routes.
    pub fn prepare(&self, schedule: &Schedule) -> Result<Prepared, CostError> {
        self.unrouted(schedule)?.route(self)
    }

    /// [`Simulator::prepare`] up to looking up routes (the dear part on thousands of ranks):
    /// enough for [`Unrouted::bound_us`].
    pub fn unrouted(&self, schedule: &Schedule) -> Result<Unrouted, CostError> {
        let n = self.network.nranks();
        if schedule.nranks != n || schedule.ranks.len() != n as usize {
            return Err(CostError::RankMismatch {
                schedule: schedule.nranks,
                topology: n,
            });
        }
        if schedule.chunks == 0 {
            return Err(CostError::NoChunks);
        }
        let m = &self.model;
        // Step ids, order and connections as the verifier numbers them.
        let dag = hccl_ir::StepDag::new(schedule).map_err(|e| match e {
            hccl_ir::DagError::TooLarge { steps } => CostError::TooLarge { steps },
            hccl_ir::DagError::BadDep { at, .. } => CostError::BadDep { at },
            hccl_ir::DagError::BadPeer { from, to, .. } => CostError::BadPeer { from, to },
        })?;
        let total = dag.step_count();
        let mut steps = Vec::with_capacity(total);
        let mut step_ref = Vec::with_capacity(total);
        for (r, prog) in schedule.ranks.iter().enumerate() {
            let r = r as u32;
            for (si, stream) in prog.streams.iter().enumerate() {
                for (ti, step) in stream.steps.iter().enumerate() {
                    let kind = step_kind(&step.op, m);
                    steps.push(FlatStep {
                        rank: r,
                        count: step.count,
                        kind,
                    });
                    step_ref.push(StepRef {
                        rank: r,
                        stream: si as u32,
                        step: ti as u32,
                    });
                }
            }
        }
        let hccl_ir::DagParts {
            succ_start,
            succ,
            preds: pending,
            connections,
            send_ends,
            recv_ends,
        } = dag.into_parts();
        let conn_keys: Vec<(u32, u32, u32)> = connections.iter().map(|c| c.key).collect();
        let (conn_sends, conn_recvs): (Vec<Vec<u32>>, Vec<Vec<u32>>) =
            connections.into_iter().map(|c| (c.sends, c.recvs)).unzip();
        let Messages {
            conn_base,
            conn_len,
            msg_conn,
            msg_count,
            msg_send,
            msg_recv,
        } = number_messages(&mut steps, &conn_sends, &conn_recvs, &send_ends, &recv_ends);
        let pairs: Vec<(u32, u32)> = conn_keys.iter().map(|&(a, b, _)| (a, b)).collect();
        // As the executor sizes segments (`hccl_executor` `program.rs`): by the largest
        // message (local steps never pass through a slot) and the largest scratch.
        let max_count = msg_count.iter().copied().max().unwrap_or(0);
        let max_scratch = schedule
            .ranks
            .iter()
            .map(|r| r.scratch_chunks)
            .max()
            .unwrap_or(0);
        Ok(Unrouted {
            pairs,
            prepared: Prepared {
                steps,
                step_ref,
                succ_start,
                succ,
                pending,
                msg_conn,
                msg_count,
                msg_send,
                msg_recv,
                conn_base,
                conn_len,
                conn_route: Vec::new(),
                chunks: schedule.chunks,
                collective: schedule.collective,
                max_count,
                max_scratch,
            },
        })
    }

    /// Simulates a prepared schedule for a collective of `bytes` under `protocol`.
    pub fn run(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        if let Some(cpu) = &self.model.cpu {
            return super::cpu::run(self, cpu, prepared, bytes, protocol, false).map(|r| r.0);
        }
        run_flows(self, prepared, bytes, protocol, &mut None, f64::INFINITY).map(|r| r.0)
    }

    /// [`Simulator::run`], given up as soon as the collective is sure to take longer than
    /// `limit_us`: `Ok(None)` then, and the estimate otherwise. What a search screening
    /// candidates against the best so far needs: a loser's run stops at the limit instead of
    /// running to its end. A CPU host model always runs to the end.
    pub fn run_within(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
        limit_us: f64,
    ) -> Result<Option<Estimate>, CostError> {
        if self.model.cpu.is_some() {
            return self.run(prepared, bytes, protocol).map(Some);
        }
        let limit = limit_us - self.model.base_us(protocol);
        if limit.is_nan() {
            return self.run(prepared, bytes, protocol).map(Some);
        }
        // The busiest link alone already past the limit: no need to run (a schedule that
        // would deadlock then reads as past the limit too).
        if limit_us.is_finite()
            && self
                .lower_bound_us(&self.resource_loads(prepared, bytes), bytes, protocol)
                .is_some_and(|lb| lb > limit_us)
        {
            return Ok(None);
        }
        match run_flows(self, prepared, bytes, protocol, &mut None, limit) {
            Ok((estimate, _)) => Ok((estimate.time_us <= limit_us).then_some(estimate)),
            Err(CostError::PastLimit { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The payload bytes each resource carries when `prepared` runs a collective of `bytes`:
    /// what a full run's [`Estimate::resource_bytes`] adds up to, without running it.
    pub fn resource_loads(&self, prepared: &Prepared, bytes: u64) -> Vec<f64> {
        let chunk_bytes = bytes as f64 / f64::from(prepared.chunks);
        let mut loads = vec![0.0; self.network.capacity.len()];
        for (&c, &count) in prepared.msg_conn.iter().zip(&prepared.msg_count) {
            let b = f64::from(count) * chunk_bytes;
            if b > 0.0 {
                for &r in &prepared.conn_route[c as usize].resources {
                    loads[r as usize] += b;
                }
            }
        }
        loads
    }

    /// [`Simulator::run`], recording when every step ran.
    pub fn timeline(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Timeline, CostError> {
        let (estimate, spans, segments, resources) = match &self.model.cpu {
            Some(cpu) => {
                let (e, spans, segments) =
                    super::cpu::run(self, cpu, prepared, bytes, protocol, true)?;
                (e, spans, segments, Vec::new())
            }
            None => {
                let mut log = Some(Vec::new());
                let (e, spans) =
                    run_flows(self, prepared, bytes, protocol, &mut log, f64::INFINITY)?;
                let uses = resource_uses(prepared, log.unwrap_or_default());
                (e, spans, 1, uses)
            }
        };
        let steps = spans
            .unwrap_or_default()
            .into_iter()
            .zip(&prepared.step_ref)
            .map(|((start_us, end_us), &at)| StepSpan {
                at,
                start_us,
                end_us,
            })
            .collect();
        Ok(Timeline {
            estimate,
            steps,
            segments,
            resources,
        })
    }

    /// A lower bound on the time of a collective of `bytes` under `protocol` whose messages
    /// put `resource_bytes` payload bytes on each resource (an [`Estimate`]'s, which no
    /// protocol changes): the busiest resource at its capacity under the protocol's
    /// efficiency, plus the protocol's base latency. `None` on a CPU host model, whose times
    /// do not come from link capacities.
    pub fn lower_bound_us(
        &self,
        resource_bytes: &[f64],
        bytes: u64,
        protocol: Protocol,
    ) -> Option<f64> {
        if self.model.cpu.is_some() {
            return None;
        }
        let eff = self.model.efficiency(protocol) * self.model.bandwidth_factor(bytes);
        let busiest = resource_bytes
            .iter()
            .zip(&self.network.capacity)
            .filter(|(_, c)| c.is_finite() && **c > 0.0)
            .map(|(b, c)| b / (c * eff * 1e3))
            .fold(0.0, f64::max);
        (busiest.is_finite() && eff > 0.0).then(|| self.model.base_us(protocol) + busiest)
    }

    /// Prepares and simulates in one go.
    pub fn simulate(
        &self,
        schedule: &Schedule,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        let prepared = self.prepare(schedule)?;
        self.run(&prepared, bytes, protocol)
    }
}

/// How the simulator costs a step's operation (message ids are filled in once connections
/// are numbered).
pub(super) fn step_kind(op: &Op, m: &CostModel) -> Kind {
    match op {
        Op::Nop => Kind::Nop,
        Op::Copy { .. } => Kind::Local {
            passes: m.copy_passes,
        },
        Op::Reduce { .. } => Kind::Local {
            passes: m.reduce_passes,
        },
        // Message ids are filled in once connections are numbered.
        Op::Send { .. } => Kind::Send { msg: NONE },
        // CPU traffic besides reading the message: writing the destination (1) and reading
        // the local operand of a reduction (1).
        Op::Recv { .. } | Op::RecvCopySend { .. } => Kind::Recv {
            msg: NONE,
            passes: 0.0,
            out: NONE,
            cpu_local: 1.0,
        },
        Op::RecvReduceSend { .. } => Kind::Recv {
            msg: NONE,
            passes: m.fused_reduce_passes,
            out: NONE,
            cpu_local: 1.0,
        },
        Op::RecvReduceCopy { .. } | Op::RecvReduceCopySend { .. } => Kind::Recv {
            msg: NONE,
            passes: m.fused_reduce_passes,
            out: NONE,
            cpu_local: 2.0,
        },
    }
}

/// Messages numbered by connection, paired with their send and receive steps.
pub(super) struct Messages {
    pub(super) conn_base: Vec<u32>,
    pub(super) conn_len: Vec<u32>,
    pub(super) msg_conn: Vec<u32>,
    pub(super) msg_count: Vec<u32>,
    pub(super) msg_send: Vec<u32>,
    pub(super) msg_recv: Vec<u32>,
}

/// One message per send, numbered by connection (`conn_sends[c]` and `conn_recvs[c]`: the
/// steps sending and receiving on connection `c`, in order; the k-th send pairs with the k-th
/// receive); fills in the message ids of `steps` from each step's `(connection, position)` of
/// its send half and receive half (`NONE` where it has none).
pub(super) fn number_messages(
    steps: &mut [FlatStep],
    conn_sends: &[Vec<u32>],
    conn_recvs: &[Vec<u32>],
    send_pos: &[(u32, u32)],
    recv_pos: &[(u32, u32)],
) -> Messages {
    let nconn = conn_sends.len();
    let mut conn_base = Vec::with_capacity(nconn);
    let mut conn_len = Vec::with_capacity(nconn);
    let mut nmsg = 0u32;
    for sends in conn_sends {
        conn_base.push(nmsg);
        conn_len.push(sends.len() as u32);
        nmsg += sends.len() as u32;
    }
    let mut msg_conn = vec![0u32; nmsg as usize];
    let mut msg_count = vec![0u32; nmsg as usize];
    let mut msg_send = vec![NONE; nmsg as usize];
    let mut msg_recv = vec![NONE; nmsg as usize];
    for (c, sends) in conn_sends.iter().enumerate() {
        for (k, &s) in sends.iter().enumerate() {
            let msg = conn_base[c] + k as u32;
            msg_conn[msg as usize] = c as u32;
            msg_count[msg as usize] = steps[s as usize].count;
            msg_send[msg as usize] = s;
        }
        for (k, &rs) in conn_recvs[c].iter().enumerate() {
            if k < sends.len() {
                msg_recv[(conn_base[c] + k as u32) as usize] = rs;
            }
        }
    }
    for id in 0..steps.len() {
        let (sc, sk) = send_pos[id];
        let (rc, rk) = recv_pos[id];
        let out = if sc == NONE {
            NONE
        } else {
            conn_base[sc as usize] + sk
        };
        let inc = if rc == NONE || rk >= conn_len[rc as usize] {
            NONE
        } else {
            conn_base[rc as usize] + rk
        };
        match &mut steps[id].kind {
            Kind::Send { msg } => *msg = out,
            Kind::Recv { msg, out: o, .. } => {
                *msg = inc;
                *o = out;
            }
            Kind::Nop | Kind::Local { .. } => {}
        }
    }
    Messages {
        conn_base,
        conn_len,
        msg_conn,
        msg_count,
        msg_send,
        msg_recv,
    }
}

/// The dependents of each of `total` steps in CSR form (`succ[succ_start[i]..succ_start[i +
/// 1]]`), from `(before, after)` edges.
pub(super) fn successors(total: usize, edges: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>) {
    let mut succ_start = vec![0u32; total + 1];
    for &(a, _) in edges {
        succ_start[a as usize + 1] += 1;
    }
    for i in 0..total {
        succ_start[i + 1] += succ_start[i];
    }
    let mut fill = succ_start.clone();
    let mut succ = vec![0u32; edges.len()];
    for &(a, b) in edges {
        succ[fill[a as usize] as usize] = b;
        fill[a as usize] += 1;
    }
    (succ_start, succ)
}

/// The step and message state of one run, shared by the flow simulator and the template
/// run ([`super::symmetric`]): which steps are ready and done, which messages started and
/// arrived, connection slots, the event queue. How flows share bandwidth is the [`Rates`]
/// the run is given.
pub(super) struct Steps<'a> {
    pub(super) sim: &'a Simulator,
    pub(super) p: &'a Prepared,
    pub(super) protocol: Protocol,
    chunk_bytes: f64,
    /// Bandwidth factor of the calibration at this size (local memory work).
    mem_scale: f64,
    pub(super) now: f64,
    /// The run stops (see [`Steps::execute`]) once the clock passes this (µs, without the
    /// protocol's base latency); infinite for a full run.
    limit: f64,
    seq: u64,
    events: BinaryHeap<Event<EventKind>>,
    pending: Vec<u32>,
    ready_at: Vec<f64>,
    /// When a relaying step's fused local work ends.
    local_until: Vec<f64>,
    recv_ready: Vec<bool>,
    done: Vec<bool>,
    completed: usize,
    worklist: Vec<u32>,
    // messages
    msg_ready: Vec<bool>,
    msg_arrived: Vec<bool>,
    data_start: Vec<f64>,
    // connections
    next_start: Vec<u32>,
    consumed: Vec<u32>,
    /// Messages started, and their payload bytes.
    pub(super) messages: usize,
    pub(super) payload: f64,
    /// Per step: (start, end), when traced.
    spans: Spans,
}

/// How a run shares bandwidth among its flows (one flow per message in transit).
pub(super) trait Rates {
    /// A flow of `bytes` (positive) starts on message `m`, whose route crosses resources.
    fn start(&mut self, st: &mut Steps<'_>, m: u32, bytes: f64);
    /// Flow `m` ended (its current `FlowDone` fired): it releases what it held.
    fn finish(&mut self, st: &mut Steps<'_>, m: u32);
    /// Whether a `FlowDone(m, version)` event is still current.
    fn current(&self, m: u32, version: u32) -> bool;
    /// Whether rates must be recomputed before time moves on.
    fn dirty(&self) -> bool;
    /// Recomputes the rates of the flows a change touched.
    fn recompute(&mut self, st: &mut Steps<'_>);
    /// With no event left: re-balances flows an approximate allocation left without
    /// capacity; whether it did (the run then goes on).
    fn revive(&mut self, st: &mut Steps<'_>) -> bool;
}

impl<'a> Steps<'a> {
    pub(super) fn new(
        sim: &'a Simulator,
        p: &'a Prepared,
        bytes: u64,
        protocol: Protocol,
        trace: bool,
    ) -> Steps<'a> {
        let nsteps = p.steps.len();
        let nmsg = p.msg_conn.len();
        let nconn = p.conn_base.len();
        Steps {
            sim,
            p,
            protocol,
            chunk_bytes: bytes as f64 / f64::from(p.chunks),
            mem_scale: sim.model.bandwidth_factor(bytes),
            now: 0.0,
            limit: f64::INFINITY,
            seq: 0,
            events: BinaryHeap::new(),
            pending: p.pending.clone(),
            ready_at: vec![0.0; nsteps],
            local_until: vec![0.0; nsteps],
            recv_ready: vec![false; nsteps],
            done: vec![false; nsteps],
            completed: 0,
            worklist: Vec::new(),
            msg_ready: vec![false; nmsg],
            msg_arrived: vec![false; nmsg],
            data_start: vec![0.0; nmsg],
            next_start: vec![0; nconn],
            consumed: vec![0; nconn],
            messages: 0,
            payload: 0.0,
            spans: trace.then(|| vec![(0.0, 0.0); nsteps]),
        }
    }

    pub(super) fn push(&mut self, time: f64, kind: EventKind) {
        self.seq += 1;
        self.events.push(Event {
            time,
            seq: self.seq,
            kind,
        });
    }

    fn mem_us(&self, step: u32, passes: f64) -> f64 {
        let s = &self.p.steps[step as usize];
        let bw = self.sim.network.mem_bw[s.rank as usize] * self.mem_scale;
        if passes <= 0.0 || bw.is_nan() || bw <= 0.0 {
            return 0.0;
        }
        passes * f64::from(s.count) * self.chunk_bytes / (bw * 1e3)
    }

    /// Runs every step under `rates`; the run ends at `self.now`. Returns the traced spans,
    /// or the first step never run when the schedule deadlocks.
    ///
    /// With a [`Steps::limit`], the run stops at the first event past it (events are taken
    /// in time order and the clock never goes back, so the full run would end later still)
    /// and returns [`CostError::PastLimit`].
    pub(super) fn execute<R: Rates>(&mut self, rates: &mut R) -> Result<Spans, CostError> {
        for id in 0..self.p.steps.len() as u32 {
            if self.pending[id as usize] == 0 {
                self.worklist.push(id);
            }
        }
        self.drain_ready(rates);
        loop {
            let next_time = self.events.peek().map(|e| e.time);
            if rates.dirty() && next_time.is_none_or(|t| t > self.now) {
                rates.recompute(self);
                continue;
            }
            let Some(ev) = self.events.pop() else {
                if rates.revive(self) {
                    continue;
                }
                break;
            };
            if let EventKind::FlowDone(m, v) = ev.kind
                && !rates.current(m, v)
            {
                continue; // superseded by a rate change
            }
            self.now = self.now.max(ev.time);
            if self.now > self.limit {
                return Err(CostError::PastLimit {
                    limit_us: self.limit,
                });
            }
            match ev.kind {
                EventKind::StepDone(s) => self.complete(s),
                EventKind::FlowDone(m, _) => {
                    rates.finish(self, m);
                    self.flow_finished(m);
                }
                EventKind::Arrive(m) => {
                    self.msg_arrived[m as usize] = true;
                    let r = self.p.msg_recv[m as usize];
                    if r != NONE && self.recv_ready[r as usize] {
                        self.consume(rates, r);
                    }
                }
            }
            self.drain_ready(rates);
        }
        if self.completed < self.p.steps.len() {
            let stuck = (0..self.p.steps.len())
                .find(|&i| !self.done[i])
                .map(|i| self.p.step_ref[i]);
            return Err(CostError::Deadlock {
                at: stuck.unwrap_or(StepRef {
                    rank: 0,
                    stream: 0,
                    step: 0,
                }),
            });
        }
        Ok(self.spans.take())
    }

    /// Processes steps whose predecessors are all done.
    fn drain_ready<R: Rates>(&mut self, rates: &mut R) {
        while let Some(s) = self.worklist.pop() {
            self.ready(rates, s);
        }
    }

    fn ready<R: Rates>(&mut self, rates: &mut R, s: u32) {
        self.ready_at[s as usize] = self.now;
        if let Some(spans) = &mut self.spans {
            spans[s as usize].0 = self.now;
        }
        match self.p.steps[s as usize].kind {
            Kind::Nop => self.complete(s),
            Kind::Local { passes } => {
                let t = self.mem_us(s, passes);
                if t > 0.0 {
                    self.push(self.now + t, EventKind::StepDone(s));
                } else {
                    self.complete(s);
                }
            }
            Kind::Send { msg } => self.send_ready(rates, msg),
            Kind::Recv { msg, .. } => {
                self.recv_ready[s as usize] = true;
                if msg != NONE && self.msg_arrived[msg as usize] {
                    self.consume(rates, s);
                }
            }
        }
    }

    fn complete(&mut self, s: u32) {
        if self.done[s as usize] {
            return;
        }
        self.done[s as usize] = true;
        self.completed += 1;
        if let Some(spans) = &mut self.spans {
            spans[s as usize].1 = self.now;
        }
        let (a, b) = (
            self.p.succ_start[s as usize] as usize,
            self.p.succ_start[s as usize + 1] as usize,
        );
        for i in a..b {
            let t = self.p.succ[i];
            self.pending[t as usize] -= 1;
            if self.pending[t as usize] == 0 {
                self.worklist.push(t);
            }
        }
    }

    fn send_ready<R: Rates>(&mut self, rates: &mut R, msg: u32) {
        if msg == NONE {
            return;
        }
        self.msg_ready[msg as usize] = true;
        self.try_start(rates, self.p.msg_conn[msg as usize]);
    }

    fn try_start<R: Rates>(&mut self, rates: &mut R, c: u32) {
        let ci = c as usize;
        while self.next_start[ci] < self.p.conn_len[ci]
            && (self.next_start[ci] as usize) < self.consumed[ci] as usize + CONNECTION_SLOTS
        {
            let msg = self.p.conn_base[ci] + self.next_start[ci];
            if !self.msg_ready[msg as usize] {
                break;
            }
            self.next_start[ci] += 1;
            self.start_flow(rates, msg);
        }
    }

    fn start_flow<R: Rates>(&mut self, rates: &mut R, m: u32) {
        let mi = m as usize;
        self.data_start[mi] = self.now;
        let bytes = f64::from(self.p.msg_count[mi]) * self.chunk_bytes;
        self.messages += 1;
        self.payload += bytes;
        let route = &self.p.conn_route[self.p.msg_conn[mi] as usize];
        if bytes <= 0.0 || route.resources.is_empty() {
            self.flow_finished(m);
            return;
        }
        rates.start(self, m, bytes);
    }

    /// The last byte left: the sender's step is done; the message arrives after the latency.
    fn flow_finished(&mut self, m: u32) {
        let mi = m as usize;
        let s = self.p.msg_send[mi];
        let end = self.local_until[s as usize];
        let route = &self.p.conn_route[self.p.msg_conn[mi] as usize];
        let latency = self.sim.model.message_us(route.class, self.protocol) + route.latency_us;
        if end > self.now {
            self.push(end, EventKind::StepDone(s));
            self.push(end + latency, EventKind::Arrive(m));
        } else {
            self.complete(s);
            self.push(self.now + latency, EventKind::Arrive(m));
        }
    }

    /// Receive step `s` takes its (arrived) message.
    fn consume<R: Rates>(&mut self, rates: &mut R, s: u32) {
        let Kind::Recv {
            msg, passes, out, ..
        } = self.p.steps[s as usize].kind
        else {
            return;
        };
        self.recv_ready[s as usize] = false;
        let c = self.p.msg_conn[msg as usize];
        self.consumed[c as usize] += 1;
        self.try_start(rates, c);
        let work = self.mem_us(s, passes);
        let start = self.data_start[msg as usize].max(self.ready_at[s as usize]);
        let finish = self.now.max(start + work);
        if out != NONE {
            // Relays stream the result on as it is produced: the outgoing message starts
            // now; the step (and the message's arrival) cannot end before the local work.
            self.local_until[s as usize] = finish;
            self.send_ready(rates, out);
        } else if finish > self.now {
            self.push(finish, EventKind::StepDone(s));
        } else {
            self.complete(s);
        }
    }
}

/// A traced run's rate changes: `(time µs, message, new rate in bytes/µs)`, in time order.
type RateLog = Option<Vec<(f64, u32, f64)>>;

/// Runs a prepared schedule with max-min fair flows ([`FlowRates`]). With a `log`, the run
/// is traced: step spans are returned and every flow's rate changes are appended to it.
fn run_flows(
    sim: &Simulator,
    p: &Prepared,
    bytes: u64,
    protocol: Protocol,
    log: &mut RateLog,
    limit: f64,
) -> Result<(Estimate, Spans), CostError> {
    let mut st = Steps::new(sim, p, bytes, protocol, log.is_some());
    st.limit = limit;
    let mut rates = FlowRates::new(sim, p, bytes, protocol);
    rates.log = log.take();
    let result = st.execute(&mut rates);
    *log = rates.log.take();
    let spans = result?;
    let base = sim.model.base_us(protocol);
    Ok((
        Estimate {
            time_us: base + st.now,
            base_us: base,
            messages: st.messages,
            payload_bytes: st.payload,
            resource_bytes: rates.resource_bytes,
        },
        spans,
    ))
}

/// Per resource, the sum of its flows' rates over time, from a traced run's rate changes.
fn resource_uses(p: &Prepared, log: Vec<(f64, u32, f64)>) -> Vec<ResourceUse> {
    let mut rate = vec![0.0f64; p.msg_conn.len()];
    let mut uses: HashMap<u32, Vec<(f64, f64)>> = HashMap::new();
    let mut total: HashMap<u32, f64> = HashMap::new();
    for (t, m, new) in log {
        let Some(old) = rate.get_mut(m as usize) else {
            continue;
        };
        let delta = new - *old;
        *old = new;
        if delta == 0.0 {
            continue;
        }
        for &r in &p.conn_route[p.msg_conn[m as usize] as usize].resources {
            let sum = total.entry(r).or_insert(0.0);
            *sum += delta;
            // Rounding leaves a few ulps where every flow has ended.
            if sum.abs() < 1e-9 * delta.abs().max(1.0) {
                *sum = 0.0;
            }
            let gbps = (*sum / 1e3).max(0.0);
            let points = uses.entry(r).or_default();
            match points.last_mut() {
                Some(last) if last.0 == t => last.1 = gbps,
                _ => points.push((t, gbps)),
            }
        }
    }
    let mut out: Vec<ResourceUse> = uses
        .into_iter()
        .map(|(resource, mut rates)| {
            // Drop points that repeat the previous rate.
            rates.dedup_by(|b, a| a.1 == b.1);
            ResourceUse { resource, rates }
        })
        .collect();
    out.sort_unstable_by_key(|u| u.resource);
    out
}

/// Max-min fair rates of every flow of a whole schedule (see [`FlowRates::recompute`]).
struct FlowRates<'a> {
    p: &'a Prepared,
    /// Rate changes, when the run is traced.
    log: RateLog,
    // flows (indexed by message)
    rate: Vec<f64>,
    remaining: Vec<f64>,
    last: Vec<f64>,
    version: Vec<u32>,
    active: Vec<bool>,
    res_flows: Vec<Vec<u32>>,
    /// Where each active flow sits in the flow list of each resource on its route:
    /// `slot[slot_base[m] + j]` for the `j`-th resource of message `m`'s route (a finished
    /// flow leaves every list in O(1), not by searching lists of thousands of flows).
    slot: Vec<u32>,
    slot_base: Vec<u32>,
    cap: Vec<f64>,
    resource_bytes: Vec<f64>,
    dirty: Vec<u32>,
    /// Flows started since the last recomputation.
    fresh: Vec<u32>,
    /// Capacity currently allocated on each resource (bytes/µs).
    used: Vec<f64>,
    active_count: usize,
    /// Flows finished since the last recomputation.
    released: usize,
    /// Approximate allocations since the last full recomputation.
    pending_changes: usize,
    // scratch for rate recomputation
    res_stamp: Vec<u32>,
    flow_stamp: Vec<u32>,
    frozen_stamp: Vec<u32>,
    epoch: u32,
    rem: Vec<f64>,
    cnt: Vec<u32>,
    new_rate: Vec<f64>,
    shares: Shares,
    /// Scratch: the resources and flows of the component being recomputed.
    comp_res: Vec<u32>,
    comp_flows: Vec<u32>,
}

impl<'a> FlowRates<'a> {
    fn new(sim: &Simulator, p: &'a Prepared, bytes: u64, protocol: Protocol) -> FlowRates<'a> {
        let nmsg = p.msg_conn.len();
        let nres = sim.network.capacity.len();
        // The calibration's bandwidth factor at this size scales links and local work alike.
        let scale = sim.model.bandwidth_factor(bytes);
        let eff = sim.model.efficiency(protocol) * scale;
        // GB/s × 1e3 = bytes per µs.
        let cap = sim.network.capacity.iter().map(|c| c * eff * 1e3).collect();
        let mut slot_base = Vec::with_capacity(nmsg);
        let mut slots = 0u32;
        for &c in &p.msg_conn {
            slot_base.push(slots);
            slots += p.conn_route[c as usize].resources.len() as u32;
        }
        FlowRates {
            p,
            rate: vec![0.0; nmsg],
            remaining: vec![0.0; nmsg],
            last: vec![0.0; nmsg],
            version: vec![0; nmsg],
            active: vec![false; nmsg],
            res_flows: vec![Vec::new(); nres],
            slot: vec![0; slots as usize],
            slot_base,
            cap,
            resource_bytes: vec![0.0; nres],
            dirty: Vec::new(),
            fresh: Vec::new(),
            used: vec![0.0; nres],
            active_count: 0,
            released: 0,
            pending_changes: 0,
            res_stamp: vec![0; nres],
            flow_stamp: vec![0; nmsg],
            frozen_stamp: vec![0; nmsg],
            epoch: 0,
            rem: vec![0.0; nres],
            cnt: vec![0; nres],
            new_rate: vec![0.0; nmsg],
            shares: Shares::new(nres, nmsg),
            comp_res: Vec::new(),
            comp_flows: Vec::new(),
            log: None,
        }
    }
}

impl Rates for FlowRates<'_> {
    fn start(&mut self, st: &mut Steps<'_>, m: u32, bytes: f64) {
        let mi = m as usize;
        let p = self.p;
        let route: &Route = &p.conn_route[p.msg_conn[mi] as usize];
        let base = self.slot_base[mi] as usize;
        for (j, &r) in route.resources.iter().enumerate() {
            let list = &mut self.res_flows[r as usize];
            self.slot[base + j] = list.len() as u32;
            list.push(m);
            self.resource_bytes[r as usize] += bytes;
        }
        self.active[mi] = true;
        self.active_count += 1;
        self.fresh.push(m);
        self.remaining[mi] = bytes;
        self.rate[mi] = 0.0;
        self.last[mi] = st.now;
        self.dirty.extend_from_slice(&route.resources);
    }

    fn finish(&mut self, st: &mut Steps<'_>, m: u32) {
        let mi = m as usize;
        if let Some(log) = &mut self.log {
            log.push((st.now, m, 0.0));
        }
        self.active[mi] = false;
        self.active_count -= 1;
        self.released += 1;
        let p = self.p;
        let route: &Route = &p.conn_route[p.msg_conn[mi] as usize];
        let base = self.slot_base[mi] as usize;
        for (j, &r) in route.resources.iter().enumerate() {
            self.used[r as usize] = (self.used[r as usize] - self.rate[mi]).max(0.0);
            let list = &mut self.res_flows[r as usize];
            let pos = self.slot[base + j] as usize;
            let last = list.len() - 1;
            list.swap_remove(pos);
            if pos < last {
                // The flow that was last now sits at `pos`: find its entry for `r` (the one
                // that pointed at the end of the list).
                let moved = list[pos] as usize;
                let mbase = self.slot_base[moved] as usize;
                let mroute = &p.conn_route[p.msg_conn[moved] as usize].resources;
                if let Some(k) = (0..mroute.len())
                    .find(|&k| mroute[k] == r && self.slot[mbase + k] as usize == last)
                {
                    self.slot[mbase + k] = pos as u32;
                }
            }
        }
        self.dirty.extend_from_slice(&route.resources);
    }

    fn current(&self, m: u32, version: u32) -> bool {
        self.active[m as usize] && self.version[m as usize] == version
    }

    fn dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    fn recompute(&mut self, st: &mut Steps<'_>) {
        self.recompute_dirty(st);
    }

    fn revive(&mut self, st: &mut Steps<'_>) -> bool {
        if self.active_count > 0 && self.pending_changes + self.released > 0 {
            // Flows left without capacity by approximate allocation: re-balance.
            self.full_recompute(st);
            true
        } else {
            false
        }
    }
}

impl<'a> FlowRates<'a> {
    /// Max-min fair rates for the flows connected to the dirty resources. Components of at
    /// most [`EXACT_COMPONENT`] flows are recomputed exactly at every change. In larger ones
    /// (all-to-all traffic through shared switches) a new flow takes the capacity its route
    /// has left and a finished flow's capacity is released, and the whole network is
    /// re-balanced after every `max(EXACT_COMPONENT / 4, active / 4)` such changes: rates stay
    /// feasible (no resource is ever over capacity), so lower bounds remain valid, and the
    /// cost per event stays bounded.
    fn recompute_dirty(&mut self, st: &mut Steps<'_>) {
        let epoch = self.next_epoch();
        let mut stack = std::mem::take(&mut self.dirty);
        let mut fresh = std::mem::take(&mut self.fresh);
        let mut comp_res = std::mem::take(&mut self.comp_res);
        let mut comp_flows = std::mem::take(&mut self.comp_flows);
        comp_res.clear();
        comp_flows.clear();
        let mut big = false;
        'bfs: while let Some(r) = stack.pop() {
            if self.res_stamp[r as usize] == epoch {
                continue;
            }
            self.res_stamp[r as usize] = epoch;
            comp_res.push(r);
            if self.res_flows[r as usize].len() > EXACT_COMPONENT {
                // More flows on this one resource than an exact component may hold: the
                // search below would only find that out after stamping them.
                big = true;
                break 'bfs;
            }
            for &f in &self.res_flows[r as usize] {
                if self.flow_stamp[f as usize] != epoch {
                    self.flow_stamp[f as usize] = epoch;
                    comp_flows.push(f);
                    if comp_flows.len() > EXACT_COMPONENT {
                        big = true;
                        break 'bfs;
                    }
                    let route = &self.p.conn_route[self.p.msg_conn[f as usize] as usize];
                    for &r2 in &route.resources {
                        if self.res_stamp[r2 as usize] != epoch {
                            stack.push(r2);
                        }
                    }
                }
            }
        }
        stack.clear();
        self.dirty = stack;
        if !big {
            self.fill(st, &comp_res, &comp_flows);
        }
        self.comp_res = comp_res;
        self.comp_flows = comp_flows;
        if !big {
            fresh.clear();
            self.fresh = fresh;
            return;
        }
        // Large component: give new flows what their route has left.
        let mut changes = self.released;
        self.released = 0;
        for &f in &fresh {
            if !self.active[f as usize] || self.rate[f as usize] > 0.0 {
                continue;
            }
            changes += 1;
            let p: &'a Prepared = self.p;
            let route: &'a Route = &p.conn_route[p.msg_conn[f as usize] as usize];
            let rate = route
                .resources
                .iter()
                .map(|&r| (self.cap[r as usize] - self.used[r as usize]).max(0.0))
                .fold(f64::INFINITY, f64::min);
            if rate > 0.0 && rate.is_finite() {
                for &r in &route.resources {
                    self.used[r as usize] += rate;
                }
                self.set_rate(st, f, rate);
            }
        }
        fresh.clear();
        self.fresh = fresh;
        self.pending_changes += changes;
        let threshold = (EXACT_COMPONENT / 4).max(self.active_count / 4);
        if self.pending_changes >= threshold {
            self.full_recompute(st);
        }
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.res_stamp.iter_mut().for_each(|x| *x = 0);
            self.flow_stamp.iter_mut().for_each(|x| *x = 0);
            self.frozen_stamp.iter_mut().for_each(|x| *x = 0);
            self.epoch = 1;
        }
        self.epoch
    }

    /// Exact max-min rates over every active flow.
    fn full_recompute(&mut self, st: &mut Steps<'_>) {
        self.pending_changes = 0;
        self.released = 0;
        self.fresh.clear();
        self.dirty.clear();
        let epoch = self.next_epoch();
        let mut comp_res = std::mem::take(&mut self.comp_res);
        let mut comp_flows = std::mem::take(&mut self.comp_flows);
        comp_res.clear();
        comp_flows.clear();
        for r in 0..self.res_flows.len() {
            if self.res_flows[r].is_empty() {
                continue;
            }
            comp_res.push(r as u32);
            for &f in &self.res_flows[r] {
                if self.flow_stamp[f as usize] != epoch {
                    self.flow_stamp[f as usize] = epoch;
                    comp_flows.push(f);
                }
            }
        }
        self.fill(st, &comp_res, &comp_flows);
        self.comp_res = comp_res;
        self.comp_flows = comp_flows;
    }

    /// Sets a flow's rate, settling its progress and scheduling its end.
    fn set_rate(&mut self, st: &mut Steps<'_>, f: u32, new: f64) {
        let fi = f as usize;
        let elapsed = st.now - self.last[fi];
        self.remaining[fi] = (self.remaining[fi] - self.rate[fi] * elapsed).max(0.0);
        self.last[fi] = st.now;
        self.rate[fi] = new;
        if let Some(log) = &mut self.log {
            log.push((st.now, f, new));
        }
        self.version[fi] = self.version[fi].wrapping_add(1);
        if new > 0.0 {
            let finish = st.now + self.remaining[fi] / new;
            st.push(finish, EventKind::FlowDone(f, self.version[fi]));
        }
    }

    /// Progressive filling over a closed set of resources and the flows on them.
    fn fill(&mut self, st: &mut Steps<'_>, comp_res: &[u32], comp_flows: &[u32]) {
        let epoch = self.epoch;
        let p: &'a Prepared = self.p;
        let (routes, msg_conn) = (&p.conn_route, &p.msg_conn);
        // Progressive filling: repeatedly freeze the flows of the resource with the smallest
        // fair share `rem / cnt` (ties: lowest id) at that share.
        {
            let FlowRates {
                shares,
                rem,
                cnt,
                cap,
                res_flows,
                frozen_stamp,
                new_rate,
                ..
            } = self;
            shares.sorted.clear();
            shares.cursor = 0;
            shares.later.clear();
            // Unfrozen flow-resource pairs: once none is left, every remaining entry is moot.
            let mut live: u64 = 0;
            for &r in comp_res {
                let ri = r as usize;
                rem[ri] = cap[ri];
                cnt[ri] = res_flows[ri].len() as u32;
                live += u64::from(cnt[ri]);
                if cnt[ri] > 0 {
                    let e = Share {
                        key: total_order_key(rem[ri] / f64::from(cnt[ri])),
                        res: r,
                        stamp: cnt[ri],
                    };
                    shares.represent(e);
                    if cnt[ri] == 1 {
                        // Of the resources a flow has to itself, only the first in filling
                        // order can freeze it: the others keep their share until it does.
                        let f = res_flows[ri][0] as usize;
                        match shares.solo[f] {
                            Some(b) if b <= e => {}
                            Some(_) => shares.solo[f] = Some(e),
                            None => {
                                shares.solo[f] = Some(e);
                                shares.solo_flows.push(f as u32);
                            }
                        }
                    } else {
                        shares.sorted.push(e);
                    }
                }
            }
            for i in 0..shares.solo_flows.len() {
                let f = shares.solo_flows[i] as usize;
                if let Some(e) = shares.solo[f].take() {
                    shares.sorted.push(e);
                }
            }
            shares.solo_flows.clear();
            shares.sorted.sort_unstable_by_key(|e| {
                (u128::from(e.key) << 64) | (u128::from(e.res) << 32) | u128::from(e.stamp)
            });
            while live > 0
                && let Some(e) = shares.pop()
            {
                let res = e.res;
                let ri = res as usize;
                if cnt[ri] == 0 || e.stamp != shares.rep_stamp[ri] {
                    continue; // all its flows are frozen, or superseded
                }
                let share = rem[ri] / f64::from(cnt[ri]);
                if cnt[ri] != e.stamp {
                    // Raised since it was stored: put back at its current share.
                    let e = Share {
                        key: total_order_key(share),
                        res,
                        stamp: cnt[ri],
                    };
                    shares.represent(e);
                    shares.later.push(Reverse(e));
                    continue;
                }
                let share = share.max(0.0);
                for &f in &res_flows[ri] {
                    if frozen_stamp[f as usize] == epoch {
                        continue;
                    }
                    frozen_stamp[f as usize] = epoch;
                    new_rate[f as usize] = share;
                    let route = &routes[msg_conn[f as usize] as usize];
                    for &r2 in &route.resources {
                        let r2i = r2 as usize;
                        rem[r2i] = (rem[r2i] - share).max(0.0);
                        cnt[r2i] -= 1;
                        live -= 1;
                        if cnt[r2i] > 0 && r2 != res {
                            let key = total_order_key(rem[r2i] / f64::from(cnt[r2i]));
                            // A lowered share (rounding) is queued now; raised ones wait
                            // until their representative reaches the front.
                            if key < shares.rep_key[r2i] {
                                let e = Share {
                                    key,
                                    res: r2,
                                    stamp: cnt[r2i],
                                };
                                shares.represent(e);
                                shares.later.push(Reverse(e));
                            }
                        }
                    }
                }
            }
        }
        for &r in comp_res {
            self.used[r as usize] = 0.0;
        }
        for &f in comp_flows {
            let new = self.new_rate[f as usize];
            let route = &routes[msg_conn[f as usize] as usize];
            for &r in &route.resources {
                self.used[r as usize] += new;
            }
            if new != self.rate[f as usize] || self.rate[f as usize] == 0.0 {
                self.set_rate(st, f, new);
            }
        }
    }
}
