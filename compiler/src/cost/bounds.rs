//! Lower bounds on the time of a collective, valid for every schedule under the simulator's
//! model (no schedule the simulator costs can beat them; tests check this property).
//!
//! **Bandwidth.** For a vertex set `S` holding `k` of the `N` ranks (`0 < k < N`), the bytes
//! that must leave and enter `S`, over the capacity of the links leaving (`B_out`) and
//! entering (`B_in`) it (NIC directions cap their links as in the simulator):
//!
//! | collective    | out of `S`            | into `S`              |
//! |---------------|-----------------------|-----------------------|
//! | AllGather     | `k·M/N`               | `(N−k)·M/N`           |
//! | ReduceScatter | `(N−k)·M/N`           | `k·M/N`               |
//! | AllToAll      | `k·(N−k)·M/N`         | `k·(N−k)·M/N`         |
//! | AllReduce     | `M`                   | `M`                   |
//! | Broadcast     | `M` if root ∈ S       | `M` if root ∉ S       |
//! | Reduce        | `M` if root ∉ S       | `M` if root ∈ S       |
//!
//! AllReduce has a second bound: without in-network reduction every element needs at least
//! `2(N−1)` transmissions (one-way gossip), so `2(N−1)·M` bytes must enter devices in total:
//! `T ≥ 2(N−1)·M / Σ_v B_in(v)` (and likewise for what leaves devices). On a uniform
//! topology this is the familiar `2(N−1)/N · M / B`. (It replaces BRIEF's "2× the AllGather
//! cut", which is not a valid bound for unbalanced cuts on heterogeneous links.) The same
//! argument with every host contracted to one node (intra-host traffic free) gives, for `H`
//! hosts, `T ≥ 2(H−1)·M / Σ_h B_in(h)` over the links entering hosts (and leaving them):
//! on multi-node clusters the NICs, not the NVLinks, bound AllReduce.
//! Broadcast and Reduce also use `M / maxflow(root → v)` (resp. `v → root`) for a sample of
//! ranks `v`.
//!
//! **Routes.** Every transfer between two ranks takes the simulator's route between them (as
//! CUDA peer copies and the transports do: two GPUs joined by NVLink never also talk over
//! PCIe), while cuts and max-flows let data take any path. For Broadcast, Reduce, AllGather
//! and ReduceScatter up to [`SYNTH_MAX_RANKS`](super::packing::SYNTH_MAX_RANKS) (resp.
//! [`SYNTH_MAX_RANKS_ALL`](super::packing::SYNTH_MAX_RANKS_ALL)) ranks, the bound also uses the optimum of the
//! tree-packing LP over those routes, proved by its dual ([`super::packing`]): any
//! schedule of these collectives is such a packing in the limit of small pieces.
//!
//! Cuts evaluated: every single rank and its complement, every host and its complement, and
//! unions of the first `j` hosts (at most [`MAX_PREFIX_CUTS`] values of `j`). Any cut gives a
//! valid bound, so sampling only weakens it.
//!
//! **Latency.** The simulator lets a rank talk to many peers at once, so `⌈log2 N⌉` rounds is
//! *not* a bound here (a direct broadcast needs one round). Instead: every rank must hear
//! from every other rank (from the root for Broadcast, to the root for Reduce), so
//! `T ≥ base(p) + message(NVLink, p) + dist(u, v)` for the farthest sampled pair. And after the
//! last byte of the bandwidth term streams, one message latency remains:
//! `T ≥ base(p) + message(p) + min hop latency + bandwidth / efficiency(p)`.
//! The bound is the smallest over protocols.

use super::model::{CostModel, LinkClass};
use super::network::{Network, VertexKind};
use hccl_ir::{Collective, Protocol};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// At most this many unions of leading hosts are evaluated as cuts.
pub const MAX_PREFIX_CUTS: usize = 64;
/// At most this many max-flow computations for rooted collectives.
pub const MAX_FLOW_SAMPLES: usize = 8;

/// A lower bound on a collective's time (µs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// Time to push the bytes the best cut must carry at full link capacity.
    pub bandwidth_us: f64,
    /// Time for the farthest required message to arrive, base latency included.
    pub latency_us: f64,
    /// The bound itself: the best protocol's `max(latency, startup + bandwidth / efficiency)`.
    pub total_us: f64,
}

/// Lower bound for `collective` of `bytes` on `network` under `model`.
pub fn bound(network: &Network, model: &CostModel, collective: Collective, bytes: u64) -> Bound {
    let n = network.nranks();
    let m = bytes as f64;
    if n <= 1 {
        let base = model.min_base_us();
        return Bound {
            bandwidth_us: 0.0,
            latency_us: base,
            total_us: base,
        };
    }
    let bandwidth_us = bandwidth_bound(network, collective, m);
    let dist = farthest(network, collective);
    let min_hop = network
        .links
        .iter()
        .filter(|l| matches!(network.vertices[l.to as usize], VertexKind::Device { .. }))
        .map(|l| l.latency)
        .fold(f64::INFINITY, f64::min);
    let min_hop = if min_hop.is_finite() { min_hop } else { 0.0 };
    // CPU ranks of one host pay no route latency (the CPU model's message latency is the
    // whole trip between cores).
    let (dist, min_hop) = if model.cpu.is_some() {
        (0.0, 0.0)
    } else {
        (dist, min_hop)
    };
    // On CPU ranks every byte that crosses a cut is sent (at least half a send's passes, for
    // a forward) and received (the read plus at least one local pass) by a rank's thread at
    // the rank's bandwidth; where the calibration makes those cheaper than one pass, the cut
    // moves bytes faster than its links' capacity.
    let cpu_factor = model.cpu.as_ref().map_or(1.0, |c| {
        (c.recv_passes + c.local_weight)
            .min(c.send_passes / 2.0)
            .min(1.0)
    });
    let bandwidth_us = bandwidth_us * cpu_factor;
    let mut latency_us = f64::INFINITY;
    let mut total_us = f64::INFINITY;
    for p in Protocol::ALL {
        let head = model.base_us(p) + model.message_us(LinkClass::NvLink, p);
        let lat = head + dist;
        // A calibrated machine moves bytes at its measured rate for this size.
        let eff = model.efficiency(p) * model.bandwidth_factor(bytes);
        let stream = if eff > 0.0 {
            head + min_hop + bandwidth_us / eff
        } else {
            f64::INFINITY
        };
        latency_us = latency_us.min(lat);
        total_us = total_us.min(lat.max(stream));
    }
    Bound {
        bandwidth_us,
        latency_us,
        total_us,
    }
}

/// `B_out` of the vertex set `in_s`, in GB/s, with NIC directions capping their links.
fn cut_out(
    network: &Network,
    in_s: &[bool],
    nic_sum: &mut [[f64; 2]],
    touched: &mut Vec<u32>,
) -> f64 {
    let mut total = 0.0;
    for (i, l) in network.links.iter().enumerate() {
        if !in_s[l.from as usize] || in_s[l.to as usize] {
            continue;
        }
        if network.nic_resource(i as u32).is_some() {
            let slot = usize::from(l.network);
            if nic_sum[l.from as usize] == [0.0, 0.0] {
                touched.push(l.from);
            }
            nic_sum[l.from as usize][slot] += l.cap;
        } else {
            total += l.cap;
        }
    }
    for v in touched.drain(..) {
        let vi = v as usize;
        let tx = network.nic_tx[vi].map_or(f64::INFINITY, |r| network.capacity[r as usize]);
        let rx = network.nic_rx[vi].map_or(f64::INFINITY, |r| network.capacity[r as usize]);
        total += nic_sum[vi][1].min(tx) + nic_sum[vi][0].min(rx);
        nic_sum[vi] = [0.0, 0.0];
    }
    total
}

/// Bytes that must leave and enter a set holding `k` ranks (`root_in`: whether it holds the
/// root of a rooted collective).
fn crossing(collective: Collective, n: f64, k: f64, root_in: bool, m: f64) -> (f64, f64) {
    match collective {
        Collective::AllGather => (k * m / n, (n - k) * m / n),
        Collective::ReduceScatter => ((n - k) * m / n, k * m / n),
        Collective::AllToAll => (k * (n - k) * m / n, k * (n - k) * m / n),
        Collective::AllReduce => (m, m),
        Collective::Broadcast { .. } => {
            if root_in {
                (m, 0.0)
            } else {
                (0.0, m)
            }
        }
        Collective::Reduce { .. } => {
            if root_in {
                (0.0, m)
            } else {
                (m, 0.0)
            }
        }
    }
}

fn time_us(bytes: f64, cap_gbps: f64) -> f64 {
    if bytes > 0.0 && cap_gbps > 0.0 && cap_gbps.is_finite() {
        bytes / (cap_gbps * 1e3)
    } else {
        0.0
    }
}

/// Which ranks a cut of [`CutCaps`] holds.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// One device vertex.
    Single(u32),
    /// One host's vertices.
    Host(usize),
    /// The vertices of the hosts below this index.
    Prefix(usize),
}

/// The cuts the bandwidth bound tries, with their capacities (GB/s) out of and into the
/// side and the ranks on it: they depend on the network alone, so they are found once per
/// network ([`Network::cut_caps`](super::Network)) and every size and collective only
/// weighs them by the bytes that must cross.
#[derive(Debug, Default)]
pub(crate) struct CutCaps {
    cuts: Vec<(Side, u32, f64, f64)>,
    /// Capacity out of and into every host, summed (the host-level gossip bound).
    host_out: f64,
    host_in: f64,
}

impl Network {
    /// The cuts the lower bounds weigh and their capacities ([`CutCaps`]), found once.
    pub(super) fn cut_caps(&self) -> &CutCaps {
        self.cut_caps
            .get_or_init(|| Box::new(CutCaps::new(self)))
            .downcast_ref()
            .expect("the network's cut cache holds CutCaps")
    }
}

impl CutCaps {
    /// The cuts of `network`: every rank alone (a sample of one rank per host on very large
    /// machines), every host, and unions of the first `j` hosts.
    pub(super) fn new(network: &Network) -> CutCaps {
        let n = network.nranks();
        let nv = network.vertices.len();
        let mut nic_sum = vec![[0.0f64; 2]; nv];
        let mut touched = Vec::new();
        let mut in_s = vec![false; nv];
        let mut complement = vec![true; nv];
        let mut out = CutCaps::default();
        let mut eval = |side: Side, in_s: &[bool], complement: &[bool], out: &mut CutCaps| {
            let k = network
                .rank_vertex
                .iter()
                .filter(|&&v| in_s[v as usize])
                .count() as u32;
            if k == 0 || k == n {
                return None;
            }
            let b_out = cut_out(network, in_s, &mut nic_sum, &mut touched);
            let b_in = cut_out(network, complement, &mut nic_sum, &mut touched);
            out.cuts.push((side, k, b_out, b_in));
            Some((b_out, b_in))
        };
        // Singletons and their complements: O(degree) via in/out sums would be faster, but
        // the generic evaluation keeps one definition of the cut; limit it to the distinct
        // ranks.
        let singles: Vec<u32> = if n as usize * network.links.len() <= 50_000_000 {
            network.rank_vertex.clone()
        } else {
            // Very large machines: a sample of ranks (every host's first rank).
            let hosts = network.nhosts.max(1);
            let mut seen = vec![false; hosts];
            network
                .rank_vertex
                .iter()
                .zip(&network.host_of)
                .filter(|&(_, &h)| !std::mem::replace(&mut seen[h.min(hosts - 1)], true))
                .map(|(&v, _)| v)
                .collect()
        };
        for v in singles {
            in_s[v as usize] = true;
            complement[v as usize] = false;
            eval(Side::Single(v), &in_s, &complement, &mut out);
            in_s[v as usize] = false;
            complement[v as usize] = true;
        }
        if network.nhosts > 1 {
            for h in 0..network.nhosts {
                for v in 0..nv {
                    let inside = network.vertex_host[v] == Some(h);
                    in_s[v] = inside;
                    complement[v] = !inside;
                }
                if let Some((b_out, b_in)) = eval(Side::Host(h), &in_s, &complement, &mut out) {
                    out.host_out += b_out;
                    out.host_in += b_in;
                }
            }
            // Unions of the first j hosts.
            let hosts = network.nhosts;
            let step = (hosts - 1).div_ceil(MAX_PREFIX_CUTS).max(1);
            let mut j = 1;
            while j < hosts {
                for v in 0..nv {
                    let inside = network.vertex_host[v].is_some_and(|h| h < j);
                    in_s[v] = inside;
                    complement[v] = !inside;
                }
                eval(Side::Prefix(j), &in_s, &complement, &mut out);
                j += step;
            }
        }
        out
    }
}

fn bandwidth_bound(network: &Network, collective: Collective, m: f64) -> f64 {
    let n = network.nranks();
    let root = collective.root();
    let root_vertex = root.and_then(|r| network.rank_vertex.get(r as usize).copied());
    let root_host = root_vertex.and_then(|v| network.vertex_host[v as usize]);
    let caps = network.cut_caps();
    let mut best = 0.0f64;
    for &(side, k, b_out, b_in) in &caps.cuts {
        let root_in = match side {
            Side::Single(v) => root_vertex == Some(v),
            Side::Host(h) => root_host == Some(h),
            Side::Prefix(j) => root_host.is_some_and(|h| h < j),
        };
        let (out_bytes, in_bytes) = crossing(collective, f64::from(n), f64::from(k), root_in, m);
        best = best
            .max(time_us(out_bytes, b_out))
            .max(time_us(in_bytes, b_in));
    }
    if network.nhosts > 1 && collective == Collective::AllReduce {
        // Gossip among hosts: contract every host to one node (its devices combine for
        // free); without in-network reduction each element still needs 2(H−1)
        // transmissions between hosts, so 2(H−1)·M bytes leave and enter hosts in total.
        let total = 2.0 * (network.nhosts as f64 - 1.0) * m;
        best = best
            .max(time_us(total, caps.host_out))
            .max(time_us(total, caps.host_in));
    }
    if let Some(caps) = route_caps(network) {
        for cut in &caps.cuts {
            let root_in = collective.root().is_some_and(|r| cut.contains(r));
            let (out_bytes, in_bytes) =
                crossing(collective, f64::from(n), f64::from(cut.k), root_in, m);
            best = best
                .max(time_us(out_bytes, cut.cap_out))
                .max(time_us(in_bytes, cut.cap_in));
        }
        best = best.max(time_us(received_bytes(collective, n, m), caps.gossip));
    }
    if collective == Collective::AllToAll
        && let Some(rate) = network.alltoall_rate()
    {
        // Every ordered pair moves M/N bytes at no more than the flow LP's rate.
        best = best.max(time_us(m / f64::from(n), rate));
    }
    if collective == Collective::AllReduce {
        // Gossip bound: 2(N-1)·M bytes enter (and leave) devices in total.
        let mut ejection = 0.0;
        let mut injection = 0.0;
        for (i, l) in network.links.iter().enumerate() {
            if matches!(network.vertices[l.to as usize], VertexKind::Device { .. }) {
                let nic_cap = network
                    .nic_resource(i as u32)
                    .map_or(f64::INFINITY, |res| network.capacity[res as usize]);
                ejection += l.cap.min(nic_cap);
            }
            if matches!(network.vertices[l.from as usize], VertexKind::Device { .. }) {
                injection += l.cap;
            }
        }
        let total = 2.0 * (f64::from(n) - 1.0) * m;
        best = best
            .max(time_us(total, ejection))
            .max(time_us(total, injection));
    }
    if let Some(rate) = super::packing::packing_bound(network, collective) {
        // Every piece reaches every rank over an arborescence of routes (from its owner, or
        // to it for reductions): the packing LP's dual bounds the rate of them all.
        let per_root = match collective {
            Collective::AllGather | Collective::ReduceScatter => m / f64::from(n),
            _ => m,
        };
        best = best.max(time_us(per_root, rate));
    }
    if let Some(root) = collective.root() {
        let reverse = matches!(collective, Collective::Reduce { .. });
        for v in flow_samples(network, root) {
            let (s, t) = if reverse { (v, root) } else { (root, v) };
            let f = max_flow(network, s, t);
            best = best.max(time_us(m, f));
        }
    }
    best
}

/// Ranks to compute max-flows to (from) the root: the one with the least capacity into it,
/// and the first rank of other hosts.
fn flow_samples(network: &Network, root: u32) -> Vec<u32> {
    let n = network.nranks();
    let mut in_cap = vec![0.0f64; network.vertices.len()];
    for l in &network.links {
        in_cap[l.to as usize] += l.cap;
    }
    let mut ranks: Vec<u32> = (0..n).filter(|&r| r != root).collect();
    ranks.sort_by(|&a, &b| {
        in_cap[network.rank_vertex[a as usize] as usize]
            .total_cmp(&in_cap[network.rank_vertex[b as usize] as usize])
            .then(a.cmp(&b))
    });
    let mut out: Vec<u32> = ranks.iter().copied().take(1).collect();
    let root_host = network.host_of.get(root as usize).copied();
    let mut seen_hosts = Vec::new();
    for r in 0..n {
        let h = network.host_of[r as usize];
        if r != root && Some(h) != root_host && !seen_hosts.contains(&h) {
            seen_hosts.push(h);
            out.push(r);
        }
        if out.len() >= MAX_FLOW_SAMPLES {
            break;
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Max-flow (GB/s) from rank `s` to rank `t` over links and NIC directions (petgraph's
/// Dinic, `algo::dinics`).
pub fn max_flow(network: &Network, s: u32, t: u32) -> f64 {
    use petgraph::graph::NodeIndex;
    let nv = network.vertices.len();
    // Node ids: vertices, then per NIC a tx and an rx node.
    let mut g: petgraph::Graph<(), f64> = petgraph::Graph::new();
    for _ in 0..nv {
        g.add_node(());
    }
    let mut tx_node = vec![usize::MAX; nv];
    let mut rx_node = vec![usize::MAX; nv];
    let node = |i: usize| NodeIndex::new(i);
    for v in 0..nv {
        if let Some(r) = network.nic_tx[v] {
            tx_node[v] = g.add_node(()).index();
            g.add_edge(node(v), node(tx_node[v]), network.capacity[r as usize]);
        }
        if let Some(r) = network.nic_rx[v] {
            rx_node[v] = g.add_node(()).index();
            g.add_edge(node(v), node(rx_node[v]), network.capacity[r as usize]);
        }
    }
    for l in &network.links {
        let from = l.from as usize;
        let src = if l.network && tx_node[from] != usize::MAX {
            tx_node[from]
        } else if !l.network && rx_node[from] != usize::MAX {
            rx_node[from]
        } else {
            from
        };
        g.add_edge(node(src), node(l.to as usize), l.cap);
    }
    petgraph::algo::dinics(
        &g,
        node(network.rank_vertex[s as usize] as usize),
        node(network.rank_vertex[t as usize] as usize),
    )
    .0
}

/// Latency distance (µs, any path, devices may relay) of the farthest pair the collective
/// needs to connect, over a sample of sources.
fn farthest(network: &Network, collective: Collective) -> f64 {
    let n = network.nranks();
    let (forward, backward, src) = match collective {
        Collective::Broadcast { root } => (true, false, root),
        Collective::Reduce { root } => (false, true, root),
        _ => (true, true, 0),
    };
    let src = src.min(n - 1);
    let mut best = 0.0f64;
    if forward {
        best = best.max(eccentricity(network, src, false));
    }
    if backward {
        best = best.max(eccentricity(network, src, true));
    }
    best
}

#[derive(PartialEq)]
struct Dist(f64, u32);
impl Eq for Dist {}
impl PartialOrd for Dist {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Dist {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// Largest shortest-latency distance from (or, `reverse`, to) rank `src` to any rank.
fn eccentricity(network: &Network, src: u32, reverse: bool) -> f64 {
    let nv = network.vertices.len();
    let mut adj: Vec<Vec<(u32, f64)>> = vec![Vec::new(); nv];
    for l in &network.links {
        if reverse {
            adj[l.to as usize].push((l.from, l.latency));
        } else {
            adj[l.from as usize].push((l.to, l.latency));
        }
    }
    let mut dist = vec![f64::INFINITY; nv];
    let start = network.rank_vertex[src as usize];
    dist[start as usize] = 0.0;
    let mut heap = BinaryHeap::from([Dist(0.0, start)]);
    while let Some(Dist(d, v)) = heap.pop() {
        if d > dist[v as usize] {
            continue;
        }
        for &(w, lat) in &adj[v as usize] {
            let nd = d + lat;
            if nd < dist[w as usize] {
                dist[w as usize] = nd;
                heap.push(Dist(nd, w));
            }
        }
    }
    network
        .rank_vertex
        .iter()
        .map(|&v| dist[v as usize])
        .filter(|d| d.is_finite())
        .fold(0.0, f64::max)
}

// ---------------------------------------------------------------------------------------
// Route-aware cuts.
//
// The simulator moves bytes between ranks only as messages along the network's fixed routes
// (see `network.rs`): least latency, then widest, through switches and NICs only; through
// other devices only for a source with some rank it cannot reach otherwise. So the rate at
// which bytes can cross from a rank set `A` to its complement is at most the optimum of the
// packing LP `max Σ x_ab` (`a ∈ A, b ∉ A`) with `Σ_{routes through r} x ≤ cap(r)` for every
// resource `r`; and any *cover* `C` (a set of resources meeting every such route) bounds it
// by LP duality: `Σ x_ab ≤ Σ_{r ∈ C} cap(r)`. A link no route uses (a GPU's PCIe link to a
// NIC that leads nowhere on a single host) is in no cover; a link every cross-group route
// shares (the PCIe bridge between two HCCS meshes, a QPI link) is a cheap one.
// The same argument over all routes bounds the total rate at which devices can receive,
// which the bytes every schedule must deliver (`received_bytes`: `2(N−1)·M` for AllReduce,
// `(N−1)·M` otherwise) are divided by.
// ---------------------------------------------------------------------------------------

/// Route-aware cut bounds are computed up to this many ranks.
pub const MAX_ROUTE_RANKS: u32 = 64;
/// Every rank subset is evaluated up to this many ranks (else singletons and hosts).
pub const MAX_EXHAUSTIVE_RANKS: u32 = 12;

/// A rank set with the capacity of covers of the routes leaving and entering it.
#[derive(Debug, Clone)]
struct RouteCut {
    /// Bitset of the ranks in the set.
    ranks: Vec<u64>,
    /// Number of ranks in it.
    k: u32,
    /// Cover capacity of the routes leaving it (GB/s).
    cap_out: f64,
    /// Cover capacity of the routes entering it (GB/s).
    cap_in: f64,
}

impl RouteCut {
    fn contains(&self, r: u32) -> bool {
        self.ranks
            .get(r as usize / 64)
            .is_some_and(|w| w >> (r % 64) & 1 == 1)
    }
}

/// Size-independent route-aware capacities of a network.
#[derive(Debug)]
struct RouteCaps {
    cuts: Vec<RouteCut>,
    /// Cover capacity of every route: the most bytes per µs·1e-3 devices can receive.
    gossip: f64,
}

type CapsCache = std::sync::Mutex<rustc_hash::FxHashMap<u64, std::sync::Arc<RouteCaps>>>;

fn caps_cache() -> &'static CapsCache {
    static CACHE: std::sync::OnceLock<CapsCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A fingerprint of everything the route-aware capacities depend on.
fn fingerprint(network: &Network) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    network.vertices.len().hash(&mut h);
    for v in &network.vertices {
        match v {
            VertexKind::Device { rank } => (0u8, *rank).hash(&mut h),
            VertexKind::Nic { bw } => (1u8, bw.to_bits()).hash(&mut h),
            VertexKind::Switch => 2u8.hash(&mut h),
        }
    }
    for l in &network.links {
        (
            l.from,
            l.to,
            l.cap.to_bits(),
            l.latency.to_bits(),
            l.network,
        )
            .hash(&mut h);
    }
    for c in &network.capacity {
        c.to_bits().hash(&mut h);
    }
    network.nic_tx.hash(&mut h);
    network.nic_rx.hash(&mut h);
    network.rank_vertex.hash(&mut h);
    network.host_of.hash(&mut h);
    h.finish()
}

fn route_caps(network: &Network) -> Option<std::sync::Arc<RouteCaps>> {
    let n = network.nranks();
    if !(2..=MAX_ROUTE_RANKS).contains(&n) {
        return None;
    }
    let key = fingerprint(network);
    let cache = caps_cache();
    if let Some(c) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Some(std::sync::Arc::clone(c));
    }
    let caps = std::sync::Arc::new(compute_route_caps(network));
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, std::sync::Arc::clone(&caps));
    Some(caps)
}

/// Every route the simulator may give each ordered pair of ranks: `(from, to, resources)`.
/// A pair may have two (switch-only and device-relayed, depending on what else its source
/// asked for at the same time); both are listed.
pub fn possible_routes(network: &Network) -> Vec<(u32, u32, Vec<u32>)> {
    let n = network.nranks();
    let mut out = Vec::new();
    for a in 0..n {
        let direct = route_tree(network, a, false);
        let all_reachable = (0..n).all(|b| b == a || direct[b as usize].is_some());
        let relayed = if all_reachable {
            None
        } else {
            Some(route_tree(network, a, true))
        };
        for b in (0..n).filter(|&b| b != a) {
            let mut seen: Vec<&Vec<u32>> = Vec::new();
            for tree in std::iter::once(&direct).chain(relayed.as_ref()) {
                if let Some(r) = &tree[b as usize]
                    && !seen.contains(&r)
                {
                    seen.push(r);
                    out.push((a, b, r.clone()));
                }
            }
        }
    }
    out
}

/// The simulator's routes from rank `src` to every rank (`None` for `src` itself and where
/// unreachable in this mode), as resource lists.
fn route_tree(network: &Network, src: u32, through_devices: bool) -> Vec<Option<Vec<u32>>> {
    let n = network.nranks();
    let dsts: Vec<u32> = (0..n).filter(|&b| b != src).collect();
    let mut tree = vec![None; n as usize];
    for (&dst, route) in dsts
        .iter()
        .zip(network.shortest_routes(src, &dsts, through_devices))
    {
        tree[dst as usize] = route.map(|r| r.resources);
    }
    tree
}

/// Bytes that devices must receive in total, whatever the schedule: every rank receives the
/// `(N−1)/N·M` it lacks (AllGather, AllToAll), every non-root the whole buffer (Broadcast),
/// and without in-network reduction every element of a reduction needs `N−1` transmissions
/// (each merges two partial values: ReduceScatter, Reduce), `2(N−1)` for AllReduce.
fn received_bytes(collective: Collective, n: u32, m: f64) -> f64 {
    let others = f64::from(n.saturating_sub(1));
    match collective {
        Collective::AllReduce => 2.0 * others * m,
        _ => others * m,
    }
}

/// Capacity of a greedy cover of `routes` (each a resource list): repeatedly takes the
/// resource with the least capacity per route it still meets. Any cover is a valid bound on
/// the rate those routes can carry together; greedy keeps it small.
fn cover_capacity(routes: &[&[u32]], capacity: &[f64]) -> f64 {
    if routes.is_empty() {
        return 0.0;
    }
    let mut through: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, r) in routes.iter().enumerate() {
        for &res in r.iter() {
            let list = through.entry(res).or_default();
            if list.last() != Some(&i) {
                list.push(i);
            }
        }
    }
    let mut covered = vec![false; routes.len()];
    let mut left = routes.len();
    let mut total = 0.0;
    let mut count: std::collections::BTreeMap<u32, usize> =
        through.iter().map(|(&r, l)| (r, l.len())).collect();
    while left > 0 {
        let pick = count
            .iter()
            .filter(|&(_, &c)| c > 0)
            .map(|(&r, &c)| (r, capacity[r as usize] / c as f64))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let Some((res, _)) = pick else {
            // A route with no resources: nothing limits it.
            return f64::INFINITY;
        };
        total += capacity[res as usize];
        for &i in &through[&res] {
            if !covered[i] {
                covered[i] = true;
                left -= 1;
                for &other in routes[i].iter() {
                    if let Some(c) = count.get_mut(&other) {
                        *c = c.saturating_sub(1);
                    }
                }
            }
        }
        count.insert(res, 0);
    }
    total
}

fn compute_route_caps(network: &Network) -> RouteCaps {
    let n = network.nranks();
    let routes = possible_routes(network);
    let all: Vec<&[u32]> = routes.iter().map(|(_, _, r)| r.as_slice()).collect();
    let gossip = cover_capacity(&all, &network.capacity);
    let words = (n as usize).div_ceil(64);
    let mut sets: Vec<Vec<u64>> = Vec::new();
    let bits = |members: &mut dyn Iterator<Item = u32>| {
        let mut w = vec![0u64; words];
        for r in members {
            w[r as usize / 64] |= 1 << (r % 64);
        }
        w
    };
    if n <= MAX_EXHAUSTIVE_RANKS {
        for mask in 1u64..(1u64 << n) - 1 {
            sets.push(vec![mask]);
        }
    } else {
        for r in 0..n {
            sets.push(bits(&mut std::iter::once(r)));
        }
        let hosts = network.nhosts;
        if hosts > 1 {
            for h in 0..hosts {
                sets.push(bits(
                    &mut (0..n).filter(|&r| network.host_of[r as usize] == h),
                ));
            }
            let step = (hosts - 1).div_ceil(MAX_PREFIX_CUTS).max(1);
            let mut j = 1;
            while j < hosts {
                sets.push(bits(
                    &mut (0..n).filter(|&r| network.host_of[r as usize] < j),
                ));
                j += step;
            }
        }
    }
    let member = |set: &[u64], r: u32| set[r as usize / 64] >> (r % 64) & 1 == 1;
    let cuts = sets
        .into_iter()
        .filter_map(|set| {
            let k = (0..n).filter(|&r| member(&set, r)).count() as u32;
            if k == 0 || k == n {
                return None;
            }
            let leaving: Vec<&[u32]> = routes
                .iter()
                .filter(|(a, b, _)| member(&set, *a) && !member(&set, *b))
                .map(|(_, _, r)| r.as_slice())
                .collect();
            let entering: Vec<&[u32]> = routes
                .iter()
                .filter(|(a, b, _)| !member(&set, *a) && member(&set, *b))
                .map(|(_, _, r)| r.as_slice())
                .collect();
            Some(RouteCut {
                k,
                cap_out: cover_capacity(&leaving, &network.capacity),
                cap_in: cover_capacity(&entering, &network.capacity),
                ranks: set,
            })
        })
        .collect();
    RouteCaps { cuts, gossip }
}
