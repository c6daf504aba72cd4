//! The verifier: proves a schedule implements its collective and cannot deadlock.
//!
//! Verification runs in layers; [`verify`] returns every error of the first layer that
//! fails (capped at [`MAX_ERRORS`], then one [`ErrorKind::Truncated`] note).
//!
//! # 1. Header and limits
//! - `nranks > 0`, `nranks == ranks.len()`, `chunks > 0`; `root < nranks` for rooted
//!   collectives; `(input_chunks, output_chunks)` equal [`crate::Collective::buffer_chunks`]
//!   (which also demands `chunks % nranks == 0` for AllGather, ReduceScatter, AllToAll).
//! - The model fits: at most [`MAX_SLOTS`] buffer chunks over all ranks (scratch counted as
//!   far as steps address it), at most [`MAX_WORK`] chunk-steps and at most [`MAX_CLOCKS`]
//!   vector-clock entries ([`ErrorKind::Limit`]), so no input exhausts memory or time.
//! - During the run, the distinct contributor sets still held by buffers or messages take at
//!   most [`MAX_SET_WORDS`] words; otherwise the run stops with [`ErrorKind::Limit`].
//!
//! # 2. Structure (every error names rank, stream, channel and step)
//! - `count > 0` for every op but `Nop`; every `src`/`dst` run `off..off+count` lies inside
//!   its buffer (u64 arithmetic) ([`ErrorKind::Bounds`]).
//! - Peers exist and differ from the rank itself ([`ErrorKind::Peer`]).
//! - Dependencies name an existing step of *another* stream of the same rank
//!   ([`ErrorKind::Dependency`]).
//! - On each rank at most one stream sends to a given `(peer, channel)` and at most one
//!   receives from it ([`ErrorKind::Connection`]).
//! - On every connection `(from, to, channel)` the k-th send pairs with the k-th receive and
//!   both carry the same `count`; the first mismatch per connection and the first unmatched
//!   send or receive are reported ([`ErrorKind::Matching`]).
//!
//! # 3. Execution: deadlock freedom and semantics
//! The schedule runs under the semantics of [`crate::schedule`]: the streams run
//! concurrently, steps of a stream in order, a step starts once its dependencies completed,
//! its received message (if any) is at the head of its connection, and its outgoing
//! connection (if any) holds fewer than [`crate::CONNECTION_SLOTS`] unreceived messages; a
//! step then runs atomically. Because each connection has a single sending and a single
//! receiving stream, the network is a bounded Kahn process network: whether it deadlocks
//! does not depend on the interleaving, so one run decides it. The run is a worklist: only
//! streams whose blocker changed (a message arrived, a slot freed, a dependency completed)
//! are retried, so the cost is linear in steps plus chunks moved. Where no op ever splits a
//! run of chunks, the run is on one chunk per such segment instead (`coarse.rs`, which proves
//! the verdict the same; a merged run that finds an error is redone on every chunk).
//!
//! If streams remain blocked, the verifier follows the wait-for graph (each blocked step waits
//! on exactly one stream: the other end of its connection or the target of its dependency)
//! to a cycle and reports each step of it with what it waits on ([`ErrorKind::Deadlock`], or
//! [`ErrorKind::Dependency`] when the cycle is made of dependencies only), after a summary.
//!
//! Along the run every chunk slot of every rank holds a symbolic value: *uninitialised*, or
//! *original chunk `o` reduced over the contributions of rank set `R`*. Initially input chunk
//! `c` of rank `r` holds `(c, {r})`, except for AllGather, whose input chunk `i` of rank `r`
//! holds `(r·k + i, {r})` (`k = chunks / nranks`); origins thus count in units of the
//! schedule's chunks of the collective buffer. Output and scratch start uninitialised.
//! In-place schedules alias the buffers as [`crate::schedule`] says (AllReduce, Broadcast,
//! Reduce, AllToAll: output is input; AllGather: input is output\[`r·k`..\]; ReduceScatter:
//! output is input\[`r·k`..\]). Checked at each step:
//! - reading an uninitialised chunk (sending it, copying it, or reducing with it) is
//!   [`ErrorKind::Uninitialized`];
//! - a reduction `a ⊕ b` needs equal origins and disjoint rank sets (no contribution counted
//!   twice), and is only allowed in AllReduce, ReduceScatter and Reduce
//!   ([`ErrorKind::BadReduction`]);
//! - a copy or reduction whose source and destination runs partly overlap (after aliasing) is
//!   [`ErrorKind::Overlap`]; identical runs (an in-place no-op copy) are fine.
//!
//! - two streams of one rank touching the same chunk (after aliasing), at least one writing,
//!   must be ordered by the *intra-rank* happens-before relation: program order plus
//!   dependencies, transitively ([`ErrorKind::Race`]). Orderings that exist only through
//!   messages to and from other ranks do not count: executors run the streams of a rank
//!   concurrently and only dependencies synchronise them locally. The check uses vector
//!   clocks over the streams of each rank and finds a race whenever one exists, since the
//!   relation does not depend on the interleaving.
//!
//! Values derived from a reported error are poisoned and not reported again. Without races,
//! the outcome of every step is the same in every interleaving, so this one run proves the
//! schedule for all of them.
//!
//! # 4. Postcondition (after a deadlock-free run)
//! With `k = chunks / nranks`, every rank's output chunk must hold:
//! - AllReduce: chunk `c` = `(c, all ranks)`;
//! - AllGather: chunk `j·k + i` = `(j·k + i, {j})` (input chunk `i` of rank `j`);
//! - ReduceScatter: on rank `r`, chunk `i` = `(r·k + i, all ranks)`;
//! - Broadcast{root}: chunk `c` = `(c, {root})`;
//! - Reduce{root}: on the root, chunk `c` = `(c, all ranks)`; other outputs are free;
//! - AllToAll: on rank `r`, chunk `j·k + i` = `(r·k + i, {j})` (rank `j`'s input chunk `r·k + i`).
//!
//! A violation names rank, buffer and chunk, what it holds and what was expected, located at
//! the step that last wrote the chunk (or unlocated if nothing wrote it).
//!
//! # Not checked
//! - Scratch contents at the end, and whether outputs of non-root ranks of Reduce are touched.

mod coarse;
mod kept;
mod quotient;
mod sim;
mod structure;
mod value;

pub use quotient::{
    MAX_LANE_WORK, check_limits_symmetric, verify_symmetric, verify_symmetric_by_orbits,
};

pub use kept::keep_buffers;
pub use structure::{MAX_CLOCKS, MAX_SET_WORDS, MAX_SLOTS, MAX_WORK};

use crate::plan::{PlanEntry, PlanFile};
use crate::schedule::{Schedule, StepRef};
use crate::symmetric::Symmetry;
use std::fmt;

/// Most errors one call reports; further ones are counted in a final [`ErrorKind::Truncated`].
pub const MAX_ERRORS: usize = 200;

/// What is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// The step at fault, or `None` for whole-schedule problems (e.g. header fields).
    pub at: Option<StepRef>,
    /// Channel of the stream at fault, when `at` is set.
    pub channel: Option<u32>,
    pub kind: ErrorKind,
    /// Human-readable explanation (full sentence fragment, no trailing period).
    pub message: String,
}

/// Classes of verification failures, so tests and tools can match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Header fields inconsistent (nranks, chunks, buffer extents, root).
    Header,
    /// An offset/count outside its buffer.
    Bounds,
    /// A peer out of range or equal to the rank itself.
    Peer,
    /// A dependency that names no step, or a cycle of dependencies.
    Dependency,
    /// Sends and receives that do not pair up on a connection.
    Matching,
    /// Several streams of a rank share one connection direction.
    Connection,
    /// No step can make progress.
    Deadlock,
    /// A step reads data that was never written.
    Uninitialized,
    /// Chunks combined from different origins, or contributions counted twice.
    BadReduction,
    /// The final buffers do not hold the collective's result.
    Postcondition,
    /// A copy or reduction whose source and destination partly overlap.
    Overlap,
    /// Two streams of a rank touch a chunk, one writing, with no ordering between them.
    Race,
    /// A symmetric schedule whose translations do not carry the template's steps onto the
    /// translated data (runs that do not stay contiguous, lanes a step's operands or a
    /// message's two ends order differently, or a collective whose result the translations
    /// do not preserve): see [`verify_symmetric`].
    Symmetry,
    /// The schedule is too large for the verifier to model (see [`MAX_SLOTS`], [`MAX_WORK`],
    /// [`MAX_CLOCKS`]).
    Limit,
    /// Not an error of its own: more errors were found than [`MAX_ERRORS`].
    Truncated,
}

impl ErrorKind {
    /// A stable lower-case name for JSON and tests (`deadlock`, `bad_reduction`, …).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Header => "header",
            ErrorKind::Bounds => "bounds",
            ErrorKind::Peer => "peer",
            ErrorKind::Dependency => "dependency",
            ErrorKind::Matching => "matching",
            ErrorKind::Connection => "connection",
            ErrorKind::Deadlock => "deadlock",
            ErrorKind::Uninitialized => "uninitialized",
            ErrorKind::BadReduction => "bad_reduction",
            ErrorKind::Postcondition => "postcondition",
            ErrorKind::Overlap => "overlap",
            ErrorKind::Race => "race",
            ErrorKind::Symmetry => "symmetry",
            ErrorKind::Limit => "limit",
            ErrorKind::Truncated => "truncated",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Collects errors up to [`MAX_ERRORS`] and counts the rest.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    errors: Vec<VerifyError>,
    dropped: usize,
}

impl Sink {
    pub(crate) fn push(&mut self, err: VerifyError) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(err);
        } else {
            self.dropped += 1;
        }
    }

    /// Errors seen so far, listed or not.
    pub(crate) fn total(&self) -> usize {
        self.errors.len() + self.dropped
    }

    fn finish(mut self) -> Result<(), Vec<VerifyError>> {
        if self.errors.is_empty() {
            return Ok(());
        }
        if self.dropped > 0 {
            self.errors.push(VerifyError {
                at: None,
                channel: None,
                kind: ErrorKind::Truncated,
                message: format!("{} further errors not listed", self.dropped),
            });
        }
        Err(self.errors)
    }
}

/// What a successful verification saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// Ranks of the schedule.
    pub ranks: u32,
    /// Streams over all ranks.
    pub streams: usize,
    /// Steps over all ranks and streams.
    pub steps: usize,
    /// Distinct connections `(from, to, channel)` used.
    pub connections: usize,
    /// Messages sent.
    pub messages: u64,
    /// Chunks carried by those messages.
    pub chunks_sent: u64,
    /// Steps that apply the reduction operator.
    pub reductions: u64,
    /// Longest chain of steps ordered by program order, dependencies and messages: the
    /// schedule's latency in steps.
    pub depth: u32,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.at, self.channel) {
            (Some(at), Some(ch)) => write!(
                f,
                "rank {} stream {} (channel {ch}) step {}: {}",
                at.rank, at.stream, at.step, self.message
            ),
            (Some(at), None) => write!(f, "{at}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Verifies a schedule: structure, deadlock freedom, then the collective's postcondition.
/// Returns every error found by the first failing layer (at least one on `Err`).
pub fn verify(schedule: &Schedule) -> Result<(), Vec<VerifyError>> {
    verify_report(schedule).map(|_| ())
}

/// Whether the schedule is within the verifier's size limits ([`MAX_SLOTS`], [`MAX_WORK`],
/// [`MAX_CLOCKS`]): a cheap pass over the steps, so a compiler can drop a candidate it could
/// never verify before spending time on it. `Err` holds the [`ErrorKind::Limit`] errors
/// [`verify`] would report (or the header errors, when the header is malformed).
pub fn check_limits(schedule: &Schedule) -> Result<(), Vec<VerifyError>> {
    let mut sink = Sink::default();
    header_and_limits(schedule, &mut sink);
    sink.finish()
}

/// The checks one rank can make of its own program without the others' (what a job's rank
/// runs at start on the part of a sealed plan it loaded, see [`crate::PlanPart`]): the header,
/// then every step of `rank`'s program (buffer bounds, peers, dependency targets) and that
/// one stream per connection direction owns it. Deadlock freedom, matching and the
/// collective's result need every rank: [`verify`] proves them, and a seal records that it did.
pub fn check_rank(schedule: &Schedule, rank: u32) -> Result<(), Vec<VerifyError>> {
    let mut sink = Sink::default();
    structure::check_header(schedule, &mut sink);
    if sink.total() == 0 {
        if rank >= schedule.nranks {
            sink.push(VerifyError {
                at: None,
                channel: None,
                kind: ErrorKind::Header,
                message: format!(
                    "rank {rank} is not a rank of the schedule (nranks is {})",
                    schedule.nranks
                ),
            });
        } else {
            structure::check_rank_program(schedule, rank, &mut sink);
        }
    }
    sink.finish()
}

/// The header checks, then (when the header is sound) the size limits.
fn header_and_limits(schedule: &Schedule, sink: &mut Sink) {
    structure::check_header(schedule, sink);
    if sink.total() == 0 {
        structure::check_limits(schedule, None, sink);
    }
}

/// Like [`verify`], returning statistics of the run on success.
pub fn verify_report(schedule: &Schedule) -> Result<Report, Vec<VerifyError>> {
    run(schedule, Run::default())
}

/// [`verify_report`] modelling every chunk of the schedule: never on merged chunks (see
/// `coarse.rs`), which give the same verdict and report (but for [`MAX_SET_WORDS`], which
/// a merged run, holding fewer contributor sets, reaches later); the tests compare the two.
pub fn verify_report_unmerged(schedule: &Schedule) -> Result<Report, Vec<VerifyError>> {
    run(
        schedule,
        Run {
            unmerged: true,
            ..Run::default()
        },
    )
}

/// The chunks [`verify_report`] models `schedule` with when it merges the chunks no op
/// separates (see `coarse.rs`), or `None` when it models every chunk (merging would not
/// halve them) or the schedule fails its header, limits or structure checks.
pub fn merged_chunks(schedule: &Schedule) -> Option<u32> {
    let mut sink = Sink::default();
    header_and_limits(schedule, &mut sink);
    if sink.total() != 0 {
        return None;
    }
    structure::check_structure(schedule, &mut sink)?;
    coarse::merge(schedule).map(|(merged, _)| merged.chunks)
}

/// How [`run`] simulates.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    /// Collect unreferenced contributor sets as soon as their arena doubles (tests use it to
    /// show collection changes no verdict).
    eager: bool,
    /// Model every chunk, never merged ones.
    unmerged: bool,
}

/// [`verify_report`] as `how` says: on merged chunks where that applies and finds no error
/// (`coarse.rs`), else on every chunk.
fn run(schedule: &Schedule, how: Run) -> Result<Report, Vec<VerifyError>> {
    let mut sink = Sink::default();
    header_and_limits(schedule, &mut sink);
    let layout = if sink.total() == 0 {
        structure::check_structure(schedule, &mut sink)
    } else {
        None
    };
    let Some(layout) = layout else {
        return Err(sink.finish().err().unwrap_or_default());
    };
    if !how.eager
        && !how.unmerged
        && let Some(report) = coarse::verified(schedule, &layout)
    {
        return Ok(report);
    }
    let stats = sim::simulate(schedule, &layout, &mut sink, how.eager, None);
    sink.finish()?;
    Ok(Report {
        ranks: schedule.nranks,
        streams: layout.streams.stream_count(),
        steps: schedule.step_count(),
        connections: layout.conns.len(),
        messages: stats.messages,
        chunks_sent: stats.chunks_sent,
        reductions: stats.reductions,
        depth: stats.depth,
    })
}

/// What the plan seals name as their verifier ([`crate::seal::Seal`]): this crate at its
/// version, and the seal form (2: explicit schedules hashed per rank). A seal of another
/// version or form counts for nothing, so a build whose verifier or seals changed verifies
/// old plans again.
pub const VERIFIER: &str = concat!("hccl-ir ", env!("CARGO_PKG_VERSION"), ", seals 2");

/// Verifies a schedule with the rank symmetry its producer claims: on the template
/// ([`verify_symmetric`]) when the schedule compresses under the symmetry, on the whole
/// schedule ([`verify_report`]) otherwise. Both give the same verdict (the tests compare
/// them); the symmetric one costs about one rank's program.
pub fn verify_claimed(
    schedule: &Schedule,
    symmetry: Option<&Symmetry>,
) -> Result<Report, Vec<VerifyError>> {
    match symmetry.and_then(|sym| schedule.compress(sym)) {
        Some(s) => verify_symmetric(&s),
        None => verify_report(schedule),
    }
}

/// Whether [`verify_claimed`] can model the schedule: the symmetric verifier's limits
/// ([`check_limits_symmetric`]) when it compresses under `symmetry`, [`check_limits`]
/// otherwise. Compresses only when the whole schedule is over the limits.
pub fn check_limits_claimed(
    schedule: &Schedule,
    symmetry: Option<&Symmetry>,
) -> Result<(), Vec<VerifyError>> {
    let whole = check_limits(schedule);
    match (whole, symmetry) {
        (Err(e), Some(sym)) => match schedule.compress(sym) {
            Some(s) => check_limits_symmetric(&s),
            None => Err(e),
        },
        (whole, _) => whole,
    }
}

/// [`verify_claimed`] for a plan entry: symmetric entries are verified on their template.
pub fn verify_entry(entry: &PlanEntry) -> Result<Report, Vec<VerifyError>> {
    if let Some(t) = &entry.template {
        return verify_symmetric(t);
    }
    verify_claimed(&entry.schedule, entry.symmetry.as_ref())
}

/// Verifies every entry of a plan ([`verify_entry`]); errors carry the entry index.
pub fn verify_plan(plan: &PlanFile) -> Result<(), Vec<(usize, Vec<VerifyError>)>> {
    let failures: Vec<_> = plan
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| verify_entry(e).err().map(|errs| (i, errs)))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Loc, Op};

    /// Schedules of the MSCCL corpus, plus variants with one source offset moved or one
    /// step's dependencies cut (wrong reductions, double counting, races, postconditions).
    fn corpus() -> Vec<Schedule> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/msccl");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "xml"))
            .collect();
        files.sort();
        let mut out = Vec::new();
        for path in files {
            let Ok(imported) = crate::msccl::load_xml(&path) else {
                continue;
            };
            for entry in imported.entries {
                let base = entry.schedule;
                let places: Vec<(usize, usize, usize)> =
                    base.ranks
                        .iter()
                        .enumerate()
                        .flat_map(|(r, p)| {
                            p.streams.iter().enumerate().flat_map(move |(s, st)| {
                                (0..st.steps.len()).map(move |k| (r, s, k))
                            })
                        })
                        .collect();
                for (i, &(r, s, k)) in places.iter().enumerate().step_by(7).take(24) {
                    let mut m = base.clone();
                    let step = &mut m.ranks[r].streams[s].steps[k];
                    if i % 2 == 0 {
                        step.deps.clear();
                    } else {
                        match &mut step.op {
                            Op::Send { src, .. }
                            | Op::RecvReduceCopy { src, .. }
                            | Op::RecvReduceSend { src, .. }
                            | Op::RecvReduceCopySend { src, .. }
                            | Op::Copy { src, .. }
                            | Op::Reduce { src, .. } => *src = Loc::new(src.buf, src.off ^ 1),
                            _ => {}
                        }
                    }
                    out.push(m);
                }
                out.push(base);
            }
        }
        out
    }

    #[test]
    fn collecting_sets_eagerly_changes_no_verdict() {
        let schedules = corpus();
        assert!(schedules.len() > 100, "{}", schedules.len());
        let mut failing = 0;
        for s in &schedules {
            let lazy = run(s, Run::default());
            failing += usize::from(lazy.is_err());
            let eager = Run {
                eager: true,
                ..Run::default()
            };
            assert_eq!(run(s, eager), lazy);
        }
        assert!(failing > 20, "only {failing} variants fail");
        let collections = sim::COLLECTIONS.load(std::sync::atomic::Ordering::Relaxed);
        assert!(collections > 100, "only {collections} collections ran");
    }
}
