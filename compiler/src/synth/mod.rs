//! Schedule synthesis by optimisation: schedules derived from the topology by a solver
//! rather than written by hand.
//!
//! - [`packing`]: the bandwidth-optimal Broadcast and Reduce, a linear program over spanning
//!   arborescences of the rank graph (every ordered pair of ranks joined by its simulator
//!   route), priced by minimum-cost arborescences ([`arborescence`]) and solved with
//!   `good_lp` (microlp).
//! - [`PackedTrees`]: the family that lowers a packing to chunk schedules: tree `t` carries a
//!   share of the chunks proportional to its rate, on a channel of its own, pipelined chunk
//!   by chunk with the trees interleaved; deeper pipelines (more chunks) for larger sizes.
//!
//! A synthesizer is only a source of [`Candidate`]s: its schedules are costed by the
//! simulator, verified and chosen by the search like any hand-written family's.

pub mod arborescence;
pub mod packing;

use crate::builder::ScheduleBuilder;
use crate::cost::Network;
use crate::families::common::{candidate, single_rank};
use crate::families::tree::{Tree, tree_chunk};
use crate::families::{Candidate, Family, FamilyParams};
use hccl_ir::{Collective, CollectiveKind, Loc};
use hccl_topologies::Topology;
pub use packing::{Direction, MAX_TREES, Packing, Pool, grow_pool, pack, prune};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
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

/// Largest rank count the synthesizers run on inside a search.
pub const SYNTH_MAX_RANKS: u32 = 32;
/// Chunk counts (pipeline depths) the packed-tree family is compiled with.
const PIPELINES: [u32; 4] = [16, 64, 256, 1024];
/// Tree limits (channels) the packed-tree family is compiled with, besides the LP's own
/// support: fewer trees give each a deeper pipeline for the same chunk count.
const TREE_LIMITS: [u32; 1] = [8];

/// Pools already priced, by topology hash, root and direction: a search asks for the same
/// packing once per parameter set, and recompiling a topology reuses them.
fn pool_for(topo: &Topology, root: u32, direction: Direction) -> Option<Arc<Pool>> {
    type Key = (String, u32, Direction);
    static CACHE: OnceLock<Mutex<HashMap<Key, Option<Arc<Pool>>>>> = OnceLock::new();
    let key = (topo.hash.clone(), root, direction);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(found) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return found.clone();
    }
    let pool = grow_pool(&Network::new(topo), root, direction)
        .ok()
        .map(Arc::new);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, pool.clone());
    pool
}

fn root_and_direction(collective: Collective) -> Option<(u32, Direction)> {
    match collective {
        Collective::Broadcast { root } => Some((root, Direction::FromRoot)),
        Collective::Reduce { root } => Some((root, Direction::ToRoot)),
        _ => None,
    }
}

/// Broadcast and Reduce over an LP packing of spanning trees ([`packing`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PackedTrees;

impl Family for PackedTrees {
    fn name(&self) -> &'static str {
        "packed_trees"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(kind, CollectiveKind::Broadcast | CollectiveKind::Reduce)
    }

    /// Chunk counts × tree limits: the LP's whole support (at most [`MAX_TREES`]) and the
    /// smaller limits below it.
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if topo.nranks() < 2 || topo.nranks() > SYNTH_MAX_RANKS {
            return Vec::new();
        }
        let Some((root, direction)) = root_and_direction(collective) else {
            return Vec::new();
        };
        let Some(pool) = pool_for(topo, root, direction) else {
            return Vec::new();
        };
        let support = (pool.support() as u32).clamp(1, MAX_TREES as u32);
        let mut limits: Vec<u32> = TREE_LIMITS.into_iter().filter(|&k| k < support).collect();
        limits.push(support);
        let mut out = Vec::new();
        for &channels in &limits {
            for &pipeline in &PIPELINES {
                out.push(FamilyParams { channels, pipeline });
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
        let Some((root, direction)) = root_and_direction(collective) else {
            return Vec::new();
        };
        let n = topo.nranks();
        if n == 1 {
            return single_rank(self.name(), collective, in_place, params);
        }
        if n > SYNTH_MAX_RANKS {
            return Vec::new();
        }
        let Some(pool) = pool_for(topo, root, direction) else {
            return Vec::new();
        };
        let Ok(packing) = prune(&pool, params.channels.max(1) as usize) else {
            return Vec::new();
        };
        lower(self.name(), &packing, collective, params.pipeline, in_place)
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        _collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        Some(u64::from(params.pipeline) * 2 * u64::from(topo.nranks().saturating_sub(1)))
    }
}

/// Chunks per tree for `chunks` chunks in all: proportional to the trees' rates (largest
/// remainders), at least one each; trees beyond `chunks` are dropped.
pub fn chunk_shares(rates: &[f64], chunks: u32) -> Vec<u32> {
    let all = rates.len();
    let k = all.min(chunks as usize);
    let rates = &rates[..k];
    let total: f64 = rates.iter().sum();
    if k == 0 || total.is_nan() || total <= 0.0 {
        return vec![0; all];
    }
    let spare = chunks - k as u32;
    let exact: Vec<f64> = rates.iter().map(|r| r / total * f64::from(spare)).collect();
    let mut shares: Vec<u32> = exact.iter().map(|e| 1 + e.floor() as u32).collect();
    let mut left = chunks - shares.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    for i in order {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares.resize(all, 0);
    shares
}

/// Lowers a packing to a schedule of `chunks` chunks (see the module docs).
pub fn lower(
    name: &str,
    packing: &Packing,
    collective: Collective,
    chunks: u32,
    in_place: bool,
) -> Vec<Candidate> {
    let n = packing.trees.first().map_or(0, |t| t.0.len());
    let rank_of: Vec<u32> = (0..n as u32).collect();
    let trees: Vec<Tree> = packing
        .trees
        .iter()
        .filter_map(|(parents, _)| {
            let vp: Vec<Option<usize>> = parents.iter().map(|p| p.map(|u| u as usize)).collect();
            Tree::from_parents(&vp, &rank_of)
        })
        .collect();
    if trees.len() != packing.trees.len() || chunks == 0 {
        return Vec::new();
    }
    let rates: Vec<f64> = packing.trees.iter().map(|t| t.1).collect();
    let shares = chunk_shares(&rates, chunks);
    // Tree t owns chunks first[t] .. first[t] + shares[t]; chunks are emitted in the order
    // of their midpoints in each tree's own time, so every tree's pipeline advances evenly.
    let mut first = Vec::with_capacity(shares.len());
    let mut next = 0u32;
    for &s in &shares {
        first.push(next);
        next += s;
    }
    let mut order: Vec<(f64, usize, u32)> = Vec::with_capacity(chunks as usize);
    for (t, &s) in shares.iter().enumerate() {
        for j in 0..s {
            order.push(((f64::from(j) + 0.5) / f64::from(s), t, j));
        }
    }
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut b = ScheduleBuilder::new(collective, n as u32, chunks, in_place);
    if let (Collective::Broadcast { root }, false) = (collective, in_place) {
        b.copy((root, Loc::input(0)), (root, Loc::output(0)), chunks, 0);
    }
    for (_, t, j) in order {
        tree_chunk(&mut b, &trees[t], first[t] + j, t as u32);
    }
    let params = FamilyParams {
        channels: trees.len() as u32,
        pipeline: chunks,
    };
    candidate(name, params, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_rates_and_add_up() {
        assert_eq!(chunk_shares(&[1.0, 1.0], 16), vec![8, 8]);
        assert_eq!(chunk_shares(&[3.0, 1.0], 16), vec![12, 4]);
        let s = chunk_shares(&[5.0, 0.1, 0.1], 10);
        assert_eq!(s.iter().sum::<u32>(), 10);
        assert!(s.iter().all(|&c| c >= 1));
        // More trees than chunks: the first `chunks` trees get one each.
        assert_eq!(chunk_shares(&[1.0, 1.0, 1.0], 2), vec![1, 1, 0]);
    }
}
