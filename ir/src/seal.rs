//! Seals: the record that the verifier passed a schedule, in a form one rank can check alone.
//!
//! A [`Seal`] names a schedule by [`schedule_hash`]:
//!
//! - a symmetric entry (written as one template, see [`crate::symmetric`]) hashes as the RON of
//!   its [`SymmetricSchedule`]: every rank reads the whole template, so every rank can hash it;
//! - an explicit entry hashes as a root over its header (collective, ranks, chunks, buffer
//!   extents, placement) and one 128-bit [`rank_digest`] per rank program, and its seal lists
//!   those digests (`ranks`, hex). A rank that loaded only its own program
//!   ([`crate::PlanFile::load_for_ranks`]) checks that the seal's list hashes to the seal's
//!   root and that its program's digest is the one listed for it: what it runs is what the
//!   verifier passed, without reading the other ranks' programs.
//!
//! Ranks that checked their own programs against *different* seals of equal headers would
//! run a mixture nobody verified; [`PlanPart::identity`] therefore names the seal each entry
//! matched, and a job compares identities across ranks before it starts.

use crate::error::PlanError;
use crate::plan::{PlanEntry, PlanFile};
use crate::schedule::{RankProgram, Schedule, ScheduleHeader};
use crate::symmetric::SymmetricSchedule;
use serde::{Deserialize, Serialize};

/// Bytes of a rank program's digest in a seal (blake3, truncated).
pub const RANK_DIGEST_BYTES: usize = 16;

/// A record that [`crate::verify::VERIFIER`] passed a schedule: the compiler seals every
/// entry it verified, so that a job starting from the plan need not verify it again (see
/// [`PlanFile::sealed`]). A seal covers a schedule, not the sizes or names around it, and is
/// matched by content ([`schedule_hash`]), so entries may be reordered, merged from several
/// files or given other size ranges and stay sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seal {
    /// The verifier that passed the schedule ([`crate::verify::VERIFIER`] when it was
    /// sealed); a seal of another verifier counts for nothing.
    pub verifier: String,
    /// [`schedule_hash`] of the schedule it passed.
    pub schedule: String,
    /// For an explicit schedule: every rank program's [`rank_digest`], in rank order, as one
    /// hex string ([`RANK_DIGEST_BYTES`] × 2 digits per rank); what `schedule` is the root of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<String>,
}

/// Digest of one rank program (format 6): blake3 of a fixed binary encoding of it (every
/// step, in order; see `Feed`), truncated to [`RANK_DIGEST_BYTES`]. Like [`symmetric_hash`],
/// far cheaper than the program's RON and independent of how the file wrote it.
pub fn rank_digest(program: &RankProgram) -> [u8; RANK_DIGEST_BYTES] {
    let mut feed = Feed(Vec::with_capacity(Feed::BUFFER + 64), blake3::Hasher::new());
    feed.0.extend_from_slice(b"hccl rank program, format 6\n");
    feed.program(program);
    feed.flush();
    truncated(&feed.1)
}

/// Digest of one rank program as the seals of files before format 6 hold it: blake3 of its
/// RON, truncated to [`RANK_DIGEST_BYTES`].
pub fn rank_digest_v5(program: &RankProgram) -> [u8; RANK_DIGEST_BYTES] {
    let mut hasher = blake3::Hasher::new();
    hash_ron(&mut hasher, program);
    truncated(&hasher)
}

fn truncated(hasher: &blake3::Hasher) -> [u8; RANK_DIGEST_BYTES] {
    let mut out = [0u8; RANK_DIGEST_BYTES];
    out.copy_from_slice(&hasher.finalize().as_bytes()[..RANK_DIGEST_BYTES]);
    out
}

/// Streams `value`'s RON into `hasher`, through a buffer: the serialiser writes token by
/// token, and the hash is the same however its input is split.
fn hash_ron<T: Serialize>(hasher: &mut blake3::Hasher, value: &T) {
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut *hasher);
    let written = ron::Options::default()
        .to_io_writer(&mut buffered, value)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            use std::io::Write;
            buffered.flush().map_err(|e| e.to_string())
        });
    drop(buffered);
    if let Err(e) = written {
        // Schedules always serialise; an error still hashes to something no seal holds.
        hasher.update(format!("unserialisable: {e}").as_bytes());
    }
}

/// The root of an explicit schedule with header `header` and rank digests `digests`
/// (concatenated).
fn explicit_root(header: &ScheduleHeader, digests: &[u8]) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"hccl explicit schedule\n");
    hash_ron(&mut hasher, header);
    hasher.update(b"\n");
    hasher.update(digests);
    hasher.finalize().to_hex().to_string()
}

/// Hash of a symmetric schedule (format 5): blake3 of a fixed binary encoding of its header,
/// symmetry and template (every template step, in order; see `Feed`). Linear in the
/// template and far cheaper than its RON, and independent of how the file wrote the
/// template (with or without strided runs, see [`crate::runs`]): what a seal covers is the
/// schedule, which a one-rank reader holds expanded anyway.
pub(crate) fn symmetric_hash(symmetric: &SymmetricSchedule) -> String {
    let mut feed = Feed(Vec::with_capacity(Feed::BUFFER + 64), blake3::Hasher::new());
    feed.symmetric(symmetric);
    feed.flush();
    feed.1.finalize().to_hex().to_string()
}

/// The binary encoding [`symmetric_hash`] hashes: a tag, then every field in declaration
/// order (enum variants as their index in declaration order), integers little-endian, lists
/// and options with their length or tag first; buffered into the hasher.
struct Feed(Vec<u8>, blake3::Hasher);

impl Feed {
    const BUFFER: usize = 16 << 10;

    fn flush(&mut self) {
        self.1.update(&self.0);
        self.0.clear();
    }

    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
        if self.0.len() >= Self::BUFFER {
            self.flush();
        }
    }

    fn len(&mut self, n: usize) {
        self.0.extend_from_slice(&(n as u64).to_le_bytes());
    }

    fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u32(v);
            }
            None => self.u8(0),
        }
    }

    fn opt_loc(&mut self, v: Option<crate::schedule::Loc>) {
        match v {
            Some(l) => {
                self.u8(1);
                self.u8(l.buf as u8);
                self.u32(l.off);
            }
            None => self.u8(0),
        }
    }

    fn symmetric(&mut self, s: &SymmetricSchedule) {
        use crate::symmetric::{BlockLabel, BlockLayout};
        self.0
            .extend_from_slice(b"hccl symmetric schedule, format 5\n");
        self.u8(s.collective.kind() as u8);
        self.opt_u32(s.collective.root());
        for v in [s.nranks, s.chunks, s.input_chunks, s.output_chunks] {
            self.u32(v);
        }
        self.u8(u8::from(s.in_place));
        let sym = &s.symmetry;
        self.len(sym.dims.len());
        for &d in &sym.dims {
            self.u32(d);
        }
        self.len(sym.actions.len());
        for &a in &sym.actions {
            self.u8(a as u8);
        }
        self.len(sym.ranks.len());
        for &r in &sym.ranks {
            self.u32(r);
        }
        match &sym.chunks {
            None => self.u8(0),
            Some(map) => {
                self.u8(1);
                self.u8(match map.layout {
                    BlockLayout::BlockMajor => 0,
                    BlockLayout::PieceMajor => 1,
                });
                match &map.label {
                    BlockLabel::Rank => self.u8(0),
                    BlockLabel::Grid { order } => {
                        self.u8(1);
                        self.len(order.len());
                        for &o in order {
                            self.u32(o);
                        }
                    }
                }
            }
        }
        self.program(&s.template);
    }

    /// A rank program: its scratch extent, then every stream and step in order.
    fn program(&mut self, t: &RankProgram) {
        use crate::schedule::Op;
        self.u32(t.scratch_chunks);
        self.len(t.streams.len());
        for stream in &t.streams {
            self.u32(stream.channel);
            self.len(stream.steps.len());
            for step in &stream.steps {
                let op = &step.op;
                self.u8(match op {
                    Op::Send { .. } => 0,
                    Op::Recv { .. } => 1,
                    Op::RecvReduceCopy { .. } => 2,
                    Op::RecvReduceSend { .. } => 3,
                    Op::RecvReduceCopySend { .. } => 4,
                    Op::RecvCopySend { .. } => 5,
                    Op::Copy { .. } => 6,
                    Op::Reduce { .. } => 7,
                    Op::Nop => 8,
                });
                self.opt_u32(op.send_peer());
                self.opt_u32(op.recv_peer());
                self.opt_loc(op.src());
                self.opt_loc(op.dst());
                self.u32(step.count);
                self.len(step.deps.len());
                for d in &step.deps {
                    self.u32(d.stream);
                    self.u32(d.step);
                }
            }
        }
    }
}

/// Hash of a symmetric schedule as formats 2 to 4 wrote it (the template expanded): what the
/// seals of files of those formats name. Readers of such files replace these roots by
/// [`symmetric_hash`] once they match ([`upgrade_seals`]).
pub(crate) fn symmetric_hash_v4(symmetric: &SymmetricSchedule) -> String {
    let mut hasher = blake3::Hasher::new();
    hash_ron(&mut hasher, symmetric);
    hasher.finalize().to_hex().to_string()
}

/// Rewrites the seals of a plan read from a format before 5: a seal of this build's verifier
/// whose root is a symmetric schedule's format-4 hash ([`symmetric_hash_v4`]) names it by its
/// current hash ([`symmetric_hash`]) instead, so the plan is held (and checked, and written
/// back) as the current format. Seals that match nothing are left as they are (and then
/// cover nothing).
pub(crate) fn upgrade_seals<'a>(
    seals: &mut [Seal],
    symmetric: impl IntoIterator<Item = &'a SymmetricSchedule>,
) {
    if !seals
        .iter()
        .any(|s| s.verifier == crate::verify::VERIFIER && s.ranks.is_none())
    {
        return;
    }
    for sym in symmetric {
        let (old, new) = (symmetric_hash_v4(sym), symmetric_hash(sym));
        for s in seals.iter_mut() {
            if s.verifier == crate::verify::VERIFIER && s.ranks.is_none() && s.schedule == old {
                s.schedule = new.clone();
            }
        }
    }
}

fn digests(schedule: &Schedule) -> Vec<u8> {
    crate::par::par_map(&schedule.ranks, rank_digest).concat()
}

/// Rewrites the seals of a plan read from a format before 6, whose explicit seals list the
/// rank digests of [`rank_digest_v5`]: a seal of this build's verifier that covers one of
/// `explicit` (its root and digests those of the schedule) covers it by the current digests
/// instead ([`rank_digest`]), so the plan is held (and checked, and written back) as the
/// current format. Seals that match nothing are left as they are (and then cover nothing).
pub(crate) fn upgrade_explicit_seals<'a>(
    seals: &mut [Seal],
    explicit: impl IntoIterator<Item = &'a Schedule>,
) {
    let own = |s: &Seal| s.verifier == crate::verify::VERIFIER && s.ranks.is_some();
    if !seals.iter().any(own) {
        return;
    }
    for schedule in explicit {
        let old: Vec<u8> = crate::par::par_map(&schedule.ranks, rank_digest_v5).concat();
        let (old_root, old_hex) = (explicit_root(&schedule.header(), &old), hex(&old));
        let mut new = None;
        for s in seals.iter_mut() {
            if own(s) && s.schedule == old_root && s.ranks.as_deref() == Some(old_hex.as_str()) {
                let d = new.get_or_insert_with(|| digests(schedule));
                s.schedule = explicit_root(&schedule.header(), d);
                s.ranks = Some(hex(d));
            }
        }
    }
}

/// Hex hash of an entry's schedule as the plan file writes it: of the symmetric form when
/// [`PlanEntry::compact`], else the root over the header and every rank's [`rank_digest`]
/// (see the module docs). What a [`Seal`] names.
pub fn schedule_hash(entry: &PlanEntry) -> String {
    match entry.compact() {
        Some(symmetric) => symmetric_hash(&symmetric),
        None => explicit_root(&entry.schedule.header(), &digests(&entry.schedule)),
    }
}

/// The seal of `entry`'s schedule by this build's verifier (only for a schedule it passed):
/// its [`schedule_hash`] and, for an explicit schedule, the rank digests.
pub fn seal_of(entry: &PlanEntry) -> Seal {
    let verifier = crate::verify::VERIFIER.to_string();
    match entry.compact() {
        Some(symmetric) => Seal {
            verifier,
            schedule: symmetric_hash(&symmetric),
            ranks: None,
        },
        None => {
            let d = digests(&entry.schedule);
            Seal {
                verifier,
                schedule: explicit_root(&entry.schedule.header(), &d),
                ranks: Some(hex(&d)),
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    t.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Some ranks' part of a plan ([`PlanFile::load_for_ranks`]): the plan's shape with only
/// those ranks' programs (the others empty), and what checking them against the seals needs.
#[derive(Debug, Clone)]
pub struct PlanPart {
    /// The plan, holding the programs of [`PlanPart::ranks`] only. It does not verify.
    pub plan: PlanFile,
    /// The ranks whose programs were loaded (sorted, distinct).
    pub ranks: Vec<u32>,
    /// Per entry: [`symmetric_hash`] of a symmetric entry's template as read, `None` for an
    /// explicit entry.
    templates: Vec<Option<String>>,
    /// Per entry: how it stands against the seals.
    matches: Vec<Match>,
    /// Whether the file's explicit seals list [`rank_digest_v5`] digests (a file before
    /// format 6: a part cannot upgrade them, since that needs every rank's program).
    legacy_digests: bool,
}

/// How one entry of a part stands against the seals.
#[derive(Debug, Clone)]
enum Match {
    /// The seal (its root) covering every loaded program.
    Sealed(String),
    /// No seal of this verifier covers it; `rank` is the first loaded rank without one
    /// (`None` for a symmetric entry).
    Unsealed { rank: Option<u32> },
}

impl PlanPart {
    /// The part of `plan` holding `ranks`' programs (sorted, distinct), checked against the
    /// seals ([`PlanPart::check_seals`]); `templates` as read; `legacy_digests` for a file
    /// before format 6.
    pub(crate) fn new(
        plan: PlanFile,
        ranks: Vec<u32>,
        templates: Vec<Option<String>>,
        legacy_digests: bool,
        origin: &str,
    ) -> Result<PlanPart, PlanError> {
        let mut part = PlanPart {
            plan,
            ranks,
            templates,
            matches: Vec::new(),
            legacy_digests,
        };
        part.matches = part.compute_matches();
        part.check_seals(origin)?;
        Ok(part)
    }

    /// The valid seals of this build's verifier: (root, rank digests of explicit ones).
    fn seals(&self) -> Vec<(&str, Option<Vec<u8>>)> {
        self.plan
            .verified
            .iter()
            .filter(|s| s.verifier == crate::verify::VERIFIER)
            .map(|s| (s.schedule.as_str(), s.ranks.as_deref().and_then(unhex)))
            .collect()
    }

    fn compute_matches(&self) -> Vec<Match> {
        let seals = self.seals();
        self.plan
            .entries
            .iter()
            .zip(&self.templates)
            .map(|(e, template)| match template {
                Some(hash) => {
                    if seals.iter().any(|(root, d)| d.is_none() && root == hash) {
                        Match::Sealed(hash.clone())
                    } else {
                        Match::Unsealed { rank: None }
                    }
                }
                None => self.match_explicit(&e.schedule, &seals),
            })
            .collect()
    }

    /// A loaded program's digest as the file's seals list it.
    fn digest(&self, program: &RankProgram) -> [u8; RANK_DIGEST_BYTES] {
        match self.legacy_digests {
            true => rank_digest_v5(program),
            false => rank_digest(program),
        }
    }

    fn match_explicit(&self, s: &Schedule, seals: &[(&str, Option<Vec<u8>>)]) -> Match {
        let header = s.header();
        let n = s.nranks as usize;
        let mine: Vec<(u32, [u8; RANK_DIGEST_BYTES])> = self
            .ranks
            .iter()
            .filter_map(|&r| Some((r, self.digest(s.ranks.get(r as usize)?))))
            .collect();
        let mut first_missing = None;
        for (root, d) in seals {
            let Some(d) = d else { continue };
            if d.len() != n * RANK_DIGEST_BYTES {
                continue;
            }
            let missing = mine.iter().find(|(r, digest)| {
                let at = *r as usize * RANK_DIGEST_BYTES;
                d[at..at + RANK_DIGEST_BYTES] != digest[..]
            });
            match missing {
                None if explicit_root(&header, d) == *root => {
                    return Match::Sealed(root.to_string());
                }
                None => {}
                Some((r, _)) => {
                    first_missing.get_or_insert(*r);
                }
            }
        }
        Match::Unsealed {
            rank: first_missing.or_else(|| self.ranks.first().copied()),
        }
    }

    /// Which entries a seal of this build's verifier covers for the loaded ranks (see
    /// [`PlanFile::sealed`]); an entry not covered must be verified, on the whole plan,
    /// before it runs.
    pub fn sealed(&self) -> Vec<bool> {
        self.matches
            .iter()
            .map(|m| matches!(m, Match::Sealed(_)))
            .collect()
    }

    /// Refuses a part of a sealed plan (one holding seals of this build's verifier) whose
    /// loaded programs a seal does not cover: the plan was edited after it was compiled.
    pub fn check_seals(&self, origin: &str) -> Result<(), PlanError> {
        if self.seals().is_empty() {
            return Ok(());
        }
        for (i, m) in self.matches.iter().enumerate() {
            if let Match::Unsealed { rank } = *m {
                let e = &self.plan.entries[i];
                return Err(match (rank, &self.templates[i]) {
                    (Some(rank), None) => PlanError::EditedRank {
                        path: origin.to_string(),
                        entry: i,
                        collective: e.schedule.collective,
                        algorithm: e.algorithm.clone(),
                        rank,
                        hash: hex(&self.digest(&e.schedule.ranks[rank as usize])),
                    },
                    _ => PlanError::Edited {
                        path: origin.to_string(),
                        entry: i,
                        collective: e.schedule.collective,
                        algorithm: e.algorithm.clone(),
                        hash: self.templates[i].clone().unwrap_or_default(),
                    },
                });
            }
        }
        Ok(())
    }

    /// The plan's identity ([`PlanFile::identity`]), computed from this part: `Some` when every
    /// entry is sealed for the loaded ranks (it names the seal each entry matched, so ranks
    /// that matched different seals disagree), `None` otherwise. Of a file before format 6
    /// with explicit entries, a part names those by their old roots where a full load holds
    /// the upgraded ones, so the two differ: a job's ranks read such a file alike (each its
    /// part, where the file is sealed throughout) or recompile it.
    pub fn identity(&self) -> Option<String> {
        let roots: Option<Vec<String>> = self
            .matches
            .iter()
            .map(|m| match m {
                Match::Sealed(root) => Some(root.clone()),
                Match::Unsealed { .. } => None,
            })
            .collect();
        Some(identity(&self.plan, &roots?))
    }
}

/// Hash of a plan's metadata, each entry's selection fields and schedule hash (`roots`).
fn identity(plan: &PlanFile, roots: &[String]) -> String {
    #[derive(Serialize)]
    struct Row<'a> {
        min_bytes: u64,
        max_bytes: Option<u64>,
        algorithm: &'a str,
        protocol: crate::plan::Protocol,
        schedule: &'a str,
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"hccl plan identity\n");
    hash_ron(&mut hasher, &plan.meta);
    for (e, root) in plan.entries.iter().zip(roots) {
        hasher.update(b"\n");
        hash_ron(
            &mut hasher,
            &Row {
                min_bytes: e.min_bytes,
                max_bytes: e.max_bytes,
                algorithm: &e.algorithm,
                protocol: e.protocol,
                schedule: root,
            },
        );
    }
    hasher.finalize().to_hex().to_string()
}

impl PlanFile {
    /// What identifies the plan across the ranks of a job: its metadata and, per entry, the
    /// size range, names and [`schedule_hash`]. Equal for the whole plan and for any part of
    /// it whose entries are all sealed ([`PlanPart::identity`]).
    pub fn identity(&self) -> String {
        self.identity_with(&self.schedule_hashes())
    }

    /// [`PlanFile::identity`], given the entries' [`PlanFile::schedule_hashes`].
    pub fn identity_with(&self, hashes: &[String]) -> String {
        identity(self, hashes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)).as_deref(), Some(&bytes[..]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("AB"), None, "seals are written in lower case");
        assert_eq!(unhex(""), Some(Vec::new()));
    }
}
