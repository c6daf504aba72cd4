//! `hcclc`: the hccl compiler command.
//!
//! Exit codes: 0 ok; 1 verification or runtime failure; 2 bad input or usage.
//! Every subcommand takes `--json` and then prints exactly one JSON document on stdout.

mod cache_cmd;
mod calibrate_cmd;
mod cli_error;
mod compile_cmd;
mod msccl_cmd;
mod plan_cmd;
mod synth_cmd;
mod topo_cmd;
mod trace_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "hcclc",
    version,
    about = "Compile, verify and inspect collective schedules"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Inspect or generate topology descriptions.
    #[command(subcommand)]
    Topo(topo_cmd::TopoCommand),
    /// Verify a plan file: structure, deadlock freedom and the collective's postcondition.
    Verify(plan_cmd::VerifyArgs),
    /// Print a plan file's schedules in readable form.
    Show(plan_cmd::ShowArgs),
    /// Import an MSCCL XML algorithm as a verified plan file.
    Import(msccl_cmd::ImportArgs),
    /// Export a plan file to another format (MSCCL XML).
    Export(msccl_cmd::ExportArgs),
    /// Compile a topology into a plan: the fastest verified schedule per collective and size.
    Compile(compile_cmd::CompileArgs),
    /// Explain a plan: predicted time, bandwidth, NCCL baseline and lower bound per size.
    Explain(compile_cmd::ExplainArgs),
    /// Fit a topology's cost model to `hccl-perf --json` measurements; write it calibrated.
    Calibrate(calibrate_cmd::CalibrateArgs),
    /// Run a synthesizer alone (LP tree packing; allreduce over trees carrying data both
    /// ways): its trees, its rate against its bounds, its predicted time, and the verified
    /// schedule as a plan.
    Synth(synth_cmd::SynthArgs),
    /// Measured timelines: merge the per-rank files of `HCCL_TRACE=DIR` into one
    /// Chrome trace-event file (Perfetto, chrome://tracing).
    #[command(subcommand)]
    Trace(trace_cmd::TraceCommand),
    /// The compiler's caches on disk (solver results and whole compiles): what they hold,
    /// and emptying them.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCommand),
}

/// A reader that closes the pipe early (`hcclc synth … | head`) ends the process quietly, as
/// it does any Unix tool, instead of making the next `println!` panic on the broken pipe.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE at start-up, before any thread
    // exists; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    quiet_on_closed_pipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are successes; everything else is a usage error.
            let code = if err.use_stderr() { 2 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Topo(cmd) => topo_cmd::run(cmd),
        Command::Verify(args) => plan_cmd::verify(args),
        Command::Show(args) => plan_cmd::show(args),
        Command::Import(args) => msccl_cmd::import(args),
        Command::Export(args) => msccl_cmd::export(args),
        Command::Compile(args) => compile_cmd::compile(args),
        Command::Explain(args) => compile_cmd::explain(args),
        Command::Calibrate(args) => calibrate_cmd::run(args),
        Command::Synth(args) => synth_cmd::run(args),
        Command::Trace(cmd) => trace_cmd::run(cmd),
        Command::Cache(cmd) => cache_cmd::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hcclc: {err}");
            ExitCode::from(err.code())
        }
    }
}
