//! `hcclc trace merge DIR [-o FILE.json]`: joins the per-rank measured traces an executor
//! wrote with `HCCL_TRACE=DIR` into one Chrome trace-event file (see `hccl_ir::trace`).
//! `hcclc trace show TRACE.json --svg FILE.svg`: draws a trace's steps as a timeline.

use crate::cli_error::{CliError, print_json};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Timelines in the Chrome trace-event format.
#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// Merge the rank files (`rank-<r>.json`) of an `HCCL_TRACE` directory into one trace
    /// (every file checked against the trace-event format; timestamps start at 0).
    Merge(MergeArgs),
    /// Draw a trace (predicted by `hcclc explain --trace`, or measured and merged) as a
    /// timeline: a row per stream of each rank, a bar per step coloured by its operation.
    Show(ShowArgs),
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The trace file (Chrome trace-event JSON in hccl's layout).
    pub trace: PathBuf,
    /// Where to write the picture.
    #[arg(long, value_name = "FILE.svg")]
    pub svg: PathBuf,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
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
        TraceCommand::Show(args) => show(args),
    }
}

fn show(args: ShowArgs) -> Result<(), CliError> {
    let at = |e: String| CliError::Input(format!("{}: {e}", args.trace.display()));
    let doc = hccl_ir::trace::TraceFile::load(&args.trace).map_err(CliError::input)?;
    doc.check()
        .map_err(|e| at(format!("not a valid trace: {e}")))?;
    let other = |k: &str| {
        doc.other
            .get(k)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let mut title = other("source").unwrap_or_else(|| "trace".into());
    for k in ["collective", "algorithm", "topology"] {
        if let Some(v) = other(k) {
            title.push_str(&format!(" · {v}"));
        }
    }
    if let Some(b) = doc.other.get("bytes").and_then(|v| v.as_u64()) {
        title.push_str(&format!(" · {}", hccl_ir::units::format_bytes(b)));
    }
    if let Some(name) = args.trace.file_name() {
        title.push_str(&format!(" ({})", name.to_string_lossy()));
    }
    let (svg, summary) =
        hccl_compiler::plot::timeline_svg(&doc, &title).map_err(|e| at(e.to_string()))?;
    hccl_ir::write_atomic(&args.svg, svg.as_bytes())
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", args.svg.display())))?;
    if args.json {
        print_json(&serde_json::json!({
            "svg": args.svg.display().to_string(),
            "rows": summary.rows,
            "rows_total": summary.rows_total,
            "slices": summary.slices,
            "ops": summary.ops,
            "span_us": [summary.span_us.0, summary.span_us.1],
        }));
    } else {
        println!(
            "{}: {} of {} streams, {} steps, {:.1} µs",
            args.svg.display(),
            summary.rows,
            summary.rows_total,
            summary.slices,
            summary.span_us.1 - summary.span_us.0
        );
    }
    Ok(())
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
