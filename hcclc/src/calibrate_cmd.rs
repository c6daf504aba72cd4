//! `hcclc calibrate TOPO --from RUN.json...`: fits the cost model of a topology (a shipped
//! machine or a file) to `hccl-perf --json` measurements of any machine (GPUs, a network,
//! CPU hosts) and writes the calibrated topology.
//!
//! Each JSON document must come from a run with `--plan FILE`: its rows name the plan entry
//! that ran, whose schedule the fit simulates; the plan is read from the `plan_file` the
//! document records (or `--plan`, for documents moved to another machine).

use crate::cli_error::{CliError, print_json};
use crate::compile_cmd::load_topology;
use clap::Args;
use hccl_compiler::cost::calibrate::{self, Measurements};
use hccl_ir::{Collective, CollectiveKind, PlanFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Topology file (RON) or the name of a shipped machine: what the measurements ran on.
    pub topo: String,
    /// `hccl-perf --json --plan FILE` output (repeatable; at least one).
    #[arg(long = "from", value_name = "RUN.json", required = true)]
    pub from: Vec<PathBuf>,
    /// The plan the runs used, when it is no longer where their `plan_file` says.
    #[arg(long, value_name = "PLAN")]
    pub plan: Option<PathBuf>,
    /// Output topology file; default `<topology stem>.calibrated.ron`.
    #[arg(short = 'o', long = "output", value_name = "TOPO")]
    pub output: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CalibrateArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.topo)?;
    let mut plans: HashMap<PathBuf, PlanFile> = HashMap::new();
    let mut gathered: Measurements<(PathBuf, String, usize)> = Measurements::new();
    for path in &args.from {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Input(format!("{}: cannot read: {e}", path.display())))?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            CliError::Input(format!(
                "{}:{}:{}: not JSON: {e}",
                path.display(),
                e.line(),
                e.column()
            ))
        })?;
        let field = |name: &str| CliError::Input(format!("{}: no `{name}` field", path.display()));
        let kind_name = doc["collective"]
            .as_str()
            .ok_or_else(|| field("collective"))?;
        let kind = CollectiveKind::from_name(kind_name).ok_or_else(|| {
            CliError::Input(format!(
                "{}: collective: unknown `{kind_name}`",
                path.display()
            ))
        })?;
        let ranks = doc["ranks"].as_u64().ok_or_else(|| field("ranks"))?;
        if ranks != u64::from(topo.nranks()) {
            return Err(CliError::Input(format!(
                "{}: measured on {ranks} ranks, but {} has {}",
                path.display(),
                topo.name,
                topo.nranks()
            )));
        }
        let plan_path = match (&args.plan, doc["plan_file"].as_str()) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => PathBuf::from(p),
            (None, None) => {
                return Err(CliError::Input(format!(
                    "{}: the run names no plan file (plan_file is null: hccl-perf compiled its \
                     own); rerun hccl-perf with --plan FILE, or give --plan",
                    path.display()
                )));
            }
        };
        // Broadcast and Reduce ran at the run's root, which the plan's entries are derived
        // for: a run that does not say which is refused rather than read as root 0.
        let root = match (kind, &doc["root"]) {
            (CollectiveKind::Broadcast | CollectiveKind::Reduce, serde_json::Value::Null) => {
                return Err(CliError::Input(format!(
                    "{}: no `root` field: a {kind_name} run must say its root (hccl-perf --json \
                     writes it; add \"root\": R, the -r the run used)",
                    path.display()
                )));
            }
            (CollectiveKind::Broadcast | CollectiveKind::Reduce, value) => {
                let root = value.as_u64().filter(|&r| r < ranks).ok_or_else(|| {
                    CliError::Input(format!(
                        "{}: root: `{value}` is not a rank of the {ranks} ranks",
                        path.display()
                    ))
                })?;
                root as u32
            }
            _ => 0,
        };
        let collective = collective_of(kind, root);
        if !plans.contains_key(&plan_path) {
            let mut plan = crate::compile_cmd::load_plan_or_xml(&plan_path)?;
            plan.ensure_root(collective);
            plans.insert(plan_path.clone(), plan);
        }
        let plan = &plans[&plan_path];
        let rows = doc["rows"].as_array().ok_or_else(|| field("rows"))?;
        for (i, row) in rows.iter().enumerate() {
            let at = |what: &str| CliError::Input(format!("{}: rows[{i}]: {what}", path.display()));
            let bytes = row["bytes"].as_u64().ok_or_else(|| at("no `bytes`"))?;
            let time = row["time_us"].as_f64().ok_or_else(|| at("no `time_us`"))?;
            let entry = row["entry"]
                .as_u64()
                .ok_or_else(|| at("no `entry` (hccl-perf older than calibration?)"))?
                as usize;
            let e = plan.entries.get(entry).ok_or_else(|| {
                at(&format!(
                    "entry {entry} is not in {} ({} entries)",
                    plan_path.display(),
                    plan.entries.len()
                ))
            })?;
            if e.schedule.nranks != topo.nranks() {
                return Err(at(&format!(
                    "entry {entry} is for {} ranks",
                    e.schedule.nranks
                )));
            }
            gathered.add(
                (plan_path.clone(), kind_name.to_string(), entry),
                e,
                bytes,
                time,
                format!("{}/{}", e.algorithm, kind_name),
            );
        }
    }
    let source = format!(
        "hcclc calibrate from {}",
        args.from
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let report = calibrate::fit(&topo, &gathered.schedules, &gathered.observations, &source)
        .map_err(CliError::input)?;
    let mut spec = topo.spec.clone();
    spec.calibration = Some(report.calibration.clone());
    let out = args.output.clone().unwrap_or_else(|| {
        let stem = Path::new(&args.topo)
            .file_stem()
            .map_or_else(|| topo.name.clone(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("{stem}.calibrated.ron"))
    });
    let text = hccl_topologies::to_ron(&spec);
    hccl_topologies::from_ron(&text, &out.display().to_string())
        .map_err(|e| CliError::Failed(format!("the calibrated topology does not build: {e}")))?;
    hccl_ir::write_atomic(&out, text.as_bytes())
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", out.display())))?;
    if args.json {
        let mut doc = report.to_json();
        doc["topology"] = serde_json::json!(out.display().to_string());
        print_json(&doc);
        return Ok(());
    }
    print!("{}", report.table());
    println!(
        "median |error| {:.0}% before, {:.0}% after; {:.0}% of rows within ±25%",
        report.median_abs_error(false) * 100.0,
        report.median_abs_error(true) * 100.0,
        report.within(0.25) * 100.0
    );
    println!("wrote {}", out.display());
    Ok(())
}

fn collective_of(kind: CollectiveKind, root: u32) -> Collective {
    match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllToAll => Collective::AllToAll,
        CollectiveKind::Broadcast => Collective::Broadcast { root },
        CollectiveKind::Reduce => Collective::Reduce { root },
    }
}
