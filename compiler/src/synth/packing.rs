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

/// Trees kept in a packing: every tree is a channel of the lowered schedule.
pub const MAX_TREES: usize = 8;
/// Pricing rounds per rank (the pool grows by at most one tree per round).
const ROUNDS_PER_RANK: usize = 6;
/// Least pricing rounds.
const MIN_ROUNDS: usize = 24;
/// Garg–Könemann's step: how fast a resource's length grows with its load.
const EPSILON: f64 = 0.25;
/// Trees carrying less than this share of the rate are dropped.
const MIN_SHARE: f64 = 0.01;

/// Direction of a packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Packs spanning arborescences rooted at `root` on `net`'s routes (see the module docs).
pub fn pack(net: &Network, root: u32, direction: Direction) -> Result<Packing, SynthError> {
    let n = net.nranks() as usize;
    if root as usize >= n {
        return Err(SynthError::Instance(format!(
            "root {root} is not a rank of this {n}-rank topology"
        )));
    }
    if n == 1 {
        return Ok(Packing {
            root,
            direction,
            trees: vec![(vec![None], f64::INFINITY)],
            rate: f64::INFINITY,
            pool_rate: f64::INFINITY,
            pool: 1,
        });
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
    let pool_rate: f64 = weights.iter().sum();
    // Keep the heaviest trees and weigh them again.
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let kept: Vec<(Vec<Option<u32>>, Usage)> = order
        .into_iter()
        .filter(|&i| weights[i] > MIN_SHARE * pool_rate)
        .take(MAX_TREES)
        .map(|i| pool[i].clone())
        .collect();
    let weights = solve_lp(&kept, &cap)?;
    let trees: Vec<(Vec<Option<u32>>, f64)> = kept
        .into_iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0.0)
        .map(|((p, _), w)| (p, w))
        .collect();
    let rate = trees.iter().map(|t| t.1).sum();
    if trees.is_empty() || !(rate > 0.0) {
        return Err(SynthError::Instance(
            "the tree packing carries nothing (no capacity on the routes)".into(),
        ));
    }
    Ok(Packing {
        root,
        direction,
        trees,
        rate,
        pool_rate,
        pool: pool.len(),
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
