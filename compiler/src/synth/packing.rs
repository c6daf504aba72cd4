//! Fractional packing of spanning arborescences by linear programming: the bandwidth-optimal
//! Broadcast (trees out of the root) and Reduce (the same trees, data flowing to the root).
//!
//! A tree edge `u → v` is the simulator's route between the two ranks, so it occupies every
//! resource on that route (links, NIC directions); a tree that reaches two children over
//! the same link uses it twice. The packing sends `x_T` GB/s down each tree `T` subject to
//! every resource's capacity, and maximises the total rate `Σ x_T`:
//!
//! ```text
//! maximise Σ_T x_T   subject to   Σ_T use_T(ρ) · x_T ≤ cap(ρ)  for every resource ρ,  x ≥ 0
//! ```
//!
//! Trees enter the LP from a pool grown by Garg–Könemann pricing: each round takes the
//! cheapest arborescence under resource lengths that grow with the load already routed
//! through them ([`super::arborescence`]), so the pool covers the spare paths a hand-written
//! family never uses (DGX-1's second NVLinks and PCIe). The LP (`good_lp`, microlp) then
//! weighs the pool exactly; the few trees it uses most are kept and re-weighed.

use super::SynthError;
use super::arborescence::min_arborescence;
use crate::cost::Network;
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, constraint, microlp, variable,
};
use std::collections::HashMap;

/// Most trees a packing keeps: every tree is a channel of the lowered schedule.
pub const MAX_TREES: usize = 16;
/// Pricing rounds per rank (the pool grows by at most one tree per round).
const ROUNDS_PER_RANK: usize = 6;
/// Least pricing rounds.
const MIN_ROUNDS: usize = 24;
/// Garg–Könemann's step: how fast a resource's length grows with its load.
const EPSILON: f64 = 0.25;
/// Trees carrying less than this share of the rate are dropped.
const MIN_SHARE: f64 = 0.01;

/// Direction of a packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Data leaves the root (Broadcast): tree edge `parent → child`.
    FromRoot,
    /// Data reaches the root (Reduce): tree edge `child → parent`.
    ToRoot,
}

/// Weighted spanning trees rooted at one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// The root rank.
    pub root: u32,
    pub direction: Direction,
    /// Parent of every rank per tree (`None` for the root), with the tree's rate (GB/s).
    pub trees: Vec<(Vec<Option<u32>>, f64)>,
    /// Total rate (GB/s): the sum of the trees' rates.
    pub rate: f64,
    /// Rate of the LP over the whole pool, before pruning to [`MAX_TREES`] (GB/s).
    pub pool_rate: f64,
    /// Trees the pricing found.
    pub pool: usize,
}

/// Resources a tree occupies, with multiplicity (sorted by resource).
type Usage = Vec<(u32, f64)>;

/// Packs at most [`MAX_TREES`] spanning arborescences rooted at `root` on `net`'s routes (see
/// the module docs).
pub fn pack(net: &Network, root: u32, direction: Direction) -> Result<Packing, SynthError> {
    prune(&grow_pool(net, root, direction)?, MAX_TREES)
}

/// The priced trees and their optimal weights over the whole pool.
#[derive(Debug, Clone)]
pub struct Pool {
    pub root: u32,
    pub direction: Direction,
    /// Trees with the resources they occupy.
    trees: Vec<(Vec<Option<u32>>, Usage)>,
    /// The LP's weight of every tree.
    weights: Vec<f64>,
    /// Capacity of every resource (GB/s).
    capacity: Vec<f64>,
}

impl Pool {
    /// Rate of the LP over the whole pool (GB/s).
    pub fn rate(&self) -> f64 {
        self.weights.iter().sum()
    }

    /// Trees the LP gives a share of at least 1% of the rate.
    pub fn support(&self) -> usize {
        let rate = self.rate();
        self.weights
            .iter()
            .filter(|&&w| w > MIN_SHARE * rate)
            .count()
    }
}

/// Prices trees for `root` and weighs them by the LP (see the module docs).
pub fn grow_pool(net: &Network, root: u32, direction: Direction) -> Result<Pool, SynthError> {
    let n = net.nranks() as usize;
    if root as usize >= n {
        return Err(SynthError::Instance(format!(
            "root {root} is not a rank of this {n}-rank topology"
        )));
    }
    if n == 1 {
        return Err(SynthError::Instance(
            "a single rank has nothing to send".into(),
        ));
    }
    // Route of every tree edge u → v (data direction), indexed u·n + v.
    let pairs: Vec<(u32, u32)> = (0..n as u32)
        .flat_map(|u| (0..n as u32).filter(move |&v| v != u).map(move |v| (u, v)))
        .map(|(u, v)| match direction {
            Direction::FromRoot => (u, v),
            Direction::ToRoot => (v, u),
        })
        .collect();
    let routes = net
        .routes(&pairs)
        .map_err(|e| SynthError::Instance(e.to_string()))?;
    let mut edge_res: Vec<Vec<u32>> = vec![Vec::new(); n * n];
    for ((u, v), r) in (0..n)
        .flat_map(|u| (0..n).filter(move |&v| v != u).map(move |v| (u, v)))
        .zip(&routes)
    {
        edge_res[u * n + v] = r.resources.clone();
    }
    let cap = |r: u32| net.capacity[r as usize];
    // Pricing: Garg–Könemann lengths, one cheapest tree per round.
    let mut length: Vec<f64> = net
        .capacity
        .iter()
        .map(|&c| if c > 0.0 { 1.0 / c } else { f64::INFINITY })
        .collect();
    let mut pool: Vec<(Vec<Option<u32>>, Usage)> = Vec::new();
    let rounds = (ROUNDS_PER_RANK * n).max(MIN_ROUNDS);
    for _ in 0..rounds {
        let parents = min_arborescence(n, root as usize, |u, v| {
            let res = &edge_res[u * n + v];
            // A hair per hop prefers short routes among equally loaded ones.
            res.iter().map(|&r| length[r as usize]).sum::<f64>() * (1.0 + 1e-6 * res.len() as f64)
        })
        .ok_or_else(|| {
            SynthError::Instance(format!("some rank cannot be reached from rank {root}"))
        })?;
        let parents: Vec<Option<u32>> = parents.iter().map(|p| p.map(|u| u as u32)).collect();
        let usage = usage_of(&parents, &edge_res, n);
        if usage.is_empty() {
            break;
        }
        // The most this tree could carry alone, and the lengths it makes grow.
        let f = usage
            .iter()
            .map(|&(r, k)| cap(r) / k)
            .fold(f64::INFINITY, f64::min);
        for &(r, k) in &usage {
            length[r as usize] *= 1.0 + EPSILON * f * k / cap(r);
        }
        if !pool.iter().any(|(p, _)| *p == parents) {
            pool.push((parents, usage));
        }
    }
    let weights = solve_lp(&pool, &cap)?;
    Ok(Pool {
        root,
        direction,
        trees: pool,
        weights,
        capacity: net.capacity.clone(),
    })
}

/// The best packing of at most `max_trees` trees of `pool`: the lightest tree of the LP's
/// support is dropped and the rest weighed again (the LP moves its share to the others)
/// until few enough remain.
pub fn prune(pool: &Pool, max_trees: usize) -> Result<Packing, SynthError> {
    let cap = |r: u32| pool.capacity[r as usize];
    let pool_rate = pool.rate();
    let mut kept: Vec<(Vec<Option<u32>>, Usage)> = pool
        .trees
        .iter()
        .zip(&pool.weights)
        .filter(|(_, w)| **w > MIN_SHARE * pool_rate)
        .map(|(t, _)| t.clone())
        .collect();
    let mut weights = solve_lp(&kept, &cap)?;
    while kept.len() > max_trees.max(1) {
        let lightest = (0..kept.len())
            .min_by(|&a, &b| weights[a].total_cmp(&weights[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        kept.remove(lightest);
        weights = solve_lp(&kept, &cap)?;
        let total: f64 = weights.iter().sum();
        let (k2, w2): (Vec<_>, Vec<_>) = kept
            .into_iter()
            .zip(weights)
            .filter(|(_, w)| *w > MIN_SHARE * total)
            .unzip();
        kept = k2;
        weights = w2;
    }
    let trees: Vec<(Vec<Option<u32>>, f64)> = kept
        .into_iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0.0)
        .map(|((p, _), w)| (p, w))
        .collect();
    let rate: f64 = trees.iter().map(|t| t.1).sum();
    if trees.is_empty() || rate.is_nan() || rate <= 0.0 {
        return Err(SynthError::Instance(
            "the tree packing carries nothing (no capacity on the routes)".into(),
        ));
    }
    Ok(Packing {
        root: pool.root,
        direction: pool.direction,
        trees,
        rate,
        pool_rate,
        pool: pool.trees.len(),
    })
}

/// Resources the tree `parents` occupies (edge `parent → child` uses route `edge_res`).
fn usage_of(parents: &[Option<u32>], edge_res: &[Vec<u32>], n: usize) -> Usage {
    let mut count: HashMap<u32, f64> = HashMap::new();
    for (v, p) in parents.iter().enumerate() {
        if let Some(u) = p {
            for &r in &edge_res[*u as usize * n + v] {
                *count.entry(r).or_default() += 1.0;
            }
        }
    }
    let mut usage: Usage = count.into_iter().collect();
    usage.sort_by_key(|&(r, _)| r);
    usage
}

/// The rate of every tree maximising the total under the resources' capacities.
fn solve_lp(
    trees: &[(Vec<Option<u32>>, Usage)],
    cap: &dyn Fn(u32) -> f64,
) -> Result<Vec<f64>, SynthError> {
    if trees.is_empty() {
        return Ok(Vec::new());
    }
    let mut vars = ProblemVariables::new();
    let x: Vec<Variable> = trees
        .iter()
        .map(|_| vars.add(variable().min(0.0)))
        .collect();
    let objective: Expression = x.iter().copied().sum();
    // Rows per resource: the trees using it and how often.
    let mut rows: HashMap<u32, Vec<(usize, f64)>> = HashMap::new();
    for (t, (_, usage)) in trees.iter().enumerate() {
        for &(r, k) in usage {
            rows.entry(r).or_default().push((t, k));
        }
    }
    let mut model = vars.maximise(objective).using(microlp);
    let mut keys: Vec<u32> = rows.keys().copied().collect();
    keys.sort_unstable();
    for r in keys {
        let lhs: Expression = rows[&r].iter().map(|&(t, k)| k * x[t]).sum();
        let c = cap(r);
        model = model.with(constraint!(lhs <= c));
    }
    let solution = model
        .solve()
        .map_err(|e| SynthError::Solver(e.to_string()))?;
    Ok(x.iter().map(|&v| solution.value(v).max(0.0)).collect())
}
