//! AllToAll from the multi-commodity flow LP: the schedule that realises the flow bound of
//! [`crate::cost::mcf`].
//!
//! 1. **Flows.** The bound's LP ([`mcf::alltoall_rate`]) gives the largest rate `λ*` every
//!    ordered pair of ranks can be given at once over the simulator's routes (a rank-pair
//!    edge `a → b` occupies every resource of route `a → b`), with flows aggregated by
//!    source. A second LP fixes every pair's rate at `λ*` (less a hair, for the solver) and
//!    minimises the total load (flow × resources of its route): of the optimal flows, the one
//!    with the shortest detours, and one without cycles.
//! 2. **Paths.** Each source's flow is split into paths by the standard decomposition of a
//!    single-source flow: walk from the source along the largest remaining edge until a rank
//!    still owed data; the path carries the least of its edges' flow and that rank's need.
//!    Every destination then gets exactly its `λ` over its paths ([`solve`]).
//! 3. **Pruning.** The decomposition can hold many thin paths per pair; every path is a
//!    pipeline of the schedule, so [`prune`] keeps the few widest of each pair and weighs
//!    them again with a path LP (maximise the rate every pair gets over its kept paths).
//! 4. **Lowering** ([`lower`]). Each pair's block is shared among its paths in proportion to
//!    their rates ([`piece_widths`]) and each path's share cut into `pieces` pieces. A piece
//!    goes from the source's input through the path's intermediate ranks (received into
//!    scratch and forwarded) to the destination's output. Paths get channels so that no two
//!    on one channel meet at a connection end ([`channels`]): on every rank each path's
//!    connections are streams of their own, so independent flows never serialise and each
//!    path is a plain pipeline (no cycle of waits). In-place schedules land what they
//!    receive in scratch and copy it to the output at the end (the output is the input).
//!
//! [`FlowAllToAll`] offers the lowered schedules to the search like any family.

use super::{SynthError, piece_widths};
use crate::builder::ScheduleBuilder;
use crate::cost::{Network, mcf};
use crate::families::common::{candidate, single_rank};
use crate::families::{Candidate, Family, FamilyParams};
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, constraint, variable,
};
use hccl_ir::{Collective, CollectiveKind, Loc, Rank, Synthesis};
use hccl_topologies::Topology;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Largest rank count the flow AllToAll is synthesized for inside a search (the LP has
/// `n²(n-1)` variables, within [`mcf::MAX_VARIABLES`], and the schedule `n²` pipelines).
pub const A2A_MAX_RANKS: u32 = 16;
/// Most paths per rank pair a pruned flow keeps (each is a pipeline of the schedule).
pub const MAX_PATHS: usize = 4;
/// Paths carrying less than this share of their pair's rate are dropped before re-weighing.
const MIN_SHARE: f64 = 0.03;
/// Chunk units a pair's block is cut into per piece: a path's piece spans its share of them
/// ([`piece_widths`] of the paths' rates), so a block is `pieces × RESOLUTION` chunks.
pub const RESOLUTION: u32 = 128;
/// Pieces per path the family compiles with (deeper pipelines for larger sizes; one, each
/// path's share of a block whole, for the sizes just above the mesh's: on DGX-1 it takes
/// 512 KiB from the mesh, 1.74x faster).
const PIPELINES: [u32; 5] = [1, 2, 8, 32, 128];
/// Path limits per pair the family compiles with.
const PATH_LIMITS: [u32; 2] = [MAX_PATHS as u32, 2];
/// Average piece size below which a schedule is not costed (see [`Candidate::min_bytes`]).
const MIN_PIECE_BYTES: u64 = 16 << 10;
/// Relative slack on `λ*` in the least-load LP (keeps it feasible despite rounding).
const RATE_SLACK: f64 = 1e-6;

/// One path of a pair's flow.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowPath {
    /// The ranks it visits, source first, destination last (at least two, all distinct).
    pub ranks: Vec<Rank>,
    /// Rate (GB/s).
    pub rate: f64,
}

impl FlowPath {
    /// Source rank.
    pub fn src(&self) -> Rank {
        self.ranks[0]
    }

    /// Destination rank.
    pub fn dst(&self) -> Rank {
        self.ranks[self.ranks.len() - 1]
    }

    /// Rank-pair hops.
    pub fn hops(&self) -> usize {
        self.ranks.len() - 1
    }
}

/// A path decomposition of an AllToAll flow.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub nranks: u32,
    /// Paths, ordered by pair `(src, dst)`, widest first within a pair.
    pub paths: Vec<FlowPath>,
    /// The rate every pair gets over its paths (GB/s): each pair's paths sum to it.
    pub rate: f64,
    /// The flow LP's optimum `λ*` (GB/s), the bound's rate.
    pub lp_rate: f64,
}

impl Flow {
    /// The paths of pair `src → dst`.
    pub fn paths_of(&self, src: Rank, dst: Rank) -> impl Iterator<Item = &FlowPath> {
        self.paths
            .iter()
            .filter(move |p| p.src() == src && p.dst() == dst)
    }

    /// Most paths any pair has.
    pub fn max_paths_per_pair(&self) -> usize {
        let mut count: HashMap<(Rank, Rank), usize> = HashMap::new();
        for p in &self.paths {
            *count.entry((p.src(), p.dst())).or_default() += 1;
        }
        count.values().copied().max().unwrap_or(0)
    }

    /// Load (GB/s) the paths put on every resource of `net`, with route multiplicity.
    pub fn load(&self, net: &Network) -> Result<Vec<f64>, SynthError> {
        let routes = Routes::new(net)?;
        let mut load = vec![0.0; net.capacity.len()];
        for p in &self.paths {
            for w in p.ranks.windows(2) {
                for &r in routes.of(w[0], w[1]) {
                    load[r as usize] += p.rate;
                }
            }
        }
        Ok(load)
    }
}

/// The route's resources of every ordered rank pair.
struct Routes {
    n: usize,
    res: Vec<Vec<u32>>,
}

impl Routes {
    fn new(net: &Network) -> Result<Routes, SynthError> {
        let n = net.nranks() as usize;
        let pairs = all_pairs(n);
        let routes = net
            .routes(&pairs)
            .map_err(|e| SynthError::Instance(e.to_string()))?;
        let mut res = vec![Vec::new(); n * n];
        for (&(a, b), r) in pairs.iter().zip(&routes) {
            res[a as usize * n + b as usize] = r.resources.clone();
        }
        Ok(Routes { n, res })
    }

    fn of(&self, a: Rank, b: Rank) -> &[u32] {
        &self.res[a as usize * self.n + b as usize]
    }
}

fn all_pairs(n: usize) -> Vec<(u32, u32)> {
    (0..n as u32)
        .flat_map(|a| (0..n as u32).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect()
}

/// The flow LP's optimum as least-load flows, decomposed into paths (see the module docs):
/// every pair's paths sum to `λ*(1 - 10⁻⁶)` up to the solver's rounding.
pub fn solve(net: &Network) -> Result<Flow, SynthError> {
    let n = net.nranks() as usize;
    if n < 2 {
        return Err(SynthError::Instance(
            "a single rank has nothing to send".into(),
        ));
    }
    if n * n * (n - 1) > mcf::MAX_VARIABLES {
        return Err(SynthError::Instance(format!(
            "{n} ranks: the flow LP is beyond {} variables",
            mcf::MAX_VARIABLES
        )));
    }
    let lp_rate = mcf::alltoall_rate(net)
        .ok_or_else(|| SynthError::Solver("the flow LP has no positive optimum".into()))?;
    let routes = Routes::new(net)?;
    let pairs = all_pairs(n);
    let lambda = lp_rate * (1.0 - RATE_SLACK);
    let mut vars = ProblemVariables::new();
    let flow: Vec<Vec<Variable>> = (0..n)
        .map(|_| {
            pairs
                .iter()
                .map(|_| vars.add(variable().min(0.0)))
                .collect()
        })
        .collect();
    // Load: every unit on edge a → b occupies each resource of its route.
    let mut objective = Expression::from(0.0);
    for f in &flow {
        for (p, &(a, b)) in pairs.iter().enumerate() {
            objective += routes.of(a, b).len().max(1) as f64 * f[p];
        }
    }
    let model = vars.minimise(objective).using(crate::lp::solver);
    let model = mcf::with_flow_rows(
        model,
        net,
        &pairs,
        |p| routes.of(pairs[p].0, pairs[p].1),
        &flow,
        lambda,
    );
    let solution = model
        .solve()
        .map_err(|e| SynthError::Solver(e.to_string()))?;
    let mut paths = Vec::new();
    for (s, f) in flow.iter().enumerate() {
        let mut edge = vec![0.0; n * n];
        for (p, &(a, b)) in pairs.iter().enumerate() {
            edge[a as usize * n + b as usize] = solution.value(f[p]).max(0.0);
        }
        paths.extend(decompose(n, s, &mut edge, lambda));
    }
    sort_paths(&mut paths);
    Ok(Flow {
        nranks: n as u32,
        paths,
        rate: lambda,
        lp_rate,
    })
}

/// Paths of source `s`'s flow `edge` (`a·n + b`, consumed) delivering `demand` to every
/// other rank (see the module docs). Cycles the solver left are cancelled.
fn decompose(n: usize, s: usize, edge: &mut [f64], demand: f64) -> Vec<FlowPath> {
    let tol = 1e-9 * demand;
    let mut need = vec![demand; n];
    need[s] = 0.0;
    let mut found: BTreeMap<Vec<Rank>, f64> = BTreeMap::new();
    // Every round zeroes an edge or a need.
    for _ in 0..(n * n + n) {
        if need.iter().all(|&x| x <= tol) {
            break;
        }
        let mut path = vec![s];
        let mut on = vec![false; n];
        on[s] = true;
        loop {
            let u = *path.last().unwrap_or(&s);
            if u != s && need[u] > tol {
                break;
            }
            let next = (0..n)
                .filter(|&v| v != u && edge[u * n + v] > tol)
                .max_by(|&a, &b| edge[u * n + a].total_cmp(&edge[u * n + b]).then(b.cmp(&a)));
            let Some(v) = next else { break };
            if on[v] {
                // A cycle v → … → u → v: cancel it and walk on from v.
                let at = path.iter().position(|&x| x == v).unwrap_or(0);
                let mut cycle: Vec<usize> = path[at..].to_vec();
                cycle.push(v);
                let least = cycle
                    .windows(2)
                    .map(|w| edge[w[0] * n + w[1]])
                    .fold(f64::INFINITY, f64::min);
                for w in cycle.windows(2) {
                    edge[w[0] * n + w[1]] -= least;
                }
                for &x in &path[at + 1..] {
                    on[x] = false;
                }
                path.truncate(at + 1);
                continue;
            }
            on[v] = true;
            path.push(v);
        }
        let end = *path.last().unwrap_or(&s);
        if end == s {
            // No flow leaves the source although some rank is still owed: rounding.
            break;
        }
        let mut amount = path
            .windows(2)
            .map(|w| edge[w[0] * n + w[1]])
            .fold(f64::INFINITY, f64::min);
        if need[end] > tol {
            amount = amount.min(need[end]);
            need[end] -= amount;
            for w in path.windows(2) {
                edge[w[0] * n + w[1]] -= amount;
            }
            let ranks: Vec<Rank> = path.iter().map(|&x| x as Rank).collect();
            *found.entry(ranks).or_default() += amount;
        } else {
            // A dead end at a rank owed nothing: flow that reaches nobody, dropped.
            for w in path.windows(2) {
                edge[w[0] * n + w[1]] -= amount;
            }
        }
    }
    found
        .into_iter()
        .map(|(ranks, rate)| FlowPath { ranks, rate })
        .collect()
}

/// Paths by pair, widest first, then by ranks (deterministic).
fn sort_paths(paths: &mut [FlowPath]) {
    paths.sort_by(|a, b| {
        (a.src(), a.dst())
            .cmp(&(b.src(), b.dst()))
            .then(b.rate.total_cmp(&a.rate))
            .then(a.ranks.cmp(&b.ranks))
    });
}

/// `flow` with at most `max_paths` paths per pair: the widest of each pair (those above
/// [`MIN_SHARE`] of it, at least one), weighed again by the path LP
///
/// ```text
/// maximise μ   subject to   Σ_{paths of pair} x ≥ μ   for every pair,
///                           Σ_paths use(ρ) · x ≤ cap(ρ)   for every resource ρ,   x ≥ 0
/// ```
///
/// and scaled so that every pair's paths sum to `μ`, the pruned flow's rate.
pub fn prune(net: &Network, flow: &Flow, max_paths: usize) -> Result<Flow, SynthError> {
    let n = flow.nranks;
    let routes = Routes::new(net)?;
    let mut kept: Vec<&FlowPath> = Vec::new();
    for s in 0..n {
        for d in (0..n).filter(|&d| d != s) {
            let mine: Vec<&FlowPath> = flow.paths_of(s, d).collect();
            let total: f64 = mine.iter().map(|p| p.rate).sum();
            if mine.is_empty() {
                return Err(SynthError::Instance(format!("pair {s} → {d} has no path")));
            }
            kept.extend(
                mine.iter()
                    .enumerate()
                    .filter(|&(i, p)| i == 0 || p.rate >= MIN_SHARE * total)
                    .take(max_paths.max(1))
                    .map(|(_, p)| *p),
            );
        }
    }
    let mut vars = ProblemVariables::new();
    let mu = vars.add(variable().min(0.0));
    let x: Vec<Variable> = kept.iter().map(|_| vars.add(variable().min(0.0))).collect();
    let mut model = vars.maximise(mu).using(crate::lp::solver);
    let mut rows: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, p) in kept.iter().enumerate() {
        for w in p.ranks.windows(2) {
            for &r in routes.of(w[0], w[1]) {
                rows.entry(r).or_default().push(i);
            }
        }
    }
    for (r, is) in &rows {
        let cap = net.capacity[*r as usize];
        if !cap.is_finite() {
            continue;
        }
        let load: Expression = is.iter().map(|&i| x[i]).sum();
        model = model.with(constraint!(load <= cap));
    }
    let mut start = 0;
    while start < kept.len() {
        let key = (kept[start].src(), kept[start].dst());
        let mut end = start;
        while end < kept.len() && (kept[end].src(), kept[end].dst()) == key {
            end += 1;
        }
        let sum: Expression = x[start..end].iter().copied().sum();
        model = model.with(constraint!(sum >= mu));
        start = end;
    }
    let solution = model
        .solve()
        .map_err(|e| SynthError::Solver(e.to_string()))?;
    let rate = solution.value(mu);
    if !(rate.is_finite() && rate > 0.0) {
        return Err(SynthError::Solver(
            "the path LP has no positive rate".into(),
        ));
    }
    let mut paths: Vec<FlowPath> = Vec::new();
    let mut start = 0;
    while start < kept.len() {
        let key = (kept[start].src(), kept[start].dst());
        let mut end = start;
        while end < kept.len() && (kept[end].src(), kept[end].dst()) == key {
            end += 1;
        }
        let values: Vec<f64> = (start..end)
            .map(|i| solution.value(x[i]).max(0.0))
            .collect();
        let sum: f64 = values.iter().sum();
        for (i, v) in (start..end).zip(values) {
            if v > 1e-6 * sum {
                paths.push(FlowPath {
                    ranks: kept[i].ranks.clone(),
                    rate: v * rate / sum,
                });
            }
        }
        start = end;
    }
    sort_paths(&mut paths);
    Ok(Flow {
        nranks: n,
        paths,
        rate,
        lp_rate: flow.lp_rate,
    })
}

/// A channel for every path such that no two paths on one channel share a connection end
/// (a rank's sending or receiving side towards one peer): greedily, longest paths first.
pub fn channels(paths: &[FlowPath]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(paths[i].hops()), i));
    // (rank, peer, sending) → channels in use there.
    let mut used: HashMap<(Rank, Rank, bool), HashSet<u32>> = HashMap::new();
    let mut out = vec![0; paths.len()];
    for i in order {
        let ends: Vec<(Rank, Rank, bool)> = paths[i]
            .ranks
            .windows(2)
            .flat_map(|w| [(w[0], w[1], true), (w[1], w[0], false)])
            .collect();
        let c = (0..)
            .find(|c| {
                ends.iter()
                    .all(|e| used.get(e).is_none_or(|s| !s.contains(c)))
            })
            .unwrap_or(0);
        for e in ends {
            used.entry(e).or_default().insert(c);
        }
        out[i] = c;
    }
    out
}

/// Steps of [`lower`]'s out-of-place schedule with `pieces` pieces per path.
pub fn step_count(flow: &Flow, pieces: u32) -> u64 {
    let per_piece: u64 = flow.paths.iter().map(|p| p.ranks.len() as u64).sum();
    u64::from(pieces) * per_piece + u64::from(flow.nranks)
}

/// Lowers `flow` to an AllToAll schedule with `pieces` pieces per path (see the module
/// docs); `None` when the flow has no path for some pair or the builder refuses.
pub fn lower(
    name: &str,
    flow: &Flow,
    pieces: u32,
    in_place: bool,
    params: FamilyParams,
) -> Option<Candidate> {
    let n = flow.nranks;
    if n < 2 || pieces == 0 {
        return None;
    }
    let m = pieces * RESOLUTION;
    let channel = channels(&flow.paths);
    // Lane: a path, its channel, and its units of the pair's block.
    struct Lane<'a> {
        path: &'a FlowPath,
        channel: u32,
        off: u32,
        width: u32,
    }
    let mut lanes: Vec<Lane> = Vec::new();
    let mut i = 0;
    while i < flow.paths.len() {
        let key = (flow.paths[i].src(), flow.paths[i].dst());
        let mut j = i;
        while j < flow.paths.len() && (flow.paths[j].src(), flow.paths[j].dst()) == key {
            j += 1;
        }
        let rates: Vec<f64> = flow.paths[i..j].iter().map(|p| p.rate).collect();
        let widths = piece_widths(&rates, RESOLUTION);
        if widths.iter().sum::<u32>() != RESOLUTION {
            return None;
        }
        let mut off = 0;
        for (k, &w) in (i..j).zip(&widths) {
            if w > 0 {
                lanes.push(Lane {
                    path: &flow.paths[k],
                    channel: channel[k],
                    off,
                    width: w,
                });
                off += w;
            }
        }
        i = j;
    }
    // Every pair's block must be covered.
    let mut covered: HashSet<(Rank, Rank)> = HashSet::new();
    for l in &lanes {
        if l.path.ranks.len() < 2 || l.path.src() == l.path.dst() || l.path.dst() >= n {
            return None;
        }
        covered.insert((l.path.src(), l.path.dst()));
    }
    if covered.len() != (n * (n - 1)) as usize {
        return None;
    }
    let mut b = ScheduleBuilder::new(Collective::AllToAll, n, n * m, in_place);
    b.set_fusion(false);
    if !in_place {
        for r in 0..n {
            b.copy((r, Loc::input(r * m)), (r, Loc::output(r * m)), m, 0);
        }
    }
    // In place, rank d lands the block from s in scratch at land[d][s] (the output is the
    // input, still to be sent), copied to the output at the end.
    let land: Vec<Vec<u32>> = if in_place {
        (0..n)
            .map(|d| {
                (0..n)
                    .map(|s| if s == d { 0 } else { b.scratch(d, m).off })
                    .collect()
            })
            .collect()
    } else {
        Vec::new()
    };
    for j in 0..pieces {
        for l in &lanes {
            let (s, d, w, ch) = (l.path.src(), l.path.dst(), l.width, l.channel);
            let k = pieces * l.off + j * w;
            let ranks = &l.path.ranks;
            let dst = if in_place {
                Loc::scratch(land[d as usize][s as usize] + k)
            } else {
                Loc::output(s * m + k)
            };
            b.send(s, ranks[1], Loc::input(d * m + k), w, ch);
            for h in 1..ranks.len() - 1 {
                let at = b.scratch(ranks[h], w);
                b.recv_copy_send(ranks[h], ranks[h - 1], ranks[h + 1], at, w, ch);
            }
            b.recv(d, ranks[ranks.len() - 2], dst, w, ch);
        }
    }
    if in_place {
        for d in 0..n {
            for s in (0..n).filter(|&s| s != d) {
                let from = Loc::scratch(land[d as usize][s as usize]);
                b.copy((d, from), (d, Loc::output(s * m)), m, 0);
            }
        }
    }
    let min_bytes = u64::from(pieces) * lanes.len() as u64 * MIN_PIECE_BYTES;
    candidate(name, params, b)
        .into_iter()
        .next()
        .map(|c| c.from_bytes(min_bytes).synthesized(record(flow)))
}

/// What a plan entry records of a flow: the rate every pair gets over the kept paths against
/// the flow LP's optimum.
pub fn record(flow: &Flow) -> Synthesis {
    Synthesis {
        method: "mcf-paths".into(),
        objective: "maximise the rate every ordered rank pair gets at once (concurrent \
                    multi-commodity flow over the simulator's routes, forwarded through ranks)"
            .into(),
        value: flow.rate,
        optimum: flow.lp_rate,
        unit: "GB/s per pair".into(),
        proven: true,
    }
}

/// The flow of topology `hash` pruned to `max_paths` paths per pair (0: the whole
/// decomposition), computed once per process by `compute`.
fn cached(
    hash: &str,
    max_paths: usize,
    compute: impl FnOnce() -> Option<Arc<Flow>>,
) -> Option<Arc<Flow>> {
    static FLOWS: super::Memo<(String, usize), Option<Arc<Flow>>> = super::Memo::new();
    FLOWS.get((hash.to_string(), max_paths), compute)
}

/// The decomposed flow of `topo` (cached by topology hash); `None` beyond
/// [`A2A_MAX_RANKS`] or when the LP fails.
pub fn flow_for(topo: &Topology) -> Option<Arc<Flow>> {
    let n = topo.nranks();
    if !(2..=A2A_MAX_RANKS).contains(&n) {
        return None;
    }
    cached(&topo.hash, 0, || {
        solve(&Network::new(topo)).ok().map(Arc::new)
    })
}

/// [`flow_for`] pruned to `max_paths` paths per pair (cached).
pub fn pruned_for(topo: &Topology, max_paths: usize) -> Option<Arc<Flow>> {
    let full = flow_for(topo)?;
    cached(&topo.hash, max_paths.max(1), || {
        prune(&Network::new(topo), &full, max_paths.max(1))
            .ok()
            .map(Arc::new)
    })
}

/// AllToAll over the multi-commodity flow LP's paths (see the module docs).
/// `params.channels` is the most paths per pair, `params.pipeline` the pieces per path.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowAllToAll;

impl Family for FlowAllToAll {
    fn name(&self) -> &'static str {
        "flow_alltoall"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllToAll
    }

    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if collective != Collective::AllToAll {
            return Vec::new();
        }
        if topo.nranks() == 1 {
            return vec![FamilyParams {
                channels: 1,
                pipeline: 1,
            }];
        }
        if flow_for(topo).is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let widest = pruned_for(topo, PATH_LIMITS[0] as usize);
        for &paths in &PATH_LIMITS {
            // A tighter path limit only where it changes the paths, and only at the middle
            // depth: fewer, wider pipelines.
            let depths: &[u32] = if paths == PATH_LIMITS[0] {
                &PIPELINES
            } else if pruned_for(topo, paths as usize).is_some_and(|f| Some(f) != widest) {
                &PIPELINES[2..3]
            } else {
                &[]
            };
            for &pipeline in depths {
                out.push(FamilyParams {
                    channels: paths,
                    pipeline,
                });
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
        if collective != Collective::AllToAll {
            return Vec::new();
        }
        if topo.nranks() == 1 {
            return single_rank(self.name(), collective, in_place, params);
        }
        let Some(flow) = pruned_for(topo, params.channels.max(1) as usize) else {
            return Vec::new();
        };
        lower(self.name(), &flow, params.pipeline.max(1), in_place, params)
            .into_iter()
            .collect()
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        if collective != Collective::AllToAll || topo.nranks() < 2 {
            return None;
        }
        let flow = pruned_for(topo, params.channels.max(1) as usize)?;
        Some(step_count(&flow, params.pipeline.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(spec: hccl_topologies::TopologySpec) -> Network {
        Network::new(&hccl_topologies::build(spec, "t").unwrap())
    }

    /// A 4-ring: neighbours go direct, opposite ranks two links round; every link
    /// carries 100 GB/s (its capacity) at λ = 50.
    #[test]
    fn ring_of_four_splits_the_far_pairs() {
        let net = network(hccl_topologies::generate::ring(4, 100.0, 1.0));
        let flow = solve(&net).expect("solves");
        assert!((flow.lp_rate - 50.0).abs() < 1e-6, "{}", flow.lp_rate);
        for s in 0..4u32 {
            let near: Vec<_> = flow.paths_of(s, (s + 1) % 4).collect();
            assert_eq!(near.len(), 1);
            assert_eq!(near[0].ranks, vec![s, (s + 1) % 4]);
            let far: Vec<_> = flow.paths_of(s, (s + 2) % 4).collect();
            assert!((1..=2).contains(&far.len()), "{far:?}");
            // Forwarded by a neighbour, or sent on the direct edge whose route crosses the
            // same two links (equally cheap: which one depends on the solver).
            assert!(far.iter().all(|p| p.hops() <= 2), "{far:?}");
            let sum: f64 = far.iter().map(|p| p.rate).sum();
            assert!((sum - flow.rate).abs() < 1e-6 * flow.rate, "{far:?}");
        }
        let pruned = prune(&net, &flow, 1).expect("prunes");
        assert_eq!(pruned.max_paths_per_pair(), 1);
        assert!(pruned.rate <= flow.lp_rate * (1.0 + 1e-9));
        // Far pairs whose widest path goes clockwise: pruned to one path each, every
        // clockwise link carries its neighbour pair and two far pairs, so μ = 100/3.
        let mut paths = Vec::new();
        for s in 0..4u32 {
            let (a, b, c) = ((s + 1) % 4, (s + 2) % 4, (s + 3) % 4);
            paths.push(FlowPath {
                ranks: vec![s, a],
                rate: 50.0,
            });
            paths.push(FlowPath {
                ranks: vec![s, c],
                rate: 50.0,
            });
            paths.push(FlowPath {
                ranks: vec![s, a, b],
                rate: 30.0,
            });
            paths.push(FlowPath {
                ranks: vec![s, c, b],
                rate: 20.0,
            });
        }
        sort_paths(&mut paths);
        let skewed = Flow {
            nranks: 4,
            paths,
            rate: 50.0,
            lp_rate: 50.0,
        };
        let one = prune(&net, &skewed, 1).expect("prunes");
        assert!((one.rate - 100.0 / 3.0).abs() < 1e-6, "{}", one.rate);
        let two = prune(&net, &skewed, 2).expect("prunes");
        assert!((two.rate - 50.0).abs() < 1e-6, "{}", two.rate);
    }

    /// Paths sharing a connection end get different channels; disjoint ones share.
    #[test]
    fn channels_keep_paths_apart() {
        let p = |ranks: Vec<Rank>| FlowPath { ranks, rate: 1.0 };
        let paths = vec![
            p(vec![0, 1]),
            p(vec![0, 1, 2]),
            p(vec![2, 3]),
            p(vec![3, 1]),
        ];
        let ch = channels(&paths);
        assert_ne!(ch[0], ch[1]);
        assert_eq!(ch[1], ch[2]);
        assert_eq!(ch[3], ch[1]);
    }
}
