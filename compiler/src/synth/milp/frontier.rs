//! The Pareto frontier of instances (steps × rounds per chunk) from the cut bound
//! ([`pareto`]), its lowering to schedules ([`lower`], [`lower_allreduce`]) and the family
//! `milp` ([`MilpFrontier`]).

use super::problem::{
    Algorithm, Instance, LinkMatrix, MAX_CHUNKS, MAX_RANKS, MAX_ROUNDS, MAX_STEPS, Ratio, Solved,
    Stop, Transfer, bandwidth_bound, base_of, least_steps,
};
use super::solve::solve_base;
use crate::builder::ScheduleBuilder;
use crate::cost::memo::Memo;
use crate::families::common::candidate;
use crate::families::{Candidate, FamilyParams};
use crate::synth::SynthError;
use hccl_ir::{Collective, Loc, Synthesis};
use hccl_topologies::Topology;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    let mut solved = solved_base(base_links, origins, inst, time_limit);
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

/// [`solve_base`] once per process for each problem: the links and origins it is solved
/// over, the instance and the time limit. A collective and its dual over links that are
/// their own transpose (every shipped machine's: AllGather and ReduceScatter over DGX-1's
/// NVLinks) are one problem, which the frontiers of both, searched side by side, would
/// otherwise solve twice; the second caller waits for the first's result.
fn solved_base(links: LinkMatrix, origins: Vec<u32>, inst: Instance, time_limit: f64) -> Solved {
    type Key = (usize, Vec<u32>, u64, Vec<u32>, Instance, u64);
    static SOLVED: Memo<Key, Solved> = Memo::new();
    let key = (
        links.n,
        links.b.clone(),
        links.unit_gbps,
        origins.clone(),
        inst,
        time_limit.to_bits(),
    );
    SOLVED.get(key, || solve_base(&links, &origins, inst, time_limit))
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
                (Stop::TimeLimit, _) => {
                    proven = false;
                    crate::clock::note_clock_stop();
                }
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
/// fails); with `cache`, read from that synthesis cache directory ([`crate::synth::cache`])
/// when it holds it, else solved and written there.
fn search_frontier(
    topo: &Topology,
    collective: Collective,
    cache: Option<&Path>,
) -> Option<Arc<Frontier>> {
    static FRONTIERS: Memo<(String, String), Option<Arc<Frontier>>> = Memo::new();
    FRONTIERS.get((topo.hash.clone(), collective.to_string()), || {
        let links = LinkMatrix::from_topology(topo).ok()?;
        let primed = cache.is_none().then(|| priming_cache(&topo.hash)).flatten();
        cached_pareto(
            &links,
            collective,
            SEARCH_OPTIONS,
            cache.or(primed.as_deref()),
        )
        .ok()
        .map(Arc::new)
    })
}

/// The synthesis caches of the topologies whose frontiers are being primed in the
/// background ([`prime_in`]), by topology hash: whichever thread computes such a frontier
/// first (the priming one, or the family when it needs it sooner) reads and stores it there.
static PRIMING: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

fn priming_cache(hash: &str) -> Option<PathBuf> {
    let priming = PRIMING.lock().unwrap_or_else(|p| p.into_inner());
    priming
        .iter()
        .find(|(h, _)| h == hash)
        .map(|(_, dir)| dir.clone())
}

/// [`pareto`] through the synthesis cache in `cache` (none: solved): a frontier stored for
/// the same links, collective and limits is read back (every point checked against the
/// model again), else solved and, when none of its instances ran out of time (its result
/// does not depend on the clock), stored. A read frontier has no [`Frontier::tried`].
pub fn cached_pareto(
    links: &LinkMatrix,
    collective: Collective,
    opts: ParetoOptions,
    cache: Option<&Path>,
) -> Result<Frontier, SynthError> {
    let Some(dir) = cache else {
        return pareto(links, collective, opts);
    };
    let key = frontier_key(links, collective, opts);
    if let Some(frontier) = crate::synth::cache::load(dir, &key)
        .and_then(|bytes| serde_json::from_slice::<StoredFrontier>(&bytes).ok())
        .and_then(|stored| stored.frontier(links, collective))
    {
        return Ok(frontier);
    }
    let frontier = pareto(links, collective, opts)?;
    if frontier.tried.iter().all(|s| s.stop != Stop::TimeLimit)
        && let Ok(bytes) = serde_json::to_vec(&StoredFrontier::of(&frontier))
    {
        // A cache that cannot be written costs the next compile the solve, nothing more.
        let _ = crate::synth::cache::store(dir, &key, &bytes);
    }
    Ok(frontier)
}

/// The cache key of a frontier: everything [`pareto`] reads.
fn frontier_key(links: &LinkMatrix, collective: Collective, opts: ParetoOptions) -> String {
    let mut input = format!(
        "{collective} n={} unit={} steps={} chunks={} limit={:016x} b=",
        links.n,
        links.unit_gbps,
        opts.max_steps,
        opts.max_chunks,
        opts.time_limit.to_bits()
    );
    for b in &links.b {
        input.push_str(&b.to_string());
        input.push(',');
    }
    crate::synth::cache::key("milp-frontier", input.as_bytes())
}

/// A frontier as the synthesis cache stores it: the points' algorithms (their collective
/// and ranks are the key's), the bound and what the search found of it; not the solver's
/// times, so that every solve of one input writes the same bytes (a frontier read back
/// reports 0 s).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredFrontier {
    bound: (u64, u64),
    least_steps: u32,
    at_bound: bool,
    points: Vec<StoredPoint>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredPoint {
    /// Steps, rounds, chunks.
    instance: (u32, u32, u32),
    rounds_per_step: Vec<u32>,
    origins: Vec<u32>,
    /// Step, chunk, from, to.
    transfers: Vec<(u32, u32, u32, u32)>,
    proven: bool,
}

impl StoredFrontier {
    fn of(f: &Frontier) -> StoredFrontier {
        StoredFrontier {
            bound: (f.bound.num, f.bound.den),
            least_steps: f.least_steps,
            at_bound: f.at_bound,
            points: f
                .points
                .iter()
                .map(|p| {
                    let a = &p.algorithm;
                    StoredPoint {
                        instance: (a.instance.steps, a.instance.rounds, a.instance.chunks),
                        rounds_per_step: a.rounds_per_step.clone(),
                        origins: a.origins.clone(),
                        transfers: a
                            .transfers
                            .iter()
                            .map(|t| (t.step, t.chunk, t.from, t.to))
                            .collect(),
                        proven: p.proven,
                    }
                })
                .collect(),
        }
    }

    /// The frontier back, `None` when some point is not an algorithm of `collective` on
    /// `links` ([`Algorithm::check`]).
    fn frontier(self, links: &LinkMatrix, collective: Collective) -> Option<Frontier> {
        let mut points = Vec::with_capacity(self.points.len());
        for p in self.points {
            let (steps, rounds, chunks) = p.instance;
            let algorithm = Algorithm {
                collective,
                nranks: links.n as u32,
                instance: Instance {
                    steps,
                    rounds,
                    chunks,
                },
                rounds_per_step: p.rounds_per_step,
                origins: p.origins,
                transfers: p
                    .transfers
                    .into_iter()
                    .map(|(step, chunk, from, to)| Transfer {
                        step,
                        chunk,
                        from,
                        to,
                    })
                    .collect(),
            };
            algorithm.check(links).ok()?;
            points.push(ParetoPoint {
                algorithm,
                proven: p.proven,
                seconds: 0.0,
            });
        }
        let (num, den) = self.bound;
        (den > 0).then_some(Frontier {
            collective,
            links: links.clone(),
            bound: Ratio { num, den },
            least_steps: self.least_steps,
            points,
            tried: Vec::new(),
            at_bound: self.at_bound,
            seconds: 0.0,
        })
    }
}

/// Reads or solves (see [`cached_pareto`]) the frontiers the family `milp` lowers for
/// `collectives` on `topo` into this process's memo, through the synthesis cache in `cache`
/// (none: solved), so that the family (which has no cache directory) finds them there; the
/// search runs it beside its collectives ([`prime_in`]). Distinct frontiers (AllGather's,
/// ReduceScatter's) are searched side by side, sharing the solves they have in common
/// ([`solve_instance`]).
pub fn prime(topo: &Topology, collectives: &[Collective], cache: Option<&Path>) {
    if !(2..=SEARCH_MAX_RANKS).contains(&topo.nranks()) {
        return;
    }
    let mut solved: Vec<Collective> = Vec::new();
    for c in collectives.iter().filter_map(|&c| solved_collective(c)) {
        if !solved.contains(&c) {
            solved.push(c);
        }
    }
    std::thread::scope(|scope| {
        for &c in &solved {
            scope.spawn(move || search_frontier(topo, c, cache));
        }
    });
}

/// [`prime`] on a thread of `scope`, so that a search can start at once: the collectives
/// that need no frontier compile meanwhile, and the family `milp` waits for the frontiers
/// it lowers (computing one itself, through the same cache, if it asks first).
pub fn prime_in<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    topo: &'scope Topology,
    collectives: Vec<Collective>,
    cache: Option<&'scope Path>,
) {
    if !(2..=SEARCH_MAX_RANKS).contains(&topo.nranks())
        || !collectives.iter().any(|&c| needs_frontier(c))
    {
        return;
    }
    let entry = cache.map(|dir| (topo.hash.clone(), dir.to_path_buf()));
    if let Some(entry) = &entry {
        PRIMING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(entry.clone());
    }
    scope.spawn(move || {
        prime(topo, &collectives, cache);
        if let Some(entry) = entry {
            let mut priming = PRIMING.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = priming.iter().position(|e| *e == entry) {
                priming.swap_remove(i);
            }
        }
    });
}

/// Whether the family `milp` lowers a frontier for `collective` (which [`prime`] solves).
pub fn needs_frontier(collective: Collective) -> bool {
    solved_collective(collective).is_some()
}

/// The collective whose frontier the family lowers for `collective` (AllReduce: the
/// AllGather's, run after its dual ReduceScatter).
fn solved_collective(collective: Collective) -> Option<Collective> {
    match collective {
        Collective::AllReduce | Collective::AllGather => Some(Collective::AllGather),
        Collective::ReduceScatter => Some(Collective::ReduceScatter),
        _ => None,
    }
}

/// Frontier points of `collective` on `topo` as verified candidates, all named `milp` (the
/// point is in their [`Synthesis`] record): AllGather and ReduceScatter from their own
/// frontiers, AllReduce as each AllGather point's dual ReduceScatter followed by the point.
fn frontier_candidates(topo: &Topology, collective: Collective) -> Vec<Candidate> {
    let Some(solved) = solved_collective(collective) else {
        return Vec::new();
    };
    let Some(frontier) = search_frontier(topo, solved, None) else {
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

/// The limits of a frontier search inside a compile.
const SEARCH_OPTIONS: ParetoOptions = ParetoOptions {
    max_steps: SEARCH_MAX_STEPS,
    max_chunks: SEARCH_MAX_CHUNKS,
    time_limit: SEARCH_TIME_LIMIT,
};
/// Steps a frontier search inside a compile goes up to.
const SEARCH_MAX_STEPS: u32 = 3;
/// Chunks per rank a frontier search inside a compile goes up to.
const SEARCH_MAX_CHUNKS: u32 = 6;
/// Seconds per instance of a frontier search inside a compile.
const SEARCH_TIME_LIMIT: f64 = 5.0;
/// Largest rank count the search runs the frontier for.
pub const SEARCH_MAX_RANKS: u32 = 8;

/// The latency-optimal frontier as a family (`--synth auto` and `full`): AllGather,
/// ReduceScatter and AllReduce (as ReduceScatter + AllGather) in SCCL's model, up to
/// [`SEARCH_MAX_RANKS`] ranks with direct links. Its frontiers are solved once per process,
/// and kept between compiles in the synthesis cache ([`crate::synth::cache`]; [`prime`]).
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
