//! LP dives: an integral point of the symmetric per-chunk model reached by fixing one
//! fractional send at a time, the LP solved again after each fix.

#[cfg(feature = "highs")]
use super::model::solve_model;
#[cfg(not(feature = "highs"))]
use super::model::{Class, build_model, read_solution};
use super::model::{Fixed, ModelKind, ModelSolution, SendKey};
use super::problem::{Instance, LinkMatrix, Perm};
#[cfg(not(feature = "highs"))]
use good_lp::{ResolutionError, Solution, SolverModel, Variable};
use std::collections::HashMap;
use std::time::Instant;

/// A diving heuristic over the symmetric per-chunk model with the rounds `split`: solve the
/// LP, fix the largest fractional send to 1 (to 0 when that makes the LP infeasible), until
/// the LP solution is integral; `earliest_first`: the fractional send of the earliest step
/// (then the largest). (Fixing every send the LP puts at 1 as well dives faster and dies on
/// DGX-1.) `Ok(Some)`: an algorithm (with
/// transfers); `Ok(None)` never (a dead end proves nothing); `Err`: dead end or time limit.
pub(super) fn dive(
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
