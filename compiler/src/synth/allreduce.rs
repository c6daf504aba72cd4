//! AllReduce over spanning trees that carry data both ways, with blocks as large as the
//! trees' rates.
//!
//! ReduceScatter followed by AllGather gives every rank an equal block, so a rank with less
//! ingress than the others still receives its full share of the other blocks, and on a
//! machine whose ranks differ (a ring with a few slower chords, ranks with an extra link)
//! it is the one all the others wait for. Nothing in AllReduce asks for equal blocks: any
//! part of the buffer can be reduced up a spanning tree and sent back down the same tree.
//! A tree edge then occupies the routes both ways at the tree's rate, and the packing LP of
//! [`crate::cost::packing`] ([`Direction::Both`]) maximises the total rate `R = Σ x_T` over such
//! trees; the buffer takes `M / R`.
//!
//! Every tree delivers each byte to `n − 1` ranks going down and takes `n − 1` transfers
//! coming up, so `2(n − 1)·R ≤ Σ_v B_in(v)`: at its optimum the packing meets the gossip
//! bound `2(n − 1)·M / Σ_v B_in(v)` of [`crate::cost::bounds`] wherever the ingress of every
//! rank can be filled. With equal blocks the best is `n·λ / 2`, `λ` the AllGather packing's
//! rate per root. The trees are offered only where the ranks' ingress differs (elsewhere
//! equal blocks are already as good) and they beat equal blocks by [`GAIN`].
//!
//! Lowering ([`lower_allreduce`]): each tree is rooted anew at its centre (the least height:
//! a piece goes up and back down), owns a share of the buffer in proportion to its rate, and
//! runs its pieces up on one channel and down on another, so that a rank relaying the next
//! piece up never waits for the previous one to come back down.

use super::{Memo, SynthLevel, copy_counts, critical_first, grow_pool, packing_bound};
use super::{max_ranks, record, resolution};
use super::{piece_widths, prune};
use crate::builder::ScheduleBuilder;
use crate::cost::Network;
use crate::cost::packing::{Direction, Packing, Pool};
use crate::families::common::candidate;
use crate::families::tree::Tree;
use crate::families::{Candidate, Family, FamilyParams};
use hccl_ir::{Collective, CollectiveKind, Loc};
use hccl_topologies::Topology;
use std::collections::VecDeque;
use std::sync::Arc;

/// Least gain in rate over equal blocks (`n·λ / 2`) for the trees to be offered.
pub const GAIN: f64 = 1.01;
/// Ingress differing by less than this share counts as equal.
const INGRESS_TOLERANCE: f64 = 1e-3;
/// Most trees a packing keeps (each runs on two channels).
pub const MAX_TREES: usize = 8;
/// Most tree copies (two channels each).
pub const MAX_COPIES: u32 = 32;
/// Pieces per tree copy.
const PIPELINES: [u32; 3] = [16, 64, 256];
/// Least chunk (bytes) a schedule is costed at: each depth only from the sizes where its
/// pieces are worth sending.
const MIN_CHUNK_BYTES: u64 = 4096;

/// The AllReduce trees `topo` is offered, memoised per topology: `None` where the ranks'
/// ingress is equal, outside the synthesizers' sizes at `level`, or where the trees do not
/// beat equal blocks by [`GAIN`] (see the module docs).
pub fn allreduce_packing(topo: &Topology, level: SynthLevel) -> Option<Arc<Packing>> {
    let n = topo.nranks();
    // The limits of the AllGather packing, whose bound the trees are compared with.
    if !(3..=max_ranks(Collective::AllGather, level)).contains(&n) {
        return None;
    }
    static PACKINGS: Memo<String, Option<Arc<Packing>>> = Memo::new();
    PACKINGS.get(topo.hash.clone(), || {
        let net = Network::new(topo);
        if !unequal_ingress(&net) {
            return None;
        }
        let pool = allreduce_pool(&net)?;
        let per_root = packing_bound(&net, Collective::AllGather)?;
        let equal_blocks = f64::from(n) * per_root / 2.0;
        if pool.rate() < equal_blocks * GAIN {
            return None;
        }
        prune(&pool, MAX_TREES).ok().map(Arc::new)
    })
}

/// The optimal pool of AllReduce trees on `net` ([`Direction::Both`], packed from rank 0).
pub fn allreduce_pool(net: &Network) -> Option<Pool> {
    grow_pool(net, &[0], Direction::Both).ok()
}

/// Whether some rank's ingress (the capacity of the links into it) differs from another's.
pub fn unequal_ingress(net: &Network) -> bool {
    let ingress: Vec<f64> = net
        .rank_vertex
        .iter()
        .map(|&v| {
            net.links
                .iter()
                .filter(|l| l.to == v && l.cap.is_finite())
                .map(|l| l.cap)
                .sum()
        })
        .collect();
    let most = ingress.iter().copied().fold(0.0, f64::max);
    ingress.iter().any(|&b| most - b > most * INGRESS_TOLERANCE)
}

/// `parents` (a spanning tree, any root) rooted at the rank of least height; ties go to the
/// rank that roots the fewest trees so far (`rooted`), then the lowest.
fn rooted_at_centre(parents: &[Option<u32>], rooted: &mut [u32]) -> Option<Vec<Option<usize>>> {
    let n = parents.len();
    let mut adj = vec![Vec::new(); n];
    for (v, p) in parents.iter().enumerate() {
        if let Some(u) = p {
            let u = *u as usize;
            if u >= n {
                return None;
            }
            adj[u].push(v);
            adj[v].push(u);
        }
    }
    let bfs = |root: usize| {
        let mut parent = vec![None; n];
        let mut depth = vec![usize::MAX; n];
        depth[root] = 0;
        let mut queue = VecDeque::from([root]);
        while let Some(u) = queue.pop_front() {
            for &v in &adj[u] {
                if depth[v] == usize::MAX {
                    depth[v] = depth[u] + 1;
                    parent[v] = Some(u);
                    queue.push_back(v);
                }
            }
        }
        let height = depth.iter().copied().max().unwrap_or(0);
        (height, parent)
    };
    let (root, (height, parent)) = (0..n)
        .map(|r| (r, bfs(r)))
        .min_by_key(|(r, (h, _))| (*h, rooted[*r], *r))?;
    if height == usize::MAX {
        return None;
    }
    rooted[root] += 1;
    Some(parent)
}

/// Lowers an AllReduce packing ([`Direction::Both`]) with at most `budget` tree copies
/// ([`copy_counts`]: links share their bandwidth fairly among messages, so a tree owed six
/// times another's rate runs as six flows of the other's rate): `pieces` pieces per copy,
/// each as large as its share of the total rate, reduced up the tree rooted at its centre on
/// one channel and sent back down it on another (see the module docs).
pub fn lower_allreduce(
    name: &str,
    packing: &Packing,
    pieces: u32,
    budget: u32,
    in_place: bool,
) -> Vec<Candidate> {
    let n = packing.trees.first().map_or(0, |t| t.parents.len()) as u32;
    if n < 2 || pieces == 0 || packing.direction != Direction::Both {
        return Vec::new();
    }
    let units = resolution(packing);
    let rates: Vec<f64> = packing.trees.iter().map(|t| t.rate).collect();
    let widths = piece_widths(&rates, units);
    let copies = copy_counts(&widths, budget);
    let rank_of: Vec<u32> = (0..n).collect();
    let mut rooted = vec![0u32; n as usize];
    // Every copy: (up, down, first unit, width in units).
    let mut flows: Vec<(Arc<Tree>, Arc<Tree>, u32, u32)> = Vec::new();
    let mut off = 0;
    for ((t, &width), &copies) in packing.trees.iter().zip(&widths).zip(&copies) {
        if width == 0 || copies == 0 {
            continue;
        }
        let Some(vp) = rooted_at_centre(&t.parents, &mut rooted) else {
            return Vec::new();
        };
        let Some(tree) = Tree::from_parents(&vp, &rank_of) else {
            return Vec::new();
        };
        let (mut up, mut down) = (tree.clone(), tree);
        critical_first(&mut up, Direction::ToRoot);
        critical_first(&mut down, Direction::FromRoot);
        let (up, down) = (Arc::new(up), Arc::new(down));
        for c in 0..copies {
            let w = width / copies + u32::from(c < width % copies);
            flows.push((up.clone(), down.clone(), off, w));
            off += w;
        }
    }
    let chunks = pieces * units;
    let mut b = ScheduleBuilder::new(Collective::AllReduce, n, chunks, in_place);
    for j in 0..pieces {
        for (f, (up, down, off, w)) in flows.iter().enumerate() {
            let k = pieces * off + j * w;
            let at = Loc::output(k);
            let f = f as u32;
            super::up_piece(&mut b, up, Loc::input(k), at, *w, 2 * f);
            super::down_piece(&mut b, down, at, at, *w, 2 * f + 1);
        }
    }
    let params = FamilyParams {
        channels: 2 * flows.len() as u32,
        pipeline: pieces,
    };
    let record = record(packing);
    candidate(name, params, b)
        .into_iter()
        .map(|c| {
            c.from_bytes(u64::from(chunks) * MIN_CHUNK_BYTES)
                .synthesized(record.clone())
        })
        .collect()
}

/// AllReduce over [`allreduce_packing`]'s trees, at a [`SynthLevel`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PackedAllReduce {
    pub level: SynthLevel,
}

impl PackedAllReduce {
    /// The family at `level`.
    pub fn at(level: SynthLevel) -> PackedAllReduce {
        PackedAllReduce { level }
    }
}

impl Family for PackedAllReduce {
    fn name(&self) -> &'static str {
        "packed_allreduce"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllReduce
    }

    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if !self.supports(collective.kind()) {
            return Vec::new();
        }
        let Some(packing) = allreduce_packing(topo, self.level) else {
            return Vec::new();
        };
        // The trees alone, and copies of them up to [`MAX_COPIES`].
        let trees = packing.trees.len() as u32;
        let mut out = Vec::new();
        for budget in [trees, MAX_COPIES.max(trees)] {
            for &pipeline in &PIPELINES {
                let p = FamilyParams {
                    channels: 2 * budget,
                    pipeline,
                };
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out
    }

    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if !self.supports(collective.kind()) {
            return Vec::new();
        }
        let Some(packing) = allreduce_packing(topo, self.level) else {
            return Vec::new();
        };
        lower_allreduce(
            self.name(),
            &packing,
            params.pipeline.max(1),
            (params.channels / 2).max(1),
            in_place,
        )
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        _collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        Some(u64::from(params.channels.max(1)) * u64::from(params.pipeline.max(1)) * 2 * n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_are_rooted_at_their_centre() {
        // The path 0 - 1 - 2 - 3 - 4, given rooted at 0: rooted anew at 2 (height 2).
        let path = [None, Some(0), Some(1), Some(2), Some(3)];
        let mut rooted = vec![0; 5];
        let p = rooted_at_centre(&path, &mut rooted).expect("a tree");
        assert_eq!(p, vec![Some(1), Some(2), None, Some(2), Some(3)]);
        assert_eq!(rooted, vec![0, 0, 1, 0, 0]);
        // The path 0 - 1 - 2 - 3 has two centres: the second tree goes to the other one.
        let path = [None, Some(0), Some(1), Some(2)];
        let mut rooted = vec![0; 4];
        let first = rooted_at_centre(&path, &mut rooted).expect("a tree");
        let second = rooted_at_centre(&path, &mut rooted).expect("a tree");
        assert_eq!(first[1], None);
        assert_eq!(second[2], None);
        // Not a tree: a parent out of range.
        assert!(rooted_at_centre(&[None, Some(7)], &mut [0, 0]).is_none());
    }

    #[test]
    fn ingress_differs_only_with_unequal_links() {
        let ring = hccl_topologies::build(hccl_topologies::generate::ring(6, 100.0, 1.0), "r")
            .expect("a ring");
        assert!(!unequal_ingress(&Network::new(&ring)));
        let dgx1 = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
        assert!(!unequal_ingress(&Network::new(&dgx1)));
        assert!(allreduce_packing(&dgx1, SynthLevel::Auto).is_none());
    }
}
