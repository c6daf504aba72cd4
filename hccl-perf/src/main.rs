//! `hccl-perf`: an nccl-tests-style benchmark of the executor.
//!
//! ```text
//! hccl-perf -b 8 -e 256M -f 4 -g 8 -c allreduce -d float -o sum --backend threads|process
//!           [--plan PLAN|ALGO.xml] [-n ITERS] [-w WARMUP] [-T SECONDS] [--check] [--json]
//!           [--no-bind] [--counts uniform|skewed|equal] [--seed N] [--hosts K] [--trace FILE.json]
//!           [--plot FILE.svg]
//! ```
//!
//! With `-T` the iteration count is calibrated as `mpi_coll_bench` does it: rounds of
//! growing length until one fills a tenth of the budget. When ranks do not outnumber the
//! cores, rank `r` is bound to the `r`-th core (as `mpirun` binds up to two ranks), unless
//! `--no-bind` is given.
//!
//! Sizes follow nccl-tests: AllReduce, Broadcast, Reduce: the buffer; AllGather: the whole
//! output; ReduceScatter: the whole input; AllToAll: what one rank sends; AllToAllv
//! (`-c alltoallv`): what a rank sends on average (the counts of all ranks summed, over the
//! ranks), its blocks drawn by `--counts` (see [`Counts`]). Each row shows the
//! measured time (mean over ranks of each rank's average per call), algbw, busbw, the number
//! of wrong elements (with `--check`) and the plan's predicted time, so the cost model's error
//! on this machine is visible.
//!
//! At the end the ranks finalize their communicator, which sums who waited for whom over the
//! run (`Communicator::straggler_report`): `--json` carries it as `stragglers`, and the text
//! output gets a `# Straggler` line when one rank dominates the waiting.
//!
//! Without `--plan` a plan is compiled for this machine: a `host` topology whose per-rank
//! bandwidth comes from a memory-copy probe. With `--backend process`, `-g N` starts N rank
//! processes; under a launcher (`mpirun`, torchrun, srun) the rank and world size come from
//! the environment instead and every process is one rank. A setting that would be ignored is
//! refused (exit 2): `--hosts K` without `--backend process` or under a launcher, and
//! `--calibrate` under a launcher (it starts ranks of its own). The predictions say which
//! calibration they use (`# calibration:`, `calibration` in `--json`).
//!
//! Exit codes: 0 ok; 1 wrong results or a runtime failure; 2 bad usage or input.

mod calibrate;

use clap::{Parser, ValueEnum};
use half::{bf16, f16};
use hccl::compiler::search;
use hccl::executor::{
    Bootstrap, Buffers, Communicator, Config, DataType, Element, ExecError, ProcessGroup, ReduceOp,
    StragglerReport, ThreadGroup,
};
use hccl::ir::{Collective, CollectiveKind, PlanFile, Protocol};
use hccl::topologies::Topology;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// How AllToAllv's block sizes are drawn (`per`: the size over the ranks, in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Counts {
    /// Rank `s`'s block for rank `d`: empty one time in eight, else uniform in
    /// `[0, 16·per/7]` (hashed from the seed, `s` and `d`).
    Uniform,
    /// Every rank sends rank 0 `n` shares, the last rank (of 3 or more) none, the others
    /// one share each, the shares summing to `n·per`.
    Skewed,
    /// Every block `per` elements: the AllToAll of the same size, through AllToAllv.
    Equal,
}

fn mix(mut h: u64) -> u64 {
    h ^= h >> 31;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// `m[s][d]`: the elements rank `s` sends rank `d`.
fn count_matrix(counts: Counts, seed: u64, n: u32, per: usize) -> Vec<Vec<usize>> {
    let n = n as usize;
    (0..n)
        .map(|s| {
            (0..n)
                .map(|d| match counts {
                    Counts::Uniform => {
                        let h = mix(seed ^ mix(((s as u64) << 32) | d as u64));
                        if h.is_multiple_of(8) {
                            0
                        } else {
                            let hi = (16 * per as u64).div_ceil(7);
                            ((h >> 3) % (hi + 1)) as usize
                        }
                    }
                    Counts::Equal => per,
                    Counts::Skewed => {
                        let weight = |d: usize| match d {
                            0 => n,
                            _ if d == n - 1 && n > 2 => 0,
                            _ => 1,
                        };
                        let total: usize = (0..n).map(weight).sum();
                        per * n * weight(d) / total.max(1)
                    }
                })
                .collect()
        })
        .collect()
}

/// AllToAllv test data: rank `s`'s element `i` of its block for rank `d`, from 1 to 100
/// (exact in every type), so a block landing at the wrong place or shifted is caught.
fn vvalue<T: Element>(s: usize, d: usize, i: usize) -> T {
    T::from_i64(1 + (mix(((s as u64) << 48) ^ ((d as u64) << 32) ^ i as u64) % 100) as i64)
}

/// One rank's AllToAllv buffers: counts and packed displacements on both sides.
struct VBuffers<T> {
    input: Vec<T>,
    output: Vec<T>,
    send: Vec<usize>,
    sdispl: Vec<usize>,
    recv: Vec<usize>,
    rdispl: Vec<usize>,
}

fn packed(counts: &[usize]) -> (Vec<usize>, usize) {
    let mut at = 0;
    let displs = counts
        .iter()
        .map(|&c| {
            at += c;
            at - c
        })
        .collect();
    (displs, at)
}

impl<T: Element> VBuffers<T> {
    fn new(m: &[Vec<usize>], rank: u32) -> VBuffers<T> {
        let r = rank as usize;
        let send = m[r].clone();
        let recv: Vec<usize> = m.iter().map(|row| row[r]).collect();
        let (sdispl, slen) = packed(&send);
        let (rdispl, rlen) = packed(&recv);
        let mut input = Vec::with_capacity(slen);
        for (d, &c) in send.iter().enumerate() {
            input.extend((0..c).map(|i| vvalue::<T>(r, d, i)));
        }
        VBuffers {
            input,
            output: vec![T::default(); rlen],
            send,
            sdispl,
            recv,
            rdispl,
        }
    }

    fn call(&mut self, comm: &mut Communicator) -> Result<(), ExecError> {
        comm.all_to_all_v(
            &self.input,
            &self.send,
            &self.sdispl,
            &mut self.output,
            &self.recv,
            &self.rdispl,
        )
    }

    fn count_wrong(&self, rank: u32) -> u64 {
        let mut wrong = 0;
        for (s, &c) in self.recv.iter().enumerate() {
            for i in 0..c {
                let want = vvalue::<T>(s, rank as usize, i);
                if self.output[self.rdispl[s] + i].to_f64().to_bits() != want.to_f64().to_bits() {
                    wrong += 1;
                }
            }
        }
        wrong
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// All ranks as threads of this process.
    Threads,
    /// Ranks as processes on this host (shared memory, TCP rendezvous).
    Process,
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "hccl-perf",
    version,
    about = "nccl-tests-style benchmark of hccl's executor (threads or processes)"
)]
struct Args {
    /// Smallest size (bytes; K, M, G are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    max_bytes: u64,
    /// Multiplicative step between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: u64,
    /// Ranks (threads, or processes started by hccl-perf).
    #[arg(short = 'g', long = "ranks", default_value_t = 2)]
    ranks: u32,
    /// Collective: allreduce, allgather, reducescatter, broadcast, reduce, alltoall,
    /// alltoallv.
    #[arg(short = 'c', long = "collective", default_value = "allreduce")]
    collective: String,
    /// AllToAllv's block sizes: uniform (random, about one block in eight empty, a rank's
    /// blocks summing to the size on average), skewed (rank 0 receives n times as much as
    /// an ordinary rank, the last of 3 or more ranks nothing) or equal (AllToAll's blocks).
    #[arg(long, value_enum, default_value = "uniform")]
    counts: Counts,
    /// Seed of `--counts uniform`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Data type (nccl-tests names: float, half, bfloat16, double, int8, uint8, int32, uint32,
    /// int64, uint64).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: u32,
    /// Backend.
    #[arg(long, value_enum, default_value = "threads")]
    backend: Backend,
    /// Plan file (RON) or MSCCL algorithm (XML); default: compiled for this machine.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Compile the default plan from this algorithm family only (a family name of `hcclc
    /// compile --algo`: ring, tree, hybrid_cube, mesh, oneshot, ...). Without `--plan`,
    /// `HCCL_ALGO` does the same; the `algorithm` column always shows what ran.
    #[arg(long)]
    algo: Option<String>,
    /// Compile the default plan with these protocols only (comma-separated: LL, LL128,
    /// Simple; a CPU host runs LL and Simple). Without `--plan`, `HCCL_PROTO` does the same.
    #[arg(long, value_name = "LIST")]
    proto: Option<String>,
    /// Compile the default plan for this topology file (e.g. one written by `--calibrate`)
    /// instead of this machine as probed.
    #[arg(long, value_name = "TOPO.ron")]
    topo: Option<PathBuf>,
    /// Measure every algorithm family that applies (at the sizes of -b/-e/-f, with this
    /// backend and rank count), fit the cost model to the measurements and write the
    /// calibrated topology (this machine as a `host`, or `--topo`) to this file.
    #[arg(long, value_name = "OUT.ron")]
    calibrate: Option<PathBuf>,
    /// With `--calibrate`: measure every family this many times (in turn, each time in a
    /// different order) and fit the fastest time per size.
    #[arg(long, default_value_t = 4, value_name = "N")]
    reps: u32,
    /// Timed iterations per size (ignored when -T is given).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: u64,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup", default_value_t = 5)]
    warmup: u64,
    /// Time budget per size in seconds: the iteration count is calibrated to fill it.
    #[arg(short = 'T', long = "target")]
    target: Option<f64>,
    /// Run in place (one buffer) instead of out of place.
    #[arg(long)]
    in_place: bool,
    /// Check every result against a sequential reference.
    #[arg(long)]
    check: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the sweep as an SVG chart: measured bus bandwidth against size, beside the
    /// plan's prediction (the `pred(us)` column as bandwidth).
    #[arg(long, value_name = "FILE.svg", conflicts_with = "calibrate")]
    plot: Option<PathBuf>,
    /// Leave ranks unbound. By default, when ranks do not outnumber the cores, rank `r` is
    /// bound to the `r`-th core (as `mpirun` binds to cores for up to two ranks).
    #[arg(long)]
    no_bind: bool,
    /// With `--backend process`: split the ranks into this many emulated hosts on this
    /// machine (each its own `HCCL_HOST_ID`, blocks of consecutive ranks), so that ranks on
    /// different "hosts" talk over TCP on loopback instead of shared memory.
    #[arg(long, default_value_t = 1)]
    hosts: u32,
    /// Record a measured timeline of every rank's calls (the first `HCCL_TRACE_CALLS`, 64
    /// by default: warm-up calls and the ranks' synchronising AllReduces included) and write
    /// it to this file in the Chrome trace-event format (Perfetto, chrome://tracing), the
    /// layout of `hcclc explain --trace`. The ranks write into a temporary directory
    /// (`HCCL_TRACE`), merged into the file at the end.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
}

fn parse_size(text: &str) -> Result<u64, String> {
    hccl::ir::units::parse_bytes(text).ok_or_else(|| format!("bad size `{text}` (e.g. 8, 64K, 1M)"))
}

/// A failure, with the exit code it maps to.
#[derive(Debug)]
enum Failure {
    Usage(String),
    Runtime(String),
}

impl From<ExecError> for Failure {
    fn from(err: ExecError) -> Failure {
        match err {
            // Bad configuration (an `HCCL_*` variable, a rank or root out of range): the
            // user's input, exit 2.
            ExecError::Invalid(message) => Failure::Usage(message),
            e @ ExecError::Env { .. } => Failure::Usage(e.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

/// What one call looks like for a given nominal size.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Bytes in the nccl-tests sense (after rounding to whole elements).
    bytes: u64,
    /// Elements of the input and output buffers (in-place: the one buffer is the larger).
    in_len: usize,
    out_len: usize,
    /// The count nccl-tests prints.
    count: usize,
}

fn shape(kind: CollectiveKind, nominal: u64, elem: usize, n: u32) -> Shape {
    let n = n as usize;
    let total = (nominal as usize / elem).max(1);
    match kind {
        CollectiveKind::AllReduce | CollectiveKind::Broadcast | CollectiveKind::Reduce => Shape {
            bytes: (total * elem) as u64,
            in_len: total,
            out_len: total,
            count: total,
        },
        CollectiveKind::AllGather => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per,
                out_len: per * n,
                count: per * n,
            }
        }
        CollectiveKind::ReduceScatter => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per * n,
                out_len: per,
                count: per * n,
            }
        }
        CollectiveKind::AllToAll => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per * n,
                out_len: per * n,
                count: per * n,
            }
        }
    }
}

/// Test data: small integers, so every reduction order gives the same exact result.
fn value<T: Element>(op: ReduceOp, rank: u32, index: usize) -> T {
    let mix = (rank as usize)
        .wrapping_mul(7)
        .wrapping_add(index.wrapping_mul(3));
    match op {
        ReduceOp::Prod => T::from_i64(1 + i64::from(mix.is_multiple_of(4))),
        _ => T::from_i64((mix % 5) as i64 + 1),
    }
}

fn fold<T: Element>(op: ReduceOp, n: u32, mut item: impl FnMut(u32) -> T) -> T {
    let mut acc = item(0);
    for r in 1..n {
        let x = item(r);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => T::add(acc, x),
            ReduceOp::Prod => T::mul(acc, x),
            ReduceOp::Min => {
                if x < acc {
                    x
                } else {
                    acc
                }
            }
            ReduceOp::Max => {
                if x > acc {
                    x
                } else {
                    acc
                }
            }
        };
    }
    if op == ReduceOp::Avg {
        acc.div_count(n)
    } else {
        acc
    }
}

/// What rank `rank`'s output element `i` must hold; `None` where nothing is promised.
fn expected<T: Element>(
    coll: Collective,
    op: ReduceOp,
    n: u32,
    rank: u32,
    per: usize,
    i: usize,
) -> Option<T> {
    Some(match coll {
        Collective::AllReduce => fold(op, n, |r| value(op, r, i)),
        Collective::Reduce { root } => {
            if rank != root {
                return None;
            }
            fold(op, n, |r| value(op, r, i))
        }
        Collective::Broadcast { root } => value(op, root, i),
        Collective::AllGather => value(op, (i / per) as u32, i % per),
        Collective::ReduceScatter => fold(op, n, |r| value(op, r, rank as usize * per + i)),
        Collective::AllToAll => value(op, (i / per) as u32, rank as usize * per + i % per),
    })
}

/// One rank's buffers for one size, filled with test data.
struct RankBuffers<T> {
    input: Vec<T>,
    output: Vec<T>,
}

fn fill<T: Element>(
    buffers: &mut RankBuffers<T>,
    coll: Collective,
    op: ReduceOp,
    rank: u32,
    s: &Shape,
    in_place: bool,
) {
    let n_in = s.in_len;
    if in_place {
        // One buffer of the larger extent; the input sits where NCCL puts it.
        let len = s.in_len.max(s.out_len);
        buffers.output.clear();
        buffers.output.resize(len, T::default());
        let base = match coll.kind() {
            CollectiveKind::AllGather => rank as usize * n_in,
            _ => 0,
        };
        for i in 0..n_in {
            buffers.output[base + i] = value(op, rank, i);
        }
    } else {
        buffers.input.clear();
        buffers
            .input
            .extend((0..n_in).map(|i| value::<T>(op, rank, i)));
        buffers.output.clear();
        buffers.output.resize(s.out_len, T::default());
    }
}

fn call<T: Element>(
    comm: &mut Communicator,
    coll: Collective,
    op: ReduceOp,
    b: &mut RankBuffers<T>,
    in_place: bool,
) -> Result<(), ExecError> {
    let buffers = if in_place {
        Buffers::InPlace(&mut b.output)
    } else {
        Buffers::OutOfPlace {
            input: &b.input,
            output: &mut b.output,
        }
    };
    comm.run(coll, op, buffers)
}

fn count_wrong<T: Element>(
    b: &RankBuffers<T>,
    coll: Collective,
    op: ReduceOp,
    n: u32,
    rank: u32,
    s: &Shape,
    in_place: bool,
) -> u64 {
    let per = match coll.kind() {
        CollectiveKind::AllGather => s.in_len,
        CollectiveKind::ReduceScatter => s.out_len,
        CollectiveKind::AllToAll => s.in_len / n as usize,
        _ => s.out_len,
    };
    let (data, offset) = match (in_place, coll.kind()) {
        (true, CollectiveKind::ReduceScatter) => (&b.output[..], rank as usize * s.out_len),
        _ => (&b.output[..], 0),
    };
    let mut wrong = 0;
    for i in 0..s.out_len {
        if let Some(want) = expected::<T>(coll, op, n, rank, per, i)
            && data[offset + i].to_f64().to_bits() != want.to_f64().to_bits()
            && !(data[offset + i].to_f64().is_nan() && want.to_f64().is_nan())
        {
            wrong += 1;
        }
    }
    wrong
}

/// Synchronisation among the ranks: a barrier that also combines one number (sum and max).
trait RankSync {
    /// Contributes `x` and waits for every rank; returns (sum, max) over ranks.
    fn combine(&mut self, comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure>;
    /// Tells the others this rank failed, so nobody waits for it.
    fn abort(&mut self);
}

struct Round {
    arrived: u32,
    generation: u64,
    aborted: bool,
    sum: f64,
    max: f64,
    last: (f64, f64),
}

/// A barrier for the threads backend that a failing rank can break.
struct ThreadSync {
    state: Mutex<Round>,
    cv: Condvar,
    n: u32,
}

impl ThreadSync {
    fn new(n: u32) -> ThreadSync {
        ThreadSync {
            state: Mutex::new(Round {
                arrived: 0,
                generation: 0,
                aborted: false,
                sum: 0.0,
                max: f64::MIN,
                last: (0.0, 0.0),
            }),
            cv: Condvar::new(),
            n,
        }
    }
}

impl RankSync for Arc<ThreadSync> {
    fn combine(&mut self, _comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure> {
        let broken = || Failure::Runtime("another rank failed".into());
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.aborted {
            return Err(broken());
        }
        let generation = st.generation;
        st.sum += x;
        st.max = st.max.max(x);
        st.arrived += 1;
        if st.arrived == self.n {
            st.last = (st.sum, st.max);
            st.arrived = 0;
            st.sum = 0.0;
            st.max = f64::MIN;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st.last);
        }
        while st.generation == generation && !st.aborted {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.generation == generation {
            return Err(broken());
        }
        Ok(st.last)
    }

    fn abort(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.aborted = true;
        self.cv.notify_all();
    }
}

/// Across processes the communicator itself synchronises: two small AllReduces.
struct CommSync;

impl RankSync for CommSync {
    fn combine(&mut self, comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure> {
        let mut v = [x];
        comm.run(
            Collective::AllReduce,
            ReduceOp::Sum,
            Buffers::InPlace(&mut v),
        )?;
        let mut m = [x];
        comm.run(
            Collective::AllReduce,
            ReduceOp::Max,
            Buffers::InPlace(&mut m),
        )?;
        Ok((v[0], m[0]))
    }

    fn abort(&mut self) {}
}

/// One measured row.
#[derive(Debug, Clone)]
struct Row {
    shape: Shape,
    iters: u64,
    time_us: f64,
    time_max_us: f64,
    wrong: Option<u64>,
    /// The plan entry the calls used (after `HCCL_ALGO` / `HCCL_PROTO`).
    entry: Option<hccl::executor::EntryInfo>,
}

/// Everything a rank needs to run the sweep.
struct Sweep {
    coll: Collective,
    /// An AllToAllv (`coll` is AllToAll) of these counts.
    vary: Option<Counts>,
    op: ReduceOp,
    dtype: DataType,
    sizes: Vec<u64>,
    args: Args,
    n: u32,
}

/// Runs the whole sweep on one rank; returns the rows (identical on every rank).
fn sweep<T: Element>(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::new();
    let mut b = RankBuffers::<T> {
        input: Vec::new(),
        output: Vec::new(),
    };
    let in_place = sw.args.in_place;
    let mut v: Option<VBuffers<T>> = None;
    for &nominal in &sw.sizes {
        let mut s = shape(sw.coll.kind(), nominal, sw.dtype.size(), sw.n);
        let mut largest = 0;
        if let Some(counts) = sw.vary {
            let m = count_matrix(counts, sw.args.seed, sw.n, s.count / sw.n as usize);
            let total: usize = m.iter().flatten().sum();
            largest = m.iter().flatten().copied().max().unwrap_or(0);
            s.count = total / sw.n as usize;
            s.bytes = (s.count * sw.dtype.size()) as u64;
            v = Some(VBuffers::new(&m, rank));
        } else {
            fill(&mut b, sw.coll, sw.op, rank, &s, in_place);
        }
        let mut once = |comm: &mut Communicator, b: &mut RankBuffers<T>| match &mut v {
            Some(v) => v.call(comm),
            None => call(comm, sw.coll, sw.op, b, in_place),
        };
        for _ in 0..sw.args.warmup {
            once(comm, &mut b)?;
        }
        // Iteration count: fixed, or calibrated to the time budget (agreed on by all ranks).
        let iters = match sw.args.target {
            None => sw.args.iters.max(1),
            Some(target) => {
                // Calibrate on rounds of growing length until one fills a tenth of the
                // budget (a few cold calls would overestimate small sizes by 10-100x and
                // leave the timed loop too short to average out a single preemption).
                let mut probe = 1u64;
                let per_call = loop {
                    sync.combine(comm, 0.0)?;
                    let start = Instant::now();
                    for _ in 0..probe {
                        once(comm, &mut b)?;
                    }
                    let (_, slowest) = sync.combine(comm, start.elapsed().as_secs_f64())?;
                    if slowest >= target / 10.0 || probe >= 1 << 24 {
                        break slowest / probe as f64;
                    }
                    // Aim straight at the tenth (at most 16x longer per round).
                    let want = (target / 10.0 / slowest.max(1e-9) * probe as f64).ceil() as u64;
                    probe = want.clamp(probe * 2, probe * 16);
                };
                ((target / per_call.max(1e-9)).ceil() as u64).clamp(1, 50_000_000)
            }
        };
        sync.combine(comm, 0.0)?;
        let start = Instant::now();
        for _ in 0..iters {
            once(comm, &mut b)?;
        }
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        let (sum, max) = sync.combine(comm, mine)?;
        let wrong = if sw.args.check {
            let local = match &mut v {
                Some(v) => {
                    v.output.fill(T::default());
                    v.call(comm)?;
                    v.count_wrong(rank)
                }
                None => {
                    fill(&mut b, sw.coll, sw.op, rank, &s, in_place);
                    call(comm, sw.coll, sw.op, &mut b, in_place)?;
                    count_wrong(&b, sw.coll, sw.op, sw.n, rank, &s, in_place)
                }
            };
            let (total, _) = sync.combine(comm, local as f64)?;
            Some(total as u64)
        } else {
            None
        };
        let row = Row {
            shape: s,
            iters,
            time_us: sum / f64::from(sw.n) * 1e6,
            time_max_us: max * 1e6,
            wrong,
            entry: if sw.vary.is_some() {
                comm.all_to_all_v_entry((largest * sw.n as usize * sw.dtype.size()) as u64)
            } else {
                comm.entry_for(sw.coll, s.bytes, in_place)
            },
        };
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

fn run_typed<T: Element>(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    let res = sweep::<T>(sw, rank, comm, sync, on_row);
    if res.is_err() {
        sync.abort();
        comm.abort();
    }
    res
}

fn dispatch(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    match sw.dtype {
        DataType::F32 => run_typed::<f32>(sw, rank, comm, sync, on_row),
        DataType::F64 => run_typed::<f64>(sw, rank, comm, sync, on_row),
        DataType::F16 => run_typed::<f16>(sw, rank, comm, sync, on_row),
        DataType::BF16 => run_typed::<bf16>(sw, rank, comm, sync, on_row),
        DataType::I8 => run_typed::<i8>(sw, rank, comm, sync, on_row),
        DataType::U8 => run_typed::<u8>(sw, rank, comm, sync, on_row),
        DataType::I32 => run_typed::<i32>(sw, rank, comm, sync, on_row),
        DataType::U32 => run_typed::<u32>(sw, rank, comm, sync, on_row),
        DataType::I64 => run_typed::<i64>(sw, rank, comm, sync, on_row),
        DataType::U64 => run_typed::<u64>(sw, rank, comm, sync, on_row),
    }
}

/// Prints rows as they come (text) and collects them for JSON.
struct Printer {
    json: bool,
    /// Simulates entries at the exact size when the topology is known; otherwise the
    /// prediction is the entry's fitted cost.
    predictor: Option<Predictor>,
    plan_file: Option<PathBuf>,
    plan: PlanFile,
    sw_coll: Collective,
    /// What the header and the JSON call the collective (`alltoallv` for an AllToAllv).
    name: String,
    dtype: DataType,
    op: ReduceOp,
    n: u32,
    in_place: bool,
    rows: Vec<serde_json::Value>,
    /// Where `--plot` draws the sweep.
    plot: Option<PathBuf>,
    /// Per row: size, measured busbw and predicted busbw (GB/s), and the algorithm that
    /// ran, for `--plot`.
    points: Vec<(u64, f64, Option<f64>, String)>,
    /// Which calibration the predictions use (a line, and the JSON); `None` without a
    /// topology (a `--plan` of the user's: the predictions are its entries' fitted costs).
    calibration: Option<(String, serde_json::Value)>,
}

/// Which calibration the predictions for `topo` use, and where the topology came from.
fn calibration_of(args: &Args, topo: Option<&Topology>) -> Option<(String, serde_json::Value)> {
    let topo = topo?;
    let from = match &args.topo {
        Some(path) => path.display().to_string(),
        None => "this machine as a `host` topology, bandwidth by a copy probe".to_string(),
    };
    Some((
        hccl::compiler::report::calibration_line(topo, &from),
        hccl::compiler::report::calibration_json(topo, &from),
    ))
}

/// The cost model of the topology a plan was compiled for, simulating entries at the exact
/// size measured (an entry's fitted cost is a straight line over its whole size range).
struct Predictor {
    sim: hccl::compiler::cost::Simulator,
    prepared: std::collections::HashMap<usize, Option<hccl::compiler::cost::Prepared>>,
}

impl Predictor {
    fn new(topo: &Topology) -> Predictor {
        Predictor {
            sim: hccl::compiler::cost::Simulator::new(
                hccl::compiler::cost::Network::new(topo),
                hccl::compiler::cost::CostModel::for_topology(topo),
            ),
            prepared: Default::default(),
        }
    }

    fn predict(&mut self, index: usize, entry: &hccl::ir::PlanEntry, bytes: u64) -> Option<f64> {
        let sim = &self.sim;
        let prepared = self
            .prepared
            .entry(index)
            .or_insert_with(|| sim.prepare(&entry.schedule).ok())
            .as_ref()?;
        sim.run(prepared, bytes, entry.protocol)
            .ok()
            .map(|e| e.time_us)
    }
}

impl Printer {
    fn header(&self, label: &str) {
        if self.json {
            return;
        }
        println!(
            "# hccl-perf: {} {} ranks, {} {}, {}, plan: {label}",
            self.name,
            self.n,
            self.dtype.name(),
            if self.sw_coll.kind().reduces() {
                self.op.name()
            } else {
                "none"
            },
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            }
        );
        if let Some((line, _)) = &self.calibration {
            println!("# {line}");
        }
        println!(
            "# {:>12} {:>12} {:>8} {:>6} {:>5} {:>9} {:>11} {:>8} {:>8} {:>7} {:>11}  algorithm",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "iters",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong",
            "pred(us)"
        );
    }

    fn row(&mut self, row: &Row) {
        let s = &row.shape;
        let algbw = s.bytes as f64 / (row.time_us * 1e-6) / 1e9;
        let busbw = algbw * self.sw_coll.kind().busbw_factor(self.n);
        // What the communicator ran (it applies HCCL_ALGO / HCCL_PROTO), not a lookup of
        // our own, so the column and the environment always agree.
        let predicted = row.entry.as_ref().and_then(|e| {
            let entry = self.plan.entries.get(e.index)?;
            self.predictor
                .as_mut()
                .and_then(|p| p.predict(e.index, entry, s.bytes))
                .or_else(|| entry.cost.map(|c| c.predict_us(s.bytes)))
        });
        let factor = self.sw_coll.kind().busbw_factor(self.n);
        let algorithm = row.entry.as_ref().map_or("-".to_string(), |e| {
            format!("{}/{}", e.algorithm, e.protocol)
        });
        self.points.push((
            s.bytes,
            busbw,
            predicted
                .filter(|p| *p > 0.0)
                .map(|p| s.bytes as f64 / (p * 1e3) * factor),
            algorithm.clone(),
        ));
        let redop = if self.sw_coll.kind().reduces() {
            self.op.name()
        } else {
            "none"
        };
        let root = self.sw_coll.root().map_or(-1, i64::from);
        if self.json {
            self.rows.push(serde_json::json!({
                "bytes": s.bytes,
                "count": s.count,
                "dtype": self.dtype.name(),
                "op": redop,
                "root": root,
                "iters": row.iters,
                "time_us": row.time_us,
                "time_max_us": row.time_max_us,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "wrong": row.wrong,
                "predicted_us": predicted,
                "algorithm": algorithm,
                "entry": row.entry.as_ref().map(|e| e.index),
            }));
            return;
        }
        let wrong = row.wrong.map_or("N/A".to_string(), |w| w.to_string());
        let pred = predicted.map_or("-".to_string(), |p| format!("{p:.2}"));
        println!(
            "  {:>12} {:>12} {:>8} {:>6} {:>5} {:>9} {:>11.2} {:>8.3} {:>8.3} {:>7} {:>11}  {algorithm}",
            s.bytes,
            s.count,
            self.dtype.name(),
            redop,
            root,
            row.iters,
            row.time_us,
            algbw,
            busbw,
            wrong,
            pred
        );
    }
}

fn nominal_sizes(args: &Args) -> Result<Vec<u64>, Failure> {
    if args.min_bytes == 0 || args.min_bytes > args.max_bytes || args.factor < 2 {
        return Err(Failure::Usage(format!(
            "need 0 < -b ({}) <= -e ({}) and -f >= 2 ({})",
            args.min_bytes, args.max_bytes, args.factor
        )));
    }
    let mut sizes = Vec::new();
    let mut s = args.min_bytes;
    loop {
        sizes.push(s);
        if s >= args.max_bytes {
            break;
        }
        s = s.saturating_mul(args.factor).min(args.max_bytes);
    }
    Ok(sizes)
}

/// The plan (given, or compiled for this machine), its label, and the topology it was
/// compiled for when it was compiled here.
fn obtain_plan(
    args: &Args,
    kind: CollectiveKind,
    n: u32,
    probe: bool,
) -> Result<(PlanFile, String, Option<Topology>), Failure> {
    if let Some(path) = &args.plan {
        let plan =
            hccl::executor::config::load_path(path).map_err(|e| Failure::Usage(e.to_string()))?;
        return Ok((plan, path.display().to_string(), None));
    }
    let topo = match &args.topo {
        Some(path) => {
            let topo = hccl::topologies::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
            hccl::topologies::validate_ranks(&topo, n)
                .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
            topo
        }
        None => {
            let mem_bw = if probe {
                hccl::topologies::probe::probe_host().per_rank_gbps(n)
            } else {
                hccl::topologies::generate::CPU_MEM_BW
            };
            let mut spec = hccl::topologies::generate::host(n, mem_bw);
            // Until this machine is calibrated (`--calibrate`, then `--topo`), the fits of the
            // development machine for as many ranks per core.
            let cores = hccl::executor::affinity::allowed_cpus().len() as u32;
            spec.calibration = Some(hccl::compiler::cost::calibrate::builtin_cpu_calibration(
                n, cores,
            ));
            hccl::topologies::build(spec, "this machine")
                .map_err(|e| Failure::Usage(e.to_string()))?
        }
    };
    let forced = forced_algo(args);
    let mut kinds = vec![kind];
    if args.backend == Backend::Process && kind != CollectiveKind::AllReduce && forced.is_none() {
        // The process backend synchronises ranks with small AllReduces (with a forced family
        // that may not do AllReduce, the built-in entries serve: `with_control_entries`).
        kinds.push(CollectiveKind::AllReduce);
    }
    let options = search::Options {
        collectives: kinds,
        sizes: search::geometric_sizes(8.min(args.min_bytes), args.max_bytes.max(8), 2),
        algorithms: forced.clone().map(|a| vec![a]),
        model: hccl::compiler::cost::CostModel::for_topology(&topo),
        protocols: forced_protocols(args)?,
        ..search::Options::default()
    };
    let compiled = search::compile(&topo, &options).map_err(|e| match &forced {
        Some(algo) => Failure::Usage(format!(
            "cannot force algorithm `{algo}` for {} on {n} ranks: {e}",
            kind.name()
        )),
        None => Failure::Runtime(e.to_string()),
    })?;
    let only = forced.map_or(String::new(), |a| format!(", {a} only"));
    let calibrated = match &topo.spec.calibration {
        Some(c) if c.source.starts_with("built-in") => ", built-in calibration",
        Some(_) => ", calibrated",
        None => "",
    };
    let label = format!(
        "compiled for {} ({} GB/s per rank{calibrated}{only})",
        topo.name,
        topo.mem_bw(0)
    );
    Ok((compiled.plan, label, Some(topo)))
}

/// Says so on stderr when `HCCL_ALGO` names a family the plan has no entry of for `coll`:
/// the communicator then runs the plan's own choice, which the `algorithm` column shows.
fn warn_unforced(plan: &PlanFile, coll: Collective, config: &Config) {
    if let Some(algo) = &config.algo {
        let has = plan.entries.iter().any(|e| {
            e.schedule.collective.kind() == coll.kind() && e.algorithm.eq_ignore_ascii_case(algo)
        });
        if !has {
            eprintln!(
                "hccl-perf: HCCL_ALGO={algo} could not be forced: the plan has no {algo} entry \
                 for {} (the plan's own choice runs; compile without --plan, or with \
                 `hcclc compile --algo {algo}`)",
                coll.kind().name()
            );
        }
    }
}

/// The user's plan file, absolute, for the JSON report.
fn user_plan_file(args: &Args) -> Option<PathBuf> {
    args.plan
        .as_ref()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
}

/// The protocols the default plan is compiled with: `--proto`, else `HCCL_PROTO`, else all.
fn forced_protocols(args: &Args) -> Result<Vec<Protocol>, Failure> {
    let text = args.proto.clone().or_else(|| {
        std::env::var("HCCL_PROTO")
            .ok()
            .filter(|v| !v.trim().is_empty())
    });
    match text {
        Some(text) => {
            Protocol::parse_list(&text).map_err(|e| Failure::Usage(format!("--proto: {e}")))
        }
        None => Ok(Protocol::ALL.to_vec()),
    }
}

/// The family the default plan is compiled from: `--algo`, else `HCCL_ALGO`.
fn forced_algo(args: &Args) -> Option<String> {
    args.algo.clone().or_else(|| {
        std::env::var("HCCL_ALGO")
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

/// Whether the collective is AllToAllv.
fn is_v(args: &Args) -> bool {
    args.collective.eq_ignore_ascii_case("alltoallv")
}

/// The collective's name in the header and the JSON.
fn collective_name(args: &Args) -> String {
    if is_v(args) {
        return "alltoallv".into();
    }
    CollectiveKind::from_name(&args.collective)
        .map_or_else(|| args.collective.clone(), |k| k.name().to_string())
}

fn parse_choice(args: &Args) -> Result<(Collective, DataType, ReduceOp), Failure> {
    if is_v(args) && args.in_place {
        return Err(Failure::Usage(
            "alltoallv runs out of place only (no --in-place)".into(),
        ));
    }
    let name = if is_v(args) {
        "alltoall"
    } else {
        args.collective.as_str()
    };
    let kind = CollectiveKind::from_name(name).ok_or_else(|| {
        Failure::Usage(format!(
            "unknown collective `{}` (allreduce, allgather, reducescatter, broadcast, reduce, alltoall, alltoallv)",
            args.collective
        ))
    })?;
    let coll = match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllToAll => Collective::AllToAll,
        CollectiveKind::Broadcast => Collective::Broadcast { root: args.root },
        CollectiveKind::Reduce => Collective::Reduce { root: args.root },
    };
    let dtype = DataType::from_name(&args.dtype)
        .ok_or_else(|| Failure::Usage(format!("unknown data type `{}`", args.dtype)))?;
    let op = ReduceOp::from_name(&args.op).ok_or_else(|| {
        Failure::Usage(format!(
            "unknown op `{}` (sum, prod, min, max, avg)",
            args.op
        ))
    })?;
    Ok((coll, dtype, op))
}

/// `--plot`: measured bus bandwidth against the prediction, one panel.
fn write_plot(path: &Path, printer: &Printer, label: &str) -> Result<(), Failure> {
    use hccl::compiler::plot::{Line, Panel, Series, busbw_chart};
    let measured: Vec<(u64, f64)> = printer.points.iter().map(|p| (p.0, p.1)).collect();
    let predicted: Vec<(u64, f64)> = printer
        .points
        .iter()
        .filter_map(|p| p.2.map(|q| (p.0, q)))
        .collect();
    // What ran, written where it changes.
    let notes = printer
        .points
        .iter()
        .enumerate()
        .filter(|(k, p)| *k == 0 || printer.points[k - 1].3 != p.3)
        .map(|(_, p)| (p.0, p.3.clone()))
        .collect();
    let mut series = vec![Series {
        name: "measured".into(),
        line: Line::Solid,
        points: measured,
        notes,
    }];
    if !predicted.is_empty() {
        series.push(Series {
            name: "predicted (the plan's cost model)".into(),
            line: Line::Dashed,
            points: predicted,
            notes: Vec::new(),
        });
    }
    let reduces = printer.sw_coll.kind().reduces();
    let panel = Panel {
        title: format!(
            "{}, {} ranks, {}{}, {}",
            printer.name,
            printer.n,
            printer.dtype.name(),
            if reduces {
                format!(" {}", printer.op.name())
            } else {
                String::new()
            },
            if printer.in_place {
                "in place"
            } else {
                "out of place"
            }
        ),
        series,
    };
    let title = format!("hccl-perf: measured bus bandwidth (plan: {label})");
    let svg =
        busbw_chart(&title, &[panel]).map_err(|e| Failure::Runtime(format!("--plot: {e}")))?;
    hccl::ir::write_atomic(path, svg.as_bytes())
        .map_err(|e| Failure::Usage(format!("--plot {}: cannot write: {e}", path.display())))
}

/// `report`: the run's straggler report (`None` when the ranks could not make one: a rank
/// failed).
fn finish(
    printer: Printer,
    label: &str,
    rows: &[Row],
    report: Option<&StragglerReport>,
) -> Result<(), Failure> {
    if let Some(path) = &printer.plot {
        write_plot(path, &printer, label)?;
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    if printer.json {
        let doc = serde_json::json!({
            "collective": printer.name,
            "root": printer.sw_coll.root(),
            "ranks": printer.n,
            "plan": label,
            // The plan file the rows' `entry` indices refer to (after deriving the measured
            // root), so `hcclc calibrate` can simulate what ran; null for a plan compiled
            // here.
            "plan_file": printer.plan_file.as_ref().map(|p| p.display().to_string()),
            // Which calibration the rows' predictions use (null: no topology known).
            "calibration": printer.calibration.as_ref().map(|c| c.1.clone()),
            "rows": printer.rows,
            // Who the ranks waited for over the whole run (warm-up and synchronisation
            // included): `Communicator::straggler_report`.
            "stragglers": report.and_then(|r| serde_json::to_value(r).ok()),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else if printer.rows.is_empty() {
        let checked = rows.iter().any(|r| r.wrong.is_some());
        if checked {
            println!(
                "# Out of bounds values : {wrong} {}",
                if wrong == 0 { "OK" } else { "FAILED" }
            );
        }
        let avg = rows
            .iter()
            .map(|r| {
                r.shape.bytes as f64 / (r.time_us * 1e-6) / 1e9
                    * printer.sw_coll.kind().busbw_factor(printer.n)
            })
            .sum::<f64>()
            / rows.len().max(1) as f64;
        println!("# Avg bus bandwidth    : {avg:.3}");
        if let Some(top) = report.and_then(StragglerReport::dominant) {
            println!("# Straggler            : {top}");
        }
    }
    if wrong > 0 {
        return Err(Failure::Runtime(format!("{wrong} wrong element(s)")));
    }
    Ok(())
}

/// What a rank thread of the threads backend ends with: its rows and the straggler report
/// its `finalize` returned.
type RankOutcome = (Result<Vec<Row>, Failure>, Option<StragglerReport>);

fn run_threads(args: &Args, trace: Option<&Path>) -> Result<(), Failure> {
    let (coll, dtype, op) = parse_choice(args)?;
    let n = args.ranks;
    if n == 0 {
        return Err(Failure::Usage("need -g >= 1".into()));
    }
    if let Some(r) = coll.root().filter(|&r| r >= n) {
        return Err(Failure::Usage(format!(
            "--root {r} is not a rank of -g {n} (ranks 0..{})",
            n - 1
        )));
    }
    let sizes = nominal_sizes(args)?;
    let (plan, label, topo) = obtain_plan(args, coll.kind(), n, true)?;
    // AllReduce entries for the straggler report at the end (appended: the measured
    // entries keep their indices).
    let mut plan = with_control_entries(plan, n);
    plan.ensure_root(coll);
    let mut config = Config::from_env()?;
    if let Some(dir) = trace {
        let calls = hccl::executor::trace::calls_from_env()?;
        config = config.with_trace(Some(hccl::executor::trace::TraceConfig {
            dir: dir.to_path_buf(),
            calls,
        }));
    }
    warn_unforced(&plan, coll, &config);
    let comms = ThreadGroup::with_config(plan.clone(), n, config)
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let sw = Arc::new(Sweep {
        coll,
        vary: is_v(args).then_some(args.counts),
        op,
        dtype,
        sizes,
        args: args.clone(),
        n,
    });
    let sync = Arc::new(ThreadSync::new(n));
    let printer = Printer {
        json: args.json,
        predictor: topo.as_ref().map(Predictor::new),
        calibration: calibration_of(args, topo.as_ref()),
        plan_file: user_plan_file(args),
        plan,
        sw_coll: coll,
        name: collective_name(args),
        dtype,
        op,
        n,
        in_place: args.in_place,
        rows: Vec::new(),
        plot: args.plot.clone(),
        points: Vec::new(),
    };
    printer.header(&label);
    let printer = Mutex::new(printer);
    let binding = should_bind(args, n);
    let results: Vec<RankOutcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let sw = Arc::clone(&sw);
                let mut sync = Arc::clone(&sync);
                let printer = &printer;
                scope.spawn(move || {
                    if binding {
                        bind(rank as u32);
                    }
                    let rows = dispatch(&sw, rank as u32, &mut comm, &mut sync, |row| {
                        if rank == 0 {
                            printer.lock().unwrap_or_else(|e| e.into_inner()).row(row);
                        }
                    });
                    // Collective: a rank whose sweep failed aborted the communicator, so
                    // the others' finalize fails fast instead of waiting for it.
                    let report = comm.finalize();
                    (rows, report)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (Err(Failure::Runtime("a rank panicked".into())), None))
            })
            .collect()
    });
    let printer = printer.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut rows = None;
    let mut report = None;
    for (res, rep) in results {
        match res {
            Ok(r) => rows = rows.or(Some(r)),
            Err(e) => return Err(e),
        }
        report = report.or(rep);
    }
    finish(printer, &label, &rows.unwrap_or_default(), report.as_ref())
}

/// Set by `hccl-perf` for the rank processes it starts when they should bind to cores.
const BIND_ENV: &str = "HCCL_PERF_BIND";

/// Set by `hccl-perf` for its rank processes: the topology their plan was compiled for (empty:
/// none known).
const TOPO_ENV: &str = "HCCL_PERF_TOPO";

/// Set by `hccl-perf` for its rank processes: how the plan they are handed was made.
const LABEL_ENV: &str = "HCCL_PERF_PLAN_LABEL";

/// Whether `n` ranks get a core each.
fn should_bind(args: &Args, n: u32) -> bool {
    !args.no_bind && n as usize <= hccl::executor::affinity::allowed_cpus().len()
}

/// Binds this thread to the core of `rank`; failure only costs speed, so it is a warning.
fn bind(rank: u32) {
    if let Err(e) = hccl::executor::affinity::bind_current_thread(rank as usize) {
        eprintln!("hccl-perf: rank {rank}: {e}; running unbound");
    }
}

/// The launchers' rank variables this process sees (empty: not under a launcher).
const LAUNCHER_VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];

fn under_launcher() -> bool {
    launcher_var().is_some()
}

/// The first launcher variable set, as `NAME=value`.
fn launcher_var() -> Option<String> {
    LAUNCHER_VARS
        .iter()
        .find_map(|v| std::env::var_os(v).map(|value| format!("{v}={}", value.to_string_lossy())))
}

/// Settings that no backend or setting would honour: an error saying what to do instead,
/// never a silently ignored flag.
fn refuse_ignored(args: &Args) -> Result<(), Failure> {
    if args.hosts > 1 && args.backend == Backend::Threads {
        return Err(Failure::Usage(format!(
            "--hosts {} needs --backend process: emulated hosts are rank processes with \
             their own HCCL_HOST_ID, and the threads backend runs every rank in this one \
             process (add --backend process)",
            args.hosts
        )));
    }
    if let Some(var) = launcher_var() {
        if args.calibrate.is_some() {
            return Err(Failure::Usage(format!(
                "--calibrate under a launcher ({var} is set): calibration starts its own rank \
                 processes for every family, so run it once without mpirun/torchrun/srun \
                 (`hccl-perf --calibrate OUT.ron --backend process -g N`) and give OUT.ron \
                 to the launched ranks with --topo OUT.ron"
            )));
        }
        // hccl-perf's own rank processes carry the label it hands down; a launcher's do not.
        if args.hosts > 1 && std::env::var_os(LABEL_ENV).is_none() {
            return Err(Failure::Usage(format!(
                "--hosts {} under a launcher ({var} is set): the launcher's ranks are on \
                 their real hosts; to emulate hosts, set HCCL_HOST_ID per rank instead, or \
                 run hccl-perf --backend process -g N --hosts K without the launcher",
                args.hosts
            )));
        }
    }
    Ok(())
}

/// One rank of a process job (started by us or by a launcher).
fn run_process_rank(args: &Args) -> Result<(), Failure> {
    let (coll, dtype, op) = parse_choice(args)?;
    let (rank, world) = hccl::executor::process::rank_world_from_env()?;
    if coll.root().is_some_and(|r| r >= world) {
        return Err(Failure::Usage(format!("root must be < {world}")));
    }
    let sizes = nominal_sizes(args)?;
    // Every rank must hold the same plan: a plan handed down by the parent (HCCL_PLAN), the
    // user's, or one compiled without the machine probe (whose numbers differ per process).
    let (plan, label) = match std::env::var_os("HCCL_PLAN") {
        Some(path) => {
            let plan = hccl::executor::config::load_path(Path::new(&path))
                .map_err(|e| Failure::Usage(e.to_string()))?;
            (
                plan,
                std::env::var(LABEL_ENV).unwrap_or_else(|_| "compiled for this machine".into()),
            )
        }
        None => {
            let (plan, label, _) = obtain_plan(args, coll.kind(), world, false)?;
            (plan, label)
        }
    };
    let topo = match std::env::var_os(TOPO_ENV).filter(|p| !p.is_empty()) {
        Some(p) => hccl::topologies::load(Path::new(&p)).ok(),
        None => None,
    };
    let mut plan = with_control_entries(plan, world);
    plan.ensure_root(coll);
    if std::env::var_os(BIND_ENV).is_some() {
        bind(rank);
    }
    let config = Config::from_env()?;
    if rank == 0 {
        warn_unforced(&plan, coll, &config);
    }
    let mut comm =
        ProcessGroup::init_with(plan.clone(), rank, world, &Bootstrap::from_env(), config)?;
    let sw = Sweep {
        coll,
        vary: is_v(args).then_some(args.counts),
        op,
        dtype,
        sizes,
        args: args.clone(),
        n: world,
    };
    let mut printer = Printer {
        json: args.json,
        predictor: topo.as_ref().map(Predictor::new),
        calibration: calibration_of(args, topo.as_ref()),
        plan_file: user_plan_file(args),
        plan,
        sw_coll: coll,
        name: collective_name(args),
        dtype,
        op,
        n: world,
        in_place: args.in_place,
        rows: Vec::new(),
        plot: args.plot.clone(),
        points: Vec::new(),
    };
    if rank == 0 {
        printer.header(&label);
    }
    let rows = dispatch(&sw, rank, &mut comm, &mut CommSync, |row| {
        if rank == 0 {
            printer.row(row);
        }
    })?;
    // Collective, like the sweep: every rank of the job gets here or has failed it.
    let report = comm.finalize();
    if rank == 0 {
        finish(printer, &label, &rows, report.as_ref())
    } else {
        let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
        if wrong > 0 {
            Err(Failure::Runtime(format!("{wrong} wrong element(s)")))
        } else {
            Ok(())
        }
    }
}

/// Makes sure the plan can synchronise ranks and sum their straggler reports: adds the
/// built-in AllReduce entries when the plan has none (e.g. an imported AllGather).
fn with_control_entries(mut plan: PlanFile, world: u32) -> PlanFile {
    let has_allreduce = plan
        .entries
        .iter()
        .any(|e| e.schedule.collective == Collective::AllReduce);
    if !has_allreduce {
        let builtin = hccl::executor::fallback::plan(world);
        plan.entries.extend(
            builtin
                .entries
                .into_iter()
                .filter(|e| e.schedule.collective == Collective::AllReduce),
        );
    }
    plan
}

/// Starts `-g N` rank processes of this program and waits for them.
fn launch_processes(args: &Args, trace: Option<&Path>) -> Result<(), Failure> {
    let (coll, _, _) = parse_choice(args)?;
    let n = args.ranks;
    if n == 0 {
        return Err(Failure::Usage("need -g >= 1".into()));
    }
    if args.hosts == 0 || args.hosts > n || !n.is_multiple_of(args.hosts) {
        return Err(Failure::Usage(format!(
            "--hosts {} must divide the {n} ranks",
            args.hosts
        )));
    }
    nominal_sizes(args)?;
    // Compile (with the probe) once here and hand the same plan to every rank.
    let (plan, label, topo) = obtain_plan(args, coll.kind(), n, true)?;
    let mut plan = with_control_entries(plan, n);
    plan.ensure_root(coll);
    let dir = std::env::temp_dir();
    let random = RandomState::new().build_hasher().finish();
    let plan_path = dir.join(format!(
        "hccl-perf-{}-{random:016x}.plan.ron",
        std::process::id()
    ));
    plan.save(&plan_path)
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    // The topology the plan was compiled for, so that rank 0 can simulate its entries.
    let topo_path = topo.map(|t| {
        let path = plan_path.with_extension("topo.ron");
        let _ = hccl::ir::write_atomic(&path, hccl::topologies::to_ron(&t.spec).as_bytes());
        path
    });
    let port = hccl::executor::process::local_rendezvous_port()
        .map_err(|e| Failure::Runtime(format!("no free port for the rendezvous: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| Failure::Runtime(e.to_string()))?;
    let token = format!("{:016x}", RandomState::new().build_hasher().finish());
    let mut children = Vec::new();
    let binding = should_bind(args, n);
    for rank in 0..n {
        let mut command = std::process::Command::new(&exe);
        if binding {
            command.env(BIND_ENV, "1");
        } else {
            command.env_remove(BIND_ENV);
        }
        if let Some(dir) = trace {
            command.env("HCCL_TRACE", dir);
        }
        if args.hosts > 1 {
            let per_host = n / args.hosts;
            command.env(
                "HCCL_HOST_ID",
                format!("hccl-perf-{token}-h{}", rank / per_host),
            );
        }
        let child = command
            .args(std::env::args_os().skip(1))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("HCCL_JOB_TOKEN", &token)
            .env("HCCL_PLAN", &plan_path)
            .env(TOPO_ENV, topo_path.as_deref().unwrap_or(Path::new("")))
            .env(LABEL_ENV, &label)
            .spawn()
            .map_err(|e| Failure::Runtime(format!("cannot start rank {rank}: {e}")));
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let _ = std::fs::remove_file(&plan_path);
                if let Some(p) = &topo_path {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
    }
    let mut worst = 0;
    for (rank, mut child) in children.into_iter().enumerate() {
        let code = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
        if code != 0 {
            eprintln!("hccl-perf: rank {rank} exited with code {code}");
        }
        worst = worst.max(code);
    }
    let _ = std::fs::remove_file(&plan_path);
    if let Some(p) = &topo_path {
        let _ = std::fs::remove_file(p);
    }
    match worst {
        0 => Ok(()),
        2 => Err(Failure::Usage("a rank rejected its input".into())),
        _ => Err(Failure::Runtime("a rank failed".into())),
    }
}

/// Merges the rank files of `dir` into `out` (`--trace`).
fn merge_trace(dir: &Path, out: &Path, json: bool) -> Result<(), Failure> {
    let doc = hccl::ir::trace::merge_dir(dir)
        .map_err(|e| Failure::Runtime(format!("merging the trace: {e}")))?;
    let summary = doc
        .check()
        .map_err(|e| Failure::Runtime(format!("the merged trace is malformed: {e}")))?;
    doc.save(out)
        .map_err(|e| Failure::Usage(format!("--trace {}: cannot write: {e}", out.display())))?;
    if !json {
        println!(
            "# Trace                : {} ({} ranks, {} slices)",
            out.display(),
            summary.processes.len(),
            summary.slices
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(err) => {
            let code = if err.use_stderr() { 2 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    hccl::executor::config::init_tracing();
    // `--trace`: the ranks write into a fresh directory, merged into the file at the end.
    let trace_dir = args.trace.as_ref().filter(|_| !under_launcher()).map(|_| {
        let random = RandomState::new().build_hasher().finish();
        std::env::temp_dir().join(format!(
            "hccl-perf-trace-{}-{random:016x}",
            std::process::id()
        ))
    });
    let res = refuse_ignored(&args).and_then(|()| match args.backend {
        _ if args.trace.is_some() && args.calibrate.is_some() => Err(Failure::Usage(
            "--trace does not go with --calibrate (trace one family with --algo)".into(),
        )),
        _ if args.trace.is_some()
            && under_launcher()
            && std::env::var_os("HCCL_TRACE").is_none() =>
        {
            Err(Failure::Usage(
                "--trace under a launcher: set HCCL_TRACE=DIR for every rank instead and merge \
                 the rank files with `hcclc trace merge DIR`"
                    .into(),
            ))
        }
        _ if args.calibrate.is_some() && !under_launcher() => {
            calibrate::run(&args, args.calibrate.as_deref().unwrap_or(Path::new("")))
        }
        Backend::Threads => run_threads(&args, trace_dir.as_deref()),
        Backend::Process if under_launcher() => run_process_rank(&args),
        Backend::Process => launch_processes(&args, trace_dir.as_deref()),
    });
    let res = match (&trace_dir, &args.trace) {
        (Some(dir), Some(out)) => {
            let merged = if dir.is_dir() {
                res.and_then(|()| merge_trace(dir, out, args.json))
            } else {
                res
            };
            let _ = std::fs::remove_dir_all(dir);
            merged
        }
        _ => res,
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("hccl-perf: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("hccl-perf: {msg}");
            ExitCode::from(1)
        }
    }
}
