//! The problem: the direct links of a machine ([`LinkMatrix`]), the instances (steps,
//! rounds, chunks), their bounds (cuts, least steps), the automorphisms that reduce the
//! model, and an algorithm's transfers with their check.

use crate::synth::SynthError;
use hccl_ir::Collective;
use hccl_topologies::{Node, Topology};
use petgraph::visit::EdgeRef;
use std::collections::{HashMap, VecDeque};

/// Largest rank count the MILP synthesizer takes.
pub const MAX_RANKS: u32 = 16;
/// Largest step count a frontier search takes.
pub const MAX_STEPS: u32 = 8;
/// Largest chunk count per buffer piece a frontier search takes.
pub const MAX_CHUNKS: u32 = 16;
/// Most rounds an instance of the frontier search has.
pub const MAX_ROUNDS: u32 = 64;
/// Rank count up to which every subset of ranks is a cut of the bandwidth bound (else only
/// single ranks and their complements).
const CUT_SUBSETS_MAX_RANKS: usize = 16;
/// Nodes the automorphism search visits per pair of ranks before giving up on the pair.
const AUTOMORPHISM_NODES: usize = 20_000;

/// Link bandwidths in SCCL's units: `b[u][v]` chunks per round over the direct links
/// `u → v` (0: no direct link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMatrix {
    pub n: usize,
    /// `b[u * n + v]`.
    pub b: Vec<u32>,
    /// Bandwidth of one unit (GB/s per direction): the slowest direct link.
    pub unit_gbps: u64,
}

impl LinkMatrix {
    /// The direct device-to-device links of `topo`: every directed edge between two rank
    /// devices, in units of the slowest single link (its bandwidth over its count), rounded
    /// down (at least 1 per link). Pairs without a direct link get 0 and are not used.
    pub fn from_topology(topo: &Topology) -> Result<LinkMatrix, SynthError> {
        let n = topo.ranks.len();
        let rank_of = |idx| match &topo.graph[idx] {
            Node::Device { rank, .. } => Some(*rank as usize),
            _ => None,
        };
        let mut edges = Vec::new();
        for e in topo.graph.edge_references() {
            if let (Some(u), Some(v)) = (rank_of(e.source()), rank_of(e.target()))
                && u != v
                && u < n
                && v < n
                && e.weight().bw > 0.0
            {
                edges.push((u, v, e.weight().bw, e.weight().count.max(1)));
            }
        }
        let unit = edges
            .iter()
            .map(|&(_, _, bw, count)| bw / f64::from(count))
            .fold(f64::INFINITY, f64::min);
        if edges.is_empty() || !unit.is_finite() || unit <= 0.0 {
            return Err(SynthError::Instance(format!(
                "{} has no direct device-to-device links (the SCCL model uses only those)",
                topo.name
            )));
        }
        let mut b = vec![0u32; n * n];
        for &(u, v, bw, _) in &edges {
            b[u * n + v] += ((bw / unit + 1e-9).floor() as u32).max(1);
        }
        Ok(LinkMatrix {
            n,
            b,
            unit_gbps: unit.round() as u64,
        })
    }

    /// A matrix from rows (tests, hand-written machines).
    pub fn from_rows(rows: &[Vec<u32>]) -> LinkMatrix {
        let n = rows.len();
        let mut b = vec![0; n * n];
        for (u, row) in rows.iter().enumerate() {
            for (v, &x) in row.iter().enumerate().take(n) {
                if u != v {
                    b[u * n + v] = x;
                }
            }
        }
        LinkMatrix { n, b, unit_gbps: 1 }
    }

    pub fn get(&self, u: usize, v: usize) -> u32 {
        self.b[u * self.n + v]
    }

    /// The links, `(u, v)` with `b > 0`.
    pub fn links(&self) -> Vec<(usize, usize)> {
        let n = self.n;
        (0..n * n)
            .filter(|&i| self.b[i] > 0)
            .map(|i| (i / n, i % n))
            .collect()
    }

    /// The matrix with every link reversed.
    pub fn transposed(&self) -> LinkMatrix {
        let n = self.n;
        let mut b = vec![0; n * n];
        for u in 0..n {
            for v in 0..n {
                b[v * n + u] = self.b[u * n + v];
            }
        }
        LinkMatrix {
            n,
            b,
            unit_gbps: self.unit_gbps,
        }
    }

    /// Rows, for display.
    pub fn rows(&self) -> Vec<Vec<u32>> {
        (0..self.n)
            .map(|u| self.b[u * self.n..(u + 1) * self.n].to_vec())
            .collect()
    }

    /// Hop distances from `src` over the links (`u32::MAX`: unreachable).
    pub fn distances(&self, src: usize) -> Vec<u32> {
        let mut dist = vec![u32::MAX; self.n];
        dist[src] = 0;
        let mut queue = VecDeque::from([src]);
        while let Some(u) = queue.pop_front() {
            for v in 0..self.n {
                if self.get(u, v) > 0 && dist[v] == u32::MAX {
                    dist[v] = dist[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        dist
    }
}

/// A collective the MILP synthesizes: the non-combining ones directly, the combining ones as
/// their duals.
pub(super) fn base_of(collective: Collective, n: u32) -> Result<(Vec<u32>, bool), SynthError> {
    match collective {
        Collective::AllGather => Ok(((0..n).collect(), false)),
        Collective::ReduceScatter => Ok(((0..n).collect(), true)),
        Collective::Broadcast { root } | Collective::Reduce { root } if root >= n => Err(
            SynthError::Instance(format!("root {root} is not a rank (0..{n})")),
        ),
        Collective::Broadcast { root } => Ok((vec![root], false)),
        Collective::Reduce { root } => Ok((vec![root], true)),
        other => Err(SynthError::Instance(format!(
            "the MILP synthesizer does allgather, broadcast, reducescatter and reduce, not {}",
            other.kind().name()
        ))),
    }
}

/// The origins of the non-combining problem `collective` reduces to (every rank for
/// AllGather and ReduceScatter, the root for Broadcast and Reduce; every other rank needs
/// every origin's chunks), and whether it is solved as a dual (reversed).
pub fn origins_of(collective: Collective, n: u32) -> Result<(Vec<u32>, bool), SynthError> {
    base_of(collective, n)
}

/// A rational `num/den` (rounds per chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    pub num: u64,
    pub den: u64,
}

impl Ratio {
    pub fn new(num: u64, den: u64) -> Ratio {
        let g = gcd(num, den.max(1));
        Ratio {
            num: num / g.max(1),
            den: den.max(1) / g.max(1),
        }
    }

    pub fn value(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `self < other`.
    pub fn lt(self, other: Ratio) -> bool {
        u128::from(self.num) * u128::from(other.den) < u128::from(other.num) * u128::from(self.den)
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The proven least rounds per chunk of any algorithm (any step count) moving every origin's
/// chunks to every other rank over `links`: the largest, over sets `X` of ranks, of the
/// origins whose chunks must enter `X` over `X`'s inbound bandwidth, and of those whose
/// chunks must leave `X` over its outbound bandwidth (each chunk crosses the cut at least
/// once; a round moves `b` chunks per link). `None` when some cut has no capacity (a rank
/// cannot be reached).
pub fn cut_bound(links: &LinkMatrix, origins: &[u32]) -> Option<Ratio> {
    let n = links.n;
    let sets: Vec<u64> = if n <= CUT_SUBSETS_MAX_RANKS {
        (1..(1u64 << n) - 1).collect()
    } else {
        let all = (1u64 << n) - 1;
        (0..n)
            .flat_map(|v| [1u64 << v, all ^ (1u64 << v)])
            .collect()
    };
    let mut best = Ratio::new(0, 1);
    let link_list = links.links();
    for x in sets {
        let inside = |v: usize| x >> v & 1 == 1;
        let (mut cap_in, mut cap_out) = (0u64, 0u64);
        for &(u, v) in &link_list {
            let b = u64::from(links.get(u, v));
            match (inside(u), inside(v)) {
                (false, true) => cap_in += b,
                (true, false) => cap_out += b,
                _ => {}
            }
        }
        // Every rank but the origin needs an origin's chunks: they enter X when the origin
        // is outside, and leave X when it is inside (X is never every rank).
        let outside = origins.iter().filter(|&&o| !inside(o as usize)).count() as u64;
        let within = origins.len() as u64 - outside;
        let needs_in = outside > 0 && (0..n).any(inside);
        for (demand, cap) in [
            (if needs_in { outside } else { 0 }, cap_in),
            (within, cap_out),
        ] {
            if demand == 0 {
                continue;
            }
            if cap == 0 {
                return None;
            }
            let r = Ratio::new(demand, cap);
            if best.lt(r) {
                best = r;
            }
        }
    }
    Some(best)
}

/// The least steps of any algorithm: the longest hop distance from an origin to a rank.
/// `None` when a rank is unreachable.
pub fn least_steps(links: &LinkMatrix, origins: &[u32]) -> Option<u32> {
    let mut most = 0;
    for &o in origins {
        for d in links.distances(o as usize) {
            if d == u32::MAX {
                return None;
            }
            most = most.max(d);
        }
    }
    Some(most)
}

/// The proven bound on rounds per chunk for `collective` over `topo`'s direct links.
pub fn bandwidth_bound(links: &LinkMatrix, collective: Collective) -> Result<Ratio, SynthError> {
    let (origins, dual) = base_of(collective, links.n as u32)?;
    let links = if dual {
        links.transposed()
    } else {
        links.clone()
    };
    cut_bound(&links, &origins).ok_or_else(|| {
        SynthError::Instance("some rank cannot be reached over the direct links".into())
    })
}

/// A permutation of ranks.
pub type Perm = Vec<usize>;

/// For every rank `o`, an automorphism of `links` (a permutation preserving every `b`) and
/// the representative `ρ` it maps to `o`: `(ρ, π)` with `π[ρ] = o`. Representatives map to
/// themselves by the identity; a rank for which no automorphism from an earlier
/// representative is found (the search is bounded) is a representative of its own.
pub fn automorphisms(links: &LinkMatrix) -> Vec<(usize, Perm)> {
    let n = links.n;
    let identity: Perm = (0..n).collect();
    let mut out: Vec<(usize, Perm)> = Vec::with_capacity(n);
    let mut reps: Vec<usize> = Vec::new();
    for o in 0..n {
        let found = reps
            .iter()
            .find_map(|&rho| automorphism_taking(links, rho, o).map(|p| (rho, p)));
        match found {
            Some(x) => out.push(x),
            None => {
                reps.push(o);
                out.push((o, identity.clone()));
            }
        }
    }
    out
}

/// An automorphism of `links` with `π[from] = to`, by backtracking (bounded).
fn automorphism_taking(links: &LinkMatrix, from: usize, to: usize) -> Option<Perm> {
    let n = links.n;
    let profile = |u: usize| {
        let mut outs: Vec<u32> = (0..n).map(|v| links.get(u, v)).collect();
        let mut ins: Vec<u32> = (0..n).map(|v| links.get(v, u)).collect();
        outs.sort_unstable();
        ins.sort_unstable();
        (outs, ins)
    };
    let profiles: Vec<_> = (0..n).map(profile).collect();
    if profiles[from] != profiles[to] {
        return None;
    }
    // `from` first, then by hop distance from it (neighbours constrain the choice early).
    let dist = links.distances(from);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&v| (v != from, dist[v], v));
    struct Search<'a> {
        links: &'a LinkMatrix,
        profiles: Vec<(Vec<u32>, Vec<u32>)>,
        order: Vec<usize>,
        image: Vec<usize>,
        used: Vec<bool>,
        nodes: usize,
        to: usize,
    }
    impl Search<'_> {
        fn go(&mut self, i: usize) -> bool {
            if i == self.order.len() {
                return true;
            }
            self.nodes += 1;
            if self.nodes > AUTOMORPHISM_NODES {
                return false;
            }
            let u = self.order[i];
            let n = self.order.len();
            for w in 0..n {
                if self.used[w] || (i == 0 && w != self.to) || self.profiles[u] != self.profiles[w]
                {
                    continue;
                }
                let links = self.links;
                let consistent = self.order[..i].iter().all(|&p| {
                    let q = self.image[p];
                    links.get(p, u) == links.get(q, w) && links.get(u, p) == links.get(w, q)
                });
                if !consistent {
                    continue;
                }
                self.image[u] = w;
                self.used[w] = true;
                if self.go(i + 1) {
                    return true;
                }
                self.used[w] = false;
                self.image[u] = usize::MAX;
            }
            false
        }
    }
    let mut search = Search {
        links,
        profiles,
        order,
        image: vec![usize::MAX; n],
        used: vec![false; n],
        nodes: 0,
        to,
    };
    search.go(0).then_some(search.image)
}

/// One instance of the search: steps, rounds and chunks per origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Instance {
    pub steps: u32,
    pub rounds: u32,
    pub chunks: u32,
}

impl Instance {
    pub fn ratio(self) -> Ratio {
        Ratio::new(u64::from(self.rounds), u64::from(self.chunks))
    }
}

/// One transfer of an algorithm: chunk `chunk` (origin-major: `origin_index · C + k`) from
/// `from` to `to` in step `step` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transfer {
    pub step: u32,
    pub chunk: u32,
    pub from: u32,
    pub to: u32,
}

/// A synthesized algorithm in SCCL's model.
#[derive(Debug, Clone, PartialEq)]
pub struct Algorithm {
    pub collective: Collective,
    pub nranks: u32,
    pub instance: Instance,
    /// Rounds of every step (`Σ = instance.rounds`).
    pub rounds_per_step: Vec<u32>,
    /// The origins (rank of each origin index: every rank for AllGather and ReduceScatter,
    /// the root for Broadcast and Reduce).
    pub origins: Vec<u32>,
    /// Sends, step-major. For the combining collectives the chunk is added into the
    /// receiver's partial sum.
    pub transfers: Vec<Transfer>,
}

impl Algorithm {
    /// The dual algorithm (SCCL's duality): every transfer reversed and its step mirrored,
    /// the rounds split mirrored, for `collective` (the combining or non-combining partner).
    pub fn reversed(&self, collective: Collective) -> Algorithm {
        let s = self.instance.steps;
        let mut transfers: Vec<Transfer> = self
            .transfers
            .iter()
            .map(|t| Transfer {
                step: s + 1 - t.step,
                chunk: t.chunk,
                from: t.to,
                to: t.from,
            })
            .collect();
        transfers.sort();
        Algorithm {
            collective,
            nranks: self.nranks,
            instance: self.instance,
            rounds_per_step: self.rounds_per_step.iter().rev().copied().collect(),
            origins: self.origins.clone(),
            transfers,
        }
    }

    /// Checks the algorithm against SCCL's model on `links`: every transfer on a link, within
    /// every step's capacity, from a rank that holds the chunk (combining: every contribution
    /// reaches the origin exactly once). Returns the first violation.
    pub fn check(&self, links: &LinkMatrix) -> Result<(), String> {
        let (_, dual) = base_of(self.collective, self.nranks).map_err(|e| e.to_string())?;
        let alg = if dual {
            self.reversed(match self.collective {
                Collective::ReduceScatter => Collective::AllGather,
                Collective::Reduce { root } => Collective::Broadcast { root },
                c => c,
            })
        } else {
            self.clone()
        };
        let links = if dual {
            links.transposed()
        } else {
            links.clone()
        };
        let n = self.nranks as usize;
        let c = self.instance.chunks;
        if alg.rounds_per_step.len() != alg.instance.steps as usize
            || alg.rounds_per_step.iter().sum::<u32>() != alg.instance.rounds
            || alg.rounds_per_step.contains(&0)
        {
            return Err("rounds per step do not add up".into());
        }
        let total = alg.origins.len() * c as usize;
        let mut holds = vec![vec![u32::MAX; n]; total];
        for (oi, &o) in alg.origins.iter().enumerate() {
            for k in 0..c as usize {
                holds[oi * c as usize + k][o as usize] = 0;
            }
        }
        let mut load: HashMap<(u32, u32, u32), u32> = HashMap::new();
        for t in &alg.transfers {
            let (u, v, ch) = (t.from as usize, t.to as usize, t.chunk as usize);
            if ch >= total || u >= n || v >= n || links.get(u, v) == 0 {
                return Err(format!("{t:?}: no such chunk or link"));
            }
            if holds[ch][u] >= t.step {
                return Err(format!("{t:?}: the sender does not hold the chunk yet"));
            }
            if holds[ch][v] != u32::MAX {
                return Err(format!("{t:?}: the receiver already has the chunk"));
            }
            holds[ch][v] = t.step;
            *load.entry((t.from, t.to, t.step)).or_default() += 1;
        }
        for (&(u, v, s), &l) in &load {
            let cap = links.get(u as usize, v as usize) * alg.rounds_per_step[s as usize - 1];
            if l > cap {
                return Err(format!(
                    "link {u}->{v} carries {l} chunks in step {s}, capacity {cap}"
                ));
            }
        }
        if let Some((ch, v)) = (0..total)
            .flat_map(|ch| (0..n).map(move |v| (ch, v)))
            .find(|&(ch, v)| holds[ch][v] == u32::MAX)
        {
            return Err(format!("rank {v} never gets chunk {ch}"));
        }
        Ok(())
    }
}

/// How a solver call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// An algorithm was found (feasibility: the first one is as good as any).
    Feasible,
    /// Proven infeasible by the solver.
    Infeasible,
    /// Proven infeasible without a solve (fewer steps than hops, rounds below the bound or
    /// fewer than steps).
    Pruned,
    /// The time limit ran out with neither an algorithm nor a proof.
    TimeLimit,
    /// A heuristic (the dive, a decomposition) found nothing; that proves nothing.
    DeadEnd,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Feasible => "feasible",
            Stop::Infeasible => "infeasible",
            Stop::Pruned => "pruned",
            Stop::TimeLimit => "time-limit",
            Stop::DeadEnd => "dead-end",
        }
    }
}

/// One instance's outcome with its solver calls.
#[derive(Debug, Clone)]
pub struct Solved {
    pub instance: Instance,
    pub stop: Stop,
    /// Wall time of all its solves (seconds).
    pub seconds: f64,
    /// Which models ran, in order, with their stop and time: `relaxation`, `symmetric`,
    /// `exact`.
    pub solves: Vec<(&'static str, Stop, f64)>,
    pub algorithm: Option<Algorithm>,
}
