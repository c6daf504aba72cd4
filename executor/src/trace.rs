//! Measured timelines (`HCCL_TRACE=DIR`): every rank records when each step of its first
//! `HCCL_TRACE_CALLS` calls ran and writes `DIR/rank-<r>.json` in the layout of the
//! simulator's predicted timeline ([`hccl_ir::trace`]), so the two open side by side;
//! `hcclc trace merge DIR` (or [`hccl_ir::trace::merge_dir`]) joins the ranks' files.
//!
//! # What a step's times mean
//!
//! A step *ends* when the engine completes it (the clock is read then). It *starts* when its
//! dependencies are done, as in the simulator's timeline: at the later of the end of the
//! previous step of its stream (the segment's start for a stream's first step) and the ends
//! of the steps it depends on. So a receive's slice includes the wait for its message and a
//! send's the wait for a free slot, and so does the time the engine spent on the rank's
//! other streams before it came back to this one (the streams of a rank share one thread).
//! Slices of one stream never overlap and follow step order, segment after segment.
//!
//! # Clocks
//!
//! Timestamps are microseconds on rank 0's `CLOCK_MONOTONIC`. Threads of one process and
//! processes of one host read the same clock; a rank on another host (the TCP backend)
//! estimates its clock's offset to rank 0's at init from a few ping-pongs over the
//! rendezvous connection, taking the sample of least round trip (offset = rank 0's time
//! minus the midpoint of the round trip, uncertain by half the round trip). Each file says
//! how its clock was aligned in `otherData.clock`.
//!
//! # Cost
//!
//! Off, the engine pays one predictable branch per step and per segment (an `Option` that is
//! `None`), and nothing else: no clock read, no allocation. On, one clock read per step and
//! a push into a buffer reserved when the call begins (at most [`MAX_STEPS`] records in all;
//! steps past it are counted, not recorded).

use crate::program::{Entry, Instr, Kind, Program};
use hccl_ir::trace::{CALLS_TID, Event, TraceFile, process_meta, step_slice, thread_meta};
use hccl_ir::{Loc, Op};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;

/// Default `HCCL_TRACE_CALLS`.
pub const DEFAULT_TRACE_CALLS: u32 = 64;
/// Most step records a rank keeps (32 bytes each).
pub const MAX_STEPS: usize = 1 << 20;
/// Most calls a rank records, whatever `HCCL_TRACE_CALLS` asks (56 bytes each).
pub const MAX_CALLS: u32 = 1 << 18;
/// Ping-pongs a rank on another host than rank 0 exchanges to align its clock.
const PINGS: u32 = 8;

/// Where and how much a communicator traces (`HCCL_TRACE`, `HCCL_TRACE_CALLS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// The directory each rank writes `rank-<r>.json` into (created if missing).
    pub dir: PathBuf,
    /// How many calls (the first ones) each rank records.
    pub calls: u32,
}

/// `HCCL_TRACE_CALLS`: how many calls a traced rank records ([`DEFAULT_TRACE_CALLS`] when
/// unset).
pub fn calls_from_env() -> crate::Result<u32> {
    calls_from(crate::env_vars::env("HCCL_TRACE_CALLS"))
}

/// [`calls_from_env`] of the value `HCCL_TRACE_CALLS` has (`None`: unset).
pub(crate) fn calls_from(value: Option<String>) -> crate::Result<u32> {
    match value {
        None => Ok(DEFAULT_TRACE_CALLS),
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|&n: &u32| n > 0)
            .ok_or_else(|| crate::ExecError::Env {
                name: "HCCL_TRACE_CALLS",
                value: v.clone(),
                expected: "a positive number of calls".into(),
            }),
    }
}

/// This host's `CLOCK_MONOTONIC`, in nanoseconds.
#[inline]
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// How a rank's clock relates to rank 0's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Clock {
    /// Rank 0's clock minus this rank's, in nanoseconds.
    pub offset_ns: i64,
    /// How far off `offset_ns` may be (half the round trip of the sample it came from).
    pub uncertainty_ns: u64,
    /// How it was found.
    pub method: String,
}

impl Clock {
    pub(crate) fn shared(method: &str) -> Clock {
        Clock {
            offset_ns: 0,
            uncertainty_ns: 0,
            method: method.into(),
        }
    }
}

/// Aligns this rank's clock with rank 0's over the rendezvous sockets (rank 0: one per
/// other rank, in rank order; others: the one to rank 0), after the rendezvous' last
/// barrier. Rank 0 tells every rank whether to ping it (one byte each: only when rank 0
/// traces and the rank is on another host) and then answers the pings of those ranks in
/// turn; each such rank keeps the sample of least round trip. The byte costs a job that
/// does not trace nothing measurable; the pings only happen when it does.
pub(crate) fn sync_clocks(
    rank: u32,
    socks: &mut [TcpStream],
    hosts: &[String],
    traces: bool,
) -> std::io::Result<Clock> {
    let same_host = "CLOCK_MONOTONIC, shared with rank 0 on this host";
    if rank == 0 {
        let remote: Vec<bool> = (1..hosts.len())
            .map(|r| traces && hosts[r] != hosts[0])
            .collect();
        for (s, &ping) in socks.iter_mut().zip(&remote) {
            s.write_all(&[u8::from(ping)])?;
        }
        for (s, _) in socks.iter_mut().zip(&remote).filter(|(_, p)| **p) {
            for _ in 0..PINGS {
                let mut b = [0u8; 1];
                s.read_exact(&mut b)?;
                s.write_all(&now_ns().to_le_bytes())?;
            }
        }
        return Ok(Clock::shared("rank 0's CLOCK_MONOTONIC"));
    }
    let s = &mut socks[0];
    let mut flag = [0u8; 1];
    s.read_exact(&mut flag)?;
    if flag[0] == 0 {
        let on_host = hosts.get(rank as usize) == hosts.first();
        return Ok(if on_host {
            Clock::shared(same_host)
        } else {
            Clock::shared("not aligned: rank 0 does not trace")
        });
    }
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..PINGS {
        let t0 = now_ns();
        s.write_all(&[0])?;
        let mut b = [0u8; 8];
        s.read_exact(&mut b)?;
        let t2 = now_ns();
        let theirs = u64::from_le_bytes(b);
        let rtt = t2.saturating_sub(t0);
        let mid = t0 as i128 + i128::from(rtt / 2);
        let offset = (i128::from(theirs) - mid) as i64;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    let (rtt, offset) = best.unwrap_or_default();
    Ok(Clock {
        offset_ns: offset,
        uncertainty_ns: rtt.div_ceil(2),
        method: format!(
            "offset to rank 0 from {PINGS} ping-pongs at init (the least round trip, {:.1} us)",
            rtt as f64 / 1e3
        ),
    })
}

/// A traced entry: what names and describes its steps.
struct Traced {
    collective: String,
    algorithm: String,
    protocol: &'static str,
    chunks: u32,
    channels: Vec<u32>,
    /// Per stream, per step: the op and its chunk count.
    steps: Vec<Vec<(Op, u32)>>,
}

struct CallRec {
    seq: u64,
    entry: usize,
    bytes: u64,
    segments: u64,
    start: u64,
    end: u64,
    ok: bool,
}

#[derive(Clone, Copy)]
struct StepRec {
    call: u32,
    segment: u32,
    stream: u32,
    step: u32,
    start: u64,
    end: u64,
}

/// One rank's recorder (lives in its [`crate::engine::EngineState`]).
pub(crate) struct Recorder {
    rank: u32,
    world: u32,
    cfg: TraceConfig,
    backend: &'static str,
    clock: Clock,
    entries: BTreeMap<usize, Traced>,
    calls: Vec<CallRec>,
    steps: Vec<StepRec>,
    untraced_calls: u64,
    dropped_steps: u64,
    /// The next call's number and bytes ([`Recorder::note_call`]).
    next: (u64, u64),
    /// A call is being recorded.
    active: bool,
    /// Steps of the current call past this many records are dropped.
    limit: usize,
    segment: u32,
    /// Of the current program: each stream's first step in `end_of`.
    offsets: Vec<usize>,
    /// Per stream: when its last step ended (or the segment began).
    last_end: Vec<u64>,
    /// Per step of the current program (flat): when it ended in this segment.
    end_of: Vec<u64>,
    /// Records since the file was last written (`None`: never written).
    unwritten: Option<usize>,
}

impl Recorder {
    /// A recorder for `rank` of `world`; makes the directory.
    pub(crate) fn new(cfg: &TraceConfig, rank: u32, world: u32) -> crate::Result<Recorder> {
        std::fs::create_dir_all(&cfg.dir).map_err(|e| {
            crate::ExecError::Invalid(format!(
                "HCCL_TRACE={}: cannot create the directory: {e}",
                cfg.dir.display()
            ))
        })?;
        Ok(Recorder {
            rank,
            world,
            cfg: cfg.clone(),
            backend: "threads",
            clock: Clock::shared("one process: the ranks share its clock"),
            entries: BTreeMap::new(),
            calls: Vec::with_capacity(cfg.calls.min(MAX_CALLS) as usize),
            steps: Vec::new(),
            untraced_calls: 0,
            dropped_steps: 0,
            next: (0, 0),
            active: false,
            limit: 0,
            segment: 0,
            offsets: Vec::new(),
            last_end: Vec::new(),
            end_of: Vec::new(),
            unwritten: None,
        })
    }

    /// Says which backend runs the rank and how its clock was aligned.
    pub(crate) fn set_clock(&mut self, backend: &'static str, clock: Clock) {
        self.backend = backend;
        self.clock = clock;
    }

    /// The number and size of the call about to be replayed.
    pub(crate) fn note_call(&mut self, seq: u64, bytes: u64) {
        self.next = (seq, bytes);
    }

    /// A call of `entry` in `segments` segments begins.
    pub(crate) fn begin(&mut self, entry: &Entry, segments: u64) {
        if self.calls.len() >= self.cfg.calls.min(MAX_CALLS) as usize {
            self.untraced_calls += 1;
            self.active = false;
            return;
        }
        let prog = &entry.program;
        self.entries
            .entry(entry.index)
            .or_insert_with(|| Traced::of(entry));
        self.offsets.clear();
        let mut total = 0usize;
        for st in &prog.streams {
            self.offsets.push(total);
            total += st.len();
        }
        self.end_of.clear();
        self.end_of.resize(total, 0);
        self.last_end.clear();
        self.last_end.resize(prog.streams.len(), 0);
        let want = total.saturating_mul(segments as usize);
        let room = MAX_STEPS.saturating_sub(self.steps.len());
        self.steps.reserve(want.min(room));
        self.limit = self.steps.len() + want.min(room);
        let (seq, bytes) = self.next;
        self.calls.push(CallRec {
            seq,
            entry: entry.index,
            bytes,
            segments,
            start: now_ns(),
            end: 0,
            ok: false,
        });
        self.active = true;
    }

    /// Segment `segment` of the current call begins.
    #[inline]
    pub(crate) fn segment(&mut self, segment: u64) {
        if !self.active {
            return;
        }
        let now = now_ns();
        self.segment = segment as u32;
        self.last_end.iter_mut().for_each(|t| *t = now);
    }

    /// Step `pc` of stream `s` of `prog` (the current call's program) completed.
    #[inline]
    pub(crate) fn step(&mut self, prog: &Program, s: usize, pc: usize) {
        if !self.active {
            return;
        }
        let end = now_ns();
        let (d0, d1) = prog.streams[s][pc].deps;
        let mut start = self.last_end[s];
        for &(ds, dt) in &prog.deps[d0 as usize..d1 as usize] {
            start = start.max(self.end_of[self.offsets[ds as usize] + dt as usize]);
        }
        self.last_end[s] = end;
        self.end_of[self.offsets[s] + pc] = end;
        if self.steps.len() < self.limit {
            self.steps.push(StepRec {
                call: (self.calls.len() - 1) as u32,
                segment: self.segment,
                stream: s as u32,
                step: pc as u32,
                start,
                end,
            });
        } else {
            self.dropped_steps += 1;
        }
    }

    /// The current call ended (`ok`: without error).
    pub(crate) fn end(&mut self, ok: bool) {
        if !self.active {
            return;
        }
        self.active = false;
        if let Some(c) = self.calls.last_mut() {
            c.end = now_ns();
            c.ok = ok;
        }
        self.unwritten = Some(self.unwritten.unwrap_or(0) + 1);
    }

    /// Microseconds on rank 0's clock.
    fn us(&self, t: u64) -> f64 {
        (i128::from(t) + i128::from(self.clock.offset_ns)) as f64 / 1e3
    }

    /// The rank's trace document.
    pub(crate) fn document(&self) -> TraceFile {
        let r = self.rank;
        let mut events: Vec<Event> = process_meta(r).into();
        // Thread names: a stream's name from every entry traced (the same in the usual
        // case of one entry, or entries of the same layout).
        let mut names: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for t in self.entries.values() {
            for (i, &c) in t.channels.iter().enumerate() {
                let n = hccl_ir::trace::thread_name(i as u32, c);
                let v = names.entry(i as u32).or_default();
                if !v.contains(&n) {
                    v.push(n);
                }
            }
        }
        for (i, n) in &names {
            events.push(thread_meta(r, *i, &n.join(" / ")));
        }
        events.push(thread_meta(r, CALLS_TID, "calls"));
        events.push(Event::meta(
            "thread_sort_index",
            r,
            Some(CALLS_TID),
            json!({"sort_index": -1}),
        ));
        for c in self.calls.iter().filter(|c| c.end != 0) {
            let Some(t) = self.entries.get(&c.entry) else {
                continue;
            };
            let mut e = Event::slice(
                &t.collective,
                "call",
                r,
                CALLS_TID,
                self.us(c.start),
                self.us(c.end) - self.us(c.start),
            );
            e.args = json_map(json!({
                "call": c.seq,
                "bytes": c.bytes,
                "entry": c.entry,
                "algorithm": t.algorithm,
                "protocol": t.protocol,
                "segments": c.segments,
                "ok": c.ok,
            }));
            events.push(e);
        }
        for s in &self.steps {
            let c = &self.calls[s.call as usize];
            if c.end == 0 {
                continue;
            }
            let Some(t) = self.entries.get(&c.entry) else {
                continue;
            };
            let Some(&(op, count)) = t
                .steps
                .get(s.stream as usize)
                .and_then(|v| v.get(s.step as usize))
            else {
                continue;
            };
            // As the predicted trace counts them: the call's bytes per chunk and segment.
            let chunk = c.bytes as f64 / f64::from(t.chunks.max(1)) / c.segments.max(1) as f64;
            let mut e = step_slice(
                r,
                s.stream,
                s.step,
                &op,
                count,
                (f64::from(count) * chunk).round(),
                self.us(s.start),
                self.us(s.end) - self.us(s.start),
            );
            e.args.insert("call".into(), json!(c.seq));
            e.args.insert("segment".into(), json!(s.segment));
            events.push(e);
        }
        let traced = self.calls.iter().filter(|c| c.end != 0).count();
        let other = json_map(json!({
            "source": "measured",
            "rank": r,
            "world": self.world,
            "backend": self.backend,
            "clock": {
                "method": self.clock.method,
                "offset_us": self.clock.offset_ns as f64 / 1e3,
                "uncertainty_us": self.clock.uncertainty_ns as f64 / 1e3,
            },
            "timestamps": "microseconds on rank 0's CLOCK_MONOTONIC",
            "step_start": "when the step's dependencies are done: the later of the end of its \
                           stream's previous step (the segment's start for a first step) and \
                           the ends of the steps it depends on",
            "calls_limit": self.cfg.calls,
            "calls_traced": traced,
            "calls_untraced": self.untraced_calls,
            "steps_limit": MAX_STEPS,
            "steps_dropped": self.dropped_steps,
            "note": format!(
                "the first {} calls of the rank (HCCL_TRACE_CALLS, at most {MAX_CALLS}), \
                 every segment of each",
                self.cfg.calls
            ),
        }));
        TraceFile::new(events, other)
    }

    /// Writes `DIR/rank-<r>.json` (atomically) and returns its path.
    pub(crate) fn flush(&mut self) -> crate::Result<PathBuf> {
        let path = hccl_ir::trace::rank_file(&self.cfg.dir, self.rank);
        self.document()
            .save(&path)
            .map_err(|source| crate::ExecError::Io {
                rank: self.rank,
                what: format!("writing the trace {}", path.display()),
                source,
            })?;
        self.unwritten = Some(0);
        Ok(path)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.unwritten == Some(0) {
            return;
        }
        if let Err(e) = self.flush() {
            tracing::warn!("rank {}: {e}", self.rank);
        }
    }
}

fn json_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl Traced {
    fn of(entry: &Entry) -> Traced {
        let prog = &entry.program;
        Traced {
            collective: entry.collective.to_string(),
            algorithm: entry.algorithm.clone(),
            protocol: entry.protocol.name(),
            chunks: entry.chunks,
            channels: prog.channels.clone(),
            steps: prog
                .streams
                .iter()
                .map(|st| st.iter().map(|i| (op_of(i), i.count)).collect())
                .collect(),
        }
    }
}

/// The IR op an instruction was compiled from.
fn op_of(i: &Instr) -> Op {
    let (from, to, src, dst): (u32, u32, Loc, Loc) = (i.recv_peer, i.send_peer, i.src, i.dst);
    match i.kind {
        Kind::Send => Op::Send { to, src },
        Kind::Recv => Op::Recv { from, dst },
        Kind::RecvReduceCopy => Op::RecvReduceCopy { from, src, dst },
        Kind::RecvReduceSend => Op::RecvReduceSend { from, to, src },
        Kind::RecvReduceCopySend => Op::RecvReduceCopySend { from, to, src, dst },
        Kind::RecvCopySend => Op::RecvCopySend { from, to, dst },
        Kind::Copy => Op::Copy { src, dst },
        Kind::Reduce => Op::Reduce { src, dst },
        Kind::Nop => Op::Nop,
    }
}
