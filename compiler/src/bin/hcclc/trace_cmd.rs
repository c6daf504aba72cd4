//! `hcclc trace merge DIR [-o FILE.json]`: joins the per-rank measured traces an executor
//! wrote with `HCCL_TRACE=DIR` into one Chrome trace-event file (see `hccl_ir::trace`).

use crate::cli_error::{CliError, print_json};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Timelines in the Chrome trace-event format.
#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// Merge the rank files (`rank-<r>.json`) of an `HCCL_TRACE` directory into one trace
    /// (every file checked against the trace-event format; timestamps start at 0).
    Merge(MergeArgs),
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The directory `HCCL_TRACE` named.
    pub dir: PathBuf,
    /// Output file (default: DIR/trace.json).
    #[arg(short = 'o', long = "output", value_name = "FILE.json")]
    pub output: Option<PathBuf>,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: TraceCommand) -> Result<(), CliError> {
    match cmd {
        TraceCommand::Merge(args) => merge(args),
    }
}

fn merge(args: MergeArgs) -> Result<(), CliError> {
    let doc = hccl_ir::trace::merge_dir(&args.dir).map_err(CliError::input)?;
    let summary = doc
        .check()
        .map_err(|e| CliError::Failed(format!("the merged trace is malformed: {e}")))?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| args.dir.join("trace.json"));
    doc.save(&out)
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", out.display())))?;
    let missing = doc.other.get("missing_ranks").cloned().unwrap_or_default();
    if args.json {
        print_json(&serde_json::json!({
            "trace": out.display().to_string(),
            "ranks": summary.processes,
            "slices": summary.slices,
            "missing_ranks": missing,
        }));
    } else {
        println!(
            "{}: {} ranks, {} slices{}",
            out.display(),
            summary.processes.len(),
            summary.slices,
            match missing.as_array() {
                Some(m) if !m.is_empty() => format!(" (no file from ranks {missing})"),
                _ => String::new(),
            }
        );
    }
    Ok(())
}
