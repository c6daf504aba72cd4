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
//! ranks), its blocks drawn by `--counts` (see [`args::Counts`]). Each row shows the
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
//!
//! Modules: `args` (the command line, `Failure`), `data` (test data, the calls, their
//! checks), `sweep` (what every rank runs, the barrier between ranks), `output` (rank 0's
//! table, JSON, summary and chart), `plan` (the plan measured), `launch` (threads, rank
//! processes, or one rank under a launcher) and `calibrate` (`--calibrate`).

mod args;
mod calibrate;
mod data;
mod launch;
mod output;
mod plan;
mod sweep;

use crate::args::{Args, Backend, Failure};
use crate::launch::{
    launch_processes, refuse_ignored, run_process_rank, run_threads, under_launcher,
};
use clap::Parser;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::process::ExitCode;

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
