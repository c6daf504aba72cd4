//! The solver of one instance ([`solve_base`]): the MILP model of sends per link and step
//! (relaxed, aggregated over symmetric origins, or exact; [`super::model`]), LP dives
//! ([`super::dive`]), and the decomposition of an aggregate solution into chunks, within one
//! time limit.

use super::decompose::{decompose, decompose_residual};
use super::dive::dive;
use super::model::{ModelKind, ModelSolution, solve_model};
use super::problem::{
    Algorithm, Instance, LinkMatrix, Perm, Solved, Stop, Transfer, automorphisms, cut_bound,
    least_steps,
};
use hccl_ir::Collective;
use std::collections::HashMap;
use std::time::Instant;

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
