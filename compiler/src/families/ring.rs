//! Ring family (one ring per channel, edge-disjoint over direct links where the topology
//! has them) and the double ring (two counter-rotating rings per channel, each with half the
//! data). AllReduce = reduce-scatter + all-gather; Broadcast and Reduce are pipelined chains
//! from / to the root along the ring.

use super::common::{
    Run, candidate, direct_bw, grid, ring_all_gather, ring_orders, ring_reduce_scatter, rotate_to,
    single_rank, uniform_hosts,
};
use super::{Candidate, Family, FamilyParams, steps_per_piece};
use crate::builder::ScheduleBuilder;
use hccl_ir::{BlockLabel, BlockLayout, ChunkMap, Collective, CollectiveKind, Loc, Rank, Symmetry};
use hccl_topologies::Topology;

/// Most chunks a ring schedule may use (bounds plan size for large rank counts).
const MAX_RING_CHUNKS: u32 = 4096;
/// Link-disjoint ring packings are searched exhaustively up to this many ranks.
const MAX_PACKING_RANKS: usize = 10;
/// Search budget (DFS expansions) for enumerating Hamiltonian cycles and packing them.
const PACKING_BUDGET: u32 = 400_000;

/// Parallel physical links between every pair of ranks joined by a direct device link
/// (`count` of the topology link; 0 without one), and the per-link bandwidth.
fn link_units(topo: &Topology) -> (Vec<Vec<u32>>, Vec<Vec<f64>>) {
    let n = topo.nranks() as usize;
    let mut units = vec![vec![0u32; n]; n];
    let mut bw = vec![vec![0.0f64; n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            if let Some(e) = topo.direct_edge(a as Rank, b as Rank) {
                let w = &topo.graph[e];
                units[a][b] = w.count.max(1);
                bw[a][b] = direct_bw(topo, a as Rank, b as Rank) / f64::from(w.count.max(1));
            }
        }
    }
    (units, bw)
}

/// Every undirected Hamiltonian cycle over direct links (starting at rank 0, second rank
/// below the last), within the budget.
pub(crate) fn hamiltonian_cycles(units: &[Vec<u32>], budget: &mut u32) -> Vec<Vec<Rank>> {
    let n = units.len();
    let mut out = Vec::new();
    let mut path = vec![0usize];
    let mut on = vec![false; n];
    on[0] = true;
    fn dfs(
        units: &[Vec<u32>],
        path: &mut Vec<usize>,
        on: &mut [bool],
        out: &mut Vec<Vec<Rank>>,
        budget: &mut u32,
    ) {
        let n = units.len();
        let last = *path.last().unwrap_or(&0);
        if path.len() == n {
            if units[last][0] > 0 && path[1] < last {
                out.push(path.iter().map(|&r| r as Rank).collect());
            }
            return;
        }
        for next in 0..n {
            if on[next] || units[last][next] == 0 || *budget == 0 {
                continue;
            }
            *budget -= 1;
            on[next] = true;
            path.push(next);
            dfs(units, path, on, out, budget);
            path.pop();
            on[next] = false;
        }
    }
    dfs(units, &mut path, &mut on, &mut out, budget);
    out
}

/// The largest set of undirected Hamiltonian cycles that together use every pair's parallel
/// links at most `count` times (a cycle uses one link of each pair it joins), preferring
/// cycles whose slowest link is fastest. Deterministic; bounded search.
fn cycle_packing(topo: &Topology) -> Vec<Vec<Rank>> {
    let n = topo.nranks() as usize;
    if !(3..=MAX_PACKING_RANKS).contains(&n) {
        return Vec::new();
    }
    let (units, bw) = link_units(topo);
    let mut budget = PACKING_BUDGET;
    let mut cycles = hamiltonian_cycles(&units, &mut budget);
    let slowest = |c: &Vec<Rank>| {
        (0..n)
            .map(|i| bw[c[i] as usize][c[(i + 1) % n] as usize])
            .fold(f64::INFINITY, f64::min)
    };
    cycles.sort_by(|a, b| slowest(b).total_cmp(&slowest(a)));
    // Upper limit on the packing: every rank's links / 2.
    let limit = (0..n)
        .map(|a| units[a].iter().sum::<u32>() / 2)
        .min()
        .unwrap_or(0) as usize;
    let mut best: Vec<usize> = Vec::new();
    let mut chosen: Vec<usize> = Vec::new();
    let mut left = units.clone();
    fn pack(
        i: usize,
        cycles: &[Vec<Rank>],
        left: &mut Vec<Vec<u32>>,
        chosen: &mut Vec<usize>,
        best: &mut Vec<usize>,
        limit: usize,
        budget: &mut u32,
    ) {
        if chosen.len() > best.len() {
            *best = chosen.clone();
        }
        if best.len() >= limit || *budget == 0 {
            return;
        }
        let n = left.len();
        for j in i..cycles.len() {
            if best.len() >= limit || *budget == 0 {
                return;
            }
            *budget -= 1;
            let c = &cycles[j];
            let fits = (0..n).all(|k| left[c[k] as usize][c[(k + 1) % n] as usize] > 0);
            if !fits {
                continue;
            }
            for k in 0..n {
                let (a, b) = (c[k] as usize, c[(k + 1) % n] as usize);
                left[a][b] -= 1;
                left[b][a] -= 1;
            }
            chosen.push(j);
            pack(j + 1, cycles, left, chosen, best, limit, budget);
            chosen.pop();
            for k in 0..n {
                let (a, b) = (c[k] as usize, c[(k + 1) % n] as usize);
                left[a][b] += 1;
                left[b][a] += 1;
            }
        }
    }
    pack(
        0,
        &cycles,
        &mut left,
        &mut chosen,
        &mut best,
        limit,
        &mut budget,
    );
    best.into_iter().map(|j| cycles[j].clone()).collect()
}

/// Directed rings for `want` channels: every cycle of the link packing in both directions
/// (so each physical link carries one ring per direction), repeated when more channels are
/// asked for; the edge-disjoint rings of [`ring_orders`] when no packing exists.
pub fn link_rings(topo: &Topology, want: usize) -> Vec<Vec<Rank>> {
    let cycles = cycle_packing(topo);
    if cycles.is_empty() {
        return ring_orders(topo, want);
    }
    let mut directed = Vec::new();
    for c in &cycles {
        let mut rev = c.clone();
        rev[1..].reverse();
        directed.push(c.clone());
        directed.push(rev);
    }
    let found = directed.len();
    (0..want.max(1))
        .map(|i| directed[i % found].clone())
        .collect()
}

/// Rings over several hosts of equal size, one per channel, as NCCL builds them on
/// rail-optimised clusters: ring `c` visits every host's ranks in local order rotated to
/// start after local rank `c`, so it leaves each host from local rank `c` (over that rank's
/// NIC) and enters the next at local rank `c + 1`; `g` channels use every NIC of a host once
/// per direction.
pub fn rail_rings(hosts: &[Vec<Rank>], want: usize) -> Vec<Vec<Rank>> {
    let g = hosts.first().map_or(0, Vec::len);
    (0..want.max(1))
        .map(|c| {
            hosts
                .iter()
                .flat_map(|h| (0..g).map(move |i| h[(c + 1 + i) % g]))
                .collect()
        })
        .collect()
}

/// Directed rings a full packing gives (0 without one).
pub fn packed_rings(topo: &Topology) -> u32 {
    2 * cycle_packing(topo).len() as u32
}

/// Generates ring schedules over the given rings (one per channel). Every ring carries an
/// equal share of the data, cut into `pipeline` pieces.
pub fn ring_schedule(
    name: &str,
    rings: &[Vec<Rank>],
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Vec<Candidate> {
    weighted_ring_schedule(
        name,
        rings,
        &vec![1; rings.len()],
        collective,
        params,
        in_place,
    )
}

/// Ring schedules in which ring `c` carries `widths[c]` of every `Σ widths` chunks of the
/// data (rings of different rates get shares in proportion), each share cut into `pipeline`
/// pieces. Every rank's block is `pipeline × Σ widths` chunks; ring `c`'s piece `q` of it is
/// the `widths[c]` chunks from `pipeline · (widths[0] + … + widths[c−1]) + q · widths[c]`.
/// With all widths 1 this is [`ring_schedule`]'s layout. A ring of width 0 carries nothing.
pub fn weighted_ring_schedule(
    name: &str,
    rings: &[Vec<Rank>],
    widths: &[u32],
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Vec<Candidate> {
    let n = rings.first().map_or(0, |r| r.len()) as u32;
    if n == 0 || widths.len() != rings.len() || widths.iter().all(|&w| w == 0) {
        return Vec::new();
    }
    if n == 1 {
        return single_rank(name, collective, in_place, params);
    }
    let pp = params.pipeline.max(1);
    let total: u32 = widths.iter().sum();
    let m = total * pp;
    // Ring c's first chunk within a block, and its width.
    let mut shares = Vec::with_capacity(rings.len());
    let mut off = 0;
    for (ring, &w) in rings.iter().zip(widths) {
        if w > 0 {
            shares.push((ring, pp * off, w));
        }
        off += w;
    }
    match collective {
        Collective::Broadcast { root } | Collective::Reduce { root } => {
            if root >= n {
                return Vec::new();
            }
            let mut b = ScheduleBuilder::new(collective, n, m, in_place);
            b.set_fusion(false);
            chains(&mut b, &shares, root, pp, m);
            candidate(name, params, b)
        }
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter => {
            let chunks = n * m;
            let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
            let kind = collective.kind();
            if kind == CollectiveKind::AllGather && !in_place {
                for r in 0..n {
                    b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
                }
            }
            let in_loc = |r: Rank, k: u32| -> Loc {
                match (kind, in_place) {
                    (CollectiveKind::AllGather, false) => Loc::input(k - r * m),
                    _ => Loc::output(k),
                }
            };
            let rs_out = |r: Rank, k: u32| -> Loc {
                match (kind, in_place) {
                    (CollectiveKind::ReduceScatter, true) => Loc::input(k),
                    (CollectiveKind::ReduceScatter, false) => Loc::output(k - r * m),
                    _ => Loc::output(k),
                }
            };
            let input = |_: Rank, k: u32| Loc::input(k);
            let output = |_: Rank, k: u32| Loc::output(k);
            for q in 0..pp {
                for (c, &(ring, first, w)) in shares.iter().enumerate() {
                    let c = c as u32;
                    let blocks: Vec<Vec<Run>> = ring
                        .iter()
                        .map(|&owner| vec![(owner * m + first + q * w, w)])
                        .collect();
                    match kind {
                        CollectiveKind::AllReduce => {
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &input, &output);
                            ring_all_gather(&mut b, ring, &blocks, c, &output, &output);
                        }
                        CollectiveKind::ReduceScatter => {
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &input, &rs_out);
                        }
                        _ => {
                            ring_all_gather(&mut b, ring, &blocks, c, &in_loc, &output);
                        }
                    }
                }
            }
            let candidates = candidate(name, params, b);
            if widths.iter().any(|&w| w != widths[0]) {
                return candidates;
            }
            // Rotating the first ring maps every rank's program onto its successor's when
            // all rings are that ring or its reverse (blocks are numbered by owner rank).
            let symmetry = Symmetry::ring(
                rings[0].clone(),
                Some(ChunkMap {
                    layout: BlockLayout::BlockMajor,
                    label: BlockLabel::Rank,
                }),
            );
            candidates
                .into_iter()
                .map(|c| c.with_symmetry(Some(symmetry.clone())))
                .collect()
        }
        Collective::AllToAll => Vec::new(),
    }
}

/// Pipelined chains from (Broadcast) or to (Reduce) the root, one per ring: `shares` gives
/// each ring, its first chunk and its width (chunks per piece); the buffer is `m` chunks.
fn chains(b: &mut ScheduleBuilder, shares: &[(&Vec<Rank>, u32, u32)], root: Rank, pp: u32, m: u32) {
    let collective = b.collective();
    let in_place = b.in_place();
    let bcast = matches!(collective, Collective::Broadcast { .. });
    if bcast && !in_place {
        b.copy((root, Loc::input(0)), (root, Loc::output(0)), m, 0);
    }
    for q in 0..pp {
        for (c, &(ring, first, w)) in shares.iter().enumerate() {
            let ch = c as u32;
            let k = first + q * w;
            let mut chain = rotate_to(ring, root);
            if !bcast {
                // Reduce: walk the ring backwards so the chain ends at the root.
                chain[1..].reverse();
                chain.reverse();
            }
            let n = chain.len();
            for i in 0..n - 1 {
                let (from, at) = (chain[i], chain[i + 1]);
                let to = chain.get(i + 2).copied();
                if i == 0 {
                    b.send(from, at, Loc::input(k), w, ch);
                }
                match (bcast, to) {
                    (true, Some(to)) => b.recv_copy_send(at, from, to, Loc::output(k), w, ch),
                    (true, None) => b.recv(at, from, Loc::output(k), w, ch),
                    (false, Some(to)) => b.recv_reduce_send(at, from, to, Loc::input(k), w, ch),
                    (false, None) => {
                        b.recv_reduce_copy(at, from, Loc::input(k), Loc::output(k), w, ch)
                    }
                }
            }
        }
    }
}

fn ring_params(topo: &Topology, collective: Collective, channels: &[u32]) -> Vec<FamilyParams> {
    let n = topo.nranks().max(1);
    let packed = packed_rings(topo);
    let mut channels = channels.to_vec();
    if packed > 0 && !channels.contains(&packed) {
        channels.push(packed);
    }
    // Multi-host: one ring per local rank (NCCL's one channel per NIC / rail).
    if let Some(hosts) = uniform_hosts(topo) {
        let g = hosts[0].len() as u32;
        if g > 1 && !channels.contains(&g) {
            channels.push(g);
        }
    }
    let channels = channels.as_slice();
    match collective.kind() {
        CollectiveKind::Broadcast | CollectiveKind::Reduce => {
            grid(channels, &[1, 2, 4, 8], 1, MAX_RING_CHUNKS)
        }
        _ => grid(channels, &[1, 2], n, MAX_RING_CHUNKS.max(n)),
    }
}

/// Steps of one ring carrying one piece of `collective` over all ranks: every rank takes
/// part in `2n − 1` (AllReduce), `n + 1` (AllGather), `n` (ReduceScatter) or about one
/// (Broadcast, Reduce) steps, so the whole-schedule count grows as n² for the first three.
pub(crate) fn ring_steps(topo: &Topology, collective: Collective) -> u64 {
    let n = u64::from(topo.nranks());
    match collective.kind() {
        CollectiveKind::AllReduce => n * (2 * n).saturating_sub(1),
        CollectiveKind::AllGather => n * (n + 1),
        CollectiveKind::ReduceScatter => n * n,
        CollectiveKind::Broadcast | CollectiveKind::Reduce | CollectiveKind::AllToAll => n + 1,
    }
}

/// The ring family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ring;

impl Family for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind != CollectiveKind::AllToAll
    }
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        ring_params(topo, collective, &[1, 2, 4])
    }
    /// Ring schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let rings = match uniform_hosts(topo) {
            Some(hosts) => rail_rings(&hosts, params.channels.max(1) as usize),
            None => link_rings(topo, params.channels.max(1) as usize),
        };
        ring_schedule(self.name(), &rings, collective, params, in_place)
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

/// Two counter-rotating rings per channel, each carrying half of the channel's data.
#[derive(Debug, Clone, Copy, Default)]
pub struct DoubleRing;

impl Family for DoubleRing {
    fn name(&self) -> &'static str {
        "double_ring"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind != CollectiveKind::AllToAll
    }
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        ring_params(topo, collective, &[1, 2])
    }
    /// Double-ring schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if topo.nranks() < 3 {
            return Vec::new();
        }
        let base = ring_orders(topo, params.channels.max(1) as usize);
        let mut rings = Vec::new();
        for ring in base {
            let mut rev = ring.clone();
            rev[1..].reverse();
            rings.push(ring);
            rings.push(rev);
        }
        ring_schedule(self.name(), &rings, collective, params, in_place)
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        Some(steps_per_piece(params, 2 * ring_steps(topo, collective)))
    }
}
