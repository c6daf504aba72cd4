//! The search as a pipeline of named phases, run per collective (side by side on small
//! machines, see [`SIDE_BY_SIDE_RANKS`]; the results joined in order): generate,
//! screen, cost, refine, select and verify, emit. Each phase is a function of its own
//! module with its own inputs and outputs; this module runs them and gathers the
//! [`SearchReport`].

use super::context::{Costed, Search, Whole, offered_options};
use super::costing::{self, Tick, sim_budget};
use super::emit::{self, Bounds};
use super::generate::{self, BASELINE_FAMILIES, Generation};
use super::nccl::{modelled_baselines, nccl_choices};
use super::options::{Options, Progress, SearchError, collective_of};
use super::par::par_map;
use super::refine::{CARRY_BUDGET, REFINE_BUDGET, carry_down, refine, uncut};
use super::registry::families_for;
use super::report::{CollectiveReport, Phase, PhaseClock, SearchReport, StopReason, stops};
use super::row::{CompiledPlan, Row};
use super::screen;
use super::screen::Probe;
use super::select::{Selection, select_and_verify};
use crate::cost::runs_for;
use hccl_ir::{CollectiveKind, EntryText, PlanFile, PlanMeta};
use hccl_topologies::Topology;

/// Topologies of at most this many ranks compile their collectives side by side on the
/// cores; larger ones one after the other (each phase already has work for every core
/// there, and a collective's candidates may hold gigabytes).
const SIDE_BY_SIDE_RANKS: u32 = 64;

/// What one collective adds to a compile: the outcome of [`compile_collective`], its report
/// and its rows and entries (as a plan of their own), and its entries' texts when asked for.
type Part = (
    Result<usize, SearchError>,
    CollectiveReport,
    CompiledPlan,
    Option<Vec<EntryText>>,
);

/// Compiles `topo` with `options`; no progress reporting.
pub fn compile(topo: &Topology, options: &Options) -> Result<CompiledPlan, SearchError> {
    compile_with_progress(topo, options, &mut |_| {})
}

/// Compiles `topo` with `options`, calling `progress` (on this thread) after each costed
/// candidate and at the end of each collective.
pub fn compile_with_progress(
    topo: &Topology,
    options: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<CompiledPlan, SearchError> {
    compile_inner(topo, options, progress, false).map(|(compiled, _)| compiled)
}

/// [`compile_with_progress`], and the plan's text ([`PlanFile::to_ron`]): each collective's
/// entries are written as it finishes, beside the search of the others (on a DGX-1 the
/// text is a tenth of the compile's work, on the 4-node H100 cluster about a second), and
/// only put together at the end ([`PlanFile::to_ron_with`]).
pub fn compile_to_text(
    topo: &Topology,
    options: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<(CompiledPlan, String), SearchError> {
    let (compiled, texts) = compile_inner(topo, options, progress, true)?;
    let text = compiled.plan.to_ron_with(texts.unwrap_or_default());
    Ok((compiled, text))
}

/// A compile, with its entries' texts when `texts` holds.
fn compile_inner(
    topo: &Topology,
    options: &Options,
    progress: &mut dyn FnMut(Progress),
    texts: bool,
) -> Result<(CompiledPlan, Option<Vec<EntryText>>), SearchError> {
    let started = std::time::Instant::now();
    // Starts the trace's clock (its lines say when they were printed) with the compile.
    super::report::tracing();
    let families = families_for(options.synth);
    let owned = offered_options(options, &families)?;
    let options = owned.as_ref().unwrap_or(options);
    let search = Search::new(topo, options, families);
    // The winners are verified one after another, some of them 100k+ chunks a rank: each
    // verification reuses the last one's arrays instead of faulting in fresh pages.
    hccl_ir::verify::keep_buffers(|| {
        std::thread::scope(|scope| {
            // The MILP frontiers the collectives need, read from the synthesis cache (or solved
            // and written there) into this process's memo, where the family finds them: on a
            // thread of their own, while the collectives that need none compile.
            if search.families.iter().any(|f| f.name() == "milp") && search.allowed("milp") {
                let wanted: Vec<_> = options
                    .collectives
                    .iter()
                    .map(|&k| collective_of(k))
                    .collect();
                crate::synth::milp::prime_in(scope, topo, wanted, options.cache_dir.as_deref());
            }
            let compiled = compile_collectives(topo, options, &search, progress, (started, texts));
            super::report::trace_runs(&search.sim.run_counts());
            compiled
        })
    })
}

/// The collectives of `options` through every phase ([`compile_collective`]), joined in
/// their order into one plan.
fn compile_collectives(
    topo: &Topology,
    options: &Options,
    search: &Search<'_>,
    progress: &mut dyn FnMut(Progress),
    (started, texts): (std::time::Instant, bool),
) -> Result<(CompiledPlan, Option<Vec<EntryText>>), SearchError> {
    let meta = PlanMeta {
        topology: topo.name.clone(),
        topology_hash: topo.hash.clone(),
        compiler: format!("hcclc {}", env!("CARGO_PKG_VERSION")),
    };
    let mut compiled = CompiledPlan {
        plan: PlanFile::new(meta.clone()),
        rows: Vec::new(),
        skipped: Vec::new(),
        report: SearchReport::default(),
    };
    let total = options.collectives.len();
    // One collective through every phase, into a plan of its own.
    let one = |index: usize, progress: &mut dyn FnMut(Progress)| -> Result<Part, SearchError> {
        options.check_cancel()?;
        let kind = options.collectives[index];
        let mut part = CompiledPlan {
            plan: PlanFile::new(meta.clone()),
            rows: Vec::new(),
            skipped: Vec::new(),
            report: SearchReport::default(),
        };
        let tick = Tick {
            kind,
            index,
            progress: &mut *progress,
        };
        let (outcome, report) = compile_collective(search, kind, tick, &mut part)?;
        // Its entries written now, while other collectives may still be searching.
        let written = texts.then(|| par_map(&part.plan.entries, EntryText::of));
        Ok((outcome, report, part, written))
    };
    // The last report of a collective compiled, as the `finished`-th done.
    let last = |index: usize, part: &Result<Part, SearchError>, finished: usize| match part {
        Ok((Ok(candidates), ..)) => Some(Progress {
            collective: options.collectives[index],
            done: *candidates,
            total: *candidates,
            collectives_done: finished,
            collectives_total: total,
        }),
        _ => None,
    };
    // The collectives' parts joined in the options' order, as one after the other makes them.
    let mut all_texts: Option<Vec<EntryText>> = texts.then(Vec::new);
    let mut merge = |part: Result<Part, SearchError>| -> Result<(), SearchError> {
        let (outcome, report, part, written) = part?;
        if let (Some(all), Some(written)) = (all_texts.as_mut(), written) {
            all.extend(written);
        }
        compiled.report.collectives.push(report);
        compiled.rows.extend(part.rows);
        for seal in part.plan.verified {
            compiled.plan.add_seal(seal);
        }
        compiled.plan.entries.extend(part.plan.entries);
        match outcome {
            Err(err) if options.partial => compiled.skipped.push(err),
            Err(err) => return Err(err),
            Ok(_) => {}
        }
        Ok(())
    };
    if total > 1 && topo.nranks() <= SIDE_BY_SIDE_RANKS {
        // Side by side on the cores (each phase spreads its own work over them as well):
        // a collective's serial stretches (a tree packing's LP, verification, emitting)
        // overlap another's simulations. Progress is reported on this thread.
        /// What a worker tells this thread: a candidate costed, or a collective finished
        /// (with its last report when it compiled); `collectives_done` counts the latter.
        enum Report {
            Tick(Progress),
            Finished(Option<Progress>),
        }
        let (tx, rx) = std::sync::mpsc::channel::<Report>();
        // Those whose MILP frontier may still be being solved ([`prime_in`]) start last.
        //
        // [`prime_in`]: crate::synth::milp::prime_in
        let mut indices: Vec<usize> = (0..total).collect();
        indices.sort_by_key(|&i| {
            crate::synth::milp::needs_frontier(collective_of(options.collectives[i]))
        });
        let mut parts = std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                par_map(&indices, |&index| {
                    // The receiver outlives every sender: nothing is lost.
                    let part = one(index, &mut |p| {
                        let _ = tx.send(Report::Tick(p));
                    });
                    let _ = tx.send(Report::Finished(last(index, &part, 0)));
                    (index, part)
                })
            });
            let mut finished = 0;
            for report in rx {
                let p = match report {
                    Report::Tick(p) => Some(p),
                    Report::Finished(p) => {
                        finished += 1;
                        p
                    }
                };
                if let Some(p) = p {
                    progress(Progress {
                        collectives_done: finished,
                        ..p
                    });
                }
            }
            worker
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        });
        parts.sort_by_key(|&(index, _)| index);
        for (_, part) in parts {
            merge(part)?;
        }
    } else {
        for index in 0..total {
            let part = one(index, &mut *progress);
            if let Some(p) = last(index, &part, index + 1) {
                progress(p);
            }
            merge(part)?;
        }
    }
    compiled.report.wall_s = started.elapsed().as_secs_f64();
    Ok((compiled, all_texts))
}

/// One collective through every phase, its rows and entries added to `compiled`. The outer
/// error stops the compile (cancelled, bad options); the inner one (no verified candidate)
/// leaves the collective out with [`Options::partial`]. `Ok` holds how many candidates
/// there were.
fn compile_collective(
    search: &Search<'_>,
    kind: CollectiveKind,
    tick: Tick<'_>,
    compiled: &mut CompiledPlan,
) -> Result<(Result<usize, SearchError>, CollectiveReport), SearchError> {
    let options = search.options;
    let collective = collective_of(kind);
    let mut clock = PhaseClock::start(kind);

    // Each stretch of this thread names what its simulation runs are for (the tally that
    // `HCCL_SEARCH_TRACE` prints); the phases that run candidates side by side, carry down
    // and uncut name their own, so a name set here also keeps an earlier one from lingering.
    runs_for("generate");
    let generation = generate::generate(search, collective).ok_or(SearchError::Cancelled)?;
    let total = generation.candidates.len();
    clock.done(
        Phase::Generate,
        generation.families,
        total,
        stops(&generation.stops),
    );
    let Generation {
        candidates,
        channels_hint,
        capped,
        ..
    } = generation;

    let budget = sim_budget(options.sim_budget, search.topo.nranks());
    let modelled = modelled_baselines(
        candidates.iter().map(|(c, _)| c),
        &search.sizes,
        options,
        budget,
    );
    // The baseline's simulated families: kept by the screen and costed at every protocol
    // whatever their times (NCCL's choice reads them).
    let simulated: Vec<&str> = BASELINE_FAMILIES
        .iter()
        .copied()
        .filter(|name| !modelled.contains(name))
        .collect();
    let (probes, screen_stops) = screen::run(search, &candidates, &simulated);
    options.check_cancel()?;
    let kept = probes.iter().filter(|p| p.keep).count();
    clock.done(Phase::Screen, total, kept, stops(&screen_stops));

    let nccl = nccl_choices(search, kind, (channels_hint, &capped), &candidates);
    let baseline = (&simulated[..], &nccl[..]);
    let (mut costed, cost_stops) =
        costing::run(search, candidates, &probes, baseline, budget, tick)
            .ok_or(SearchError::Cancelled)?;
    // Candidates with a time somewhere go on.
    let timeless: usize = cost_stops
        .iter()
        .filter(|(r, _)| matches!(r, StopReason::NotCostable | StopReason::PastEverywhere))
        .map(|(_, n)| n)
        .sum();
    let costable = kept - timeless;
    clock.done(Phase::Cost, kept, costable, stops(&cost_stops));

    let mut bounds = Bounds::new(search, collective);
    let interpolated = costed.iter().filter(|c| c.exact.contains(&false)).count();
    let whole = |c: &Costed| simulated.contains(&c.candidate.algorithm.as_str());
    let refined = refine(
        &search.sim,
        &mut costed,
        &search.sizes,
        options,
        (REFINE_BUDGET * budget, &whole),
        &mut |si| bounds.at(search, si).total_us,
    );
    let carried = carry_down(
        &search.sim,
        &mut costed,
        &search.sizes,
        options,
        CARRY_BUDGET * budget,
    );
    clock.done(
        Phase::Refine,
        interpolated,
        refined.simulated + carried,
        stops(&[
            (StopReason::RefineBudget, refined.left),
            (StopReason::NearBound, refined.near_bound),
            (StopReason::PastBest, refined.cut),
        ]),
    );

    runs_for("select and verify");
    let mut selection = select_and_verify(search, kind, &mut costed)?;
    if selection.failed > 0 && costed.iter().any(|c| c.limited || !c.cut.is_empty()) {
        // A winner failed verification: the sizes it won are decided again among every
        // candidate's full times, as costing them without limits would have.
        let all: Vec<usize> = (0..costed.len()).collect();
        costing::complete(search, (&mut costed, &probes), (&all, &whole), None, budget);
        for c in costed.iter_mut() {
            uncut(&search.sim, c, &search.sizes, options, (None, None));
        }
        carry_down(
            &search.sim,
            &mut costed,
            &search.sizes,
            options,
            CARRY_BUDGET * budget,
        );
        let again = select_and_verify(search, kind, &mut costed)?;
        selection = Selection {
            verified: selection.verified + again.verified,
            failed: selection.failed + again.failed,
            ..again
        };
    }
    clock.done(
        Phase::SelectAndVerify,
        selection.verified,
        selection.verified - selection.failed,
        stops(&[
            (StopReason::FailedVerification, selection.failed),
            (StopReason::NoCandidate, selection.uncovered),
        ]),
    );
    let winners = match selection.winners {
        Ok(winners) => winners,
        Err(err) => {
            let report = clock.finish(Some(err.to_string()));
            return Ok((Err(err), report));
        }
    };

    runs_for("emit");
    complete_neighbours(search, (&mut costed, &probes), (&winners, &whole), budget);
    let rows: &mut Vec<Row> = &mut compiled.rows;
    emit::rows(
        search,
        &costed,
        &winners,
        (&nccl, &capped, &modelled),
        &mut bounds,
        rows,
    );
    let entries = emit::entries(search, &costed, &winners, &mut compiled.plan);
    clock.done(Phase::Emit, search.sizes.len(), entries, Vec::new());
    Ok((Ok(total), clock.finish(None)))
}

/// The times the winners' cost fits read outside the sizes they won ([`emit::fit`]: the
/// next bucket's edge, or the previous one), where the cost phase's limits left them out.
fn complete_neighbours(
    search: &Search<'_>,
    (costed, probes): (&mut [Costed], &[Probe]),
    (winners, whole): (&[(usize, usize)], &Whole<'_>),
    budget: usize,
) {
    let mut wanted: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    let mut start = 0;
    while start < winners.len() {
        let mut end = start + 1;
        while end < winners.len() && winners[end] == winners[start] {
            end += 1;
        }
        let (c, p) = winners[start];
        // Neighbours the refine phase stopped past their best, run to their end.
        let near: Vec<usize> = [Some(end), start.checked_sub(1)]
            .into_iter()
            .flatten()
            .filter(|&si| si < winners.len())
            .collect();
        uncut(
            &search.sim,
            &mut costed[c],
            &search.sizes,
            search.options,
            (Some(&near), Some(p)),
        );
        let unknown = |si: usize| {
            costed[c].limited
                && costed[c].times[p]
                    .as_ref()
                    .is_some_and(|t| t[si].is_infinite())
        };
        for si in [Some(end), start.checked_sub(1)].into_iter().flatten() {
            if si < winners.len() && unknown(si) {
                wanted.entry(c).or_default().push(si);
            }
        }
        start = end;
    }
    for (c, at) in wanted {
        costing::complete(search, (costed, probes), (&[c], whole), Some(&at), budget);
    }
}
