//! The solver of one instance ([`solve_base`]): the MILP model of sends per link and step
//! (relaxed, aggregated over symmetric origins, or exact), LP dives, and the decomposition
//! of an aggregate solution into chunks, within one time limit.

use super::decompose::{decompose, decompose_residual};
use super::problem::{
    Algorithm, Instance, LinkMatrix, Perm, Solved, Stop, Transfer, automorphisms, cut_bound,
    least_steps,
};
use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, WithTimeLimit,
    constraint, variable,
};
use hccl_ir::Collective;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

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
    dive: Option<&Fixed>,
    time_limit: f64,
) -> Result<Option<ModelSolution>, String> {
    let built = build_model(
        crate::lp::solver,
        links,
        origins,
        inst,
        kind,
        sym,
        split,
        dive,
        time_limit,
    );
    let sol = match built.model.solve() {
        Ok(sol) => sol,
        Err(ResolutionError::Infeasible) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    Ok(Some(read_solution(
        &sol,
        &built.classes,
        &built.class_of,
        &links.links(),
        origins,
        (&built.r, inst.chunks),
    )))
}

/// A model ready to solve, and what reading its solution needs.
struct Built<M> {
    model: M,
    classes: Vec<Class>,
    class_of: Vec<(usize, u32)>,
    /// The rounds of every step.
    r: Vec<Variable>,
    /// Every variable, in the order they were created (the order good_lp creates microlp's).
    #[cfg(not(feature = "highs"))]
    order: Vec<Variable>,
}

/// The model of `kind` (see [`send_variables`], [`with_flow_rows`], [`with_capacity_rows`])
/// for `solver`, under `time_limit`.
#[allow(clippy::too_many_arguments)]
fn build_model<S: good_lp::Solver>(
    solver: S,
    links: &LinkMatrix,
    origins: &[u32],
    inst: Instance,
    kind: &ModelKind,
    sym: &[(usize, Perm)],
    split: Option<&[u32]>,
    dive: Option<&Fixed>,
    time_limit: f64,
) -> Built<S::Model>
where
    S::Model: WithTimeLimit,
{
    let (mut classes, class_of) = model_classes(links.n, origins, inst.chunks, kind, sym);
    let mut vars = ProblemVariables::new();
    let r = send_variables(&mut vars, links, &mut classes, inst, split, dive);
    #[cfg(not(feature = "highs"))]
    let order = vars.iter_variables_with_def().map(|(v, _)| v).collect();
    let model = vars
        .minimise(Expression::from(0.0))
        .using(solver)
        .with_time_limit(time_limit.max(0.001));
    let (model, link_index) = with_flow_rows(model, links, &classes, &class_of, &r, inst);
    let model = with_capacity_rows(model, links, &classes, &link_index, &r, inst.steps);
    Built {
        model,
        classes,
        class_of,
        r,
        #[cfg(not(feature = "highs"))]
        order,
    }
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
    dive: Option<&Fixed>,
) -> Vec<Variable> {
    let link_list = links.links();
    let steps = inst.steps;
    let max_r = inst.rounds.saturating_sub(steps) + 1;
    let r: Vec<Variable> = (0..steps as usize)
        .map(|s| {
            let (lo, hi) = split.map_or((1, max_r), |sp| (sp[s], sp[s]));
            let def = variable().min(f64::from(lo)).max(f64::from(hi));
            // A dive's LP has no integer variable (its rounds are fixed by the split), so
            // that it can be solved again from its basis after each fix.
            vars.add(if dive.is_some() && split.is_some() {
                def
            } else {
                def.integer()
            })
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
    let (mut lp, mut current) = DiveLp::new(links, origins, inst, sym, split, time_limit)?;
    loop {
        if time_limit - started.elapsed().as_secs_f64() <= 0.0 {
            return Err("time limit".into());
        }
        let Some(m) = current else {
            return Err("the dive reached a dead end".into());
        };
        let frac = m
            .values
            .iter()
            .filter(|(key, v)| !lp.is_fixed(key) && **v > EPS && **v < 1.0 - EPS)
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
        let left = time_limit - started.elapsed().as_secs_f64();
        current = match lp.fix(key, true, left)? {
            Some(m) => Some(m),
            // Sending it makes the LP infeasible: not sending it, from the LP before.
            None => lp.fix(key, false, left)?,
        };
    }
}

/// A send of the dive's model: `(class, link index, step)`.
type SendKey = (usize, usize, u32);

/// The sends a dive has fixed, and to what (sent or not).
type Fixed = HashMap<SendKey, bool>;

/// The LP of a dive, solved again as its sends are fixed one by one: with microlp, from the
/// last solution's basis (a few dual simplex pivots per send instead of a whole solve; a
/// dive on DGX-1 fixes dozens); with HiGHS, built and solved anew with every send fixed so far.
struct DiveLp<'a> {
    links: &'a LinkMatrix,
    origins: &'a [u32],
    inst: Instance,
    #[cfg(feature = "highs")]
    sym: &'a [(usize, Perm)],
    #[cfg(feature = "highs")]
    split: &'a [u32],
    fixed: Fixed,
    #[cfg(not(feature = "highs"))]
    warm: Warm,
}

/// The solved LP a microlp dive edits, and what reading it needs.
#[cfg(not(feature = "highs"))]
struct Warm {
    solution: microlp::Solution,
    /// Each good_lp variable's microlp variable (good_lp creates them in its order).
    variables: HashMap<Variable, microlp::Variable>,
    classes: Vec<Class>,
    class_of: Vec<(usize, u32)>,
    r: Vec<Variable>,
}

/// A microlp solution read through good_lp's [`Solution`] (values as solved, unrounded: the
/// dive's LP has no integer variables).
#[cfg(not(feature = "highs"))]
struct WarmValues<'a>(&'a Warm);

#[cfg(not(feature = "highs"))]
impl Solution for WarmValues<'_> {
    fn status(&self) -> good_lp::SolutionStatus {
        good_lp::SolutionStatus::Optimal
    }

    fn value(&self, variable: Variable) -> f64 {
        self.0.solution.var_value_raw(self.0.variables[&variable])
    }
}

impl<'a> DiveLp<'a> {
    /// The dive's LP with nothing fixed, and its solution (`None`: infeasible).
    fn new(
        links: &'a LinkMatrix,
        origins: &'a [u32],
        inst: Instance,
        sym: &'a [(usize, Perm)],
        split: &'a [u32],
        time_limit: f64,
    ) -> Result<(DiveLp<'a>, Option<ModelSolution>), String> {
        #[cfg(feature = "highs")]
        {
            let lp = DiveLp {
                links,
                origins,
                inst,
                sym,
                split,
                fixed: HashMap::new(),
            };
            let first = lp.solve_anew(time_limit)?;
            Ok((lp, first))
        }
        #[cfg(not(feature = "highs"))]
        {
            let fixed = HashMap::new();
            let built = build_model(
                good_lp::microlp,
                links,
                origins,
                inst,
                &ModelKind::SymmetricChunks,
                sym,
                Some(split),
                Some(&fixed),
                time_limit,
            );
            let solution = match built.model.solve() {
                Ok(sol) => sol.into_inner(),
                Err(ResolutionError::Infeasible) => {
                    return Err("the dive reached a dead end".into());
                }
                // As every solve of the dive: out of time (or the solver gave up).
                Err(_) => return Err("time limit".into()),
            };
            let variables = built
                .order
                .into_iter()
                .zip(solution.iter().map(|(v, _)| v))
                .collect();
            let lp = DiveLp {
                links,
                origins,
                inst,
                fixed,
                warm: Warm {
                    solution,
                    variables,
                    classes: built.classes,
                    class_of: built.class_of,
                    r: built.r,
                },
            };
            let first = lp.read();
            Ok((lp, Some(first)))
        }
    }

    fn is_fixed(&self, key: &SendKey) -> bool {
        self.fixed.contains_key(key)
    }

    /// Fixes `key` to `on` and solves again: the solution, or `None` when that is infeasible
    /// (and the fix is undone).
    fn fix(
        &mut self,
        key: SendKey,
        on: bool,
        time_limit: f64,
    ) -> Result<Option<ModelSolution>, String> {
        self.fixed.insert(key, on);
        #[cfg(feature = "highs")]
        let solved = self.solve_anew(time_limit)?;
        #[cfg(not(feature = "highs"))]
        let solved = {
            let _ = time_limit; // the edit runs under the first solve's limit
            let w = &mut self.warm;
            let (ci, li, s) = key;
            let x = w.classes[ci].x[&(li, s)];
            match w
                .solution
                .clone()
                .fix_var(w.variables[&x], f64::from(u8::from(on)))
            {
                Ok(microlp::SolveOutcome::Solution(sol)) => {
                    w.solution = sol;
                    Some(self.read())
                }
                Ok(microlp::SolveOutcome::Interrupted(_)) => return Err("time limit".into()),
                Err(microlp::Error::Infeasible) => None,
                Err(_) => return Err("time limit".into()),
            }
        };
        if solved.is_none() {
            self.fixed.remove(&key);
        }
        Ok(solved)
    }

    /// The model built and solved from scratch with the sends fixed so far.
    #[cfg(feature = "highs")]
    fn solve_anew(&self, time_limit: f64) -> Result<Option<ModelSolution>, String> {
        solve_model(
            self.links,
            self.origins,
            self.inst,
            &ModelKind::SymmetricChunks,
            self.sym,
            Some(self.split),
            Some(&self.fixed),
            time_limit,
        )
        .map_err(|_| "time limit".to_string())
    }

    /// The current solution of the warm LP.
    #[cfg(not(feature = "highs"))]
    fn read(&self) -> ModelSolution {
        let w = &self.warm;
        read_solution(
            &WarmValues(w),
            &w.classes,
            &w.class_of,
            &self.links.links(),
            self.origins,
            (&w.r, self.inst.chunks),
        )
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
