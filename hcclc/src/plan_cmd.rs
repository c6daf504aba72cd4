//! `hcclc verify` and `hcclc show`.
//!
//! Both read a plan file (RON) or an MSCCL algorithm (a path ending in `.xml`, imported with
//! [`hccl_ir::msccl`]; import warnings go to stderr).
//!
//! `verify` exits 0 when every entry verifies, 1 when some entry does not (every error is
//! listed, located as `entry I (COLLECTIVE SIZES ALGORITHM): rank R stream S (channel C)
//! step K: …`) or the plan was edited after it was sealed, and 2 when the file cannot be
//! read or parsed. `verify --rank R` runs only what rank `R` of a job checks at start (its
//! programs against the seals, and the checks one rank can make alone) and times it. `show` prints each entry's
//! header and its steps in a compact form such as `rrcs from 3 to 5 i[4]->i[4] x1 deps [s1:2]`.

use crate::cli_error::{CliError, print_json};
use clap::Args;
use hccl_ir::verify::{Report, VerifyError, check_rank, verify_entry};
use hccl_ir::{PlanEntry, PlanError, PlanFile, Step};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Plan file (RON), or an MSCCL algorithm (`.xml`).
    pub plan: PathBuf,
    /// Run only what one rank of a job checks at start, and time it: load that rank's
    /// programs, check them against the plan's seals and make the checks a rank can make
    /// alone (bounds, peers, dependencies). Entries no seal covers would be verified on the
    /// whole plan at start: they are listed, not verified here.
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Plan file (RON), or an MSCCL algorithm (`.xml`).
    pub plan: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A plan that cannot be loaded: edited after it was sealed is a failed check (exit 1),
/// anything else bad input (exit 2).
fn plan_error(err: PlanError) -> CliError {
    match err {
        PlanError::Edited { .. } | PlanError::EditedRank { .. } => {
            CliError::Failed(err.to_string())
        }
        _ => CliError::input(err),
    }
}

fn is_xml(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"))
}

/// Loads a plan file, or imports an MSCCL XML algorithm as a plan.
fn load_plan(path: &std::path::Path) -> Result<PlanFile, CliError> {
    load_plan_as(path, PlanFile::load)
}

/// [`load_plan`] with `load` reading plan files (XML is imported either way).
fn load_plan_as(
    path: &std::path::Path,
    load: fn(&std::path::Path) -> Result<PlanFile, hccl_ir::PlanError>,
) -> Result<PlanFile, CliError> {
    if !is_xml(path) {
        return load(path).map_err(plan_error);
    }
    let imported = hccl_ir::msccl::load_xml(path).map_err(CliError::input)?;
    for warning in &imported.warnings {
        eprintln!("hcclc: warning: {}: {warning}", path.display());
    }
    Ok(imported.into_plan(&path.display().to_string()))
}

/// `1 entry`, `2 entries`.
pub(crate) fn entries_text(n: usize) -> String {
    if n == 1 {
        "1 entry".to_string()
    } else {
        format!("{n} entries")
    }
}

/// `1024` → `1K`; sizes that are not a whole number of K/M/G stay in bytes.
fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// `1K..4K`, or `1K..` when unbounded.
fn fmt_range(entry: &PlanEntry) -> String {
    match entry.max_bytes {
        Some(max) => format!("{}..{}", fmt_bytes(entry.min_bytes), fmt_bytes(max)),
        None => format!("{}..", fmt_bytes(entry.min_bytes)),
    }
}

/// `allreduce 1K..4K ring`.
fn entry_label(entry: &PlanEntry) -> String {
    format!(
        "{} {} {}",
        entry.schedule.collective,
        fmt_range(entry),
        entry.algorithm
    )
}

fn entry_json(index: usize, entry: &PlanEntry) -> serde_json::Map<String, Value> {
    let s = &entry.schedule;
    let mut m = serde_json::Map::new();
    m.insert("index".into(), json!(index));
    m.insert("collective".into(), json!(s.collective.kind().name()));
    m.insert("root".into(), json!(s.collective.root()));
    m.insert("min_bytes".into(), json!(entry.min_bytes));
    m.insert("max_bytes".into(), json!(entry.max_bytes));
    m.insert("algorithm".into(), json!(entry.algorithm));
    m.insert("protocol".into(), json!(entry.protocol.name()));
    m.insert("in_place".into(), json!(s.in_place));
    m.insert("ranks".into(), json!(s.nranks));
    m.insert("chunks".into(), json!(s.chunks));
    m.insert("channels".into(), json!(entry.channel_count()));
    m.insert("steps".into(), json!(entry.step_count()));
    m
}

fn error_json(e: &VerifyError) -> Value {
    json!({
        "kind": e.kind.name(),
        "rank": e.at.map(|a| a.rank),
        "stream": e.at.map(|a| a.stream),
        "step": e.at.map(|a| a.step),
        "channel": e.channel,
        "message": e.message,
        "text": e.to_string(),
    })
}

fn report_json(r: &Report) -> Value {
    json!({
        "streams": r.streams,
        "connections": r.connections,
        "messages": r.messages,
        "chunks_sent": r.chunks_sent,
        "reductions": r.reductions,
        "depth": r.depth,
    })
}

pub fn verify(args: VerifyArgs) -> Result<(), CliError> {
    if let Some(rank) = args.rank {
        return verify_rank(&args, rank);
    }
    // Symmetric entries stay templates: they are verified on the template, never expanded.
    let plan = load_plan_as(&args.plan, PlanFile::load_compact)?;
    let path = args.plan.display().to_string();
    // Entries side by side on the machine's cores.
    let results = hccl_compiler::search::par_map(&plan.entries, verify_entry);
    let steps: usize = plan.entries.iter().map(PlanEntry::step_count).sum();
    let collectives: BTreeSet<&str> = plan
        .entries
        .iter()
        .map(|e| e.schedule.collective.kind().name())
        .collect();
    let failed = results.iter().filter(|r| r.is_err()).count();
    let errors: usize = results
        .iter()
        .map(|r| r.as_ref().err().map_or(0, Vec::len))
        .sum();

    // Entries the compiler sealed as verified (a job loading the plan skips them).
    let sealed = plan.sealed();
    if args.json {
        let entries: Vec<Value> = plan
            .entries
            .iter()
            .zip(&results)
            .enumerate()
            .map(|(i, (entry, result))| {
                let mut m = entry_json(i, entry);
                m.insert("ok".into(), json!(result.is_ok()));
                m.insert("sealed".into(), json!(sealed[i]));
                match result {
                    Ok(report) => {
                        m.insert("report".into(), report_json(report));
                        m.insert("errors".into(), json!([]));
                    }
                    Err(errs) => {
                        m.insert(
                            "errors".into(),
                            Value::Array(errs.iter().map(error_json).collect()),
                        );
                    }
                }
                Value::Object(m)
            })
            .collect();
        print_json(&json!({
            "plan": path,
            "ok": failed == 0,
            "entries": entries,
            "summary": {
                "entries": plan.entries.len(),
                "failed_entries": failed,
                "sealed_entries": sealed.iter().filter(|s| **s).count(),
                "errors": errors,
                "steps": steps,
                "collectives": collectives,
            },
        }));
    } else if failed == 0 {
        println!(
            "{path}: ok: {}, {steps} steps, collectives: {}",
            entries_text(plan.entries.len()),
            collectives.into_iter().collect::<Vec<_>>().join(", ")
        );
        for (i, (entry, result)) in plan.entries.iter().zip(&results).enumerate() {
            if let Ok(r) = result {
                println!(
                    "  entry {i} ({}): {} ranks, {} streams, {} steps, {} messages, depth {}",
                    entry_label(entry),
                    entry.schedule.nranks,
                    r.streams,
                    entry.step_count(),
                    r.messages,
                    r.depth
                );
            }
        }
    } else {
        print_entry_errors(plan.entries.iter().zip(&results));
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{path}: {failed} of {} entries do not verify ({errors} errors)",
            plan.entries.len()
        )))
    }
}

/// Every error of every entry, one line each: `entry I (LABEL): ERROR`.
fn print_entry_errors<'a, T: 'a>(
    entries: impl Iterator<Item = (&'a PlanEntry, &'a Result<T, Vec<VerifyError>>)>,
) {
    for (i, (entry, result)) in entries.enumerate() {
        if let Err(errs) = result {
            for e in errs {
                println!("entry {i} ({}): {e}", entry_label(entry));
            }
        }
    }
}

/// Milliseconds between two instants.
fn ms(from: Instant, to: Instant) -> f64 {
    (to - from).as_secs_f64() * 1e3
}

/// `hcclc verify PLAN --rank R`: what rank `R` of a job checks at start (see
/// [`hccl_ir::PlanPart`]), timed.
fn verify_rank(args: &VerifyArgs, rank: u32) -> Result<(), CliError> {
    let path = args.plan.display().to_string();
    if is_xml(&args.plan) {
        return Err(CliError::Input(format!(
            "{path}: --rank checks a plan file (RON); import the MSCCL algorithm first (`hcclc import`)"
        )));
    }
    let start = Instant::now();
    let part = PlanFile::load_for_ranks(&args.plan, &[rank]).map_err(plan_error)?;
    let loaded = Instant::now();
    let sealed = part.sealed();
    let results: Vec<Result<(), Vec<VerifyError>>> = part
        .plan
        .entries
        .iter()
        .map(|e| check_rank(&e.schedule, rank))
        .collect();
    let checked = Instant::now();
    let plan = &part.plan;
    let failed = results.iter().filter(|r| r.is_err()).count();
    let unsealed = sealed.iter().filter(|s| !**s).count();
    let steps: usize = plan
        .entries
        .iter()
        .map(|e| {
            e.schedule.ranks[rank as usize]
                .streams
                .iter()
                .map(|s| s.steps.len())
                .sum::<usize>()
        })
        .sum();
    let timings = json!({
        "load_ms": ms(start, loaded),
        "checks_ms": ms(loaded, checked),
        "total_ms": ms(start, checked),
    });
    if args.json {
        let entries: Vec<Value> = plan
            .entries
            .iter()
            .zip(&results)
            .enumerate()
            .map(|(i, (entry, result))| {
                let mut m = entry_json(i, entry);
                m.remove("steps");
                m.remove("channels");
                let prog = &entry.schedule.ranks[rank as usize];
                m.insert("rank_streams".into(), json!(prog.streams.len()));
                m.insert(
                    "rank_steps".into(),
                    json!(prog.streams.iter().map(|s| s.steps.len()).sum::<usize>()),
                );
                m.insert("ok".into(), json!(result.is_ok()));
                m.insert("sealed".into(), json!(sealed[i]));
                let errors = result
                    .as_ref()
                    .err()
                    .map_or(Vec::new(), |errs| errs.iter().map(error_json).collect());
                m.insert("errors".into(), Value::Array(errors));
                Value::Object(m)
            })
            .collect();
        print_json(&json!({
            "plan": path,
            "rank": rank,
            "ok": failed == 0,
            "identity": part.identity(),
            "timings": timings,
            "entries": entries,
            "summary": {
                "entries": plan.entries.len(),
                "failed_entries": failed,
                "sealed_entries": plan.entries.len() - unsealed,
                "unsealed_entries": unsealed,
                "rank_steps": steps,
            },
        }));
    } else {
        print_entry_errors(plan.entries.iter().zip(&results));
        if failed == 0 {
            println!(
                "{path}: rank {rank}: ok: {}, {} sealed, {steps} steps; {:.2} ms (load and seals {:.2}, checks {:.2})",
                entries_text(plan.entries.len()),
                plan.entries.len() - unsealed,
                ms(start, checked),
                ms(start, loaded),
                ms(loaded, checked),
            );
        }
        if unsealed > 0 {
            println!(
                "{unsealed} of {} entries are not sealed: a job verifies them on the whole plan when it starts (`hcclc verify {path}`)",
                plan.entries.len()
            );
        }
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{path}: rank {rank}: {failed} of {} entries fail the rank's checks",
            plan.entries.len()
        )))
    }
}

/// The compact text form of a step: `rrcs from 3 to 5 i[4]->i[4] x1 deps [s1:2]`.
fn step_text(step: &Step) -> String {
    let op = step.op;
    let mut out = op.mnemonic().to_string();
    if let Some(from) = op.recv_peer() {
        out.push_str(&format!(" from {from}"));
    }
    if let Some(to) = op.send_peer() {
        out.push_str(&format!(" to {to}"));
    }
    match (op.src(), op.dst()) {
        (Some(src), Some(dst)) => out.push_str(&format!(" {src}->{dst}")),
        (Some(src), None) => out.push_str(&format!(" {src}->")),
        (None, Some(dst)) => out.push_str(&format!(" ->{dst}")),
        (None, None) => {}
    }
    out.push_str(&format!(" x{}", step.count));
    if !step.deps.is_empty() {
        let deps: Vec<String> = step
            .deps
            .iter()
            .map(|d| format!("s{}:{}", d.stream, d.step))
            .collect();
        out.push_str(&format!(" deps [{}]", deps.join(", ")));
    }
    out
}

pub fn show(args: ShowArgs) -> Result<(), CliError> {
    let plan = load_plan(&args.plan)?;
    let path = args.plan.display().to_string();
    if args.json {
        let entries: Vec<Value> = plan
            .entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let mut m = entry_json(i, entry);
                let programs: Vec<Value> = entry
                    .schedule
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(r, prog)| {
                        json!({
                            "rank": r,
                            "scratch_chunks": prog.scratch_chunks,
                            "streams": prog.streams.iter().enumerate().map(|(si, st)| json!({
                                "stream": si,
                                "channel": st.channel,
                                "steps": st.steps.iter().map(step_text).collect::<Vec<_>>(),
                            })).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                m.insert("programs".into(), Value::Array(programs));
                Value::Object(m)
            })
            .collect();
        print_json(&json!({
            "plan": path,
            "format_version": plan.format_version,
            "meta": {
                "topology": plan.meta.topology,
                "topology_hash": plan.meta.topology_hash,
                "compiler": plan.meta.compiler,
            },
            "entries": entries,
        }));
        return Ok(());
    }
    println!(
        "plan {path}: format {}, topology {}, compiler {}, {}",
        plan.format_version,
        plan.meta.topology,
        plan.meta.compiler,
        entries_text(plan.entries.len())
    );
    for (i, entry) in plan.entries.iter().enumerate() {
        let s = &entry.schedule;
        println!(
            "entry {i}: {} {} {} {}: {} ranks, {} chunks, {} channels, {} steps, {}",
            s.collective,
            fmt_range(entry),
            entry.algorithm,
            entry.protocol,
            s.nranks,
            s.chunks,
            s.channel_count(),
            s.step_count(),
            if s.in_place {
                "in place"
            } else {
                "out of place"
            }
        );
        for (r, prog) in s.ranks.iter().enumerate() {
            if prog.scratch_chunks > 0 {
                println!("  rank {r} (scratch {} chunks):", prog.scratch_chunks);
            } else {
                println!("  rank {r}:");
            }
            for (si, st) in prog.streams.iter().enumerate() {
                println!("    stream {si} (channel {}):", st.channel);
                for (k, step) in st.steps.iter().enumerate() {
                    println!("      {k}: {}", step_text(step));
                }
            }
        }
    }
    Ok(())
}
