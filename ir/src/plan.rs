//! Plan files: schedules keyed by collective and message-size range, plus metadata.
//!
//! A plan file is RON (human-readable, diffable, checked into a job's repository):
//!
//! ```ron
//! (
//!     format_version: 1,
//!     meta: (topology: "dgx1", topology_hash: "…", compiler: "hcclc 0.1.0"),
//!     entries: [ (min_bytes: 0, max_bytes: Some(262144), algorithm: "ring", …, schedule: (…)) ],
//! )
//! ```
//!
//! `format_version` comes first so that a reader can refuse a file written for a newer format
//! with a clear message before it tries to make sense of the rest.

use crate::error::{Located, PlanError};
use crate::schedule::{Collective, Schedule};
use crate::symmetric::Symmetry;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The plan format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

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

/// One schedule and the message sizes it is chosen for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanEntry {
    /// Smallest message size (bytes, nccl-tests convention) this entry serves.
    pub min_bytes: u64,
    /// Exclusive upper bound; `None` means unbounded.
    pub max_bytes: Option<u64>,
    /// Family name (`ring`, `double_ring`, `hybrid_cube`, …) or the imported algorithm's name.
    pub algorithm: String,
    pub protocol: Protocol,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostFit>,
    pub schedule: Schedule,
    /// The rank symmetry the producer claims `schedule` has; when the schedule is invariant
    /// under it the entry is written in the compact symmetric form.
    #[serde(skip)]
    pub symmetry: Option<Symmetry>,
}

impl PlanEntry {
    pub fn covers(&self, bytes: u64) -> bool {
        self.min_bytes <= bytes && self.max_bytes.is_none_or(|max| bytes < max)
    }
}

/// The contents of a plan file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    pub format_version: u32,
    pub meta: PlanMeta,
    pub entries: Vec<PlanEntry>,
}

impl PlanFile {
    pub fn new(meta: PlanMeta) -> PlanFile {
        PlanFile {
            format_version: FORMAT_VERSION,
            meta,
            entries: Vec::new(),
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
        let derived: Vec<PlanEntry> = self
            .entries
            .iter()
            .filter(|e| {
                e.schedule.collective.kind() == collective.kind()
                    && e.schedule.collective.root() == Some(source_root)
            })
            .filter_map(|e| {
                Some(PlanEntry {
                    schedule: e.schedule.with_root(root)?,
                    ..e.clone()
                })
            })
            .collect();
        let added = derived.len();
        self.entries.extend(derived);
        added
    }

    /// Serialises to pretty RON. Output is deterministic for equal values.
    pub fn to_ron(&self) -> String {
        let config = ron::ser::PrettyConfig::new()
            .indentor("  ".to_string())
            .struct_names(false)
            .depth_limit(6)
            .compact_arrays(true);
        ron::ser::to_string_pretty(self, config).expect("plan values always serialise")
    }

    /// Parses plan text; `origin` names the source (a path) in errors.
    pub fn from_ron(text: &str, origin: &str) -> Result<PlanFile, PlanError> {
        check_version(text, origin)?;
        let options = ron::Options::default().with_recursion_limit(64);
        options
            .from_str::<PlanFile>(text)
            .map_err(|err| PlanError::Parse(Located::from_ron(origin, &err)))
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
    pub fn from_ron_for_rank(text: &str, origin: &str, rank: u32) -> Result<PlanFile, PlanError> {
        check_version(text, origin)?;
        let options = ron::Options::default().with_recursion_limit(64);
        let partial = WANTED_RANK.with(|w| {
            let previous = w.replace(Some(rank));
            let parsed = options.from_str::<one_rank::Plan>(text);
            w.set(previous);
            parsed
        });
        partial
            .map(one_rank::Plan::into_plan)
            .map_err(|err| PlanError::Parse(Located::from_ron(origin, &err)))
    }

    /// Reads a plan file keeping only `rank`'s part (see [`PlanFile::from_ron_for_rank`]).
    pub fn load_for_rank(path: &Path, rank: u32) -> Result<PlanFile, PlanError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| PlanError::Io {
            path: origin.clone(),
            source,
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|err| PlanError::NotText {
            path: origin.clone(),
            offset: err.valid_up_to(),
        })?;
        PlanFile::from_ron_for_rank(text, &origin, rank)
    }

    /// Writes the plan atomically: a temporary file beside `path`, then a rename, so a reader
    /// never sees half a plan and an existing file survives a failed write.
    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        crate::write_atomic(path, self.to_ron().as_bytes()).map_err(|source| PlanError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Hex blake3 of the canonical serialisation: equal plans hash equally on every rank.
    pub fn content_hash(&self) -> String {
        blake3::hash(self.to_ron().as_bytes()).to_hex().to_string()
    }
}

thread_local! {
    /// The rank [`PlanFile::from_ron_for_rank`] keeps while it parses on this thread.
    static WANTED_RANK: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Mirrors of [`PlanFile`], [`PlanEntry`] and [`Schedule`] (same RON shape, same field rules)
/// whose `ranks` list deserialises only the element [`WANTED_RANK`] and skips the others
/// with [`serde::de::IgnoredAny`].
mod one_rank {
    use super::{CostFit, PlanEntry, PlanFile, PlanMeta, Protocol, WANTED_RANK};
    use crate::schedule::{Collective, RankProgram, Schedule};
    use serde::Deserialize;
    use serde::de::{self, IgnoredAny, SeqAccess, Visitor};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Plan {
        format_version: u32,
        meta: PlanMeta,
        entries: Vec<Entry>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        min_bytes: u64,
        max_bytes: Option<u64>,
        algorithm: String,
        protocol: Protocol,
        #[serde(default)]
        cost: Option<CostFit>,
        schedule: Sched,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sched {
        collective: Collective,
        nranks: u32,
        chunks: u32,
        input_chunks: u32,
        output_chunks: u32,
        in_place: bool,
        #[serde(deserialize_with = "wanted_rank_only")]
        ranks: Vec<RankProgram>,
    }

    impl Plan {
        pub(super) fn into_plan(self) -> PlanFile {
            PlanFile {
                format_version: self.format_version,
                meta: self.meta,
                entries: self
                    .entries
                    .into_iter()
                    .map(|e| PlanEntry {
                        min_bytes: e.min_bytes,
                        max_bytes: e.max_bytes,
                        algorithm: e.algorithm,
                        protocol: e.protocol,
                        cost: e.cost,
                        schedule: Schedule {
                            collective: e.schedule.collective,
                            nranks: e.schedule.nranks,
                            chunks: e.schedule.chunks,
                            input_chunks: e.schedule.input_chunks,
                            output_chunks: e.schedule.output_chunks,
                            in_place: e.schedule.in_place,
                            ranks: e.schedule.ranks,
                        },
                        symmetry: None,
                    })
                    .collect(),
            }
        }
    }

    fn wanted_rank_only<'de, D: de::Deserializer<'de>>(d: D) -> Result<Vec<RankProgram>, D::Error> {
        struct Ranks(Option<u32>);
        impl<'de> Visitor<'de> for Ranks {
            type Value = Vec<RankProgram>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of rank programs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                loop {
                    let index = out.len();
                    let keep = self.0.is_none_or(|r| r as usize == index);
                    if keep {
                        match seq.next_element::<RankProgram>()? {
                            Some(p) => out.push(p),
                            None => break,
                        }
                    } else {
                        match seq.next_element::<IgnoredAny>()? {
                            Some(_) => out.push(RankProgram {
                                scratch_chunks: 0,
                                streams: Vec::new(),
                            }),
                            None => break,
                        }
                    }
                }
                if let Some(r) = self.0
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
        d.deserialize_seq(Ranks(WANTED_RANK.with(|w| w.get())))
    }
}

/// Refuses files from a newer format before the full parse, so the user reads "version 7 is
/// newer than this build's 1" instead of an error about some field that changed meaning.
fn check_version(text: &str, origin: &str) -> Result<(), PlanError> {
    let head: String = text.chars().take(4096).collect();
    let Some(pos) = head.find("format_version") else {
        return Ok(()); // the full parse reports the missing field with its location
    };
    let rest = head[pos + "format_version".len()..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else {
        return Ok(());
    };
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    match digits.parse::<u64>() {
        Ok(found) if found != u64::from(FORMAT_VERSION) => Err(PlanError::Version {
            path: origin.to_string(),
            found,
            supported: FORMAT_VERSION,
        }),
        _ => Ok(()),
    }
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
            });
        }
        plan
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
        let newer = text.replacen("format_version: 1", "format_version: 9", 1);
        assert!(matches!(
            PlanFile::from_ron_for_rank(&newer, "p", 0),
            Err(PlanError::Version { found: 9, .. })
        ));
    }
}
