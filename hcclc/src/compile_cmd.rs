//! `hcclc compile` and `hcclc explain`: compile a topology into a plan, or explain an existing
//! plan, as a table (or JSON) of predicted time, bandwidth, NCCL baseline and lower bound.

use crate::cli_error::{CliError, print_json};
use clap::Args;
use hccl_compiler::families::Candidate;
use hccl_compiler::report::{self, ReportError, row_json, table};
use hccl_compiler::search::{
    self, CompiledPlan, DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, Options, Progress, Row, SearchError,
    SearchReport, plan_cache,
};
use hccl_compiler::synth::SynthLevel;
use hccl_ir::units::format_bytes;
use hccl_ir::{CollectiveKind, PlanFile};
use hccl_topologies::Topology;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// Topology file (RON) or the name of a shipped machine (e.g. dgx1-v100).
    pub topo: String,
    /// Collectives to compile, comma-separated (allreduce,allgather,reducescatter,broadcast,
    /// reduce,alltoall); default all.
    #[arg(short = 'c', long = "collectives", value_name = "LIST")]
    pub collectives: Option<String>,
    /// Size range MIN..MAX (bytes; K, M, G = powers of 1024), factor 2; default 1K..4G.
    #[arg(long, value_name = "MIN..MAX")]
    pub sizes: Option<String>,
    /// Only consider these algorithms (comma-separated family names).
    #[arg(long, value_name = "NAME")]
    pub algo: Option<String>,
    /// Only consider these protocols (comma-separated: LL, LL128, Simple); default every
    /// protocol the target's executor implements (CPU hosts: LL and Simple).
    #[arg(long, value_name = "LIST")]
    pub proto: Option<String>,
    /// Output plan file; default `<topology stem>.plan.ron` in the current directory.
    #[arg(short = 'o', long = "output", value_name = "PLAN")]
    pub output: Option<PathBuf>,
    /// MSCCL algorithms (XML) or plan files that join the search as candidates (repeatable).
    #[arg(long = "with", value_name = "ALGO.xml")]
    pub with: Vec<PathBuf>,
    /// Synthesizers in the search: off (hand-written families only), auto (those that fit
    /// a compile of a few seconds) or full (every synthesizer at every size it solves).
    #[arg(long, default_value = "auto", value_name = "off|auto|full")]
    pub synth: String,
    /// Steps simulated per candidate and protocol over all sizes (default 400000, shrinking
    /// as 64/ranks beyond 64 ranks). Larger schedules are simulated at fewer sizes and
    /// interpolated; where even the cheapest schedule of NCCL's algorithm gets fewer than 3
    /// sizes, the `nccl` column is NCCL's own formula, marked `(model)`. Larger is slower and
    /// simulates more.
    #[arg(long, value_name = "STEPS", value_parser = clap::value_parser!(u64).range(1..))]
    pub sim_budget: Option<u64>,
    /// Print one JSON document instead of the table (with the search's report, as
    /// `search_report`).
    #[arg(long)]
    pub json: bool,
    /// Print the search's report on stderr: per collective and phase (generate, screen,
    /// cost, refine, select and verify, emit) the candidates in and out, the wall time and
    /// why candidates stopped.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Neither read nor write the caches in $HCCL_CACHE_DIR, else $XDG_CACHE_HOME/hccl, else
    /// ~/.cache/hccl: the synthesis cache (solver results kept between compiles; every
    /// synthesizer solves again) and the plan cache (whole compiles, keyed by the topology,
    /// the options and this build of hcclc; the search runs again). The plan is the same
    /// either way.
    #[arg(long)]
    pub no_cache: bool,
}

/// Loads a plan file or imports an MSCCL algorithm (by its `.xml` extension).
pub fn load_plan_or_xml(path: &Path) -> Result<PlanFile, CliError> {
    let is_xml = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"));
    if is_xml {
        Ok(hccl_ir::msccl::load_xml(path)
            .map_err(CliError::input)?
            .into_plan(&path.display().to_string()))
    } else {
        PlanFile::load(path).map_err(CliError::input)
    }
}

/// What identifies the `--with` files for the plan cache: their contents, in order.
fn with_identity(paths: &[PathBuf]) -> Result<Vec<u8>, CliError> {
    let mut out = Vec::new();
    for path in paths {
        let bytes = std::fs::read(path)
            .map_err(|e| CliError::Input(format!("{}: cannot read: {e}", path.display())))?;
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

/// External candidates from `--with` files: each must fit the topology's rank count and
/// verify, or the command stops with the reason.
fn external_candidates(paths: &[PathBuf], topo: &Topology) -> Result<Vec<Candidate>, CliError> {
    let mut out = Vec::new();
    for path in paths {
        let plan = load_plan_or_xml(path)?;
        for (i, entry) in plan.entries.into_iter().enumerate() {
            if entry.schedule.nranks != topo.nranks() {
                return Err(CliError::Input(format!(
                    "{}: entry {i} is for {} ranks but {} has {}",
                    path.display(),
                    entry.schedule.nranks,
                    topo.name,
                    topo.nranks()
                )));
            }
            if let Err(errors) = hccl_ir::verify::verify_entry(&entry) {
                return Err(CliError::Failed(format!(
                    "{}: entry {i} does not verify: {}",
                    path.display(),
                    errors[0]
                )));
            }
            out.push(Candidate::imported(entry));
        }
    }
    Ok(out)
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Plan file (RON) or MSCCL algorithm (.xml).
    pub plan: PathBuf,
    /// Topology (file or shipped name); default: the plan's topology among shipped machines.
    #[arg(long, value_name = "TOPO")]
    pub topo: Option<String>,
    /// Size range MIN..MAX (bytes; K, M, G = powers of 1024), factor 2; default 1K..4G.
    #[arg(long, value_name = "MIN..MAX")]
    pub sizes: Option<String>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the table as an SVG chart: bus bandwidth against size per collective, the
    /// plan's, NCCL's choice and the lower bound (all predicted by the same model).
    #[arg(long, value_name = "FILE.svg", conflicts_with = "trace")]
    pub plot: Option<PathBuf>,
    /// Write the predicted timeline of one call (--size) as Chrome trace-event JSON (open in
    /// Perfetto or chrome://tracing): a process per rank, a thread per stream, a slice per
    /// step with its op, peer and bytes; and a process of counter tracks, the utilisation of
    /// the busiest links over time (--links).
    #[arg(long, value_name = "FILE", requires = "size")]
    pub trace: Option<PathBuf>,
    /// The call size the trace shows (bytes; K, M, G = powers of 1024).
    #[arg(long, value_name = "SIZE", requires = "trace")]
    pub size: Option<String>,
    /// The collective the trace shows, when the plan has several.
    #[arg(long, value_name = "NAME", requires = "trace")]
    pub collective: Option<String>,
    /// How many of the busiest links and NIC directions the trace shows as counter tracks
    /// of their utilisation over time (0: none).
    #[arg(long, value_name = "N", default_value_t = 8, requires = "trace")]
    pub links: usize,
}

/// Parses `1024`, `4K`, `16M`, `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, CliError> {
    hccl_ir::units::parse_bytes(text).ok_or_else(|| {
        CliError::Input(format!(
            "bad size `{text}` (expected e.g. 4096, 64K, 1M, 2G)"
        ))
    })
}

/// Parses `MIN..MAX` (or a single size) into the bucket edges, factor 2.
pub fn parse_sizes(text: Option<&str>) -> Result<Vec<u64>, CliError> {
    let (min, max) = match text {
        None => (DEFAULT_MIN_BYTES, DEFAULT_MAX_BYTES),
        Some(t) => match t.split_once("..") {
            Some((a, b)) => (parse_size(a)?, parse_size(b)?),
            None => {
                let v = parse_size(t)?;
                (v, v)
            }
        },
    };
    if min == 0 || min > max {
        return Err(CliError::Input(format!(
            "bad size range {min}..{max}: need 0 < MIN <= MAX"
        )));
    }
    Ok(search::geometric_sizes(min, max, 2))
}

/// Parses `--proto LL,Simple` (every protocol when absent).
pub fn parse_protocols(text: Option<&str>) -> Result<Vec<hccl_ir::Protocol>, CliError> {
    match text {
        Some(text) => hccl_ir::Protocol::parse_list(text)
            .map_err(|e| CliError::Input(format!("--proto: {e}"))),
        None => Ok(hccl_ir::Protocol::ALL.to_vec()),
    }
}

fn parse_collectives(text: Option<&str>) -> Result<Vec<CollectiveKind>, CliError> {
    let Some(text) = text else {
        return Ok(CollectiveKind::ALL.to_vec());
    };
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let kind = CollectiveKind::from_name(name).ok_or_else(|| {
            CliError::Input(format!(
                "unknown collective `{name}` (known: allreduce, allgather, reducescatter, \
                 broadcast, reduce, alltoall)"
            ))
        })?;
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    if out.is_empty() {
        return Err(CliError::Input("no collective given to -c".into()));
    }
    Ok(out)
}

/// Where a topology given as `spec` was read (the calibration line of a prediction).
pub fn topology_origin(spec: &str) -> String {
    if Path::new(spec).exists() {
        spec.to_string()
    } else {
        format!("the shipped machine {spec}")
    }
}

/// A topology from a file path, or a shipped machine's name (`hccl_topologies::load_spec`).
pub fn load_topology(spec: &str) -> Result<Topology, CliError> {
    hccl_topologies::load_spec(spec).map_err(|err| match err {
        hccl_topologies::TopologyError::UnknownShipped { .. } => {
            CliError::Input(format!("{spec}: no such file, and {err}"))
        }
        err => CliError::input(err),
    })
}

fn search_error(err: SearchError) -> CliError {
    match err {
        SearchError::BadOptions(_) => CliError::Input(err.to_string()),
        SearchError::NoCandidate { .. } | SearchError::Cancelled => {
            CliError::Failed(err.to_string())
        }
    }
}

/// A progress bar on stderr when it is a terminal.
fn progress_bar() -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

/// The search's options for `args` on `topo`.
fn compile_options(args: &CompileArgs, topo: &Topology) -> Result<Options, CliError> {
    Ok(Options {
        collectives: parse_collectives(args.collectives.as_deref())?,
        sizes: parse_sizes(args.sizes.as_deref())?,
        algorithms: args.algo.as_deref().map(|a| {
            a.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        }),
        extra: external_candidates(&args.with, topo)?,
        model: hccl_compiler::cost::CostModel::for_topology(topo),
        protocols: parse_protocols(args.proto.as_deref())?,
        synth: SynthLevel::from_name(&args.synth).ok_or_else(|| {
            CliError::Input(format!(
                "--synth {}: expected off, auto or full",
                args.synth
            ))
        })?,
        // A collective nothing schedules (at thousands of ranks) is left out of the plan,
        // which is still written; the command then exits 1 naming it.
        partial: true,
        sim_budget: args.sim_budget.map_or(Options::default().sim_budget, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        }),
        cancel: None,
        cache_dir: if args.no_cache {
            None
        } else {
            hccl_compiler::synth::cache::default_dir()
        },
    })
}

pub fn compile(args: CompileArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.topo)?;
    let options = compile_options(&args, &topo)?;
    let out = args.output.clone().unwrap_or_else(|| {
        let stem = Path::new(&args.topo)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| topo.name.clone());
        PathBuf::from(format!("{stem}.plan.ron"))
    });
    let write_plan = |text: &str| {
        hccl_ir::write_atomic(&out, text.as_bytes())
            .map_err(|e| CliError::Input(format!("{}: cannot write the plan: {e}", out.display())))
    };
    // The plan cache: the same topology, options and build of hcclc compiled before.
    let cache = match &options.cache_dir {
        Some(dir) => plan_cache::key(&topo, &options, Some(&with_identity(&args.with)?))
            .map(|key| (dir.clone(), key)),
        None => None,
    };
    if let Some((dir, key)) = &cache
        && let Some(hit) = plan_cache::load(dir, key)
    {
        write_plan(&hit.plan_text)?;
        if args.verbose {
            eprintln!(
                "plan cache: hit, entry {key} in {} (an earlier compile of this topology with \
                 these options by this build; --no-cache searches again)",
                dir.join(plan_cache::AREA).display()
            );
        }
        report(
            &out,
            (&topo, &topology_origin(&args.topo)),
            &hit.rows,
            args.json,
            Some((&hit.report, "hit")),
        );
        return Ok(());
    }
    let clock_stops = hccl_compiler::clock::clock_stops();
    let bar = progress_bar();
    // Candidates costed over those generated, summed over the collectives reported so far
    // (small machines compile them side by side, so reports of several interleave).
    let mut seen: Vec<(CollectiveKind, usize, usize)> = Vec::new();
    let mut on_progress = |p: Progress| {
        if let Some(bar) = &bar {
            match seen.iter_mut().find(|s| s.0 == p.collective) {
                Some(s) => (s.1, s.2) = (p.done, p.total),
                None => seen.push((p.collective, p.done, p.total)),
            }
            let (done, total) = seen.iter().fold((0, 0), |(d, t), s| (d + s.1, t + s.2));
            bar.set_prefix(p.collective.name().to_string());
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(format!(
                "{}/{} collectives done",
                p.collectives_done, p.collectives_total
            ));
        }
    };
    // The plan's text comes with it: each collective's entries are written beside the
    // search of the others.
    let result = search::compile_to_text(&topo, &options, &mut on_progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let (
        CompiledPlan {
            plan,
            rows,
            skipped,
            report: search_report,
        },
        plan_text,
    ) = result.map_err(search_error)?;
    if args.verbose {
        eprint!("{search_report}");
    }
    if plan.entries.is_empty()
        && let Some(first) = skipped.first()
    {
        return Err(search_error(first.clone()));
    }
    write_plan(&plan_text)?;
    // The plan and its text take hundreds of megabytes on a cluster, and freeing them took a
    // tenth of a second there: this command is the process's last work, and its end hands
    // the memory back at once.
    std::mem::forget(plan);
    let cache_state = match &cache {
        None => "off",
        // A result that depends on the clock, or a partial plan, is not kept.
        Some(_) if !skipped.is_empty() || hccl_compiler::clock::clock_stops() != clock_stops => {
            "not_stored"
        }
        // A cache that cannot be written costs the next compile its search.
        Some((dir, key)) => match plan_cache::store(dir, key, &plan_text, &rows, &search_report) {
            Ok(true) => "stored",
            Ok(false) | Err(_) => "not_stored",
        },
    };
    std::mem::forget(plan_text);
    if args.verbose && cache.is_some() {
        eprintln!("plan cache: {}", cache_state.replace('_', " "));
    }
    report(
        &out,
        (&topo, &topology_origin(&args.topo)),
        &rows,
        args.json,
        Some((&search_report, cache_state)),
    );
    if skipped.is_empty() {
        return Ok(());
    }
    let why: Vec<String> = skipped.iter().map(ToString::to_string).collect();
    Err(CliError::Failed(format!(
        "wrote {} without {}: {}",
        out.display(),
        skipped
            .iter()
            .filter_map(|e| match e {
                SearchError::NoCandidate { collective, .. } => Some(collective.name()),
                SearchError::BadOptions(_) | SearchError::Cancelled => None,
            })
            .collect::<Vec<_>>()
            .join(", "),
        why.join("; ")
    )))
}

/// `explain --trace`: the simulator's timeline of one call as Chrome trace-event JSON.
fn write_trace(
    args: &ExplainArgs,
    path: &Path,
    plan: &PlanFile,
    (topo, from): (&Topology, &str),
) -> Result<(), CliError> {
    let bytes = parse_size(args.size.as_deref().unwrap_or_default())?;
    let collective =
        match &args.collective {
            Some(name) => Some(CollectiveKind::from_name(name).ok_or_else(|| {
                CliError::Input(format!("--collective {name}: no such collective"))
            })?),
            None => None,
        };
    let label = args.plan.display().to_string();
    let trace = report::predicted_trace(plan, &label, topo, bytes, collective, args.links)
        .map_err(|e| match e {
            ReportError::Input(m) => {
                CliError::Input(m.replace("pick one", "pick one with --collective"))
            }
            ReportError::Failed(m) => CliError::Failed(m),
        })?;
    trace
        .doc
        .save(path)
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    let mut summary = trace.summary;
    summary["trace"] = serde_json::Value::from(path.display().to_string());
    summary["calibration"] = report::calibration_json(topo, from);
    if args.json {
        print_json(&summary);
    } else {
        let segments = summary["segments"].as_u64().unwrap_or(1);
        println!(
            "{}: {} {} at {bytes} bytes, {} steps, predicted {:.2} us{}",
            path.display(),
            summary["collective"].as_str().unwrap_or_default(),
            summary["algorithm"].as_str().unwrap_or_default(),
            summary["steps"],
            summary["predicted_us"].as_f64().unwrap_or(f64::NAN),
            if segments > 1 {
                format!(" (one of {segments} segments shown)")
            } else {
                String::new()
            }
        );
        println!("{}", report::calibration_line(topo, from));
    }
    Ok(())
}

pub fn explain(args: ExplainArgs) -> Result<(), CliError> {
    let is_xml = args
        .plan
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"));
    let plan = load_plan_or_xml(&args.plan)?;
    let from = match &args.topo {
        Some(t) => topology_origin(t),
        None => format!("the shipped machine {}", plan.meta.topology),
    };
    let topo = match &args.topo {
        Some(t) => load_topology(t)?,
        None => hccl_topologies::shipped_by_name(&plan.meta.topology).ok_or_else(|| {
            CliError::Input(format!(
                "{}: plan topology `{}` is not a shipped machine; pass --topo",
                args.plan.display(),
                plan.meta.topology
            ))
        })?,
    };
    if let Some(path) = &args.trace {
        return write_trace(&args, path, &plan, (&topo, &from));
    }
    let options = Options {
        sizes: parse_sizes(args.sizes.as_deref())?,
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Options::default()
    };
    let rows = search::evaluate_plan(&topo, &plan, &options).map_err(search_error)?;
    if let Some(path) = &args.plot {
        let name = args.plan.file_name().map_or_else(
            || args.plan.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let svg =
            report::busbw_svg(&name, &topo, &rows).map_err(|e| CliError::Failed(e.to_string()))?;
        hccl_ir::write_atomic(path, svg.as_bytes())
            .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    }
    if !is_xml {
        report(&args.plan, (&topo, &from), &rows, args.json, None);
        return Ok(());
    }
    // An imported algorithm is shown beside what hcclc itself picks for the same topology,
    // collectives and sizes.
    let mut collectives: Vec<CollectiveKind> = Vec::new();
    for entry in &plan.entries {
        let kind = entry.schedule.collective.kind();
        if !collectives.contains(&kind) {
            collectives.push(kind);
        }
    }
    let ours = search::compile(
        &topo,
        &Options {
            collectives,
            sizes: options.sizes.clone(),
            model: options.model.clone(),
            ..Options::default()
        },
    )
    .map_err(search_error)?;
    if args.json {
        let rows: Vec<serde_json::Value> = rows.iter().map(row_json).collect();
        let compiler_rows: Vec<serde_json::Value> = ours.rows.iter().map(row_json).collect();
        print_json(&serde_json::json!({
            "plan": args.plan.display().to_string(),
            "topology": topo.name,
            "calibration": report::calibration_json(&topo, &from),
            "rows": rows,
            "compiler_rows": compiler_rows,
        }));
    } else {
        print!("{}", table(&args.plan.display().to_string(), &topo, &rows));
        println!("{}", report::calibration_line(&topo, &from));
        println!();
        print!(
            "{}",
            table("(hcclc's own choice, not written)", &topo, &ours.rows)
        );
        for (theirs, mine) in rows.iter().zip(&ours.rows) {
            if theirs.bytes == mine.bytes && mine.predicted_us > 0.0 {
                println!(
                    "  {:>5}: {} {:.2} us vs hcclc {} {:.2} us ({:.2}x)",
                    format_bytes(theirs.bytes),
                    theirs.algorithm,
                    theirs.predicted_us,
                    mine.algorithm,
                    mine.predicted_us,
                    theirs.predicted_us / mine.predicted_us
                );
            }
        }
    }
    Ok(())
}

/// The rows of a plan for `topo` (read from `from`), and which calibration predicted them;
/// in JSON also, when the plan was just compiled, the search's report and what the plan
/// cache did (`hit`: the report is the one of the compile that made the entry; `stored`,
/// `not_stored`, `off`).
fn report(
    plan_path: &Path,
    (topo, from): (&Topology, &str),
    rows: &[Row],
    json: bool,
    search_report: Option<(&SearchReport, &str)>,
) {
    if json {
        let rows: Vec<serde_json::Value> = rows.iter().map(row_json).collect();
        let mut doc = serde_json::json!({
            "plan": plan_path.display().to_string(),
            "topology": topo.name,
            "calibration": report::calibration_json(topo, from),
            "rows": rows,
        });
        if let Some((search_report, cache)) = search_report {
            doc["search_report"] = serde_json::to_value(search_report)
                .expect("a search report is plain data and serializes");
            doc["plan_cache"] = serde_json::Value::from(cache);
        }
        print_json(&doc);
    } else {
        print!("{}", table(&plan_path.display().to_string(), topo, rows));
        println!("{}", report::calibration_line(topo, from));
    }
}
