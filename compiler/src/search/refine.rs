//! The refine phase: interpolated times close to a size's best, simulated after all.

use super::context::Costed;
use super::options::Options;
use super::par::par_map;
use super::ready::Ready;
use super::select::{TIE, winner_at};
use crate::cost::{Simulator, runs_for};

/// What [`refine`] did, for the report.
#[derive(Debug, Default)]
pub(super) struct Refined {
    /// (candidate, size) pairs simulated.
    pub(super) simulated: usize,
    /// Pairs the last round left for want of steps ([`REFINE_BUDGET`]).
    pub(super) left: usize,
    /// Sizes not refined because their best is within [`REFINE_SLACK`] of the bound.
    pub(super) near_bound: usize,
    /// Runs stopped past their size's best time ([`Costed::cut`]).
    pub(super) cut: usize,
}

/// Rounds of [`refine`].
const REFINE_ROUNDS: usize = 3;
/// Interpolated candidates [`refine`] simulates per size and round, best first.
const REFINE_PER_SIZE: usize = 3;
/// How far above the best time at a size an interpolated time may be and still be refined:
/// a pipeline's time is convex in the size where its pieces fall below a connection's
/// latency (two slots stop covering it), so the chord between samples overestimates it
/// there (a 432-piece rail schedule on the 4-node H100 cluster: 25% at 1 GiB between
/// samples at 1 KiB and 4 GiB).
const REFINE_FACTOR: f64 = 1.3;

/// Steps [`refine`] may simulate per collective, in units of the per-candidate budget
/// ([`sim_budget`](super::sim_budget): it shrinks beyond [`SCALE_RANKS`](super::SCALE_RANKS), and so does refining).
pub(super) const REFINE_BUDGET: usize = 10;
/// Steps [`carry_down`] may simulate per collective for candidates other than the winners
/// it carries, in the same units as [`REFINE_BUDGET`].
pub(super) const CARRY_BUDGET: usize = 1;
/// Sizes whose best time is within this fraction of the lower bound are not refined.
const REFINE_SLACK: f64 = 0.01;

/// Simulates, at each size, the candidates whose time there is interpolated (their
/// schedules too large to simulate at every size within the budget) and within
/// [`REFINE_FACTOR`] of the size's best, [`REFINE_PER_SIZE`] at a time from the fastest,
/// for up to [`REFINE_ROUNDS`] rounds and `steps_left` simulated steps (the closest to
/// their size's best first), except where the best is within [`REFINE_SLACK`] of
/// `bound_us`: winners are then decided on simulated times wherever the decision is close
/// and matters, not on a chord across sizes far apart.
///
/// A run stops once it is past the best simulated time at its size (over every candidate
/// that may win, and the protocols of its own candidate run before it there), and its time
/// is left infinite and recorded in [`Costed::cut`]: it could not have won (a time equal to
/// the best runs to its end, and ties go to the earlier candidate and protocol as before).
/// Simulated times never change later, so what wins is what running every refined pair to
/// its end gives; where a time of a stopped run is read after all (a winner's cost fit, a
/// winner that fails verification), [`uncut`] runs it to its end. Candidates for which
/// `whole` holds (NCCL's families, whose every time the baseline reads) run to their end.
pub(super) fn refine(
    sim: &Simulator,
    costed: &mut [Costed],
    sizes: &[u64],
    options: &Options,
    (mut steps_left, whole): (usize, &dyn Fn(&Costed) -> bool),
    bound_us: &mut dyn FnMut(usize) -> f64,
) -> Refined {
    let mut refined = Refined::default();
    let mut near_bound: Vec<usize> = Vec::new();
    let np = options.protocols.len();
    let time =
        |c: &Costed, si: usize, p: usize| c.times[p].as_ref().map_or(f64::INFINITY, |t| t[si]);
    for _ in 0..REFINE_ROUNDS {
        // (time over the size's best, candidate, size) of the pairs to simulate.
        let mut wanted: Vec<(f64, usize, usize)> = Vec::new();
        for si in 0..sizes.len() {
            let live = |c: &&Costed| c.selectable && c.verified != Some(false);
            let best = costed
                .iter()
                .filter(live)
                .flat_map(|c| (0..np).map(move |p| time(c, si, p)))
                .fold(f64::INFINITY, f64::min);
            if !best.is_finite() {
                continue;
            }
            let mut near: Vec<(f64, usize)> = costed
                .iter()
                .enumerate()
                .filter(|(_, c)| live(c) && !c.exact[si])
                .map(|(i, c)| {
                    let t = (0..np)
                        .map(|p| time(c, si, p))
                        .fold(f64::INFINITY, f64::min);
                    (t, i)
                })
                .filter(|&(t, _)| t <= best * REFINE_FACTOR)
                .collect();
            // Nothing can gain more than the slack where the best is that near the bound.
            if near.is_empty() {
                continue;
            }
            if best <= bound_us(si) * (1.0 + REFINE_SLACK) {
                near_bound.push(si);
                continue;
            }
            near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            wanted.extend(
                near.iter()
                    .take(REFINE_PER_SIZE)
                    .map(|&(t, i)| (t / best, i, si)),
            );
        }
        // The closest first, within the steps left to simulate.
        wanted.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        refined.left = 0;
        for (_, c, si) in wanted {
            let cost = costed[c].candidate.work_steps().max(1) as usize * np;
            if cost > steps_left {
                refined.left += 1;
                continue;
            }
            steps_left -= cost;
            jobs.push((c, si));
        }
        near_bound.sort_unstable();
        near_bound.dedup();
        refined.near_bound = near_bound.len();
        if jobs.is_empty() {
            return refined;
        }
        refined.simulated += jobs.len();
        // The best simulated time at each size among the candidates that may win.
        let limits: Vec<f64> = (0..sizes.len())
            .map(|si| {
                costed
                    .iter()
                    .filter(|c| c.selectable && c.verified != Some(false) && c.exact[si])
                    .flat_map(|c| (0..np).map(move |p| time(c, si, p)))
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let whole_of: Vec<bool> = costed.iter().map(whole).collect();
        // One preparation per candidate, its sizes together.
        let mut by: Vec<(usize, Vec<usize>)> = Vec::new();
        jobs.sort_unstable();
        for (c, si) in jobs {
            match by.last_mut() {
                Some((last, list)) if *last == c => list.push(si),
                _ => by.push((c, vec![si])),
            }
        }
        let results = par_map(&by, |&(c, ref list)| {
            runs_for("refine");
            let stops = !whole_of[c];
            let c = &costed[c];
            let Ok(prepared) = Ready::new(sim, &c.candidate) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for &si in list {
                let limit = stops.then_some(limits[si]);
                let runs = run_protocols(sim, (&prepared, c), (sizes[si], options), limit);
                out.extend(runs.into_iter().map(|(p, t, cut)| (si, p, t, cut)));
            }
            out
        });
        for ((c, list), out) in by.iter().zip(results) {
            for (si, p, t, cut) in out {
                if let Some(times) = costed[*c].times[p].as_mut() {
                    times[si] = t;
                }
                if cut {
                    costed[*c].cut.push((si, p));
                    refined.cut += 1;
                }
            }
            for &si in list {
                costed[*c].exact[si] = true;
            }
        }
    }
    refined
}

/// How far below its least size ([`Candidate::min_bytes`](crate::families::Candidate::min_bytes))
/// [`carry_down`] simulates a candidate: a factor of sizes. The families' floors are where
/// pieces stop competing as a rule (4 KiB a chunk for the rail schedules, 16 KiB a piece
/// for the synthesized AllToAll); a quarter of them is still a message worth its latency,
/// while far below (a 2048-piece AllToAll at 1 KiB, half a byte a piece) the model's times
/// are nothing a schedule should be chosen on.
const CARRY_SPAN: u64 = 4;

/// Sizes just below the ones a candidate was simulated at, simulated where it may win there.
/// From the largest size down, at each size it simulates (every protocol, runs stopped past
/// the size's best as [`refine`]'s are, recorded in [`Costed::cut`]):
/// - the next larger size's winner, where the best here is slower than that winner's time
///   there and its time here was never simulated (interpolated, or below its least size):
///   a schedule moves less data at the smaller size, so it usually comes in under both;
/// - every candidate whose least size ([`Candidate::min_bytes`](crate::families::Candidate::min_bytes))
///   is above this size by at most [`CARRY_SPAN`] and whose line through its two smallest
///   simulated sizes, extended to this one, comes within [`REFINE_FACTOR`] of the best
///   here, closest first, within `steps_left` simulated steps in all (deep pipelines of
///   100k steps on the 4-node cluster cost a tenth of a second a run).
///
/// The families' least sizes are where their pieces stop competing as a rule, and just
/// below them the rule is often wrong: on the 4-node H100 cluster, Reduce at 512 KiB took a
/// rail chain of 54.8 µs while the rail tree winning 1 MiB runs 512 KiB in 41.3 µs.
/// Returns how many `(candidate, size)` pairs it simulated.
pub(super) fn carry_down(
    sim: &Simulator,
    costed: &mut [Costed],
    sizes: &[u64],
    options: &Options,
    mut steps_left: usize,
) -> usize {
    runs_for("carry down");
    let np = options.protocols.len();
    let mut simulated = 0;
    let mut ready: Vec<Option<Ready>> = (0..costed.len()).map(|_| None).collect();
    for si in (0..sizes.len().saturating_sub(1)).rev() {
        let here = |costed: &[Costed]| winner_at(costed, si, np).map_or(f64::INFINITY, |w| w.0);
        // Below its least size within the span, and not carried there yet.
        let below = |c: &Costed| {
            let least = c.candidate.min_bytes;
            let ran = c.cut.iter().any(|&(sj, _)| sj == si)
                || c.times.iter().flatten().any(|t| t[si].is_finite());
            sizes[si] < least && sizes[si].saturating_mul(CARRY_SPAN) >= least && !ran
        };
        let mut wanted: Vec<(f64, usize)> = Vec::new();
        if let Some((above, c, _)) = winner_at(costed, si + 1, np)
            && here(costed) > above + above.abs() * TIE
            && (below(&costed[c]) || !costed[c].exact[si])
        {
            wanted.push((f64::NEG_INFINITY, c));
        }
        let limit = here(costed) * REFINE_FACTOR;
        for (c, costed) in costed.iter().enumerate() {
            if costed.selectable && below(costed) && !wanted.iter().any(|w| w.1 == c) {
                let guess = extended(costed, sizes, si);
                if guess <= limit {
                    wanted.push((guess, c));
                }
            }
        }
        wanted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (guess, c) in wanted {
            let cost = costed[c].candidate.work_steps().max(1) as usize * np;
            if guess.is_finite() {
                // The next size's winner is always carried; the others within the budget.
                if cost > steps_left {
                    continue;
                }
                steps_left -= cost;
            }
            if ready[c].is_none() {
                ready[c] = Ready::new(sim, &costed[c].candidate).ok();
            }
            let Some(prepared) = &ready[c] else {
                continue;
            };
            simulated += 1;
            let limit = Some(here(costed));
            let runs = run_protocols(sim, (prepared, &costed[c]), (sizes[si], options), limit);
            for (p, t, cut) in runs {
                if let Some(times) = costed[c].times[p].as_mut() {
                    times[si] = t;
                }
                if cut {
                    costed[c].cut.push((si, p));
                }
            }
            costed[c].exact[si] = true;
        }
    }
    simulated
}

/// Runs candidate `c` (prepared as `prepared`) at `bytes` under every protocol it has times
/// for, in the options' order: `(protocol index, µs, stopped)`. With a `limit`, each run is
/// given up past the best time so far (the limit, then the earlier protocols' times) and
/// its time is infinite, `stopped`; without one, every run goes to its end. A run that fails
/// is infinite.
fn run_protocols(
    sim: &Simulator,
    (prepared, c): (&Ready, &Costed),
    (bytes, options): (u64, &Options),
    mut limit: Option<f64>,
) -> Vec<(usize, f64, bool)> {
    let mut out = Vec::new();
    for (p, &protocol) in options.protocols.iter().enumerate() {
        if c.times[p].is_none() {
            continue;
        }
        let t = match limit {
            Some(l) => match prepared.run_within(sim, (bytes, protocol), l, false) {
                Ok(Some(e)) => e.time_us,
                Ok(None) => {
                    out.push((p, f64::INFINITY, true));
                    continue;
                }
                Err(_) => f64::INFINITY,
            },
            None => prepared
                .run(sim, bytes, protocol)
                .map_or(f64::INFINITY, |e| e.time_us),
        };
        limit = limit.map(|l| l.min(t));
        out.push((p, t, false));
    }
    out
}

/// A candidate's time at size index `si` on the line through its two smallest sizes above
/// `si` with a finite time (at its best protocol at each), never below 0; infinite with
/// fewer than two.
fn extended(c: &Costed, sizes: &[u64], si: usize) -> f64 {
    let best = |sj: usize| {
        c.times
            .iter()
            .flatten()
            .map(|t| t[sj])
            .fold(f64::INFINITY, f64::min)
    };
    let mut known = (si + 1..sizes.len())
        .filter(|&sj| c.exact[sj])
        .map(|sj| (sizes[sj] as f64, best(sj)))
        .filter(|&(_, t)| t.is_finite());
    let (Some((x0, t0)), Some((x1, t1))) = (known.next(), known.next()) else {
        return f64::INFINITY;
    };
    let slope = (t1 - t0) / (x1 - x0);
    (t0 - slope * (x0 - sizes[si] as f64)).max(0.0)
}

/// Runs to their end the runs [`refine`] stopped past their size's best ([`Costed::cut`]) of
/// candidate `c`: those at the size indices `at` under protocol `protocol` (every one when
/// `None`), so the times read are the ones running every refined pair to its end gives.
/// Returns how many it ran.
pub(super) fn uncut(
    sim: &Simulator,
    costed: &mut Costed,
    sizes: &[u64],
    options: &Options,
    (at, protocol): (Option<&[usize]>, Option<usize>),
) -> usize {
    let wanted = |&(si, p): &(usize, usize)| {
        at.is_none_or(|at| at.contains(&si)) && protocol.is_none_or(|q| q == p)
    };
    runs_for("uncut: stopped runs to their end");
    let todo: Vec<(usize, usize)> = costed.cut.iter().copied().filter(wanted).collect();
    if todo.is_empty() {
        return 0;
    }
    costed.cut.retain(|e| !wanted(e));
    let prepared = Ready::new(sim, &costed.candidate).ok();
    for &(si, p) in &todo {
        let t = prepared.as_ref().map_or(f64::INFINITY, |r| {
            r.run(sim, sizes[si], options.protocols[p])
                .map_or(f64::INFINITY, |e| e.time_us)
        });
        if let Some(times) = costed.times[p].as_mut() {
            times[si] = t;
        }
    }
    todo.len()
}
