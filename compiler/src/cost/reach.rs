//! A lower bound on a schedule's simulated time that needs no routes: the critical path of
//! its steps and messages, each message costing at least what any route between its two
//! ranks would make it cost.
//!
//! What the simulator does to a message of `b` bytes from rank `a` to rank `z` (see
//! [`super::sim`]) is bounded below without knowing its route:
//!
//! - **Streaming** takes at least `b / (cap × efficiency)`, where `cap` is the largest
//!   capacity of a link leaving `a` (or entering `z`), NIC directions included: every route
//!   starts on one of `a`'s links and ends on one of `z`'s, and a max-min share never exceeds
//!   a resource's capacity.
//! - **Latency** is at least the per-message latency of the least class the route can have:
//!   a route between ranks that no path of NVLink-class links joins holds a slower link
//!   (PCIe, or a network link when no NVLink or PCIe path joins them either). Classes come
//!   from connectivity alone (any path, devices included), so routing rules cannot beat it.
//!   The route's hop latencies add at least that of one link of its least class; its
//!   streaming is at most as fast as the widest link of that class.
//!
//! - **Hosts' cuts**: the bytes that leave (or enter) a host, a component of NVLink- and
//!   PCIe-class links, cross the network links leaving (entering) it, at no more than
//!   their capacities together.
//!
//! The bound then walks the steps in dependency order (stream order, dependencies, and a
//! receive after its message): a send ends no earlier than it started plus its message's
//! streaming; its message arrives a latency later; a receive ends no earlier than its
//! message's arrival, and a relaying receive streams its outgoing message from there. Slot
//! waits, contention and local work only add time. The collective's bound is the protocol's
//! base latency plus the latest step's bound or the busiest cut's time, whichever is later.
//!
//! The search screens large schedules of families that cannot win with it (a k-ary tree on
//! thousands of ranks, against a hierarchical template): a candidate whose bound is past
//! the screen's limit is dropped before its routes are looked up.

use super::model::CostModel;
use super::model::LinkClass;
use super::network::Network;
use super::path_points::CurveKey;
use super::prepared::{Kind, NONE, Prepared};
use hccl_ir::Protocol;
use std::sync::Arc;

/// What the bound needs to know of each rank, computed once per network.
#[derive(Debug, Clone)]
pub struct RankReach {
    /// Largest capacity of a link leaving / entering each rank's vertex (GB/s), NIC
    /// direction included.
    out_cap: Vec<f64>,
    in_cap: Vec<f64>,
    /// Per rank: its component among NVLink-class links, and among NVLink- and PCIe-class
    /// links.
    nvlink_part: Vec<u32>,
    pci_part: Vec<u32>,
    /// Per class: the largest capacity (GB/s) and the least hop latency (µs) of any link of
    /// that class or a slower one (a route of that class holds one).
    widest_of: [f64; 3],
    nearest_of: [f64; 3],
    /// Per vertex that names a PCIe-class component (a host): the capacity (GB/s) of the
    /// links leaving it and entering it, all of network class.
    cut_out: Vec<f64>,
    cut_in: Vec<f64>,
}

impl RankReach {
    pub fn new(network: &Network) -> RankReach {
        let nv = network.vertices.len();
        let link_cap = |li: usize| {
            let mut cap = network.capacity[li];
            if let Some(r) = network.nic_resource(li as u32) {
                cap = cap.min(network.capacity[r as usize]);
            }
            cap
        };
        let mut v_out = vec![0.0f64; nv];
        let mut v_in = vec![0.0f64; nv];
        let mut nvlink = Parts::new(nv);
        let mut pci = Parts::new(nv);
        let mut widest_of = [0.0f64; 3];
        let mut nearest_of = [f64::INFINITY; 3];
        for (li, l) in network.links.iter().enumerate() {
            let cap = link_cap(li);
            for class in LinkClass::ALL.iter().filter(|&&c| c <= l.class) {
                let k = class.index();
                widest_of[k] = widest_of[k].max(cap);
                nearest_of[k] = nearest_of[k].min(l.latency.max(0.0));
            }
            let (a, b) = (l.from as usize, l.to as usize);
            v_out[a] = v_out[a].max(cap);
            v_in[b] = v_in[b].max(cap);
            if l.class <= LinkClass::NvLink {
                nvlink.join(a, b);
            }
            if l.class <= LinkClass::Pci {
                pci.join(a, b);
            }
        }
        let mut cut_out = vec![0.0f64; nv];
        let mut cut_in = vec![0.0f64; nv];
        for (li, l) in network.links.iter().enumerate() {
            let (a, b) = (pci.find(l.from as usize), pci.find(l.to as usize));
            if a != b {
                cut_out[a as usize] += link_cap(li);
                cut_in[b as usize] += link_cap(li);
            }
        }
        let ranks = &network.rank_vertex;
        RankReach {
            cut_out,
            cut_in,
            out_cap: ranks.iter().map(|&v| v_out[v as usize]).collect(),
            in_cap: ranks.iter().map(|&v| v_in[v as usize]).collect(),
            nvlink_part: ranks.iter().map(|&v| nvlink.find(v as usize)).collect(),
            pci_part: ranks.iter().map(|&v| pci.find(v as usize)).collect(),
            widest_of,
            nearest_of,
        }
    }

    /// The least class a route from `a` to `z` can have.
    pub fn least_class(&self, a: u32, z: u32) -> LinkClass {
        let (a, z) = (a as usize, z as usize);
        if self.nvlink_part[a] == self.nvlink_part[z] {
            LinkClass::NvLink
        } else if self.pci_part[a] == self.pci_part[z] {
            LinkClass::Pci
        } else {
            LinkClass::Net
        }
    }

    /// The largest capacity a route from `a` to `z` can have (GB/s): that of its first
    /// link, of its last, and of a link of its least class.
    pub fn widest(&self, a: u32, z: u32) -> f64 {
        self.out_cap[a as usize]
            .min(self.in_cap[z as usize])
            .min(self.widest_of[self.least_class(a, z).index()])
    }

    /// The least hop latency (µs) a route from `a` to `z` can have: that of a link of its
    /// least class.
    pub fn nearest(&self, a: u32, z: u32) -> f64 {
        let near = self.nearest_of[self.least_class(a, z).index()];
        if near.is_finite() { near } else { 0.0 }
    }
}

/// Union-find over vertices.
struct Parts(Vec<u32>);

impl Parts {
    fn new(n: usize) -> Parts {
        Parts((0..n as u32).collect())
    }

    fn find(&mut self, mut x: usize) -> u32 {
        while self.0[x] as usize != x {
            let up = self.0[self.0[x] as usize];
            self.0[x] = up;
            x = up as usize;
        }
        x as u32
    }

    fn join(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0[ra.max(rb) as usize] = ra.min(rb);
        }
    }
}

/// The bound of the module docs for a prepared (possibly unrouted) schedule whose
/// connection `c` joins `pairs[c]`.
pub(super) fn critical_path_us(
    (model, reach): (&CostModel, &RankReach),
    p: &Prepared,
    pairs: &[(u32, u32)],
    bytes: u64,
    protocol: Protocol,
) -> f64 {
    let Some((eff, chunk_bytes)) = scale(model, p, bytes, protocol) else {
        return 0.0;
    };
    // Least per-message latency of each class or a slower one.
    let mut latency = [0.0; 3];
    let mut least = f64::INFINITY;
    for class in LinkClass::ALL.iter().rev() {
        least = least.min(model.message_us(*class, protocol));
        latency[class.index()] = least;
    }
    let least_latency = |m: usize| {
        let (a, z) = pairs[p.msg_conn[m] as usize];
        latency[reach.least_class(a, z).index()].max(0.0) + reach.nearest(a, z)
    };
    let streaming = |m: usize| {
        let (a, z) = pairs[p.msg_conn[m] as usize];
        let b = f64::from(p.msg_count[m]) * chunk_bytes;
        let rate = reach.widest(a, z) * eff;
        if b > 0.0 && rate > 0.0 && rate.is_finite() {
            b / rate
        } else {
            0.0
        }
    };
    // Bytes that leave and enter each host (PCIe-class component) cross its cut.
    let mut leaving = vec![0.0f64; reach.cut_out.len()];
    let mut entering = vec![0.0f64; reach.cut_in.len()];
    for (m, &c) in p.msg_conn.iter().enumerate() {
        let (a, z) = pairs[c as usize];
        let (pa, pz) = (reach.pci_part[a as usize], reach.pci_part[z as usize]);
        if pa != pz {
            let b = f64::from(p.msg_count[m]) * chunk_bytes;
            leaving[pa as usize] += b;
            entering[pz as usize] += b;
        }
    }
    let over_cut = |bytes: &[f64], cap: &[f64]| {
        bytes
            .iter()
            .zip(cap)
            .filter(|(b, c)| **b > 0.0 && **c > 0.0 && c.is_finite())
            .map(|(b, c)| b / (c * eff))
            .fold(0.0, f64::max)
    };
    let cut = over_cut(&leaving, &reach.cut_out).max(over_cut(&entering, &reach.cut_in));
    let Some(last) = latest_step(p, least_latency, streaming) else {
        return f64::INFINITY;
    };
    model.base_us(protocol) + last.max(cut)
}

/// The same walk over a routed schedule ([`Prepared::conn_route`]): a message streams at no
/// more than its route's bottleneck (a max-min share never exceeds a resource's capacity)
/// and arrives its route's latency after it leaves, exactly as the simulator delays it;
/// contention, slot waits and local work only add time. Tighter than the route-free bound
/// wherever the route is slower than the best one between its ranks. Infinite for a
/// schedule the simulator would find deadlocked, 0 on a CPU host model.
pub(super) fn routed_path_us(
    (model, capacity): (&CostModel, &[f64]),
    p: &Prepared,
    bytes: u64,
    protocol: Protocol,
) -> f64 {
    let Some((eff, chunk_bytes)) = scale(model, p, bytes, protocol) else {
        return 0.0;
    };
    match routed_last((model, capacity), p, (eff, chunk_bytes), protocol) {
        Some(last) => model.base_us(protocol) + last,
        None => f64::INFINITY,
    }
}

/// Whether [`routed_path_us`] is finite and above `threshold`: the same answer, settled
/// where it can be from the walks taken before at other sizes under the same protocol
/// and model ([`super::path_points`]), else by a walk.
pub(super) fn routed_path_past(
    (model, capacity): (&CostModel, &[f64]),
    p: &Prepared,
    (bytes, protocol): (u64, Protocol),
    threshold: f64,
) -> bool {
    let Some((eff, chunk_bytes)) = scale(model, p, bytes, protocol) else {
        return 0.0 > threshold; // a CPU host model's path is 0
    };
    // The walks settle questions from each other only where every latency is at least 0
    // (rounding then stays relative, `path_points.rs`).
    let nonnegative = LinkClass::ALL
        .iter()
        .all(|&c| model.message_us(c, protocol) >= 0.0)
        && p.conn_route.iter().all(|r| r.latency_us >= 0.0);
    if !nonnegative {
        let path = routed_path_us((model, capacity), p, bytes, protocol);
        return path.is_finite() && path > threshold;
    }
    // The curve: the protocol and its per-message latencies (the routes, their capacities
    // and the counts are the prepared schedule's).
    let mut key: CurveKey = [proto_tag(protocol), 0, 0, 0];
    for class in LinkClass::ALL {
        key[1 + class.index()] = model.message_us(class, protocol).to_bits();
    }
    p.path_points.settle_or_walk(
        (key, p.steps.len(), (chunk_bytes, eff)),
        (model.base_us(protocol), threshold),
        || routed_last((model, capacity), p, (eff, chunk_bytes), protocol),
    )
}

/// The last step's end in [`routed_path_us`]'s walk (without the protocol's base latency);
/// `None` where the schedule would deadlock.
fn routed_last(
    (model, capacity): (&CostModel, &[f64]),
    p: &Prepared,
    (eff, chunk_bytes): (f64, f64),
    protocol: Protocol,
) -> Option<f64> {
    // Per connection: its route's latency as the simulator adds it, and the least capacity
    // of its resources (bytes per µs at this protocol and size).
    let conns: Vec<(f64, f64)> = p
        .conn_route
        .iter()
        .map(|r| {
            let least = r
                .resources
                .iter()
                .map(|&x| capacity[x as usize])
                .fold(f64::INFINITY, f64::min);
            (
                model.message_us(r.class, protocol) + r.latency_us,
                least * eff,
            )
        })
        .collect();
    let latency = |m: usize| conns[p.msg_conn[m] as usize].0;
    let streaming = |m: usize| {
        let rate = conns[p.msg_conn[m] as usize].1;
        let b = f64::from(p.msg_count[m]) * chunk_bytes;
        if b > 0.0 && rate > 0.0 && rate.is_finite() {
            b / rate
        } else {
            0.0
        }
    };
    latest_step(p, latency, streaming)
}

/// Bytes per µs per GB/s of capacity at this protocol and size, and the bytes of a chunk;
/// `None` on a CPU host model (whose bounds are 0).
fn scale(model: &CostModel, p: &Prepared, bytes: u64, protocol: Protocol) -> Option<(f64, f64)> {
    if model.cpu.is_some() {
        return None;
    }
    Some((
        model.efficiency(protocol) * model.bandwidth_factor(bytes) * 1e3,
        bytes as f64 / f64::from(p.chunks.max(1)),
    ))
}

/// The latest end of any step when every send takes `streaming(message)` from its start,
/// its message arrives `latency(message)` after that, and a receive ends no earlier than its
/// message's arrival (a relaying one streams its outgoing message from there); `None` when
/// some step never becomes ready (the simulator's deadlock). The steps are taken in
/// [`walk_order`] (found once per schedule): each one's start is the latest of its
/// predecessors' ends, which no order changes.
fn latest_step(
    p: &Prepared,
    latency: impl Fn(usize) -> f64,
    streaming: impl Fn(usize) -> f64,
) -> Option<f64> {
    let order = p.walk_order.get_or_init(|| walk_order(p)).clone()?;
    let n = p.steps.len();
    SCRATCH.with_borrow_mut(|scratch| {
        // Per step: the latest end of a predecessor, and its message's arrival.
        scratch.clear();
        scratch.resize(n, (0.0, 0.0));
        let mut last = 0.0f64;
        for &s in order.iter() {
            let si = s as usize;
            let (start, arrival) = scratch[si];
            // The end of the step and the message it puts on the wire, if any (a walk that
            // finds every step ready has no send or receive without its message).
            let (end, sent) = match p.steps[si].kind {
                Kind::Nop | Kind::Local { .. } => (start, NONE),
                Kind::Send { msg } => (start + streaming(msg as usize), msg),
                Kind::Recv { out, .. } => {
                    let consumed = start.max(arrival);
                    if out == NONE {
                        (consumed, NONE)
                    } else {
                        (consumed + streaming(out as usize), out)
                    }
                }
            };
            last = last.max(end);
            if sent != NONE {
                let r = p.msg_recv[sent as usize];
                if r != NONE {
                    let a = &mut scratch[r as usize].1;
                    *a = a.max(end + latency(sent as usize));
                }
            }
            for &t in &p.succ[p.succ_start[si] as usize..p.succ_start[si + 1] as usize] {
                let ready = &mut scratch[t as usize].0;
                *ready = ready.max(end);
            }
        }
        if scratch.capacity() > super::buffers::KEEP_ELEMENTS {
            *scratch = Vec::new();
        }
        Some(last)
    })
}

thread_local! {
    /// [`latest_step`]'s per-step times, kept for this thread's next walk.
    static SCRATCH: std::cell::RefCell<Vec<(f64, f64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The order [`latest_step`] takes the steps in: each after its predecessors and after the
/// sender of its message; `None` when some step never becomes ready (a send or receive
/// without its message, or a cycle), as the simulator would find it deadlocked.
fn walk_order(p: &Prepared) -> Option<Arc<[u32]>> {
    let n = p.steps.len();
    let mut pending = p.pending.clone();
    for (m, &r) in p.msg_recv.iter().enumerate() {
        if r != NONE && p.msg_send[m] != NONE {
            pending[r as usize] += 1;
        }
    }
    let mut work: Vec<u32> = (0..n as u32)
        .filter(|&s| pending[s as usize] == 0)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(s) = work.pop() {
        let si = s as usize;
        let sent = match p.steps[si].kind {
            Kind::Nop | Kind::Local { .. } => NONE,
            Kind::Send { msg } if msg == NONE => continue,
            Kind::Send { msg } => msg,
            Kind::Recv { msg, .. } if msg == NONE => continue,
            Kind::Recv { out, .. } => out,
        };
        order.push(s);
        if sent != NONE {
            let r = p.msg_recv[sent as usize];
            if r != NONE {
                let ri = r as usize;
                pending[ri] -= 1;
                if pending[ri] == 0 {
                    work.push(r);
                }
            }
        }
        for &t in &p.succ[p.succ_start[si] as usize..p.succ_start[si + 1] as usize] {
            let ti = t as usize;
            pending[ti] -= 1;
            if pending[ti] == 0 {
                work.push(t);
            }
        }
    }
    (order.len() == n).then(|| order.into())
}

/// A number per protocol, for a [`CurveKey`].
fn proto_tag(protocol: Protocol) -> u64 {
    match protocol {
        Protocol::LL => 1,
        Protocol::LL128 => 2,
        Protocol::Simple => 3,
    }
}
