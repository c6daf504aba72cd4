//! Plan files: schedules keyed by collective and message-size range, plus metadata.
//!
//! A plan file is RON (human-readable, diffable, checked into a job's repository):
//!
//! ```ron
//! (
//!     format_version: 6,
//!     meta: (topology: "dgx1", topology_hash: "…", compiler: "hcclc 0.1.0"),
//!     entries: [
//!         (min_bytes: 0, max_bytes: Some(262144), algorithm: "ring", …, schedule: (…)),
//!         (min_bytes: 262144, max_bytes: None, algorithm: "ring", …, symmetric: (…)),
//!     ],
//!     verified: [(verifier: "hccl-ir 0.1.0, seals 2", schedule: "…", ranks: Some("…")), …],
//! )
//! ```
//!
//! `format_version` comes first so that a reader can refuse a file written for a newer format
//! with a clear message before it tries to make sense of the rest.
//!
//! # Entries: explicit and symmetric
//!
//! Each entry holds its schedule in exactly one of two forms:
//!
//! - `schedule: (collective: …, nranks: …, chunks: …, input_chunks: …, output_chunks: …,
//!   in_place: …, ranks: [ … ])`: the [`Schedule`] with every rank's program (explicit);
//! - `symmetric: (collective: …, nranks: …, chunks: …, input_chunks: …, output_chunks: …,
//!   in_place: …, symmetry: ( … ), template: ( … ))`: a
//!   [`SymmetricSchedule`], one template program (its strided runs compressed, see
//!   [`crate::runs`]) and the
//!   [`Symmetry`] that translates it to every rank (see [`crate::symmetric`]). Its size is
//!   `O(nranks + template)` instead of `O(nranks × template)`.
//!
//! In memory an entry always holds the expanded [`Schedule`]; [`PlanEntry::symmetry`] is the
//! symmetry its producer claims. The writer uses the symmetric form when that claim holds
//! exactly ([`PlanEntry::is_compact`]: the schedule compresses under it), and the explicit
//! form otherwise (the symmetry is then not written). The reader validates a symmetric entry
//! (errors are located in the file) and expands it, setting `symmetry`; explicit entries read
//! back with `symmetry: None`. [`PlanFile::from_ron_for_rank`] instantiates only the wanted
//! rank's program of a symmetric entry, which makes one rank's load of a large plan cost the
//! template, not the whole schedule.
//!
//! # Versions
//!
//! - 1: explicit entries only;
//! - 2: explicit or symmetric entries;
//! - 3: seals of the verified schedules (`verified`, see [`Seal`]);
//! - 4: large plans carry a rank index (`rank_index`, see [`PlanFile::to_ron`]) for one-rank
//!   loads;
//! - 5: strided runs in templates. A symmetric entry's template
//!   writes a run of steps of a stream that differ only by constant strides (peers, offsets,
//!   dependencies) as its first step with `repeat: (times: …, src: …, …)`, and a run of
//!   streams likewise (`repeat: (times: …, every: …, channel: …, steps: [ … ])`); see
//!   [`crate::runs`] for the exact form. A template without runs is written as in format 4;
//!   explicit entries are unchanged. Seals name a symmetric schedule by the hash of this
//!   written form ([`crate::seal`]); the seals of older files (the expanded template's hash)
//!   are checked as they were written and held under the current hash.
//! - 6 (written by this build): strided runs in explicit programs too, written as in
//!   templates: deep pipelines on machines without a usable symmetry (packed trees, routed
//!   rings, flow AllToAll) are written 10 to 40 times shorter. A seal's rank digests are of
//!   a binary encoding of each program ([`crate::seal::rank_digest`]) instead of its RON;
//!   the explicit seals of older files are checked as they were written (a one-rank load
//!   checks its programs' old digests) and, on a full load, held under the current digests.
//!
//! Readers accept versions [`MIN_FORMAT_VERSION`]`..=`[`FORMAT_VERSION`] and refuse others
//! with [`PlanError::Version`]; a plan read from an older version is held (and written back)
//! as the current version.

use crate::error::{Located, PlanError};
use crate::schedule::{Collective, RankProgram, Schedule};
use crate::seal::{PlanPart, seal_of};
pub use crate::seal::{Seal, schedule_hash};
use crate::symmetric::{SymmetricSchedule, Symmetry};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::Path;
use std::sync::Arc;

/// The plan format this build writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 6;

/// The first format whose templates may hold strided runs, and whose seals name symmetric
/// schedules by the hash of their written form (see [`crate::runs`], [`crate::seal`]).
pub const RUNS_VERSION: u32 = 5;

/// The first format whose explicit programs may hold strided runs, and whose seals list rank
/// digests of a binary encoding (see [`crate::runs`], [`crate::seal::rank_digest`]).
pub const DIGESTS_VERSION: u32 = 6;

/// The oldest plan format this build reads.
pub const MIN_FORMAT_VERSION: u32 = 1;

/// NCCL-style protocol a schedule is tuned for: the executor's transfer granularity and
/// synchronisation (low-latency flags vs bulk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    /// 8-byte flag+data lines: lowest latency, half the bandwidth.
    LL,
    /// 128-byte lines with 120 bytes of data.
    LL128,
    /// Bulk transfers with separate synchronisation.
    Simple,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::LL, Protocol::LL128, Protocol::Simple];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::LL => "LL",
            Protocol::LL128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    /// Case-insensitive parse of `LL`, `LL128`, `Simple`.
    pub fn from_name(name: &str) -> Option<Protocol> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Parses a comma-separated list of protocol names (`LL,Simple`, any case), without
    /// repeats; an empty list or an unknown name is an error saying which.
    pub fn parse_list(text: &str) -> Result<Vec<Protocol>, String> {
        let mut out = Vec::new();
        for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let p = Protocol::from_name(name)
                .ok_or_else(|| format!("unknown protocol `{name}` (known: LL, LL128, Simple)"))?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err("no protocol given".into());
        }
        Ok(out)
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who made the plan and for what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanMeta {
    /// Name of the topology the plan was compiled for.
    pub topology: String,
    /// Content hash of that topology (hex blake3), empty when not compiled from one.
    #[serde(default)]
    pub topology_hash: String,
    /// Producer and version, e.g. `hcclc 0.1.0` or `msccl import`.
    pub compiler: String,
}

/// The predicted cost of a schedule as `latency + bytes / bandwidth`, fitted by the compiler
/// over the entry's size range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFit {
    pub latency_us: f64,
    /// Effective algorithm bandwidth in GB/s (1e9 B/s).
    pub algbw_gbps: f64,
}

impl CostFit {
    /// Predicted time in µs for a message of `bytes`.
    pub fn predict_us(&self, bytes: u64) -> f64 {
        // 1 GB/s moves 1e3 bytes per µs.
        self.latency_us + bytes as f64 / (self.algbw_gbps.max(f64::MIN_POSITIVE) * 1e3)
    }
}

/// How a synthesized entry's schedule was found: the synthesizer, what it optimised, the
/// value its schedule reaches and the best value the solver proved possible. Written by the
/// compiler for schedules that come from a solver rather than a hand-written family;
/// informational (the executor ignores it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Synthesis {
    /// The synthesizer, e.g. `lp-tree-packing`.
    pub method: String,
    /// What it maximised or minimised, in words.
    pub objective: String,
    /// The objective's value for this entry's schedule.
    pub value: f64,
    /// The optimum over every schedule of the synthesizer's model, as far as the solver
    /// proved it (`value == optimum` when the schedule is optimal).
    pub optimum: f64,
    /// Unit of `value` and `optimum` (`GB/s`, `steps`, …).
    pub unit: String,
    /// Whether the solver proved `optimum` optimal (else it stopped early, e.g. at a time
    /// limit, and `optimum` is its best bound).
    pub proven: bool,
}

/// One schedule and the message sizes it is chosen for.
///
/// Serialised by hand (see the module docs): the schedule is written `symmetric:` when
/// [`PlanEntry::is_compact`], `schedule:` otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEntry {
    /// Smallest message size (bytes, nccl-tests convention) this entry serves.
    pub min_bytes: u64,
    /// Exclusive upper bound; `None` means unbounded.
    pub max_bytes: Option<u64>,
    /// Family name (`ring`, `double_ring`, `hybrid_cube`, …) or the imported algorithm's name.
    pub algorithm: String,
    pub protocol: Protocol,
    /// The compiler's predicted cost over the size range, when it made one.
    pub cost: Option<CostFit>,
    /// The schedule, every rank's program expanded.
    pub schedule: Schedule,
    /// The rank symmetry the producer claims `schedule` has. When the schedule is exactly
    /// invariant under it the entry is written in the compact symmetric form; otherwise it is
    /// written explicitly and the claim is dropped. Entries read from a file have `Some` iff
    /// they were written symmetric.
    pub symmetry: Option<Symmetry>,
    /// How the schedule was synthesized, when a solver made it.
    pub synthesis: Option<Synthesis>,
    /// The schedule as a template alone: a compiler that built, costed and verified it that
    /// way (thousands of ranks) hands it on without expanding it. `schedule` then has the
    /// header and no programs, the entry is written in the symmetric form, and the readers
    /// give the schedule back expanded (with `template: None`); in memory, use
    /// [`PlanEntry::expand_template`] before running it. `None` otherwise.
    pub template: Option<Arc<SymmetricSchedule>>,
}

impl PlanEntry {
    /// Builds the whole schedule of a template entry (see [`PlanEntry::template`]); other
    /// entries are left as they are.
    pub fn expand_template(&mut self) -> Result<(), crate::SymmetryError> {
        if let Some(t) = self.template.take() {
            match t.expand() {
                Ok(s) => {
                    self.schedule = s;
                    self.symmetry = Some(t.symmetry.clone());
                }
                Err(e) => {
                    self.template = Some(t);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    pub fn covers(&self, bytes: u64) -> bool {
        self.min_bytes <= bytes && self.max_bytes.is_none_or(|max| bytes < max)
    }

    /// The symmetric form this entry is written in: `Some` when [`PlanEntry::symmetry`] is
    /// set and the schedule compresses under it (checks every rank; linear in the schedule).
    pub fn compact(&self) -> Option<SymmetricSchedule> {
        if let Some(t) = &self.template {
            return Some(t.as_ref().clone());
        }
        self.schedule.compress(self.symmetry.as_ref()?)
    }

    /// Steps of the whole schedule (every rank's), counted on the template for a template
    /// entry.
    pub fn step_count(&self) -> usize {
        match &self.template {
            Some(t) => t.template_step_count() * t.nranks as usize,
            None => self.schedule.step_count(),
        }
    }

    /// Channels of the schedule (translations keep a stream's channel).
    pub fn channel_count(&self) -> u32 {
        match &self.template {
            Some(t) => t
                .template
                .streams
                .iter()
                .map(|s| s.channel + 1)
                .max()
                .unwrap_or(0),
            None => self.schedule.channel_count(),
        }
    }

    /// Whether the entry is written in the symmetric form (see [`PlanEntry::compact`]).
    pub fn is_compact(&self) -> bool {
        self.compact().is_some()
    }
}

/// The RON form of entries, shared by the full and the one-rank reader.
mod wire {
    use super::{CostFit, PlanEntry, Protocol, Synthesis};
    use crate::schedule::Schedule;
    use crate::symmetric::{SymmetricSchedule, Symmetry};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// What an entry is written as: exactly one of `schedule` and `symmetric` is `Some`.
    #[derive(Serialize)]
    #[serde(rename = "PlanEntry")]
    pub(super) struct Out<'a> {
        pub min_bytes: u64,
        pub max_bytes: Option<u64>,
        pub algorithm: &'a str,
        pub protocol: Protocol,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cost: Option<CostFit>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub synthesis: Option<&'a Synthesis>,
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "explicit")]
        pub schedule: Option<&'a Schedule>,
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "written")]
        pub symmetric: Option<SymmetricSchedule>,
    }

    /// What an entry is read as; `S` is the explicit schedule's form (the full [`Schedule`]
    /// or the one-rank mirror).
    #[derive(Deserialize)]
    #[serde(
        rename = "PlanEntry",
        deny_unknown_fields,
        bound(deserialize = "S: Deserialize<'de>")
    )]
    pub(super) struct In<S> {
        pub min_bytes: u64,
        pub max_bytes: Option<u64>,
        pub algorithm: String,
        pub protocol: Protocol,
        #[serde(default)]
        pub cost: Option<CostFit>,
        #[serde(default)]
        pub synthesis: Option<Synthesis>,
        #[serde(default = "none", deserialize_with = "present")]
        pub schedule: Option<S>,
        #[serde(default, deserialize_with = "read_symmetric")]
        pub symmetric: Option<SymmetricSchedule>,
    }

    /// Writes an explicit schedule (format 6): the fields of [`Schedule`] in its order, every
    /// rank program in the written form of [`crate::runs`] (read back through
    /// [`crate::RankProgram`]'s reader, which expands it).
    fn explicit<S: Serializer>(value: &Option<&Schedule>, s: S) -> Result<S::Ok, S::Error> {
        use crate::schedule::ScheduleHeader;
        use serde::ser::SerializeStruct;
        let Some(schedule) = value else {
            return s.serialize_none();
        };
        let ranks: Vec<crate::runs::WProgram> =
            schedule.ranks.iter().map(crate::runs::encode).collect();
        let mut st = s.serialize_struct("Schedule", ScheduleHeader::FIELDS + 1)?;
        schedule.header().serialize_fields(&mut st)?;
        st.serialize_field("ranks", &ranks)?;
        st.end()
    }

    /// Writes a symmetric schedule with its template's runs compressed (see [`crate::runs`]).
    fn written<S: Serializer>(value: &Option<SymmetricSchedule>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => crate::runs::SymmetricOut::of(v).serialize(s),
            None => s.serialize_none(),
        }
    }

    /// Reads a symmetric schedule, expanding its template's runs.
    fn read_symmetric<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SymmetricSchedule>, D::Error> {
        crate::runs::SymmetricIn::deserialize(d).map(|s| Some(s.into()))
    }

    fn none<S>() -> Option<S> {
        None
    }

    /// Reads a present optional field written without `Some(…)`.
    fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        T::deserialize(d).map(Some)
    }

    /// Which form an entry was written in.
    pub(super) enum Form<S> {
        Explicit(S),
        Symmetric(SymmetricSchedule),
    }

    impl<S> In<S> {
        /// The entry, with its schedule (and claimed symmetry) made by `build` from the form
        /// that was read.
        pub(super) fn into_entry(
            self,
            build: impl FnOnce(Form<S>) -> Result<(Schedule, Option<Symmetry>), String>,
        ) -> Result<PlanEntry, String> {
            let form = match (self.schedule, self.symmetric) {
                (Some(s), None) => Form::Explicit(s),
                (None, Some(s)) => Form::Symmetric(s),
                (Some(_), Some(_)) => {
                    return Err(
                        "entry has both `schedule` and `symmetric`; it needs exactly one".into(),
                    );
                }
                (None, None) => {
                    return Err(
                        "entry has neither `schedule` nor `symmetric`; it needs exactly one".into(),
                    );
                }
            };
            let (schedule, symmetry) = build(form)?;
            Ok(PlanEntry {
                min_bytes: self.min_bytes,
                max_bytes: self.max_bytes,
                algorithm: self.algorithm,
                protocol: self.protocol,
                cost: self.cost,
                schedule,
                symmetry,
                synthesis: self.synthesis,
                template: None,
            })
        }
    }
}

impl Serialize for PlanEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let symmetric = self.compact();
        wire::Out {
            min_bytes: self.min_bytes,
            max_bytes: self.max_bytes,
            algorithm: &self.algorithm,
            protocol: self.protocol,
            cost: self.cost,
            synthesis: self.synthesis.as_ref(),
            schedule: symmetric.is_none().then_some(&self.schedule),
            symmetric,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for PlanEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PlanEntry, D::Error> {
        use serde::de::Error;
        let compact = COMPACT.get();
        let mut kept: Option<SymmetricSchedule> = None;
        let mut entry = wire::In::<Schedule>::deserialize(d)?
            .into_entry(|form| match form {
                wire::Form::Explicit(schedule) => Ok((schedule, None)),
                wire::Form::Symmetric(symmetric) if compact => {
                    symmetric
                        .table()
                        .map_err(|e| format!("symmetric schedule: {e}"))?;
                    let empty = RankProgram {
                        scratch_chunks: 0,
                        streams: Vec::new(),
                    };
                    let ranks = vec![empty; symmetric.nranks as usize];
                    let schedule = Schedule::from_header(symmetric.header(), ranks);
                    let symmetry = symmetric.symmetry.clone();
                    kept = Some(symmetric);
                    Ok((schedule, Some(symmetry)))
                }
                wire::Form::Symmetric(symmetric) => {
                    let schedule = symmetric
                        .expand()
                        .map_err(|e| format!("symmetric schedule: {e}"))?;
                    Ok((schedule, Some(symmetric.symmetry)))
                }
            })
            .map_err(D::Error::custom)?;
        entry.template = kept.map(Arc::new);
        Ok(entry)
    }
}

/// The least limit on a plan file's expanded steps ([`expansion_limit`]): every plan
/// `hcclc` writes stays below it (the compiler builds no template schedule past 2^23 steps).
pub const MIN_EXPANSION_LIMIT: u64 = 1 << 26;

/// Expanded steps a plan file may stand for per byte of its text ([`expansion_limit`]).
pub const EXPANSION_STEPS_PER_BYTE: u64 = 16;

/// How many steps a full load of a plan file may expand its symmetric entries to, all entries
/// together, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpansionLimit {
    pub steps: u64,
    /// Where the limit comes from, for the error that names it.
    pub why: String,
}

/// The limit on the steps a full load ([`PlanFile::from_ron`], [`PlanFile::load`]) expands a
/// plan file of `file_bytes` bytes to: `HCCL_PLAN_MAX_STEPS` when set, else
/// [`EXPANSION_STEPS_PER_BYTE`] per byte of the file, at least [`MIN_EXPANSION_LIMIT`] and at
/// most [`crate::symmetric::MAX_EXPANDED_STEPS`]. A bad `HCCL_PLAN_MAX_STEPS` is
/// [`PlanError::MaxSteps`].
pub fn expansion_limit(file_bytes: usize) -> Result<ExpansionLimit, PlanError> {
    if let Some(steps) = max_steps_from_env()? {
        return Ok(ExpansionLimit {
            steps,
            why: format!("HCCL_PLAN_MAX_STEPS={steps}"),
        });
    }
    let steps = (file_bytes as u64)
        .saturating_mul(EXPANSION_STEPS_PER_BYTE)
        .clamp(MIN_EXPANSION_LIMIT, crate::symmetric::MAX_EXPANDED_STEPS);
    Ok(ExpansionLimit {
        steps,
        why: format!(
            "{EXPANSION_STEPS_PER_BYTE} steps per byte of the file's {file_bytes} bytes, at \
             least {MIN_EXPANSION_LIMIT} and at most {}",
            crate::symmetric::MAX_EXPANDED_STEPS
        ),
    })
}

/// `HCCL_PLAN_MAX_STEPS`: `None` when unset or blank, else the positive number it holds.
pub fn max_steps_from_env() -> Result<Option<u64>, PlanError> {
    match std::env::var("HCCL_PLAN_MAX_STEPS") {
        Ok(v) if !v.trim().is_empty() => parse_max_steps(&v).map(Some),
        _ => Ok(None),
    }
}

/// A value of `HCCL_PLAN_MAX_STEPS`: a positive number of steps.
pub fn parse_max_steps(value: &str) -> Result<u64, PlanError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| PlanError::MaxSteps {
            value: value.to_string(),
        })
}

/// How deep plan text nests before the writer puts a value on one line.
const PLAN_DEPTH: usize = 6;

/// Pretty RON of `value` as plan files are written, on one line below `depth` levels.
fn pretty_ron<T: Serialize + ?Sized>(value: &T, depth: usize) -> String {
    let config = ron::ser::PrettyConfig::new()
        .indentor("  ".to_string())
        .struct_names(false)
        .depth_limit(depth)
        .compact_arrays(true);
    ron::ser::to_string_pretty(value, config).expect("plan values always serialise")
}

/// `text` with a rank index when it is long enough to be worth one (see
/// [`PlanFile::to_ron`]).
fn index_if_large(text: String) -> String {
    if text.len() >= crate::plan_index::INDEX_MIN_BYTES {
        return crate::plan_index::insert(&text).unwrap_or(text);
    }
    text
}

thread_local! {
    /// Whether [`PlanEntry`]'s reader on this thread keeps symmetric entries as templates
    /// ([`PlanFile::load_compact`]).
    static COMPACT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One plan entry's text as the plan's writer puts it in ([`PlanFile::to_ron`]), with where
/// its rank programs are (for the rank index): made on its own, so that a compiler writes a
/// collective's entries while it searches the others ([`PlanFile::to_ron_with`]).
#[derive(Debug, Clone)]
pub struct EntryText {
    text: String,
    /// Its rank lists, at offsets into `text`; `None` when the text looked unexpected.
    lists: Option<Vec<crate::plan_scan::RankList>>,
}

impl EntryText {
    /// `entry`'s text: written alone one level shallower than in the plan (so with a depth
    /// limit one less) and indented one level.
    pub fn of(entry: &PlanEntry) -> EntryText {
        let written = pretty_ron(entry, PLAN_DEPTH - 1);
        let mut text = String::with_capacity(written.len() + written.len() / 16);
        let mut lines = written.split('\n');
        text.push_str(lines.next().unwrap_or_default());
        for line in lines {
            text.push_str("\n  ");
            text.push_str(line);
        }
        let lists = crate::plan_scan::entry_rank_lists(&text);
        EntryText { text, lists }
    }
}

/// The rank lists of `texts`' entries in a plan's text whose entries start at byte `base`,
/// joined by `", "`; `None` when an entry's text looked unexpected.
fn lists_in_plan(texts: &[EntryText], mut base: usize) -> Option<Vec<crate::plan_scan::RankList>> {
    let mut lists = Vec::new();
    for part in texts {
        lists.extend(part.lists.as_ref()?.iter().map(|l| l.moved(base)));
        base += part.text.len() + 2;
    }
    Some(lists)
}

/// The contents of a plan file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(clippy::manual_non_exhaustive)]
pub struct PlanFile {
    pub format_version: u32,
    pub meta: PlanMeta,
    pub entries: Vec<PlanEntry>,
    /// Seals of the schedules the compiler verified ([`PlanFile::seal`]); empty when nobody
    /// sealed the plan, and then every entry is verified when a job loads it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified: Vec<Seal>,
    /// The rank index of the file it was read from (see [`PlanFile::to_ron`]): read past,
    /// never held; the writer makes it anew. (Private, so plans are made by
    /// [`PlanFile::new`].)
    #[serde(default, skip_serializing, deserialize_with = "skip_index")]
    rank_index: (),
}

/// Reads past a plan's `rank_index` string.
fn skip_index<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| ())
}

impl PlanFile {
    pub fn new(meta: PlanMeta) -> PlanFile {
        PlanFile {
            format_version: FORMAT_VERSION,
            meta,
            entries: Vec::new(),
            verified: Vec::new(),
            rank_index: (),
        }
    }

    /// The entry for `collective` (root included) at `bytes`, preferring one written for the
    /// requested buffer placement; falls back to the other placement.
    pub fn lookup(&self, collective: Collective, bytes: u64, in_place: bool) -> Option<&PlanEntry> {
        let mut candidates = self
            .entries
            .iter()
            .filter(|e| e.schedule.collective == collective && e.covers(bytes));
        let first = candidates.clone().next()?;
        Some(
            candidates
                .find(|e| e.schedule.in_place == in_place)
                .unwrap_or(first),
        )
    }

    /// Adds entries for `collective` (a Broadcast or Reduce with its root) derived from the
    /// entries of another root by [`Schedule::with_root`], when the plan has none for it.
    /// Returns how many entries were added.
    pub fn ensure_root(&mut self, collective: Collective) -> usize {
        let Some(root) = collective.root() else {
            return 0;
        };
        if self
            .entries
            .iter()
            .any(|e| e.schedule.collective == collective)
        {
            return 0;
        }
        let Some(source_root) = self
            .entries
            .iter()
            .filter(|e| e.schedule.collective.kind() == collective.kind())
            .filter_map(|e| e.schedule.collective.root())
            .min()
        else {
            return 0;
        };
        // A schedule relabelled from a sealed one is sealed too: the verifier's checks are
        // the same under any renumbering of the ranks.
        let sealed = self.sealed();
        let derived: Vec<(PlanEntry, bool)> = self
            .entries
            .iter()
            .zip(sealed)
            .filter(|(e, _)| {
                e.schedule.collective.kind() == collective.kind()
                    && e.schedule.collective.root() == Some(source_root)
            })
            .filter_map(|(e, sealed)| {
                let entry = PlanEntry {
                    schedule: e.schedule.with_root(root)?,
                    symmetry: None,
                    synthesis: None,
                    ..e.clone()
                };
                Some((entry, sealed))
            })
            .collect();
        let added = derived.len();
        for (entry, sealed) in derived {
            if sealed {
                self.add_seal(seal_of(&entry));
            }
            self.entries.push(entry);
        }
        added
    }

    /// Serialises to pretty RON. Output is deterministic for equal values. A text of
    /// [`crate::plan_index::INDEX_MIN_BYTES`] or more with explicit entries gets a rank index
    /// (see [`PlanFile::to_ron_indexed`]).
    pub fn to_ron(&self) -> String {
        self.render(false)
    }

    /// [`PlanFile::to_ron`] with a rank index whatever the size, when the plan has explicit
    /// entries: a line after `format_version` giving where every rank program of every
    /// explicit entry starts, so that [`PlanFile::load_for_ranks`] reads a rank's programs
    /// and the text around them instead of the whole file (see the crate's `plan_index`).
    pub fn to_ron_indexed(&self) -> String {
        self.render(true)
    }

    /// [`PlanFile::to_ron`]'s text made in one pass on this thread, where `to_ron` writes
    /// the entries side by side and splices them in. For tests that hold the two equal.
    #[doc(hidden)]
    pub fn to_ron_one_pass(&self) -> String {
        index_if_large(pretty_ron(self, PLAN_DEPTH))
    }

    /// [`PlanFile::to_ron`] from its entries' texts made beforehand ([`EntryText::of`], one
    /// per entry, in order): a compiler writes each collective's entries beside the search of
    /// the others, and only puts the text together at the end. Texts that are not as many as
    /// the entries are not used (the entries are written again).
    pub fn to_ron_with(&self, texts: Vec<EntryText>) -> String {
        if texts.len() != self.entries.len() {
            return self.to_ron();
        }
        self.assemble(texts, false)
    }

    /// The pretty text of the plan, with a rank index when `always_index` or when it is
    /// long enough ([`PlanFile::to_ron`]), its entries written on up to
    /// [`crate::par::cores`] threads (a compiled plan is megabytes of text, and writing it is
    /// the compile's last step) and put together by [`PlanFile::assemble`].
    fn render(&self, always_index: bool) -> String {
        // Entries differ a hundredfold in size: each thread takes the next entry left.
        let texts = crate::par::par_map(&self.entries, EntryText::of);
        self.assemble(texts, always_index)
    }

    /// The plan's text from its entries' `texts`. The text is the one-pass text
    /// ([`PlanFile::to_ron_one_pass`]): the plan's own fields are written around an empty
    /// entry list, each entry is written alone one level shallower (so with a depth limit one
    /// less) and indented one level ([`EntryText::of`]), and the entries go between the
    /// brackets joined as the writer joins the elements of a compact array (`), (`). The rank
    /// index comes from the rank lists each entry's writer found, with no pass over the whole
    /// text, and the text is put together once, index included.
    fn assemble(&self, texts: Vec<EntryText>, always_index: bool) -> String {
        let one_pass = |text: String| match always_index {
            true => crate::plan_index::insert(&text).unwrap_or(text),
            false => index_if_large(text),
        };
        let shell = PlanFile {
            format_version: self.format_version,
            meta: self.meta.clone(),
            entries: Vec::new(),
            verified: self.verified.clone(),
            rank_index: (),
        };
        let shell_text = pretty_ron(&shell, PLAN_DEPTH);
        let marker = "\n  entries: [],\n";
        if self.entries.is_empty() {
            return shell_text;
        }
        let Some(at) = shell_text.find(marker) else {
            return one_pass(pretty_ron(self, PLAN_DEPTH));
        };
        let (open, close, tail) = ("\n  entries: [", "],\n", &shell_text[at + marker.len()..]);
        let len = at
            + open.len()
            + texts.iter().map(|p| p.text.len() + 2).sum::<usize>()
            + close.len()
            + tail.len()
            - 2;
        // Every entry's rank lists at their offsets in the text without an index (`None`
        // when an entry's text looked unexpected: the text then goes without one, as a
        // scan of the whole would find).
        let lists = if always_index || len >= crate::plan_index::INDEX_MIN_BYTES {
            lists_in_plan(&texts, at + open.len())
        } else {
            None
        };
        let (index_at, index) = lists
            .and_then(|lists| crate::plan_index::placed(&shell_text[..at], &lists))
            .unwrap_or((0, String::new()));
        let mut text = String::with_capacity(len + index.len());
        text.push_str(&shell_text[..index_at]);
        text.push_str(&index);
        text.push_str(&shell_text[index_at..at]);
        text.push_str(open);
        for (i, part) in texts.iter().enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&part.text);
        }
        text.push_str(close);
        text.push_str(tail);
        text
    }

    /// Parses plan text; `origin` names the source (a path) in errors. Symmetric entries are
    /// read as templates and then expanded, each only when the plan's expansions stay within
    /// [`expansion_limit`] of `text`'s size (else [`PlanError::TooLarge`]).
    pub fn from_ron(text: &str, origin: &str) -> Result<PlanFile, PlanError> {
        let limit = (!COMPACT.get())
            .then(|| expansion_limit(text.len()))
            .transpose()?;
        PlanFile::parse(text, origin, limit)
    }

    /// [`PlanFile::from_ron`] with this limit on the steps its symmetric entries expand to,
    /// all together (whatever `HCCL_PLAN_MAX_STEPS` and the text's size say).
    pub fn from_ron_within(
        text: &str,
        origin: &str,
        max_steps: u64,
    ) -> Result<PlanFile, PlanError> {
        let limit = ExpansionLimit {
            steps: max_steps,
            why: "the limit the program set".into(),
        };
        PlanFile::parse(text, origin, Some(limit))
    }

    /// Parses plan text, its symmetric entries as templates, then expanded within `limit`
    /// when there is one (else left as templates: [`PlanFile::load_compact`]).
    fn parse(
        text: &str,
        origin: &str,
        limit: Option<ExpansionLimit>,
    ) -> Result<PlanFile, PlanError> {
        check_version(text, origin)?;
        let options = ron::Options::default().with_recursion_limit(64);
        // Templates are refused by the same limit as they are read, before they are built.
        let budget = match &limit {
            Some(limit) => limit.clone(),
            None => expansion_limit(text.len())?,
        };
        let before = COMPACT.replace(true);
        let parsed = crate::runs::with_budget(budget.steps, &budget.why, || {
            options.from_str::<PlanFile>(text)
        });
        COMPACT.set(before);
        let mut plan = parsed.map_err(|err| PlanError::Parse(Located::from_ron(origin, &err)))?;
        if plan.format_version < RUNS_VERSION && plan.has_own_seals() {
            let compact: Vec<SymmetricSchedule> =
                plan.entries.iter().filter_map(PlanEntry::compact).collect();
            crate::seal::upgrade_seals(&mut plan.verified, &compact);
        }
        if plan.format_version < DIGESTS_VERSION && plan.has_own_seals() {
            // (Symmetric entries are still templates here.)
            let explicit = plan.entries.iter().filter(|e| e.template.is_none());
            crate::seal::upgrade_explicit_seals(&mut plan.verified, explicit.map(|e| &e.schedule));
        }
        let mut plan = upgrade(plan, origin)?;
        plan.check_seals(origin)?;
        if let Some(limit) = limit {
            plan.expand_templates(limit, origin)?;
        }
        Ok(plan)
    }

    /// Expands every template entry (see [`PlanEntry::template`]), refusing, before it is
    /// allocated, the first whose expansion takes the plan's expanded steps past
    /// `limit` ([`PlanError::TooLarge`] naming the entry and the numbers).
    fn expand_templates(&mut self, limit: ExpansionLimit, origin: &str) -> Result<(), PlanError> {
        // The explicit programs count too: from format 6 they are written as runs, so a
        // small file can stand for many of their steps as well.
        let mut total: u64 = self
            .entries
            .iter()
            .filter(|e| e.template.is_none())
            .map(|e| e.schedule.step_count() as u64)
            .sum();
        for (i, entry) in self.entries.iter_mut().enumerate() {
            let Some(t) = entry.template.take() else {
                continue;
            };
            let template_steps = t.template_step_count() as u64;
            let expanded = u64::from(t.nranks).saturating_mul(template_steps);
            if total.saturating_add(expanded) > limit.steps {
                return Err(PlanError::TooLarge {
                    path: origin.to_string(),
                    entry: i,
                    collective: t.collective,
                    nranks: t.nranks,
                    template_steps,
                    expanded,
                    before: total,
                    limit: limit.steps,
                    why: limit.why,
                });
            }
            total += expanded;
            entry.schedule = t
                .expand_within(u64::MAX)
                .map_err(|source| PlanError::Expand {
                    path: origin.to_string(),
                    entry: i,
                    collective: t.collective,
                    source,
                })?;
            entry.symmetry = Some(t.symmetry.clone());
        }
        Ok(())
    }

    /// Reads and parses a plan file keeping every symmetric entry as its template
    /// ([`PlanEntry::template`], the schedule holding the header and empty programs): what
    /// verifying a whole plan needs ([`crate::verify::verify_entry`] proves a template on
    /// the template), in time and memory of one rank's program per entry instead of every
    /// rank's. Use [`PlanEntry::expand_template`] before running such an entry.
    pub fn load_compact(path: &Path) -> Result<PlanFile, PlanError> {
        let before = COMPACT.replace(true);
        let plan = PlanFile::load(path);
        COMPACT.set(before);
        plan
    }

    /// [`PlanFile::load_compact`] of plan text (what the fuzz target reads).
    pub(crate) fn from_ron_compact(text: &str, origin: &str) -> Result<PlanFile, PlanError> {
        let before = COMPACT.replace(true);
        let plan = PlanFile::from_ron(text, origin);
        COMPACT.set(before);
        plan
    }

    /// Builds the programs of `ranks` in every template entry of a compact plan
    /// ([`PlanFile::load_compact`]), leaving the template in place (it still stands for the
    /// whole schedule: its seal and its verification). Ranks past an entry are skipped.
    pub fn expand_ranks(&mut self, ranks: &[u32]) -> Result<(), crate::SymmetryError> {
        for entry in &mut self.entries {
            let Some(t) = &entry.template else { continue };
            let table = t.table()?;
            for &r in ranks {
                if let Some(slot) = entry.schedule.ranks.get_mut(r as usize) {
                    *slot = t.program_with(&table, r)?;
                }
            }
        }
        Ok(())
    }

    /// Reads and parses a plan file.
    pub fn load(path: &Path) -> Result<PlanFile, PlanError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| PlanError::Io {
            path: origin.clone(),
            source,
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|err| PlanError::NotText {
            path: origin.clone(),
            offset: err.valid_up_to(),
        })?;
        PlanFile::from_ron(text, &origin)
    }

    /// Parses plan text keeping only `rank`'s program in every schedule: the other ranks'
    /// programs are skipped during parsing (never built) and left empty
    /// (no streams, no scratch), so the result has the shape of the full plan but holds one
    /// rank's part. Such a plan does not verify and serves only that rank (an executor's view).
    /// A `rank` that some schedule does not have is an error located at that schedule.
    /// The part is checked against the plan's seals ([`PlanFile::from_ron_for_ranks`]).
    pub fn from_ron_for_rank(text: &str, origin: &str, rank: u32) -> Result<PlanFile, PlanError> {
        Ok(PlanFile::from_ron_for_ranks(text, origin, &[rank])?.plan)
    }

    /// Parses plan text keeping only the programs of `ranks` (see
    /// [`PlanFile::from_ron_for_rank`]), and refuses a sealed plan whose loaded programs no
    /// seal covers ([`PlanPart::check_seals`]: an edit after compiling).
    ///
    /// The other ranks' programs of explicit entries are skipped by a byte scan before the
    /// RON parse (the crate's `plan_scan` module), which only matches their brackets, strings and
    /// comments: a syntax or type error inside another rank's program is therefore not
    /// reported here (a part does not validate other ranks' programs;
    /// [`PlanFile::from_ron`] does). Everything else is checked as by the full parse, and
    /// errors are located in `text` as written.
    pub fn from_ron_for_ranks(
        text: &str,
        origin: &str,
        ranks: &[u32],
    ) -> Result<PlanPart, PlanError> {
        let budget = expansion_limit(text.len())?;
        crate::runs::with_budget(budget.steps, &budget.why, || {
            PlanFile::part_of_text(text, origin, ranks)
        })
    }

    /// [`PlanFile::from_ron_for_ranks`] within the budget it set.
    fn part_of_text(text: &str, origin: &str, ranks: &[u32]) -> Result<PlanPart, PlanError> {
        let wanted = sorted_ranks(ranks);
        // The rank index first; the byte scan only when there is none.
        let blanked = crate::plan_index::shrink(text, &wanted)
            .into_iter()
            .chain(std::iter::once_with(|| crate::plan_scan::shrink(text, &wanted)).flatten());
        for shrunk in blanked {
            if let Some(part) = part_of_blanked(&shrunk, origin, &wanted) {
                return part;
            }
        }
        // No explicit entry, or no blanked text parses: the real parse, on the text as
        // written, gives the result or the error with its location in the file.
        check_version(text, origin)?;
        let (plan, templates) = parse_ranks(text, &wanted)
            .map_err(|err| PlanError::Parse(Located::from_ron(origin, &err)))?;
        part_of(plan, wanted, templates, origin)
    }

    /// Reads a plan file keeping only `rank`'s part (see [`PlanFile::from_ron_for_rank`]).
    pub fn load_for_rank(path: &Path, rank: u32) -> Result<PlanFile, PlanError> {
        Ok(PlanFile::load_for_ranks(path, &[rank])?.plan)
    }

    /// Reads a plan file keeping only the programs of `ranks` (see
    /// [`PlanFile::from_ron_for_ranks`]).
    pub fn load_for_ranks(path: &Path, ranks: &[u32]) -> Result<PlanPart, PlanError> {
        let origin = path.display().to_string();
        // A file with a rank index: read only what the index says these ranks need.
        #[cfg(unix)]
        if let Ok(file) = std::fs::File::open(path)
            && let Ok(meta) = file.metadata()
            && let Ok(len) = usize::try_from(meta.len())
        {
            let wanted = sorted_ranks(ranks);
            let budget = expansion_limit(len)?;
            let src = crate::plan_index::FileSource { file, len };
            if let Some(part) = crate::plan_index::shrink(&src, &wanted).and_then(|shrunk| {
                crate::runs::with_budget(budget.steps, &budget.why, || {
                    part_of_blanked(&shrunk, &origin, &wanted)
                })
            }) {
                return part;
            }
        }
        let bytes = std::fs::read(path).map_err(|source| PlanError::Io {
            path: origin.clone(),
            source,
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|err| PlanError::NotText {
            path: origin.clone(),
            offset: err.valid_up_to(),
        })?;
        PlanFile::from_ron_for_ranks(text, &origin, ranks)
    }

    /// Writes the plan atomically: a temporary file beside `path`, then a rename, so a reader
    /// never sees half a plan and an existing file survives a failed write.
    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        crate::write_atomic(path, self.to_ron().as_bytes()).map_err(|source| PlanError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Seals every entry's schedule as passed by [`crate::verify::VERIFIER`] (replacing any
    /// seals the plan had). Call it only when the verifier has passed every entry: the seals
    /// let a job skip verifying them ([`PlanFile::sealed`]).
    pub fn seal(&mut self) {
        let seals: Vec<Seal> = self.entries.iter().map(seal_of).collect();
        self.verified.clear();
        for seal in seals {
            self.add_seal(seal);
        }
    }

    /// Adds `seal` ([`crate::seal::seal_of`] a schedule the verifier has passed), unless the
    /// plan holds it already.
    pub fn add_seal(&mut self, seal: Seal) {
        if !self.verified.contains(&seal) {
            self.verified.push(seal);
        }
    }

    /// Which entries a seal of this build's verifier covers (their schedules hash to a
    /// sealed one). An entry that is not covered must be verified before it runs.
    pub fn sealed(&self) -> Vec<bool> {
        if !self.has_own_seals() {
            return vec![false; self.entries.len()];
        }
        self.sealed_with(&self.schedule_hashes())
    }

    /// [`schedule_hash`] of every entry, in order: what [`PlanFile::sealed_with`] and
    /// [`PlanFile::identity_with`] take, for a caller that needs both (hashing a large plan
    /// costs seconds).
    pub fn schedule_hashes(&self) -> Vec<String> {
        self.entries.iter().map(schedule_hash).collect()
    }

    /// [`PlanFile::sealed`], given the entries' [`PlanFile::schedule_hashes`].
    pub fn sealed_with(&self, hashes: &[String]) -> Vec<bool> {
        let mine: std::collections::HashSet<&str> = self
            .verified
            .iter()
            .filter(|s| s.verifier == crate::verify::VERIFIER)
            .map(|s| s.schedule.as_str())
            .collect();
        hashes.iter().map(|h| mine.contains(h.as_str())).collect()
    }

    /// Whether the plan holds seals of this build's verifier.
    fn has_own_seals(&self) -> bool {
        self.verified
            .iter()
            .any(|s| s.verifier == crate::verify::VERIFIER)
    }

    /// Refuses a plan whose seals (of this build's verifier) leave an entry uncovered: a
    /// schedule edited after the plan was compiled. Plans without such seals pass.
    fn check_seals(&self, origin: &str) -> Result<(), PlanError> {
        if !self.has_own_seals() {
            return Ok(());
        }
        let hashes = self.schedule_hashes();
        match self.sealed_with(&hashes).iter().position(|&ok| !ok) {
            None => Ok(()),
            Some(i) => {
                let e = &self.entries[i];
                Err(PlanError::Edited {
                    path: origin.to_string(),
                    entry: i,
                    collective: e.schedule.collective,
                    algorithm: e.algorithm.clone(),
                    hash: hashes[i].clone(),
                })
            }
        }
    }

    /// Hex blake3 of the canonical serialisation: equal plans hash equally on every rank.
    pub fn content_hash(&self) -> String {
        blake3::hash(self.to_ron().as_bytes()).to_hex().to_string()
    }
}

/// `ranks` sorted, each once.
fn sorted_ranks(ranks: &[u32]) -> Vec<u32> {
    let mut wanted = ranks.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    wanted
}

/// The part of `wanted` (sorted) from a plan text whose other ranks' programs were blanked
/// (by the rank index or the scan); `None` when that text does not parse (the caller then
/// parses the text as written, whose errors are located in the file).
fn part_of_blanked(
    shrunk: &str,
    origin: &str,
    wanted: &[u32],
) -> Option<Result<PlanPart, PlanError>> {
    if let Err(e) = check_version(shrunk, origin) {
        return Some(Err(e));
    }
    let (plan, templates) = parse_ranks(shrunk, wanted).ok()?;
    Some(part_of(plan, wanted.to_vec(), templates, origin))
}

/// The part of a plan parsed for `wanted` ([`parse_ranks`]), as the current format and
/// checked against its seals (by the digests its own format lists).
fn part_of(
    plan: PlanFile,
    wanted: Vec<u32>,
    templates: Vec<Option<String>>,
    origin: &str,
) -> Result<PlanPart, PlanError> {
    let legacy_digests = plan.format_version < DIGESTS_VERSION;
    PlanPart::new(
        upgrade(plan, origin)?,
        wanted,
        templates,
        legacy_digests,
        origin,
    )
}

/// [`PlanFile::from_ron_for_rank`] without the byte-scan pre-pass: every other rank's
/// program goes through the RON parser (and is skipped there).
#[cfg(test)]
fn from_ron_for_rank_unshrunk(text: &str, origin: &str, rank: u32) -> Result<PlanFile, PlanError> {
    check_version(text, origin)?;
    let (plan, _) = parse_ranks(text, &[rank])
        .map_err(|err| PlanError::Parse(Located::from_ron(origin, &err)))?;
    upgrade(plan, origin)
}

/// Parses `text` keeping only the programs of `ranks` (sorted; no version checks), with the
/// hash of every symmetric entry's template as read.
fn parse_ranks(
    text: &str,
    ranks: &[u32],
) -> Result<(PlanFile, Vec<Option<String>>), ron::error::SpannedError> {
    let options = ron::Options::default().with_recursion_limit(64);
    // Templates are kept past their entry only to upgrade the seals of an older format.
    let keep = head_version(text).is_none_or(|v| v < u64::from(RUNS_VERSION));
    WANTED_RANKS
        .with(|w| {
            let previous = w.replace(Some(ranks.to_vec()));
            let kept = KEEP_TEMPLATES.replace(keep);
            let parsed = options.from_str::<one_rank::Plan>(text);
            KEEP_TEMPLATES.set(kept);
            w.replace(previous);
            parsed
        })
        .map(one_rank::Plan::into_plan)
}

thread_local! {
    /// Whether the one-rank parse on this thread keeps symmetric entries' templates (to
    /// upgrade the seals of a file before format 5, see [`crate::seal::upgrade_seals`]).
    static KEEP_TEMPLATES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

thread_local! {
    /// The ranks (sorted) [`PlanFile::from_ron_for_ranks`] keeps while it parses on this
    /// thread.
    static WANTED_RANKS: std::cell::RefCell<Option<Vec<u32>>> =
        const { std::cell::RefCell::new(None) };
}

/// The ranks being kept (see [`WANTED_RANKS`]).
fn wanted_ranks() -> Option<Vec<u32>> {
    WANTED_RANKS.with(|w| w.borrow().clone())
}

/// Mirrors of [`PlanFile`], [`PlanEntry`] and [`Schedule`] (same RON shape, same field rules)
/// whose `ranks` list deserialises only the elements of [`WANTED_RANKS`] and skips the
/// others with [`serde::de::IgnoredAny`].
mod one_rank {
    use super::{PlanEntry, PlanFile, PlanMeta, wanted_ranks, wire};
    use crate::schedule::{Collective, RankProgram, Schedule};
    use crate::symmetric::SymmetricSchedule;
    use serde::Deserialize;
    use serde::de::{self, IgnoredAny, SeqAccess, Visitor};

    #[derive(Deserialize)]
    #[serde(rename = "PlanFile", deny_unknown_fields)]
    pub(super) struct Plan {
        format_version: u32,
        meta: PlanMeta,
        entries: Vec<Entry>,
        #[serde(default)]
        verified: Vec<super::Seal>,
        #[serde(default, rename = "rank_index", deserialize_with = "super::skip_index")]
        _rank_index: (),
    }

    /// An entry holding only the wanted ranks' programs and, when it was written symmetric,
    /// the hash of its template as read, and the schedule itself when it is kept (see
    /// [`super::KEEP_TEMPLATES`]).
    struct Entry(PlanEntry, Option<(String, Option<SymmetricSchedule>)>);

    fn empty() -> RankProgram {
        RankProgram {
            scratch_chunks: 0,
            streams: Vec::new(),
        }
    }

    impl<'de> Deserialize<'de> for Entry {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
            use serde::de::Error;
            let wanted = wanted_ranks();
            let mut template = None;
            let entry = wire::In::<Sched>::deserialize(d)?
                .into_entry(|form| match form {
                    wire::Form::Explicit(s) => Ok((
                        Schedule {
                            collective: s.collective,
                            nranks: s.nranks,
                            chunks: s.chunks,
                            input_chunks: s.input_chunks,
                            output_chunks: s.output_chunks,
                            in_place: s.in_place,
                            ranks: s.ranks,
                        },
                        None,
                    )),
                    wire::Form::Symmetric(sym) => {
                        let fail = |e| format!("symmetric schedule: {e}");
                        let table = sym.table().map_err(fail)?;
                        let hash = crate::seal::symmetric_hash(&sym);
                        let keep = super::KEEP_TEMPLATES.get();
                        let symmetry = sym.symmetry.clone();
                        let Some(wanted) = &wanted else {
                            let schedule = sym.expand().map_err(fail)?;
                            template = Some((hash, keep.then_some(sym)));
                            return Ok((schedule, Some(symmetry)));
                        };
                        let mut ranks = vec![empty(); sym.nranks as usize];
                        let mut sym = sym;
                        for (i, &rank) in wanted.iter().enumerate() {
                            let program = if keep || i + 1 < wanted.len() {
                                sym.program_with(&table, rank).map_err(fail)?
                            } else {
                                // The last rank's program: the template translated in place.
                                let mut program = std::mem::replace(&mut sym.template, empty());
                                sym.translate_in_place(&table, rank, &mut program)
                                    .map_err(fail)?;
                                program
                            };
                            if let Some(slot) = ranks.get_mut(rank as usize) {
                                *slot = program;
                            }
                        }
                        let schedule = Schedule::from_header(sym.header(), ranks);
                        template = Some((hash, keep.then_some(sym)));
                        Ok((schedule, Some(symmetry)))
                    }
                })
                .map_err(D::Error::custom)?;
            Ok(Entry(entry, template))
        }
    }

    #[derive(Deserialize)]
    #[serde(rename = "Schedule", deny_unknown_fields)]
    struct Sched {
        collective: Collective,
        nranks: u32,
        chunks: u32,
        input_chunks: u32,
        output_chunks: u32,
        in_place: bool,
        #[serde(deserialize_with = "wanted_ranks_only")]
        ranks: Vec<RankProgram>,
    }

    impl Plan {
        /// The plan and, per entry, the hash of its template as read (`None` for an explicit
        /// entry); the seals of a file before format 5 are upgraded first
        /// ([`crate::seal::upgrade_seals`]).
        pub(super) fn into_plan(self) -> (PlanFile, Vec<Option<String>>) {
            let (entries, templates): (Vec<PlanEntry>, Vec<_>) =
                self.entries.into_iter().map(|e| (e.0, e.1)).unzip();
            let mut verified = self.verified;
            if self.format_version < super::RUNS_VERSION {
                crate::seal::upgrade_seals(
                    &mut verified,
                    templates.iter().flatten().filter_map(|(_, t)| t.as_ref()),
                );
            }
            let hashes = templates.into_iter().map(|t| t.map(|(h, _)| h)).collect();
            let plan = PlanFile {
                format_version: self.format_version,
                meta: self.meta,
                entries,
                // Checked against the loaded programs by `PlanPart::check_seals`.
                verified,
                rank_index: (),
            };
            (plan, hashes)
        }
    }

    fn wanted_ranks_only<'de, D: de::Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<RankProgram>, D::Error> {
        struct Ranks(Option<Vec<u32>>);
        impl<'de> Visitor<'de> for Ranks {
            type Value = Vec<RankProgram>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of rank programs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                loop {
                    let index = out.len() as u64;
                    let keep = self.0.as_ref().is_none_or(|w| {
                        u32::try_from(index).is_ok_and(|i| w.binary_search(&i).is_ok())
                    });
                    if keep {
                        match seq.next_element::<RankProgram>()? {
                            Some(p) => out.push(p),
                            None => break,
                        }
                    } else {
                        match seq.next_element::<IgnoredAny>()? {
                            Some(_) => out.push(empty()),
                            None => break,
                        }
                    }
                }
                if let Some(&r) = self.0.as_ref().and_then(|w| w.last())
                    && r as usize >= out.len()
                {
                    return Err(de::Error::custom(format!(
                        "rank {r} is out of range: the schedule has {} rank programs",
                        out.len()
                    )));
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Ranks(wanted_ranks()))
    }
}

/// The error for a file of format `found`, unless this build reads it.
fn version_error(found: u64, origin: &str) -> Result<(), PlanError> {
    if (u64::from(MIN_FORMAT_VERSION)..=u64::from(FORMAT_VERSION)).contains(&found) {
        return Ok(());
    }
    Err(PlanError::Version {
        path: origin.to_string(),
        found,
        supported: FORMAT_VERSION,
    })
}

/// A parsed plan as the current format: refuses a version the text check could not see (the
/// field placed far into the file), then records the plan as [`FORMAT_VERSION`] (older
/// formats are subsets of the current one).
fn upgrade(mut plan: PlanFile, origin: &str) -> Result<PlanFile, PlanError> {
    version_error(u64::from(plan.format_version), origin)?;
    plan.format_version = FORMAT_VERSION;
    Ok(plan)
}

/// Refuses files from another format before the full parse, so the user reads "version 7 is
/// not supported by this build" instead of an error about some field that changed meaning.
fn check_version(text: &str, origin: &str) -> Result<(), PlanError> {
    match head_version(text) {
        Some(found) => version_error(found, origin),
        None => Ok(()), // the full parse reports a missing field with its location
    }
}

/// The `format_version` written near the start of `text`, when a quick look finds it.
fn head_version(text: &str) -> Option<u64> {
    let head: String = text.chars().take(4096).collect();
    let pos = head.find("format_version")?;
    let rest = head[pos + "format_version".len()..].trim_start();
    let rest = rest.strip_prefix(':')?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{RankProgram, Stream};

    fn plan() -> PlanFile {
        let mut plan = PlanFile::new(PlanMeta {
            topology: "t".into(),
            topology_hash: String::new(),
            compiler: "test".into(),
        });
        for (i, collective) in [Collective::AllReduce, Collective::Broadcast { root: 2 }]
            .into_iter()
            .enumerate()
        {
            let mut schedule = Schedule::empty(collective, 4, 4, i == 1).expect("fits");
            for (r, prog) in schedule.ranks.iter_mut().enumerate() {
                prog.scratch_chunks = r as u32 + 1;
                prog.streams.push(Stream {
                    channel: r as u32,
                    steps: Vec::new(),
                });
            }
            plan.entries.push(PlanEntry {
                min_bytes: 0,
                max_bytes: None,
                algorithm: "ring".into(),
                protocol: Protocol::Simple,
                cost: Some(CostFit {
                    latency_us: 1.0,
                    algbw_gbps: 2.0,
                }),
                schedule,
                symmetry: None,
                // One entry records a synthesis: it survives both readers.
                synthesis: (i == 1).then(|| Synthesis {
                    method: "lp-tree-packing".into(),
                    objective: "maximise the rate".into(),
                    value: 150.5,
                    optimum: 157.875,
                    unit: "GB/s".into(),
                    proven: true,
                }),
                template: None,
            });
        }
        plan
    }

    /// The entries written side by side and spliced in give the one-pass text, with no
    /// entry, one, and more entries than threads, with and without seals; and so does the
    /// rank index their writers found, against one found by scanning the one-pass text.
    #[test]
    fn plan_text_is_the_one_pass_text() {
        let mut plan = plan();
        let two = plan.entries.clone();
        for round in 0..4 {
            assert_eq!(plan.to_ron(), plan.to_ron_one_pass(), "round {round}");
            let one_pass = pretty_ron(&plan, PLAN_DEPTH);
            let scanned = crate::plan_index::insert(&one_pass).unwrap_or(one_pass);
            assert_eq!(plan.to_ron_indexed(), scanned, "round {round}");
            // From entry texts made beforehand; too few are not used.
            let texts: Vec<EntryText> = plan.entries.iter().map(EntryText::of).collect();
            assert_eq!(
                plan.to_ron_with(texts.clone()),
                plan.to_ron(),
                "round {round}"
            );
            if let Some((_, fewer)) = texts.split_last() {
                assert_eq!(
                    plan.to_ron_with(fewer.to_vec()),
                    plan.to_ron(),
                    "round {round}"
                );
            }
            assert_eq!(
                plan.to_ron_indexed().contains("rank_index"),
                !plan.entries.is_empty(),
                "round {round}"
            );
            match round {
                0 => plan.entries.truncate(1),
                1 => plan.entries.clear(),
                _ => {
                    for _ in 0..5 {
                        plan.entries.extend(two.iter().cloned());
                    }
                    let seal = seal_of(&plan.entries[0]);
                    plan.add_seal(seal);
                }
            }
        }
    }

    #[test]
    fn seals_cover_the_verified_schedules_and_catch_edits() {
        let mut p = plan();
        assert!(p.sealed().iter().all(|s| !s));
        p.seal();
        assert_eq!(p.verified.len(), 2);
        assert!(p.sealed().iter().all(|s| *s));
        let text = p.to_ron();
        assert!(text.contains(&format!("format_version: {FORMAT_VERSION}")));
        assert!(text.contains("verified:"));
        let back = PlanFile::from_ron(&text, "p").expect("a sealed plan loads");
        assert_eq!(back, p);
        assert!(back.sealed().iter().all(|s| *s));
        // Sizes and names are not what a seal covers.
        let resized = text.replacen("max_bytes: None", "max_bytes: Some(64)", 1);
        assert_ne!(resized, text);
        assert!(PlanFile::from_ron(&resized, "p").is_ok());
        // A schedule edited after sealing: refused with the entry named.
        let edited = text.replacen("scratch_chunks: 2", "scratch_chunks: 9", 1);
        assert_ne!(edited, text);
        let err = PlanFile::from_ron(&edited, "p.ron").expect_err("edited");
        assert!(matches!(err, PlanError::Edited { entry: 0, .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with("p.ron: entry 0 (allreduce ring)"), "{msg}");
        // Seals of another verifier: ignored, every entry unsealed.
        let other = edited.replace(crate::verify::VERIFIER, "hccl-ir 0.0.1");
        let loaded = PlanFile::from_ron(&other, "p").expect("foreign seals are ignored");
        assert!(loaded.sealed().iter().all(|s| !s));
        // Entries reordered: each keeps its seal.
        p.entries.reverse();
        assert!(p.sealed().iter().all(|s| *s));
        // Entries derived for another root are sealed with their source, and load back.
        assert_eq!(p.ensure_root(Collective::Broadcast { root: 1 }), 1);
        assert!(p.sealed().iter().all(|s| *s));
        assert!(PlanFile::from_ron(&p.to_ron(), "p").is_ok());
    }

    #[test]
    fn one_rank_load_keeps_that_rank_only() {
        let full = plan();
        let text = full.to_ron();
        for rank in 0..4u32 {
            let part = PlanFile::from_ron_for_rank(&text, "p", rank).expect("parses");
            let mut expected = full.clone();
            for e in &mut expected.entries {
                for (r, prog) in e.schedule.ranks.iter_mut().enumerate() {
                    if r as u32 != rank {
                        *prog = RankProgram {
                            scratch_chunks: 0,
                            streams: Vec::new(),
                        };
                    }
                }
            }
            assert_eq!(part, expected, "rank {rank}");
        }
        // The full parse is unaffected by a one-rank parse on the same thread.
        assert_eq!(PlanFile::from_ron(&text, "p").expect("parses"), full);
    }

    #[test]
    fn one_rank_load_rejects_what_the_full_load_rejects() {
        let text = plan().to_ron();
        let err = PlanFile::from_ron_for_rank(&text, "p", 4).expect_err("rank 4 of 4");
        assert!(err.to_string().contains("rank 4 is out of range"), "{err}");
        let bad = text.replacen("in_place", "in_placed", 1);
        assert!(PlanFile::from_ron(&bad, "p").is_err());
        assert!(PlanFile::from_ron_for_rank(&bad, "p", 0).is_err());
        let version = format!("format_version: {FORMAT_VERSION}");
        let newer = text.replacen(&version, "format_version: 9", 1);
        assert_ne!(newer, text);
        assert!(matches!(
            PlanFile::from_ron_for_rank(&newer, "p", 0),
            Err(PlanError::Version { found: 9, .. })
        ));
    }

    /// `plan()`'s text with comments, strings and chars holding brackets and `ranks` in and
    /// between the rank programs, struct names, and a trailing comma.
    fn decorated() -> String {
        plan()
            .to_ron()
            .replacen("ranks: [", "ranks /* ranks: [ */ : [ // ( ] ranks: [\n", 1)
            .replace("streams: [", "streams: /* a /* nested ( */ ] */ [")
            .replacen(
                "algorithm: \"ring\"",
                "algorithm: \"r)i]n\\\"g ranks: [\"",
                1,
            )
            .replacen("algorithm: \"ring\"", "algorithm: r#\"a\"]\"#", 1)
            .replacen("(scratch_chunks: 2", "RankProgram(scratch_chunks: 2", 1)
    }

    #[test]
    fn scan_then_parse_equals_the_parser_alone() {
        let texts = [
            plan().to_ron(),
            decorated(),
            decorated().replace("]),\n", "]),,\n"),
        ];
        for text in &texts {
            for rank in 0..5u32 {
                let fast = PlanFile::from_ron_for_rank(text, "p", rank).map_err(|e| e.to_string());
                let slow = from_ron_for_rank_unshrunk(text, "p", rank).map_err(|e| e.to_string());
                assert_eq!(fast, slow, "rank {rank} of {text}");
            }
        }
        let part = PlanFile::from_ron_for_rank(&texts[1], "p", 1).expect("parses");
        assert_eq!(part.entries[0].algorithm, "r)i]n\"g ranks: [");
        assert_eq!(part.entries[1].algorithm, "a\"]");
        assert_eq!(part.entries[1].schedule.ranks[1].scratch_chunks, 2);
        assert!(
            crate::plan_scan::shrink(&texts[1], &[1]).is_some(),
            "the scan applies"
        );
    }

    #[test]
    fn out_of_range_rank_error_is_located_in_the_file() {
        let text = decorated();
        let fast = PlanFile::from_ron_for_rank(&text, "p", 4).expect_err("rank 4 of 4");
        let slow = from_ron_for_rank_unshrunk(&text, "p", 4).expect_err("rank 4 of 4");
        assert_eq!(fast.to_string(), slow.to_string());
        assert!(
            fast.to_string().contains("rank 4 is out of range"),
            "{fast}"
        );
    }

    #[test]
    fn other_ranks_programs_are_not_validated() {
        let text = plan().to_ron();
        // A type error in rank 2's program of the first entry.
        let bad = text.replacen("scratch_chunks: 3", "scratch_chunks: \"x\"", 1);
        assert!(PlanFile::from_ron(&bad, "p").is_err());
        assert!(
            from_ron_for_rank_unshrunk(&bad, "p", 0).is_ok(),
            "IgnoredAny skips it"
        );
        assert!(PlanFile::from_ron_for_rank(&bad, "p", 0).is_ok());
        let err = PlanFile::from_ron_for_rank(&bad, "p", 2).expect_err("rank 2 reads it");
        let slow = from_ron_for_rank_unshrunk(&bad, "p", 2).expect_err("rank 2 reads it");
        assert_eq!(err.to_string(), slow.to_string(), "located in the file");
    }

    /// A sealed plan of one symmetric entry whose template is deep (strided runs).
    fn deep_plan() -> PlanFile {
        use crate::symmetric::{BlockLabel, BlockLayout, ChunkMap};
        let sym = SymmetricSchedule {
            collective: Collective::AllReduce,
            nranks: 8,
            chunks: 512,
            input_chunks: 512,
            output_chunks: 512,
            in_place: false,
            symmetry: Symmetry::ring(
                (0..8).collect(),
                Some(ChunkMap {
                    layout: BlockLayout::BlockMajor,
                    label: BlockLabel::Rank,
                }),
            ),
            template: crate::runs::tests::deep(),
        };
        let mut plan = PlanFile::new(PlanMeta {
            topology: "t".into(),
            topology_hash: String::new(),
            compiler: "test".into(),
        });
        plan.entries.push(PlanEntry {
            min_bytes: 0,
            max_bytes: None,
            algorithm: "deep".into(),
            protocol: Protocol::Simple,
            cost: None,
            schedule: sym.expand().expect("expands"),
            symmetry: Some(sym.symmetry.clone()),
            synthesis: None,
            template: None,
        });
        assert!(plan.entries[0].is_compact());
        plan.seal();
        plan
    }

    #[test]
    fn deep_templates_are_written_with_runs_and_read_back() {
        let plan = deep_plan();
        let text = plan.to_ron();
        assert!(text.contains("repeat: ("), "{text}");
        assert_eq!(text.matches("op: ").count(), 4, "{text}");
        assert_eq!(PlanFile::from_ron(&text, "p").expect("reads"), plan);
        for rank in 0..8 {
            let part = PlanFile::from_ron_for_ranks(&text, "p", &[rank]).expect("reads");
            assert_eq!(part.sealed(), vec![true]);
            assert_eq!(part.identity(), Some(plan.identity()));
            assert_eq!(
                part.plan.entries[0].schedule.ranks[rank as usize],
                plan.entries[0].schedule.ranks[rank as usize]
            );
        }
    }

    #[test]
    fn an_edited_repeat_breaks_the_seal() {
        let text = deep_plan().to_ron();
        let edited = text.replacen("times: 12", "times: 11", 1);
        assert_ne!(edited, text);
        // Still a well-formed template (one step fewer): the seal catches it.
        let err = PlanFile::from_ron(&edited, "p.ron").expect_err("edited");
        assert!(matches!(err, PlanError::Edited { entry: 0, .. }), "{err}");
        let err = PlanFile::from_ron_for_rank(&edited, "p.ron", 3).expect_err("edited");
        assert!(matches!(err, PlanError::Edited { entry: 0, .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("p.ron: entry 0 (allreduce deep) was changed"),
            "{err}"
        );
        // A stride edited.
        let edited = text.replacen("src: 32,", "src: 33,", 1);
        assert_ne!(edited, text);
        assert!(matches!(
            PlanFile::from_ron_for_rank(&edited, "p", 0),
            Err(PlanError::Edited { .. })
        ));
    }

    #[test]
    fn malformed_repeats_in_a_plan_are_located_errors() {
        let text = deep_plan().to_ron();
        for (from, to, fragment) in [
            ("times: 12", "times: 0", "times is 0"),
            ("src: 32,", "src: -32,", "leaves 0..2^32"),
            (
                "times: 12",
                "times: 12, often: 1",
                "Unexpected field named `often`",
            ),
            (
                "deps: [(stream: 0, step: 1)]",
                "deps: [(stream: 0, step: 4294967295)]",
                "leaves 0..2^32",
            ),
        ] {
            let bad = text.replacen(from, to, 1);
            assert_ne!(bad, text, "{from}");
            for result in [
                PlanFile::from_ron(&bad, "p.ron").map(|_| ()),
                PlanFile::from_ron_for_rank(&bad, "p.ron", 1).map(|_| ()),
            ] {
                let err = result.expect_err(to);
                let PlanError::Parse(located) = &err else {
                    panic!("{to}: {err}");
                };
                assert!(located.line > 1, "{to}: {err}");
                assert!(err.to_string().contains(fragment), "{to}: {err}");
            }
        }
    }

    #[test]
    fn format_4_seals_still_hold() {
        let plan = deep_plan();
        let sym = plan.entries[0].compact().expect("symmetric");
        // The file format 4 wrote: the template expanded, sealed by its RON's hash.
        let v4 = format!(
            "(format_version: 4, meta: (topology: \"t\", compiler: \"test\"), entries: [(min_bytes: 0, max_bytes: None, algorithm: \"deep\", protocol: Simple, symmetric: {})], verified: [(verifier: \"{}\", schedule: \"{}\")])",
            ron::to_string(&sym).expect("serialises"),
            crate::verify::VERIFIER,
            crate::seal::symmetric_hash_v4(&sym),
        );
        assert!(!v4.contains("repeat"));
        let full = PlanFile::from_ron(&v4, "v4").expect("a sealed v4 plan loads");
        assert_eq!(full.sealed(), vec![true]);
        assert_eq!(full, plan, "held as the current format, seals included");
        let part = PlanFile::from_ron_for_ranks(&v4, "v4", &[5]).expect("one rank loads");
        assert_eq!(part.sealed(), vec![true]);
        assert_eq!(part.identity(), Some(full.identity()));
        // The same text claiming format 5: its seal names another hash.
        let claimed = v4.replacen("format_version: 4", "format_version: 5", 1);
        for err in [
            PlanFile::from_ron(&claimed, "v").expect_err("v5 hash"),
            PlanFile::from_ron_for_rank(&claimed, "v", 0).expect_err("v5 hash"),
        ] {
            assert!(matches!(err, PlanError::Edited { .. }), "{err}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Mutated text never panics, and whenever the parser alone accepts it the scan
        /// path returns the same plan.
        #[test]
        fn mutated_text_agrees_with_the_parser_alone(
            which in 0usize..2,
            edits in proptest::collection::vec((0.0f64..1.0, 0usize..18, 0usize..3), 1..4),
            rank in 0u32..5,
        ) {
            const BYTES: &[u8] = b"()[]{}\",'/*#r\\: bn";
            let mut bytes = if which == 0 { plan().to_ron() } else { decorated() }.into_bytes();
            for (at, b, kind) in edits {
                let at = ((bytes.len() as f64) * at) as usize;
                let b = BYTES[b % BYTES.len()];
                match kind {
                    0 => bytes.insert(at, b),
                    1 if at < bytes.len() => { bytes.remove(at); }
                    _ if at < bytes.len() => bytes[at] = b,
                    _ => bytes.push(b),
                }
            }
            let text = String::from_utf8(bytes).expect("ASCII edits of ASCII text");
            let fast = PlanFile::from_ron_for_rank(&text, "p", rank);
            if let Ok(slow) = from_ron_for_rank_unshrunk(&text, "p", rank) {
                proptest::prop_assert_eq!(fast.ok(), Some(slow));
            }
        }
    }
}
