//! The MILP model of one instance: sends per link and step of every chunk class (relaxed,
//! aggregated over symmetric origins, or exact), its rows, and its solution read back.

use super::problem::{Instance, LinkMatrix, Perm, Transfer};
use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, WithTimeLimit,
    constraint, variable,
};
use std::collections::{BTreeMap, HashMap};

/// The model's variables of one chunk class: sends per (link, step).
pub(super) struct Class {
    /// Origin rank.
    pub(super) origin: usize,
    /// Chunks the class stands for (1, or C in the relaxation).
    pub(super) count: u32,
    /// Automorphisms it is copied under for the capacities (identity alone when not
    /// symmetric).
    pub(super) images: Vec<Perm>,
    /// `(link index, step) → variable`.
    pub(super) x: HashMap<(usize, u32), Variable>,
}

pub(super) enum ModelKind {
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
pub(super) struct ModelSolution {
    /// Every send variable's value, `(class, link, step)`.
    pub(super) values: HashMap<(usize, usize, u32), f64>,
    pub(super) rounds: Vec<u32>,
    pub(super) aggregates: Vec<Aggregate>,
    pub(super) transfers: Vec<Transfer>,
}

/// Builds and solves one model: `Ok(Some((rounds per step, transfers)))` (no transfers
/// from the relaxation), `Ok(None)` proven infeasible, `Err` time limit or solver trouble.
#[allow(clippy::too_many_arguments)]
pub(super) fn solve_model(
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
pub(super) struct Built<M> {
    pub(super) model: M,
    pub(super) classes: Vec<Class>,
    pub(super) class_of: Vec<(usize, u32)>,
    /// The rounds of every step.
    pub(super) r: Vec<Variable>,
    /// Every variable, in the order they were created (the order good_lp creates microlp's).
    #[cfg(not(feature = "highs"))]
    pub(super) order: Vec<Variable>,
}

/// The model of `kind` (see [`send_variables`], [`with_flow_rows`], [`with_capacity_rows`])
/// for `solver`, under `time_limit`.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_model<S: good_lp::Solver>(
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
pub(super) fn read_solution(
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

/// A send of the dive's model: `(class, link index, step)`.
pub(super) type SendKey = (usize, usize, u32);

/// The sends a dive has fixed, and to what (sent or not).
pub(super) type Fixed = HashMap<SendKey, bool>;
