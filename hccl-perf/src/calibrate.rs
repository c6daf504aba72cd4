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
use hccl::compiler::search;
use hccl::compiler::search::all_families;
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
    let bar = indicatif::ProgressBar::new((3 * families.len() * (reps + 1)) as u64);
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
    // and the fit after it sees both. Round 3 measures the families whose plans under that
    // fit still hold a schedule never measured, so that the calibrated model's own choices
    // have been seen by its fit (on the development VM, a model fitted to two rounds picked
    // 4-channel rings at 128 B that it had never measured, and predicted them 2.2x too fast).
    // A schedule measured in more than one round pools its launches.
    let mut pool = Pool::default();
    let mut skipped = Vec::new();
    let mut families_measured = 0;
    let cores = hccl::executor::affinity::allowed_cpus().len() as u32;
    let start = Calibration {
        cores: Some(cores.max(1)),
        ..Calibration::identity(&source)
    };
    let mut model = CostModel::uncalibrated_for(&topo).calibrated(&start);
    let mut report = None;
    for round in 1..=3 {
        let known = (round == 3).then_some(&pool);
        let runs = measure_round(
            args, &topo, &model, &families, &sizes, reps, round, known, &bar,
        )?;
        if round == 3 && runs.0.is_empty() {
            break;
        }
        families_measured = families_measured.max(runs.0.len());
        if round == 1 {
            skipped = runs.1;
        }
        for run in &runs.0 {
            pool.add(run);
        }
        let gathered = pool.measurements();
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
/// runs and the families that had no schedule. With `known`, a family whose plan holds no
/// schedule `known` lacks is not measured.
#[allow(clippy::too_many_arguments)]
fn measure_round(
    args: &Args,
    topo: &Topology,
    model: &CostModel,
    families: &[String],
    sizes: &[u64],
    reps: usize,
    round: usize,
    known: Option<&Pool>,
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
        if known.is_some_and(|pool| pool.holds(family, &plan, sizes)) {
            bar.inc(1 + reps as u64);
            continue;
        }
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

/// Every launch's time per family, schedule and size, over the rounds (a schedule that more
/// than one round compiled counts the launches of each), in the order first measured.
#[derive(Default)]
struct Pool {
    rows: Vec<(String, hccl::ir::PlanEntry, u64, Vec<f64>)>,
    index: std::collections::HashMap<(String, hccl::ir::Protocol, hccl::ir::Schedule, u64), usize>,
}

impl Pool {
    fn add(&mut self, run: &Run) {
        for rows in &run.reps {
            for row in rows {
                let (Some(entry), Some(bytes), Some(time)) = (
                    row["entry"].as_u64(),
                    row["bytes"].as_u64(),
                    row["time_us"].as_f64(),
                ) else {
                    continue;
                };
                let Some(e) = run.plan.entries.get(entry as usize) else {
                    continue; // a control entry the child added: not this family's
                };
                let key = (run.family.clone(), e.protocol, e.schedule.clone(), bytes);
                let rows = &mut self.rows;
                let i = *self.index.entry(key).or_insert_with(|| {
                    rows.push((run.family.clone(), e.clone(), bytes, Vec::new()));
                    rows.len() - 1
                });
                rows[i].3.push(time);
            }
        }
    }

    /// Whether every entry of `family`'s `plan` that runs at one of `sizes` has been measured
    /// (at some size).
    fn holds(&self, family: &str, plan: &PlanFile, sizes: &[u64]) -> bool {
        let runs = |e: &&hccl::ir::PlanEntry| sizes.iter().any(|&b| e.covers(b));
        plan.entries.iter().filter(runs).all(|e| {
            self.rows.iter().any(|(f, m, _, _)| {
                f == family && m.protocol == e.protocol && m.schedule == e.schedule
            })
        })
    }

    /// What the fit sees: per family, schedule and size, the typical launch
    /// ([`typical_time`]), labelled with the family.
    fn measurements(&self) -> Measurements<(String, hccl::ir::Protocol, hccl::ir::Schedule)> {
        let mut m = Measurements::new();
        for (family, e, bytes, times) in &self.rows {
            let key = (family.clone(), e.protocol, e.schedule.clone());
            m.add(key, e, *bytes, typical_time(times.clone()), family.clone());
        }
        m
    }
}

/// Launches slower than this factor times the fastest of theirs fell in a slow spell of the
/// machine and do not count (see [`typical_time`]; `scripts/fidelity.sh` judges by the same).
const SPELL_FACTOR: f64 = 1.75;

/// What a launch typically takes: the median of the launches that ran within
/// [`SPELL_FACTOR`] of the fastest (the mean of the middle two for an even count); `times` is not empty. Users
/// compare predictions with medians over launches (`hccl-perf` sweeps,
/// `scripts/bench-vs-mpi.sh`), and the fastest launch alone made predictions 1.25-1.5x
/// optimistic from 8 KiB to 128 KiB. Launches further off are dropped: the shared
/// development VM has spells, often tens of seconds long, in which whole launches run 1.9-4x
/// slower (its two vCPUs' core-to-core traffic slows; docs/benchmarks.md), while its launches
/// outside them spread by up to 1.5x. A spell can cover a whole round: that is why the
/// rounds' launches of a schedule are pooled.
fn typical_time(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    let fastest = times[0];
    times.retain(|t| *t <= SPELL_FACTOR * fastest);
    let n = times.len();
    if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::typical_time;

    #[test]
    fn typical_time_is_the_median_of_the_launches_near_the_fastest() {
        let cases: [(&[f64], f64); 6] = [
            (&[3.0], 3.0),
            (&[5.0, 3.0, 4.0], 4.0),
            (&[4.0, 3.0, 5.0, 5.2], 4.5),
            // Launches in a slow spell (over 1.75x the fastest) do not count, even as the
            // majority.
            (&[10.0, 2.0, 9.0, 2.5, 11.0], 2.25),
            (&[1.0, 1.5, 1.8], 1.25),
            (&[1.0, 1.75], 1.375),
        ];
        for (times, want) in cases {
            let got = typical_time(times.to_vec());
            assert!((got - want).abs() < 1e-12, "{times:?}: {got}, want {want}");
        }
    }
}
