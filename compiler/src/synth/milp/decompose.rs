//! The decomposition of an aggregate solution into chunks: per origin, each chunk's
//! transfers along the aggregate's sends ([`decompose`]) or, when those do not suffice,
//! anywhere the other origins leave room ([`decompose_residual`]).

use super::problem::{Instance, LinkMatrix, Perm};
use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, WithTimeLimit,
    constraint, variable,
};
use std::collections::HashMap;

/// The rows every chunk `k` of `origin` obeys, over its transfer variables `x[k]` (`(link,
/// step) → binary`): every other rank receives it once, a rank sends it only at a step after
/// it received it, and chunk `k` arrives no later in total than chunk `k + 1` (which breaks
/// the chunks' symmetry).
fn with_chunk_rows<M: SolverModel>(
    mut model: M,
    x: &[HashMap<(usize, u32), Variable>],
    link_list: &[(usize, usize)],
    n: usize,
    origin: usize,
) -> M {
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
    model
}

/// The chunks of `origin` along sends that stay within `counts` (`(link, step) → chunks`,
/// an aggregate solution): per chunk `k`, its transfers `(k, from, to, step)`. `Ok(None)`:
/// proven impossible; `Err`: time limit.
#[allow(clippy::type_complexity)]
pub(super) fn decompose(
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
    model = with_chunk_rows(model, &x, &link_list, n, origin);
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
pub(super) fn decompose_residual(
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
    model = with_chunk_rows(model, &x, &link_list, n, origin);
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
