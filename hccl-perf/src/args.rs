//! The command line: `Args` (clap), what its values mean (the collective, data type and
//! operator, the sizes of the sweep) and `Failure`, the two kinds of error and their exit
//! codes.

use clap::{Parser, ValueEnum};
use hccl::executor::{DataType, ExecError, ReduceOp};
use hccl::ir::{Collective, CollectiveKind};
use std::path::PathBuf;

/// How AllToAllv's block sizes are drawn (`per`: the size over the ranks, in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Counts {
    /// Rank `s`'s block for rank `d`: empty one time in eight, else uniform in
    /// `[0, 16·per/7]` (hashed from the seed, `s` and `d`).
    Uniform,
    /// Every rank sends rank 0 `n` shares, the last rank (of 3 or more) none, the others
    /// one share each, the shares summing to `n·per`.
    Skewed,
    /// Every block `per` elements: the AllToAll of the same size, through AllToAllv.
    Equal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
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
pub(crate) struct Args {
    /// Smallest size (bytes; K, M, G are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub(crate) min_bytes: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub(crate) max_bytes: u64,
    /// Multiplicative step between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub(crate) factor: u64,
    /// Ranks (threads, or processes started by hccl-perf).
    #[arg(short = 'g', long = "ranks", default_value_t = 2)]
    pub(crate) ranks: u32,
    /// Collective: allreduce, allgather, reducescatter, broadcast, reduce, alltoall,
    /// alltoallv.
    #[arg(short = 'c', long = "collective", default_value = "allreduce")]
    pub(crate) collective: String,
    /// AllToAllv's block sizes: uniform (random, about one block in eight empty, a rank's
    /// blocks summing to the size on average), skewed (rank 0 receives n times as much as
    /// an ordinary rank, the last of 3 or more ranks nothing) or equal (AllToAll's blocks).
    #[arg(long, value_enum, default_value = "uniform")]
    pub(crate) counts: Counts,
    /// Seed of `--counts uniform`.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Data type (nccl-tests names: float, half, bfloat16, double, int8, uint8, int32, uint32,
    /// int64, uint64).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub(crate) dtype: String,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub(crate) op: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub(crate) root: u32,
    /// Backend.
    #[arg(long, value_enum, default_value = "threads")]
    pub(crate) backend: Backend,
    /// Plan file (RON) or MSCCL algorithm (XML); default: compiled for this machine.
    #[arg(long)]
    pub(crate) plan: Option<PathBuf>,
    /// Compile the default plan from this algorithm family only (a family name of `hcclc
    /// compile --algo`: ring, tree, hybrid_cube, mesh, oneshot, ...). Without `--plan`,
    /// `HCCL_ALGO` does the same; the `algorithm` column always shows what ran.
    #[arg(long)]
    pub(crate) algo: Option<String>,
    /// Compile the default plan with these protocols only (comma-separated: LL, LL128,
    /// Simple; a CPU host runs LL and Simple). Without `--plan`, `HCCL_PROTO` does the same.
    #[arg(long, value_name = "LIST")]
    pub(crate) proto: Option<String>,
    /// Compile the default plan for this topology file (e.g. one written by `--calibrate`)
    /// instead of this machine as probed.
    #[arg(long, value_name = "TOPO.ron")]
    pub(crate) topo: Option<PathBuf>,
    /// Measure every algorithm family that applies (at the sizes of -b/-e/-f, with this
    /// backend and rank count), fit the cost model to the measurements and write the
    /// calibrated topology (this machine as a `host`, or `--topo`) to this file.
    #[arg(long, value_name = "OUT.ron")]
    pub(crate) calibrate: Option<PathBuf>,
    /// With `--calibrate`: measure every family this many times (in turn, each time in a
    /// different order) and fit the typical time per size (the median of the launches within
    /// 1.75x of the fastest).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub(crate) reps: u32,
    /// Timed iterations per size (ignored when -T is given).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub(crate) iters: u64,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup", default_value_t = 5)]
    pub(crate) warmup: u64,
    /// Time budget per size in seconds: the iteration count is calibrated to fill it.
    #[arg(short = 'T', long = "target")]
    pub(crate) target: Option<f64>,
    /// Run in place (one buffer) instead of out of place.
    #[arg(long)]
    pub(crate) in_place: bool,
    /// Check every result against a sequential reference.
    #[arg(long)]
    pub(crate) check: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also draw the sweep as an SVG chart: measured bus bandwidth against size, beside the
    /// plan's prediction (the `pred(us)` column as bandwidth).
    #[arg(long, value_name = "FILE.svg", conflicts_with = "calibrate")]
    pub(crate) plot: Option<PathBuf>,
    /// Leave ranks unbound. By default, when ranks do not outnumber the cores, rank `r` is
    /// bound to the `r`-th core (as `mpirun` binds to cores for up to two ranks).
    #[arg(long)]
    pub(crate) no_bind: bool,
    /// With `--backend process`: split the ranks into this many emulated hosts on this
    /// machine (each its own `HCCL_HOST_ID`, blocks of consecutive ranks), so that ranks on
    /// different "hosts" talk over TCP on loopback instead of shared memory.
    #[arg(long, default_value_t = 1)]
    pub(crate) hosts: u32,
    /// Record a measured timeline of every rank's calls (the first `HCCL_TRACE_CALLS`, 64
    /// by default: warm-up calls and the ranks' synchronising AllReduces included) and write
    /// it to this file in the Chrome trace-event format (Perfetto, chrome://tracing), the
    /// layout of `hcclc explain --trace`. The ranks write into a temporary directory
    /// (`HCCL_TRACE`), merged into the file at the end.
    #[arg(long, value_name = "FILE.json")]
    pub(crate) trace: Option<PathBuf>,
}

fn parse_size(text: &str) -> Result<u64, String> {
    hccl::ir::units::parse_bytes(text).ok_or_else(|| format!("bad size `{text}` (e.g. 8, 64K, 1M)"))
}

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub(crate) enum Failure {
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

pub(crate) fn nominal_sizes(args: &Args) -> Result<Vec<u64>, Failure> {
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

/// Whether the collective is AllToAllv.
pub(crate) fn is_v(args: &Args) -> bool {
    args.collective.eq_ignore_ascii_case("alltoallv")
}

/// The collective's name in the header and the JSON.
pub(crate) fn collective_name(args: &Args) -> String {
    if is_v(args) {
        return "alltoallv".into();
    }
    CollectiveKind::from_name(&args.collective)
        .map_or_else(|| args.collective.clone(), |k| k.name().to_string())
}

pub(crate) fn parse_choice(args: &Args) -> Result<(Collective, DataType, ReduceOp), Failure> {
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
