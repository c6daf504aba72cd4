//! Arc-disjoint spanning arborescences over the direct links between ranks (Edmonds'
//! branching theorem, built by Lovász's greedy construction).
//!
//! On a machine whose ranks are joined by links of one capacity (a torus, a ring, a mesh of
//! equal links), a root whose every cut is crossed by at least `k` links has `k` spanning
//! arborescences that share no link (Edmonds, 1973): a Broadcast at `k` links' rate, which is
//! the max-flow bound, in only `k` trees. The LP of [`crate::cost::packing`] reaches the same rate
//! only with a fractional support of many trees (53 on a 4×4 torus), and pruned to the 8–16
//! trees a schedule runs it loses a quarter of it.
//!
//! Construction (Lovász, 1976): grow one arborescence at a time; an arc `u → v` from the
//! tree to a rank outside it is taken only if, without it, every rank can still be reached
//! from the root by `k − 1` arc-disjoint paths in the links the tree leaves unused (checked
//! by max-flow, petgraph's `dinics`). Such an arc always exists, so the tree grows to span
//! every rank and the rest of the links still hold `k − 1` disjoint arborescences. Arcs are
//! tried from the shallowest tree rank first, so the trees stay shallow where they can.
//!
//! Links of unequal capacities count in units of the smallest (a 50 GB/s link is two
//! 25 GB/s arcs); what does not divide evenly is left unused.
//!
//! Where ranks meet through switches and NICs there are no direct links to count.
//! [`equal_rate_trees`] grows a few trees of equal rate at the LP's proven rate together
//! over the simulator's routes instead (a greedy, without Edmonds' guarantee): on an
//! NVSwitch box two trees of 225 GB/s. Equal rates are what the simulator's fair sharing of
//! links gives trees, where the LP's trees of unequal rates get more or less than their
//! weight.

use super::milp;
use crate::cost::Network;
use crate::cost::packing::{Direction, PackedTree};
use hccl_topologies::Topology;
use petgraph::graph::{Graph, NodeIndex};

/// `k` arc-disjoint spanning arborescences of `root` over the direct rank-to-rank links of
/// `net`, each of rate `unit` (GB/s). Trees are returned with the packing's parent
/// convention for `direction` (for [`Direction::ToRoot`] the links are used backwards:
/// data flows from every rank to its parent).
#[derive(Debug, Clone, PartialEq)]
pub struct Disjoint {
    pub trees: Vec<PackedTree>,
    /// The capacity of one arc (GB/s): the smallest direct link.
    pub unit: f64,
}

impl Disjoint {
    /// The rate the trees carry together (GB/s).
    pub fn rate(&self) -> f64 {
        self.unit * self.trees.len() as f64
    }
}

/// Most ranks the construction runs on (each arc tried costs a max-flow per rank).
pub const MAX_RANKS: usize = 64;

/// The direct rank-to-rank links of `net` as arcs in units of the smallest: `mult[a][b]`
/// arcs from `a` to `b` of `unit` GB/s each, oriented as tree edges run (parent to child):
/// as the links for [`Direction::FromRoot`], against them for [`Direction::ToRoot`].
pub fn unit_arcs(net: &Network, direction: Direction) -> Option<(Vec<Vec<u32>>, f64)> {
    let n = net.nranks() as usize;
    let rank_of_vertex = |v: u32| net.rank_vertex.iter().position(|&x| x == v);
    let mut direct: Vec<(usize, usize, f64)> = Vec::new();
    for link in &net.links {
        if let (Some(a), Some(b)) = (rank_of_vertex(link.from), rank_of_vertex(link.to))
            && a != b
            && link.cap.is_finite()
            && link.cap > 0.0
        {
            match direction {
                Direction::FromRoot => direct.push((a, b, link.cap)),
                Direction::ToRoot => direct.push((b, a, link.cap)),
                // Trees carrying data both ways are the LP's alone.
                Direction::Both => return None,
            }
        }
    }
    let unit = direct.iter().map(|d| d.2).fold(f64::INFINITY, f64::min);
    if !unit.is_finite() {
        return None;
    }
    let mut mult = vec![vec![0u32; n]; n];
    for &(a, b, cap) in &direct {
        mult[a][b] += (cap / unit + 1e-6).floor() as u32;
    }
    Some((mult, unit))
}

/// The disjoint arborescences of `root`, or `None` where the direct links do not connect
/// every rank to the root (switched machines: their ranks have no direct links).
pub fn disjoint_arborescences(net: &Network, root: u32, direction: Direction) -> Option<Disjoint> {
    let n = net.nranks() as usize;
    if !(2..=MAX_RANKS).contains(&n) || root as usize >= n {
        return None;
    }
    let (mut mult, unit) = unit_arcs(net, direction)?;
    let k = connectivity(&mult, root as usize)?;
    if k == 0 {
        return None;
    }
    let mut trees = Vec::with_capacity(k as usize);
    for i in 0..k {
        let keep = k - 1 - i;
        let parents = grow(&mut mult, root as usize, keep)?;
        trees.push(PackedTree {
            root,
            parents,
            rate: unit,
        });
    }
    Some(Disjoint { trees, unit })
}

/// Link-disjoint trees for every rank as a root at once (AllGather, ReduceScatter): each
/// orbit representative's trees ([`disjoint_arborescences`]) carried to the other ranks of
/// its orbit by the topology's automorphisms ([`milp::automorphisms`]), so that on a
/// vertex-transitive machine (a torus, a ring) every link carries the same number of trees
/// wherever its representative's trees are spread evenly. Every tree gets the rate that the
/// most loaded arc leaves it; the returned rate is per root (its trees together).
pub fn every_root(
    topo: &Topology,
    net: &Network,
    direction: Direction,
) -> Option<(Vec<PackedTree>, f64)> {
    let n = net.nranks() as usize;
    if !(2..=MAX_RANKS).contains(&n) {
        return None;
    }
    let links = milp::LinkMatrix::from_topology(topo).ok()?;
    let sym = milp::automorphisms(&links);
    if sym.len() != n {
        return None;
    }
    let (mult, unit) = unit_arcs(net, direction)?;
    let mut of_rep: Vec<Option<Disjoint>> = vec![None; n];
    let mut trees = Vec::new();
    for (o, (rho, perm)) in sym.iter().enumerate() {
        if of_rep[*rho].is_none() {
            of_rep[*rho] = Some(disjoint_arborescences(net, *rho as u32, direction)?);
        }
        let rep = of_rep[*rho].as_ref()?;
        for t in &rep.trees {
            let mut parents = vec![None; n];
            for (v, p) in t.parents.iter().enumerate() {
                parents[perm[v]] = p.map(|p| perm[p as usize] as u32);
            }
            if parents[o].is_some() {
                return None;
            }
            trees.push(PackedTree {
                root: o as u32,
                parents,
                rate: 0.0,
            });
        }
    }
    // Every root needs as many trees (orbits of unequal connectivity are not balanced here).
    let k = trees.iter().filter(|t| t.root == 0).count();
    if (0..n as u32).any(|r| trees.iter().filter(|t| t.root == r).count() != k) {
        return None;
    }
    let mut load = vec![vec![0u32; n]; n];
    for t in &trees {
        for (v, p) in t.parents.iter().enumerate() {
            if let Some(p) = p {
                load[*p as usize][v] += 1;
            }
        }
    }
    let mut share = f64::INFINITY;
    for a in 0..n {
        for b in 0..n {
            if load[a][b] > 0 {
                // Arcs the automorphisms map a tree onto exist (they preserve the links).
                share = share.min(f64::from(mult[a][b]) / f64::from(load[a][b]));
            }
        }
    }
    if !share.is_finite() || share <= 0.0 {
        return None;
    }
    let rate = unit * share;
    for t in &mut trees {
        t.rate = rate;
    }
    Some((trees, rate * k as f64))
}

/// Relative shortfall of a link's room below a tree's share that [`equal_rate_trees`]
/// still accepts (the column generation's stopping gap, as in `super::reaches_bound`).
pub const RATE_SLACK: f64 = 1e-3;

/// Most trees [`equal_rate_trees`] tries.
pub const MAX_EQUAL_TREES: u32 = 8;

/// `k` spanning trees of `root` at `rate / k` each over the simulator's routes (any pair of
/// ranks, through switches and NICs), grown together: in turns, each tree takes the edge to
/// a rank it lacks whose route still has room for one more tree's share on every link and
/// NIC direction, from its shallowest rank first (then the route of fewest hops). A greedy
/// without the guarantee of [`disjoint_arborescences`]: `None` when some tree cannot grow.
/// Equal rates matter because links share their bandwidth fairly among the messages that
/// cross them: trees of one rate get, on every link, just what the packing gives them.
pub fn equal_rate_trees(
    net: &Network,
    root: u32,
    direction: Direction,
    rate: f64,
    k: u32,
) -> Option<Vec<PackedTree>> {
    let n = net.nranks() as usize;
    if !(2..=MAX_RANKS).contains(&n)
        || root as usize >= n
        || k == 0
        || rate.is_nan()
        || rate <= 0.0
        || direction == Direction::Both
    {
        return None;
    }
    let share = rate / f64::from(k);
    let pairs: Vec<(u32, u32)> = (0..n as u32)
        .flat_map(|a| (0..n as u32).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let routes = net.routes(&pairs).ok()?;
    // The resources of the edge parent → child, as the data flows.
    let route = |p: usize, c: usize| {
        let (a, b) = match direction {
            Direction::FromRoot | Direction::Both => (p, c),
            Direction::ToRoot => (c, p),
        };
        let at = a * (n - 1) + if b < a { b } else { b - 1 };
        &routes[at]
    };
    let mut left: Vec<f64> = net.capacity.clone();
    // `rate` is typically the LP's bound, its dual within the column generation's stopping
    // gap: a link it fills exactly may read a hair short of the share.
    let slack = share * RATE_SLACK;
    let mut depth = vec![vec![None::<u32>; n]; k as usize];
    let mut parent = vec![vec![None::<u32>; n]; k as usize];
    for d in &mut depth {
        d[root as usize] = Some(0);
    }
    for _ in 1..n {
        for t in 0..k as usize {
            let mut best: Option<(u32, u32, usize, usize)> = None;
            for u in 0..n {
                let Some(du) = depth[t][u] else { continue };
                for (v, dv) in depth[t].iter().enumerate() {
                    if dv.is_some() {
                        continue;
                    }
                    let r = route(u, v);
                    let fits = r
                        .resources
                        .iter()
                        .all(|&x| left[x as usize] + slack >= share);
                    let key = (du, r.hops, u, v);
                    if fits && best.is_none_or(|b| key < b) {
                        best = Some(key);
                    }
                }
            }
            let (du, _, u, v) = best?;
            for &x in &route(u, v).resources {
                left[x as usize] -= share;
            }
            depth[t][v] = Some(du + 1);
            parent[t][v] = Some(u as u32);
        }
    }
    Some(
        parent
            .into_iter()
            .map(|parents| PackedTree {
                root,
                parents,
                rate: share,
            })
            .collect(),
    )
}

/// Grows one spanning arborescence of `root`, taking its arcs out of `mult`, such that what
/// is left still connects `root` to every rank by `keep` arc-disjoint paths.
fn grow(mult: &mut [Vec<u32>], root: usize, keep: u32) -> Option<Vec<Option<u32>>> {
    let n = mult.len();
    let mut parent: Vec<Option<u32>> = vec![None; n];
    let mut depth: Vec<Option<u32>> = vec![None; n];
    depth[root] = Some(0);
    let mut order = vec![root];
    while order.len() < n {
        // Tree ranks shallowest first (then in the order they joined), their arcs to ranks
        // outside the tree.
        let mut from: Vec<usize> = order.clone();
        from.sort_by_key(|&u| depth[u]);
        let mut taken = None;
        'search: for &u in &from {
            for v in 0..n {
                if depth[v].is_some() || mult[u][v] == 0 {
                    continue;
                }
                mult[u][v] -= 1;
                if keep == 0 || connectivity(mult, root).is_some_and(|c| c >= keep) {
                    taken = Some((u, v));
                    break 'search;
                }
                mult[u][v] += 1;
            }
        }
        // By Lovász's lemma an arc is always found; a `None` here means the links did not
        // hold the connectivity they were counted with.
        let (u, v) = taken?;
        parent[v] = Some(u as u32);
        depth[v] = depth[u].map(|d| d + 1);
        order.push(v);
    }
    Some(parent)
}

/// The least, over the other ranks, of the number of arc-disjoint paths from `root` to it
/// (max-flow over unit arcs; 0 where a rank cannot be reached); `None` for one rank.
fn connectivity(mult: &[Vec<u32>], root: usize) -> Option<u32> {
    let n = mult.len();
    let mut g: Graph<(), u32> = Graph::with_capacity(n, n * n);
    let nodes: Vec<NodeIndex> = (0..n).map(|_| g.add_node(())).collect();
    for (a, row) in mult.iter().enumerate() {
        for (b, &m) in row.iter().enumerate() {
            if m > 0 {
                g.add_edge(nodes[a], nodes[b], m);
            }
        }
    }
    (0..n)
        .filter(|&w| w != root)
        .map(|w| petgraph::algo::dinics(&g, nodes[root], nodes[w]).0)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hccl_topologies::{build, generate};

    /// Every tree spans: each rank reaches the root through its parents.
    fn check(d: &Disjoint, n: usize, root: u32) {
        for t in &d.trees {
            assert_eq!(t.parents.len(), n);
            assert_eq!(t.parents[root as usize], None);
            for v in 0..n {
                let mut at = v as u32;
                let mut steps = 0;
                while let Some(p) = t.parents[at as usize] {
                    at = p;
                    steps += 1;
                    assert!(steps <= n, "cycle in {:?}", t.parents);
                }
                assert_eq!(at, root);
            }
        }
    }

    #[test]
    fn a_torus_root_gets_four_link_disjoint_trees() {
        let topo = build(generate::torus(&[4, 4], 50.0, 1.0), "t").expect("torus");
        let net = Network::new(&topo);
        for dir in [Direction::FromRoot, Direction::ToRoot] {
            let d = disjoint_arborescences(&net, 5, dir).expect("trees");
            assert_eq!(d.trees.len(), 4);
            assert!((d.rate() - 200.0).abs() < 1e-9, "{}", d.rate());
            check(&d, 16, 5);
            // No directed link carries two trees.
            let mut seen = std::collections::HashSet::new();
            for t in &d.trees {
                for (v, p) in t.parents.iter().enumerate() {
                    if let Some(p) = p {
                        assert!(seen.insert((*p, v as u32)), "link {p}-{v} shared");
                    }
                }
            }
        }
    }

    #[test]
    fn every_torus_rank_gets_four_trees_and_the_links_are_evenly_loaded() {
        let topo = build(generate::torus(&[4, 4], 50.0, 1.0), "t").expect("torus");
        let net = Network::new(&topo);
        for dir in [Direction::FromRoot, Direction::ToRoot] {
            let (trees, rate) = every_root(&topo, &net, dir).expect("trees");
            assert_eq!(trees.len(), 64);
            // Every rank receives 15 blocks over 4 links of 50 GB/s: at most 200/15 GB/s per
            // root, which balanced trees reach.
            assert!((rate - 200.0 / 15.0).abs() < 1e-9, "{rate}");
            for r in 0..16u32 {
                let d = Disjoint {
                    trees: trees.iter().filter(|t| t.root == r).cloned().collect(),
                    unit: 50.0,
                };
                assert_eq!(d.trees.len(), 4);
                check(&d, 16, r);
            }
        }
    }

    #[test]
    fn every_root_of_a_small_torus_gets_four_trees() {
        let topo = build(generate::torus(&[3, 3], 50.0, 1.0), "t").expect("torus");
        let net = Network::new(&topo);
        for root in 0..9 {
            for dir in [Direction::FromRoot, Direction::ToRoot] {
                let d = disjoint_arborescences(&net, root, dir);
                assert_eq!(
                    d.as_ref().map(|d| d.trees.len()),
                    Some(4),
                    "root {root} {dir:?}"
                );
                check(&d.unwrap(), 9, root);
            }
        }
    }

    #[test]
    fn equal_rate_trees_fit_the_routes_of_an_nvswitch_box() {
        let topo = hccl_topologies::shipped_by_name("dgx-h100").expect("shipped");
        let net = Network::new(&topo);
        for dir in [Direction::FromRoot, Direction::ToRoot] {
            // 450 GB/s from the root (its NVSwitch ports): two trees of 225 fit.
            let trees = equal_rate_trees(&net, 3, dir, 450.0, 2).expect("two trees");
            assert_eq!(trees.len(), 2);
            let d = Disjoint {
                trees: trees.clone(),
                unit: 225.0,
            };
            check(&d, 8, 3);
            // No link or NIC direction carries more than its capacity.
            let mut load = vec![0.0; net.capacity.len()];
            for t in &trees {
                for (v, p) in t.parents.iter().enumerate() {
                    let Some(p) = *p else { continue };
                    let pair = match dir {
                        Direction::FromRoot | Direction::Both => (p, v as u32),
                        Direction::ToRoot => (v as u32, p),
                    };
                    for &x in &net.routes(&[pair]).expect("route")[0].resources {
                        load[x as usize] += t.rate;
                    }
                }
            }
            for (x, l) in load.iter().enumerate() {
                assert!(*l <= net.capacity[x] * (1.0 + 1e-9), "resource {x}: {l}");
            }
            // Beyond the root's 450 GB/s no tree count fits.
            assert_eq!(equal_rate_trees(&net, 3, dir, 451.0, 2), None);
        }
    }

    #[test]
    fn a_ring_root_gets_two_trees() {
        let topo = build(generate::ring(8, 100.0, 1.0), "t").expect("ring");
        let net = Network::new(&topo);
        let d = disjoint_arborescences(&net, 0, Direction::FromRoot).expect("trees");
        assert_eq!(d.trees.len(), 2);
        check(&d, 8, 0);
    }

    #[test]
    fn a_fat_tree_root_gets_equal_rate_trees_at_the_lps_bound() {
        // No direct links: every edge is a route through the leaf and spine switches. The
        // LP's bound is its dual, a hair above the 50 GB/s of the root's NIC; the trees are
        // still found at it.
        let topo = build(generate::fat_tree(16, 4, 50.0, 1.0), "t").expect("fat tree");
        let net = Network::new(&topo);
        for dir in [Direction::FromRoot, Direction::ToRoot] {
            let trees = equal_rate_trees(&net, 0, dir, 50.0 * (1.0 + 2e-6), 2).expect("trees");
            assert_eq!(trees.len(), 2);
            let d = Disjoint { trees, unit: 25.0 };
            check(&d, 16, 0);
            // Every rank's NIC sends at 50 GB/s at most: one child per tree, or two in one.
            assert_eq!(equal_rate_trees(&net, 0, dir, 50.1, 2), None);
        }
    }
}
