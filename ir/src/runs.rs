//! Strided runs: the compact form of rank programs in plan files, a symmetric entry's
//! template (from format 5) and an explicit entry's programs (from format 6).
//!
//! Deep pipelined templates are regular: inside a stream, consecutive steps are often the same
//! op on the same peers with the same count, their offsets (and dependencies) advancing by a
//! constant stride; and consecutive streams (or every second one, …) are often the same
//! stream with peers, offsets, dependencies and channel advancing by constant strides. The
//! plan file writes such a run once, with a `repeat` saying how often and by how much:
//!
//! ```ron
//! steps: [(
//!   op: Send(to: 1, src: (buf: Input, off: 512)),
//!   count: 512,
//!   repeat: (times: 12, src: 8192),
//! )]
//! ```
//!
//! is the 12 steps `Send(to: 1, src: (buf: Input, off: 512 + k·8192))`, `k = 0..12`.
//!
//! # Step repeats
//!
//! A step may carry `repeat: (times: T, every: E, to: …, from: …, src: …, dst: …, deps: […])`:
//! the step stands for `T ≥ 2` steps; copy `k` (`k = 0..T`, copy 0 the step as written) has
//! its `to` and `from` peers, its `src` and `dst` offsets moved by `k` times the given
//! (signed) strides, and its `i`-th dependency moved by `k` times `deps[i]` (`(stream: …,
//! step: …)`; `deps: []` when no dependency moves, else one stride per dependency). Op,
//! buffers and count are those of the step. Fields that are 0 (and `every: 1`, `deps: []`)
//! are not written; a stride on a field the op does not have is an error.
//!
//! # Stream repeats
//!
//! A stream may carry `repeat: (times: T, every: E, channel: c, steps: [ … ])`: copy `k` of
//! the stream has its channel moved by `k·c`, and its `j`-th *written* step (the step as
//! written, its own `repeat` kept as it is) moved by `k` times `steps[j]`, a stride of the
//! form `(to: …, from: …, src: …, dst: …, deps: […])` (`steps: []` when no step moves, else
//! one per written step).
//!
//! # Where copies go
//!
//! Copies are placed in *slots*, the positions of the expanded list (of steps of a stream, or
//! of streams of the template): each written item goes to the first free slot, and its copy
//! `k` to `k·E` slots after it (`every: E ≥ 1`, written only when not 1). So `every: 2` runs
//! interleave: two written streams with `times: 5, every: 2` stand for ten streams
//! alternating between them. Every slot must be filled exactly once: copies that land on a
//! filled slot or leave a gap are an error, as are `times` below 2, offsets, peers or
//! dependencies that leave `u32`, and expansions past [`MAX_TEMPLATE_ITEMS`].
//!
//! # Rank runs
//!
//! The symmetry's `ranks` (one per grid position, often `0..nranks` in order) is written
//! `rank_runs: [(first: 0, times: 4096)]` when runs of constant `step` (written when not 1)
//! make it at least 8 times shorter: run `(first: f, times: t, step: s)` stands for the ranks
//! `f, f + s, …, f + (t − 1)·s`. A symmetry has exactly one of `ranks` and `rank_runs`.
//!
//! The writer finds runs greedily ([`encode`]: at each first free slot, the longest run over
//! `every` in `1..=`[`MAX_EVERY`], at least [`MIN_TIMES`] long), so a template without runs
//! is written exactly as before (format 4), and reading gives back the template written.

use crate::schedule::{Collective, Dep, Loc, Op, RankProgram, ScheduleHeader, Step, Stream};
use crate::symmetric::{SymmetricSchedule, Symmetry};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Shortest run the writer compresses.
pub const MIN_TIMES: u32 = 3;

/// Largest `every` the writer tries.
pub const MAX_EVERY: usize = 8;

/// Most streams, and most steps, an expanded template may have (a bound on what a small
/// hostile file can make the reader allocate).
pub const MAX_TEMPLATE_ITEMS: u64 = 1 << 24;

thread_local! {
    /// How many steps the templates read on this thread may still have, all together, and
    /// where that limit comes from; `None`: only [`MAX_TEMPLATE_ITEMS`] per template
    /// ([`with_budget`]).
    static BUDGET: std::cell::RefCell<Option<(u64, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `read` with the templates it reads on this thread limited to `items` steps in all
/// (`why`: where the limit comes from, for the error), so that a plan refused by its
/// expansion limit is refused before its templates are allocated.
pub(crate) fn with_budget<T>(items: u64, why: &str, read: impl FnOnce() -> T) -> T {
    let before = BUDGET.replace(Some((items, why.to_string())));
    let out = read();
    BUDGET.set(before);
    out
}

/// Takes `n` items of `what` from the budget ([`with_budget`]), or says why not.
fn charge(n: u64, what: &str) -> Result<(), String> {
    BUDGET.with_borrow_mut(|budget| match budget {
        None => Ok(()),
        Some((left, why)) if n > *left => Err(format!(
            "{what} expand to {n}, past what the plan's expansion limit leaves ({left} steps \
             of {why})"
        )),
        Some((left, _)) => {
            *left -= n;
            Ok(())
        }
    })
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

fn one() -> u32 {
    1
}

/// How one dependency moves per copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename = "Dep", deny_unknown_fields)]
pub struct DepStride {
    pub stream: i64,
    pub step: i64,
}

/// How a step moves per copy: its peers, offsets and dependencies.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename = "Stride", deny_unknown_fields)]
pub struct Stride {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub to: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub from: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub src: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dst: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<DepStride>,
}

/// A step's `repeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Repeat", deny_unknown_fields)]
pub struct StepRepeat {
    pub times: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub every: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub to: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub from: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub src: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dst: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<DepStride>,
}

impl StepRepeat {
    fn stride(&self) -> Stride {
        Stride {
            to: self.to,
            from: self.from,
            src: self.src,
            dst: self.dst,
            deps: self.deps.clone(),
        }
    }

    fn new(times: u32, every: u32, s: Stride) -> StepRepeat {
        StepRepeat {
            times,
            every,
            to: s.to,
            from: s.from,
            src: s.src,
            dst: s.dst,
            deps: s.deps,
        }
    }
}

/// A stream's `repeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Repeat", deny_unknown_fields)]
pub struct StreamRepeat {
    pub times: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub every: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub channel: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Stride>,
}

/// A written step: a [`Step`] and its optional `repeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Step", deny_unknown_fields)]
pub struct WStep {
    pub op: Op,
    pub count: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<Dep>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "bare",
        deserialize_with = "present"
    )]
    pub repeat: Option<StepRepeat>,
}

/// A written stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Stream", deny_unknown_fields)]
pub struct WStream {
    pub channel: u32,
    pub steps: Vec<WStep>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "bare",
        deserialize_with = "present"
    )]
    pub repeat: Option<StreamRepeat>,
}

/// A written template program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "RankProgram", deny_unknown_fields)]
pub struct WProgram {
    #[serde(default)]
    pub scratch_chunks: u32,
    pub streams: Vec<WStream>,
}

/// Writes the value of a present optional field without RON's `Some(…)`.
fn bare<T: Serialize, S: Serializer>(value: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => v.serialize(s),
        None => s.serialize_none(),
    }
}

/// Reads a present optional field written without `Some(…)`.
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

// ---------------------------------------------------------------------------------------
// Moving steps by strides.

/// `v + k·s` as a `u32`, or `None` when it leaves `u32`.
fn moved(v: u32, k: u32, s: i64) -> Option<u32> {
    let x = i128::from(v) + i128::from(k) * i128::from(s);
    u32::try_from(x).ok()
}

/// The op's (to, from, src offset, dst offset), each `None` when the op has no such field.
fn fields(op: &Op) -> [Option<u32>; 4] {
    [
        op.send_peer(),
        op.recv_peer(),
        op.src().map(|l| l.off),
        op.dst().map(|l| l.off),
    ]
}

const FIELD_NAMES: [&str; 4] = ["to", "from", "src", "dst"];

/// `op` with its fields moved by `k` times `s`; an error names a stride on a field the op
/// lacks or a value leaving `u32`.
fn move_op(op: Op, k: u32, s: &Stride) -> Result<Op, String> {
    let strides = [s.to, s.from, s.src, s.dst];
    let have = fields(&op);
    let mut new = [0u32; 4];
    for i in 0..4 {
        match have[i] {
            Some(v) => {
                new[i] = moved(v, k, strides[i]).ok_or_else(|| {
                    format!(
                        "repeat: {} {v} moved {k} times by {} leaves 0..2^32",
                        FIELD_NAMES[i], strides[i]
                    )
                })?;
            }
            None if strides[i] != 0 => {
                return Err(format!(
                    "repeat: a stride for `{}` on a {} step, which has none",
                    FIELD_NAMES[i],
                    op.name()
                ));
            }
            None => {}
        }
    }
    let [to, from, so, d] = new;
    Ok(op
        .map_ends(|_| from, |_| to)
        .map_locs(|l| Loc { off: so, ..l }, |l| Loc { off: d, ..l }))
}

fn move_deps(deps: &[Dep], k: u32, s: &[DepStride]) -> Result<Vec<Dep>, String> {
    if s.is_empty() {
        return Ok(deps.to_vec());
    }
    if s.len() != deps.len() {
        return Err(format!(
            "repeat: {} dependency strides for {} dependencies",
            s.len(),
            deps.len()
        ));
    }
    let mut out = Vec::with_capacity(deps.len());
    for (d, s) in deps.iter().zip(s) {
        match (moved(d.stream, k, s.stream), moved(d.step, k, s.step)) {
            (Some(stream), Some(step)) => out.push(Dep { stream, step }),
            _ => {
                return Err(format!(
                    "repeat: dependency (stream: {}, step: {}) moved {k} times by (stream: {}, step: {}) leaves 0..2^32",
                    d.stream, d.step, s.stream, s.step
                ));
            }
        }
    }
    Ok(out)
}

/// The stride that takes `a` to `b`, when they differ only by strides.
fn stride_between(a: &Step, b: &Step) -> Option<Stride> {
    if a.count != b.count
        || std::mem::discriminant(&a.op) != std::mem::discriminant(&b.op)
        || a.op.src().map(|l| l.buf) != b.op.src().map(|l| l.buf)
        || a.op.dst().map(|l| l.buf) != b.op.dst().map(|l| l.buf)
        || a.deps.len() != b.deps.len()
    {
        return None;
    }
    let (fa, fb) = (fields(&a.op), fields(&b.op));
    let d = |i: usize| match (fa[i], fb[i]) {
        (Some(x), Some(y)) => i64::from(y) - i64::from(x),
        _ => 0,
    };
    let deps: Vec<DepStride> = a
        .deps
        .iter()
        .zip(&b.deps)
        .map(|(x, y)| DepStride {
            stream: i64::from(y.stream) - i64::from(x.stream),
            step: i64::from(y.step) - i64::from(x.step),
        })
        .collect();
    let deps = if deps.iter().all(|s| *s == DepStride::default()) {
        Vec::new()
    } else {
        deps
    };
    Some(Stride {
        to: d(0),
        from: d(1),
        src: d(2),
        dst: d(3),
        deps,
    })
}

fn move_step(step: &Step, k: u32, s: &Stride) -> Result<Step, String> {
    Ok(Step {
        op: move_op(step.op, k, s)?,
        count: step.count,
        deps: move_deps(&step.deps, k, &s.deps)?,
    })
}

// ---------------------------------------------------------------------------------------
// Encoding.

/// Greedy runs over `n` items: `(first, times, every, stride)` per written item, in slot
/// order (see the module docs).
fn runs<D: PartialEq>(
    n: usize,
    between: impl Fn(usize, usize) -> Option<D>,
) -> Vec<(usize, u32, usize, Option<D>)> {
    let mut covered = vec![false; n];
    let mut out = Vec::new();
    for i in 0..n {
        if covered[i] {
            continue;
        }
        let mut best: (usize, usize, Option<D>) = (1, 1, None);
        for every in 1..=MAX_EVERY {
            let j = i + every;
            if j >= n || covered[j] {
                continue;
            }
            let Some(d) = between(i, j) else { continue };
            let mut k = 2;
            while let Some(next) = i.checked_add(k * every).filter(|&x| x < n) {
                if covered[next] || u32::try_from(k).is_err() {
                    break;
                }
                if between(next - every, next).as_ref() != Some(&d) {
                    break;
                }
                k += 1;
            }
            if k > best.0 {
                best = (k, every, Some(d));
            }
        }
        let (times, every, d) = best;
        if times >= MIN_TIMES as usize {
            for m in 0..times {
                covered[i + m * every] = true;
            }
            out.push((i, times as u32, every, d));
        } else {
            covered[i] = true;
            out.push((i, 1, 1, None));
        }
    }
    out
}

fn encode_steps(steps: &[Step]) -> Vec<WStep> {
    runs(steps.len(), |a, b| stride_between(&steps[a], &steps[b]))
        .into_iter()
        .map(|(i, times, every, d)| {
            let s = &steps[i];
            WStep {
                op: s.op,
                count: s.count,
                deps: s.deps.clone(),
                repeat: d.map(|d| StepRepeat::new(times, every as u32, d)),
            }
        })
        .collect()
}

/// What takes written stream `a` to `b`: the channel stride and one stride per written step.
fn stream_stride(a: &WStream, b: &WStream) -> Option<(i64, Vec<Stride>)> {
    if a.steps.len() != b.steps.len() {
        return None;
    }
    let steps = a
        .steps
        .iter()
        .zip(&b.steps)
        .map(|(x, y)| {
            if x.repeat != y.repeat {
                return None;
            }
            stride_between(&as_step(x), &as_step(y))
        })
        .collect::<Option<Vec<Stride>>>()?;
    let steps = if steps.iter().all(|s| *s == Stride::default()) {
        Vec::new()
    } else {
        steps
    };
    Some((i64::from(b.channel) - i64::from(a.channel), steps))
}

fn as_step(w: &WStep) -> Step {
    Step {
        op: w.op,
        count: w.count,
        deps: w.deps.clone(),
    }
}

/// The written form of `program`: step runs inside streams, then runs of streams (see the
/// module docs).
pub fn encode(program: &RankProgram) -> WProgram {
    let streams: Vec<WStream> = program
        .streams
        .iter()
        .map(|s| WStream {
            channel: s.channel,
            steps: encode_steps(&s.steps),
            repeat: None,
        })
        .collect();
    let written = runs(streams.len(), |a, b| {
        stream_stride(&streams[a], &streams[b])
    })
    .into_iter()
    .map(|(i, times, every, d)| WStream {
        repeat: d.map(|(channel, steps)| StreamRepeat {
            times,
            every: every as u32,
            channel,
            steps,
        }),
        ..streams[i].clone()
    })
    .collect();
    WProgram {
        scratch_chunks: program.scratch_chunks,
        streams: written,
    }
}

// ---------------------------------------------------------------------------------------
// Decoding.

/// Places written items in slots: item `i` (with `times`, `every`) at the first free slot
/// and its copies `every` apart; `make(i, k)` builds copy `k`. `what` names the items in
/// errors.
fn place<T>(
    reps: &[(u32, u32)],
    what: &str,
    mut make: impl FnMut(usize, u32) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let total: u64 = reps.iter().map(|&(t, _)| u64::from(t)).sum();
    if total > MAX_TEMPLATE_ITEMS {
        return Err(format!(
            "repeats expand to {total} {what}s; at most {MAX_TEMPLATE_ITEMS} are allowed"
        ));
    }
    let total = total as usize;
    let mut slots: Vec<Option<T>> = (0..total).map(|_| None).collect();
    let mut free = 0usize;
    for (i, &(times, every)) in reps.iter().enumerate() {
        while free < total && slots[free].is_some() {
            free += 1;
        }
        let first = free;
        for k in 0..times {
            let at = u64::from(k) * u64::from(every) + first as u64;
            let slot = usize::try_from(at)
                .ok()
                .and_then(|at| slots.get_mut(at))
                .ok_or_else(|| {
                    format!(
                        "written {what} {i}: copy {k} of its repeat lands at {what} {at}, past the {total} {what}s the repeats make"
                    )
                })?;
            if slot.is_some() {
                return Err(format!(
                    "written {what} {i}: copy {k} of its repeat lands at {what} {at}, which another {what} fills"
                ));
            }
            *slot = Some(make(i, k)?);
        }
    }
    // Pushed into an exact allocation (collecting `Result`s would grow it by doubling).
    let mut out = Vec::with_capacity(total);
    for (at, s) in slots.into_iter().enumerate() {
        out.push(s.ok_or_else(|| format!("repeats leave {what} {at} empty"))?);
    }
    Ok(out)
}

fn check_repeat(times: u32, every: u32) -> Result<(), String> {
    if times < 2 {
        return Err(format!(
            "repeat: times is {times}; a repeat stands for at least 2 copies"
        ));
    }
    if every == 0 {
        return Err("repeat: every is 0; copies are at least 1 apart".into());
    }
    Ok(())
}

fn expand_steps(steps: &[WStep]) -> Result<Vec<Step>, String> {
    if steps.iter().all(|s| s.repeat.is_none()) {
        return Ok(steps.iter().map(as_step).collect());
    }
    let mut reps = Vec::with_capacity(steps.len());
    for s in steps {
        match &s.repeat {
            Some(r) => {
                check_repeat(r.times, r.every)?;
                reps.push((r.times, r.every));
            }
            None => reps.push((1, 1)),
        }
    }
    let strides: Vec<Option<Stride>> = steps
        .iter()
        .map(|s| s.repeat.as_ref().map(StepRepeat::stride))
        .collect();
    place(&reps, "step", |i, k| {
        let s = &steps[i];
        match &strides[i] {
            Some(stride) if k > 0 => Ok(Step {
                op: move_op(s.op, k, stride)?,
                count: s.count,
                deps: move_deps(&s.deps, k, &stride.deps)?,
            }),
            _ => Ok(as_step(s)),
        }
    })
}

/// Written stream `w` moved `k` times by its stream repeat.
fn move_stream(w: &WStream, k: u32) -> Result<WStream, String> {
    let Some(r) = &w.repeat else {
        return Ok(w.clone());
    };
    if !r.steps.is_empty() && r.steps.len() != w.steps.len() {
        return Err(format!(
            "repeat: {} step strides for a stream of {} written steps",
            r.steps.len(),
            w.steps.len()
        ));
    }
    let channel = moved(w.channel, k, r.channel).ok_or_else(|| {
        format!(
            "repeat: channel {} moved {k} times by {} leaves 0..2^32",
            w.channel, r.channel
        )
    })?;
    let steps = w
        .steps
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let Some(stride) = r.steps.get(j) else {
                return Ok(s.clone());
            };
            let m = move_step(&as_step(s), k, stride)?;
            Ok(WStep {
                op: m.op,
                count: m.count,
                deps: m.deps,
                repeat: s.repeat.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(WStream {
        channel,
        steps,
        repeat: None,
    })
}

impl WProgram {
    /// The template this written form stands for; errors say which repeat is malformed.
    pub fn expand(&self) -> Result<RankProgram, String> {
        self.expand_as("the template's steps")
    }

    /// The program this written form stands for, its steps charged to the reading thread's
    /// budget ([`with_budget`]) as `what`.
    pub(crate) fn expand_as(&self, what: &str) -> Result<RankProgram, String> {
        let mut reps = Vec::with_capacity(self.streams.len());
        let mut steps_total = 0u64;
        for (i, s) in self.streams.iter().enumerate() {
            let (times, every) = match &s.repeat {
                Some(r) => {
                    check_repeat(r.times, r.every).map_err(|e| format!("stream {i}: {e}"))?;
                    (r.times, r.every)
                }
                None => (1, 1),
            };
            let per: u64 = s
                .steps
                .iter()
                .map(|w| w.repeat.as_ref().map_or(1, |r| u64::from(r.times)))
                .sum();
            steps_total = steps_total.saturating_add(per.saturating_mul(u64::from(times)));
            reps.push((times, every));
        }
        if steps_total > MAX_TEMPLATE_ITEMS {
            return Err(format!(
                "repeats expand to {steps_total} steps; at most {MAX_TEMPLATE_ITEMS} are allowed"
            ));
        }
        // A template of T steps expands to at least T steps (one rank), so charging them
        // refuses nothing the expansion limit allows; streams are charged too when more
        // (empty streams cost memory as well).
        let streams_total: u64 = reps.iter().map(|&(t, _)| u64::from(t)).sum();
        charge(steps_total.max(streams_total), what)?;
        let streams = place(&reps, "stream", |i, k| {
            let w = &self.streams[i];
            if let Some(r) = &w.repeat
                && k > 0
                && w.steps.iter().all(|s| s.repeat.is_none())
                && r.steps.len() == w.steps.len()
            {
                // Copy k of a stream of plain steps: its steps moved directly.
                let channel = moved(w.channel, k, r.channel).ok_or_else(|| {
                    format!(
                        "stream {i}: repeat: channel {} moved {k} times by {} leaves 0..2^32",
                        w.channel, r.channel
                    )
                })?;
                let mut steps = Vec::with_capacity(w.steps.len());
                for (s, stride) in w.steps.iter().zip(&r.steps) {
                    let fail = |e| format!("stream {i}: {e}");
                    steps.push(Step {
                        op: move_op(s.op, k, stride).map_err(fail)?,
                        count: s.count,
                        deps: move_deps(&s.deps, k, &stride.deps).map_err(fail)?,
                    });
                }
                return Ok(Stream { channel, steps });
            }
            let copy;
            let w = if k == 0 {
                w
            } else {
                copy = move_stream(w, k).map_err(|e| format!("stream {i}: {e}"))?;
                &copy
            };
            let steps = expand_steps(&w.steps).map_err(|e| format!("stream {i}: {e}"))?;
            Ok(Stream {
                channel: w.channel,
                steps,
            })
        })?;
        Ok(RankProgram {
            scratch_chunks: self.scratch_chunks,
            streams,
        })
    }
}

/// A template program read in the written form (with or without repeats) and expanded.
pub(crate) struct Template(pub RankProgram);

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Template, D::Error> {
        let w = WProgram::deserialize(d)?;
        w.expand()
            .map(Template)
            .map_err(|e| serde::de::Error::custom(format!("template: {e}")))
    }
}

/// A run of ranks in a symmetry's `rank_runs`: `first`, `first + step`, … (`times` ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "RankRun", deny_unknown_fields)]
pub struct RankRun {
    pub first: u32,
    pub times: u32,
    #[serde(default = "one_i64", skip_serializing_if = "is_one_i64")]
    pub step: i64,
}

fn one_i64() -> i64 {
    1
}

fn is_one_i64(v: &i64) -> bool {
    *v == 1
}

/// `ranks` as runs of constant step (greedy, longest first run).
fn rank_runs(ranks: &[u32]) -> Vec<RankRun> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let first = ranks[i];
        let step = ranks
            .get(i + 1)
            .map_or(1, |&r| i64::from(r) - i64::from(first));
        let mut times = 1usize;
        while ranks
            .get(i + times)
            .is_some_and(|&r| i64::from(r) == i64::from(first) + step * times as i64)
            && times < u32::MAX as usize
        {
            times += 1;
        }
        let step = if times == 1 { 1 } else { step };
        out.push(RankRun {
            first,
            times: times as u32,
            step,
        });
        i += times;
    }
    out
}

/// The ranks `runs` stand for; errors name a run that leaves `u32` or a total past
/// [`MAX_TEMPLATE_ITEMS`].
fn expand_rank_runs(runs: &[RankRun]) -> Result<Vec<u32>, String> {
    let total: u64 = runs.iter().map(|r| u64::from(r.times)).sum();
    if total > MAX_TEMPLATE_ITEMS {
        return Err(format!(
            "symmetry.rank_runs stand for {total} ranks; at most {MAX_TEMPLATE_ITEMS} are allowed"
        ));
    }
    let mut out = Vec::with_capacity(total as usize);
    for (i, r) in runs.iter().enumerate() {
        if r.times == 0 {
            return Err(format!("symmetry.rank_runs[{i}]: times is 0"));
        }
        if moved(r.first, r.times - 1, r.step).is_none() {
            return Err(format!(
                "symmetry.rank_runs[{i}]: rank {} moved {} times by {} leaves 0..2^32",
                r.first,
                r.times - 1,
                r.step
            ));
        }
        let mut v = i64::from(r.first);
        for _ in 0..r.times {
            out.push(v as u32);
            v += r.step;
        }
    }
    Ok(out)
}

/// A [`Symmetry`] as plan files write it: `ranks` as `rank_runs` when that is shorter
/// (see the module docs).
#[derive(Serialize)]
#[serde(rename = "Symmetry")]
struct SymmetryOut<'a> {
    dims: &'a [u32],
    actions: &'a [crate::symmetric::Action],
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "bare")]
    ranks: Option<&'a [u32]>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "bare")]
    rank_runs: Option<Vec<RankRun>>,
    chunks: &'a Option<crate::symmetric::ChunkMap>,
}

impl SymmetryOut<'_> {
    fn of(s: &Symmetry) -> SymmetryOut<'_> {
        let runs = rank_runs(&s.ranks);
        let compact = runs.len() * 8 <= s.ranks.len();
        SymmetryOut {
            dims: &s.dims,
            actions: &s.actions,
            ranks: (!compact).then_some(&s.ranks[..]),
            rank_runs: compact.then_some(runs),
            chunks: &s.chunks,
        }
    }
}

/// A [`Symmetry`] read from a plan file: `ranks` or `rank_runs`, exactly one.
#[derive(Deserialize)]
#[serde(rename = "Symmetry", deny_unknown_fields)]
struct SymmetryIn {
    dims: Vec<u32>,
    actions: Vec<crate::symmetric::Action>,
    #[serde(default, deserialize_with = "present")]
    ranks: Option<Vec<u32>>,
    #[serde(default, deserialize_with = "present")]
    rank_runs: Option<Vec<RankRun>>,
    chunks: Option<crate::symmetric::ChunkMap>,
}

/// A [`Symmetry`] read from a plan file.
struct ReadSymmetry(Symmetry);

impl<'de> Deserialize<'de> for ReadSymmetry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ReadSymmetry, D::Error> {
        use serde::de::Error;
        let s = SymmetryIn::deserialize(d)?;
        let ranks = match (s.ranks, s.rank_runs) {
            (Some(r), None) => r,
            (None, Some(runs)) => expand_rank_runs(&runs).map_err(D::Error::custom)?,
            (Some(_), Some(_)) => {
                return Err(D::Error::custom(
                    "symmetry has both `ranks` and `rank_runs`; it needs exactly one",
                ));
            }
            (None, None) => {
                return Err(D::Error::custom(
                    "symmetry has neither `ranks` nor `rank_runs`; it needs exactly one",
                ));
            }
        };
        Ok(ReadSymmetry(Symmetry {
            dims: s.dims,
            actions: s.actions,
            ranks,
            chunks: s.chunks,
        }))
    }
}

/// A [`SymmetricSchedule`] as plan files write it: the template in the written form.
pub(crate) struct SymmetricOut<'a> {
    header: ScheduleHeader,
    symmetry: SymmetryOut<'a>,
    template: WProgram,
}

impl SymmetricOut<'_> {
    pub(crate) fn of(s: &SymmetricSchedule) -> SymmetricOut<'_> {
        SymmetricOut {
            header: s.header(),
            symmetry: SymmetryOut::of(&s.symmetry),
            template: encode(&s.template),
        }
    }
}

impl Serialize for SymmetricOut<'_> {
    /// The fields of [`SymmetricSchedule`], in its order (the header's kept flat).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("SymmetricSchedule", ScheduleHeader::FIELDS + 2)?;
        self.header.serialize_fields(&mut st)?;
        st.serialize_field("symmetry", &self.symmetry)?;
        st.serialize_field("template", &self.template)?;
        st.end()
    }
}

/// A [`SymmetricSchedule`] read from a plan file, its template expanded.
#[derive(Deserialize)]
#[serde(rename = "SymmetricSchedule", deny_unknown_fields)]
pub(crate) struct SymmetricIn {
    collective: Collective,
    nranks: u32,
    chunks: u32,
    input_chunks: u32,
    output_chunks: u32,
    in_place: bool,
    symmetry: ReadSymmetry,
    template: Template,
}

impl From<SymmetricIn> for SymmetricSchedule {
    fn from(s: SymmetricIn) -> SymmetricSchedule {
        let header = ScheduleHeader {
            collective: s.collective,
            nranks: s.nranks,
            chunks: s.chunks,
            input_chunks: s.input_chunks,
            output_chunks: s.output_chunks,
            in_place: s.in_place,
        };
        SymmetricSchedule::from_header(header, s.symmetry.0, s.template.0)
    }
}

#[cfg(test)]
pub(crate) mod tests;
