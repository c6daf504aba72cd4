//! The cost phase: every kept candidate at every size and protocol, within the
//! per-candidate simulation budget ([`sim_budget`]), interpolated between sampled sizes
//! beyond it.

use super::context::{Costed, Search, Whole};
use super::options::{Options, Progress};
use super::par::par_map;
use super::ready::Ready;
use super::report::{Counts, StopReason, trace_candidate, tracing};
use super::screen::Probe;
use crate::cost::{NcclChoice, Simulator, runs_for};
use crate::families::Candidate;
use hccl_ir::{CollectiveKind, Protocol};

/// Where the cost phase reports progress: after each costed candidate, as
/// `(candidates done, candidates in all)` of the collective `kind`, the `index`-th of the
/// options' collectives.
pub(super) struct Tick<'p> {
    pub(super) kind: CollectiveKind,
    pub(super) index: usize,
    pub(super) progress: &'p mut dyn FnMut(Progress),
}

/// The cost phase: the candidates the screen kept costed (NCCL's `simulated` families at
/// every protocol), the others with no time; in candidate order, reporting progress after
/// each. `None` when cancelled. Also returns what stopped candidates.
///
/// It runs in two waves. The first costs the baseline's simulated families (kept and costed
/// at every protocol whatever their times), the cheapest first in batches of
/// [`FIRST_WAVE_BATCH`], each run stopped where it could be neither the baseline nor a
/// winner ([`BaselineLimits`]); `nccl` is NCCL's choice at each size. The best time of
/// its selectable candidates at each size is then a time the winner there cannot exceed,
/// and so are the screen's probes of selectable candidates. The second wave costs every
/// other candidate simulated at every size with that limit ([`Simulator::run_within`]): a
/// run past it stops there and the time is left infinite (it could not have won). It takes
/// the candidates in batches of [`SECOND_WAVE_BATCH`], those whose probes came closest to
/// their size's limit first, and lowers the limits to the simulated times of each batch
/// before the next: the rail and tree schedules of a cluster beat the baseline's ring by
/// 2.5× at large sizes, and the candidates after them stop that much earlier. The
/// candidates too large to simulate at every size run last, sampled only among the sizes
/// where no lower bound puts them past the limits (see [`cost_sampled`]). What the
/// winners' cost fits read of their neighbouring sizes is filled in afterwards
/// ([`complete`]), and a collective whose winner fails verification is costed again
/// without limits; so the plan is the one costing every candidate in full gives.
pub(super) fn run(
    search: &Search<'_>,
    candidates: Vec<(Candidate, bool)>,
    probes: &[Probe],
    (simulated, nccl): (&[&str], &[Option<NcclChoice>]),
    budget: usize,
    tick: Tick<'_>,
) -> Option<(Vec<Costed>, Counts)> {
    let options = search.options;
    let sizes = &search.sizes;
    let baseline = |c: &Candidate| simulated.iter().any(|b| c.algorithm == *b);
    let cost = |i: usize, limits: Limits<'_>| {
        let candidate = &candidates[i].0;
        if probes[i].keep && !options.cancelled() {
            let started = std::time::Instant::now();
            let out = cost_sampled(
                &search.sim,
                candidate,
                sizes,
                options,
                budget,
                Some(&probes[i]),
                (!baseline(candidate), limits),
            );
            let shown = if tracing() {
                let best = out
                    .times
                    .iter()
                    .flatten()
                    .flatten()
                    .fold(f64::INFINITY, |a, &b| a.min(b));
                format!(", best {best:.2} us")
            } else {
                String::new()
            };
            trace_candidate("cost", candidate, started, &shown);
            out
        } else {
            Sampled::none(options.protocols.len(), sizes.len())
        }
    };
    let (mut first, second): (Vec<usize>, Vec<usize>) =
        (0..candidates.len()).partition(|&i| baseline(&candidates[i].0));
    let mut all: Vec<Option<Sampled>> = (0..candidates.len()).map(|_| None).collect();
    let selectable = |i: usize| candidates[i].1;
    // The first wave, cheapest first, in batches under limits from the batches before it
    // ([`BaselineLimits`]).
    first.sort_by_key(|&i| (candidates[i].0.work_steps(), i));
    let mut first_limits = BaselineLimits::new(&options.protocols, sizes.len());
    for batch in first.chunks(FIRST_WAVE_BATCH) {
        let tables: Vec<Vec<Vec<f64>>> = batch
            .iter()
            .map(|&i| first_limits.of(&candidates[i].0.algorithm, nccl))
            .collect();
        let jobs: Vec<(usize, &Vec<Vec<f64>>)> = batch.iter().copied().zip(&tables).collect();
        let first_wave = |&(i, table): &(usize, &Vec<Vec<f64>>)| {
            runs_for(COST_BASELINE);
            cost(i, Limits::Runs(table))
        };
        for (&i, out) in batch.iter().zip(par_map(&jobs, first_wave)) {
            first_limits.lower(&candidates[i].0.algorithm, selectable(i), &out);
            all[i] = Some(out);
        }
    }
    // The limit at each size: the best time of a selectable candidate so far (the first
    // wave's, the screen's probes, then the simulated ones of each batch of the second).
    let mut limits = vec![f64::INFINITY; sizes.len()];
    for &i in first.iter().filter(|&&i| selectable(i)) {
        if let Some(out) = &all[i] {
            lower_limits(&mut limits, out, false);
        }
    }
    for i in (0..candidates.len()).filter(|&i| selectable(i)) {
        for &(si, _, t) in &probes[i].known {
            limits[si] = limits[si].min(t);
        }
    }
    let (second, sampled) =
        second_wave_order(search, (&candidates, probes), &limits, second, budget);
    let batches = second
        .chunks(SECOND_WAVE_BATCH)
        .map(|b| (b, COST_WHOLE))
        .chain(std::iter::once((&sampled[..], COST_SAMPLED)));
    for (batch, purpose) in batches {
        let second_wave = |&i: &usize| {
            runs_for(purpose);
            cost(i, Limits::Sizes(&limits))
        };
        for (&i, out) in batch.iter().zip(par_map(batch, second_wave)) {
            if selectable(i) {
                lower_limits(&mut limits, &out, true);
            }
            all[i] = Some(out);
        }
    }
    if options.cancelled() {
        return None;
    }
    let total = candidates.len();
    let mut costed = Vec::with_capacity(total);
    let mut limited = 0;
    for (i, ((candidate, selectable), out)) in candidates.into_iter().zip(all).enumerate() {
        let out = out.unwrap_or_else(|| Sampled::none(options.protocols.len(), sizes.len()));
        limited += usize::from(out.limited);
        costed.push(Costed {
            candidate,
            selectable,
            times: out.times,
            exact: out.exact,
            limited: out.limited,
            cut: Vec::new(),
            verified: None,
        });
        (tick.progress)(Progress {
            collective: tick.kind,
            done: i + 1,
            total,
            collectives_done: tick.index,
            collectives_total: options.collectives.len(),
        });
    }
    let kept: Vec<&Costed> = costed
        .iter()
        .zip(probes)
        .filter(|(_, p)| p.keep)
        .map(|(c, _)| c)
        .collect();
    let interpolated = kept.iter().filter(|c| c.exact.contains(&false)).count();
    // No time anywhere: for want of one, or (limited) past the limits at every size.
    let timeless = |c: &Costed| !c.times.iter().flatten().flatten().any(|t| t.is_finite());
    let not_costable = kept.iter().filter(|c| timeless(c) && !c.limited).count();
    let hopeless = kept.iter().filter(|c| timeless(c) && c.limited).count();
    let stops = vec![
        (StopReason::SimBudget, interpolated),
        (StopReason::NotCostable, not_costable),
        (StopReason::PastBaseline, limited),
        (StopReason::PastEverywhere, hopeless),
    ];
    Some((costed, stops))
}

/// What stops the runs of a candidate costed by [`cost_sampled`].
#[derive(Clone, Copy)]
pub(super) enum Limits<'a> {
    /// Every run to its end.
    None,
    /// A time per size: a run past its size's stops there (infinite), and a candidate too
    /// large to simulate at every size is sampled among the sizes within their reach
    /// ([`in_reach`]), its runs not stopped.
    Sizes(&'a [f64]),
    /// A time per protocol and size (`[protocol][size]`) where the candidate is simulated at
    /// every size; else every run to its end, at every size (the first wave's, whose
    /// families NCCL's choice reads).
    Runs(&'a [Vec<f64>]),
}

/// Candidates of the cost phase's first wave (NCCL's families) costed between two updates
/// of their limits (a fixed number, so that the plan does not depend on the thread count).
const FIRST_WAVE_BATCH: usize = 2;

/// The limits of the first wave's runs (NCCL's families: every one of their schedules that
/// is simulated at every size, costed at every protocol), from the simulated times of its
/// batches so far. A run of a family's schedule under a protocol at a size stops once it is
/// past
/// - where NCCL's choice at that size is this family and protocol: the family's best time
///   there so far, since the baseline is the family's best time under NCCL's protocol;
/// - elsewhere: the best time of a selectable candidate there so far, under any protocol.
///
/// A run stopped so could neither be the baseline nor win its size: what it would have
/// given is not read, as no stopped run of the second wave is (a winner's neighbouring
/// sizes are costed again, [`complete`], and so is everything when a winner fails
/// verification). Only simulated times lower a limit: an interpolated one may be replaced
/// later by a slower simulated one, and the winner or the baseline with it.
struct BaselineLimits<'a> {
    /// Protocols costed.
    protocols: &'a [Protocol],
    /// Per family seen: its best simulated time, `[protocol][size]`.
    family: Vec<(String, Vec<Vec<f64>>)>,
    /// Per size: the best simulated time of a selectable candidate.
    selectable: Vec<f64>,
}

impl<'a> BaselineLimits<'a> {
    fn new(protocols: &'a [Protocol], sizes: usize) -> BaselineLimits<'a> {
        BaselineLimits {
            protocols,
            family: Vec::new(),
            selectable: vec![f64::INFINITY; sizes],
        }
    }

    /// The limits of a schedule of `family`, `[protocol][size]`; `nccl` is NCCL's choice at
    /// each size.
    fn of(&self, family: &str, nccl: &[Option<NcclChoice>]) -> Vec<Vec<f64>> {
        let own = self.family.iter().find(|(f, _)| f == family).map(|f| &f.1);
        (self.protocols.iter().enumerate())
            .map(|(p, &protocol)| {
                (0..self.selectable.len())
                    .map(|si| match nccl.get(si).copied().flatten() {
                        Some(ch) if ch.algo.family() == family && ch.protocol == protocol => {
                            own.map_or(f64::INFINITY, |own| own[p][si])
                        }
                        _ => self.selectable[si],
                    })
                    .collect()
            })
            .collect()
    }

    /// Lowers the limits to the simulated times of a schedule of `family` (`selectable`:
    /// whether it may win).
    fn lower(&mut self, family: &str, selectable: bool, out: &Sampled) {
        let (np, sizes) = (self.protocols.len(), self.selectable.len());
        let k = match self.family.iter().position(|(f, _)| f == family) {
            Some(k) => k,
            None => {
                self.family
                    .push((family.to_string(), vec![vec![f64::INFINITY; sizes]; np]));
                self.family.len() - 1
            }
        };
        for (p, times) in out.times.iter().enumerate() {
            let Some(times) = times else { continue };
            for (si, &t) in times.iter().enumerate() {
                if !out.exact[si] {
                    continue;
                }
                let best = &mut self.family[k].1[p][si];
                *best = best.min(t);
                if selectable {
                    self.selectable[si] = self.selectable[si].min(t);
                }
            }
        }
    }
}

/// Lowers `limits` to the times of `out` at each size: only its simulated ones with
/// `simulated_only`, else its interpolated ones too (the first wave's, as before).
fn lower_limits(limits: &mut [f64], out: &Sampled, simulated_only: bool) {
    for times in out.times.iter().flatten() {
        for (si, (limit, &t)) in limits.iter_mut().zip(times).enumerate() {
            if out.exact[si] || !simulated_only {
                *limit = limit.min(t);
            }
        }
    }
}

/// The simulated-steps budget of a candidate costed as a template (one rank class, whose
/// steps do not grow with the ranks as a whole schedule's do, so neither does its budget;
/// see [`sim_budget`]) or as a whole schedule.
fn class_budget(budget: usize, options: &Options, template: bool) -> usize {
    if template {
        budget.max(options.sim_budget)
    } else {
        budget
    }
}

/// The second wave of [`run`] in the order it is costed: the candidates simulated at every
/// size, the most promising first (the least ratio of a screen probe's time to its size's
/// limit), so that the others run under limits that are tight early; and apart, those too
/// large to simulate at every size, interpolated between samples whose runs are never
/// stopped by a limit (the limits only choose the sizes they are sampled among, see
/// [`cost_sampled`]), which wait for no batch and run last, the dearest first.
fn second_wave_order(
    search: &Search<'_>,
    (candidates, probes): (&[(Candidate, bool)], &[Probe]),
    limits: &[f64],
    second: Vec<usize>,
    budget: usize,
) -> (Vec<usize>, Vec<usize>) {
    let (sizes, options) = (&search.sizes, search.options);
    let promise = |i: usize| {
        probes[i]
            .known
            .iter()
            .map(|&(si, _, t)| t / limits[si])
            .fold(f64::INFINITY, f64::min)
    };
    let (mut whole, sampled): (Vec<usize>, Vec<usize>) = second.into_iter().partition(|&i| {
        let c = &candidates[i].0;
        let first = sizes.partition_point(|&s| s < c.min_bytes);
        let n = sizes.len() - first;
        let budget = class_budget(budget, options, c.template.is_some());
        sample_indices(n, c.work_steps() as usize, budget).len() == n
    });
    whole.sort_by(|&a, &b| promise(a).total_cmp(&promise(b)).then(a.cmp(&b)));
    // The dearest first (by the screen's time for its probes), so that the cores finish
    // together rather than one of them running the dearest alone at the end: on the 4-node
    // H100 cluster, a 31-tree packing's samples take 1.3 s where most others take 0.1-0.4 s.
    // They run in one batch under the same limits, so the order changes no result.
    let mut sampled = sampled;
    sampled.sort_by(|&a, &b| probes[b].secs.total_cmp(&probes[a].secs).then(a.cmp(&b)));
    (whole, sampled)
}

/// Costs again, without limits, what the waves of [`run`] left out: for the candidates
/// `which` that they limited, at the size indices `at` (every size when `None`), every
/// protocol as costing them in full would have (with what the screen found, `probes`; no
/// protocol pruned for those `whole` holds of, NCCL's families). Returns how many
/// candidates it costed.
pub(super) fn complete(
    search: &Search<'_>,
    (costed, probes): (&mut [Costed], &[Probe]),
    (which, whole): (&[usize], &Whole<'_>),
    at: Option<&[usize]>,
    budget: usize,
) -> usize {
    let (sizes, options) = (&search.sizes, search.options);
    let todo: Vec<usize> = which
        .iter()
        .copied()
        .filter(|&c| costed[c].limited)
        .collect();
    // NCCL's families at every protocol (NCCL's choice reads them), as the first wave.
    let prunes: Vec<bool> = todo.iter().map(|&c| !whole(&costed[c])).collect();
    let jobs: Vec<(usize, bool)> = todo.iter().copied().zip(prunes).collect();
    let found = par_map(&jobs, |&(c, prune)| {
        runs_for(COMPLETE);
        let candidate = &costed[c].candidate;
        let Some(at) = at else {
            let out = cost_sampled(
                &search.sim,
                candidate,
                sizes,
                options,
                budget,
                Some(&probes[c]),
                (prune, Limits::None),
            );
            return Some((out.times, Some(out.exact)));
        };
        let owned;
        let ready = match &probes[c].ready {
            Some(r) => r,
            None => {
                owned = Ready::new(&search.sim, candidate).ok()?;
                &owned
            }
        };
        let mut times = costed[c].times.clone();
        let order = protocol_order(&search.sim, options);
        for &si in at.iter().filter(|&&si| sizes[si] >= candidate.min_bytes) {
            let mut lists: Vec<Option<SizeTimes>> = vec![Some(Vec::new()); times.len()];
            cost_size(
                (&search.sim, ready, options),
                (si, sizes),
                &order,
                (&probes[c].known, prune, &|_| f64::INFINITY),
                (&mut lists, &mut Courses::new(times.len())),
            );
            for (list, times) in lists.into_iter().zip(times.iter_mut()) {
                match (list.and_then(|l| l.first().copied()), times) {
                    (Some((_, t)), Some(times)) => times[si] = t,
                    (None, times) => *times = None,
                    (Some(_), None) => {}
                }
            }
        }
        Some((times, None))
    });
    for (&c, found) in todo.iter().zip(found) {
        if let Some((times, exact)) = found {
            costed[c].times = times;
            if let Some(exact) = exact {
                // Sizes out of its reach are costed now (or interpolated).
                costed[c].exact = exact;
            }
        }
        if at.is_none() {
            costed[c].limited = false;
            // Costed anew: what `carry_down` ran below its least size is gone with the
            // times, its stopped runs too (it runs them again where it still wants them).
            let least = costed[c].candidate.min_bytes;
            costed[c].cut.retain(|&(si, _)| sizes[si] >= least);
        }
    }
    todo.len()
}

/// What the cost phase's runs are tallied under ([`runs_for`]; `HCCL_SEARCH_TRACE` prints the
/// tally): the first wave, the second's candidates simulated at every size, its sampled
/// ones, and the runs [`complete`] makes.
const COST_BASELINE: &str = "cost: NCCL's families";
const COST_WHOLE: &str = "cost: every size, within limits";
const COST_SAMPLED: &str = "cost: sampled sizes";
const COMPLETE: &str = "complete: runs without limits";

/// Candidates of the cost phase's second wave costed between two updates of its limits (a
/// fixed number, so that the plan does not depend on the thread count).
const SECOND_WAVE_BATCH: usize = 4;

/// Rank count above which the per-candidate simulation budget shrinks (see [`sim_budget`]).
pub const SCALE_RANKS: u32 = 64;

/// The simulated-steps budget per candidate and protocol on `nranks` ranks: `budget` up to
/// [`SCALE_RANKS`] ranks, then shrinking as `1/nranks` (a schedule's step count grows at least
/// linearly with the ranks, so this keeps the number of simulations per candidate roughly
/// constant while each costs more); large schedules are then simulated at fewer sizes and
/// interpolated.
pub fn sim_budget(budget: usize, nranks: u32) -> usize {
    if nranks <= SCALE_RANKS {
        budget
    } else {
        budget.saturating_mul(SCALE_RANKS as usize) / nranks as usize
    }
}

/// What [`cost_sampled`] found of one candidate.
pub(super) struct Sampled {
    /// `times[p][s]`: predicted µs under protocol `p` at size `s` (`None`: the protocol
    /// failed to simulate).
    pub(super) times: Vec<Option<Vec<f64>>>,
    /// Per size, whether its times were simulated (or are known, or cannot be had: below the
    /// candidate's least size, or out of its reach) rather than interpolated.
    pub(super) exact: Vec<bool>,
    /// Whether some time was left infinite for being past its size's limit, or out of reach
    /// of it.
    pub(super) limited: bool,
}

impl Sampled {
    /// No time anywhere.
    fn none(np: usize, nsizes: usize) -> Sampled {
        Sampled {
            times: vec![None; np],
            exact: vec![true; nsizes],
            limited: false,
        }
    }
}

/// Predicted times of one candidate at every size, per protocol, simulating at most
/// `budget` steps per protocol (see [`sample_indices`]); what the screen found (`screened`:
/// the times it simulated, used instead of simulating again, and the schedule as it prepared
/// it) is reused. Sizes below the candidate's
/// [`Candidate::min_bytes`] are not simulated and get an infinite time. With `prune`, a
/// protocol that cannot be the candidate's best at a size is not simulated there
/// ([`cost_size`]; never for the baseline families, whose per-protocol times NCCL's choice
/// reads). With `limits` (a time per size) and every size simulated, a run past its size's
/// limit stops there and its time is infinite. With `limits` and too many steps to simulate
/// every size, the samples are taken among the sizes within its reach ([`in_reach`]) and
/// run to their end; the others are infinite (and `limited`).
///
/// The sampled sizes are costed ends first, then midpoints ([`bisection_order`]); a size
/// between two full runs of a protocol that took the same course takes its time from them
/// instead of a run ([`Courses`]). The times are those running every size gives, to
/// rounding.
pub(super) fn cost_sampled(
    sim: &Simulator,
    candidate: &Candidate,
    sizes: &[u64],
    options: &Options,
    budget: usize,
    screened: Option<&Probe>,
    (prune, limits): (bool, Limits<'_>),
) -> Sampled {
    let known: &[(usize, usize, f64)] = screened.map_or(&[], |p| &p.known);
    let ready = screened.and_then(|p| p.ready.as_ref());
    let np = options.protocols.len();
    let first = sizes.partition_point(|&s| s < candidate.min_bytes);
    if first == sizes.len() {
        return Sampled::none(np, sizes.len());
    }
    let owned;
    let prepared = match ready {
        Some(r) => r,
        None => match Ready::new(sim, candidate) {
            Ok(r) => {
                owned = r;
                &owned
            }
            Err(_) => return Sampled::none(np, sizes.len()),
        },
    };
    let budget = class_budget(budget, options, matches!(prepared, Ready::Template(_)));
    let order = protocol_order(sim, options);
    let every = sample_indices(sizes.len() - first, prepared.step_count(), budget).len()
        == sizes.len() - first;
    // The sizes it is costed at: from its least size, those where it might win (every one
    // when it is simulated at every size, each run then stopped past its limit).
    let reach: Vec<usize> = match (limits, prepared) {
        (Limits::Sizes(limits), Ready::Full(p)) if !every => {
            in_reach(sim, p, (first, sizes), (&options.protocols, &order), limits)
        }
        _ => (first..sizes.len()).collect(),
    };
    let samples: Vec<usize> = sample_indices(reach.len(), prepared.step_count(), budget)
        .into_iter()
        .map(|i| reach[i])
        .collect();
    // Limits only where every size is simulated: an interpolated candidate's samples stay
    // what they are (refine reads them).
    let limits = if every { limits } else { Limits::None };
    // Times at the sampled sizes, per protocol; `None` once a protocol fails to simulate.
    let mut at: Vec<Option<SizeTimes>> = vec![Some(Vec::new()); np];
    let mut limited = false;
    // The ends first, then midpoints: a size between two runs of one course is had from
    // them ([`Courses`]).
    let mut courses = Courses::new(np);
    for k in bisection_order(samples.len()) {
        let si = samples[k];
        let limit = |p: usize| match limits {
            Limits::None => f64::INFINITY,
            Limits::Sizes(l) => l[si],
            Limits::Runs(l) => l[p][si],
        };
        limited |= cost_size(
            (sim, prepared, options),
            (si, sizes),
            &order,
            (known, prune, &limit),
            (&mut at, &mut courses),
        );
    }
    for list in at.iter_mut().flatten() {
        list.sort_unstable_by_key(|&(si, _)| si);
    }
    let mut reached = vec![false; sizes.len()];
    for &si in &reach {
        reached[si] = true;
    }
    // Below its least size or out of its reach (it cannot win there): decided, with no time
    // (see `complete`); within reach, simulated where sampled.
    let mut exact: Vec<bool> = reached.iter().map(|r| !r).collect();
    for &i in &samples {
        exact[i] = true;
    }
    limited |= reach.len() < sizes.len() - first;
    let times = at
        .into_iter()
        .map(|list| {
            list.map(|list| {
                let mut times = interpolate(sizes, &list);
                for (t, _) in times.iter_mut().zip(&reached).filter(|(_, r)| !**r) {
                    *t = f64::INFINITY;
                }
                times
            })
        })
        .collect();
    Sampled {
        times,
        exact,
        limited,
    }
}

/// The size indices from `first` at which a run of `prepared` under some protocol might come
/// in within its size's limit: those where no lower bound puts every protocol past it
/// ([`Simulator::bound_past`]). At the others it cannot win (the limits are times other
/// candidates reach), so a candidate interpolated between samples is sampled among these
/// only: on the 4-node H100 cluster, half the packed trees' schedules (100k steps a run)
/// are out of reach at every size of Broadcast and Reduce. The busiest link's and the
/// connections' bounds, cheap, are asked of every protocol first; the critical path, a walk
/// of every step, only of the protocols they leave, the most efficient first.
fn in_reach(
    sim: &Simulator,
    prepared: &crate::cost::Prepared,
    (first, sizes): (usize, &[u64]),
    (protocols, order): (&[hccl_ir::Protocol], &[usize]),
    limits: &[f64],
) -> Vec<usize> {
    (first..sizes.len())
        .filter(|&si| {
            let (bytes, limit) = (sizes[si], limits[si]);
            if !limit.is_finite() {
                return true;
            }
            // The same at every protocol: counted once.
            let loads = sim.resource_loads(prepared, bytes);
            let left: Vec<hccl_ir::Protocol> = order
                .iter()
                .map(|&pi| protocols[pi])
                .filter(|&p| !sim.cheap_bound_past(prepared, (bytes, p), limit, Some(&loads)))
                .collect();
            left.into_iter()
                .any(|p| !sim.path_bound_past(prepared, (bytes, p), limit))
        })
        .collect()
}

/// Protocols by falling efficiency.
fn protocol_order(sim: &Simulator, options: &Options) -> Vec<usize> {
    let mut order: Vec<usize> = (0..options.protocols.len()).collect();
    order.sort_by(|&a, &b| {
        sim.model
            .efficiency(options.protocols[b])
            .total_cmp(&sim.model.efficiency(options.protocols[a]))
    });
    order
}

/// A run's limit at one size, by protocol index.
type ProtocolLimit<'a> = dyn Fn(usize) -> f64 + 'a;

/// One protocol's times at the sizes costed so far: `(size index, µs)`.
type SizeTimes = Vec<(usize, f64)>;

/// One size of [`cost_sampled`]: every protocol in `order` (by falling efficiency), its time
/// appended to `at[protocol]` (`None` once a protocol fails). With `prune`, a protocol
/// whose lower bound (the busiest link at its efficiency, [`Simulator::lower_bound_us`])
/// already exceeds the best time reached at this size is not simulated (infinite): it cannot
/// be the candidate's best. A run past `limit` stops there (infinite too). `known` times
/// (the screen's) are taken as they are; a time on the line through two runs of one course
/// either side ([`Courses::affine`]) is taken as the run's, the limit applied as a run
/// would. Returns whether the limit cut a run.
fn cost_size(
    (sim, prepared, options): (&Simulator, &Ready, &Options),
    (si, sizes): (usize, &[u64]),
    order: &[usize],
    (known, prune, limit): (&[(usize, usize, f64)], bool, &ProtocolLimit<'_>),
    (at, courses): (&mut [Option<SizeTimes>], &mut Courses),
) -> bool {
    let bytes = sizes[si];
    let mut best = f64::INFINITY;
    // Whether a run at this size came in within the limit, ours or the screen's (the
    // resource loads then prune).
    let mut loaded = false;
    let mut limited = false;
    for &pi in order {
        let p = options.protocols[pi];
        let limit = limit(pi);
        let Some(list) = at[pi].as_mut() else {
            continue;
        };
        let t = if let Some(k) = known.iter().find(|&&(ks, kp, _)| ks == si && kp == pi) {
            // The screen's run of this size: its time prunes like one of ours.
            loaded |= k.2.is_finite();
            k.2
        } else if prune
            && loaded
            && let Some(loads) = courses.loads(bytes)
            && sim
                .lower_bound_us(&loads, bytes, p)
                .is_some_and(|lb| lb > best)
        {
            f64::INFINITY
        } else if let Some(t) = courses.affine(pi, si, sizes) {
            // What the run would give (to rounding), and past the limit as it would be.
            if t <= limit {
                loaded = true;
                t
            } else {
                limited = true;
                f64::INFINITY
            }
        } else {
            match prepared.run_within(sim, (bytes, p), limit, true) {
                Ok(Some(e)) => {
                    loaded = true;
                    courses.record(pi, (si, bytes), &e);
                    e.time_us
                }
                Ok(None) => {
                    limited = true;
                    f64::INFINITY
                }
                Err(_) => {
                    at[pi] = None;
                    continue;
                }
            }
        };
        best = best.min(t);
        list.push((si, t));
    }
    limited
}

/// One candidate's full runs, per protocol, by size: what sizes between two runs of the
/// same course take from them. A flow run's times are affine in the collective's size while
/// its course (the order of its events, [`Estimate::course`](crate::cost::Estimate::course))
/// stays the same, so at a size between two runs with one course the run would give the
/// time on the line through theirs: it is not simulated. Also the resource loads of a run
/// per byte of the collective (they are proportional to its size), for
/// [`Simulator::lower_bound_us`] at sizes had without a run.
struct Courses {
    /// Per protocol: `(size index, time µs, course)` of its full runs, by size.
    runs: Vec<Vec<(usize, f64, u64)>>,
    /// A run's resource loads divided by its size.
    loads_per_byte: Option<Vec<f64>>,
}

impl Courses {
    fn new(protocols: usize) -> Courses {
        Courses {
            runs: vec![Vec::new(); protocols],
            loads_per_byte: None,
        }
    }

    /// Notes a full run of protocol `p` at size index `si` (`bytes`).
    fn record(&mut self, p: usize, (si, bytes): (usize, u64), e: &crate::cost::Estimate) {
        if self.loads_per_byte.is_none() && bytes > 0 {
            let per = 1.0 / bytes as f64;
            self.loads_per_byte = Some(e.resource_bytes.iter().map(|b| b * per).collect());
        }
        if let Some(course) = e.course {
            let runs = &mut self.runs[p];
            let k = runs.partition_point(|r| r.0 < si);
            runs.insert(k, (si, e.time_us, course));
        }
    }

    /// Protocol `p`'s time at size index `si` from the closest runs either side, when they
    /// took the same course.
    fn affine(&self, p: usize, si: usize, sizes: &[u64]) -> Option<f64> {
        let runs = &self.runs[p];
        let k = runs.partition_point(|r| r.0 < si);
        let (lo, hi) = (runs.get(k.checked_sub(1)?)?, runs.get(k)?);
        if lo.2 != hi.2 || hi.0 == si {
            return None;
        }
        let (x0, x1, x) = (sizes[lo.0] as f64, sizes[hi.0] as f64, sizes[si] as f64);
        Some(lo.1 + (hi.1 - lo.1) * (x - x0) / (x1 - x0))
    }

    /// The resource loads of a run of `bytes`.
    fn loads(&self, bytes: u64) -> Option<Vec<f64>> {
        let b = bytes as f64;
        self.loads_per_byte
            .as_ref()
            .map(|per| per.iter().map(|l| l * b).collect())
    }
}

/// Positions `0..n` in the order [`cost_sampled`] costs them: both ends, then the midpoint
/// of each interval between positions already costed, breadth first (so that a midpoint's
/// neighbours either side are costed before it).
pub(super) fn bisection_order(n: usize) -> Vec<usize> {
    if n <= 2 {
        return (0..n).collect();
    }
    let mut order = vec![0, n - 1];
    let mut intervals = std::collections::VecDeque::from([(0, n - 1)]);
    while let Some((lo, hi)) = intervals.pop_front() {
        if hi - lo < 2 {
            continue;
        }
        let mid = lo + (hi - lo) / 2;
        order.push(mid);
        intervals.push_back((lo, mid));
        intervals.push_back((mid, hi));
    }
    order
}

/// Times at every size from times at sampled size indices (ascending): linear in bytes
/// between samples; infinite outside them and where either end is infinite.
pub(super) fn interpolate(sizes: &[u64], at: &[(usize, f64)]) -> Vec<f64> {
    let mut out = vec![f64::INFINITY; sizes.len()];
    for (k, &(i0, t0)) in at.iter().enumerate() {
        out[i0] = t0;
        let Some(&(i1, t1)) = at.get(k + 1) else {
            continue;
        };
        if !(t0.is_finite() && t1.is_finite()) {
            continue;
        }
        let (x0, x1) = (sizes[i0] as f64, sizes[i1] as f64);
        for i in i0 + 1..i1 {
            out[i] = t0 + (t1 - t0) * (sizes[i] as f64 - x0) / (x1 - x0);
        }
    }
    out
}

/// Which size indices to simulate: all when `steps × n ≤ budget`, else an even subsample
/// that always contains the first and the last.
pub(super) fn sample_indices(n: usize, steps: usize, budget: usize) -> Vec<usize> {
    let affordable = (budget / steps.max(1)).max(2);
    if n <= affordable {
        return (0..n).collect();
    }
    let k = affordable;
    let mut idx: Vec<usize> = (0..k).map(|j| j * (n - 1) / (k - 1)).collect();
    idx.dedup();
    idx
}
