//! The resource network the simulator and the lower bounds share: the topology graph with
//! equivalent switches merged, every directed link and every NIC direction turned into a
//! capacity-limited *resource*, and routes between ranks.
//!
//! - **Switch merging.** Switches of the same host and kind with exactly the same neighbours
//!   (the four NVSwitch chips of a DGX H100, the spines of a rail-optimised cluster) are one
//!   switch for routing: traffic spreads over them evenly, which is what equal-cost
//!   multipath and NVSwitch link striping do. Their links to a common neighbour add up.
//! - **Capacities.** A directed link carries its bandwidth (per-link bandwidth × count),
//!   capped by the switch port bandwidth at either end (× count). A NIC adds two resources
//!   with its bandwidth: *tx* for traffic it sends onto the network, *rx* for traffic it
//!   hands to the host.
//! - **Routes.** A transfer from rank `a` to rank `b` takes the path of least latency and,
//!   among those, the widest bottleneck, through switches and NICs only (devices do not
//!   forward in hardware). Only when no such path exists may it pass through other devices
//!   (e.g. GPUs without a common switch): that models a runtime relaying through them.

use super::error::CostError;
use super::model::LinkClass;
use hccl_topologies::{LinkKind, Node, Topology};
use rustc_hash::FxHashMap;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};

/// Sources above which [`Network::routes`] searches on several threads.
pub const PARALLEL_ROUTE_SOURCES: usize = 256;

/// What a vertex of the resource network is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VertexKind {
    /// The device of a rank.
    Device { rank: u32 },
    /// A NIC with its per-direction bandwidth (GB/s).
    Nic { bw: f64 },
    /// A switch (possibly several merged ones).
    Switch,
}

/// A directed, aggregated link.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub from: u32,
    pub to: u32,
    /// Capacity in GB/s (per direction).
    pub cap: f64,
    /// Hop latency in µs.
    pub latency: f64,
    pub class: LinkClass,
    /// Whether the link leaves the host (network kind).
    pub network: bool,
    /// The topology's kind of the link (of the first, where links of several kinds were
    /// aggregated).
    pub kind: LinkKind,
}

/// A route between two ranks: the resources it occupies and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Resource ids, in path order (links interleaved with NIC directions).
    pub resources: Vec<u32>,
    /// Sum of the hop latencies (µs).
    pub latency_us: f64,
    /// The slowest class of link on the route.
    pub class: LinkClass,
    /// Smallest capacity along the route (GB/s).
    pub bottleneck: f64,
    /// Number of links.
    pub hops: u32,
}

/// The resource network of a topology; build once, use for many simulations.
#[derive(Debug)]
pub struct Network {
    /// Vertex kinds.
    pub vertices: Vec<VertexKind>,
    /// Aggregated directed links; resource `i < links.len()` is link `i`.
    pub links: Vec<Link>,
    /// Outgoing link ids per vertex, in a deterministic order.
    pub out: Vec<Vec<u32>>,
    /// Capacity of every resource (GB/s).
    pub capacity: Vec<f64>,
    /// Resource of the NIC's transmit direction, per vertex (NICs only).
    pub nic_tx: Vec<Option<u32>>,
    /// Resource of the NIC's receive direction, per vertex (NICs only).
    pub nic_rx: Vec<Option<u32>>,
    /// Vertex of each rank.
    pub rank_vertex: Vec<u32>,
    /// Host of each rank.
    pub host_of: Vec<usize>,
    /// Host of each vertex, when it belongs to one.
    pub vertex_host: Vec<Option<usize>>,
    /// Memory bandwidth of each rank (GB/s).
    pub mem_bw: Vec<f64>,
    /// Number of hosts.
    pub nhosts: usize,
    /// Hash of the topology this network was built from (keys solver caches).
    pub topo_hash: String,
    /// Topology graph node of each vertex (of merged switches, the first) and how many
    /// graph nodes it stands for: what [`Network::resource_name`] names.
    pub vertex_node: Vec<(u32, u32)>,
    routes: Mutex<FxHashMap<(u32, u32), Arc<Route>>>,
    /// Held while routes for the cache are searched: one search at a time (each on all
    /// threads when large), so two candidates needing the same routes search them once.
    routing: Mutex<()>,
    /// The AllToAll flow rate ([`Network::alltoall_rate`], in `mcf.rs`), computed on first
    /// use.
    pub(super) alltoall: std::sync::OnceLock<Option<f64>>,
    /// Links by their ends and per vertex the links into it, built on first use.
    adjacency: std::sync::OnceLock<Adjacency>,
    /// The automorphism moving every rank to the next host, if the network has it.
    shift: std::sync::OnceLock<Option<Shift>>,
    /// The bandwidth bound's cuts and their capacities, found on first use (a `CutCaps` of
    /// `bounds.rs`, which reads it back; held untyped so that the network does not depend on
    /// the bounds).
    pub(super) cut_caps: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
}

/// An automorphism of the network as orbits: that of every rank and every resource, and
/// each one's position in its orbit, so that its `k`-th power maps anything in one lookup.
/// Routes are searched from one rank of each rank orbit (one host's ranks for a shift by a
/// host) and carried to the others ([`Network::routes`]).
#[derive(Debug)]
struct Shift {
    rank_at: Vec<(u32, u32)>,
    rank_orbits: Vec<Vec<u32>>,
    res_at: Vec<(u32, u32)>,
    res_orbits: Vec<Vec<u32>>,
}

/// Every element's (orbit, position) and the orbits, as [`orbits`] finds them.
type Orbits = (Vec<(u32, u32)>, Vec<Vec<u32>>);

/// The orbits of the permutation `next` of `0..n`, and each element's (orbit, position):
/// an orbit lists `x, next(x), next(next(x)), …` from its least element. `None` when `next`
/// is not a permutation.
fn orbits(n: usize, next: impl Fn(u32) -> u32) -> Option<Orbits> {
    let mut at = vec![(u32::MAX, 0u32); n];
    let mut list: Vec<Vec<u32>> = Vec::new();
    for start in 0..n {
        if at[start].0 != u32::MAX {
            continue;
        }
        let id = list.len() as u32;
        let mut orbit = Vec::new();
        let mut x = start as u32;
        loop {
            if x as usize >= n || at[x as usize].0 != u32::MAX {
                return None; // lands inside another orbit or outside: not a permutation
            }
            at[x as usize] = (id, orbit.len() as u32);
            orbit.push(x);
            x = next(x);
            if x as usize == start {
                break;
            }
        }
        list.push(orbit);
    }
    Some((at, list))
}

impl Shift {
    /// `(a0, b0, k)`: the pair whose image under the `k`-th power is `(a, b)`, `a0` the first
    /// of its orbit.
    fn canonical(&self, a: u32, b: u32) -> (u32, u32, u32) {
        let (oa, k) = self.rank_at[a as usize];
        let (ob, pb) = self.rank_at[b as usize];
        let orbit = &self.rank_orbits[ob as usize];
        let len = orbit.len() as u32;
        let b0 = orbit[((pb + len - k % len) % len) as usize];
        (self.rank_orbits[oa as usize][0], b0, k)
    }

    /// The image of resource `r` under the `k`-th power.
    fn resource(&self, r: u32, k: u32) -> u32 {
        let (o, p) = self.res_at[r as usize];
        let orbit = &self.res_orbits[o as usize];
        orbit[((p + k) % orbit.len() as u32) as usize]
    }
}

/// What finding an [`Automorphism`] looks links up by.
#[derive(Debug)]
struct Adjacency {
    by_ends: FxHashMap<(u32, u32), u32>,
    into: Vec<Vec<u32>>,
}

/// A permutation of the resource network's vertices that maps every link onto a link of
/// exactly the same capacity, latency, class and kind, every NIC onto a NIC of the same
/// bandwidth and every rank's device onto a rank's device: the network looks the same from
/// every image, so the route search finds the image of every route that was its only best
/// path ([`Network::unique_routes`]). Found by [`Network::automorphism`].
#[derive(Debug, Clone)]
pub struct Automorphism {
    resource: Vec<u32>,
}

impl Automorphism {
    /// The image of a resource (a link or a NIC direction).
    pub fn resource(&self, r: u32) -> u32 {
        self.resource[r as usize]
    }
}

impl Route {
    /// This route's image under a map of resources (an automorphism's power): the same
    /// latency, class, bottleneck and hops.
    fn carried(&self, map: impl Fn(u32) -> u32) -> Route {
        Route {
            resources: self.resources.iter().map(|&r| map(r)).collect(),
            latency_us: self.latency_us,
            class: self.class,
            bottleneck: self.bottleneck,
            hops: self.hops,
        }
    }
}

/// Whether two links are alike in everything a route search or a simulation reads.
fn same_link(a: &Link, b: &Link) -> bool {
    a.cap.to_bits() == b.cap.to_bits()
        && a.latency.to_bits() == b.latency.to_bits()
        && a.class == b.class
        && a.network == b.network
}

thread_local! {
    /// Per-thread buffers of [`Network::switched_routes`].
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Buffers of one route search, valid where stamped with the current epoch.
#[derive(Default)]
struct Scratch {
    epoch: u32,
    /// Epoch of each vertex's label, of its being final, of its being a destination.
    labelled: Vec<u32>,
    done: Vec<u32>,
    target: Vec<u32>,
    best: Vec<Label>,
    pred: Vec<u32>,
    /// Epoch of a vertex whose best label two different links gave (a tie the search broke
    /// by the order it relaxed them).
    tied: Vec<u32>,
    heap: BinaryHeap<HeapItem>,
    /// Labels destinations reached, best first.
    reached: BinaryHeap<HeapItem>,
}

impl Scratch {
    fn reset(&mut self, nv: usize) {
        if self.labelled.len() != nv || self.epoch == u32::MAX {
            let zero = Label {
                latency: 0.0,
                width: 0.0,
                hops: 0,
            };
            *self = Scratch {
                epoch: 0,
                labelled: vec![0; nv],
                done: vec![0; nv],
                target: vec![0; nv],
                best: vec![zero; nv],
                pred: vec![u32::MAX; nv],
                tied: vec![0; nv],
                heap: BinaryHeap::new(),
                reached: BinaryHeap::new(),
            };
        }
        self.epoch += 1;
        self.heap.clear();
        self.reached.clear();
    }

    fn get(&self, v: usize) -> Option<Label> {
        (self.labelled[v] == self.epoch).then(|| self.best[v])
    }

    fn set(&mut self, v: usize, label: Label, pred: u32) {
        self.labelled[v] = self.epoch;
        self.best[v] = label;
        self.pred[v] = pred;
        self.tied[v] = 0;
    }

    /// Whether the path the search keeps to `end` was its only best one: no vertex on it
    /// (past `start`) was reached by two links with the same label.
    fn unique(&self, start: u32, end: u32, links: &[Link]) -> bool {
        let mut v = end;
        while v != start {
            if self.tied[v as usize] == self.epoch {
                return false;
            }
            v = links[self.pred[v as usize] as usize].from;
        }
        true
    }
}

/// Whether two labels are the same (neither better).
fn same_label(a: &Label, b: &Label) -> bool {
    !a.better(b) && !b.better(a)
}

/// Dijkstra label: least latency first, then the widest bottleneck, then fewer hops.
#[derive(Debug, Clone, Copy)]
struct Label {
    latency: f64,
    width: f64,
    hops: u32,
}

impl Label {
    fn better(&self, other: &Label) -> bool {
        match self.latency.total_cmp(&other.latency) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => match self.width.total_cmp(&other.width) {
                Ordering::Greater => true,
                Ordering::Less => false,
                Ordering::Equal => self.hops < other.hops,
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct HeapItem {
    label: Label,
    vertex: u32,
}

impl PartialEq for HeapItem {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeapItem {
    // Reversed: BinaryHeap is a max-heap and we want the best label first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .label
            .latency
            .total_cmp(&self.label.latency)
            .then(self.label.width.total_cmp(&other.label.width))
            .then(other.label.hops.cmp(&self.label.hops))
            .then(other.vertex.cmp(&self.vertex))
    }
}

impl Network {
    /// Builds the resource network of `topo`.
    pub fn new(topo: &Topology) -> Network {
        let g = &topo.graph;
        let n = g.node_count();
        // Merge switches with identical (host, kind, neighbour set).
        let mut neighbours: Vec<Vec<usize>> = vec![Vec::new(); n];
        for e in g.edge_indices() {
            if let Some((a, b)) = g.edge_endpoints(e) {
                neighbours[a.index()].push(b.index());
                neighbours[b.index()].push(a.index());
            }
        }
        for list in &mut neighbours {
            list.sort_unstable();
            list.dedup();
        }
        let mut rep: Vec<usize> = (0..n).collect();
        let mut groups: BTreeMap<(String, Vec<usize>), usize> = BTreeMap::new();
        for (i, node) in g.node_indices().map(|ix| (ix.index(), &g[ix])) {
            if let Node::Switch { kind, host, .. } = node {
                let key = (format!("{kind:?}/{host:?}"), neighbours[i].clone());
                rep[i] = *groups.entry(key).or_insert(i);
            }
        }
        // Dense vertex numbering over representatives, in node order.
        let mut vid = vec![u32::MAX; n];
        let mut vertices = Vec::new();
        let mut vertex_host = Vec::new();
        let mut vertex_node = Vec::new();
        let mut merged = vec![0u32; n];
        for &r in &rep {
            merged[r] += 1;
        }
        for i in 0..n {
            if rep[i] != i {
                continue;
            }
            vid[i] = vertices.len() as u32;
            vertex_node.push((i as u32, merged[i]));
            let node = &g[petgraph::graph::NodeIndex::new(i)];
            vertices.push(match node {
                Node::Device { rank, .. } => VertexKind::Device { rank: *rank },
                Node::Nic { bw, .. } => VertexKind::Nic { bw: *bw },
                Node::Switch { .. } => VertexKind::Switch,
            });
            vertex_host.push(match node {
                Node::Device { host, .. } | Node::Nic { host, .. } => Some(*host),
                Node::Switch { host, .. } => *host,
            });
        }
        for i in 0..n {
            vid[i] = vid[rep[i]];
        }
        let port_bw = |i: usize| match &g[petgraph::graph::NodeIndex::new(i)] {
            Node::Switch { port_bw, .. } => *port_bw,
            _ => None,
        };
        // Aggregate directed edges by (from, to).
        let mut agg: BTreeMap<(u32, u32), Link> = BTreeMap::new();
        for e in g.edge_indices() {
            let Some((a, b)) = g.edge_endpoints(e) else {
                continue;
            };
            let (va, vb) = (vid[a.index()], vid[b.index()]);
            if va == vb {
                continue;
            }
            let w = &g[e];
            let mut cap = w.bw;
            for end in [a.index(), b.index()] {
                if let Some(p) = port_bw(end) {
                    cap = cap.min(p * f64::from(w.count.max(1)));
                }
            }
            if cap.is_nan() || cap <= 0.0 || !cap.is_finite() {
                continue;
            }
            let latency = if w.latency.is_finite() && w.latency > 0.0 {
                w.latency
            } else {
                0.0
            };
            let class = LinkClass::of(w.kind);
            agg.entry((va, vb))
                .and_modify(|l| {
                    l.cap += cap;
                    l.latency = l.latency.min(latency);
                    l.class = l.class.max(class);
                })
                .or_insert(Link {
                    from: va,
                    to: vb,
                    cap,
                    latency,
                    class,
                    network: w.kind.is_network(),
                    kind: w.kind,
                });
        }
        let links: Vec<Link> = agg.into_values().collect();
        let mut out = vec![Vec::new(); vertices.len()];
        for (i, l) in links.iter().enumerate() {
            out[l.from as usize].push(i as u32);
        }
        let mut capacity: Vec<f64> = links.iter().map(|l| l.cap).collect();
        let mut nic_tx = vec![None; vertices.len()];
        let mut nic_rx = vec![None; vertices.len()];
        for (v, kind) in vertices.iter().enumerate() {
            if let VertexKind::Nic { bw } = kind {
                // A NIC without a usable bandwidth is limited by its links only.
                if !(*bw > 0.0 && bw.is_finite()) {
                    continue;
                }
                let bw = *bw;
                nic_tx[v] = Some(capacity.len() as u32);
                capacity.push(bw);
                nic_rx[v] = Some(capacity.len() as u32);
                capacity.push(bw);
            }
        }
        let rank_vertex = topo.ranks.iter().map(|ix| vid[ix.index()]).collect();
        let mem_bw = (0..topo.nranks()).map(|r| topo.mem_bw(r)).collect();
        Network {
            vertices,
            links,
            out,
            capacity,
            nic_tx,
            nic_rx,
            rank_vertex,
            host_of: topo.host_of.clone(),
            vertex_host,
            mem_bw,
            nhosts: topo.nhosts(),
            topo_hash: topo.hash.clone(),
            vertex_node,
            routes: Mutex::new(FxHashMap::default()),
            routing: Mutex::new(()),
            alltoall: std::sync::OnceLock::new(),
            adjacency: std::sync::OnceLock::new(),
            shift: std::sync::OnceLock::new(),
            cut_caps: std::sync::OnceLock::new(),
        }
    }

    /// The automorphism that moves the `i`-th rank of every host to the `i`-th rank of the
    /// next host (the last host to the first), as orbits; `None` when hosts hold different
    /// numbers of ranks or that map is not an automorphism (it is on clusters of identical
    /// boxes behind rail or leaf switches every host reaches alike).
    fn shift(&self) -> Option<&Shift> {
        self.shift
            .get_or_init(|| {
                let n = self.rank_vertex.len();
                if self.nhosts < 2 || self.host_of.len() != n {
                    return None;
                }
                let mut by_host: Vec<Vec<u32>> = vec![Vec::new(); self.nhosts];
                for (r, &h) in self.host_of.iter().enumerate() {
                    by_host.get_mut(h)?.push(r as u32);
                }
                let g = by_host[0].len();
                if g == 0 || by_host.iter().any(|h| h.len() != g) {
                    return None;
                }
                let mut image = vec![0u32; n];
                for (h, ranks) in by_host.iter().enumerate() {
                    let next = &by_host[(h + 1) % self.nhosts];
                    for (&r, &to) in ranks.iter().zip(next) {
                        image[r as usize] = to;
                    }
                }
                let auto = self.automorphism(&image)?;
                let (rank_at, rank_orbits) = orbits(n, |r| image[r as usize])?;
                let (res_at, res_orbits) = orbits(self.capacity.len(), |r| auto.resource(r))?;
                Some(Shift {
                    rank_at,
                    rank_orbits,
                    res_at,
                    res_orbits,
                })
            })
            .as_ref()
    }

    /// Whether routes are searched from one host's ranks and carried to the others by the
    /// shift of every rank to the next host (see [`Network::routes`]).
    pub fn shifts_routes(&self) -> bool {
        self.shift().is_some()
    }

    /// Routes for `pairs` (same order; checked, distinct ends). Where the network has a
    /// [`Shift`], a pair's route is searched as its canonical pair's (from the first rank of
    /// its source's orbit: one host's ranks search for everyone) and carried over by the
    /// shift's power, when the canonical route is the search's only best path (so its image
    /// is exactly what a search from the pair's own source finds, see
    /// [`Network::unique_routes`]); other pairs are searched from their own sources.
    fn find_routes(&self, pairs: &[(u32, u32)]) -> Result<Vec<Route>, CostError> {
        let Some(shift) = self.shift() else {
            return self.search_pairs(pairs);
        };
        let canon: Vec<(u32, u32, u32)> =
            pairs.iter().map(|&(a, b)| shift.canonical(a, b)).collect();
        let batches = batches(canon.iter().map(|&(a0, b0, _)| (a0, b0)));
        let found: Vec<Vec<Option<(Route, bool)>>> = batches
            .iter()
            .map(|(src, dsts)| {
                SCRATCH.with(|scratch| self.switched_routes(&mut scratch.borrow_mut(), *src, dsts))
            })
            .collect();
        let mut out: Vec<Option<Route>> = Vec::with_capacity(pairs.len());
        let mut left: Vec<(u32, u32)> = Vec::new();
        for (&(a, b), &(a0, b0, k)) in pairs.iter().zip(&canon) {
            let (i, j) = batch_slot(&batches, a0, b0);
            match &found[i][j] {
                Some((route, true)) => out.push(Some(route.carried(|r| shift.resource(r, k)))),
                _ => {
                    out.push(None);
                    left.push((a, b));
                }
            }
        }
        let mut searched = self.search_pairs(&left)?.into_iter();
        out.into_iter()
            .zip(pairs)
            .map(|(r, &(a, b))| {
                r.or_else(|| searched.next())
                    .ok_or(CostError::NoRoute { from: a, to: b })
            })
            .collect()
    }

    /// Routes for `pairs` (same order; checked, distinct ends), each searched from its own
    /// source ([`Network::search`]).
    fn search_pairs(&self, pairs: &[(u32, u32)]) -> Result<Vec<Route>, CostError> {
        let batches = batches(pairs.iter().copied());
        let found = self
            .search(&batches)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        Ok(pairs
            .iter()
            .map(|&(a, b)| {
                let (i, j) = batch_slot(&batches, a, b);
                found[i][j].clone()
            })
            .collect())
    }

    fn adjacency(&self) -> &Adjacency {
        self.adjacency.get_or_init(|| {
            let mut into = vec![Vec::new(); self.vertices.len()];
            let mut by_ends =
                FxHashMap::with_capacity_and_hasher(self.links.len(), Default::default());
            for (i, l) in self.links.iter().enumerate() {
                into[l.to as usize].push(i as u32);
                by_ends.insert((l.from, l.to), i as u32);
            }
            Adjacency { by_ends, into }
        })
    }

    /// The automorphism of this network that takes rank `r`'s device to rank `image[r]`'s,
    /// if there is one this finds: the other vertices are matched outward from the devices
    /// (each to the first free neighbour of its neighbour's image whose links to every
    /// vertex matched so far have equal counterparts), and the whole map is then checked
    /// link by link. `None` when the ranks' images are not a permutation, when matching
    /// gets stuck, or when the check fails (the map is then not an automorphism; a
    /// network with one may still be missed where twins make the first free match wrong).
    pub fn automorphism(&self, image: &[u32]) -> Option<Automorphism> {
        const FREE: u32 = u32::MAX;
        let nv = self.vertices.len();
        if image.len() != self.rank_vertex.len() {
            return None;
        }
        let adj = self.adjacency();
        let mut vmap = vec![FREE; nv];
        let mut used = vec![false; nv];
        let mut queue = std::collections::VecDeque::new();
        for (r, &v) in self.rank_vertex.iter().enumerate() {
            let w = *self.rank_vertex.get(image[r] as usize)?;
            if used[w as usize] || vmap[v as usize] != FREE {
                return None;
            }
            vmap[v as usize] = w;
            used[w as usize] = true;
            queue.push_back(v);
        }
        let same_kind =
            |v: u32, w: u32| match (self.vertices[v as usize], self.vertices[w as usize]) {
                (VertexKind::Nic { bw: a }, VertexKind::Nic { bw: b }) => {
                    a.to_bits() == b.to_bits()
                }
                (VertexKind::Switch, VertexKind::Switch) => true,
                _ => false,
            };
        // Whether `w` can be `v`'s image: free, alike, and linked to the image of every
        // matched neighbour of `v` as `v` is to it.
        let fits = |vmap: &[u32], used: &[bool], v: u32, w: u32| -> bool {
            if used[w as usize] || !same_kind(v, w) {
                return false;
            }
            let out = self.out[v as usize].iter().map(|&li| {
                let l = &self.links[li as usize];
                (l, vmap[l.to as usize], true)
            });
            let inc = adj.into[v as usize].iter().map(|&li| {
                let l = &self.links[li as usize];
                (l, vmap[l.from as usize], false)
            });
            out.chain(inc).all(|(l, fx, outward)| {
                if fx == FREE {
                    return true;
                }
                let ends = if outward { (w, fx) } else { (fx, w) };
                adj.by_ends
                    .get(&ends)
                    .is_some_and(|&m| same_link(l, &self.links[m as usize]))
            })
        };
        // The vertices a link joins to `v`, either way.
        let neighbours = |v: u32| {
            let out = self.out[v as usize]
                .iter()
                .map(|&li| self.links[li as usize].to);
            let inc = adj.into[v as usize]
                .iter()
                .map(|&li| self.links[li as usize].from);
            out.chain(inc)
        };
        while let Some(u) = queue.pop_front() {
            let fu = vmap[u as usize];
            for v in neighbours(u) {
                if vmap[v as usize] != FREE {
                    continue;
                }
                let mut found = FREE;
                for w in neighbours(fu) {
                    if fits(&vmap, &used, v, w) {
                        found = w;
                        break;
                    }
                }
                if found == FREE {
                    return None;
                }
                vmap[v as usize] = found;
                used[found as usize] = true;
                queue.push_back(v);
            }
        }
        if vmap.contains(&FREE) {
            return None;
        }
        let mut resource = vec![FREE; self.capacity.len()];
        for (i, l) in self.links.iter().enumerate() {
            let m = *adj
                .by_ends
                .get(&(vmap[l.from as usize], vmap[l.to as usize]))?;
            if !same_link(l, &self.links[m as usize]) {
                return None;
            }
            resource[i] = m;
        }
        for v in 0..nv {
            let w = vmap[v] as usize;
            if let VertexKind::Device { .. } = self.vertices[v] {
                continue; // matched by rank above
            }
            if !same_kind(v as u32, w as u32) {
                return None;
            }
            for dir in [&self.nic_tx, &self.nic_rx] {
                match (dir[v], dir[w]) {
                    (Some(a), Some(b)) => resource[a as usize] = b,
                    (None, None) => {}
                    _ => return None,
                }
            }
        }
        // Links are matched injectively (distinct ends), NIC directions by vertex: a
        // permutation exactly when nothing was left out.
        if resource.contains(&FREE) {
            return None;
        }
        Some(Automorphism { resource })
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.rank_vertex.len() as u32
    }

    /// A reader's name of resource `r` of the network built from `topo`: a link as its
    /// kind and ends (`NVLink gpu3→gpu5`), a NIC direction as `NIC n1.nic0 out` / `in`; a vertex that
    /// stands for `k` merged switches is its first switch's id and `×k`.
    pub fn resource_name(&self, topo: &Topology, r: u32) -> String {
        let vertex = |v: u32| -> String {
            let Some(&(node, merged)) = self.vertex_node.get(v as usize) else {
                return format!("vertex {v}");
            };
            let id = topo
                .graph
                .node_weight(petgraph::graph::NodeIndex::new(node as usize))
                .map_or_else(|| format!("node {node}"), |n| n.id().to_string());
            if merged > 1 {
                format!("{id}×{merged}")
            } else {
                id
            }
        };
        if let Some(l) = self.links.get(r as usize) {
            return format!("{} {}→{}", l.kind.label(), vertex(l.from), vertex(l.to));
        }
        let nic = |dirs: &[Option<u32>]| dirs.iter().position(|&x| x == Some(r));
        if let Some(v) = nic(&self.nic_tx) {
            return format!("NIC {} out", vertex(v as u32));
        }
        if let Some(v) = nic(&self.nic_rx) {
            return format!("NIC {} in", vertex(v as u32));
        }
        format!("resource {r}")
    }

    /// The NIC direction resource a flow leaving `link`'s source uses, if it is a NIC.
    pub fn nic_resource(&self, link: u32) -> Option<u32> {
        let l = &self.links[link as usize];
        if l.network {
            self.nic_tx[l.from as usize]
        } else {
            self.nic_rx[l.from as usize]
        }
    }

    /// Routes for every pair in `pairs` (same order), computing missing ones.
    ///
    /// Where moving every rank to the next host is an automorphism of the network (clusters
    /// of identical boxes), routes are searched from one host's ranks only and carried to
    /// the others ([`Network::shifts_routes`]): what every rank's own search finds, at one
    /// host's cost (32,768 ranks: 8 searches instead of 32,768).
    ///
    /// The cache is locked only to look routes up and to add the new ones, so lookups go
    /// on while routes are searched; searches for the cache take turns (one candidate's
    /// missing routes at a time, looked up again once it is their turn, so routes two
    /// candidates share are searched once), and a large batch (more than
    /// [`PARALLEL_ROUTE_SOURCES`] sources) is searched on all available threads.
    pub fn routes(&self, pairs: &[(u32, u32)]) -> Result<Vec<Arc<Route>>, CostError> {
        let n = self.nranks();
        let missing_of = |cache: &FxHashMap<(u32, u32), Arc<Route>>| {
            let mut missing: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for &(a, b) in pairs {
                if a >= n || b >= n || a == b {
                    return Err(CostError::BadPeer { from: a, to: b });
                }
                if !cache.contains_key(&(a, b)) {
                    missing.entry(a).or_default().push(b);
                }
            }
            Ok(missing)
        };
        let mut missing = missing_of(&self.route_cache())?;
        let _turn = if missing.is_empty() {
            None
        } else {
            let turn = self
                .routing
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            missing = missing_of(&self.route_cache())?;
            Some(turn)
        };
        let missing: Vec<(u32, u32)> = distinct_destinations(missing)
            .into_iter()
            .flat_map(|(src, dsts)| dsts.into_iter().map(move |dst| (src, dst)))
            .collect();
        let found = self.find_routes(&missing)?;
        let mut cache = self.route_cache();
        for (pair, route) in missing.into_iter().zip(found) {
            cache.entry(pair).or_insert_with(|| Arc::new(route));
        }
        Ok(pairs.iter().map(|p| Arc::clone(&cache[p])).collect())
    }

    /// Routes for every pair in `pairs` (same order), searched without the cache (neither
    /// read nor filled): for batches whose routes are used once, such as every translate
    /// of a template's peers ([`Simulator::prepare_symmetric`](super::Simulator)), which
    /// would fill the cache with millions of routes on thousands of ranks.
    pub fn routes_uncached(&self, pairs: &[(u32, u32)]) -> Result<Vec<Route>, CostError> {
        let n = self.nranks();
        if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a >= n || b >= n || a == b) {
            return Err(CostError::BadPeer { from: a, to: b });
        }
        self.find_routes(pairs)
    }

    /// The routes from each source to its (sorted, distinct) destinations, searched on all
    /// available threads when there are more than [`PARALLEL_ROUTE_SOURCES`] sources.
    fn search(&self, batches: &[(u32, Vec<u32>)]) -> Vec<Result<Vec<Route>, CostError>> {
        let search = |(src, dsts): &(u32, Vec<u32>)| -> Result<Vec<Route>, CostError> {
            let mut found = self.shortest_routes(*src, dsts, false);
            if found.iter().any(Option::is_none) {
                found = self.shortest_routes(*src, dsts, true);
            }
            dsts.iter()
                .zip(found)
                .map(|(&dst, route)| {
                    route.ok_or(CostError::NoRoute {
                        from: *src,
                        to: dst,
                    })
                })
                .collect()
        };
        let threads = hccl_ir::par::cores();
        if batches.len() <= PARALLEL_ROUTE_SOURCES || threads <= 1 {
            return batches.iter().map(search).collect();
        }
        let per = batches.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = batches
                .chunks(per)
                .map(|part| scope.spawn(move || part.iter().map(search).collect::<Vec<_>>()))
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    }

    /// The route cache, also after a panic elsewhere (its entries are whole routes).
    fn route_cache(&self) -> std::sync::MutexGuard<'_, FxHashMap<(u32, u32), Arc<Route>>> {
        self.routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The route the simulator gives rank `src` to each of `dsts` (same order): least
    /// latency, then widest, then fewest hops; devices are transit vertices only when
    /// `through_devices` is set. `None` for a destination unreachable that way. The lower
    /// bounds read the same routes, so bound and simulator can never disagree about paths.
    pub fn shortest_routes(
        &self,
        src: u32,
        dsts: &[u32],
        through_devices: bool,
    ) -> Vec<Option<Route>> {
        if through_devices {
            self.shortest_routes_through_devices(src, dsts)
        } else {
            SCRATCH.with(|scratch| {
                self.switched_routes(&mut scratch.borrow_mut(), src, dsts)
                    .into_iter()
                    .map(|found| found.map(|(route, _)| route))
                    .collect()
            })
        }
    }

    /// The routes [`Network::shortest_routes`] gives `src` to each of `dsts`, when each is
    /// the only best path there is through switches and NICs (no vertex on it was reached
    /// by two links with the same label, so the search's order of relaxing links decided
    /// nothing); `None` otherwise. A unique route's image under an [`Automorphism`] is the
    /// unique route between the images of its ends (the search sees the same labels there),
    /// which is what lets a carried route stand for a search.
    pub fn unique_routes(&self, src: u32, dsts: &[u32]) -> Option<Vec<Route>> {
        SCRATCH.with(|scratch| {
            self.switched_routes(&mut scratch.borrow_mut(), src, dsts)
                .into_iter()
                .map(|found| found.and_then(|(route, unique)| unique.then_some(route)))
                .collect()
        })
    }

    /// [`Network::shortest_routes`] through switches and NICs only: the same search, but
    /// devices (which never forward) are not queued; a device's label is kept as links
    /// reach it, in the order the full search would relax them, and the search stops once
    /// every destination's label is no worse than the best queued one (nothing queued can
    /// better it then: every hop makes a label strictly worse). Scratch buffers are kept
    /// per thread and reset by epoch, not cleared. The routes are exactly those of the full
    /// search (tested), at about half the work on clusters, where devices are half the
    /// vertices.
    ///
    /// Each route comes with whether it was the search's only best path (see
    /// [`Network::unique_routes`]).
    fn switched_routes(
        &self,
        sc: &mut Scratch,
        src: u32,
        dsts: &[u32],
    ) -> Vec<Option<(Route, bool)>> {
        let nv = self.vertices.len();
        sc.reset(nv);
        let epoch = sc.epoch;
        let start = self.rank_vertex[src as usize];
        let mut remaining = 0usize;
        for &d in dsts {
            let v = self.rank_vertex[d as usize] as usize;
            if sc.target[v] != epoch {
                sc.target[v] = epoch;
                remaining += 1;
            }
        }
        let first = Label {
            latency: 0.0,
            width: f64::INFINITY,
            hops: 0,
        };
        sc.set(start as usize, first, u32::MAX);
        sc.heap.push(HeapItem {
            label: first,
            vertex: start,
        });
        while remaining > 0 {
            // Destinations no worse than the best queued label are final.
            while let Some(t) = sc.reached.peek().copied() {
                if let Some(head) = sc.heap.peek()
                    && head.label.better(&t.label)
                {
                    break;
                }
                sc.reached.pop();
                let tv = t.vertex as usize;
                if sc.done[tv] != epoch && sc.get(tv).is_some_and(|l| same_label(&l, &t.label)) {
                    sc.done[tv] = epoch;
                    remaining -= 1;
                }
            }
            let Some(HeapItem { label, vertex }) = sc.heap.pop() else {
                break;
            };
            let v = vertex as usize;
            if remaining == 0 {
                break;
            }
            if sc.done[v] == epoch {
                continue;
            }
            sc.done[v] = epoch;
            for &li in &self.out[v] {
                let l = &self.links[li as usize];
                let next = self.extend(&label, li);
                let t = l.to as usize;
                if sc.done[t] == epoch {
                    continue;
                }
                match sc.get(t) {
                    Some(b) if !next.better(&b) => {
                        if same_label(&next, &b) {
                            sc.tied[t] = epoch;
                        }
                        continue;
                    }
                    _ => {}
                }
                sc.set(t, next, li);
                let item = HeapItem {
                    label: next,
                    vertex: l.to,
                };
                if matches!(self.vertices[t], VertexKind::Device { .. }) {
                    if sc.target[t] == epoch {
                        sc.reached.push(item);
                    }
                } else {
                    sc.heap.push(item);
                }
            }
        }
        // Whatever is left queued cannot better a reached destination.
        let out = dsts
            .iter()
            .map(|&d| {
                let v = self.rank_vertex[d as usize];
                sc.get(v as usize)?;
                let route = self.route_along(start, v, |x| sc.pred[x as usize]);
                Some((route, sc.unique(start, v, &self.links)))
            })
            .collect();
        sc.heap.clear();
        sc.reached.clear();
        out
    }

    /// `label` one hop further, over link `li` (and its NIC direction, if any).
    fn extend(&self, label: &Label, li: u32) -> Label {
        let l = &self.links[li as usize];
        let mut width = label.width.min(l.cap);
        if let Some(r) = self.nic_resource(li) {
            width = width.min(self.capacity[r as usize]);
        }
        Label {
            latency: label.latency + l.latency,
            width,
            hops: label.hops + 1,
        }
    }

    /// The route from `start` to `end` following `pred` (the link that reached a vertex).
    fn route_along(&self, start: u32, end: u32, pred: impl Fn(u32) -> u32) -> Route {
        let mut v = end;
        let mut path = Vec::new();
        while v != start {
            let li = pred(v);
            path.push(li);
            v = self.links[li as usize].from;
        }
        path.reverse();
        let mut resources = Vec::with_capacity(path.len() * 2);
        let mut class = LinkClass::NvLink;
        let mut latency = 0.0;
        let mut bottleneck = f64::INFINITY;
        for &li in &path {
            let l = &self.links[li as usize];
            resources.push(li);
            bottleneck = bottleneck.min(l.cap);
            if let Some(r) = self.nic_resource(li) {
                resources.push(r);
                bottleneck = bottleneck.min(self.capacity[r as usize]);
            }
            class = class.max(l.class);
            latency += l.latency;
        }
        Route {
            resources,
            latency_us: latency,
            class,
            bottleneck,
            hops: path.len() as u32,
        }
    }

    /// [`Network::shortest_routes`] where devices may forward (the fallback when no
    /// switched route exists), and the reference the switched search is tested against.
    #[doc(hidden)]
    pub fn shortest_routes_through_devices(&self, src: u32, dsts: &[u32]) -> Vec<Option<Route>> {
        self.reference_routes(src, dsts, true)
    }

    /// The plain search [`Network::shortest_routes`] describes, every vertex queued.
    #[doc(hidden)]
    pub fn reference_routes(
        &self,
        src: u32,
        dsts: &[u32],
        through_devices: bool,
    ) -> Vec<Option<Route>> {
        let nv = self.vertices.len();
        let start = self.rank_vertex[src as usize];
        let mut best: Vec<Option<Label>> = vec![None; nv];
        let mut pred: Vec<u32> = vec![u32::MAX; nv];
        let mut done = vec![false; nv];
        let mut targets: Vec<bool> = vec![false; nv];
        let mut remaining = 0usize;
        for &d in dsts {
            let v = self.rank_vertex[d as usize] as usize;
            if !targets[v] {
                targets[v] = true;
                remaining += 1;
            }
        }
        let mut heap = BinaryHeap::new();
        let first = Label {
            latency: 0.0,
            width: f64::INFINITY,
            hops: 0,
        };
        best[start as usize] = Some(first);
        heap.push(HeapItem {
            label: first,
            vertex: start,
        });
        while let Some(HeapItem { label, vertex }) = heap.pop() {
            let v = vertex as usize;
            if done[v] {
                continue;
            }
            done[v] = true;
            if targets[v] {
                remaining -= 1;
                if remaining == 0 {
                    break;
                }
            }
            let transit_ok = v == start as usize
                || through_devices
                || !matches!(self.vertices[v], VertexKind::Device { .. });
            if !transit_ok {
                continue;
            }
            for &li in &self.out[v] {
                let l = &self.links[li as usize];
                let next = self.extend(&label, li);
                let t = l.to as usize;
                if done[t] {
                    continue;
                }
                if best[t].is_none_or(|b| next.better(&b)) {
                    best[t] = Some(next);
                    pred[t] = li;
                    heap.push(HeapItem {
                        label: next,
                        vertex: l.to,
                    });
                }
            }
        }
        dsts.iter()
            .map(|&d| {
                let v = self.rank_vertex[d as usize];
                done[v as usize].then(|| self.route_along(start, v, |x| pred[x as usize]))
            })
            .collect()
    }
}

/// `pairs` as route batches by source ([`distinct_destinations`]), sources ascending.
fn batches(pairs: impl IntoIterator<Item = (u32, u32)>) -> Vec<(u32, Vec<u32>)> {
    let mut by_source: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (a, b) in pairs {
        by_source.entry(a).or_default().push(b);
    }
    distinct_destinations(by_source)
}

/// Where the pair `(a, b)` sits in [`batches`] of pairs that hold it: (batch, destination).
fn batch_slot(batches: &[(u32, Vec<u32>)], a: u32, b: u32) -> (usize, usize) {
    let i = batches.partition_point(|(src, _)| *src < a);
    (i, batches[i].1.binary_search(&b).unwrap_or(0))
}

/// Route batches (source, destinations) with each batch's destinations sorted and distinct.
fn distinct_destinations(
    batches: impl IntoIterator<Item = (u32, Vec<u32>)>,
) -> Vec<(u32, Vec<u32>)> {
    batches
        .into_iter()
        .map(|(src, mut dsts)| {
            dsts.sort_unstable();
            dsts.dedup();
            (src, dsts)
        })
        .collect()
}
