//! What a simulation works on and what it predicts: a schedule flattened for repeated runs
//! ([`Prepared`]: steps, messages numbered per connection, successor lists, routes), the
//! helpers that flatten it, and the run's result ([`Estimate`], [`Timeline`]).

use super::model::{CostModel, LinkClass};
use super::network::{Network, Route};
use hccl_ir::{CONNECTION_SLOTS, Collective, Op, StepRef};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// No message, step or connection (an index's "none").
pub(super) const NONE: u32 = u32::MAX;

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
    /// A fingerprint of the run's course: the order in which its events happened and which
    /// way each choice between two times went; recorded only where asked for
    /// ([`Simulator::run_limited`](super::Simulator::run_limited),
    /// [`Simulator::run_symmetric_noting`](super::Simulator::run_symmetric_noting)) and
    /// never on a CPU host model or under a calibration. Every time of a flow run is affine
    /// in the collective's size while its course stays the same, so two runs of one schedule
    /// and protocol at two sizes with the same fingerprint give, at any size between, the
    /// time on the line through theirs.
    pub course: Option<u64>,
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
    /// The routes as the flow simulator shares bandwidth over them, built on its first run.
    pub(super) flow_routes: std::sync::OnceLock<Arc<FlowRoutes>>,
    /// The steps in the order the critical-path bounds walk them, each after its
    /// predecessors and its message's sender (`None`: some step never becomes ready), found
    /// on the first walk ([`super::reach`]).
    pub(super) walk_order: std::sync::OnceLock<Option<Arc<[u32]>>>,
    /// The routed critical path's walks so far ([`super::path_points`]): most questions
    /// whether it is past a limit are settled from them without a walk.
    pub(super) path_points: super::path_points::PathPoints,
    pub(super) chunks: u32,
    /// The collective, the largest message (in chunks) and the most scratch chunks of any
    /// rank: how the executor segments a call.
    pub(super) collective: Collective,
    pub(super) max_count: u32,
    pub(super) max_scratch: u32,
}

impl Prepared {
    /// How many times [`Simulator::path_bound_past`](super::Simulator::path_bound_past) has
    /// walked this schedule's critical path (the other questions were settled from those
    /// walks).
    pub fn path_walks(&self) -> usize {
        self.path_points.walks()
    }

    /// Number of steps.
    pub fn step_count(&self) -> usize {
        self.steps.len()
    }

    /// The payload bytes each of `resources` resources carries when this schedule runs a
    /// collective of `bytes`: what a full run's [`Estimate::resource_bytes`] adds up to.
    pub(super) fn resource_loads(&self, bytes: u64, resources: usize) -> Vec<f64> {
        let chunk_bytes = bytes as f64 / f64::from(self.chunks);
        let mut loads = vec![0.0; resources];
        for (&c, &count) in self.msg_conn.iter().zip(&self.msg_count) {
            let b = f64::from(count) * chunk_bytes;
            if b > 0.0 {
                for &r in &self.conn_route[c as usize].resources {
                    loads[r as usize] += b;
                }
            }
        }
        loads
    }

    /// Whether some message of the schedule travels a route whose slowest link is of `class`.
    pub fn uses_class(&self, class: LinkClass) -> bool {
        self.conn_route
            .iter()
            .zip(&self.conn_len)
            .any(|(r, &len)| len > 0 && r.class == class)
    }
}

/// The routes as max-min sharing sees them. Resources crossed by exactly the same
/// connections (of those that carry messages) always carry the same flows, so they form a
/// *bundle* that only its member of least capacity (then lowest id) can limit: their flow
/// counts are equal and the same shares are taken off each, so that member's fair share is
/// never above another's, and it comes first on a tie. A route lists the representatives
/// of its bundles, each once, in the order of the bundle's first resource on the route.
/// Filling over representatives (`flow.rs`) gives every flow the rate filling over every
/// resource gives, with half the work on a multi-hop route; the capacity left on a route (the
/// large component's approximate allocation) is the same as well, since a bundle's members
/// carry the same allocated rate.
#[derive(Debug)]
pub(super) struct FlowRoutes {
    /// Per connection, where its representatives start in `res` (and one past the last).
    start: Vec<u32>,
    res: Vec<u32>,
    /// The most representatives on one route.
    pub(super) widest: usize,
    /// The most flows ever active at once: a connection has at most [`CONNECTION_SLOTS`]
    /// messages started and not yet taken by their receive, summed over connections.
    pub(super) most_active: usize,
}

impl FlowRoutes {
    pub(super) fn new(p: &Prepared, capacity: &[f64]) -> FlowRoutes {
        let nres = capacity.len();
        let mut users: Vec<Vec<u32>> = vec![Vec::new(); nres];
        for (c, route) in p.conn_route.iter().enumerate() {
            if p.conn_len[c] == 0 {
                continue;
            }
            for &r in &route.resources {
                let list = &mut users[r as usize];
                if list.last() != Some(&(c as u32)) {
                    list.push(c as u32);
                }
            }
        }
        let mut best: FxHashMap<&[u32], u32> = FxHashMap::default();
        for (r, list) in users.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            best.entry(list.as_slice())
                .and_modify(|b| {
                    if capacity[r].total_cmp(&capacity[*b as usize]).is_lt() {
                        *b = r as u32;
                    }
                })
                .or_insert(r as u32);
        }
        let rep: Vec<u32> = users
            .iter()
            .enumerate()
            .map(|(r, list)| best.get(list.as_slice()).copied().unwrap_or(r as u32))
            .collect();
        let mut start = Vec::with_capacity(p.conn_route.len() + 1);
        let mut res = Vec::new();
        start.push(0);
        for route in &p.conn_route {
            let first = res.len();
            for &r in &route.resources {
                let b = rep[r as usize];
                if !res[first..].contains(&b) {
                    res.push(b);
                }
            }
            start.push(res.len() as u32);
        }
        let widest = start
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        let most_active: usize = p
            .conn_len
            .iter()
            .map(|&len| (len as usize).min(CONNECTION_SLOTS))
            .sum();
        FlowRoutes {
            start,
            res,
            widest,
            most_active,
        }
    }

    /// The representatives on connection `c`'s route.
    #[inline]
    pub(super) fn of(&self, c: u32) -> &[u32] {
        &self.res[self.start[c as usize] as usize..self.start[c as usize + 1] as usize]
    }

    /// Where connection `c`'s representatives sit in [`FlowRoutes::all`]: start and count.
    #[inline]
    pub(super) fn span(&self, c: u32) -> (u32, u32) {
        let a = self.start[c as usize];
        (a, self.start[c as usize + 1] - a)
    }

    /// Every connection's representatives, one after another.
    #[inline]
    pub(super) fn all(&self) -> &[u32] {
        &self.res
    }
}

/// A flattened schedule whose routes are not looked up yet ([`Simulator::unrouted`](super::Simulator::unrouted)).
#[derive(Debug, Clone)]
pub struct Unrouted {
    /// Everything but `conn_route`.
    pub(super) prepared: Prepared,
    /// The ranks of every connection, in connection order.
    pub(super) pairs: Vec<(u32, u32)>,
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
