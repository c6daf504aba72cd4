//! `hccl-perf --calibrate OUT.ron`: measures every algorithm family that applies on this
//! machine, fits the cost model to what it measured (`hccl::compiler::cost::calibrate`) and
//! writes the calibrated topology, so that plans compiled for it predict this machine.
//!
//! Each family is compiled alone into a plan file and run by a child `hccl-perf --json
//! --plan FILE` with the caller's backend, ranks, sizes and time budget; the rows name the
//! plan entry that ran, whose schedule the fit simulates.

use crate::args::{Args, Backend, Failure, nominal_sizes, parse_choice};
use hccl::compiler::cost::CostModel;
use hccl::compiler::cost::calibrate::{self, Measurements};
use hccl::compiler::families::all_families;
use hccl::compiler::search;
use hccl::ir::PlanFile;
use hccl::topologies::{Calibration, Topology, TopologySpec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One family's plan and its measurements (one set of rows per repetition).
struct Run {
    family: String,
    plan: PlanFile,
    path: PathBuf,
    reps: Vec<Vec<serde_json::Value>>,
}

pub(crate) fn run(args: &Args, out: &Path) -> Result<(), Failure> {
    let (coll, _, _) = parse_choice(args)?;
    let n = args.ranks;
    if n < 2 {
        return Err(Failure::Usage(
            "--calibrate needs -g 2 or more ranks".into(),
        ));
    }
    let topo = base_topology(args, n)?;
    let sizes = nominal_sizes(args)?;
    let families: Vec<String> = all_families()
        .iter()
        .filter(|f| f.supports(coll.kind()))
        .map(|f| f.name().to_string())
        .collect();
    let reps = args.reps.max(1) as usize;
    let bar = indicatif::ProgressBar::new((2 * families.len() * (reps + 1)) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let source = format!(
        "hccl-perf --calibrate: {} on {n} ranks ({} backend), host {}, {}",
        coll.kind().name(),
        match args.backend {
            Backend::Threads => "threads",
            Backend::Process => "process",
        },
        hostname(),
        today()
    );
    // Round 1 measures the plans the uncalibrated model compiles; round 2 those the model
    // fitted to round 1 compiles (more channels, other pipelines: what it would now pick),
    // and the final fit sees both.
    let mut gathered: Measurements<(usize, String, u64)> = Measurements::new();
    let mut skipped = Vec::new();
    let mut families_measured = 0;
    let cores = hccl::executor::affinity::allowed_cpus().len() as u32;
    let start = Calibration {
        cores: Some(cores.max(1)),
        ..Calibration::identity(&source)
    };
    let mut model = CostModel::uncalibrated_for(&topo).calibrated(&start);
    let mut report = None;
    for round in 1..=2 {
        let runs = measure_round(args, &topo, &model, &families, &sizes, reps, round, &bar)?;
        families_measured = families_measured.max(runs.0.len());
        if round == 1 {
            skipped = runs.1;
        }
        for run in &runs.0 {
            for (entry, bytes, time) in fastest(&run.reps) {
                let Some(e) = run.plan.entries.get(entry as usize) else {
                    continue; // a control entry the child added: not this family's
                };
                let key = (round, run.family.clone(), entry);
                gathered.add(key, e, bytes, time, run.family.clone());
            }
        }
        let fitted = calibrate::fit(
            &topo_with(&topo, &start),
            &gathered.schedules,
            &gathered.observations,
            &source,
        )
        .map_err(|e| Failure::Runtime(format!("cannot fit the measurements: {e}")))?;
        model = CostModel::uncalibrated_for(&topo).calibrated(&fitted.calibration);
        report = Some(fitted);
    }
    bar.finish_and_clear();
    let Some(report) = report else {
        return Err(Failure::Runtime("nothing measured".into()));
    };
    let mut spec: TopologySpec = topo.spec.clone();
    spec.calibration = Some(report.calibration.clone());
    if !spec.description.contains("calibrated") {
        spec.description = format!("{} (calibrated by hccl-perf)", spec.description);
    }
    // The file must build back (it is what users compile for).
    let text = hccl::topologies::to_ron(&spec);
    hccl::topologies::from_ron(&text, &out.display().to_string())
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    hccl::ir::write_atomic(out, text.as_bytes())
        .map_err(|e| Failure::Runtime(format!("{}: cannot write: {e}", out.display())))?;
    if args.json {
        let mut doc = report.to_json();
        doc["topology"] = serde_json::json!(out.display().to_string());
        doc["ranks"] = serde_json::json!(n);
        doc["collective"] = serde_json::json!(coll.kind().name());
        doc["skipped"] = serde_json::json!(skipped);
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    }
    println!(
        "# hccl-perf --calibrate: {} on {n} ranks; {} families measured",
        coll.kind().name(),
        families_measured
    );
    for s in &skipped {
        println!("# skipped: {s}");
    }
    print!("{}", report.table());
    let cal = &report.calibration;
    println!(
        "# fit: base latency x{}, per-message latency x{} (memory class), bandwidth x{:.2}..x{:.2} over sizes",
        cal.base_scale,
        cal.message_scale[0],
        cal.bandwidth
            .iter()
            .map(|k| k.1)
            .fold(f64::INFINITY, f64::min),
        cal.bandwidth.iter().map(|k| k.1).fold(0.0, f64::max)
    );
    println!(
        "# median |error|: {:.0}% before, {:.0}% after; {:.0}% of rows within ±25%",
        report.median_abs_error(false) * 100.0,
        report.median_abs_error(true) * 100.0,
        report.within(0.25) * 100.0
    );
    println!(
        "# wrote {} (compile for it: hcclc compile {0})",
        out.display()
    );
    Ok(())
}

/// `topo` carrying `cal` (the fit keeps what it does not fit, such as the cores).
fn topo_with(topo: &Topology, cal: &Calibration) -> Topology {
    let mut t = topo.clone();
    t.spec.calibration = Some(cal.clone());
    t
}

/// Compiles every family with `model` and measures each `reps` times, in turn; returns the
/// runs and the families that had no schedule.
#[allow(clippy::too_many_arguments)]
fn measure_round(
    args: &Args,
    topo: &Topology,
    model: &CostModel,
    families: &[String],
    sizes: &[u64],
    reps: usize,
    round: usize,
    bar: &indicatif::ProgressBar,
) -> Result<(Vec<Run>, Vec<String>), Failure> {
    let (coll, _, _) = parse_choice(args)?;
    let dir = std::env::temp_dir();
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for family in families {
        bar.set_message(format!("round {round}: compiling {family}"));
        let options = search::Options {
            collectives: vec![coll.kind()],
            sizes: search::geometric_sizes(8.min(args.min_bytes), args.max_bytes.max(8), 2),
            algorithms: Some(vec![family.clone()]),
            model: model.clone(),
            ..search::Options::default()
        };
        let plan = match search::compile(topo, &options) {
            Ok(c) => c.plan,
            Err(e) => {
                skipped.push(format!("{family} ({e})"));
                bar.inc(1 + reps as u64);
                continue;
            }
        };
        let path = dir.join(format!(
            "hccl-perf-calibrate-{}-{round}-{family}.plan.ron",
            std::process::id()
        ));
        plan.save(&path)
            .map_err(|e| Failure::Runtime(e.to_string()))?;
        runs.push(Run {
            family: family.clone(),
            plan,
            path,
            reps: Vec::new(),
        });
        bar.inc(1);
    }
    // Every family once per repetition, each repetition starting at another family, so that
    // a slow spell of the machine does not fall on one family only.
    let mut failure = None;
    'outer: for r in 0..reps {
        for k in 0..runs.len() {
            let i = (k + r) % runs.len();
            bar.set_message(format!(
                "round {round}: {} (repetition {})",
                runs[i].family,
                r + 1
            ));
            match measure(args, &runs[i].path, sizes) {
                Ok(rows) => runs[i].reps.push(rows),
                Err(e) => {
                    failure = Some(e);
                    break 'outer;
                }
            }
            bar.inc(1);
        }
    }
    for run in &runs {
        let _ = std::fs::remove_file(&run.path);
    }
    match failure {
        Some(e) => Err(e),
        None => Ok((runs, skipped)),
    }
}

/// The topology to calibrate: `--topo FILE` (its calibration dropped), else this machine as
/// a `host` of `n` ranks with the probed memory bandwidth.
fn base_topology(args: &Args, n: u32) -> Result<Topology, Failure> {
    let mut spec = match &args.topo {
        Some(path) => {
            let topo = hccl::topologies::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
            hccl::topologies::validate_ranks(&topo, n)
                .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
            topo.spec
        }
        None => {
            let mem_bw = hccl::topologies::probe::probe_host().per_rank_gbps(n);
            hccl::topologies::generate::host(n, mem_bw)
        }
    };
    spec.calibration = None;
    hccl::topologies::build(spec, "this machine").map_err(|e| Failure::Usage(e.to_string()))
}

/// Runs a child `hccl-perf --json --plan PLAN` with the caller's settings; returns its rows.
fn measure(args: &Args, plan: &Path, sizes: &[u64]) -> Result<Vec<serde_json::Value>, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::Runtime(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--backend")
        .arg(match args.backend {
            Backend::Threads => "threads",
            Backend::Process => "process",
        })
        .args(["-g", &args.ranks.to_string()])
        .args(["-c", &args.collective, "-d", &args.dtype, "-o", &args.op])
        .args(["-r", &args.root.to_string()])
        .args(["-b", &sizes[0].to_string()])
        .args(["-e", &sizes[sizes.len() - 1].to_string()])
        .args(["-f", &args.factor.to_string()])
        .args(["-w", &args.warmup.to_string()])
        .args(["-n", &args.iters.to_string()])
        .args(["--hosts", &args.hosts.to_string()])
        .arg("--json")
        .arg("--plan")
        .arg(plan)
        .env_remove("HCCL_ALGO")
        .env_remove("HCCL_PROTO");
    if let Some(t) = args.target {
        cmd.args(["-T", &t.to_string()]);
    }
    if args.in_place {
        cmd.arg("--in-place");
    }
    if args.no_bind {
        cmd.arg("--no-bind");
    }
    let output = cmd
        .output()
        .map_err(|e| Failure::Runtime(format!("cannot run hccl-perf: {e}")))?;
    if !output.status.success() {
        return Err(Failure::Runtime(format!(
            "measuring {} failed: {}",
            plan.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| Failure::Runtime(format!("unreadable hccl-perf output: {e}")))?;
    Ok(doc["rows"].as_array().cloned().unwrap_or_default())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Today's UTC date as `YYYY-MM-DD`.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Days to civil date (H. Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Per size, the entry that ran and the fastest time over the repetitions. Not the median:
/// on the shared development VM whole launches run 2.5-4× slower than others at random
/// (about one in four; latency and cache-resident bandwidth alike), so the fastest of a few
/// launches is the stable statistic of what the machine does.
fn fastest(reps: &[Vec<serde_json::Value>]) -> Vec<(u64, u64, f64)> {
    let mut by_size: std::collections::BTreeMap<(u64, u64), Vec<f64>> = Default::default();
    for rows in reps {
        for row in rows {
            if let (Some(entry), Some(bytes), Some(time)) = (
                row["entry"].as_u64(),
                row["bytes"].as_u64(),
                row["time_us"].as_f64(),
            ) {
                by_size.entry((bytes, entry)).or_default().push(time);
            }
        }
    }
    by_size
        .into_iter()
        .map(|((bytes, entry), times)| {
            let best = times.iter().copied().fold(f64::INFINITY, f64::min);
            (entry, bytes, best)
        })
        .collect()
}
