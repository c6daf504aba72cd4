//! Fractional packing of spanning arborescences by linear programming, with a proof of
//! optimality: the bandwidth-optimal Broadcast and Reduce (trees of one root) and AllGather
//! and ReduceScatter (trees of every root at once).
//!
//! A tree edge `u → v` is the simulator's route between the two ranks, so it occupies every
//! resource on that route (links, NIC directions); a tree that reaches two children over
//! the same link uses it twice. The packing sends `x_T` GB/s down each tree `T` rooted at
//! `r(T)`, subject to every resource's capacity, and maximises the rate `λ` every root gets:
//!
//! ```text
//! maximise λ   subject to   Σ_{T: r(T)=r} x_T ≥ λ           for every root r,
//!                           Σ_T use_T(ρ) · x_T ≤ cap(ρ)      for every resource ρ,   x ≥ 0
//! ```
//!
//! With one root this is the usual `maximise Σ x_T`.
//!
//! **Column generation.** The trees are too many to list, so the LP runs over a pool. The
//! pool starts with trees found by Garg–Könemann pricing: each round takes the cheapest
//! arborescence under resource lengths that grow with the load already routed through them
//! ([`super::arborescence`]). Then its dual is solved:
//!
//! ```text
//! minimise Σ_ρ cap(ρ)·y_ρ   subject to   Σ_r z_r = 1,   Σ_ρ use_T(ρ)·y_ρ ≥ z_{r(T)}  (T in the pool)
//! ```
//!
//! and every root's cheapest arborescence under the prices `y` (cost `c_r`) joins the pool
//! when it is cheaper than `z_r`. Whatever the round, `(y, c) / Σ_r c_r` is feasible for the
//! dual over *every* tree, so `λ ≤ Σ_ρ cap(ρ)·y_ρ / Σ_r c_r`: [`Pool::bound`], a proven upper
//! bound on every tree packing over these routes. When it meets the pool's rate the packing
//! is optimal. Any Broadcast (Reduce, AllGather, ReduceScatter) schedule over the simulator's
//! routes is such a packing in the limit of small pieces (every piece reaches every rank
//! over some arborescence; reaching one twice only wastes), so the bound is also a lower
//! bound on their time: [`crate::cost::bounds`] uses it.
//!
//! The LP support can hold many trees; every tree is a channel of the lowered schedule, so
//! [`prune`] keeps at most a few per root (dropping the lightest and weighing the rest again).

use super::Network;
use super::arborescence::min_arborescence;
use super::memo::Memo;
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, WithTimeLimit, constraint,
    variable,
};
use hccl_ir::{Collective, CollectiveKind};
use hccl_topologies::Topology;
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// Why a synthesis produced nothing.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SynthError {
    /// The instance cannot be synthesized (a rank unreachable, no capacity, bad root).
    #[error("cannot synthesize: {0}")]
    Instance(String),
    /// The solver failed (infeasible, unbounded, numerical trouble).
    #[error("LP solver failed: {0}")]
    Solver(String),
}

/// Largest rank count Broadcast and Reduce are packed for inside a search (`--synth auto`;
/// twice as many with `full`).
pub const SYNTH_MAX_RANKS: u32 = 32;
/// Largest rank count AllGather and ReduceScatter are packed for inside a search (every
/// rank is a root: one pricing problem per rank per round; twice as many with `full`).
pub const SYNTH_MAX_RANKS_ALL: u32 = 16;

/// Largest rank count `collective` is packed for inside a search at the default synthesis
/// level ([`SYNTH_MAX_RANKS`] or [`SYNTH_MAX_RANKS_ALL`]), and so the largest its packing
/// bound ([`packing_bound`]) is computed for.
pub fn auto_max_ranks(collective: Collective) -> u32 {
    match collective.kind() {
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => SYNTH_MAX_RANKS_ALL,
        _ => SYNTH_MAX_RANKS,
    }
}

/// The roots and direction of the packing `collective` runs on (`None`: not a packing).
pub fn packing_of(collective: Collective, nranks: u32) -> Option<(Vec<u32>, Direction)> {
    match collective {
        Collective::Broadcast { root } => Some((vec![root], Direction::FromRoot)),
        Collective::Reduce { root } => Some((vec![root], Direction::ToRoot)),
        Collective::AllGather => Some(((0..nranks).collect(), Direction::FromRoot)),
        Collective::ReduceScatter => Some(((0..nranks).collect(), Direction::ToRoot)),
        _ => None,
    }
}

/// A pool's cache key: topology hash, roots, direction.
pub(crate) type PoolKey = (String, Vec<u32>, Direction);

/// The pool for `key`, computed once per process by `compute`.
pub(crate) fn cached(
    key: PoolKey,
    compute: impl FnOnce() -> Option<Arc<Pool>>,
) -> Option<Arc<Pool>> {
    static POOLS: Memo<PoolKey, Option<Arc<Pool>>> = Memo::new();
    POOLS.get(key, compute)
}

/// The optimal pool of trees for `roots` on `net` (cached by topology hash).
pub fn pool(net: &Network, roots: &[u32], direction: Direction) -> Option<Arc<Pool>> {
    cached((net.topo_hash.clone(), roots.to_vec(), direction), || {
        grow_pool(net, roots, direction).ok().map(Arc::new)
    })
}

/// The optimal pool of trees for `roots` on `topo` (cached by topology hash; the network is
/// built only when the pool is not cached yet).
pub(crate) fn pool_for_topo(
    topo: &Topology,
    roots: &[u32],
    direction: Direction,
) -> Option<Arc<Pool>> {
    cached((topo.hash.clone(), roots.to_vec(), direction), || {
        grow_pool(&Network::new(topo), roots, direction)
            .ok()
            .map(Arc::new)
    })
}

/// The proven upper bound on the rate (GB/s per root) of any schedule of `collective` over
/// `net`'s routes, from the packing LP's dual (this module): Broadcast and Reduce move the
/// whole buffer at no more than this, AllGather and ReduceScatter each rank's block. `None`
/// for other collectives and outside the sizes the synthesizer runs on.
pub fn packing_bound(net: &Network, collective: Collective) -> Option<f64> {
    let n = net.nranks();
    if n < 2 || n > auto_max_ranks(collective) {
        return None;
    }
    let (roots, direction) = packing_of(collective, n)?;
    let bound = pool(net, &roots, direction)?.bound;
    (bound.is_finite() && bound > 0.0).then_some(bound)
}

/// Most trees a packing keeps per root: every tree is a channel of the lowered schedule.
pub const MAX_TREES: usize = 16;
/// Garg–Könemann pricing rounds per rank (the pool grows by at most one tree per round).
const ROUNDS_PER_RANK: usize = 6;
/// Least Garg–Könemann rounds.
const MIN_ROUNDS: usize = 24;
/// Garg–Könemann's step: how fast a resource's length grows with its load.
const EPSILON: f64 = 0.25;
/// Trees carrying less than this share of a root's rate are dropped.
const MIN_SHARE: f64 = 0.01;
/// Column-generation rounds at most (each solves the dual LP and prices every root).
const MAX_CG_ROUNDS: usize = 60;
/// Column generation stops when the proven bound is within this factor of the pool's rate.
const CG_GAP: f64 = 1e-4;
/// Time limit of the tree-selection MILP in [`prune`] (seconds), about five times what the
/// largest shipped machine needs (1.1 s for the 4-node cluster's Broadcast at 16 trees). A
/// solve that reaches [`MILP_GIVE_UP`] of it is discarded and the greedy elimination decides
/// alone, so that a compile's result does not depend on the machine's speed or load (a
/// 4×4 torus's selection never finishes in time, and always gets the greedy one).
const MILP_SECONDS: f64 = 6.0;
/// Share of [`MILP_SECONDS`] past which a selection MILP counts as timed out.
const MILP_GIVE_UP: f64 = 0.75;
/// Pools up to this many trees are searched whole by the MILP.
const MILP_POOL: usize = 64;
/// Hop tie-break on pricing costs (relative, per resource on the route).
const HOP_TIE: f64 = 1e-6;

/// Direction of a packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Data leaves the root (Broadcast, AllGather): tree edge `parent → child`.
    FromRoot,
    /// Data reaches the root (Reduce, ReduceScatter): tree edge `child → parent`.
    ToRoot,
    /// Data is reduced up the tree and sent back down it (AllReduce,
    /// [`super::allreduce`]): a tree edge occupies the routes both ways, and the root is
    /// immaterial (the trees are packed from rank 0 and rooted anew when lowered).
    Both,
}

/// One weighted spanning tree of a packing.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedTree {
    pub root: u32,
    /// Parent of every rank (`None` for the root).
    pub parents: Vec<Option<u32>>,
    /// Rate (GB/s).
    pub rate: f64,
}

/// Weighted spanning trees, a few per root.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// The roots (one for Broadcast and Reduce, every rank for AllGather and ReduceScatter).
    pub roots: Vec<u32>,
    pub direction: Direction,
    pub trees: Vec<PackedTree>,
    /// Rate every root gets (GB/s): the least, over roots, of its trees' rates summed.
    pub rate: f64,
    /// Rate of the LP over the whole pool, before pruning (GB/s).
    pub pool_rate: f64,
    /// Proven upper bound on the rate of any packing over these routes (GB/s).
    pub bound: f64,
    /// Trees the pricing found.
    pub pool: usize,
    /// How the trees were chosen: the LP's support pruned (`lp-tree-packing`),
    /// link-disjoint arborescences (`disjoint-arborescences`) or equal-rate trees over the
    /// routes (`equal-rate-trees`), both of [`super::disjoint`].
    pub method: &'static str,
}

impl Packing {
    /// The trees of `root`.
    pub fn trees_of(&self, root: u32) -> impl Iterator<Item = &PackedTree> {
        self.trees.iter().filter(move |t| t.root == root)
    }
}

/// Resources a tree occupies, with multiplicity (sorted by resource).
type Usage = Vec<(u32, f64)>;

/// A priced tree.
#[derive(Debug, Clone)]
struct Priced {
    root: u32,
    parents: Vec<Option<u32>>,
    usage: Usage,
}

/// Packs at most [`MAX_TREES`] spanning arborescences rooted at `root` on `net`'s routes (see
/// the module docs).
pub fn pack(net: &Network, root: u32, direction: Direction) -> Result<Packing, SynthError> {
    prune(&grow_pool(net, &[root], direction)?, MAX_TREES)
}

/// The priced trees, their optimal weights over the pool, and the proof of how good they are.
#[derive(Debug, Clone)]
pub struct Pool {
    pub roots: Vec<u32>,
    pub direction: Direction,
    trees: Vec<Priced>,
    /// The LP's weight of every tree.
    weights: Vec<f64>,
    /// Capacity of every resource (GB/s).
    capacity: Vec<f64>,
    /// λ over the pool (GB/s).
    rate: f64,
    /// Proven upper bound on λ over every tree packing on these routes (GB/s).
    pub bound: f64,
    /// Column-generation rounds run.
    pub rounds: usize,
}

impl Pool {
    /// Rate every root gets from the LP over the whole pool (GB/s).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether the pool's rate meets the proven bound (the packing is optimal).
    pub fn optimal(&self) -> bool {
        self.rate >= self.bound * (1.0 - 2.0 * CG_GAP)
    }

    /// Trees in the pool.
    pub fn len(&self) -> usize {
        self.trees.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }

    /// Most trees any root has with a share of at least 1% of the rate.
    pub fn support(&self) -> usize {
        let mut count: HashMap<u32, usize> = HashMap::new();
        for (t, &w) in self.trees.iter().zip(&self.weights) {
            if w > MIN_SHARE * self.rate {
                *count.entry(t.root).or_default() += 1;
            }
        }
        count.values().copied().max().unwrap_or(0)
    }
}

/// Routes of every rank-graph edge, as resource lists indexed `u·n + v` for the tree edge
/// `u → v` (parent to child), whatever the direction data flows.
struct Instance {
    n: usize,
    edge_res: Vec<Vec<u32>>,
    /// Longest route (resources).
    max_len: usize,
    capacity: Vec<f64>,
}

impl Instance {
    fn new(net: &Network, roots: &[u32], direction: Direction) -> Result<Instance, SynthError> {
        let n = net.nranks() as usize;
        if n < 2 {
            return Err(SynthError::Instance(
                "a single rank has nothing to send".into(),
            ));
        }
        if roots.is_empty() {
            return Err(SynthError::Instance("no root to pack trees for".into()));
        }
        if let Some(r) = roots.iter().find(|&&r| r as usize >= n) {
            return Err(SynthError::Instance(format!(
                "root {r} is not a rank of this {n}-rank topology"
            )));
        }
        let edges: Vec<(u32, u32)> = (0..n as u32)
            .flat_map(|u| (0..n as u32).filter(move |&v| v != u).map(move |v| (u, v)))
            .collect();
        let pairs: Vec<(u32, u32)> = edges
            .iter()
            .map(|&(u, v)| match direction {
                Direction::FromRoot | Direction::Both => (u, v),
                Direction::ToRoot => (v, u),
            })
            .collect();
        let routes = net
            .routes(&pairs)
            .map_err(|e| SynthError::Instance(e.to_string()))?;
        // `edges` lists every ordered pair, so the route back of `u → v` is that of `v → u`.
        let index = |u: u32, v: u32| u as usize * (n - 1) + if v < u { v } else { v - 1 } as usize;
        let mut edge_res: Vec<Vec<u32>> = vec![Vec::new(); n * n];
        for (&(u, v), r) in edges.iter().zip(&routes) {
            let mut res = r.resources.clone();
            if direction == Direction::Both {
                res.extend_from_slice(&routes[index(v, u)].resources);
            }
            edge_res[u as usize * n + v as usize] = res;
        }
        let max_len = edge_res.iter().map(Vec::len).max().unwrap_or(0);
        Ok(Instance {
            n,
            edge_res,
            max_len,
            capacity: net.capacity.clone(),
        })
    }

    /// The cheapest arborescence of `root` when resource `ρ` costs `price[ρ]`, and a lower
    /// bound on the cost of every arborescence of `root` (the found tree's cost less the
    /// hop tie-break it may have gained by).
    fn cheapest(&self, root: u32, price: &[f64]) -> Result<(Vec<Option<u32>>, f64), SynthError> {
        let n = self.n;
        let parents = min_arborescence(n, root as usize, |u, v| {
            let res = &self.edge_res[u * n + v];
            res.iter().map(|&r| price[r as usize]).sum::<f64>() * (1.0 + HOP_TIE * res.len() as f64)
        })
        .ok_or_else(|| {
            SynthError::Instance(format!(
                "some rank cannot be reached from rank {root} over the routes"
            ))
        })?;
        let parents: Vec<Option<u32>> = parents.iter().map(|p| p.map(|u| u as u32)).collect();
        let perturbed: f64 = parents
            .iter()
            .enumerate()
            .filter_map(|(v, p)| p.map(|u| (u as usize, v)))
            .map(|(u, v)| {
                let res = &self.edge_res[u * n + v];
                res.iter().map(|&r| price[r as usize]).sum::<f64>()
                    * (1.0 + HOP_TIE * res.len() as f64)
            })
            .sum();
        Ok((parents, perturbed / (1.0 + HOP_TIE * self.max_len as f64)))
    }

    /// Resources the tree `parents` occupies.
    fn usage(&self, parents: &[Option<u32>]) -> Usage {
        let mut count: HashMap<u32, f64> = HashMap::new();
        for (v, p) in parents.iter().enumerate() {
            if let Some(u) = p {
                for &r in &self.edge_res[*u as usize * self.n + v] {
                    *count.entry(r).or_default() += 1.0;
                }
            }
        }
        let mut usage: Usage = count.into_iter().collect();
        usage.sort_by_key(|&(r, _)| r);
        usage
    }
}

/// Prices trees for `roots` and weighs them by the LP, until the dual proves the packing
/// optimal (see the module docs).
pub fn grow_pool(net: &Network, roots: &[u32], direction: Direction) -> Result<Pool, SynthError> {
    let inst = Instance::new(net, roots, direction)?;
    let n = inst.n;
    let cap = &inst.capacity;
    let mut pool: Vec<Priced> = Vec::new();
    let add = |pool: &mut Vec<Priced>, root: u32, parents: Vec<Option<u32>>| -> bool {
        if pool.iter().any(|t| t.root == root && t.parents == parents) {
            return false;
        }
        let usage = inst.usage(&parents);
        pool.push(Priced {
            root,
            parents,
            usage,
        });
        true
    };
    // Warm start: Garg–Könemann lengths, one cheapest tree per round, roots in turn.
    let mut length: Vec<f64> = cap
        .iter()
        .map(|&c| if c > 0.0 { 1.0 / c } else { f64::INFINITY })
        .collect();
    let rounds = (ROUNDS_PER_RANK * n).max(MIN_ROUNDS).max(2 * roots.len());
    for i in 0..rounds {
        let root = roots[i % roots.len()];
        let (parents, _) = inst.cheapest(root, &length)?;
        let usage = inst.usage(&parents);
        if usage.is_empty() {
            break;
        }
        let f = usage
            .iter()
            .map(|&(r, k)| cap[r as usize] / k)
            .fold(f64::INFINITY, f64::min);
        for &(r, k) in &usage {
            length[r as usize] *= 1.0 + EPSILON * f * k / cap[r as usize];
        }
        add(&mut pool, root, parents);
    }
    // Column generation on the dual.
    let mut bound = f64::INFINITY;
    let mut cg_rounds = 0;
    let mut value = 0.0;
    for _ in 0..MAX_CG_ROUNDS {
        cg_rounds += 1;
        let dual = solve_dual(&pool, roots, cap)?;
        value = dual.value;
        let mut lower_sum = 0.0;
        let mut added = 0;
        for (i, &root) in roots.iter().enumerate() {
            let (parents, lower) = inst.cheapest(root, &dual.price)?;
            lower_sum += lower;
            if lower < dual.z[i] * (1.0 - 1e-9) && add(&mut pool, root, parents) {
                added += 1;
            }
        }
        if lower_sum > 0.0 {
            bound = bound.min(value / lower_sum);
        }
        if added == 0 || bound <= value * (1.0 + CG_GAP) {
            break;
        }
    }
    let (weights, rate) = solve_primal(&pool, roots, cap)?;
    // The LP's own rate can sit a hair above `value` from solver tolerances.
    let bound = bound.max(rate).max(value);
    Ok(Pool {
        roots: roots.to_vec(),
        direction,
        trees: pool,
        weights,
        capacity: inst.capacity,
        rate,
        bound,
        rounds: cg_rounds,
    })
}

/// A packing of at most `max_trees` trees per root of `pool`. One root: the trees are chosen
/// by a MILP ([`select_milp`]). Every root (the MILP would be large): each root with too many
/// drops its lightest tree and the rest are weighed again (the LP moves the share to the
/// others), until few enough remain.
pub fn prune(pool: &Pool, max_trees: usize) -> Result<Packing, SynthError> {
    let cap = &pool.capacity;
    let max_trees = max_trees.max(1);
    let mut kept: Vec<Priced> = pool
        .trees
        .iter()
        .zip(&pool.weights)
        .filter(|(_, w)| **w > MIN_SHARE * pool.rate)
        .map(|(t, _)| t.clone())
        .collect();
    let over = |kept: &[Priced]| {
        pool.roots
            .iter()
            .any(|&r| kept.iter().filter(|t| t.root == r).count() > max_trees)
    };
    if pool.roots.len() == 1 && over(&kept) {
        // The MILP chooses among the whole pool when it is small (trees outside the LP's
        // support may combine better in few), else among the support.
        let candidates: &[Priced] = if pool.trees.len() <= MILP_POOL {
            &pool.trees
        } else {
            &kept
        };
        if let Some(chosen) = select_milp(candidates, &pool.roots, cap, max_trees)
            && !over(&chosen)
        {
            kept = chosen;
        }
    }
    let (mut weights, mut rate) = solve_primal(&kept, &pool.roots, cap)?;
    loop {
        let mut drop = vec![false; kept.len()];
        let mut any = false;
        for &root in &pool.roots {
            let mine: Vec<usize> = (0..kept.len()).filter(|&t| kept[t].root == root).collect();
            if mine.len() > max_trees {
                let lightest = mine
                    .iter()
                    .copied()
                    .min_by(|&a, &b| weights[a].total_cmp(&weights[b]).then(b.cmp(&a)))
                    .unwrap_or(mine[0]);
                drop[lightest] = true;
                any = true;
            }
        }
        if !any {
            break;
        }
        kept = kept
            .into_iter()
            .zip(drop)
            .filter(|(_, d)| !d)
            .map(|(t, _)| t)
            .collect();
        (weights, rate) = solve_primal(&kept, &pool.roots, cap)?;
        let (k2, w2): (Vec<_>, Vec<_>) = kept
            .into_iter()
            .zip(weights)
            .filter(|(_, w)| *w > MIN_SHARE * rate)
            .unzip();
        kept = k2;
        weights = w2;
    }
    let trees: Vec<PackedTree> = kept
        .into_iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0.0)
        .map(|(t, w)| PackedTree {
            root: t.root,
            parents: t.parents,
            rate: w,
        })
        .collect();
    let covered = pool
        .roots
        .iter()
        .all(|&r| trees.iter().any(|t| t.root == r));
    if trees.is_empty() || !covered || rate.is_nan() || rate <= 0.0 {
        return Err(SynthError::Instance(
            "the tree packing carries nothing (no capacity on the routes)".into(),
        ));
    }
    Ok(Packing {
        roots: pool.roots.clone(),
        direction: pool.direction,
        trees,
        rate,
        pool_rate: pool.rate,
        bound: pool.bound,
        pool: pool.trees.len(),
        method: "lp-tree-packing",
    })
}

/// At most `max_trees` trees per root of `trees`, chosen by a MILP (binary `s_T`, with
/// `x_T ≤ alone(T)·s_T` and `Σ_{T of r} s_T ≤ max_trees`) maximising the rate every root
/// gets; `None` when the solver gives up (time limit) or fails.
fn select_milp(
    trees: &[Priced],
    roots: &[u32],
    cap: &[f64],
    max_trees: usize,
) -> Option<Vec<Priced>> {
    let mut vars = ProblemVariables::new();
    let x: Vec<Variable> = trees
        .iter()
        .map(|_| vars.add(variable().min(0.0)))
        .collect();
    let pick: Vec<Variable> = trees
        .iter()
        .map(|_| vars.add(variable().binary()))
        .collect();
    let lambda = vars.add(variable().min(0.0));
    let mut model = vars
        .maximise(lambda)
        .using(crate::lp::solver)
        .with_time_limit(MILP_SECONDS);
    for &root in roots {
        let mine: Vec<usize> = (0..trees.len())
            .filter(|&t| trees[t].root == root)
            .collect();
        let sum: Expression = mine.iter().map(|&t| x[t]).sum();
        model = model.with(constraint!(sum >= lambda));
        let picked: Expression = mine.iter().map(|&t| pick[t]).sum();
        model = model.with(constraint!(picked <= max_trees as f64));
    }
    for (t, tree) in trees.iter().enumerate() {
        let alone = tree
            .usage
            .iter()
            .filter(|(r, _)| cap[*r as usize].is_finite())
            .map(|&(r, k)| cap[r as usize] / k)
            .fold(f64::INFINITY, f64::min);
        if alone.is_finite() {
            model = model.with(constraint!(x[t] <= alone * pick[t]));
        }
    }
    let mut rows: HashMap<u32, Vec<(usize, f64)>> = HashMap::new();
    for (t, tree) in trees.iter().enumerate() {
        for &(r, k) in &tree.usage {
            rows.entry(r).or_default().push((t, k));
        }
    }
    for r in used_resources(trees, cap) {
        let lhs: Expression = rows[&r].iter().map(|&(t, k)| k * x[t]).sum();
        let c = cap[r as usize];
        model = model.with(constraint!(lhs <= c));
    }
    let started = std::time::Instant::now();
    let solution = model.solve();
    if started.elapsed().as_secs_f64() >= MILP_GIVE_UP * MILP_SECONDS {
        // At (or near) the time limit the solver's incumbent depends on the machine's speed
        // and load: the greedy elimination decides instead, so the plan does not. Near
        // the cut itself, whether it applies depends on the clock.
        crate::clock::note_clock_stop();
        return None;
    }
    let solution = solution.ok()?;
    Some(
        trees
            .iter()
            .zip(&pick)
            .filter(|(_, p)| solution.value(**p) > 0.5)
            .map(|(t, _)| t.clone())
            .collect(),
    )
}

/// Resources some tree of `trees` uses, with a finite capacity, sorted; and, per tree, its
/// rows `(resource, multiplicity)`.
fn used_resources(trees: &[Priced], cap: &[f64]) -> Vec<u32> {
    let mut res: Vec<u32> = trees
        .iter()
        .flat_map(|t| t.usage.iter().map(|&(r, _)| r))
        .filter(|&r| cap[r as usize].is_finite())
        .collect();
    res.sort_unstable();
    res.dedup();
    res
}

/// The tree weights maximising the rate every root gets, and that rate.
fn solve_primal(
    trees: &[Priced],
    roots: &[u32],
    cap: &[f64],
) -> Result<(Vec<f64>, f64), SynthError> {
    if trees.is_empty() {
        return Ok((Vec::new(), 0.0));
    }
    let mut vars = ProblemVariables::new();
    let x: Vec<Variable> = trees
        .iter()
        .map(|_| vars.add(variable().min(0.0)))
        .collect();
    let lambda = vars.add(variable().min(0.0));
    let mut model = vars.maximise(lambda).using(crate::lp::solver);
    for &root in roots {
        let sum: Expression = trees
            .iter()
            .zip(&x)
            .filter(|(t, _)| t.root == root)
            .map(|(_, &v)| v)
            .sum();
        model = model.with(constraint!(sum >= lambda));
    }
    let mut rows: HashMap<u32, Vec<(usize, f64)>> = HashMap::new();
    for (t, tree) in trees.iter().enumerate() {
        for &(r, k) in &tree.usage {
            rows.entry(r).or_default().push((t, k));
        }
    }
    for r in used_resources(trees, cap) {
        let lhs: Expression = rows[&r].iter().map(|&(t, k)| k * x[t]).sum();
        let c = cap[r as usize];
        model = model.with(constraint!(lhs <= c));
    }
    let solution = model
        .solve()
        .map_err(|e| SynthError::Solver(e.to_string()))?;
    let weights: Vec<f64> = x.iter().map(|&v| solution.value(v).max(0.0)).collect();
    let rate = roots
        .iter()
        .map(|&r| {
            trees
                .iter()
                .zip(&weights)
                .filter(|(t, _)| t.root == r)
                .map(|(_, w)| w)
                .sum::<f64>()
        })
        .fold(f64::INFINITY, f64::min);
    Ok((weights, if rate.is_finite() { rate } else { 0.0 }))
}

/// An optimal solution of the dual LP over the pool.
struct Dual {
    /// Price of every resource (zero where unused or uncapacitated).
    price: Vec<f64>,
    /// Share `z_r` of every root (same order as the roots).
    z: Vec<f64>,
    /// The dual objective: the pool's rate.
    value: f64,
}

/// Solves the dual of the packing LP over `trees` (see the module docs).
fn solve_dual(trees: &[Priced], roots: &[u32], cap: &[f64]) -> Result<Dual, SynthError> {
    let used = used_resources(trees, cap);
    let mut vars = ProblemVariables::new();
    let y: HashMap<u32, Variable> = used
        .iter()
        .map(|&r| (r, vars.add(variable().min(0.0))))
        .collect();
    let z: Vec<Variable> = roots
        .iter()
        .map(|_| vars.add(variable().min(0.0)))
        .collect();
    let objective: Expression = used.iter().map(|&r| cap[r as usize] * y[&r]).sum();
    let mut model = vars.minimise(objective).using(crate::lp::solver);
    let zsum: Expression = z.iter().copied().sum();
    model = model.with(constraint!(zsum == 1.0));
    let root_index: HashMap<u32, usize> = roots.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    for t in trees {
        let Some(&i) = root_index.get(&t.root) else {
            continue;
        };
        let lhs: Expression = t
            .usage
            .iter()
            .filter_map(|&(r, k)| y.get(&r).map(|&v| k * v))
            .sum();
        model = model.with(constraint!(lhs >= z[i]));
    }
    let solution = model
        .solve()
        .map_err(|e| SynthError::Solver(e.to_string()))?;
    let mut price = vec![0.0; cap.len()];
    let mut value = 0.0;
    for &r in &used {
        let p = solution.value(y[&r]).max(0.0);
        price[r as usize] = p;
        value += cap[r as usize] * p;
    }
    let z = z.iter().map(|&v| solution.value(v).max(0.0)).collect();
    Ok(Dual { price, z, value })
}
