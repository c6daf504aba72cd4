//! Hybrid cube family: recursive halving (reduce-scatter) and recursive doubling (all-gather)
//! over the dimensions of a hypercube embedded in the topology, for AllReduce, AllGather and
//! ReduceScatter.
//!
//! # Embedding
//!
//! The `2^d` "core" ranks get cube labels such that the two ranks of every exchange (labels
//! differing in one bit) can talk without relaying through another device: they share a
//! direct link, or a switch fabric reaches both. The labelling is searched deterministically
//! over that graph ([`embed`]): a depth-first search that tries the best-connected candidates
//! first and, within a search budget, keeps the labelling whose weakest dimension is fastest
//! (compared dimension by dimension, fastest first). On the DGX-1 hybrid cube-mesh this puts
//! the first halving step, which moves half the buffer, on the doubled NVLinks
//! (0-1, 2-3, 4-5, 6-7). Generated hypercubes (`torus(&[2, 2, 2])`, `torus(&[4, 4])`) and
//! switched machines always embed; a topology without an embedding gets no schedule.
//!
//! # Non-powers of two
//!
//! The `n - 2^d` extra ranks are each paired with a distinct core rank they can reach. Before
//! the core runs, an extra sends its data to its partner (which reduces it in); afterwards the
//! partner sends the result back.
//!
//! # Channels and pipelining
//!
//! Every channel runs its own cube over its share of the buffer with the dimension order
//! rotated by the channel index, so that different channels use different links at the same
//! time; `pipeline` cuts every channel's share into pieces that follow each other through the
//! dimensions, so successive dimensions overlap.

use super::common::{candidate, grid, single_rank};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{
    BlockLabel, BlockLayout, ChunkMap, Collective, CollectiveKind, Loc, Op, Rank, Symmetry,
};
use hccl_topologies::{Node, Topology};
use std::cmp::Ordering;

/// Expansions of the embedding search before it settles for the best labelling found.
const SEARCH_BUDGET: u32 = 4000;

/// Most chunks a cube schedule may use.
const MAX_CUBE_CHUNKS: u32 = 4096;

/// A hypercube embedded in a topology.
#[derive(Debug, Clone, PartialEq)]
pub struct CubeEmbedding {
    /// `core[x]`: the rank with cube label `x` (`2^d` entries).
    pub core: Vec<Rank>,
    /// `extra[x]`: the rank folded into core label `x` (non-powers of two), if any.
    pub extra: Vec<Option<Rank>>,
    /// Cube dimensions (bit indices), fastest first: reduce-scatter halves along `order[0]`
    /// first and all-gather doubles along it last, so it carries the largest messages.
    pub order: Vec<u32>,
    /// Slowest pair bandwidth (GB/s) of each dimension in `order`.
    pub dim_bw: Vec<f64>,
}

impl CubeEmbedding {
    /// The cube dimension `d` (`core.len() == 2^d`).
    pub fn dims(&self) -> u32 {
        self.core.len().trailing_zeros()
    }
}

/// Which ranks can exchange data without relaying through another device, and how fast.
struct Reach {
    /// Direct device neighbours of each rank with the edge bandwidth, sorted by rank.
    direct: Vec<Vec<(Rank, f64)>>,
    /// Switch-fabric components (connected sets of non-device nodes) each rank touches.
    comps: Vec<Vec<usize>>,
    /// Fastest edge from each rank into a switch.
    local_bw: Vec<f64>,
    /// Fastest NIC of each rank's host.
    nic_bw: Vec<f64>,
    host_of: Vec<usize>,
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

impl Reach {
    fn new(topo: &Topology) -> Reach {
        let g = &topo.graph;
        let is_dev = |i: petgraph::graph::NodeIndex| matches!(g[i], Node::Device { .. });
        let mut parent: Vec<usize> = (0..g.node_count()).collect();
        for e in g.edge_indices() {
            if let Some((a, b)) = g.edge_endpoints(e)
                && !is_dev(a)
                && !is_dev(b)
            {
                let (x, y) = (find(&mut parent, a.index()), find(&mut parent, b.index()));
                if x != y {
                    parent[x.max(y)] = x.min(y);
                }
            }
        }
        let mut host_nic = vec![0.0f64; topo.nhosts()];
        for i in g.node_indices() {
            if let Node::Nic { host, bw, .. } = g[i]
                && let Some(h) = host_nic.get_mut(host)
            {
                *h = h.max(bw);
            }
        }
        let mut rank_of = vec![u32::MAX; g.node_count()];
        for (r, node) in topo.ranks.iter().enumerate() {
            rank_of[node.index()] = r as Rank;
        }
        let n = topo.ranks.len();
        let mut reach = Reach {
            direct: vec![Vec::new(); n],
            comps: vec![Vec::new(); n],
            local_bw: vec![0.0; n],
            nic_bw: vec![0.0; n],
            host_of: topo.host_of.clone(),
        };
        for (r, &node) in topo.ranks.iter().enumerate() {
            for e in g.edges(node) {
                use petgraph::visit::EdgeRef;
                let m = e.target();
                if is_dev(m) {
                    let p = rank_of[m.index()];
                    if p != u32::MAX && p as usize != r {
                        reach.direct[r].push((p, e.weight().bw));
                    }
                } else {
                    reach.comps[r].push(find(&mut parent, m.index()));
                    reach.local_bw[r] = reach.local_bw[r].max(e.weight().bw);
                }
            }
            reach.direct[r].sort_by_key(|x| x.0);
            reach.direct[r].dedup_by_key(|x| x.0);
            reach.comps[r].sort_unstable();
            reach.comps[r].dedup();
            reach.nic_bw[r] = topo.host_of.get(r).map_or(0.0, |&h| host_nic[h]);
        }
        reach
    }

    fn direct_bw(&self, a: Rank, b: Rank) -> Option<f64> {
        let list = &self.direct[a as usize];
        list.binary_search_by_key(&b, |x| x.0)
            .ok()
            .map(|i| list[i].1)
    }

    fn switched(&self, a: Rank, b: Rank) -> bool {
        let (x, y) = (&self.comps[a as usize], &self.comps[b as usize]);
        x.iter().any(|c| y.binary_search(c).is_ok())
    }

    fn adjacent(&self, a: Rank, b: Rank) -> bool {
        a != b && (self.direct_bw(a, b).is_some() || self.switched(a, b))
    }

    /// Bandwidth class of the pair (GB/s); `None` when they cannot talk without a relay.
    fn score(&self, a: Rank, b: Rank) -> Option<f64> {
        if a == b {
            return None;
        }
        if let Some(bw) = self.direct_bw(a, b) {
            return Some(bw);
        }
        if !self.switched(a, b) {
            return None;
        }
        let (a, b) = (a as usize, b as usize);
        Some(if self.host_of[a] == self.host_of[b] {
            self.local_bw[a].min(self.local_bw[b])
        } else {
            self.nic_bw[a].min(self.nic_bw[b])
        })
    }

    /// Candidate ranks for a cube neighbour of `anchor`, best first: direct neighbours by
    /// bandwidth, then switched ranks of the same host, then the others, by rank.
    fn candidates(&self, anchor: Rank, taken: &[bool]) -> Vec<Rank> {
        let mut direct: Vec<(Rank, f64)> = self.direct[anchor as usize]
            .iter()
            .copied()
            .filter(|&(p, _)| !taken[p as usize])
            .collect();
        direct.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
        let mut out: Vec<Rank> = direct.iter().map(|x| x.0).collect();
        let h = self.host_of[anchor as usize];
        let n = taken.len() as Rank;
        let rest = |same: bool| {
            (0..n).filter(move |&r| {
                !taken[r as usize]
                    && r != anchor
                    && (self.host_of[r as usize] == h) == same
                    && self.direct_bw(anchor, r).is_none()
                    && self.switched(anchor, r)
            })
        };
        out.extend(rest(true));
        out.extend(rest(false));
        out
    }
}

/// Comparable quality of an embedding: per-dimension slowest pair, fastest first, then the
/// slowest fold pair, then the sum over all pairs.
#[derive(Debug, Clone, PartialEq)]
struct Quality {
    dims: Vec<f64>,
    fold: f64,
    total: f64,
}

impl Quality {
    fn cmp(&self, other: &Quality) -> Ordering {
        for (a, b) in self.dims.iter().zip(&other.dims) {
            match a.total_cmp(b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        self.fold
            .total_cmp(&other.fold)
            .then(self.total.total_cmp(&other.total))
    }
}

/// Pairs each extra rank with a distinct core rank it can reach (augmenting paths, best
/// bandwidth first); `None` when some extra cannot be paired.
fn match_extras(reach: &Reach, core: &[Rank], in_core: &[bool]) -> Option<Vec<Option<Rank>>> {
    let n = in_core.len();
    let extras: Vec<Rank> = (0..n as Rank).filter(|&r| !in_core[r as usize]).collect();
    let opts: Vec<Vec<usize>> = extras
        .iter()
        .map(|&e| {
            let mut v: Vec<(usize, f64)> = core
                .iter()
                .enumerate()
                .filter_map(|(x, &c)| reach.score(e, c).map(|s| (x, s)))
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            v.into_iter().map(|x| x.0).collect()
        })
        .collect();
    // owner[x]: index into `extras` of the extra paired with label x.
    let mut owner: Vec<Option<usize>> = vec![None; core.len()];
    for i in 0..extras.len() {
        let mut seen = vec![false; core.len()];
        if !augment(i, &opts, &mut owner, &mut seen) {
            return None;
        }
    }
    Some(owner.iter().map(|o| o.map(|i| extras[i])).collect())
}

fn augment(i: usize, opts: &[Vec<usize>], owner: &mut [Option<usize>], seen: &mut [bool]) -> bool {
    // Iterative depth-first augmenting path search (no recursion on large inputs).
    // Stack entries: (extra, next option index, label taken on the way down).
    let mut stack: Vec<(usize, usize)> = vec![(i, 0)];
    let mut path: Vec<usize> = Vec::new();
    while let Some(&mut (e, ref mut k)) = stack.last_mut() {
        let Some(&x) = opts[e].get(*k) else {
            stack.pop();
            path.pop();
            continue;
        };
        *k += 1;
        if seen[x] {
            continue;
        }
        seen[x] = true;
        match owner[x] {
            None => {
                // Flip the path: each extra on the stack takes the label chosen below it.
                path.push(x);
                for (level, &(ex, _)) in stack.iter().enumerate() {
                    owner[path[level]] = Some(ex);
                }
                return true;
            }
            Some(other) => {
                path.push(x);
                stack.push((other, 0));
            }
        }
    }
    false
}

/// Searches a hypercube labelling of the topology's ranks (see the module docs); `None` when
/// none exists (or none was found within the search budget).
pub fn embed(topo: &Topology) -> Option<CubeEmbedding> {
    let n = topo.nranks() as usize;
    if n < 2 {
        return None;
    }
    let reach = Reach::new(topo);
    let l = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let d = l.trailing_zeros();
    // Depth-first search over labels 0..l; `cands[x]` are the options for label x.
    let mut f: Vec<Rank> = Vec::with_capacity(l);
    let mut taken = vec![false; n];
    let mut cands: Vec<(Vec<Rank>, usize)> = vec![((0..n as Rank).collect(), 0)];
    let mut budget = SEARCH_BUDGET.max(4 * n as u32);
    let mut best: Option<(Quality, Vec<Rank>, Vec<Option<Rank>>)> = None;
    while let Some((list, next)) = cands.last_mut() {
        let x = f.len();
        let pick = list.get(*next).copied();
        *next += 1;
        let Some(r) = pick else {
            cands.pop();
            if let Some(gone) = f.pop() {
                taken[gone as usize] = false;
            }
            continue;
        };
        if budget == 0 {
            break;
        }
        budget -= 1;
        // Every other cube neighbour already labelled must be reachable too.
        let ok = (0..d).all(|b| {
            let y = x ^ (1 << b);
            y >= x || y == x & (x - 1) || reach.adjacent(f[y], r)
        });
        if !ok {
            continue;
        }
        f.push(r);
        taken[r as usize] = true;
        if f.len() == l {
            if let Some(extra) = match_extras(&reach, &f, &taken) {
                let q = quality(&reach, &f, &extra, d);
                if best
                    .as_ref()
                    .is_none_or(|b| q.cmp(&b.0) == Ordering::Greater)
                {
                    best = Some((q, f.clone(), extra));
                }
                if n > 16 {
                    break;
                }
            }
            f.pop();
            taken[r as usize] = false;
            continue;
        }
        let y = f.len();
        let anchor = f[y ^ (y & y.wrapping_neg())];
        cands.push((reach.candidates(anchor, &taken), 0));
    }
    let (_, core, extra) = best?;
    let mut dims: Vec<(u32, f64, f64)> = (0..d)
        .map(|b| {
            let (lo, sum) = dim_bw(&reach, &core, b);
            (b, lo, sum)
        })
        .collect();
    dims.sort_by(|x, y| {
        y.1.total_cmp(&x.1)
            .then(y.2.total_cmp(&x.2))
            .then(x.0.cmp(&y.0))
    });
    Some(CubeEmbedding {
        core,
        extra,
        order: dims.iter().map(|x| x.0).collect(),
        dim_bw: dims.iter().map(|x| x.1).collect(),
    })
}

/// [`embed`], remembered per topology (by content hash) for the rest of the process: the
/// search asks for every parameter set and collective, and on a thousand ranks one search
/// takes a noticeable fraction of a second.
pub fn embed_cached(topo: &Topology) -> Option<CubeEmbedding> {
    type Cache = std::sync::Mutex<Vec<(String, Option<CubeEmbedding>)>>;
    /// Topologies remembered at once (a compile uses one; tests use a few).
    const KEEP: usize = 8;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = format!("{}/{}", topo.hash, topo.nranks());
    if let Ok(held) = cache.lock()
        && let Some((_, emb)) = held.iter().find(|(k, _)| *k == key)
    {
        return emb.clone();
    }
    let emb = embed(topo);
    if let Ok(mut held) = cache.lock() {
        if held.len() >= KEEP {
            held.remove(0);
        }
        held.push((key, emb.clone()));
    }
    emb
}

/// Slowest and summed pair bandwidth of cube dimension `b`.
fn dim_bw(reach: &Reach, core: &[Rank], b: u32) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut sum = 0.0;
    for x in 0..core.len() {
        let y = x ^ (1 << b);
        if y > x {
            let s = reach.score(core[x], core[y]).unwrap_or(0.0);
            lo = lo.min(s);
            sum += s;
        }
    }
    (lo, sum)
}

fn quality(reach: &Reach, core: &[Rank], extra: &[Option<Rank>], d: u32) -> Quality {
    let mut dims = Vec::new();
    let mut total = 0.0;
    for b in 0..d {
        let (lo, sum) = dim_bw(reach, core, b);
        dims.push(lo);
        total += sum;
    }
    dims.sort_by(|a, b| b.total_cmp(a));
    let fold = core
        .iter()
        .zip(extra)
        .filter_map(|(&c, e)| e.map(|e| reach.score(c, e).unwrap_or(0.0)))
        .fold(f64::INFINITY, f64::min);
    Quality { dims, fold, total }
}

/// Splits sorted, distinct chunks into runs along which every location function stays
/// contiguous, and calls `emit(first, count)` for each.
fn for_runs(chunks: &[u32], locs: &[&dyn Fn(u32) -> Loc], mut emit: impl FnMut(u32, u32)) {
    let mut i = 0;
    while i < chunks.len() {
        let start = chunks[i];
        let mut j = i + 1;
        while j < chunks.len() && chunks[j] == chunks[j - 1] + 1 && {
            let (prev, next) = (chunks[j - 1], chunks[j]);
            locs.iter().all(|f| {
                let (a, b) = (f(prev), f(next));
                a.buf == b.buf && a.off.checked_add(1) == Some(b.off)
            })
        } {
            j += 1;
        }
        emit(start, (j - i) as u32);
        i = j;
    }
}

/// Where chunks live during one collective (per kind and buffer arrangement).
struct Layout {
    kind: CollectiveKind,
    in_place: bool,
    /// Chunks per rank block (`channels × pipeline`).
    m: u32,
}

impl Layout {
    /// A rank's contribution of chunk `k` (reductions).
    fn contrib(&self, _r: Rank, k: u32) -> Loc {
        Loc::input(k)
    }

    /// Where a rank accumulates chunk `k`: the output for AllReduce and the rank's own
    /// ReduceScatter block, scratch for the blocks it reduces for others.
    fn work(&self, r: Rank, k: u32) -> Loc {
        match self.kind {
            CollectiveKind::ReduceScatter if k / self.m == r => {
                if self.in_place {
                    Loc::input(k)
                } else {
                    Loc::output(k - r * self.m)
                }
            }
            CollectiveKind::ReduceScatter => Loc::scratch(k),
            _ => Loc::output(k),
        }
    }
}

/// Builds a cube schedule over `emb` for `n` ranks. With `ranges` (what the family uses),
/// AllReduce's exchanges are cut from slot ranges instead of by listing every chunk they
/// move (the same schedule: the tests compare both). An
/// AllReduce exchange moves the blocks of the labels that agree with one label on the bits
/// already halved (or not yet doubled): those are the leading bits of the slot order, so
/// the blocks are the consecutive slots from that label with the free bits clear to it
/// with them all set (its extra included). Listing them costs `n` per exchange (`n²` in
/// all, 34M chunks sorted at 4096 ranks); the range costs one lookup.
fn cube_schedule(
    name: &str,
    emb: &CubeEmbedding,
    n: u32,
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
    ranges: bool,
) -> Vec<Candidate> {
    let kind = collective.kind();
    let nch = params.channels.max(1);
    let pp = params.pipeline.max(1);
    let m = nch * pp;
    let Some(chunks) = n.checked_mul(m) else {
        return Vec::new();
    };
    let d = emb.dims() as usize;
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    // Channel c's dimension order: the base order rotated by c.
    let orders: Vec<Vec<u32>> = (0..nch as usize)
        .map(|c| {
            let mut o = emb.order.clone();
            o.rotate_left(c % d.max(1));
            o
        })
        .collect();
    let cube = Cube {
        emb,
        n,
        kind,
        pp,
        m,
        lay: Layout { kind, in_place, m },
        folded: emb.extra.iter().map(Option::is_some).collect(),
        slots: slot_orders(emb, n, &orders),
        ranges: ranges && kind == CollectiveKind::AllReduce,
    };
    cube.fold_in(&mut b);
    let mut scratch = (Vec::new(), Vec::new());
    for q in 0..pp {
        for (c, ord) in orders.iter().enumerate() {
            if kind == CollectiveKind::AllReduce {
                cube.fold_piece(&mut b, c as u32, q);
            }
            if matches!(
                kind,
                CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
            ) {
                cube.halving(&mut b, (c, q), ord, &mut scratch);
            }
            if matches!(kind, CollectiveKind::AllReduce | CollectiveKind::AllGather) {
                cube.doubling(&mut b, (c, q), ord, &mut scratch);
            }
            if kind == CollectiveKind::AllReduce {
                cube.unfold_piece(&mut b, c as u32, q);
            }
        }
    }
    cube.unfold(&mut b, chunks);
    let symmetry = cube_symmetry(emb, kind, &cube.slots);
    candidate(name, params, b)
        .into_iter()
        .map(|c| c.with_symmetry(symmetry.clone()))
        .collect()
}

/// AllReduce places the blocks of each piece so that every halving set is contiguous: per
/// channel (dimension order `orders[c]`), each rank's slot, in the order of the label bits
/// with `order[0]` most significant (a folded-in rank right after its partner).
fn slot_orders(emb: &CubeEmbedding, n: u32, orders: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let l = emb.core.len();
    orders
        .iter()
        .map(|ord| {
            let mut slot = vec![0u32; n as usize];
            let mut by_pos: Vec<usize> = (0..l).collect();
            let pos = |x: usize| {
                ord.iter()
                    .fold(0usize, |acc, &bit| (acc << 1) | ((x >> bit) & 1))
            };
            by_pos.sort_by_key(|&x| pos(x));
            let mut next = 0;
            for x in by_pos {
                for r in std::iter::once(emb.core[x]).chain(emb.extra[x]) {
                    slot[r as usize] = next;
                    next += 1;
                }
            }
            slot
        })
        .collect()
}

/// What the phases of one cube schedule share: the embedding, the chunk layout and, for
/// AllReduce, the slot order of every channel.
struct Cube<'e> {
    emb: &'e CubeEmbedding,
    n: u32,
    kind: CollectiveKind,
    /// Pipeline depth, and chunks per rank block (`channels × pipeline`).
    pp: u32,
    m: u32,
    lay: Layout,
    /// Per label: whether an extra rank is folded into it.
    folded: Vec<bool>,
    slots: Vec<Vec<u32>>,
    /// Whether AllReduce's exchanges are cut from slot ranges (see [`cube_schedule`]).
    ranges: bool,
}

/// Scratch lists of the exchanges: chunks, and runs `(first, count)`.
type Scratch = (Vec<u32>, Vec<(u32, u32)>);

impl Cube<'_> {
    /// The chunk of rank `r`'s block in piece `q` of channel `c`.
    fn chunk_of(&self, c: usize, q: u32, r: Rank) -> u32 {
        let idx = c as u32 * self.pp + q;
        match self.kind {
            CollectiveKind::AllReduce => idx * self.n + self.slots[c][r as usize],
            _ => r * self.m + idx,
        }
    }

    /// Appends the chunks label `x` owns (its rank's and its extra's) in piece `q` of
    /// channel `c`.
    fn own(&self, c: usize, q: u32, x: usize, out: &mut Vec<u32>) {
        out.push(self.chunk_of(c, q, self.emb.core[x]));
        if let Some(e) = self.emb.extra[x] {
            out.push(self.chunk_of(c, q, e));
        }
    }

    /// AllReduce: the chunks of labels `lo..=hi` in slot order (`hi` = `lo` with the free
    /// bits set), as one range `(first, count)`.
    fn slot_range(&self, c: usize, q: u32, lo: usize, hi: usize) -> (u32, u32) {
        let first = self.chunk_of(c, q, self.emb.core[lo]);
        let last = self.chunk_of(c, q, self.emb.extra[hi].unwrap_or(self.emb.core[hi]));
        (first, last - first + 1)
    }

    /// Before the pieces: out-of-place AllGather's own blocks into the outputs, and the
    /// extras of ReduceScatter and AllGather folded in, in one go (AllReduce folds per
    /// piece).
    fn fold_in(&self, b: &mut ScheduleBuilder) {
        let (kind, m, lay) = (self.kind, self.m, &self.lay);
        // Out-of-place AllGather: every rank's own block into its output first.
        if kind == CollectiveKind::AllGather && !lay.in_place {
            for r in 0..self.n {
                b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
            }
        }
        for (x, e) in self.emb.extra.iter().enumerate() {
            let (Some(e), p) = (*e, self.emb.core[x]) else {
                continue;
            };
            match kind {
                CollectiveKind::ReduceScatter => {
                    let ks = (0..b.chunks()).collect::<Vec<u32>>();
                    for_runs(&ks, &[&|k| lay.work(p, k)], |k, cnt| {
                        b.reduce_to(
                            (e, Loc::input(k)),
                            Loc::input(k),
                            (p, lay.work(p, k)),
                            cnt,
                            0,
                        )
                    });
                }
                CollectiveKind::AllGather => {
                    b.copy((e, b.input_loc(e, 0)), (p, Loc::output(e * m)), m, 0);
                }
                _ => {}
            }
        }
    }

    /// AllReduce, piece `q` of channel `ch`: every extra's contribution reduced into its
    /// partner's.
    fn fold_piece(&self, b: &mut ScheduleBuilder, ch: u32, q: u32) {
        let n = self.n;
        let base = (ch * self.pp + q) * n;
        for (x, e) in self.emb.extra.iter().enumerate() {
            if let Some(e) = *e {
                let p = self.emb.core[x];
                b.reduce_to(
                    (e, Loc::input(base)),
                    Loc::input(base),
                    (p, Loc::output(base)),
                    n,
                    ch,
                );
            }
        }
    }

    /// AllReduce, piece `q` of channel `ch`: the result copied back to every extra.
    fn unfold_piece(&self, b: &mut ScheduleBuilder, ch: u32, q: u32) {
        let n = self.n;
        let base = (ch * self.pp + q) * n;
        for (x, e) in self.emb.extra.iter().enumerate() {
            if let Some(e) = *e {
                let p = self.emb.core[x];
                b.copy((p, Loc::output(base)), (e, Loc::output(base)), n, ch);
            }
        }
    }

    /// Recursive halving of piece `q` of channel `c` over the dimensions `ord`: after step
    /// `s`, label `x` holds the labels agreeing with it on bits `ord[0..=s]`. Every round
    /// records all sends before all receives, so each rank's ops run in the same relative
    /// order (send half, receive half) whatever its label: the schedule is then invariant
    /// under XOR translations of labels.
    fn halving(
        &self,
        b: &mut ScheduleBuilder,
        (c, q): (usize, u32),
        ord: &[u32],
        (buf, runs): &mut Scratch,
    ) {
        let (emb, lay, ch) = (self.emb, &self.lay, c as u32);
        let l = emb.core.len();
        let mut mask = 0usize;
        for (s, &bit) in ord.iter().enumerate() {
            let bit = 1usize << bit;
            for pass in [Pass::Send, Pass::Receive] {
                for x in 0..l {
                    let y = x ^ bit;
                    let free = (l - 1) & !(mask | bit);
                    let fixed = (x & mask) | (y & bit);
                    let (from, to) = (emb.core[x], emb.core[y]);
                    let src_first = s == 0 && !self.folded[x];
                    let acc_first = s == 0 && !self.folded[y];
                    let src = |k: u32| {
                        if src_first {
                            lay.contrib(from, k)
                        } else {
                            lay.work(from, k)
                        }
                    };
                    let acc = |k: u32| {
                        if acc_first {
                            lay.contrib(to, k)
                        } else {
                            lay.work(to, k)
                        }
                    };
                    let dst = |k: u32| lay.work(to, k);
                    runs.clear();
                    if self.ranges {
                        // Input and output offsets are the chunk: one run.
                        runs.push(self.slot_range(c, q, fixed, fixed | free));
                    } else {
                        buf.clear();
                        for_submasks(free, |sub| self.own(c, q, fixed | sub, buf));
                        buf.sort_unstable();
                        for_runs(buf, &[&src, &acc, &dst], |k, cnt| runs.push((k, cnt)));
                    }
                    for &(k, cnt) in runs.iter() {
                        match pass {
                            Pass::Send => b.send(from, to, src(k), cnt, ch),
                            Pass::Receive => b.push(
                                to,
                                Op::RecvReduceCopy {
                                    from,
                                    src: acc(k),
                                    dst: dst(k),
                                },
                                cnt,
                                ch,
                            ),
                        }
                    }
                }
            }
            mask |= bit;
        }
    }

    /// Recursive doubling of piece `q` of channel `c`, dimensions `ord` in reverse: before
    /// step `s`, label `x` holds the labels agreeing with it on bits `ord[0..=s]`.
    fn doubling(
        &self,
        b: &mut ScheduleBuilder,
        (c, q): (usize, u32),
        ord: &[u32],
        (buf, runs): &mut Scratch,
    ) {
        let (emb, ch) = (self.emb, c as u32);
        let l = emb.core.len();
        for s in (0..emb.dims() as usize).rev() {
            let bit = 1usize << ord[s];
            let mask: usize = ord[..=s].iter().fold(0, |a, &o| a | (1 << o));
            for pass in [Pass::Send, Pass::Receive] {
                for x in 0..l {
                    let y = x ^ bit;
                    let free = (l - 1) & !mask;
                    runs.clear();
                    if self.ranges {
                        let lo = x & mask;
                        runs.push(self.slot_range(c, q, lo, lo | free));
                    } else {
                        buf.clear();
                        for_submasks(free, |sub| self.own(c, q, (x & mask) | sub, buf));
                        buf.sort_unstable();
                        for_runs(buf, &[], |k, cnt| runs.push((k, cnt)));
                    }
                    let (from, to) = (emb.core[x], emb.core[y]);
                    for &(k, cnt) in runs.iter() {
                        match pass {
                            Pass::Send => b.send(from, to, Loc::output(k), cnt, ch),
                            Pass::Receive => b.recv(to, from, Loc::output(k), cnt, ch),
                        }
                    }
                }
            }
        }
    }

    /// After the pieces: the results of ReduceScatter and AllGather copied to the extras.
    fn unfold(&self, b: &mut ScheduleBuilder, chunks: u32) {
        let (n, m, lay) = (self.n, self.m, &self.lay);
        for (x, e) in self.emb.extra.iter().enumerate() {
            let (Some(e), p) = (*e, self.emb.core[x]) else {
                continue;
            };
            match self.kind {
                CollectiveKind::ReduceScatter => {
                    b.copy((p, lay.work(p, e * m)), (e, lay.work(e, e * m)), m, 0);
                }
                CollectiveKind::AllGather => {
                    if e > 0 {
                        b.copy((p, Loc::output(0)), (e, Loc::output(0)), e * m, 0);
                    }
                    if e + 1 < n {
                        let k = (e + 1) * m;
                        b.copy((p, Loc::output(k)), (e, Loc::output(k)), chunks - k, 0);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The XOR symmetry a cube AllReduce has when no rank is folded in: cube labels translate by
/// XOR, and so do the exchange partners. AllReduce numbers the blocks of a piece by slot
/// (the label with its bits in the channel's dimension order), so the grid is written in slot
/// order; one channel only, since every channel has its own slot order.
fn cube_symmetry(
    emb: &CubeEmbedding,
    kind: CollectiveKind,
    slots: &[Vec<u32>],
) -> Option<Symmetry> {
    if emb.extra.iter().any(Option::is_some) {
        return None;
    }
    match kind {
        CollectiveKind::AllReduce => {
            let [slot] = slots else {
                return None;
            };
            let mut by_slot = vec![0 as Rank; emb.core.len()];
            for &r in &emb.core {
                *by_slot.get_mut(*slot.get(r as usize)? as usize)? = r;
            }
            Some(Symmetry::xor(
                by_slot,
                Some(ChunkMap {
                    layout: BlockLayout::PieceMajor,
                    label: BlockLabel::Grid { order: vec![0] },
                }),
            ))
        }
        // AllGather and ReduceScatter number blocks by rank, and the runs a round moves are
        // runs of rank numbers: XOR on labels maps them onto runs only for the identity
        // labelling, which real embeddings rarely are. Stored in full.
        _ => None,
    }
}

/// Which half of an exchange round is being recorded.
#[derive(Clone, Copy)]
enum Pass {
    Send,
    Receive,
}

/// Calls `f` for every submask of `mask` (including 0 and `mask`).
fn for_submasks(mask: usize, mut f: impl FnMut(usize)) {
    let mut sub = mask;
    loop {
        f(sub);
        if sub == 0 {
            break;
        }
        sub = (sub - 1) & mask;
    }
}

/// The hybrid cube family (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct HybridCube;

impl Family for HybridCube {
    fn name(&self) -> &'static str {
        "hybrid_cube"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        )
    }
    fn param_space(&self, topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        let n = topo.nranks().max(1);
        grid(&[1, 2, 4], &[1, 2, 4], n, MAX_CUBE_CHUNKS.max(n))
    }
    /// Per rank and piece: `4d - 1` steps of AllReduce (halving and doubling, a send and a
    /// receive per dimension), about `2(n - 1) - d` of AllGather and `3(n - 1) / 2` of
    /// ReduceScatter (a message per block); within 5% of the generated counts on 64 ranks.
    /// Without it a 32,768-rank search spent minutes embedding a cube it could not use.
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks().max(1));
        let d = u64::from(n.ilog2());
        let per_rank = match collective.kind() {
            CollectiveKind::AllReduce => (4 * d).saturating_sub(1),
            CollectiveKind::AllGather => (2 * (n - 1)).saturating_sub(d),
            CollectiveKind::ReduceScatter => 3 * (n - 1) / 2,
            _ => return None,
        };
        Some(
            n.saturating_mul(per_rank.max(1))
                .saturating_mul(u64::from(params.channels.max(1)))
                .saturating_mul(u64::from(params.pipeline.max(1))),
        )
    }
    /// Hybrid cube schedules for either buffer arrangement; empty when the collective is not
    /// AllReduce, AllGather or ReduceScatter or the topology has no cube embedding.
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
        let n = topo.nranks();
        if n == 1 {
            return single_rank(self.name(), collective, in_place, params);
        }
        match embed_cached(topo) {
            Some(emb) => cube_schedule(self.name(), &emb, n, collective, params, in_place, true),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hccl_topologies::{build, generate, shipped_by_name};

    /// AllReduce's exchanges cut from slot ranges are exactly the schedule that listing
    /// every chunk gives: powers of two and not (extras folded in), direct links and
    /// switches, channels (rotated orders) and pipelines, both buffer arrangements.
    #[test]
    fn slot_ranges_build_the_listed_schedule() {
        let mut topos: Vec<Topology> = [3u32, 5, 8, 12, 16, 24, 33, 64]
            .iter()
            .map(|&n| build(generate::fat_tree(n, 4, 25.0, 1.0), "test").expect("fat tree"))
            .collect();
        topos.push(build(generate::torus(&[4, 4], 50.0, 0.5), "test").expect("torus"));
        topos.extend(
            ["dgx1-v100", "dgx-h100"]
                .iter()
                .filter_map(|n| shipped_by_name(n)),
        );
        let mut compared = 0;
        for topo in &topos {
            let Some(emb) = embed(topo) else { continue };
            let n = topo.nranks();
            for (channels, pipeline) in [(1, 1), (2, 1), (1, 3), (4, 2)] {
                let params = FamilyParams { channels, pipeline };
                for in_place in [false, true] {
                    let build = |ranges| {
                        cube_schedule(
                            "hybrid_cube",
                            &emb,
                            n,
                            Collective::AllReduce,
                            params,
                            in_place,
                            ranges,
                        )
                    };
                    let (fast, listed) = (build(true), build(false));
                    assert_eq!(fast.len(), listed.len());
                    for (a, b) in fast.iter().zip(&listed) {
                        assert!(
                            a.schedule == b.schedule,
                            "{} ranks {params:?} in_place={in_place}",
                            n
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared >= 60, "only {compared} schedules compared");
    }
}
