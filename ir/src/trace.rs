//! Timelines in the Chrome trace-event JSON format (Perfetto, `chrome://tracing`): the one
//! layout both the simulator's predicted timeline (`hcclc explain --trace`) and the
//! executor's measured one (`HCCL_TRACE`) are written in, so the two open side by side.
//!
//! Layout: a process per rank (`pid` = rank, named `rank r`), a thread per stream of the
//! rank's program (`tid` = stream index, named `stream i (channel c)`), and a complete
//! slice (`ph: "X"`, `cat: "step"`) per step, named by the step's op ([`Op::name`]) with
//! the args `step`, `chunks`, `bytes`, and as the op has them `from`, `to`, `src`, `dst`.
//! Measured traces add the args `call` and `segment` to every step, and a slice per call
//! (`cat: "call"`) on the thread [`CALLS_TID`] (named `calls`). Timestamps and durations are
//! in microseconds.
//!
//! [`merge_dir`] joins the per-rank files an executor writes (`rank-<r>.json`) into one
//! document; [`TraceFile::check`] is the format check every reader of ours applies.

use crate::schedule::Op;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The thread of a rank's process that holds one slice per call (measured traces).
pub const CALLS_TID: u32 = 1 << 20;

/// One trace event. Only the fields this crate writes are modelled; a field another writer
/// adds is refused on reading (the rank files are ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cat: Option<String>,
    pub ph: String,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub args: Map<String, Value>,
}

/// A whole trace document (the JSON object form of the format).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFile {
    #[serde(rename = "traceEvents")]
    pub events: Vec<Event>,
    #[serde(rename = "displayTimeUnit", default = "display_unit")]
    pub display_time_unit: String,
    /// What the trace shows (source, plan, clock, limits): free-form.
    #[serde(rename = "otherData", default)]
    pub other: Map<String, Value>,
}

fn display_unit() -> String {
    "ns".into()
}

/// What went wrong reading or merging trace files.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a trace directory (missing or not a directory)", .0.display())]
    NoDir(PathBuf),
    #[error("{}: no rank-<r>.json files", .0.display())]
    Empty(PathBuf),
    #[error("{}:{line}:{column}: not a trace file: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

/// Counts [`TraceFile::check`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckSummary {
    /// The `pid`s with a `process_name`, in order.
    pub processes: Vec<u32>,
    /// Complete slices (`X`) and begin/end pairs.
    pub slices: usize,
}

impl Event {
    /// A metadata event (`ph: "M"`).
    pub fn meta(name: &str, pid: u32, tid: Option<u32>, args: Value) -> Event {
        Event {
            name: name.into(),
            cat: None,
            ph: "M".into(),
            pid,
            tid,
            ts: None,
            dur: None,
            args: match args {
                Value::Object(m) => m,
                _ => Map::new(),
            },
        }
    }

    /// A complete slice (`ph: "X"`).
    pub fn slice(name: &str, cat: &str, pid: u32, tid: u32, ts: f64, dur: f64) -> Event {
        Event {
            name: name.into(),
            cat: Some(cat.into()),
            ph: "X".into(),
            pid,
            tid: Some(tid),
            ts: Some(ts),
            dur: Some(dur.max(0.0)),
            args: Map::new(),
        }
    }
}

/// The metadata naming rank `rank`'s process and ordering it by rank.
pub fn process_meta(rank: u32) -> [Event; 2] {
    [
        Event::meta(
            "process_name",
            rank,
            None,
            json!({"name": format!("rank {rank}")}),
        ),
        Event::meta(
            "process_sort_index",
            rank,
            None,
            json!({"sort_index": rank}),
        ),
    ]
}

/// The name of stream `stream` of a rank, on channel `channel`.
pub fn thread_name(stream: u32, channel: u32) -> String {
    format!("stream {stream} (channel {channel})")
}

/// The metadata naming a stream's thread.
pub fn thread_meta(rank: u32, stream: u32, name: &str) -> Event {
    Event::meta("thread_name", rank, Some(stream), json!({ "name": name }))
}

/// The slice of step `step` of stream `stream` of rank `rank`: op `op` on `count` chunks
/// moving `bytes` bytes, from `ts` for `dur` microseconds.
#[allow(clippy::too_many_arguments)]
pub fn step_slice(
    rank: u32,
    stream: u32,
    step: u32,
    op: &Op,
    count: u32,
    bytes: f64,
    ts: f64,
    dur: f64,
) -> Event {
    let mut e = Event::slice(op.name(), "step", rank, stream, ts, dur);
    let a = &mut e.args;
    a.insert("step".into(), json!(step));
    a.insert("chunks".into(), json!(count));
    a.insert("bytes".into(), json!(bytes));
    if let Some(p) = op.recv_peer() {
        a.insert("from".into(), json!(p));
    }
    if let Some(p) = op.send_peer() {
        a.insert("to".into(), json!(p));
    }
    if let Some(src) = op.src() {
        a.insert("src".into(), json!(src.to_string()));
    }
    if let Some(dst) = op.dst() {
        a.insert("dst".into(), json!(dst.to_string()));
    }
    e
}

impl TraceFile {
    /// A document of `events` with `other` as its `otherData`.
    pub fn new(events: Vec<Event>, other: Map<String, Value>) -> TraceFile {
        TraceFile {
            events,
            display_time_unit: display_unit(),
            other,
        }
    }

    /// Compact JSON.
    pub fn to_json(&self) -> String {
        // A document of strings, numbers and maps always serialises; a NaN would become
        // `null`, which `check` then refuses on reading.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Writes the document atomically ([`crate::write_atomic`]).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        crate::write_atomic(path, self.to_json().as_bytes())
    }

    /// Reads a document, locating a syntax or shape error.
    pub fn load(path: &Path) -> Result<TraceFile, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.into(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| TraceError::Parse {
            path: path.into(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })
    }

    /// Checks the trace-event format as Perfetto reads it: every event has a name and a
    /// phase; a complete slice has `ts`, `dur >= 0` and `tid`; every begin (`B`) has its end
    /// (`E`) on the same thread, in order; metadata events are the four naming and ordering
    /// processes and threads, each process named once; every thread with a slice is named,
    /// and every process with an event.
    pub fn check(&self) -> Result<CheckSummary, String> {
        let mut summary = CheckSummary::default();
        let mut named_procs = BTreeSet::new();
        let mut named_threads = BTreeSet::new();
        let mut used_threads = BTreeSet::new();
        let mut used_procs = BTreeSet::new();
        let mut open: BTreeMap<(u32, u32), Vec<(&str, f64)>> = BTreeMap::new();
        let finite = |v: Option<f64>, what: &str, e: &Event| -> Result<f64, String> {
            v.filter(|x| x.is_finite())
                .ok_or_else(|| format!("event `{}` ({}): no finite {what}", e.name, e.ph))
        };
        for e in &self.events {
            if e.name.is_empty() {
                return Err(format!("an event of pid {} has no name", e.pid));
            }
            used_procs.insert(e.pid);
            let tid = || {
                e.tid
                    .ok_or_else(|| format!("event `{}` ({}) has no tid", e.name, e.ph))
            };
            match e.ph.as_str() {
                "M" => match e.name.as_str() {
                    "process_name" => {
                        if !e.args.get("name").is_some_and(Value::is_string) {
                            return Err(format!("process_name of pid {} has no name", e.pid));
                        }
                        if !named_procs.insert(e.pid) {
                            return Err(format!("pid {} is named twice", e.pid));
                        }
                        summary.processes.push(e.pid);
                    }
                    "thread_name" => {
                        if !e.args.get("name").is_some_and(Value::is_string) {
                            return Err(format!("thread_name of pid {} has no name", e.pid));
                        }
                        named_threads.insert((e.pid, tid()?));
                    }
                    "process_sort_index" | "thread_sort_index" => {}
                    other => return Err(format!("unknown metadata event `{other}`")),
                },
                "X" => {
                    let dur = finite(e.dur, "dur", e)?;
                    finite(e.ts, "ts", e)?;
                    if dur < 0.0 {
                        return Err(format!("slice `{}` has a negative duration", e.name));
                    }
                    used_threads.insert((e.pid, tid()?));
                    summary.slices += 1;
                }
                "B" => {
                    let ts = finite(e.ts, "ts", e)?;
                    let t = tid()?;
                    used_threads.insert((e.pid, t));
                    open.entry((e.pid, t)).or_default().push((&e.name, ts));
                }
                "E" => {
                    let ts = finite(e.ts, "ts", e)?;
                    let t = tid()?;
                    match open.get_mut(&(e.pid, t)).and_then(Vec::pop) {
                        Some((_, begun)) if begun <= ts => summary.slices += 1,
                        Some((name, _)) => {
                            return Err(format!(
                                "`{name}` on pid {} tid {t} ends before it begins",
                                e.pid
                            ));
                        }
                        None => {
                            return Err(format!("an end on pid {} tid {t} without a begin", e.pid));
                        }
                    }
                }
                "i" | "I" | "C" => {
                    finite(e.ts, "ts", e)?;
                }
                other => return Err(format!("event `{}` has unknown phase `{other}`", e.name)),
            }
        }
        if let Some(((pid, tid), stack)) = open.iter().find(|(_, s)| !s.is_empty()) {
            return Err(format!(
                "`{}` begins on pid {pid} tid {tid} and never ends",
                stack[0].0
            ));
        }
        if let Some((pid, tid)) = used_threads.difference(&named_threads).next() {
            return Err(format!("pid {pid} tid {tid} has slices but no thread_name"));
        }
        if let Some(pid) = used_procs.difference(&named_procs).next() {
            return Err(format!("pid {pid} has events but no process_name"));
        }
        Ok(summary)
    }
}

/// The rank of a per-rank file name `rank-<r>.json`.
pub fn rank_of_file(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("rank-")?.strip_suffix(".json")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The file rank `rank` writes in a trace directory.
pub fn rank_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Joins the per-rank files of `dir` (`rank-<r>.json`, as `HCCL_TRACE=DIR` leaves them)
/// into one document. Every file must pass [`TraceFile::check`] and hold only its own rank's
/// process. Their timestamps share rank 0's clock; the merged document starts at 0 (the
/// earliest event), and its `otherData` says where that was (`origin_us`), holds each rank
/// file's `otherData` under `ranks`, and lists the ranks of the job (`world`, as the files
/// say) that left no file under `missing_ranks`.
pub fn merge_dir(dir: &Path) -> Result<TraceFile, TraceError> {
    if !dir.is_dir() {
        return Err(TraceError::NoDir(dir.into()));
    }
    let listing = std::fs::read_dir(dir).map_err(|source| TraceError::Io {
        path: dir.into(),
        source,
    })?;
    let mut files = Vec::new();
    for item in listing {
        let item = item.map_err(|source| TraceError::Io {
            path: dir.into(),
            source,
        })?;
        if let Some(rank) = item.file_name().to_str().and_then(rank_of_file) {
            files.push((rank, item.path()));
        }
    }
    if files.is_empty() {
        return Err(TraceError::Empty(dir.into()));
    }
    files.sort();
    let mut events = Vec::new();
    let mut ranks = Vec::new();
    let mut world: Option<(u64, PathBuf)> = None;
    for (rank, path) in &files {
        let doc = TraceFile::load(path)?;
        let bad = |message: String| TraceError::Invalid {
            path: path.clone(),
            message,
        };
        doc.check().map_err(bad)?;
        if let Some(e) = doc.events.iter().find(|e| e.pid != *rank) {
            return Err(bad(format!(
                "holds an event of pid {} (`{}`); a rank file holds its rank's only",
                e.pid, e.name
            )));
        }
        if let Some(w) = doc.other.get("world").and_then(Value::as_u64) {
            match &world {
                Some((w0, p0)) if *w0 != w => {
                    return Err(bad(format!(
                        "is from a {w}-rank job but {} from a {w0}-rank one",
                        p0.display()
                    )));
                }
                _ => world = Some((w, path.clone())),
            }
        }
        events.extend(doc.events);
        ranks.push(Value::Object(doc.other));
    }
    let origin = events
        .iter()
        .filter_map(|e| e.ts)
        .fold(f64::INFINITY, f64::min);
    let origin = if origin.is_finite() { origin } else { 0.0 };
    for e in &mut events {
        if let Some(ts) = &mut e.ts {
            *ts -= origin;
        }
    }
    let have: BTreeSet<u32> = files.iter().map(|(r, _)| *r).collect();
    let missing: Vec<u64> = world
        .as_ref()
        .map(|(w, _)| (0..*w).filter(|r| !have.contains(&(*r as u32))).collect())
        .unwrap_or_default();
    let mut other = Map::new();
    other.insert("source".into(), json!("measured"));
    other.insert("origin_us".into(), json!(origin));
    if let Some((w, _)) = world {
        other.insert("world".into(), json!(w));
    }
    other.insert("missing_ranks".into(), json!(missing));
    other.insert("ranks".into(), Value::Array(ranks));
    Ok(TraceFile::new(events, other))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Buf, Loc};

    fn doc(events: Vec<Event>) -> TraceFile {
        TraceFile::new(events, Map::new())
    }

    #[test]
    fn the_check_catches_what_perfetto_would_drop() {
        let op = Op::Send {
            to: 1,
            src: Loc::new(Buf::Input, 0),
        };
        let mut events: Vec<Event> = process_meta(0).into();
        events.push(thread_meta(0, 0, &thread_name(0, 0)));
        events.push(step_slice(0, 0, 0, &op, 1, 8.0, 1.0, 2.0));
        let good = doc(events.clone());
        let s = good.check().expect("valid");
        assert_eq!((s.processes, s.slices), (vec![0], 1));
        let e = &good.events[3];
        assert_eq!(e.name, "send");
        assert_eq!(e.args["to"], 1);
        assert_eq!(e.args["src"], "i[0]");
        assert!(e.args.get("from").is_none());
        // A slice on an unnamed thread, a begin without end, an end without begin.
        let mut unnamed = events.clone();
        unnamed[3].tid = Some(5);
        assert!(doc(unnamed).check().unwrap_err().contains("tid 5"));
        let mut begin = events.clone();
        begin.push(Event {
            ph: "B".into(),
            dur: None,
            ..events[3].clone()
        });
        assert!(
            doc(begin.clone())
                .check()
                .unwrap_err()
                .contains("never ends")
        );
        begin.push(Event {
            ph: "E".into(),
            ts: Some(0.5),
            dur: None,
            ..events[3].clone()
        });
        assert!(doc(begin).check().unwrap_err().contains("before it begins"));
        let mut twice = events.clone();
        twice.push(process_meta(0)[0].clone());
        assert!(doc(twice).check().is_err());
        let mut no_dur = events;
        no_dur[3].dur = None;
        assert!(doc(no_dur).check().is_err());
        assert_eq!(rank_of_file("rank-12.json"), Some(12));
        assert_eq!(rank_of_file("rank-.json"), None);
        assert_eq!(rank_of_file("rank-1.json.tmp"), None);
    }
}
