//! Bandwidth analysis of a machine graph: max-flow between node sets, per-rank injection
//! bandwidth, the rank-to-rank bandwidth matrix, bisection bandwidth, hop diameter and the
//! host grouping. Used by the compiler's lower bounds and by `hcclc topo show`.
//!
//! Flow model: every directed edge carries at most its bandwidth (per-link bw × count),
//! clipped to `port_bw × count` when it touches a switch with a port cap; a NIC node passes at
//! most its `bw` in each direction (node split into in/out halves). Devices and switches may
//! forward traffic (relaying through a GPU is allowed), so max-flow values are upper bounds on
//! what a schedule can reach, the right side for lower bounds on time.

use crate::model::{Node, Topology};
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Flows closer than this (GB/s) are equal.
const EPS: f64 = 1e-9;

/// A flow network on dense node ids, solved with petgraph's Dinic (`algo::dinics`).
struct FlowNet {
    graph: petgraph::Graph<(), f64>,
}

impl FlowNet {
    fn new(n: usize) -> FlowNet {
        let mut graph = petgraph::Graph::with_capacity(n, 4 * n);
        for _ in 0..n {
            graph.add_node(());
        }
        FlowNet { graph }
    }

    fn add(&mut self, u: usize, v: usize, c: f64) {
        if c > 0.0 {
            self.graph.add_edge(NodeIndex::new(u), NodeIndex::new(v), c);
        }
    }

    fn max_flow(&self, s: usize, t: usize) -> f64 {
        petgraph::algo::dinics(&self.graph, NodeIndex::new(s), NodeIndex::new(t)).0
    }
}

/// Capacity of the graph edge `u -> v` after switch port caps.
fn edge_cap(topo: &Topology, u: NodeIndex, v: NodeIndex, bw: f64, count: u32) -> f64 {
    let mut cap = bw;
    for n in [u, v] {
        if let Node::Switch {
            port_bw: Some(p), ..
        } = &topo.graph[n]
        {
            cap = cap.min(p * f64::from(count));
        }
    }
    cap
}

/// Maximum total flow (GB/s) from the node set `sources` to the node set `sinks`, under the
/// flow model of this module. Returns `f64::INFINITY` when the sets share a node and 0 when
/// either is empty.
pub fn max_flow(topo: &Topology, sources: &[NodeIndex], sinks: &[NodeIndex]) -> f64 {
    if sources.is_empty() || sinks.is_empty() {
        return 0.0;
    }
    if sources.iter().any(|s| sinks.contains(s)) {
        return f64::INFINITY;
    }
    let n = topo.graph.node_count();
    let (s, t) = (2 * n, 2 * n + 1);
    // "Unbounded" capacities: more than everything the graph can carry.
    let unbounded = 1.0 + topo.graph.edge_weights().map(|e| e.bw).sum::<f64>();
    let mut net = FlowNet::new(2 * n + 2);
    for v in topo.graph.node_indices() {
        let through = match &topo.graph[v] {
            Node::Nic { bw, .. } => *bw,
            _ => unbounded,
        };
        net.add(2 * v.index(), 2 * v.index() + 1, through);
    }
    for e in topo.graph.edge_references() {
        let w = e.weight();
        let cap = edge_cap(topo, e.source(), e.target(), w.bw, w.count);
        net.add(2 * e.source().index() + 1, 2 * e.target().index(), cap);
    }
    for &v in sources {
        net.add(s, 2 * v.index(), unbounded);
    }
    for &v in sinks {
        net.add(2 * v.index() + 1, t, unbounded);
    }
    net.max_flow(s, t)
}

/// Injection bandwidth of rank `r` (GB/s): the sum of the bandwidth of its device's outgoing
/// edges, i.e. what it can send per direction with every link busy.
pub fn injection_bw(topo: &Topology, r: u32) -> f64 {
    topo.graph
        .edges(topo.ranks[r as usize])
        .map(|e| {
            edge_cap(
                topo,
                e.source(),
                e.target(),
                e.weight().bw,
                e.weight().count,
            )
        })
        .sum()
}

/// Rank-to-rank bandwidth matrix (GB/s): entry `[a][b]` is the max-flow from rank `a`'s device
/// to rank `b`'s (multi-path, relays allowed); the diagonal is 0. The graph is symmetric (two
/// equal directed edges per link), so the matrix is too and only `a < b` is computed.
pub fn bandwidth_matrix(topo: &Topology) -> Vec<Vec<f64>> {
    let n = topo.ranks.len();
    let mut m = vec![vec![0.0; n]; n];
    for (a, &va) in topo.ranks.iter().enumerate() {
        for (b, &vb) in topo.ranks.iter().enumerate().skip(a + 1) {
            let f = max_flow(topo, &[va], &[vb]);
            m[a][b] = f;
            m[b][a] = f;
        }
    }
    m
}

/// Largest rank count for which [`bisection`] enumerates every balanced cut.
pub const EXACT_BISECTION_MAX_RANKS: usize = 16;

/// The bisection bandwidth of a topology and how it was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bisection {
    /// Max-flow (GB/s, one direction) across the weakest balanced cut found.
    pub bw: f64,
    /// True when every balanced rank bipartition was tried (≤ 16 ranks); false for the
    /// heuristic, whose value is then an upper bound on the true bisection bandwidth.
    pub exact: bool,
    /// How the value was found, in words.
    pub method: String,
    /// Ranks on one side of the weakest cut (the other side is the rest).
    pub side: Vec<u32>,
}

fn cut_flow(topo: &Topology, side: &[u32]) -> f64 {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (r, &v) in topo.ranks.iter().enumerate() {
        if side.contains(&(r as u32)) {
            a.push(v);
        } else {
            b.push(v);
        }
    }
    max_flow(topo, &a, &b)
}

/// Bisection bandwidth: the minimum over balanced bipartitions of the ranks (sizes ⌊n/2⌋ and
/// ⌈n/2⌉; switches and NICs may fall on either side) of the max-flow from one half to the
/// other. Finding it is NP-hard in general: up to [`EXACT_BISECTION_MAX_RANKS`] ranks every
/// bipartition is enumerated (rank 0 fixed on one side); above, the minimum is taken over
/// three structured cuts: the first half of the ranks vs the rest, even vs odd ranks, and a
/// host-aligned cut (whole hosts, in order, until half the ranks), which is an upper bound.
/// `None` for a single rank.
pub fn bisection(topo: &Topology) -> Option<Bisection> {
    let n = topo.ranks.len();
    if n < 2 {
        return None;
    }
    let mut best: Option<(f64, Vec<u32>)> = None;
    let mut consider = |side: Vec<u32>| {
        let f = cut_flow(topo, &side);
        if best.as_ref().is_none_or(|(b, _)| f < *b - EPS) {
            best = Some((f, side));
        }
    };
    let exact = n <= EXACT_BISECTION_MAX_RANKS;
    let method;
    if exact {
        method = format!("exact: all balanced bipartitions of {n} ranks");
        let sizes: Vec<usize> = if n.is_multiple_of(2) {
            vec![n / 2]
        } else {
            vec![n / 2, n / 2 + 1]
        };
        for size in sizes {
            // Subsets of 1..n of size-1, plus rank 0.
            let mut pick: Vec<u32> = (1..size as u32).collect();
            loop {
                let mut side = vec![0u32];
                side.extend(&pick);
                consider(side);
                // Next combination of (size - 1) elements from 1..n.
                let k = pick.len();
                let mut i = k;
                let mut advanced = false;
                while i > 0 {
                    i -= 1;
                    if (pick[i] as usize) < n - (k - i) {
                        pick[i] += 1;
                        for j in i + 1..k {
                            pick[j] = pick[j - 1] + 1;
                        }
                        advanced = true;
                        break;
                    }
                }
                if !advanced {
                    break;
                }
            }
        }
    } else {
        method = format!(
            "heuristic for {n} ranks (> {EXACT_BISECTION_MAX_RANKS}): min of first-half, even/odd and host-aligned cuts; an upper bound"
        );
        consider((0..n as u32 / 2).collect());
        consider((0..n as u32).step_by(2).collect());
        let mut side = Vec::new();
        for h in 0..topo.nhosts() {
            if side.len() >= n / 2 {
                break;
            }
            side.extend(topo.ranks_of_host(h));
        }
        if !side.is_empty() && side.len() < n {
            consider(side);
        }
    }
    best.map(|(bw, side)| Bisection {
        bw,
        exact,
        method,
        side,
    })
}

/// Hop diameter: the largest number of links on a shortest path between two ranks' devices
/// (through NICs and switches). 0 for a single rank.
pub fn hop_diameter(topo: &Topology) -> u32 {
    let mut diameter = 0;
    for &src in &topo.ranks {
        let mut dist = vec![u32::MAX; topo.graph.node_count()];
        dist[src.index()] = 0;
        let mut queue = VecDeque::from([src]);
        while let Some(v) = queue.pop_front() {
            for w in topo.graph.neighbors(v) {
                if dist[w.index()] == u32::MAX {
                    dist[w.index()] = dist[v.index()] + 1;
                    queue.push_back(w);
                }
            }
        }
        for &dst in &topo.ranks {
            diameter = diameter.max(dist[dst.index()]);
        }
    }
    diameter
}

/// Ranks grouped by host: entry `h` lists the ranks of host `h` in rank order.
pub fn hosts(topo: &Topology) -> Vec<Vec<u32>> {
    topo.ranks_by_host()
}

/// One host in a [`Summary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostSummary {
    pub id: String,
    pub ranks: Vec<u32>,
}

/// Links of one kind in a [`Summary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkSummary {
    /// Link kind (`NvLink`, `Pcie`, ...).
    pub kind: String,
    /// Entries in the file.
    pub entries: usize,
    /// Physical links (sum of `count`).
    pub links: u64,
    /// Sum of per-direction bandwidth over those links (GB/s).
    pub total_bw: f64,
}

/// Everything `hcclc topo show` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub name: String,
    pub description: String,
    pub hash: String,
    pub nranks: u32,
    pub hosts: Vec<HostSummary>,
    /// Device count per `"Kind model"` label.
    pub devices: BTreeMap<String, usize>,
    pub nics: usize,
    /// Switch count per kind.
    pub switches: BTreeMap<String, usize>,
    pub links: Vec<LinkSummary>,
    /// Per-rank injection bandwidth (GB/s).
    pub injection_bw: Vec<f64>,
    /// Rank-to-rank max-flow bandwidth (GB/s).
    pub bw_matrix: Vec<Vec<f64>>,
    pub bisection: Option<Bisection>,
    pub hop_diameter: u32,
}

/// Computes the [`Summary`] of a topology.
pub fn summarize(topo: &Topology) -> Summary {
    let mut devices = BTreeMap::new();
    let mut nics = 0;
    let mut switches = BTreeMap::new();
    for node in topo.graph.node_weights() {
        match node {
            Node::Device { .. } => {}
            Node::Nic { .. } => nics += 1,
            Node::Switch { kind, .. } => *switches.entry(format!("{kind:?}")).or_insert(0) += 1,
        }
    }
    for d in topo.spec.hosts.iter().flat_map(|h| &h.devices) {
        let label = if d.model.is_empty() {
            format!("{:?}", d.kind)
        } else {
            format!("{:?} {}", d.kind, d.model)
        };
        *devices.entry(label).or_insert(0) += 1;
    }
    let mut by_kind: BTreeMap<String, LinkSummary> = BTreeMap::new();
    for l in &topo.spec.links {
        let kind = format!("{:?}", l.kind);
        let entry = by_kind.entry(kind.clone()).or_insert(LinkSummary {
            kind,
            entries: 0,
            links: 0,
            total_bw: 0.0,
        });
        entry.entries += 1;
        entry.links += u64::from(l.count);
        entry.total_bw += l.bw * f64::from(l.count);
    }
    Summary {
        name: topo.name.clone(),
        description: topo.description.clone(),
        hash: topo.hash.clone(),
        nranks: topo.nranks(),
        hosts: hosts(topo)
            .into_iter()
            .zip(&topo.hosts)
            .map(|(ranks, id)| HostSummary {
                id: id.clone(),
                ranks,
            })
            .collect(),
        devices,
        nics,
        switches,
        links: by_kind.into_values().collect(),
        injection_bw: (0..topo.nranks()).map(|r| injection_bw(topo, r)).collect(),
        bw_matrix: bandwidth_matrix(topo),
        bisection: bisection(topo),
        hop_diameter: hop_diameter(topo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate;
    use crate::parse::build;

    #[test]
    fn ring_flows_use_both_directions() {
        let topo = build(generate::ring(6, 10.0, 1.0), "ring").unwrap();
        let m = bandwidth_matrix(&topo);
        // Two disjoint paths between any two ranks of a ring.
        assert!((m[0][3] - 20.0).abs() < 1e-9);
        assert!((m[1][2] - 20.0).abs() < 1e-9);
        let b = bisection(&topo).unwrap();
        assert!(b.exact);
        assert!((b.bw - 20.0).abs() < 1e-9, "{b:?}");
        assert_eq!(hop_diameter(&topo), 3);
        assert_eq!(injection_bw(&topo, 0), 20.0);
    }

    #[test]
    fn nic_bandwidth_caps_flows_through_it() {
        let topo = build(generate::fat_tree(4, 2, 12.5, 1.0), "ft").unwrap();
        let m = bandwidth_matrix(&topo);
        assert!((m[0][3] - 12.5).abs() < 1e-9);
        let b = bisection(&topo).unwrap();
        assert!((b.bw - 25.0).abs() < 1e-9, "{b:?}");
    }

    #[test]
    fn overlapping_or_empty_sets() {
        let topo = build(generate::ring(3, 1.0, 1.0), "r").unwrap();
        let r0 = topo.ranks[0];
        assert_eq!(max_flow(&topo, &[r0], &[r0]), f64::INFINITY);
        assert_eq!(max_flow(&topo, &[], &[r0]), 0.0);
        assert!(bisection(&build(generate::ring(1, 1.0, 1.0), "r").unwrap()).is_none());
    }
}
