//! Rings over every route: the ring family's link-disjoint rings, plus *spare* rings over
//! the simulator's routes that none of them touches, each ring carrying a share of the data
//! in proportion to its rate.
//!
//! On a machine whose direct links form a full ring packing, the hand-written rings use
//! every direct link and nothing else. Where other routes join ranks without touching those
//! links (the DGX-1's PCIe switches and QPI, which carry traffic between the GPUs that share
//! no NVLink), a Hamiltonian cycle over such routes adds bandwidth the packing leaves idle:
//! on the DGX-1 a cycle alternating sockets over the eight non-NVLink pairs carries
//! 7.875 GB/s per ring hop (two GPUs share each PCIe switch's uplink) beside the six NVLink
//! rings' 25 GB/s, which is exactly what the compiler's bound counts (157.875 = 150 + 7.875).
//!
//! Rates are the max-min fair shares the simulator gives the rings' flows (a ring moves at
//! its slowest hop); spare cycles are added greedily, each only if it raises the rings'
//! total rate by [`SPARE_GAIN`]. The shares are whole chunk units ([`units_for`]), so the
//! schedules are [`weighted_ring_schedule`]s: AllGather, ReduceScatter and AllReduce as
//! rings, Broadcast and Reduce as pipelined chains along them.

use super::{Memo, packing_bound, piece_widths, rounding_loss};
use crate::cost::Network;
use crate::families::common::uniform_hosts;
use crate::families::ring::{
    hamiltonian_cycles, link_rings, packed_rings, ring_steps, weighted_ring_schedule,
};
use crate::families::{Candidate, Family, FamilyParams, steps_per_piece};
use hccl_ir::{Collective, CollectiveKind, Rank, Synthesis};
use hccl_topologies::Topology;
use std::collections::HashSet;
use std::sync::Arc;

/// How [`RoutedRings`]' schedules are named in [`Synthesis::method`].
pub const ROUTED_RINGS: &str = "routed-rings";
/// Least relative gain in the rings' total rate for a spare cycle to be added.
pub const SPARE_GAIN: f64 = 1.01;
/// At most this many spare rings.
pub const MAX_SPARE: usize = 2;
/// Most chunk units the rings' shares are rounded to ([`units_for`]).
pub const MAX_UNITS: u32 = 128;
/// Search budget (DFS expansions) for the spare cycles.
const SPARE_BUDGET: u32 = 100_000;
/// Pieces per ring for AllGather, ReduceScatter and AllReduce (two pieces never won a size
/// on the DGX-1, and cost the README's compile its time).
const PIPELINES_ALL: [u32; 1] = [1];
/// Pieces per chain for Broadcast and Reduce (a chain of `n` ranks fills in `n − 2` pieces):
/// 128 from 256 MiB, 384 from 1 GiB on the DGX-1 (1.024 of the bound there, against 1.020
/// with 512 pieces, whose plan entries cost the README's compile 0.2 s).
const PIPELINES_ROOTED: [u32; 2] = [128, 384];
/// Smallest chunk (bytes) an AllGather, ReduceScatter or AllReduce schedule is costed at.
const MIN_CHUNK_BYTES: u64 = 4096;
/// Smallest chunk a Broadcast or Reduce chain is costed at: each pipeline depth only from
/// the sizes where it can win.
const MIN_CHAIN_CHUNK_BYTES: u64 = 16 << 10;

/// Rings, their rates and their shares.
#[derive(Debug, Clone, PartialEq)]
pub struct RingSet {
    /// Directed rings (rank orders), the link packing's first, then the spare ones.
    pub rings: Vec<Vec<Rank>>,
    /// How many of [`RingSet::rings`] are spare.
    pub spare: usize,
    /// Each ring's rate (GB/s): the least max-min fair share of its hops' flows.
    pub rates: Vec<f64>,
    /// Each ring's chunk units of every `Σ widths` ([`piece_widths`] of the rates).
    pub widths: Vec<u32>,
    /// The tree-packing LP's proven AllGather rate on the same network (GB/s per root), the
    /// optimum the plan entries record; `None` where the LP does not run.
    pub bound: Option<f64>,
}

impl RingSet {
    /// The rings' total rate (GB/s).
    pub fn rate(&self) -> f64 {
        self.rates.iter().sum()
    }
}

static SETS: Memo<String, Option<Arc<RingSet>>> = Memo::new();

/// The routed rings of `topo` (memoised per topology): `None` on multi-host machines (whose
/// rings run over rails), where the direct links form no ring packing, or where no spare
/// ring adds [`SPARE_GAIN`].
pub fn routed_rings(topo: &Topology) -> Option<Arc<RingSet>> {
    SETS.get(topo.hash.clone(), || ring_set(topo).map(Arc::new))
}

fn ring_set(topo: &Topology) -> Option<RingSet> {
    let n = topo.nranks() as usize;
    if n < 3 || uniform_hosts(topo).is_some() {
        return None;
    }
    let packed = packed_rings(topo) as usize;
    if packed == 0 {
        return None;
    }
    let net = Network::new(topo);
    let mut rings = link_rings(topo, packed);
    let mut flows: Vec<Vec<Vec<u32>>> = rings
        .iter()
        .map(|r| ring_flows(&net, r))
        .collect::<Option<_>>()?;
    let used: HashSet<u32> = flows.iter().flatten().flatten().copied().collect();

    // Pairs whose routes (both ways) avoid every resource of the packing.
    let pairs: Vec<(u32, u32)> = (0..n as u32)
        .flat_map(|a| (0..n as u32).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let routes = net.routes(&pairs).ok()?;
    let mut free = vec![vec![true; n]; n];
    for (&(a, b), route) in pairs.iter().zip(&routes) {
        if route.resources.iter().any(|r| used.contains(r)) {
            free[a as usize][b as usize] = false;
            free[b as usize][a as usize] = false;
        }
    }
    let units: Vec<Vec<u32>> = (0..n)
        .map(|a| (0..n).map(|b| u32::from(a != b && free[a][b])).collect())
        .collect();
    let mut budget = SPARE_BUDGET;
    let cycles = hamiltonian_cycles(&units, &mut budget);
    let mut options: Vec<(Vec<Rank>, Vec<Vec<u32>>)> = Vec::new();
    for c in cycles {
        let mut rev = c.clone();
        rev[1..].reverse();
        for ring in [c, rev] {
            if let Some(f) = ring_flows(&net, &ring) {
                options.push((ring, f));
            }
        }
    }

    let mut rate = total_rate(&net.capacity, &flows);
    let mut spare = 0;
    while spare < MAX_SPARE && !options.is_empty() {
        let (best, best_rate) = options
            .iter()
            .enumerate()
            .map(|(i, (_, f))| {
                flows.push(f.clone());
                let r = total_rate(&net.capacity, &flows);
                flows.pop();
                (i, r)
            })
            .fold(
                (0, f64::NEG_INFINITY),
                |acc, (i, r)| {
                    if r > acc.1 { (i, r) } else { acc }
                },
            );
        if best_rate < rate * SPARE_GAIN {
            break;
        }
        let (ring, f) = options.remove(best);
        rings.push(ring);
        flows.push(f);
        rate = best_rate;
        spare += 1;
    }
    if spare == 0 {
        return None;
    }
    let rates = ring_rates(&net.capacity, &flows);
    let units = units_for(&rates);
    Some(RingSet {
        widths: piece_widths(&rates, units),
        bound: packing_bound(&net, Collective::AllGather),
        rings,
        spare,
        rates,
    })
}

/// The resources of every hop of `ring`, over the simulator's routes.
fn ring_flows(net: &Network, ring: &[Rank]) -> Option<Vec<Vec<u32>>> {
    let n = ring.len();
    let pairs: Vec<(u32, u32)> = (0..n).map(|i| (ring[i], ring[(i + 1) % n])).collect();
    let routes = net.routes(&pairs).ok()?;
    Some(routes.iter().map(|r| r.resources.clone()).collect())
}

/// Each ring's rate: the least max-min fair share among its hops, all rings' hops sharing
/// the resources of capacities `cap`.
fn ring_rates(cap: &[f64], rings: &[Vec<Vec<u32>>]) -> Vec<f64> {
    let flows: Vec<&Vec<u32>> = rings.iter().flatten().collect();
    let shares = fair_shares(cap, &flows);
    let mut out = Vec::with_capacity(rings.len());
    let mut i = 0;
    for r in rings {
        out.push(
            shares[i..i + r.len()]
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min),
        );
        i += r.len();
    }
    out
}

fn total_rate(cap: &[f64], rings: &[Vec<Vec<u32>>]) -> f64 {
    ring_rates(cap, rings).iter().sum()
}

/// Max-min fair rates of `flows` (each a list of resources) over resources of capacities
/// `cap`, by progressive filling: the resource whose remaining capacity per unfrozen flow is
/// least fixes its flows at that share, until every flow is fixed. A flow that uses no
/// resource gets an infinite rate.
pub fn fair_shares(cap: &[f64], flows: &[&Vec<u32>]) -> Vec<f64> {
    let mut rate = vec![f64::INFINITY; flows.len()];
    let mut fixed: Vec<bool> = flows.iter().map(|f| f.is_empty()).collect();
    let mut rem = cap.to_vec();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); cap.len()];
    for (i, f) in flows.iter().enumerate() {
        for &r in f.iter() {
            if let Some(u) = users.get_mut(r as usize) {
                u.push(i);
            }
        }
    }
    loop {
        let mut least: Option<(f64, usize)> = None;
        for (r, u) in users.iter().enumerate() {
            let open = u.iter().filter(|&&i| !fixed[i]).count();
            if open == 0 {
                continue;
            }
            let share = rem[r].max(0.0) / open as f64;
            if least.is_none_or(|(s, _)| share < s) {
                least = Some((share, r));
            }
        }
        let Some((share, r)) = least else {
            break;
        };
        let open: Vec<usize> = users[r].iter().copied().filter(|&i| !fixed[i]).collect();
        for i in open {
            fixed[i] = true;
            rate[i] = share;
            for &res in flows[i].iter() {
                if let Some(x) = rem.get_mut(res as usize) {
                    *x -= share;
                }
            }
        }
    }
    rate
}

/// The fewest chunk units (at most [`MAX_UNITS`]) whose rounding of the rates' shares costs
/// at most [`super::ROUNDING_LOSS`]; the least lossy up to [`MAX_UNITS`] otherwise.
pub fn units_for(rates: &[f64]) -> u32 {
    let mut best = (f64::INFINITY, MAX_UNITS);
    for units in 1..=MAX_UNITS {
        let loss = rounding_loss(rates, units);
        if loss <= super::ROUNDING_LOSS {
            return units;
        }
        if loss < best.0 {
            best = (loss, units);
        }
    }
    best.1
}

/// What a plan entry records of routed rings: the rate at which every block reaches every
/// rank (the rings' total over `n − 1` hops) against the tree-packing LP's proven optimum.
fn record(set: &RingSet, topo: &Topology) -> Synthesis {
    let n = topo.nranks().max(2);
    let value = set.rate() / f64::from(n - 1);
    let bound = set.bound;
    Synthesis {
        method: ROUTED_RINGS.into(),
        objective: format!(
            "rings over every route ({} spare beside the link packing), shares in proportion \
             to their max-min fair rates: the rate at which each rank's block reaches every rank",
            set.spare
        ),
        value,
        optimum: bound.unwrap_or(value),
        unit: "GB/s".into(),
        proven: bound.is_some(),
    }
}

/// AllGather, ReduceScatter and AllReduce over [`routed_rings`], and Broadcast and Reduce as
/// chains along them.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoutedRings;

impl Family for RoutedRings {
    fn name(&self) -> &'static str {
        "routed_rings"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        kind != CollectiveKind::AllToAll
    }

    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if !self.supports(collective.kind()) {
            return Vec::new();
        }
        let Some(set) = routed_rings(topo) else {
            return Vec::new();
        };
        let channels = set.rings.len() as u32;
        let pipelines: &[u32] = match collective.kind() {
            CollectiveKind::Broadcast | CollectiveKind::Reduce => &PIPELINES_ROOTED,
            _ => &PIPELINES_ALL,
        };
        pipelines
            .iter()
            .map(|&pipeline| FamilyParams { channels, pipeline })
            .collect()
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
        let Some(set) = routed_rings(topo) else {
            return Vec::new();
        };
        let params = FamilyParams {
            channels: set.rings.len() as u32,
            pipeline: params.pipeline.max(1),
        };
        let per_block = u64::from(params.pipeline) * u64::from(set.widths.iter().sum::<u32>());
        let (chunks, least) = match collective.kind() {
            CollectiveKind::Broadcast | CollectiveKind::Reduce => {
                (per_block, MIN_CHAIN_CHUNK_BYTES)
            }
            _ => (per_block * u64::from(topo.nranks()), MIN_CHUNK_BYTES),
        };
        let record = record(&set, topo);
        weighted_ring_schedule(
            self.name(),
            &set.rings,
            &set.widths,
            collective,
            params,
            in_place,
        )
        .into_iter()
        .map(|c| c.from_bytes(chunks * least).synthesized(record.clone()))
        .collect()
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        Some(steps_per_piece(params, ring_steps(topo, collective)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_shares_fill_progressively() {
        // Two flows share resource 0 (capacity 10); the second also crosses resource 1
        // (capacity 2): it gets 2, the first the remaining 8.
        let a = vec![0];
        let b = vec![0, 1];
        let none = vec![];
        let shares = fair_shares(&[10.0, 2.0], &[&a, &b, &none]);
        assert_eq!(shares[0], 8.0);
        assert_eq!(shares[1], 2.0);
        assert!(shares[2].is_infinite());
    }

    #[test]
    fn units_round_unequal_rates_closely() {
        let rates = [25.0, 25.0, 25.0, 25.0, 25.0, 25.0, 7.875];
        let units = units_for(&rates);
        assert!(units <= MAX_UNITS);
        assert!(rounding_loss(&rates, units) <= crate::synth::ROUNDING_LOSS);
        assert_eq!(units_for(&[5.0, 5.0]), 2);
    }
}
