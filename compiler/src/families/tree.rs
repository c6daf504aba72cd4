//! Tree families: NCCL-style double binary tree (two complementary trees, each carrying
//! half of the data) and k-ary trees (fan-out 2–4) whose parents are picked over the
//! fastest direct links. AllReduce = pipelined reduce up + broadcast down; Broadcast and
//! Reduce use the down / up half only.

use super::common::{candidate, direct_bw, grid, host_order, ring_orders, rotate_to, single_rank};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

/// A rooted tree over ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The root rank.
    pub root: Rank,
    /// Parent of each rank (`None` for the root).
    pub parent: Vec<Option<Rank>>,
    /// Children of each rank, in send order.
    pub children: Vec<Vec<Rank>>,
    /// Ranks top-down (every parent before its children).
    pub top_down: Vec<Rank>,
}

impl Tree {
    /// Builds a tree from a parent array over virtual indices `0..n` mapped to ranks by
    /// `rank_of`. Returns `None` if the parent array is not a tree.
    pub fn from_parents(vparent: &[Option<usize>], rank_of: &[Rank]) -> Option<Tree> {
        let n = vparent.len();
        let mut parent = vec![None; n];
        let mut children = vec![Vec::new(); n];
        let mut root = None;
        for (v, p) in vparent.iter().enumerate() {
            let r = *rank_of.get(v)?;
            match p {
                Some(p) => {
                    let pr = *rank_of.get(*p)?;
                    parent[r as usize] = Some(pr);
                    children[pr as usize].push(r);
                }
                None => root = Some(r),
            }
        }
        let root = root?;
        let mut top_down = vec![root];
        let mut i = 0;
        while i < top_down.len() {
            let v = top_down[i];
            top_down.extend(children[v as usize].iter().copied());
            i += 1;
            if top_down.len() > n {
                return None;
            }
        }
        (top_down.len() == n).then_some(Tree {
            root,
            parent,
            children,
            top_down,
        })
    }
}

/// NCCL's binary tree over virtual ranks `0..n` (root 0): parents of each virtual rank.
pub fn btree_parents(n: usize) -> Vec<Option<usize>> {
    (0..n)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let bit = 1usize << r.trailing_zeros();
            let up = (r ^ bit) | (bit << 1);
            Some(if up >= n { r ^ bit } else { up })
        })
        .collect()
}

/// The complementary second tree of NCCL's double binary tree: mirrored for even `n`,
/// shifted by one for odd `n`. Returns (parents, root).
pub fn dtree_second(n: usize) -> (Vec<Option<usize>>, usize) {
    let first = btree_parents(n);
    if n.is_multiple_of(2) {
        let p = (0..n)
            .map(|v| first[n - 1 - v].map(|u| n - 1 - u))
            .collect();
        (p, n - 1)
    } else {
        let p = (0..n)
            .map(|v| first[(v + n - 1) % n].map(|u| (u + 1) % n))
            .collect();
        (p, 1 % n)
    }
}

/// Emits one chunk `k` of a tree collective on `channel`.
pub fn tree_chunk(b: &mut ScheduleBuilder, tree: &Tree, k: u32, channel: u32) {
    let kind = b.collective().kind();
    let (up, down) = match kind {
        CollectiveKind::AllReduce => (true, true),
        CollectiveKind::Reduce => (true, false),
        _ => (false, true),
    };
    let input = Loc::input(k);
    let output = Loc::output(k);
    if up {
        for &v in tree.top_down.iter().rev() {
            let cs = &tree.children[v as usize];
            let p = tree.parent[v as usize];
            if cs.is_empty() {
                if let Some(p) = p {
                    b.send(v, p, input, 1, channel);
                }
                continue;
            }
            for (i, &c) in cs.iter().enumerate() {
                let src = if i == 0 { input } else { output };
                match p {
                    Some(p) if i + 1 == cs.len() => b.recv_reduce_send(v, c, p, src, 1, channel),
                    _ => b.recv_reduce_copy(v, c, src, output, 1, channel),
                }
            }
        }
    }
    if down {
        for &v in &tree.top_down {
            let cs = &tree.children[v as usize];
            match tree.parent[v as usize] {
                None => {
                    let src = if up { output } else { input };
                    for &c in cs {
                        b.send(v, c, src, 1, channel);
                    }
                }
                Some(p) => match cs.split_first() {
                    None => b.recv(v, p, output, 1, channel),
                    Some((&c0, rest)) => {
                        b.recv_copy_send(v, p, c0, output, 1, channel);
                        for &c in rest {
                            b.send(v, c, output, 1, channel);
                        }
                    }
                },
            }
        }
    }
}

/// A schedule running `trees[t]` on channels; tree `t` carries chunks
/// `t·pipeline..(t+1)·pipeline`, pipelined piece by piece.
pub fn tree_schedule(
    name: &str,
    trees: &[Tree],
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Vec<Candidate> {
    let n = trees.first().map_or(0, |t| t.parent.len()) as u32;
    if n == 0 || !collective.kind().tree_capable() {
        return Vec::new();
    }
    if n == 1 {
        return single_rank(name, collective, in_place, params);
    }
    let pp = params.pipeline.max(1);
    let chunks = trees.len() as u32 * pp;
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    if let (Collective::Broadcast { root }, false) = (collective, in_place) {
        b.copy((root, Loc::input(0)), (root, Loc::output(0)), chunks, 0);
    }
    for q in 0..pp {
        for (t, tree) in trees.iter().enumerate() {
            let t = t as u32;
            tree_chunk(&mut b, tree, t * pp + q, t);
        }
    }
    candidate(name, params, b)
}

trait TreeKind {
    fn tree_capable(self) -> bool;
}

impl TreeKind for CollectiveKind {
    fn tree_capable(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllReduce | CollectiveKind::Broadcast | CollectiveKind::Reduce
        )
    }
}

/// The order tree positions are mapped onto: a ring over direct links where there is one
/// (neighbours in the order are then well connected), else host-contiguous.
fn tree_order(topo: &Topology) -> Vec<Rank> {
    ring_orders(topo, 1)
        .into_iter()
        .next()
        .unwrap_or_else(|| host_order(topo))
}

/// The double binary tree family.
#[derive(Debug, Clone, Copy, Default)]
pub struct DoubleBinaryTree;

impl DoubleBinaryTree {
    /// The two trees for `collective` (rooted at its root for Broadcast / Reduce).
    pub fn trees(&self, topo: &Topology, collective: Collective) -> Option<[Tree; 2]> {
        let n = topo.nranks() as usize;
        let order = tree_order(topo);
        let first = btree_parents(n);
        let (second, root2) = dtree_second(n);
        match collective.root() {
            None => Some([
                Tree::from_parents(&first, &order)?,
                Tree::from_parents(&second, &order)?,
            ]),
            Some(root) => {
                let o = rotate_to(&order, root);
                let o2: Vec<Rank> = (0..n).map(|v| o[(v + n - root2) % n]).collect();
                Some([
                    Tree::from_parents(&first, &o)?,
                    Tree::from_parents(&second, &o2)?,
                ])
            }
        }
    }
}

impl Family for DoubleBinaryTree {
    fn name(&self) -> &'static str {
        "tree"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind.tree_capable()
    }
    fn param_space(&self, _topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1, 2, 4, 8], 1, u32::MAX)
    }
    /// Double-binary-tree schedules for either buffer arrangement; `params.channels`
    /// replicates both trees over more channels.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if collective.root().is_some_and(|r| r >= topo.nranks()) {
            return Vec::new();
        }
        let Some(pair) = self.trees(topo, collective) else {
            return Vec::new();
        };
        let mut trees = Vec::new();
        for _ in 0..params.channels.max(1) {
            trees.extend(pair.iter().cloned());
        }
        tree_schedule(self.name(), &trees, collective, params, in_place)
    }
}

/// K-ary trees with fan-out 2–4; parents adopt the children they have the fastest direct
/// links to (then same host, then host-contiguous order).
#[derive(Debug, Clone, Copy, Default)]
pub struct KaryTree;

/// Fan-outs the k-ary tree family generates.
pub const KARY_FANOUTS: [usize; 3] = [2, 3, 4];

impl KaryTree {
    /// The greedy k-ary tree rooted at `root`: ranks in breadth-first order take as
    /// children the `fanout` unassigned ranks they prefer: direct device neighbours by
    /// falling bandwidth, then ranks of their own host, then the others; ties by distance
    /// after the parent in host order.
    ///
    /// Linear in the ranks (up to the host sizes and direct links): the rank after a parent
    /// in host order that is still unassigned is found through skip pointers over that
    /// order, not by sorting every unassigned rank for every parent (quadratic: a minute for
    /// 32,768 ranks).
    pub fn tree(&self, topo: &Topology, root: Rank, fanout: usize) -> Option<Tree> {
        let n = topo.nranks() as usize;
        let order = host_order(topo);
        let mut pos = vec![0usize; n];
        for (i, &r) in order.iter().enumerate() {
            pos[r as usize] = i;
        }
        let mut rank_of = std::collections::HashMap::with_capacity(n);
        for (r, &node) in topo.ranks.iter().enumerate() {
            rank_of.insert(node, r as Rank);
        }
        let by_host = topo.ranks_by_host();
        let mut assigned = vec![false; n];
        // next[i]: a position at or after i (n: none) whose rank may be unassigned.
        let mut next: Vec<usize> = (0..=n).collect();
        fn free(next: &mut [usize], mut i: usize) -> usize {
            let mut root = i;
            while next[root] != root {
                root = next[root];
            }
            while next[i] != root {
                let up = next[i];
                next[i] = root;
                i = up;
            }
            root
        }
        let assign = |r: Rank, assigned: &mut Vec<bool>, next: &mut Vec<usize>| {
            assigned[r as usize] = true;
            next[pos[r as usize]] = pos[r as usize] + 1;
        };
        if root as usize >= n {
            return None;
        }
        assign(root, &mut assigned, &mut next);
        let mut parent = vec![None; n];
        let mut children = vec![Vec::new(); n];
        let mut top_down = vec![root];
        let mut i = 0;
        while i < top_down.len() && top_down.len() < n {
            let v = top_down[i];
            let hv = topo.host_of[v as usize];
            let dist = |r: Rank| (pos[r as usize] + n - pos[v as usize]) % n;
            let other_host = |r: Rank| topo.host_of[r as usize] != hv;
            // Direct neighbours, fastest first.
            let mut linked: Vec<(Rank, f64)> = topo
                .graph
                .neighbors(topo.ranks[v as usize])
                .filter_map(|m| rank_of.get(&m).copied())
                .filter(|&c| c != v && !assigned[c as usize])
                .map(|c| (c, direct_bw(topo, v, c)))
                .collect();
            linked.sort_by(|&(a, ba), &(c, bc)| {
                bc.total_cmp(&ba)
                    .then(other_host(a).cmp(&other_host(c)))
                    .then(dist(a).cmp(&dist(c)))
            });
            linked.dedup_by_key(|x| x.0);
            let mut picked: Vec<Rank> = linked.iter().take(fanout).map(|x| x.0).collect();
            // Then the host's own ranks, then the others, by distance in host order.
            if picked.len() < fanout {
                let mut own: Vec<Rank> = by_host[hv]
                    .iter()
                    .copied()
                    .filter(|&c| c != v && !assigned[c as usize] && !picked.contains(&c))
                    .collect();
                own.sort_by_key(|&c| dist(c));
                let room = fanout - picked.len();
                picked.extend(own.into_iter().take(room));
            }
            let start = pos[v as usize] + 1;
            let mut p = free(&mut next, start.min(n));
            let mut wrapped = false;
            while picked.len() < fanout {
                if p >= n {
                    if wrapped {
                        break;
                    }
                    wrapped = true;
                    p = free(&mut next, 0);
                    continue;
                }
                if wrapped && p >= start {
                    break;
                }
                let c = order[p];
                if other_host(c) && !picked.contains(&c) {
                    picked.push(c);
                }
                p = free(&mut next, p + 1);
            }
            for c in picked {
                assign(c, &mut assigned, &mut next);
                parent[c as usize] = Some(v);
                children[v as usize].push(c);
                top_down.push(c);
            }
            i += 1;
        }
        (top_down.len() == n).then_some(Tree {
            root,
            parent,
            children,
            top_down,
        })
    }
}

impl Family for KaryTree {
    fn name(&self) -> &'static str {
        "kary_tree"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind.tree_capable()
    }
    fn param_space(&self, _topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1, 4, 8], 1, u32::MAX)
    }
    /// K-ary tree schedules (one per fan-out) for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let root = collective.root().unwrap_or(0);
        if root >= topo.nranks() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for fanout in KARY_FANOUTS {
            if fanout > 2 && fanout + 1 >= topo.nranks() as usize {
                continue;
            }
            let Some(tree) = self.tree(topo, root, fanout) else {
                continue;
            };
            let trees = vec![tree; params.channels.max(1) as usize];
            out.extend(tree_schedule(
                self.name(),
                &trees,
                collective,
                params,
                in_place,
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hccl_topologies::generate;

    /// The tree as [`KaryTree::tree`] built it before it was made linear: every unassigned
    /// rank sorted for every parent. Kept to test that both agree.
    fn tree_by_sorting(topo: &Topology, root: Rank, fanout: usize) -> Option<Tree> {
        let n = topo.nranks() as usize;
        let order = host_order(topo);
        let mut pos = vec![0usize; n];
        for (i, &r) in order.iter().enumerate() {
            pos[r as usize] = i;
        }
        let mut assigned = vec![false; n];
        *assigned.get_mut(root as usize)? = true;
        let mut parent = vec![None; n];
        let mut children = vec![Vec::new(); n];
        let mut top_down = vec![root];
        let mut i = 0;
        while i < top_down.len() && top_down.len() < n {
            let v = top_down[i];
            let mut cands: Vec<Rank> = (0..n as Rank).filter(|&r| !assigned[r as usize]).collect();
            let hv = topo.host_of[v as usize];
            let dist = |r: Rank| (pos[r as usize] + n - pos[v as usize]) % n;
            cands.sort_by(|&a, &c| {
                direct_bw(topo, v, c)
                    .total_cmp(&direct_bw(topo, v, a))
                    .then((topo.host_of[a as usize] != hv).cmp(&(topo.host_of[c as usize] != hv)))
                    .then(dist(a).cmp(&dist(c)))
            });
            for &c in cands.iter().take(fanout) {
                assigned[c as usize] = true;
                parent[c as usize] = Some(v);
                children[v as usize].push(c);
                top_down.push(c);
            }
            i += 1;
        }
        (top_down.len() == n).then_some(Tree {
            root,
            parent,
            children,
            top_down,
        })
    }

    /// The linear greedy builds exactly the tree the sorting one does: shipped machines and
    /// generated ones (one host, clusters, tori, rings, a fat tree), several roots, every
    /// fan-out.
    #[test]
    fn kary_trees_match_the_sorting_construction() {
        let h100 = hccl_topologies::parse_spec(
            hccl_topologies::shipped_text("dgx-h100").expect("shipped"),
            "dgx-h100",
        )
        .expect("parses");
        let build = |spec, name| hccl_topologies::build(spec, name).expect("builds");
        let mut machines: Vec<Topology> = [
            "dgx1-v100",
            "ascend910-8",
            "h100-cluster-2node",
            "azure-ndv2-2node",
        ]
        .into_iter()
        .map(|m| hccl_topologies::shipped_by_name(m).expect("shipped"))
        .collect();
        machines.push(build(generate::ring(13, 25.0, 0.7), "ring-13"));
        machines.push(build(generate::torus(&[4, 6], 25.0, 0.7), "torus"));
        machines.push(build(generate::cluster(5, &h100), "cluster-5"));
        machines.push(build(generate::cluster(16, &h100), "cluster-16"));
        let mut compared = 0;
        for topo in &machines {
            let n = topo.nranks();
            for root in [0, 1, n / 2, n - 1] {
                for fanout in [1, 2, 3, 4, 7] {
                    let fast = KaryTree.tree(topo, root, fanout);
                    let slow = tree_by_sorting(topo, root, fanout);
                    assert_eq!(fast, slow, "{} root {root} fan-out {fanout}", topo.name);
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, machines.len() * 20);
    }
}
