//! What a search reports of itself: per collective and phase, how many candidates went in
//! and came out, the phase's wall time and why candidates stopped there ([`SearchReport`]);
//! and the `HCCL_SEARCH_TRACE` lines, printed as the search goes.

use hccl_ir::CollectiveKind;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Instant;

/// What a compile did, phase by phase, for every collective: returned with the plan
/// ([`CompiledPlan::report`](super::CompiledPlan::report)), printed by `hcclc compile -v`
/// and written by `hcclc compile --json` (`search_report`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchReport {
    /// One per collective compiled (or left out), in compile order.
    pub collectives: Vec<CollectiveReport>,
    /// Wall time of the whole compile (s).
    pub wall_s: f64,
}

/// The phases of one collective's search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveReport {
    pub collective: CollectiveKind,
    /// The phases that ran, in order.
    pub phases: Vec<PhaseReport>,
    /// Why the collective was left out of the plan (with
    /// [`Options::partial`](super::Options::partial)); `None` when it was compiled.
    pub skipped: Option<String>,
}

/// The phases of the search, in the order they run for each collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Every family × parameter set (and the external candidates): candidates in are the
    /// families asked, out the candidate schedules.
    Generate,
    /// Two probe sizes on more than [`SCREEN_RANKS`](super::SCREEN_RANKS) ranks: the
    /// candidates worth costing at every size.
    Screen,
    /// Every kept candidate at every size and protocol (subsampled and interpolated beyond
    /// the simulation budget): out are the candidates with a time somewhere.
    Cost,
    /// Interpolated times close to a size's best, simulated after all: in are the
    /// candidates with interpolated sizes, out the (candidate, size) pairs simulated.
    Refine,
    /// The winner per size, verified (a failing winner's sizes decided again): in are the
    /// candidates verified, out those that passed.
    SelectAndVerify,
    /// Rows and plan entries: in are the sizes, out the entries (runs of equal winners).
    Emit,
}

impl Phase {
    /// The phase's name as printed (`generate`, `screen`, …, `select and verify`, `emit`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Generate => "generate",
            Phase::Screen => "screen",
            Phase::Cost => "cost",
            Phase::Refine => "refine",
            Phase::SelectAndVerify => "select and verify",
            Phase::Emit => "emit",
        }
    }
}

/// One phase of one collective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    pub phase: Phase,
    /// What the phase started from (see [`Phase`] for what is counted).
    pub candidates_in: usize,
    /// What it handed on.
    pub candidates_out: usize,
    /// Its wall time (s).
    pub wall_s: f64,
    /// Why candidates stopped (or the phase stopped early), with how many; only reasons
    /// that occurred.
    pub stops: Vec<Stop>,
}

/// How many candidates (or sizes, or parameter sets: see [`StopReason`]) stopped for one
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    pub reason: StopReason,
    pub count: usize,
}

/// Why candidates stopped in a phase, or why a phase stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Generate: parameter sets or schedules over the step cap
    /// ([`MAX_CANDIDATE_STEPS`](super::MAX_CANDIDATE_STEPS)) or the verifier's size limits,
    /// not generated (counted per schedule or parameter set left out).
    StepCap,
    /// Generate: families (a synthesizer past its rank limit, infeasible or failing; a
    /// family that does not apply to the machine) that offered nothing (counted per family).
    OfferedNothing,
    /// Generate: nothing selectable under the step cap, so each capped family's smallest
    /// parameter set was tried (counted per candidate so added).
    Fallback,
    /// Generate: schedules that repeat an earlier candidate of their family (two parameter
    /// sets that lower to one schedule), dropped.
    Duplicate,
    /// Screen: dropped before routing, its route-free lower bound past both probes' limits.
    PrunedByBound,
    /// Screen: simulated at the probes and not within the screen's factor of the best at
    /// either.
    ScreenedOut,
    /// Cost: the simulation budget reached, so simulated at a subsample of the sizes and
    /// interpolated between them (counted per candidate).
    SimBudget,
    /// Cost: no time at any size and protocol (the simulation failed or every size is below
    /// the candidate's least).
    NotCostable,
    /// Cost: no time at any size, every one past its size's limit or out of the candidate's
    /// reach (it cannot win anywhere; also counted in [`StopReason::PastBaseline`]).
    PastEverywhere,
    /// Cost: candidates some of whose runs stopped past the best time of NCCL's families at
    /// their size (they could not win there; counted per candidate).
    PastBaseline,
    /// Refine: (candidate, size) pairs it would have simulated beyond its step budget.
    RefineBudget,
    /// Refine: sizes whose best time is within 1% of the lower bound, not refined.
    NearBound,
    /// Refine: runs stopped past the best simulated time at their size (they could not
    /// win there).
    PastBest,
    /// Select and verify: winners that failed verification (their sizes decided again).
    FailedVerification,
    /// Select and verify: sizes no verified candidate covers (the collective has no plan).
    NoCandidate,
}

impl StopReason {
    /// The reason as printed.
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::StepCap => "over the step cap or verifier limits",
            StopReason::OfferedNothing => {
                "offered nothing (families that do not apply here, synthesizers past their limits)"
            }
            StopReason::Fallback => "fallback candidates",
            StopReason::Duplicate => "repeated an earlier candidate",
            StopReason::PrunedByBound => "pruned by bound",
            StopReason::ScreenedOut => "screened out",
            StopReason::SimBudget => "interpolated (simulation budget reached)",
            StopReason::NotCostable => "not costable",
            StopReason::PastEverywhere => "past the best time at every size",
            StopReason::PastBaseline => "stopped past the baseline's time at some sizes",
            StopReason::RefineBudget => "left (refine budget reached)",
            StopReason::NearBound => "sizes within 1% of the bound",
            StopReason::PastBest => "runs stopped past their size's best time",
            StopReason::FailedVerification => "failed verification",
            StopReason::NoCandidate => "sizes without a verified candidate",
        }
    }
}

/// How many stopped for each reason, as a phase counts them.
pub(super) type Counts = Vec<(StopReason, usize)>;

/// `(reason, count)` pairs as [`Stop`]s, leaving out the zero counts.
pub(super) fn stops(counts: &[(StopReason, usize)]) -> Vec<Stop> {
    counts
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|&(reason, count)| Stop { reason, count })
        .collect()
}

impl fmt::Display for SearchReport {
    /// The report as lines of text: a heading per collective, a line per phase.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "search: {:.2} s", self.wall_s)?;
        for c in &self.collectives {
            match &c.skipped {
                Some(why) => writeln!(f, "{}: left out: {why}", c.collective)?,
                None => writeln!(f, "{}:", c.collective)?,
            }
            for p in &c.phases {
                write!(
                    f,
                    "  {:<18} {:>6} in {:>6} out {:>9.3} s",
                    p.phase.name(),
                    p.candidates_in,
                    p.candidates_out,
                    p.wall_s
                )?;
                let why: Vec<String> = p
                    .stops
                    .iter()
                    .map(|s| format!("{} {}", s.count, s.reason.describe()))
                    .collect();
                if why.is_empty() {
                    writeln!(f)?;
                } else {
                    writeln!(f, "   ({})", why.join(", "))?;
                }
            }
        }
        Ok(())
    }
}

/// Whether `HCCL_SEARCH_TRACE` is set: the search then prints, on stderr, what each family
/// generated and how long each candidate took to screen and to cost (for finding where
/// compile time goes; the plan is unaffected).
pub(super) fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var_os("HCCL_SEARCH_TRACE").is_some();
        if on {
            traced_since();
        }
        on
    })
}

/// Seconds since the first [`tracing`] check, which the start of a process's first compile
/// makes: each trace line says when it was printed, so that the phases of collectives
/// compiled side by side can be laid out in time.
pub(super) fn traced_since() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Prints, when [`tracing`], what a compile's simulation runs cost by purpose
/// ([`runs_for`](crate::cost::runs_for)), the dearest first: runs and thread seconds, and how
/// the runs ended. Thread seconds exceed CPU seconds when more threads run than cores.
pub(super) fn trace_runs(counts: &[crate::cost::RunCounts]) {
    if !tracing() {
        return;
    }
    let mut counts = counts.to_vec();
    counts.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let total: f64 = counts.iter().map(|c| c.seconds).sum();
    let at = traced_since();
    eprintln!(
        "trace [{at:7.3} s]: simulation runs: {total:.3} thread seconds; per purpose, runs \
         (to their end / within a limit / stopped past it / failed), seconds, runs a bound spared"
    );
    for c in &counts {
        eprintln!(
            "trace [{at:7.3} s]:   {}: {} ({} / {} / {} / {}), {:.3} s ({:.0}%), {} spared",
            c.purpose,
            c.runs(),
            c.whole,
            c.within,
            c.stopped,
            c.failed,
            c.seconds,
            100.0 * c.seconds / total.max(f64::MIN_POSITIVE),
            c.bounded
        );
    }
}

/// Prints one candidate's screening or costing time when [`tracing`].
pub(super) fn trace_candidate(
    what: &str,
    c: &crate::families::Candidate,
    started: Instant,
    extra: &str,
) {
    if tracing() {
        eprintln!(
            "trace [{:7.3} s]: {what} {} (channels {}, pipeline {}): {} steps, {:.3} s{extra}",
            traced_since(),
            c.algorithm,
            c.params.channels,
            c.params.pipeline,
            c.step_count(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// The phases of one collective as they end: each one's wall time (printed when
/// [`tracing`]) and counts, gathered into its [`CollectiveReport`].
pub(super) struct PhaseClock {
    report: CollectiveReport,
    since: Instant,
}

impl PhaseClock {
    pub(super) fn start(collective: CollectiveKind) -> PhaseClock {
        PhaseClock {
            report: CollectiveReport {
                collective,
                phases: Vec::new(),
                skipped: None,
            },
            since: Instant::now(),
        }
    }

    /// Ends `phase` (its time is the time since the previous phase ended) and starts the
    /// next.
    pub(super) fn done(
        &mut self,
        phase: Phase,
        candidates_in: usize,
        candidates_out: usize,
        stops: Vec<Stop>,
    ) {
        let wall_s = self.since.elapsed().as_secs_f64();
        if tracing() {
            eprintln!(
                "trace [{:7.3} s]: {} phase {}: {wall_s:.3} s wall",
                traced_since(),
                self.report.collective,
                phase.name()
            );
        }
        self.report.phases.push(PhaseReport {
            phase,
            candidates_in,
            candidates_out,
            wall_s,
            stops,
        });
        self.since = Instant::now();
    }

    /// The collective's report, marked as left out for `why` when it was.
    pub(super) fn finish(mut self, skipped: Option<String>) -> CollectiveReport {
        self.report.skipped = skipped;
        self.report
    }
}
