//! Latency-optimal synthesis in SCCL's model (steps, rounds, chunks), by mixed-integer
//! linear programming, and the Pareto frontier over (steps, rounds per chunk).
//!
//! **The model** (SCCL, Cai et al., PPoPP 2021). Ranks joined by directed links of
//! bandwidth `b(u, v)` chunks per round ([`LinkMatrix`]: the topology's direct
//! device-to-device links, in units of the slowest one, times the link count; pairs without a
//! direct link are not used — traffic through switches, NICs or host bridges is outside the
//! model, so a topology whose ranks only meet at a switch has no links here). An algorithm has
//! `S` steps; step `s` has `r_s ≥ 1` rounds, `R = Σ r_s`; in step `s` link `(u, v)` carries at
//! most `b(u, v)·r_s` chunks; a chunk that arrives in step `s` can be forwarded from step
//! `s + 1`. A collective over `C` chunks per buffer piece (AllGather: every rank starts with
//! `C` chunks, `n·C` in all; Broadcast: the root's `C`) then costs about `S·α + (R/C)·M·β`
//! for buffers of `M` bytes per piece: `R/C` rounds per chunk is the bandwidth cost.
//!
//! **One instance** `(S, R, C)` ([`solve_instance`]) is a feasibility MILP over binary sends
//! `x[c, u, v, s]` (chunk `c` crosses `u → v` in step `s`) and integer rounds `r_s`:
//!
//! ```text
//! Σ_{u,s} x[c,u,v,s] = 1                 every rank v that needs c (received exactly once)
//! x[c,u,v,s] ≤ Σ_{w, s'<s} x[c,w,u,s']    u ≠ origin(c): u forwards only what it holds
//! Σ_c x[c,u,v,s] ≤ b(u,v)·r_s             link capacity in step s
//! Σ_s r_s = R,  1 ≤ r_s                   the rounds split is part of the search
//! ```
//!
//! Possession is implicit (a rank holds `c` from the step after it receives it); a chunk is
//! never sent twice to one rank; sends from a rank that cannot hold the chunk yet (hop
//! distance from its origin ≥ s) are not variables at all. The solves, cheapest first
//! ([`solve_base`]):
//!
//! 1. the **relaxation**: chunks of one origin are interchangeable, so their sends are summed
//!    into integer counts `y[o, u, v, s]` (the same constraints summed over the origin's
//!    chunks). Every algorithm gives a solution of it, so its infeasibility proves the
//!    instance infeasible. It runs once with the rounds split free, then once per split
//!    `r_1 + … + r_S = R` (balanced splits first), each split it refutes is proven
//!    impossible; an instance whose every split is refuted is proven infeasible;
//! 2. per split left, a **dive** over the **symmetric** per-chunk model: with automorphisms
//!    `π_o` of the link matrix taking a representative origin `ρ` to every origin `o` of its
//!    orbit ([`automorphisms`]; on DGX-1 two orbits of four), only the representatives'
//!    chunks are variables, chunk `k` of `o` follows `π_o` of the path of chunk `k` of `ρ`,
//!    and the capacities sum over the images. The dive solves its LP, fixes the largest
//!    fractional send to 1 (to 0 when that makes the LP infeasible) and repeats until the LP
//!    is integral: an algorithm, checked against the model ([`Algorithm::check`]). A dive that
//!    dies proves nothing (microlp's own branch and bound on this model runs past a minute
//!    for DGX-1's 3-step instance; the dive takes half a second);
//! 3. per split still left, the aggregate over the representatives and its decomposition into
//!    chunks, origin by origin (a small MILP per origin within the aggregate's sends, else
//!    within what the others leave of the links);
//! 4. the **exact** per-chunk model over every split, with the time left.
//!
//! Chunks of one origin are ordered by the sum of their send steps (symmetry breaking).
//! Every solve has a time limit; a call that runs out reports [`Stop::TimeLimit`] (microlp
//! reports no bound for a feasibility problem, so no gap is known).
//!
//! **The frontier** ([`pareto`]): for `S` from the least possible (the largest hop distance
//! a chunk must travel) to `max_steps`, instances `(R, C)` with `C ≤ max_chunks` in
//! increasing `R/C` (then `C`), skipping ratios below the proven bound ([`bandwidth_bound`]:
//! for every set `X` of ranks, the chunks that must enter `X` over its inbound capacity and
//! those that must leave it over its outbound) and ratios no better than the last point; the
//! first feasible one is a point. It stops when `R/C` meets the bound.
//!
//! **Combining collectives** by SCCL's duality: a ReduceScatter (Reduce) is an AllGather
//! (Broadcast) over the transposed links run backwards ([`Algorithm::reversed`]): every send
//! `u → v` in step `s` becomes `v → u` in step `S + 1 − s`, and a received chunk is added to
//! the receiver's contribution instead of copied.
//!
//! [`lower`] turns an algorithm into a chunk schedule: step-major sends, one IR chunk per
//! algorithm chunk, runs of consecutive chunks on one link in one step as one message (a
//! step with `r_s` rounds moves up to `b·r_s` chunks per link, which is what the simulator
//! then prices).

use super::SynthError;
use crate::builder::ScheduleBuilder;
use crate::families::common::candidate;
use crate::families::{Candidate, FamilyParams};
use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, WithTimeLimit,
    constraint, variable,
};
use hccl_ir::{Collective, Loc, Synthesis};
use hccl_topologies::{Node, Topology};
use petgraph::visit::EdgeRef;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

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
fn base_of(collective: Collective, n: u32) -> Result<(Vec<u32>, bool), SynthError> {
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

/// The model's variables of one chunk class: sends per (link, step).
struct Class {
    /// Origin rank.
    origin: usize,
    /// Chunks the class stands for (1, or C in the relaxation).
    count: u32,
    /// Automorphisms it is copied under for the capacities (identity alone when not
    /// symmetric).
    images: Vec<Perm>,
    /// `(link index, step) → variable`.
    x: HashMap<(usize, u32), Variable>,
}

enum ModelKind {
    /// Sends of every origin's chunks summed.
    Relaxation,
    /// Sends of the representatives' chunks summed, images under the automorphisms.
    Symmetric,
    /// Every chunk's sends.
    Exact,
    /// Every representative chunk's sends, images under the automorphisms.
    SymmetricChunks,
}

/// One class of an aggregate solution: its origin, its images and its sends
/// (`(link, step) → chunks`).
type Aggregate = (usize, Vec<Perm>, HashMap<(usize, u32), u32>);

/// A model's solution: the rounds of every step, and per class its origin, images and sends
/// (`(link, step) → chunks`), and the transfers of the exact model.
struct ModelSolution {
    /// Every send variable's value, `(class, link, step)`.
    values: HashMap<(usize, usize, u32), f64>,
    rounds: Vec<u32>,
    aggregates: Vec<Aggregate>,
    transfers: Vec<Transfer>,
}

/// Builds and solves one model: `Ok(Some((rounds per step, transfers)))` (no transfers
/// from the relaxation), `Ok(None)` proven infeasible, `Err` time limit or solver trouble.
#[allow(clippy::too_many_arguments)]
fn solve_model(
    links: &LinkMatrix,
    origins: &[u32],
    inst: Instance,
    kind: &ModelKind,
    sym: &[(usize, Perm)],
    split: Option<&[u32]>,
    dive: Option<&HashMap<(usize, usize, u32), bool>>,
    time_limit: f64,
) -> Result<Option<ModelSolution>, String> {
    let link_list = links.links();
    let (mut classes, class_of) = model_classes(links.n, origins, inst.chunks, kind, sym);
    let mut vars = ProblemVariables::new();
    let r = send_variables(&mut vars, links, &mut classes, inst, split, dive);
    let model = vars
        .minimise(Expression::from(0.0))
        .using(crate::lp::solver)
        .with_time_limit(time_limit.max(0.001));
    let (model, link_index) = with_flow_rows(model, links, &classes, &class_of, &r, inst);
    let model = with_capacity_rows(model, links, &classes, &link_index, &r, inst.steps);
    let sol = match model.solve() {
        Ok(sol) => sol,
        Err(ResolutionError::Infeasible) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    Ok(Some(read_solution(
        &sol,
        &classes,
        &class_of,
        &link_list,
        origins,
        (&r, inst.chunks),
    )))
}

/// The model's chunk classes and each one's `(origin index, chunk)`: per origin its whole
/// buffer (the relaxation) or each chunk (exact); in the symmetric models per orbit
/// representative, copied under the automorphisms to the rest of its orbit.
fn model_classes(
    n: usize,
    origins: &[u32],
    c: u32,
    kind: &ModelKind,
    sym: &[(usize, Perm)],
) -> (Vec<Class>, Vec<(usize, u32)>) {
    // Classes: (origin, chunk index or aggregate, images).
    let mut classes: Vec<Class> = Vec::new();
    let mut class_of: Vec<(usize, u32)> = Vec::new(); // (origin index, k) of each class
    match kind {
        ModelKind::Relaxation => {
            for (oi, &o) in origins.iter().enumerate() {
                classes.push(Class {
                    origin: o as usize,
                    count: c,
                    images: vec![(0..n).collect()],
                    x: HashMap::new(),
                });
                class_of.push((oi, 0));
            }
        }
        ModelKind::Exact => {
            for (oi, &o) in origins.iter().enumerate() {
                for k in 0..c {
                    classes.push(Class {
                        origin: o as usize,
                        count: 1,
                        images: vec![(0..n).collect()],
                        x: HashMap::new(),
                    });
                    class_of.push((oi, k));
                }
            }
        }
        ModelKind::Symmetric | ModelKind::SymmetricChunks => {
            // Representatives among the origins, each with the automorphisms to its orbit.
            let mut by_rep: BTreeMap<usize, Vec<Perm>> = BTreeMap::new();
            for &o in origins {
                let (rho, p) = &sym[o as usize];
                by_rep.entry(*rho).or_default().push(p.clone());
            }
            for (rho, images) in by_rep {
                let oi = origins.iter().position(|&o| o as usize == rho).unwrap_or(0);
                let per = if matches!(kind, ModelKind::Symmetric) {
                    1
                } else {
                    c
                };
                for k in 0..per {
                    classes.push(Class {
                        origin: rho,
                        count: c / per,
                        images: images.clone(),
                        x: HashMap::new(),
                    });
                    class_of.push((oi, k));
                }
            }
        }
    }
    (classes, class_of)
}

/// The model's variables: the rounds of every step (fixed by `split`) and every class's
/// sends per link and step where the link's source can hold the chunk by then (relaxed,
/// with the dive's choices fixed, in a dive's LP).
fn send_variables(
    vars: &mut ProblemVariables,
    links: &LinkMatrix,
    classes: &mut [Class],
    inst: Instance,
    split: Option<&[u32]>,
    dive: Option<&HashMap<(usize, usize, u32), bool>>,
) -> Vec<Variable> {
    let link_list = links.links();
    let steps = inst.steps;
    let max_r = inst.rounds.saturating_sub(steps) + 1;
    let r: Vec<Variable> = (0..steps as usize)
        .map(|s| {
            let (lo, hi) = split.map_or((1, max_r), |sp| (sp[s], sp[s]));
            vars.add(variable().integer().min(f64::from(lo)).max(f64::from(hi)))
        })
        .collect();
    for (ci, cl) in classes.iter_mut().enumerate() {
        let dist = links.distances(cl.origin);
        for (li, &(u, v)) in link_list.iter().enumerate() {
            if v == cl.origin {
                continue;
            }
            for s in 1..=steps {
                // u can hold the chunk only after dist(origin, u) steps.
                if dist[u] == u32::MAX || dist[u] > s - 1 {
                    continue;
                }
                let def = if let Some(fixed) = dive {
                    // The LP of a dive: binaries relaxed, the dive's choices fixed.
                    match fixed.get(&(ci, li, s)) {
                        Some(&on) => variable()
                            .min(f64::from(u8::from(on)))
                            .max(f64::from(u8::from(on))),
                        None => variable().min(0.0).max(f64::from(cl.count)),
                    }
                } else if cl.count == 1 {
                    variable().binary()
                } else {
                    variable().integer().min(0.0).max(f64::from(cl.count))
                };
                cl.x.insert((li, s), vars.add(def));
            }
        }
    }
    r
}

/// The total rounds, and per class: every rank but the origin receives each of its chunks,
/// a rank sends only what it received at an earlier step, and the chunks of one class come
/// in step-sum order (symmetry breaking). Also returns the links by their ends.
fn with_flow_rows<M: SolverModel>(
    mut model: M,
    links: &LinkMatrix,
    classes: &[Class],
    class_of: &[(usize, u32)],
    r: &[Variable],
    inst: Instance,
) -> (M, HashMap<(usize, usize), usize>) {
    let (n, link_list, steps) = (links.n, links.links(), inst.steps);
    let total_r: Expression = r.iter().copied().sum();
    model = model.with(constraint!(total_r == f64::from(inst.rounds)));
    // Index of links by endpoint.
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut out_of: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut link_index: HashMap<(usize, usize), usize> = HashMap::new();
    for (li, &(u, v)) in link_list.iter().enumerate() {
        into[v].push(li);
        out_of[u].push(li);
        link_index.insert((u, v), li);
    }
    for (ci, cl) in classes.iter().enumerate() {
        let get = |li: usize, s: u32| cl.x.get(&(li, s)).copied();
        for (v, ins) in into.iter().enumerate() {
            if v == cl.origin {
                continue;
            }
            let recv: Expression = ins
                .iter()
                .flat_map(|&li| (1..=steps).filter_map(move |s| get(li, s)))
                .sum();
            model = model.with(constraint!(recv == f64::from(cl.count)));
        }
        for u in 0..n {
            if u == cl.origin {
                continue;
            }
            for &lo in &out_of[u] {
                for s in 1..=steps {
                    let Some(send) = get(lo, s) else { continue };
                    let held: Expression = into[u]
                        .iter()
                        .flat_map(|&li| (1..s).filter_map(move |s2| get(li, s2)))
                        .sum();
                    model = model.with(constraint!(send <= held));
                }
            }
        }
        // Symmetry breaking: chunks of one class group in step-sum order.
        if ci > 0 && cl.count == 1 && class_of[ci - 1].0 == class_of[ci].0 {
            let prev = &classes[ci - 1];
            let t = |c: &Class| -> Expression {
                c.x.iter().map(|(&(_, s), &x)| f64::from(s) * x).sum()
            };
            let (a, b) = (t(prev), t(cl));
            model = model.with(constraint!(a <= b));
        }
    }
    (model, link_index)
}

/// Per link and step: every class's sends over it, under each of the class's images, within
/// the link's capacity times the step's rounds.
fn with_capacity_rows<M: SolverModel>(
    mut model: M,
    links: &LinkMatrix,
    classes: &[Class],
    link_index: &HashMap<(usize, usize), usize>,
    r: &[Variable],
    steps: u32,
) -> M {
    let link_list = links.links();
    for &(u, v) in &link_list {
        for s in 1..=steps {
            let mut load = Expression::from(0.0);
            let mut any = false;
            for cl in classes {
                for p in &cl.images {
                    // The image of the class's link (u', v') is (u, v): u' = p⁻¹(u).
                    let (Some(u0), Some(v0)) = (
                        p.iter().position(|&x| x == u),
                        p.iter().position(|&x| x == v),
                    ) else {
                        continue;
                    };
                    if let Some(&l0) = link_index.get(&(u0, v0))
                        && let Some(&x) = cl.x.get(&(l0, s))
                    {
                        load += x;
                        any = true;
                    }
                }
            }
            if any {
                let cap = f64::from(links.get(u, v));
                let rs = r[s as usize - 1];
                model = model.with(constraint!(load <= cap * rs));
            }
        }
    }
    model
}

/// The solved model: every send variable's value, the rounds, each class's aggregate sends
/// and, for single chunks, their transfers under every image (sorted).
fn read_solution(
    sol: &impl Solution,
    classes: &[Class],
    class_of: &[(usize, u32)],
    link_list: &[(usize, usize)],
    origins: &[u32],
    (r, c): (&[Variable], u32),
) -> ModelSolution {
    let rounds: Vec<u32> = r.iter().map(|&x| sol.value(x).round() as u32).collect();
    let mut transfers = Vec::new();
    let mut aggregates = Vec::new();
    let mut values = HashMap::new();
    for (ci, cl) in classes.iter().enumerate() {
        let (_, k) = class_of[ci];
        let mut counts = HashMap::new();
        for (&(li, s), &x) in &cl.x {
            values.insert((ci, li, s), sol.value(x));
            let val = sol.value(x).round();
            if val < 1.0 {
                continue;
            }
            counts.insert((li, s), val as u32);
            if cl.count > 1 {
                continue;
            }
            let (u, v) = link_list[li];
            for p in &cl.images {
                let o = p[cl.origin];
                let oi = origins.iter().position(|&x| x as usize == o).unwrap_or(0);
                transfers.push(Transfer {
                    step: s,
                    chunk: oi as u32 * c + k,
                    from: p[u] as u32,
                    to: p[v] as u32,
                });
            }
        }
        aggregates.push((cl.origin, cl.images.clone(), counts));
    }
    transfers.sort_unstable();
    ModelSolution {
        values,
        rounds,
        aggregates,
        transfers,
    }
}

/// The chunks of `origin` along sends that stay within `counts` (`(link, step) → chunks`,
/// an aggregate solution): per chunk `k`, its transfers `(k, from, to, step)`. `Ok(None)`:
/// proven impossible; `Err`: time limit.
#[allow(clippy::type_complexity)]
fn decompose(
    links: &LinkMatrix,
    origin: usize,
    inst: Instance,
    counts: &HashMap<(usize, u32), u32>,
    time_limit: f64,
) -> Result<Option<Vec<(u32, usize, usize, u32)>>, String> {
    if time_limit <= 0.0 {
        return Err("time limit".into());
    }
    let n = links.n;
    let link_list = links.links();
    let c = inst.chunks;
    let mut vars = ProblemVariables::new();
    let mut x: Vec<HashMap<(usize, u32), Variable>> = vec![HashMap::new(); c as usize];
    for xk in &mut x {
        for &(li, s) in counts.keys() {
            xk.insert((li, s), vars.add(variable().binary()));
        }
    }
    let mut model = vars
        .minimise(Expression::from(0.0))
        .using(crate::lp::solver)
        .with_time_limit(time_limit);
    for (k, xk) in x.iter().enumerate() {
        for v in 0..n {
            if v == origin {
                continue;
            }
            let recv: Expression = xk
                .iter()
                .filter(|((li, _), _)| link_list[*li].1 == v)
                .map(|(_, &var)| var)
                .sum();
            model = model.with(constraint!(recv == 1.0));
        }
        for (&(li, s), &send) in xk {
            let u = link_list[li].0;
            if u == origin {
                continue;
            }
            let held: Expression = xk
                .iter()
                .filter(|((l2, s2), _)| link_list[*l2].1 == u && *s2 < s)
                .map(|(_, &var)| var)
                .sum();
            model = model.with(constraint!(send <= held));
        }
        if k > 0 {
            let t = |m: &HashMap<(usize, u32), Variable>| -> Expression {
                m.iter().map(|(&(_, s), &v)| f64::from(s) * v).sum()
            };
            let (a, b) = (t(&x[k - 1]), t(xk));
            model = model.with(constraint!(a <= b));
        }
    }
    for (&(li, s), &cap) in counts {
        let load: Expression = x.iter().map(|xk| xk[&(li, s)]).sum();
        model = model.with(constraint!(load <= f64::from(cap)));
    }
    let sol = match model.solve() {
        Ok(sol) => sol,
        Err(ResolutionError::Infeasible) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut out = Vec::new();
    for (k, xk) in x.iter().enumerate() {
        for (&(li, s), &var) in xk {
            if sol.value(var) > 0.5 {
                let (u, v) = link_list[li];
                out.push((k as u32, u, v, s));
            }
        }
    }
    Ok(Some(out))
}

/// The chunks of `origin`, copied under `images`, within what `fixed` (`(u, v, step) →
/// chunks` of the other origins) leaves of every link's capacity in the rounds `split`: per
/// chunk `k` of `origin`, its transfers `(k, from, to, step)`. `Ok(None)`: proven impossible
/// given `fixed`; `Err`: time limit.
#[allow(clippy::type_complexity)]
fn decompose_residual(
    links: &LinkMatrix,
    origin: usize,
    images: &[Perm],
    inst: Instance,
    split: &[u32],
    fixed: &HashMap<(usize, usize, u32), u32>,
    time_limit: f64,
) -> Result<Option<Vec<(u32, usize, usize, u32)>>, String> {
    if time_limit <= 0.0 {
        return Err("time limit".into());
    }
    let n = links.n;
    let link_list = links.links();
    let link_index: HashMap<(usize, usize), usize> =
        link_list.iter().enumerate().map(|(i, &l)| (l, i)).collect();
    let dist = links.distances(origin);
    let c = inst.chunks;
    let mut vars = ProblemVariables::new();
    let mut x: Vec<HashMap<(usize, u32), Variable>> = vec![HashMap::new(); c as usize];
    for xk in &mut x {
        for (li, &(u, v)) in link_list.iter().enumerate() {
            for s in 1..=inst.steps {
                if v != origin && dist[u] != u32::MAX && dist[u] < s {
                    xk.insert((li, s), vars.add(variable().binary()));
                }
            }
        }
    }
    let mut model = vars
        .minimise(Expression::from(0.0))
        .using(crate::lp::solver)
        .with_time_limit(time_limit);
    for (k, xk) in x.iter().enumerate() {
        for v in 0..n {
            if v == origin {
                continue;
            }
            let recv: Expression = xk
                .iter()
                .filter(|((li, _), _)| link_list[*li].1 == v)
                .map(|(_, &var)| var)
                .sum();
            model = model.with(constraint!(recv == 1.0));
        }
        for (&(li, s), &send) in xk {
            let u = link_list[li].0;
            if u == origin {
                continue;
            }
            let held: Expression = xk
                .iter()
                .filter(|((l2, s2), _)| link_list[*l2].1 == u && *s2 < s)
                .map(|(_, &var)| var)
                .sum();
            model = model.with(constraint!(send <= held));
        }
        if k > 0 {
            let t = |m: &HashMap<(usize, u32), Variable>| -> Expression {
                m.iter().map(|(&(_, s), &v)| f64::from(s) * v).sum()
            };
            let (a, b) = (t(&x[k - 1]), t(xk));
            model = model.with(constraint!(a <= b));
        }
    }
    let inverses: Vec<Perm> = images
        .iter()
        .map(|p| {
            let mut inv = vec![0; n];
            for (i, &j) in p.iter().enumerate() {
                inv[j] = i;
            }
            inv
        })
        .collect();
    for &(u, v) in &link_list {
        for s in 1..=inst.steps {
            let mut load = Expression::from(0.0);
            let mut any = false;
            for inv in &inverses {
                if let Some(&l0) = link_index.get(&(inv[u], inv[v])) {
                    for xk in &x {
                        if let Some(&var) = xk.get(&(l0, s)) {
                            load += var;
                            any = true;
                        }
                    }
                }
            }
            let cap = i64::from(links.get(u, v) * split[s as usize - 1])
                - i64::from(fixed.get(&(u, v, s)).copied().unwrap_or(0));
            if cap < 0 {
                return Ok(None);
            }
            if any {
                model = model.with(constraint!(load <= cap as f64));
            }
        }
    }
    let sol = match model.solve() {
        Ok(sol) => sol,
        Err(ResolutionError::Infeasible) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut out = Vec::new();
    for (k, xk) in x.iter().enumerate() {
        for (&(li, s), &var) in xk {
            if sol.value(var) > 0.5 {
                let (u, v) = link_list[li];
                out.push((k as u32, u, v, s));
            }
        }
    }
    Ok(Some(out))
}

/// A diving heuristic over the symmetric per-chunk model with the rounds `split`: solve the
/// LP, fix the largest fractional send to 1 (to 0 when that makes the LP infeasible), until
/// the LP solution is integral; `earliest_first`: the fractional send of the earliest step
/// (then the largest). (Fixing every send the LP puts at 1 as well dives faster and dies on
/// DGX-1.) `Ok(Some)`: an algorithm (with
/// transfers); `Ok(None)` never (a dead end proves nothing); `Err`: dead end or time limit.
fn dive(
    links: &LinkMatrix,
    origins: &[u32],
    inst: Instance,
    sym: &[(usize, Perm)],
    split: &[u32],
    earliest_first: bool,
    time_limit: f64,
) -> Result<Option<ModelSolution>, String> {
    const EPS: f64 = 1e-6;
    let started = Instant::now();
    let mut fixed: HashMap<(usize, usize, u32), bool> = HashMap::new();
    let mut last: Option<(usize, usize, u32)> = None;
    loop {
        let left = time_limit - started.elapsed().as_secs_f64();
        if left <= 0.0 {
            return Err("time limit".into());
        }
        let kind = ModelKind::SymmetricChunks;
        let res = solve_model(
            links,
            origins,
            inst,
            &kind,
            sym,
            Some(split),
            Some(&fixed),
            left,
        )
        .map_err(|_| "time limit".to_string())?;
        match res {
            None => match last.take() {
                Some(key) if fixed.get(&key) == Some(&true) => {
                    fixed.insert(key, false);
                }
                _ => return Err("the dive reached a dead end".into()),
            },
            Some(m) => {
                let frac = m
                    .values
                    .iter()
                    .filter(|(key, v)| !fixed.contains_key(key) && **v > EPS && **v < 1.0 - EPS)
                    .max_by(|a, b| {
                        let by_step = if earliest_first {
                            b.0.2.cmp(&a.0.2)
                        } else {
                            std::cmp::Ordering::Equal
                        };
                        by_step.then(a.1.total_cmp(b.1)).then(b.0.cmp(a.0))
                    });
                let Some((&key, _)) = frac else {
                    return Ok(Some(m));
                };
                fixed.insert(key, true);
                last = Some(key);
            }
        }
    }
}

/// Every way of splitting `rounds` into `steps` positive parts.
pub fn compositions(rounds: u32, steps: u32) -> Vec<Vec<u32>> {
    if steps == 0 || rounds < steps {
        return Vec::new();
    }
    if steps == 1 {
        return vec![vec![rounds]];
    }
    let mut out = Vec::new();
    for first in 1..=rounds - (steps - 1) {
        for mut rest in compositions(rounds - first, steps - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

/// Solves one instance of the non-combining problem `origins` over `links` (see the module
/// docs): the relaxations, the dives, the decompositions and the exact model, all within
/// `time_limit` seconds together (each split gets an equal share of what is left).
pub fn solve_base(links: &LinkMatrix, origins: &[u32], inst: Instance, time_limit: f64) -> Solved {
    let started = Instant::now();
    let mut solved = Solved {
        instance: inst,
        stop: Stop::Pruned,
        seconds: 0.0,
        solves: Vec::new(),
        algorithm: None,
    };
    let pruned = inst.steps == 0
        || inst.chunks == 0
        || inst.rounds < inst.steps
        || least_steps(links, origins).is_none_or(|s| inst.steps < s)
        || cut_bound(links, origins).is_none_or(|b| inst.ratio().lt(b));
    if pruned {
        return solved;
    }
    let sym = automorphisms(links);
    let mut reps: Vec<usize> = origins.iter().map(|&o| sym[o as usize].0).collect();
    reps.sort_unstable();
    reps.dedup();
    let symmetric =
        reps.len() < origins.len() && reps.iter().all(|&rho| origins.contains(&(rho as u32)));
    // The relaxation over every rounds split at once (its infeasibility is a proof); then
    // split by split (`SplitSearch`); the exact model over every split last.
    let left = |started: Instant| time_limit - started.elapsed().as_secs_f64();
    let t0 = Instant::now();
    match solve_model(
        links,
        origins,
        inst,
        &ModelKind::Relaxation,
        &sym,
        None,
        None,
        time_limit,
    ) {
        Ok(None) => {
            record_solve(&mut solved, "relaxation", Stop::Infeasible, t0);
            solved.stop = Stop::Infeasible;
            solved.seconds = started.elapsed().as_secs_f64();
            return solved;
        }
        Ok(Some(_)) => record_solve(&mut solved, "relaxation", Stop::Feasible, t0),
        Err(_) => {
            record_solve(&mut solved, "relaxation", Stop::TimeLimit, t0);
            solved.stop = Stop::TimeLimit;
            solved.seconds = started.elapsed().as_secs_f64();
            return solved;
        }
    }
    let mut splits_left = false;
    let mut all_splits_refuted = true;
    let mut splits = compositions(inst.rounds, inst.steps);
    // Balanced splits first.
    splits.sort_by_key(|sp| (sp.iter().max().copied(), std::cmp::Reverse(sp.clone())));
    let nsplits = splits.len();
    for (si, split) in splits.into_iter().enumerate() {
        let share = left(started) / (nsplits - si) as f64;

        if left(started) <= 0.0 {
            splits_left = true;
            break;
        }
        let search = SplitSearch {
            links,
            origins,
            inst,
            sym: &sym,
            symmetric,
            started,
            time_limit,
        };
        match search.solve(&split, share, &mut solved) {
            SplitOutcome::Refuted => {}
            SplitOutcome::Open => all_splits_refuted = false,
            SplitOutcome::OutOfTime { refuted } => {
                all_splits_refuted &= refuted;
                splits_left = true;
                break;
            }
            SplitOutcome::Found(alg) => {
                solved.algorithm = Some(alg);
                solved.stop = Stop::Feasible;
                solved.seconds = started.elapsed().as_secs_f64();
                return solved;
            }
        }
    }
    if all_splits_refuted && !splits_left {
        solved.stop = Stop::Infeasible;
        solved.seconds = started.elapsed().as_secs_f64();
        return solved;
    }
    let t0 = Instant::now();
    solved.stop = Stop::TimeLimit;
    if left(started) > 0.0 {
        match solve_model(
            links,
            origins,
            inst,
            &ModelKind::Exact,
            &sym,
            None,
            None,
            left(started),
        ) {
            Ok(None) => {
                record_solve(&mut solved, "exact", Stop::Infeasible, t0);
                solved.stop = Stop::Infeasible;
            }
            Ok(Some(m)) => {
                record_solve(&mut solved, "exact", Stop::Feasible, t0);
                solved.algorithm = Some(Algorithm {
                    collective: Collective::AllGather,
                    nranks: links.n as u32,
                    instance: inst,
                    rounds_per_step: m.rounds,
                    origins: origins.to_vec(),
                    transfers: m.transfers,
                });
                solved.stop = Stop::Feasible;
            }
            Err(_) => record_solve(&mut solved, "exact", Stop::TimeLimit, t0),
        }
    }
    solved.seconds = started.elapsed().as_secs_f64();
    solved
}

/// Records one solve of `solved`'s search: its name, how it ended, its time since `t0`.
fn record_solve(solved: &mut Solved, name: &'static str, stop: Stop, t0: Instant) {
    solved.solves.push((name, stop, t0.elapsed().as_secs_f64()));
}

/// How one rounds split of [`solve_base`] ended.
enum SplitOutcome {
    /// Its relaxation is infeasible: a proof that no algorithm uses this split.
    Refuted,
    /// Its relaxation is feasible, but no algorithm was found for it.
    Open,
    /// Time ran out; `refuted`: before its relaxation was solved.
    OutOfTime { refuted: bool },
    /// An algorithm (checked when from a dive).
    Found(Algorithm),
}

/// One instance of [`solve_base`] searched split by split: for a split, the relaxation (a
/// proof for the split), a dive, the aggregate over the representatives (symmetric) or every
/// origin, and its decomposition into chunks, origin by origin.
struct SplitSearch<'a> {
    links: &'a LinkMatrix,
    origins: &'a [u32],
    inst: Instance,
    sym: &'a [(usize, Perm)],
    symmetric: bool,
    /// When the instance's search started, and its time limit (s).
    started: Instant,
    time_limit: f64,
}

impl SplitSearch<'_> {
    fn left(&self) -> f64 {
        self.time_limit - self.started.elapsed().as_secs_f64()
    }

    /// Searches `split`, the decomposition within `share` seconds; records every solve.
    fn solve(&self, split: &[u32], share: f64, solved: &mut Solved) -> SplitOutcome {
        let (links, origins, inst, sym) = (self.links, self.origins, self.inst, self.sym);
        let t0 = Instant::now();
        match solve_model(
            links,
            origins,
            inst,
            &ModelKind::Relaxation,
            sym,
            Some(split),
            None,
            self.left(),
        ) {
            Ok(None) => {
                record_solve(solved, "relaxation", Stop::Infeasible, t0);
                return SplitOutcome::Refuted;
            }
            Ok(Some(_)) => record_solve(solved, "relaxation", Stop::Feasible, t0),
            Err(_) => {
                record_solve(solved, "relaxation", Stop::TimeLimit, t0);
                return SplitOutcome::OutOfTime { refuted: true };
            }
        }
        if let Some(alg) = self.dive(split, solved) {
            return SplitOutcome::Found(alg);
        }
        let name = if self.symmetric {
            "symmetric"
        } else {
            "aggregate"
        };
        let agg_kind = if self.symmetric {
            ModelKind::Symmetric
        } else {
            ModelKind::Relaxation
        };
        let t0 = Instant::now();
        let share = share.min(self.left());
        let split_left = || share - t0.elapsed().as_secs_f64();
        let agg = match solve_model(
            links,
            origins,
            inst,
            &agg_kind,
            sym,
            Some(split),
            None,
            split_left(),
        ) {
            Ok(Some(m)) => m,
            Ok(None) => {
                record_solve(solved, name, Stop::Infeasible, t0);
                return SplitOutcome::Open;
            }
            Err(_) => {
                record_solve(solved, name, Stop::TimeLimit, t0);
                return SplitOutcome::OutOfTime { refuted: false };
            }
        };
        record_solve(solved, name, Stop::Feasible, t0);
        let t0 = Instant::now();
        match self.decompose_aggregate(split, &agg, &split_left) {
            Err(()) => {
                record_solve(solved, "decompose", Stop::TimeLimit, t0);
                SplitOutcome::OutOfTime { refuted: false }
            }
            Ok(None) => {
                record_solve(solved, "decompose", Stop::Infeasible, t0);
                SplitOutcome::Open
            }
            Ok(Some(transfers)) => {
                record_solve(solved, "decompose", Stop::Feasible, t0);
                SplitOutcome::Found(Algorithm {
                    collective: Collective::AllGather,
                    nranks: links.n as u32,
                    instance: inst,
                    rounds_per_step: agg.rounds,
                    origins: origins.to_vec(),
                    transfers,
                })
            }
        }
    }

    /// The dive of `split`: an algorithm when it reaches an integral point that checks.
    /// Largest fractional send first; when that dies, earliest step first. A dive ends by
    /// itself (one LP per fixed send), so it may take all the time left; the split's share
    /// bounds only the decomposition after it.
    fn dive(&self, split: &[u32], solved: &mut Solved) -> Option<Algorithm> {
        let (links, origins, inst, sym) = (self.links, self.origins, self.inst, self.sym);
        let t0 = Instant::now();
        let mut dived = dive(links, origins, inst, sym, split, false, self.left());
        if matches!(&dived, Err(e) if e != "time limit") {
            dived = dive(links, origins, inst, sym, split, true, self.left());
        }
        let dead_end = matches!(&dived, Err(e) if e != "time limit");
        if let Ok(Some(m)) = dived {
            let alg = Algorithm {
                collective: Collective::AllGather,
                nranks: links.n as u32,
                instance: inst,
                rounds_per_step: m.rounds,
                origins: origins.to_vec(),
                transfers: m.transfers,
            };
            if alg.check(links).is_ok() {
                record_solve(solved, "dive", Stop::Feasible, t0);
                return Some(alg);
            }
        }
        record_solve(
            solved,
            "dive",
            if dead_end {
                Stop::DeadEnd
            } else {
                Stop::TimeLimit
            },
            t0,
        );
        None
    }

    /// The aggregate solution `agg` of `split` decomposed into chunks, origin by origin:
    /// first within the aggregate's own sends; else anywhere the others leave room (the
    /// decomposed origins as they are, the rest as aggregated). The transfers (sorted);
    /// `Ok(None)`: an origin does not decompose; `Err`: time limit.
    fn decompose_aggregate(
        &self,
        split: &[u32],
        agg: &ModelSolution,
        split_left: &dyn Fn() -> f64,
    ) -> Result<Option<Vec<Transfer>>, ()> {
        let (links, origins, inst) = (self.links, self.origins, self.inst);
        let mut transfers = Vec::new();
        // Loads of every class's aggregate on the physical links.
        let link_list = links.links();
        let loads: Vec<HashMap<(usize, usize, u32), u32>> = agg
            .aggregates
            .iter()
            .map(|(_, images, counts)| {
                let mut m = HashMap::new();
                for (&(li, s), &k) in counts {
                    let (u, v) = link_list[li];
                    for p in images {
                        *m.entry((p[u], p[v], s)).or_insert(0) += k;
                    }
                }
                m
            })
            .collect();
        let mut done: HashMap<(usize, usize, u32), u32> = HashMap::new();
        for (ai, (origin, images, counts)) in agg.aggregates.iter().enumerate() {
            let mut found =
                decompose(links, *origin, inst, counts, split_left()).map_err(|_| ())?;
            if found.is_none() {
                let mut fixed = done.clone();
                for load in loads.iter().skip(ai + 1) {
                    for (&key, &k) in load {
                        *fixed.entry(key).or_insert(0) += k;
                    }
                }
                found =
                    decompose_residual(links, *origin, images, inst, split, &fixed, split_left())
                        .map_err(|_| ())?;
            }
            let Some(chunks) = found else {
                return Ok(None);
            };
            for p in images {
                let o = p[*origin];
                let oi = origins.iter().position(|&x| x as usize == o).unwrap_or(0);
                for &(k, u, v, step) in &chunks {
                    *done.entry((p[u], p[v], step)).or_insert(0) += 1;
                    transfers.push(Transfer {
                        step,
                        chunk: oi as u32 * inst.chunks + k,
                        from: p[u] as u32,
                        to: p[v] as u32,
                    });
                }
            }
        }
        transfers.sort_unstable();
        Ok(Some(transfers))
    }
}

/// Solves one instance of `collective` over `links` (combining collectives as their duals,
/// reversed). The algorithm, when found, has passed [`Algorithm::check`].
pub fn solve_instance(
    links: &LinkMatrix,
    collective: Collective,
    inst: Instance,
    time_limit: f64,
) -> Result<Solved, SynthError> {
    let n = links.n as u32;
    let (origins, dual) = base_of(collective, n)?;
    let base_links = if dual {
        links.transposed()
    } else {
        links.clone()
    };
    let mut solved = solve_base(&base_links, &origins, inst, time_limit);
    if let Some(alg) = solved.algorithm.take() {
        let alg = if dual {
            alg.reversed(collective)
        } else {
            Algorithm { collective, ..alg }
        };
        alg.check(links).map_err(|e| {
            SynthError::Solver(format!("the solver's algorithm breaks the model: {e}"))
        })?;
        solved.algorithm = Some(alg);
    }
    Ok(solved)
}

/// Limits of a frontier search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParetoOptions {
    pub max_steps: u32,
    pub max_chunks: u32,
    /// Seconds per instance (all its solves together).
    pub time_limit: f64,
}

impl Default for ParetoOptions {
    fn default() -> Self {
        ParetoOptions {
            max_steps: 4,
            max_chunks: 8,
            time_limit: 10.0,
        }
    }
}

/// One point of the frontier.
#[derive(Debug, Clone)]
pub struct ParetoPoint {
    pub algorithm: Algorithm,
    /// Whether every instance of lower `R/C` at this step count was proven infeasible (else
    /// some ran out of time and a better one may exist).
    pub proven: bool,
    /// Solver time of the instance that found it (seconds).
    pub seconds: f64,
}

impl ParetoPoint {
    pub fn instance(&self) -> Instance {
        self.algorithm.instance
    }
}

/// The frontier and every instance tried.
#[derive(Debug, Clone)]
pub struct Frontier {
    pub collective: Collective,
    pub links: LinkMatrix,
    pub bound: Ratio,
    pub least_steps: u32,
    pub points: Vec<ParetoPoint>,
    pub tried: Vec<Solved>,
    /// Whether the last point meets the bound (no more steps can help).
    pub at_bound: bool,
    /// Wall time of the whole search (seconds).
    pub seconds: f64,
}

/// The Pareto frontier over (steps, rounds per chunk) of `collective` on `links` (see the
/// module docs).
pub fn pareto(
    links: &LinkMatrix,
    collective: Collective,
    opts: ParetoOptions,
) -> Result<Frontier, SynthError> {
    let started = Instant::now();
    let n = links.n as u32;
    if !(2..=MAX_RANKS).contains(&n) {
        return Err(SynthError::Instance(format!(
            "{n} ranks: the MILP synthesizer takes 2 to {MAX_RANKS}"
        )));
    }
    if opts.max_steps == 0 || opts.max_steps > MAX_STEPS {
        return Err(SynthError::Instance(format!(
            "max steps {}: expected 1 to {MAX_STEPS}",
            opts.max_steps
        )));
    }
    if opts.max_chunks == 0 || opts.max_chunks > MAX_CHUNKS {
        return Err(SynthError::Instance(format!(
            "max chunks {}: expected 1 to {MAX_CHUNKS}",
            opts.max_chunks
        )));
    }
    if !(opts.time_limit.is_finite() && opts.time_limit > 0.0) {
        return Err(SynthError::Instance(format!(
            "time limit {}: expected a positive number of seconds",
            opts.time_limit
        )));
    }
    let (origins, dual) = base_of(collective, n)?;
    let base = if dual {
        links.transposed()
    } else {
        links.clone()
    };
    let bound = bandwidth_bound(links, collective)?;
    let least = least_steps(&base, &origins).ok_or_else(|| {
        SynthError::Instance("some rank cannot be reached over the direct links".into())
    })?;
    let mut frontier = Frontier {
        collective,
        links: links.clone(),
        bound,
        least_steps: least,
        points: Vec::new(),
        tried: Vec::new(),
        at_bound: false,
        seconds: 0.0,
    };
    let mut best: Option<Ratio> = None;
    for steps in least.max(1)..=opts.max_steps {
        let mut cands: Vec<Instance> = Vec::new();
        for chunks in 1..=opts.max_chunks {
            for rounds in steps..=MAX_ROUNDS {
                let inst = Instance {
                    steps,
                    rounds,
                    chunks,
                };
                let q = inst.ratio();
                if q.lt(bound) {
                    continue;
                }
                if best.is_some_and(|b| !q.lt(b)) {
                    break;
                }
                cands.push(inst);
            }
        }
        cands.sort_by(|a, b| {
            let (qa, qb) = (a.ratio(), b.ratio());
            (u128::from(qa.num) * u128::from(qb.den))
                .cmp(&(u128::from(qb.num) * u128::from(qa.den)))
                .then(a.chunks.cmp(&b.chunks))
        });
        let mut proven = true;
        for inst in cands {
            let solved = solve_instance(links, collective, inst, opts.time_limit)?;
            let stop = solved.stop;
            let alg = solved.algorithm.clone();
            let seconds = solved.seconds;
            frontier.tried.push(solved);
            match (stop, alg) {
                (Stop::Feasible, Some(algorithm)) => {
                    best = Some(inst.ratio());
                    frontier.points.push(ParetoPoint {
                        algorithm,
                        proven,
                        seconds,
                    });
                    break;
                }
                (Stop::TimeLimit, _) => proven = false,
                _ => {}
            }
        }
        if best.is_some_and(|b| !bound.lt(b)) {
            frontier.at_bound = true;
            break;
        }
    }
    frontier.seconds = started.elapsed().as_secs_f64();
    Ok(frontier)
}

/// The frontier of `collective` on `topo`'s direct links ([`pareto`]), every point lowered
/// ([`lower`]) and verified, as candidates named `milp_s<S>_r<R>_c<C>` (out of place).
pub fn candidates(
    topo: &Topology,
    collective: Collective,
    opts: ParetoOptions,
) -> Result<Vec<Candidate>, SynthError> {
    let links = LinkMatrix::from_topology(topo)?;
    let frontier = pareto(&links, collective, opts)?;
    let mut out = Vec::new();
    for p in &frontier.points {
        let i = p.instance();
        let name = format!("milp_s{}_r{}_c{}", i.steps, i.rounds, i.chunks);
        let cand = lower(&name, &p.algorithm)
            .ok_or_else(|| SynthError::Instance(format!("{name} cannot be lowered")))?;
        if let Err(errors) = hccl_ir::verify::verify(&cand.schedule) {
            return Err(SynthError::Solver(format!(
                "{name} does not verify: {}",
                errors[0]
            )));
        }
        out.push(cand.synthesized(record(p, &frontier)));
    }
    Ok(out)
}

/// What a plan entry records of a frontier point: its rounds per chunk against the least
/// the solver proved possible in as many steps (the bandwidth bound when some lower ratio
/// ran out of time).
pub fn record(point: &ParetoPoint, frontier: &Frontier) -> Synthesis {
    let i = point.instance();
    let value = Ratio::new(u64::from(i.rounds), u64::from(i.chunks)).value();
    Synthesis {
        method: "milp-steps-rounds".into(),
        objective: format!(
            "least rounds per chunk in {} steps ({} rounds, {} chunks per rank; SCCL's model \
             over direct links)",
            i.steps, i.rounds, i.chunks
        ),
        value,
        optimum: if point.proven {
            value
        } else {
            frontier.bound.value()
        },
        unit: "rounds per chunk".into(),
        proven: point.proven,
    }
}

/// The chunk schedule of `alg` (see the module docs), as a [`Candidate`] named `name`
/// (channels 1, pipeline = chunks per origin); out of place. `None` when it cannot be built.
pub fn lower(name: &str, alg: &Algorithm) -> Option<Candidate> {
    let n = alg.nranks;
    let c = alg.instance.chunks;
    let params = FamilyParams {
        channels: 1,
        pipeline: c,
    };
    match alg.collective {
        Collective::AllGather | Collective::Broadcast { .. } => {
            let all_gather = alg.collective == Collective::AllGather;
            let chunks = if all_gather { n * c } else { c };
            let mut b = ScheduleBuilder::new(alg.collective, n, chunks, false);
            // No receive-and-forward fusion: a fused op joins two connections on one
            // stream, and a rank forwarding a chunk to several peers would give one stream
            // several send peers, which MSCCL's thread blocks cannot express.
            b.set_fusion(false);
            for &o in &alg.origins {
                let dst = if all_gather { o * c } else { 0 };
                b.copy((o, Loc::input(0)), (o, Loc::output(dst)), c, 0);
            }
            // Group by (step, from, to), runs of consecutive chunks with one source buffer.
            let mut groups: BTreeMap<(u32, u32, u32), Vec<u32>> = BTreeMap::new();
            for t in &alg.transfers {
                groups
                    .entry((t.step, t.from, t.to))
                    .or_default()
                    .push(t.chunk);
            }
            for ((_, from, to), mut chunks) in groups {
                chunks.sort_unstable();
                let origin_of = |ch: u32| alg.origins[(ch / c) as usize];
                let src_of = |ch: u32| {
                    if origin_of(ch) == from {
                        Loc::input(ch % c)
                    } else {
                        Loc::output(if all_gather { ch } else { ch % c })
                    }
                };
                let dst_of = |ch: u32| Loc::output(if all_gather { ch } else { ch % c });
                let mut i = 0;
                while i < chunks.len() {
                    let mut j = i + 1;
                    let own = origin_of(chunks[i]) == from;
                    while j < chunks.len()
                        && chunks[j] == chunks[j - 1] + 1
                        && chunks[j] / c == chunks[i] / c
                        && (origin_of(chunks[j]) == from) == own
                    {
                        j += 1;
                    }
                    let count = (j - i) as u32;
                    b.copy((from, src_of(chunks[i])), (to, dst_of(chunks[i])), count, 0);
                    i = j;
                }
            }
            candidate(name, params, b).into_iter().next()
        }
        Collective::ReduceScatter | Collective::Reduce { .. } => {
            let scatter = alg.collective == Collective::ReduceScatter;
            let chunks = if scatter { n * c } else { c };
            let mut b = ScheduleBuilder::new(alg.collective, n, chunks, false);
            // No receive-and-forward fusion: a fused op joins two connections on one
            // stream, and a rank forwarding a chunk to several peers would give one stream
            // several send peers, which MSCCL's thread blocks cannot express.
            b.set_fusion(false);
            // Every rank's partial sum of every chunk: None until it receives one.
            let mut partial: HashMap<(u32, u32), Loc> = HashMap::new();
            // Children still to come, to know the last receive (the root's goes to output).
            for t in &alg.transfers {
                let ch = t.chunk;
                let origin = alg.origins[(ch / c) as usize];
                let input = Loc::input(if scatter { ch } else { ch % c });
                // Sender: its partial sum, or its own input when it received nothing.
                let src = partial.get(&(t.from, ch)).copied().unwrap_or(input);
                let recv_src = partial.get(&(t.to, ch)).copied().unwrap_or(input);
                let dst = match partial.get(&(t.to, ch)) {
                    Some(&l) => l,
                    None if t.to == origin => Loc::output(ch % c),
                    None => b.scratch(t.to, 1),
                };
                b.send(t.from, t.to, src, 1, 0);
                b.recv_reduce_copy(t.to, t.from, recv_src, dst, 1, 0);
                partial.insert((t.to, ch), dst);
            }
            // An origin that received nothing (a single rank) copies its input.
            for (oi, &o) in alg.origins.iter().enumerate() {
                for k in 0..c {
                    let ch = oi as u32 * c + k;
                    if !partial.contains_key(&(o, ch)) {
                        let input = Loc::input(if scatter { ch } else { k });
                        b.copy((o, input), (o, Loc::output(k)), 1, 0);
                    }
                }
            }
            candidate(name, params, b).into_iter().next()
        }
        _ => None,
    }
}

/// AllReduce as the ReduceScatter `rs` followed by the AllGather `ag` (both over every rank,
/// with the same chunks per rank), as one out-of-place schedule named `name`: chunk `ch` is
/// reduced into its owner's output slot `ch` by `rs`'s transfers, then sent on from there by
/// `ag`'s. `None` when the two do not fit together or the schedule cannot be built.
pub fn lower_allreduce(name: &str, rs: &Algorithm, ag: &Algorithm) -> Option<Candidate> {
    let n = rs.nranks;
    let c = rs.instance.chunks;
    if rs.collective != Collective::ReduceScatter
        || ag.collective != Collective::AllGather
        || ag.nranks != n
        || ag.instance.chunks != c
        || rs.origins != ag.origins
    {
        return None;
    }
    let params = FamilyParams {
        channels: 1,
        pipeline: c,
    };
    let mut b = ScheduleBuilder::new(Collective::AllReduce, n, n * c, false);
    b.set_fusion(false);
    let mut partial: HashMap<(u32, u32), Loc> = HashMap::new();
    for t in &rs.transfers {
        let ch = t.chunk;
        let origin = rs.origins[(ch / c) as usize];
        let input = Loc::input(ch);
        let src = partial.get(&(t.from, ch)).copied().unwrap_or(input);
        let recv_src = partial.get(&(t.to, ch)).copied().unwrap_or(input);
        let dst = match partial.get(&(t.to, ch)) {
            Some(&l) => l,
            None if t.to == origin => Loc::output(ch),
            None => b.scratch(t.to, 1),
        };
        b.send(t.from, t.to, src, 1, 0);
        b.recv_reduce_copy(t.to, t.from, recv_src, dst, 1, 0);
        partial.insert((t.to, ch), dst);
    }
    for (oi, &o) in rs.origins.iter().enumerate() {
        for k in 0..c {
            let ch = oi as u32 * c + k;
            if !partial.contains_key(&(o, ch)) {
                b.copy((o, Loc::input(ch)), (o, Loc::output(ch)), 1, 0);
            }
        }
    }
    for t in &ag.transfers {
        b.copy(
            (t.from, Loc::output(t.chunk)),
            (t.to, Loc::output(t.chunk)),
            1,
            0,
        );
    }
    candidate(name, params, b).into_iter().next()
}

/// The frontier of `collective` on `topo` for a search, computed once per process per
/// topology hash and collective (`None` when the topology has no direct links or the search
/// fails).
fn search_frontier(topo: &Topology, collective: Collective) -> Option<std::sync::Arc<Frontier>> {
    static FRONTIERS: super::Memo<(String, String), Option<std::sync::Arc<Frontier>>> =
        super::Memo::new();
    FRONTIERS.get((topo.hash.clone(), collective.to_string()), || {
        let opts = ParetoOptions {
            max_steps: SEARCH_MAX_STEPS,
            max_chunks: SEARCH_MAX_CHUNKS,
            time_limit: SEARCH_TIME_LIMIT,
        };
        let links = LinkMatrix::from_topology(topo).ok()?;
        pareto(&links, collective, opts)
            .ok()
            .map(std::sync::Arc::new)
    })
}

/// Frontier points of `collective` on `topo` as verified candidates, all named `milp` (the
/// point is in their [`Synthesis`] record): AllGather and ReduceScatter from their own
/// frontiers, AllReduce as each AllGather point's dual ReduceScatter followed by the point.
fn frontier_candidates(topo: &Topology, collective: Collective) -> Vec<Candidate> {
    let solved = match collective {
        Collective::AllReduce => Collective::AllGather,
        c => c,
    };
    let Some(frontier) = search_frontier(topo, solved) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in &frontier.points {
        let cand = if collective == Collective::AllReduce {
            let rs = p.algorithm.reversed(Collective::ReduceScatter);
            lower_allreduce("milp", &rs, &p.algorithm)
        } else {
            lower("milp", &p.algorithm)
        };
        let Some(cand) = cand else { continue };
        if hccl_ir::verify::verify(&cand.schedule).is_ok() {
            let mut record = record(p, &frontier);
            if collective == Collective::AllReduce {
                record.objective = format!(
                    "ReduceScatter then AllGather, each the {}",
                    record.objective
                );
            }
            out.push(cand.synthesized(record));
        }
    }
    out
}

/// Steps a frontier search inside a compile goes up to.
const SEARCH_MAX_STEPS: u32 = 3;
/// Chunks per rank a frontier search inside a compile goes up to.
const SEARCH_MAX_CHUNKS: u32 = 6;
/// Seconds per instance of a frontier search inside a compile.
const SEARCH_TIME_LIMIT: f64 = 5.0;
/// Largest rank count the search runs the frontier for.
pub const SEARCH_MAX_RANKS: u32 = 8;

/// The latency-optimal frontier as a family (`--synth full` only): AllGather, ReduceScatter
/// and AllReduce (as ReduceScatter + AllGather) in SCCL's model, up to
/// [`SEARCH_MAX_RANKS`] ranks with direct links.
#[derive(Debug, Clone, Copy, Default)]
pub struct MilpFrontier;

impl crate::families::Family for MilpFrontier {
    fn name(&self) -> &'static str {
        "milp"
    }

    fn supports(&self, kind: hccl_ir::CollectiveKind) -> bool {
        use hccl_ir::CollectiveKind as K;
        matches!(kind, K::AllGather | K::ReduceScatter | K::AllReduce)
    }

    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if !(2..=SEARCH_MAX_RANKS).contains(&topo.nranks()) || !self.supports(collective.kind()) {
            return Vec::new();
        }
        vec![FamilyParams {
            channels: 1,
            pipeline: 1,
        }]
    }

    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        _params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if in_place || !(2..=SEARCH_MAX_RANKS).contains(&topo.nranks()) {
            return Vec::new();
        }
        frontier_candidates(topo, collective)
    }
}
