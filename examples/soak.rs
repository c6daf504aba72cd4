//! Soak: random collectives for a while on every CPU backend, every result checked.
//!
//! Calls of every kind (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll,
//! AllToAllv) with random sizes (0 bytes to `--max-bytes`, log-uniform), element types,
//! operators, roots and in place or not, with message checksums (`HCCL_CHECKSUM=1`) and
//! call fingerprints compared at the end of every call (`HCCL_CHECK_CALLS=1`), on three
//! backends in turn: `threads` (ranks as threads of this process), `process` (ranks as
//! processes of one host, sharing memory) and `hosts` (ranks as processes of 2 emulated hosts,
//! `HCCL_HOST_ID`, talking TCP over loopback). Every rank draws the same calls from the
//! seeded generator, makes its inputs from the seed, and checks its output against a
//! reference it computes alone from everyone's inputs (64-bit arithmetic on small integers,
//! independent of the executor's kernels); out-of-place inputs must come back unchanged and
//! an AllToAllv's gaps between receive blocks untouched.
//!
//! Reported per backend: calls (each rank makes them all), failures (wrong results and
//! errors; an error ends the backend's run, as it poisons the communicator), and from the
//! start (after a warm-up of one call of each kind at the largest size) to the end (after the
//! last call), and halfway: resident memory (`VmRSS`, read after `malloc_trim` so that free
//! memory the allocator keeps does not count) and open file descriptors of each process. The
//! run fails (exit 1) on any failure, on resident memory growing by more than
//! `--max-rss-growth` MiB (default 32) in a process from the start to the end (the bound on
//! "unbounded": in a 10-minute soak on 2026-12-04 no process grew by more than 0.3 MiB; in
//! shorter runs the threads backend's process, which holds 4 ranks' heaps, grew by up to 9 MiB
//! while they settle) or on any process ending with more open descriptors than it started
//! with. `scripts/soak.sh MINUTES` builds and runs it; `--seed` replays a run's calls.

use clap::Parser;
use half::{bf16, f16};
use hccl::executor::{
    Buffers, CallCheck, Communicator, Config, DataType, Element, PlanSource, ProcessGroup,
    ReduceOp, ThreadGroup,
};
use hccl::ir::Collective;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Random collectives with checksums on every CPU backend, every result checked")]
struct Args {
    /// Total run time in minutes, shared equally by the backends.
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// Make exactly this many random calls per backend instead (after the warm-up).
    #[arg(long)]
    calls: Option<u64>,
    /// The generator's seed (printed; pass it again to replay the same calls).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Backends to soak, in order: threads, process, hosts.
    #[arg(long, value_delimiter = ',', default_value = "threads,process,hosts")]
    backends: Vec<String>,
    /// Ranks of each job (2 to 8; `hosts` puts half on each of its 2 hosts).
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Largest buffer of a call (`4M`, `512K`, …).
    #[arg(long, default_value = "4M")]
    max_bytes: String,
    /// Most resident memory (MiB) a process may gain from the start to the end.
    #[arg(long, default_value_t = 32)]
    max_rss_growth: u64,
    /// Internal: run as a rank process of this backend (its rank from `RANK`).
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Internal: a rank process's run time in seconds.
    #[arg(long, hide = true)]
    seconds: Option<f64>,
}

/// SplitMix64: the seeded generator every rank runs identically.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The kinds of call, AllToAllv included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    AllToAllV,
}

pub const KINDS: [Kind; 7] = [
    Kind::AllReduce,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::AllToAll,
    Kind::AllToAllV,
];

/// One call every rank makes.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub kind: Kind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: u32,
    pub in_place: bool,
    /// Elements of the whole buffer (blocked kinds: `block × ranks`); AllToAllv: the
    /// largest block.
    pub count: usize,
    /// Seed of the inputs (and of an AllToAllv's block sizes).
    pub seed: u64,
}

impl Call {
    /// A random call of `kind` (`None`: any kind) on `n` ranks, at most `max_bytes` bytes
    /// (exactly that size, in whole elements, when `largest`).
    pub fn random(
        rng: &mut Rng,
        kind: Option<Kind>,
        n: u32,
        max_bytes: u64,
        largest: bool,
    ) -> Call {
        let kind = kind.unwrap_or(KINDS[rng.below(KINDS.len() as u64) as usize]);
        let dtype = DataType::ALL[rng.below(DataType::ALL.len() as u64) as usize];
        let op = ReduceOp::ALL[rng.below(ReduceOp::ALL.len() as u64) as usize];
        let root = rng.below(u64::from(n)) as u32;
        let in_place = rng.below(2) == 1;
        let bytes = if largest {
            max_bytes
        } else if rng.below(32) == 0 {
            0
        } else {
            // Log-uniform from 1 byte to `max_bytes`.
            (max_bytes as f64).powf(rng.unit()).round() as u64
        };
        let elems = (bytes / dtype.size() as u64) as usize;
        let n = n as usize;
        let count = match kind {
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (elems / n) * n,
            Kind::AllToAllV => elems / n,
            _ => elems,
        };
        Call {
            kind,
            dtype,
            op,
            root,
            in_place,
            count,
            seed: rng.next_u64(),
        }
    }

    fn collective(&self) -> Collective {
        match self.kind {
            Kind::AllReduce => Collective::AllReduce,
            Kind::AllGather => Collective::AllGather,
            Kind::ReduceScatter => Collective::ReduceScatter,
            Kind::Broadcast => Collective::Broadcast { root: self.root },
            Kind::Reduce => Collective::Reduce { root: self.root },
            Kind::AllToAll | Kind::AllToAllV => Collective::AllToAll,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{:?} {} {} root {} {} count {} seed {:#x}",
            self.kind,
            self.dtype,
            self.op,
            self.root,
            if self.in_place {
                "in place"
            } else {
                "out of place"
            },
            self.count,
            self.seed
        )
    }
}

fn unsigned(d: DataType) -> bool {
    matches!(d, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Input element `i` of rank `rank`: a small integer that keeps every reduction of up to 8
/// ranks exact in every type (products of {1, 2, -1} stay within ±256, which `i8`/`u8` wrap
/// alike on both sides).
fn value(call: &Call, rank: u32, i: usize) -> i64 {
    let h =
        mix(call.seed ^ (u64::from(rank) << 48) ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let v = match call.op {
        ReduceOp::Prod => [1, 2, 1, -1][(h % 4) as usize],
        _ => (h % 7) as i64 - 3,
    };
    if unsigned(call.dtype) { v.abs() } else { v }
}

/// AllToAllv: elements rank `from` sends rank `to`.
fn v_count(call: &Call, from: u32, to: u32) -> usize {
    let h = mix(call.seed ^ 0xA11 ^ (u64::from(from) << 32) ^ u64::from(to));
    if call.count == 0 {
        0
    } else {
        (h % (call.count as u64 + 1)) as usize
    }
}

/// AllToAllv: elements left free before the block for `peer` (displacements with gaps).
fn v_gap(call: &Call, side: u64, rank: u32, peer: u32) -> usize {
    (mix(call.seed ^ side ^ (u64::from(rank) << 32) ^ u64::from(peer)) % 3) as usize
}

/// Displacements and total length of one side of an AllToAllv.
fn v_layout(call: &Call, side: u64, rank: u32, counts: &[usize]) -> (Vec<usize>, usize) {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at = 0;
    for (p, &c) in counts.iter().enumerate() {
        at += v_gap(call, side, rank, p as u32);
        displs.push(at);
        at += c;
    }
    (displs, at)
}

/// AllToAllv: element `j` of the block rank `from` sends rank `to`.
fn v_value(call: &Call, from: u32, to: u32, j: usize) -> i64 {
    value(call, from, to as usize * (1 << 28) + j)
}

/// The reference reduction of element `i` over every rank's input, as the exact value a
/// result of the call's type must compare equal to.
fn reduced(call: &Call, n: u32, i: usize) -> f64 {
    let vals = (0..n).map(|r| value(call, r, i));
    let float = matches!(
        call.dtype,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    );
    let v = match call.op {
        ReduceOp::Sum => vals.sum::<i64>(),
        ReduceOp::Prod => vals.product::<i64>(),
        ReduceOp::Min => vals.min().unwrap_or(0),
        ReduceOp::Max => vals.max().unwrap_or(0),
        ReduceOp::Avg => {
            let s: i64 = vals.sum();
            if float {
                // The sum is exact in every type; it is divided in the type (f16 and bf16
                // through f32, as their arithmetic is defined).
                return match call.dtype {
                    DataType::F64 => s as f64 / f64::from(n),
                    DataType::F32 => f64::from(s as f32 / n as f32),
                    DataType::F16 => f16::from_f32(s as f32 / n as f32).to_f64(),
                    _ => bf16::from_f32(s as f32 / n as f32).to_f64(),
                };
            }
            // Integer division truncates toward zero, as the executor's does.
            s / i64::from(n)
        }
    };
    typed_int(call.dtype, v)
}

/// `v` as the call's type stores it (integers wrap), back as `f64`.
fn typed_int(d: DataType, v: i64) -> f64 {
    match d {
        DataType::I8 => f64::from(v as i8),
        DataType::U8 => f64::from(v as u8),
        DataType::I32 => f64::from(v as i32),
        DataType::U32 => f64::from(v as u32),
        DataType::I64 => v as f64,
        DataType::U64 => (v as u64) as f64,
        DataType::F32 => f64::from(v as f32),
        DataType::F64 => v as f64,
        DataType::F16 => f16::from_f64(v as f64).to_f64(),
        DataType::BF16 => bf16::from_f64(v as f64).to_f64(),
    }
}

/// Filler for what a rank does not provide (not read, or to be overwritten).
const FILL: i64 = 77;

/// How a call ended on one rank.
pub enum Outcome {
    Ok,
    /// Wrong result: the rank and the communicator are fine, the soak goes on.
    Wrong(String),
    /// The call returned an error: the communicator is poisoned.
    Error(String),
}

/// Runs `call` on `comm` and checks everything this rank can see.
pub fn run_call(comm: &mut Communicator, call: &Call) -> Outcome {
    match call.dtype {
        DataType::F32 => run_typed::<f32>(comm, call),
        DataType::F64 => run_typed::<f64>(comm, call),
        DataType::F16 => run_typed::<f16>(comm, call),
        DataType::BF16 => run_typed::<bf16>(comm, call),
        DataType::I8 => run_typed::<i8>(comm, call),
        DataType::U8 => run_typed::<u8>(comm, call),
        DataType::I32 => run_typed::<i32>(comm, call),
        DataType::U32 => run_typed::<u32>(comm, call),
        DataType::I64 => run_typed::<i64>(comm, call),
        DataType::U64 => run_typed::<u64>(comm, call),
    }
}

/// The first index where `got` differs from `want(i)`, described.
fn first_difference<T: Element>(
    got: &[T],
    want: impl Fn(usize) -> f64,
    what: &str,
) -> Option<String> {
    got.iter().enumerate().find_map(|(i, g)| {
        let w = want(i);
        (g.to_f64().to_bits() != w.to_bits()).then(|| {
            format!(
                "{what}: element {i} of {} is {}, want {w}",
                got.len(),
                g.to_f64()
            )
        })
    })
}

fn run_typed<T: Element>(comm: &mut Communicator, call: &Call) -> Outcome {
    let n = comm.world_size();
    let r = comm.rank();
    let ru = r as usize;
    if call.kind == Kind::AllToAllV {
        return run_v::<T>(comm, call);
    }
    let t = |v: i64| T::from_i64(v);
    let c = call.count;
    let block = c / n as usize;
    // This rank's input (in place: the buffer's initial contents).
    let (input, out_len): (Vec<T>, usize) = match call.kind {
        Kind::AllGather if call.in_place => (
            (0..c)
                .map(|i| {
                    if i / block.max(1) == ru {
                        t(value(call, r, i - ru * block))
                    } else {
                        t(FILL)
                    }
                })
                .collect(),
            c,
        ),
        Kind::AllGather => ((0..block).map(|i| t(value(call, r, i))).collect(), c),
        Kind::ReduceScatter => (
            (0..c).map(|i| t(value(call, r, i))).collect(),
            if call.in_place { c } else { block },
        ),
        Kind::Broadcast if call.in_place && r != call.root => (vec![t(FILL); c], c),
        _ => ((0..c).map(|i| t(value(call, r, i))).collect(), c),
    };
    let mut buf = input;
    let mut out = if call.in_place {
        Vec::new()
    } else {
        vec![t(FILL); out_len]
    };
    let res = if call.in_place {
        comm.run(call.collective(), call.op, Buffers::InPlace(&mut buf))
    } else {
        comm.run(
            call.collective(),
            call.op,
            Buffers::OutOfPlace {
                input: &buf,
                output: &mut out,
            },
        )
    };
    if let Err(e) = res {
        return Outcome::Error(e.to_string());
    }
    let got: &[T] = if call.in_place { &buf } else { &out };
    let wrong = match call.kind {
        Kind::AllReduce => first_difference(got, |i| reduced(call, n, i), "result"),
        Kind::Reduce if r == call.root => first_difference(got, |i| reduced(call, n, i), "result"),
        Kind::Reduce => None,
        Kind::Broadcast => first_difference(
            got,
            |i| typed_int(call.dtype, value(call, call.root, i)),
            "result",
        ),
        Kind::AllGather => first_difference(
            got,
            |i| typed_int(call.dtype, value(call, (i / block) as u32, i % block)),
            "result",
        ),
        Kind::ReduceScatter => {
            let mine = if call.in_place {
                &got[ru * block..(ru + 1) * block]
            } else {
                got
            };
            first_difference(
                mine,
                |j| reduced(call, n, ru * block + j),
                "this rank's block",
            )
        }
        Kind::AllToAll => first_difference(
            got,
            |i| {
                typed_int(
                    call.dtype,
                    value(call, (i / block) as u32, ru * block + i % block),
                )
            },
            "result",
        ),
        Kind::AllToAllV => None,
    };
    let wrong = wrong.or_else(|| {
        // An out-of-place call leaves its input as it was.
        if call.in_place {
            return None;
        }
        let kept = |i: usize| typed_int(call.dtype, value(call, r, i));
        first_difference(&buf, kept, "the input (out of place)")
    });
    match wrong {
        Some(w) => Outcome::Wrong(w),
        None => Outcome::Ok,
    }
}

fn run_v<T: Element>(comm: &mut Communicator, call: &Call) -> Outcome {
    let n = comm.world_size();
    let r = comm.rank();
    let send_counts: Vec<usize> = (0..n).map(|p| v_count(call, r, p)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|p| v_count(call, p, r)).collect();
    let (send_displs, send_len) = v_layout(call, 1, r, &send_counts);
    let (recv_displs, recv_len) = v_layout(call, 2, r, &recv_counts);
    let mut input = vec![T::from_i64(FILL); send_len];
    for p in 0..n {
        let d = send_displs[p as usize];
        for j in 0..send_counts[p as usize] {
            input[d + j] = T::from_i64(v_value(call, r, p, j));
        }
    }
    let mut output = vec![T::from_i64(FILL); recv_len];
    if let Err(e) = comm.all_to_all_v(
        &input,
        &send_counts,
        &send_displs,
        &mut output,
        &recv_counts,
        &recv_displs,
    ) {
        return Outcome::Error(e.to_string());
    }
    // Every received block, and the gaps between them untouched (blocks lie in rank order).
    let fill = typed_int(call.dtype, FILL);
    let mut at = 0;
    for p in 0..n {
        let (d, c) = (recv_displs[p as usize], recv_counts[p as usize]);
        let gap = first_difference(
            &output[at..d],
            |_| fill,
            &format!("the gap before rank {p}'s block"),
        );
        let block = first_difference(
            &output[d..d + c],
            |j| typed_int(call.dtype, v_value(call, p, r, j)),
            &format!("the block from rank {p}"),
        );
        if let Some(w) = gap.or(block) {
            return Outcome::Wrong(w);
        }
        at = d + c;
    }
    match first_difference(&output[at..], |_| fill, "the end after the last block") {
        Some(w) => Outcome::Wrong(w),
        None => Outcome::Ok,
    }
}

/// Resident memory (KiB) and open file descriptors of this process. Memory the allocator
/// holds free is returned to the system first (`malloc_trim`), so that what is left is what
/// the process uses, not how fragmented its heaps are.
fn usage() -> (u64, u64) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    (rss, fds)
}

/// What one rank saw.
#[derive(Debug, Clone, Default)]
pub struct RankReport {
    pub rank: u32,
    pub calls: u64,
    pub failures: u64,
    /// The first few failures, described.
    pub first: Vec<String>,
    pub rss_start_kib: u64,
    /// Halfway through the random calls (by this rank's clock, or by count).
    pub rss_mid_kib: u64,
    pub rss_end_kib: u64,
    pub fds_start: u64,
    pub fds_end: u64,
}

impl RankReport {
    fn to_json(&self) -> Value {
        json!({
            "rank": self.rank,
            "calls": self.calls,
            "failures": self.failures,
            "first_failures": self.first,
            "rss_start_kib": self.rss_start_kib,
            "rss_mid_kib": self.rss_mid_kib,
            "rss_end_kib": self.rss_end_kib,
            "fds_start": self.fds_start,
            "fds_end": self.fds_end,
        })
    }

    fn from_json(v: &Value) -> Option<RankReport> {
        let u = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(RankReport {
            rank: u32::try_from(u("rank")?).ok()?,
            calls: u("calls")?,
            failures: u("failures")?,
            first: v
                .get("first_failures")?
                .as_array()?
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect(),
            rss_start_kib: u("rss_start_kib")?,
            rss_mid_kib: u("rss_mid_kib")?,
            rss_end_kib: u("rss_end_kib")?,
            fds_start: u("fds_start")?,
            fds_end: u("fds_end")?,
        })
    }
}

/// How long a rank soaks: rank 0's clock decides (it tells the others with every
/// 8th call's control broadcast), or a fixed number of random calls.
#[derive(Debug, Clone, Copy)]
pub enum Length {
    Time(Duration),
    Calls(u64),
}

/// Failures described per rank, at most this many.
const KEEP: usize = 5;

/// The soak loop of one rank: the warm-up (one call of each kind at `max_bytes`), then
/// random calls until `length` is reached. `sample`: whether this rank measures its
/// process (every process rank does; of a thread group only rank 0).
pub fn soak_rank(
    comm: &mut Communicator,
    seed: u64,
    length: Length,
    max_bytes: u64,
    sample: bool,
) -> RankReport {
    let n = comm.world_size();
    let mut rep = RankReport {
        rank: comm.rank(),
        ..RankReport::default()
    };
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    fn note(rep: &mut RankReport, call: &Call, what: &str) {
        rep.failures += 1;
        if rep.first.len() < KEEP {
            let idx = rep.calls - 1;
            rep.first.push(format!(
                "call {idx} ({}) on rank {}: {what}",
                call.describe(),
                rep.rank
            ));
        }
    }
    let mut poisoned = false;
    for kind in KINDS {
        let call = Call::random(&mut rng, Some(kind), n, max_bytes, true);
        rep.calls += 1;
        match run_call(comm, &call) {
            Outcome::Ok => {}
            Outcome::Wrong(w) => note(&mut rep, &call, &w),
            Outcome::Error(e) => {
                note(&mut rep, &call, &e);
                poisoned = true;
                break;
            }
        }
    }
    if sample {
        (rep.rss_start_kib, rep.fds_start) = usage();
    }
    let mut random = 0u64;
    let mut mid_taken = false;
    let (random_start, warm_up) = (Instant::now(), start.elapsed());
    while !poisoned {
        let past_half = match length {
            Length::Calls(c) => random >= c / 2,
            Length::Time(d) => random_start.elapsed() >= d.saturating_sub(warm_up) / 2,
        };
        if sample && past_half && !mid_taken {
            rep.rss_mid_kib = usage().0;
            mid_taken = true;
        }
        let go = match length {
            Length::Calls(c) => random < c,
            Length::Time(d) => {
                if random.is_multiple_of(8) {
                    let mut flag = [u8::from(start.elapsed() < d)];
                    if let Err(e) = comm.broadcast_in_place(&mut flag, 0) {
                        rep.failures += 1;
                        if rep.first.len() < KEEP {
                            rep.first
                                .push(format!("control broadcast after call {}: {e}", rep.calls));
                        }
                        break;
                    }
                    flag[0] == 1
                } else {
                    true
                }
            }
        };
        if !go {
            break;
        }
        let call = Call::random(&mut rng, None, n, max_bytes, false);
        rep.calls += 1;
        random += 1;
        match run_call(comm, &call) {
            Outcome::Ok => {}
            Outcome::Wrong(w) => note(&mut rep, &call, &w),
            Outcome::Error(e) => {
                note(&mut rep, &call, &e);
                poisoned = true;
            }
        }
    }
    if sample {
        (rep.rss_end_kib, rep.fds_end) = usage();
    }
    rep
}

/// A backend's run, as reported.
#[derive(Debug, Clone)]
pub struct BackendReport {
    pub backend: String,
    /// Calls of the job (every rank made them).
    pub calls: u64,
    /// Failures over all ranks, and launch problems (a rank that crashed or hung, ranks
    /// that disagree on the number of calls).
    pub failures: u64,
    pub first: Vec<String>,
    /// Per process: (resident KiB at start, at end, descriptors at start, at end).
    pub processes: Vec<RankReport>,
    pub seconds: f64,
}

impl BackendReport {
    fn rss_growth_kib(&self) -> i64 {
        self.processes
            .iter()
            .map(|p| p.rss_end_kib as i64 - p.rss_start_kib as i64)
            .max()
            .unwrap_or(0)
    }
    fn fd_growth(&self) -> i64 {
        self.processes
            .iter()
            .map(|p| p.fds_end as i64 - p.fds_start as i64)
            .max()
            .unwrap_or(0)
    }
}

/// The seed of one backend's calls (each backend its own sequence).
fn backend_seed(seed: u64, backend: &str) -> u64 {
    let k = match backend {
        "threads" => 1,
        "process" => 2,
        _ => 3,
    };
    mix(seed ^ k)
}

fn config() -> Config {
    Config::default()
        .with_checksum(true)
        .with_check_calls(CallCheck::EveryCall)
        .with_timeout(Duration::from_secs(60))
}

pub fn soak_threads(seed: u64, n: u32, length: Length, max_bytes: u64) -> BackendReport {
    let started = Instant::now();
    let mut rep = BackendReport {
        backend: "threads".into(),
        calls: 0,
        failures: 0,
        first: Vec::new(),
        processes: Vec::new(),
        seconds: 0.0,
    };
    let comms = PlanSource::Builtin
        .load(n)
        .and_then(|plan| ThreadGroup::with_config(plan, n, config()));
    let comms = match comms {
        Ok(c) => c,
        Err(e) => {
            rep.failures = 1;
            rep.first.push(format!("starting {n} thread ranks: {e}"));
            return rep;
        }
    };
    let seed = backend_seed(seed, "threads");
    let ranks: Vec<RankReport> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let sample = comm.rank() == 0;
                    let r = soak_rank(&mut comm, seed, length, max_bytes, sample);
                    if r.failures > 0 {
                        comm.abort();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| RankReport {
                    rank: r as u32,
                    failures: 1,
                    first: vec![format!("rank {r}'s thread panicked")],
                    ..RankReport::default()
                })
            })
            .collect()
    });
    rep.seconds = started.elapsed().as_secs_f64();
    rep.absorb(&ranks);
    rep.processes = ranks.into_iter().filter(|r| r.rank == 0).collect();
    rep
}

impl BackendReport {
    /// Calls, failures and their descriptions from every rank's report.
    fn absorb(&mut self, ranks: &[RankReport]) {
        self.calls = ranks.iter().map(|r| r.calls).max().unwrap_or(0);
        self.failures += ranks.iter().map(|r| r.failures).sum::<u64>();
        for r in ranks {
            self.first.extend(r.first.iter().cloned());
        }
        if let Some(r) = ranks
            .iter()
            .find(|r| r.calls != self.calls && r.failures == 0)
        {
            self.failures += 1;
            self.first.push(format!(
                "rank {} made {} calls but another rank made {}",
                r.rank, r.calls, self.calls
            ));
        }
        self.first.truncate(3 * KEEP);
    }
}

/// The marker of a rank process's report line.
const REPORT: &str = "SOAK-RANK ";

fn soak_processes(
    backend: &str,
    seed: u64,
    n: u32,
    length: Length,
    max_bytes: u64,
    secs: f64,
) -> BackendReport {
    let started = Instant::now();
    let mut rep = BackendReport {
        backend: backend.into(),
        calls: 0,
        failures: 0,
        first: Vec::new(),
        processes: Vec::new(),
        seconds: 0.0,
    };
    let fail = |rep: &mut BackendReport, what: String| {
        rep.failures += 1;
        rep.first.push(what);
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            fail(&mut rep, format!("finding this program: {e}"));
            return rep;
        }
    };
    let port = match hccl::executor::process::local_rendezvous_port() {
        Ok(p) => p,
        Err(e) => {
            fail(&mut rep, format!("finding a rendezvous port: {e}"));
            return rep;
        }
    };
    let token = format!("soak-{:016x}", mix(seed ^ u64::from(port)));
    let mut children = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--child",
            backend,
            "--seed",
            &backend_seed(seed, backend).to_string(),
        ])
        .args(["--max-bytes", &max_bytes.to_string()])
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("HCCL_JOB_TOKEN", &token)
        .env("HCCL_CHECKSUM", "1")
        .env("HCCL_CHECK_CALLS", "1")
        .env("HCCL_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        match length {
            Length::Calls(c) => cmd.args(["--calls", &c.to_string()]),
            Length::Time(_) => cmd.args(["--seconds", &secs.to_string()]),
        };
        if backend == "hosts" {
            // Two emulated hosts on loopback: the first half of the ranks on one.
            cmd.env("HCCL_HOST_ID", format!("soak-h{}", r / n.div_ceil(2)));
        } else {
            cmd.env_remove("HCCL_HOST_ID");
        }
        match cmd.spawn() {
            Ok(c) => children.push((r, c)),
            Err(e) => {
                fail(&mut rep, format!("starting rank {r}: {e}"));
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return rep;
            }
        }
    }
    // Each rank's report line, read on a thread per rank; a rank that outlives its time by
    // far is killed.
    let limit = Duration::from_secs_f64(secs + 120.0);
    let mut ranks = Vec::new();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|(r, c)| {
            let out = c.stdout.take();
            let r = *r;
            std::thread::spawn(move || {
                let mut report = None;
                if let Some(out) = out {
                    for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                        if let Some(j) = line.find(REPORT).map(|i| &line[i + REPORT.len()..]) {
                            report = serde_json::from_str::<Value>(j)
                                .ok()
                                .as_ref()
                                .and_then(RankReport::from_json);
                        }
                    }
                }
                (r, report)
            })
        })
        .collect();
    for (r, c) in &mut children {
        let status = loop {
            match c.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if started.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
            }
        };
        match status {
            Some(s) if s.success() => {}
            Some(s) => fail(&mut rep, format!("rank {r} exited with {s}")),
            None => fail(
                &mut rep,
                format!("rank {r} ran past {limit:?} and was killed"),
            ),
        }
    }
    for h in readers {
        match h.join() {
            Ok((_, Some(report))) => ranks.push(report),
            Ok((r, None)) => fail(&mut rep, format!("rank {r} printed no report")),
            Err(_) => fail(&mut rep, "a reader thread panicked".into()),
        }
    }
    rep.seconds = started.elapsed().as_secs_f64();
    rep.absorb(&ranks);
    rep.processes = ranks;
    rep
}

/// A rank process: joins the job from the launcher's variables, soaks, prints its report.
fn child(args: &Args, max_bytes: u64) -> ExitCode {
    let length = match (args.calls, args.seconds) {
        (Some(c), _) => Length::Calls(c),
        (None, s) => Length::Time(Duration::from_secs_f64(s.unwrap_or(10.0))),
    };
    let seed = args.seed.unwrap_or(0);
    let rank = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let rep = match ProcessGroup::init(PlanSource::Builtin) {
        Ok(mut comm) => {
            let rep = soak_rank(&mut comm, seed, length, max_bytes, true);
            if rep.failures > 0 {
                comm.abort();
            }
            rep
        }
        Err(e) => RankReport {
            rank,
            failures: 1,
            first: vec![format!("rank {rank} could not join: {e}")],
            ..RankReport::default()
        },
    };
    println!("{REPORT}{}", rep.to_json());
    ExitCode::SUCCESS
}

fn mib(kib: i64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(max_bytes) = hccl::ir::units::parse_bytes(&args.max_bytes) else {
        eprintln!(
            "soak: --max-bytes {}: expected a size such as 4M",
            args.max_bytes
        );
        return ExitCode::from(2);
    };
    if !(2..=8).contains(&args.ranks) {
        eprintln!("soak: --ranks {}: expected 2 to 8", args.ranks);
        return ExitCode::from(2);
    }
    if args.child.is_some() {
        return child(&args, max_bytes);
    }
    if let Some(b) = args
        .backends
        .iter()
        .find(|b| !["threads", "process", "hosts"].contains(&b.as_str()))
    {
        eprintln!("soak: unknown backend {b}: expected threads, process or hosts");
        return ExitCode::from(2);
    }
    if !(args.minutes.is_finite() && args.minutes > 0.0) {
        eprintln!(
            "soak: --minutes {}: expected a positive number",
            args.minutes
        );
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        mix(t ^ u64::from(std::process::id()))
    });
    let secs = args.minutes * 60.0 / args.backends.len().max(1) as f64;
    let length = match args.calls {
        Some(c) => Length::Calls(c),
        None => Length::Time(Duration::from_secs_f64(secs)),
    };
    let n = args.ranks;
    eprintln!(
        "soak: seed {seed} ({}), {n} ranks, calls up to {max_bytes} bytes, HCCL_CHECKSUM=1 HCCL_CHECK_CALLS=1; replay with --seed {seed}",
        match length {
            Length::Time(_) => format!("{secs:.0} s per backend"),
            Length::Calls(c) => format!("{c} random calls per backend"),
        }
    );
    let limit_kib = args.max_rss_growth as i64 * 1024;
    let mut reports = Vec::new();
    for b in &args.backends {
        let rep = match b.as_str() {
            "threads" => soak_threads(seed, n, length, max_bytes),
            other => soak_processes(other, seed, n, length, max_bytes, secs),
        };
        let worst = rep
            .processes
            .iter()
            .max_by_key(|p| p.rss_end_kib as i64 - p.rss_start_kib as i64);
        eprintln!(
            "soak: {:<8} {:>7} calls  {:>3} failures  rss growth {:>6} MiB (start, mid, end {})  fds {}  ({:.0} s)",
            rep.backend,
            rep.calls,
            rep.failures,
            mib(rep.rss_growth_kib()),
            worst.map_or_else(String::new, |p| format!(
                "{}, {}, {} MiB",
                mib(p.rss_start_kib as i64),
                mib(p.rss_mid_kib as i64),
                mib(p.rss_end_kib as i64)
            )),
            rep.processes
                .iter()
                .map(|p| format!("{}→{}", p.fds_start, p.fds_end))
                .collect::<Vec<_>>()
                .join(" "),
            rep.seconds
        );
        for f in &rep.first {
            eprintln!("soak:   {f}");
        }
        reports.push(rep);
    }
    let mut problems = Vec::new();
    for r in &reports {
        if r.failures > 0 {
            problems.push(format!("{}: {} failures", r.backend, r.failures));
        }
        if r.rss_growth_kib() > limit_kib {
            problems.push(format!(
                "{}: resident memory grew by {} MiB, over the {} MiB allowed",
                r.backend,
                mib(r.rss_growth_kib()),
                args.max_rss_growth
            ));
        }
        if r.fd_growth() > 0 {
            problems.push(format!(
                "{}: {} more open file descriptors at the end",
                r.backend,
                r.fd_growth()
            ));
        }
    }
    if args.json {
        let backends: Vec<Value> = reports
            .iter()
            .map(|r| {
                json!({
                    "backend": r.backend,
                    "calls": r.calls,
                    "failures": r.failures,
                    "first_failures": r.first,
                    "seconds": r.seconds,
                    "rss_growth_kib": r.rss_growth_kib(),
                    "fd_growth": r.fd_growth(),
                    "processes": r.processes.iter().map(RankReport::to_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "seed": seed,
                "ranks": n,
                "max_bytes": max_bytes,
                "max_rss_growth_kib": limit_kib,
                "backends": backends,
                "problems": problems,
                "ok": problems.is_empty(),
            })
        );
    }
    if problems.is_empty() {
        eprintln!("soak: OK");
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("soak: FAILED: {p}");
        }
        ExitCode::from(1)
    }
}
