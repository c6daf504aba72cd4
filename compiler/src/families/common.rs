//! Helpers shared by the families: rank orders (rings over direct links, host-contiguous
//! orders), host grouping, ring and chain primitives written with the
//! [`ScheduleBuilder`], and wrapping builders into [`Candidate`]s.

use super::{Candidate, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, Loc, Rank};
use hccl_topologies::{Node, Topology};
use std::collections::HashSet;

/// Ranks ordered by (host, rank): consecutive ranks of a host stay together.
pub fn host_order(topo: &Topology) -> Vec<Rank> {
    let mut order: Vec<Rank> = (0..topo.nranks()).collect();
    order.sort_by_key(|&r| (topo.host_of[r as usize], r));
    order
}

/// Ranks of every host (hosts in index order, ranks ascending) when all hosts hold the same
/// number of ranks and there is more than one host.
pub fn uniform_hosts(topo: &Topology) -> Option<Vec<Vec<Rank>>> {
    let groups: Vec<Vec<Rank>> = topo
        .ranks_by_host()
        .into_iter()
        .filter(|g| !g.is_empty())
        .collect();
    let g = groups.first()?.len();
    (groups.len() > 1 && groups.iter().all(|x| x.len() == g)).then_some(groups)
}

/// Bandwidth of the direct device-to-device edge `a → b` (GB/s), 0 without one.
pub fn direct_bw(topo: &Topology, a: Rank, b: Rank) -> f64 {
    topo.direct_edge(a, b).map_or(0.0, |e| topo.graph[e].bw)
}

/// Direct device neighbours of each rank, fastest first (ties by rank).
fn direct_neighbours(topo: &Topology) -> Vec<Vec<Rank>> {
    let n = topo.nranks();
    let mut rank_of = std::collections::HashMap::new();
    for (r, &node) in topo.ranks.iter().enumerate() {
        rank_of.insert(node, r as Rank);
    }
    (0..n)
        .map(|r| {
            let mut ns: Vec<Rank> = topo
                .graph
                .neighbors(topo.ranks[r as usize])
                .filter(|m| matches!(topo.graph[*m], Node::Device { .. }))
                .filter_map(|m| rank_of.get(&m).copied())
                .filter(|&p| p != r)
                .collect();
            ns.sort_unstable();
            ns.dedup();
            ns.sort_by(|&a, &b| direct_bw(topo, r, b).total_cmp(&direct_bw(topo, r, a)));
            ns
        })
        .collect()
}

/// Search budget (DFS expansions) per Hamiltonian cycle.
const HAMILTON_BUDGET: u32 = 200_000;

/// A directed Hamiltonian cycle over direct links avoiding `used` edges, by bounded DFS.
fn hamiltonian_cycle(nbrs: &[Vec<Rank>], used: &HashSet<(Rank, Rank)>) -> Option<Vec<Rank>> {
    let n = nbrs.len();
    let mut path = vec![0 as Rank];
    let mut on_path = vec![false; n];
    on_path[0] = true;
    let mut next_idx = vec![0usize];
    let mut budget = HAMILTON_BUDGET;
    while let Some(&last) = path.last() {
        if path.len() == n {
            if !used.contains(&(last, 0)) && nbrs[last as usize].contains(&0) {
                return Some(path);
            }
        } else {
            let i = next_idx.last_mut()?;
            let cand = nbrs[last as usize]
                .iter()
                .enumerate()
                .skip(*i)
                .find(|&(_, &m)| !on_path[m as usize] && !used.contains(&(last, m)));
            if let Some((j, &m)) = cand {
                *i = j + 1;
                budget = budget.checked_sub(1)?;
                path.push(m);
                on_path[m as usize] = true;
                next_idx.push(0);
                continue;
            }
        }
        // Backtrack.
        let gone = path.pop()?;
        on_path[gone as usize] = false;
        next_idx.pop();
    }
    None
}

/// Up to `want` edge-disjoint directed rings: Hamiltonian cycles over direct links (each
/// with its reverse) when the device graph has them, else the host-contiguous order
/// repeated. Always at least one ring; deterministic.
pub fn ring_orders(topo: &Topology, want: usize) -> Vec<Vec<Rank>> {
    let n = topo.nranks() as usize;
    let mut rings = Vec::new();
    if n > 2 && n <= 64 {
        let nbrs = direct_neighbours(topo);
        if nbrs.iter().all(|v| v.len() >= 2) {
            let mut used = HashSet::new();
            while rings.len() < want {
                let Some(cycle) = hamiltonian_cycle(&nbrs, &used) else {
                    break;
                };
                for w in 0..n {
                    let (a, b) = (cycle[w], cycle[(w + 1) % n]);
                    used.insert((a, b));
                    used.insert((b, a));
                }
                let mut rev = cycle.clone();
                rev[1..].reverse();
                rings.push(cycle);
                if rings.len() < want {
                    rings.push(rev);
                }
            }
        }
    }
    if rings.is_empty() {
        rings.push(host_order(topo));
    }
    let found = rings.len();
    let mut i = 0;
    while rings.len() < want {
        rings.push(rings[i % found].clone());
        i += 1;
    }
    rings.truncate(want.max(1));
    rings
}

/// Position of each rank in `order`.
pub fn positions(order: &[Rank], n: u32) -> Vec<usize> {
    let mut pos = vec![0; n as usize];
    for (i, &r) in order.iter().enumerate() {
        pos[r as usize] = i;
    }
    pos
}

/// `order` rotated so that `first` comes first.
pub fn rotate_to(order: &[Rank], first: Rank) -> Vec<Rank> {
    let at = order.iter().position(|&r| r == first).unwrap_or(0);
    order[at..].iter().chain(&order[..at]).copied().collect()
}

/// A contiguous run of chunks `(start, count)`.
pub type Run = (u32, u32);

/// Merges a list of single-chunk indices into contiguous runs (input need not be sorted).
pub fn runs_of(mut chunks: Vec<u32>) -> Vec<Run> {
    chunks.sort_unstable();
    let mut runs: Vec<Run> = Vec::new();
    for c in chunks {
        match runs.last_mut() {
            Some((s, n)) if *s + *n == c => *n += 1,
            _ => runs.push((c, 1)),
        }
    }
    runs
}

/// Where a rank keeps a run, given the run's first chunk.
pub type LocFn<'a> = &'a dyn Fn(Rank, u32) -> Loc;

/// Ring reduce-scatter along `ring`: block `i` (runs `blocks[i]`) ends reduced on `ring[i]`.
/// Contributions are read from `contrib`, the result written to `result` on the owner;
/// intermediate hops use receive-reduce-send.
fn ring_reduce_scatter_pass(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    contrib: LocFn<'_>,
    result: LocFn<'_>,
) {
    let n = ring.len();
    if n < 2 {
        for (i, runs) in blocks.iter().enumerate() {
            for &(s, c) in runs {
                b.copy(
                    (ring[i], contrib(ring[i], s)),
                    (ring[i], result(ring[i], s)),
                    c,
                    channel,
                );
            }
        }
        return;
    }
    // Every rank's own first send precedes what it forwards on the same connection.
    for (i, runs) in blocks.iter().enumerate() {
        let (from, at) = (ring[(i + 1) % n], ring[(i + 2) % n]);
        for &(s, c) in runs {
            b.send(from, at, contrib(from, s), c, channel);
        }
    }
    for h in 0..n - 1 {
        for (i, runs) in blocks.iter().enumerate() {
            let from = ring[(i + 1 + h) % n];
            let at = ring[(i + 2 + h) % n];
            let to = ring[(i + 3 + h) % n];
            for &(s, c) in runs {
                if h == n - 2 {
                    b.recv_reduce_copy(at, from, contrib(at, s), result(at, s), c, channel);
                } else {
                    b.recv_reduce_send(at, from, to, contrib(at, s), c, channel);
                }
            }
        }
    }
}

/// Ring all-gather along `ring`: block `i` starts at `ring[i]` in `have` and is stored at
/// `put` on every other rank.
fn ring_all_gather_pass(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    have: LocFn<'_>,
    put: LocFn<'_>,
) {
    let n = ring.len();
    if n < 2 {
        return;
    }
    for (i, runs) in blocks.iter().enumerate() {
        let (from, at) = (ring[i], ring[(i + 1) % n]);
        for &(s, c) in runs {
            b.send(from, at, have(from, s), c, channel);
        }
    }
    for h in 0..n - 1 {
        for (i, runs) in blocks.iter().enumerate() {
            let from = ring[(i + h) % n];
            let at = ring[(i + 1 + h) % n];
            let to = ring[(i + 2 + h) % n];
            for &(s, c) in runs {
                if h == n - 2 {
                    b.recv(at, from, put(at, s), c, channel);
                } else {
                    b.recv_copy_send(at, from, to, put(at, s), c, channel);
                }
            }
        }
    }
}

/// Wraps a finished builder as a candidate; a build error (a family bug) yields nothing.
pub fn candidate(name: &str, params: FamilyParams, b: ScheduleBuilder) -> Vec<Candidate> {
    match b.build() {
        Ok(schedule) => vec![Candidate {
            algorithm: name.to_string(),
            params,
            schedule,
            symmetry: None,
            min_bytes: 0,
            synthesis: None,
            template: None,
        }],
        Err(_) => Vec::new(),
    }
}

/// The schedule of a single rank: copy input to output unless in place.
pub fn single_rank(
    name: &str,
    collective: Collective,
    in_place: bool,
    params: FamilyParams,
) -> Vec<Candidate> {
    let mut b = ScheduleBuilder::new(collective, 1, 1, in_place);
    if !in_place {
        b.copy((0, Loc::input(0)), (0, Loc::output(0)), 1, 0);
    }
    candidate(name, params, b)
}

/// The (channels, pipeline) grid, skipping combinations whose chunk count
/// `nranks × channels × pipeline` would exceed `max_chunks` (the smallest always stays).
pub fn grid(
    channels: &[u32],
    pipeline: &[u32],
    per_rank: u32,
    max_chunks: u32,
) -> Vec<FamilyParams> {
    let mut out = Vec::new();
    for &c in channels {
        for &p in pipeline {
            if out.is_empty() || u64::from(per_rank) * u64::from(c * p) <= u64::from(max_chunks) {
                out.push(FamilyParams {
                    channels: c,
                    pipeline: p,
                });
            }
        }
    }
    out
}

/// The `u`-th run of every block (blocks without one get none): rings move one run per
/// block at a time, so that no rank queues more than one message ahead of its forwards.
fn run_pass(blocks: &[Vec<Run>], u: usize) -> Vec<Vec<Run>> {
    blocks
        .iter()
        .map(|r| r.get(u).into_iter().copied().collect())
        .collect()
}

/// Ring reduce-scatter along `ring`: block `i` (runs `blocks[i]`) ends reduced on `ring[i]`.
/// Contributions are read from `contrib`, the result written to `result` on the owner;
/// intermediate hops use receive-reduce-send.
pub fn ring_reduce_scatter(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    contrib: LocFn<'_>,
    result: LocFn<'_>,
) {
    let passes = blocks.iter().map(Vec::len).max().unwrap_or(0);
    for u in 0..passes {
        ring_reduce_scatter_pass(b, ring, &run_pass(blocks, u), channel, contrib, result);
    }
}

/// Ring all-gather along `ring`: block `i` starts at `ring[i]` in `have` and is stored at
/// `put` on every other rank.
pub fn ring_all_gather(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    have: LocFn<'_>,
    put: LocFn<'_>,
) {
    let passes = blocks.iter().map(Vec::len).max().unwrap_or(0);
    for u in 0..passes {
        ring_all_gather_pass(b, ring, &run_pass(blocks, u), channel, have, put);
    }
}
