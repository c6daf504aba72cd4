//! `hcclc compile` and `hcclc explain`: compile a topology into a plan, or explain an existing
//! plan, as a table (or JSON) of predicted time, bandwidth, NCCL baseline and lower bound.

use crate::cli_error::{CliError, print_json};
use clap::Args;
use hccl_compiler::families::{Candidate, FamilyParams};
use hccl_compiler::search::{
    self, CompiledPlan, DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, Options, Progress, Row, SearchError,
};
use hccl_compiler::synth::SynthLevel;
use hccl_ir::{CollectiveKind, PlanFile, Synthesis};
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
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
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
            out.push(Candidate {
                algorithm: entry.algorithm,
                params: FamilyParams {
                    channels: entry.schedule.channel_count().max(1),
                    pipeline: 1,
                },
                schedule: entry.schedule,
                symmetry: entry.symmetry,
                min_bytes: 0,
                synthesis: None,
                template: None,
            });
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

/// A topology from a file path, or a shipped machine's name.
pub fn load_topology(spec: &str) -> Result<Topology, CliError> {
    let path = Path::new(spec);
    if path.exists() {
        return hccl_topologies::load(path).map_err(CliError::input);
    }
    if let Some(t) = hccl_topologies::shipped_by_name(spec) {
        return Ok(t);
    }
    hccl_topologies::shipped_or_err(spec)
        .map_err(|err| CliError::Input(format!("{spec}: no such file, and {err}")))
}

fn search_error(err: SearchError) -> CliError {
    match err {
        SearchError::BadOptions(_) => CliError::Input(err.to_string()),
        SearchError::NoCandidate { .. } => CliError::Failed(err.to_string()),
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

pub fn compile(args: CompileArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.topo)?;
    let options = Options {
        collectives: parse_collectives(args.collectives.as_deref())?,
        sizes: parse_sizes(args.sizes.as_deref())?,
        algorithms: args.algo.as_deref().map(|a| {
            a.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        }),
        extra: external_candidates(&args.with, &topo)?,
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
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
    };
    let bar = progress_bar();
    let mut on_progress = |p: Progress| {
        if let Some(bar) = &bar {
            bar.set_prefix(p.collective.name().to_string());
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
            bar.set_message(format!(
                "collective {}/{}",
                (p.collectives_done + 1).min(p.collectives_total),
                p.collectives_total
            ));
        }
    };
    let result = search::compile_with_progress(&topo, &options, &mut on_progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let CompiledPlan {
        plan,
        rows,
        skipped,
    } = result.map_err(search_error)?;
    if plan.entries.is_empty()
        && let Some(first) = skipped.first()
    {
        return Err(search_error(first.clone()));
    }
    let out = args.output.unwrap_or_else(|| {
        let stem = Path::new(&args.topo)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| topo.name.clone());
        PathBuf::from(format!("{stem}.plan.ron"))
    });
    plan.save(&out).map_err(CliError::input)?;
    report(&out, &topo, &rows, args.json);
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
                SearchError::BadOptions(_) => None,
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
    topo: &Topology,
) -> Result<(), CliError> {
    use hccl_compiler::cost::{CostModel, network::Network, sim::Simulator};
    use serde_json::json;
    let bytes = parse_size(args.size.as_deref().unwrap_or_default())?;
    let mut kinds: Vec<CollectiveKind> = Vec::new();
    for e in &plan.entries {
        let k = e.schedule.collective.kind();
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let names = || {
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kind = match &args.collective {
        Some(name) => CollectiveKind::from_name(name)
            .filter(|k| kinds.contains(k))
            .ok_or_else(|| {
                CliError::Input(format!("--collective {name}: the plan has {}", names()))
            })?,
        None if kinds.len() == 1 => kinds[0],
        None => {
            return Err(CliError::Input(format!(
                "the plan has several collectives ({}): pick one with --collective",
                names()
            )));
        }
    };
    // The entry a call of this size runs (out of place, the lowest root's for rooted ones).
    let entry = plan
        .entries
        .iter()
        .filter(|e| e.schedule.collective.kind() == kind && e.covers(bytes))
        .min_by_key(|e| (e.schedule.in_place, e.schedule.collective.root()))
        .ok_or_else(|| {
            CliError::Input(format!(
                "{}: no {} entry covers {bytes} bytes",
                args.plan.display(),
                kind.name()
            ))
        })?;
    let s = &entry.schedule;
    if s.nranks != topo.nranks() {
        return Err(CliError::Input(format!(
            "the plan is for {} ranks, topology {} has {}",
            s.nranks,
            topo.name,
            topo.nranks()
        )));
    }
    let sim = Simulator::new(Network::new(topo), CostModel::for_topology(topo));
    let fail = |e: hccl_compiler::cost::CostError| CliError::Failed(format!("simulating: {e}"));
    let prepared = sim.prepare(s).map_err(fail)?;
    let timeline = sim
        .timeline(&prepared, bytes, entry.protocol)
        .map_err(fail)?;
    let chunk_bytes = bytes as f64 / f64::from(s.chunks.max(1)) / timeline.segments as f64;
    // The layout and names of `hccl_ir::trace`, which measured traces (`HCCL_TRACE`) share.
    use hccl_ir::trace::{Event, TraceFile, process_meta, step_slice, thread_meta, thread_name};
    let mut events = Vec::new();
    for (r, prog) in s.ranks.iter().enumerate() {
        let r = r as u32;
        events.extend(process_meta(r));
        for (i, st) in prog.streams.iter().enumerate() {
            events.push(thread_meta(r, i as u32, &thread_name(i as u32, st.channel)));
        }
    }
    for span in &timeline.steps {
        let at = span.at;
        let step = &s.ranks[at.rank as usize].streams[at.stream as usize].steps[at.step as usize];
        events.push(step_slice(
            at.rank,
            at.stream,
            at.step,
            &step.op,
            step.count,
            (f64::from(step.count) * chunk_bytes).round(),
            span.start_us,
            (span.end_us - span.start_us).max(0.0),
        ));
    }
    // Counter tracks: the busiest resources (by their utilisation over the call) in a process
    // of their own, each one's utilisation as a step function.
    let net = &sim.network;
    let mut busiest: Vec<(f64, &hccl_compiler::cost::ResourceUse)> = timeline
        .resources
        .iter()
        .map(|u| (timeline.estimate.utilisation(net, u.resource), u))
        .filter(|(util, _)| *util > 0.0)
        .collect();
    busiest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.resource.cmp(&b.1.resource)));
    busiest.truncate(args.links);
    let links_pid = s.nranks;
    if !busiest.is_empty() {
        let name = format!(
            "busiest links ({} of {})",
            busiest.len(),
            timeline.resources.len()
        );
        events.push(Event::meta(
            "process_name",
            links_pid,
            None,
            json!({ "name": name }),
        ));
        events.push(Event::meta(
            "process_sort_index",
            links_pid,
            None,
            json!({"sort_index": -1}),
        ));
    }
    let mut links = Vec::new();
    for (util, u) in &busiest {
        let cap = net.capacity[u.resource as usize];
        let name = format!(
            "{} ({} GB/s)",
            net.resource_name(topo, u.resource),
            round3(cap)
        );
        for &(t, gbps) in &u.rates {
            let mut used = serde_json::Map::new();
            used.insert("used %".into(), json!(round3(100.0 * gbps / cap)));
            events.push(Event {
                name: name.clone(),
                cat: None,
                ph: "C".into(),
                pid: links_pid,
                tid: None,
                ts: Some(t),
                dur: None,
                args: used,
            });
        }
        links.push(json!({
            "name": name,
            "resource": u.resource,
            "capacity_gbps": cap,
            "utilisation": round3(*util),
            "peak_gbps": round3(u.peak_gbps()),
        }));
    }
    let other = json!({
        "source": "predicted",
        "plan": args.plan.display().to_string(),
        "topology": topo.name,
        "collective": s.collective.to_string(),
        "algorithm": entry.algorithm,
        "protocol": entry.protocol.name(),
        "bytes": bytes,
        "predicted_us": timeline.estimate.time_us,
        "base_us": timeline.estimate.base_us,
        "segments": timeline.segments,
        "links": links,
    });
    let doc = TraceFile::new(events, other.as_object().cloned().unwrap_or_default());
    doc.save(path)
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    let summary = json!({
        "trace": path.display().to_string(),
        "collective": s.collective.to_string(),
        "algorithm": entry.algorithm,
        "bytes": bytes,
        "predicted_us": timeline.estimate.time_us,
        "steps": timeline.steps.len(),
        "segments": timeline.segments,
        "links": links.len(),
    });
    if args.json {
        print_json(&summary);
    } else {
        println!(
            "{}: {} {} at {bytes} bytes, {} steps, predicted {:.2} us{}",
            path.display(),
            s.collective,
            entry.algorithm,
            timeline.steps.len(),
            timeline.estimate.time_us,
            if timeline.segments > 1 {
                format!(" (one of {} segments shown)", timeline.segments)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

pub fn explain(args: ExplainArgs) -> Result<(), CliError> {
    let is_xml = args
        .plan
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"));
    let plan = load_plan_or_xml(&args.plan)?;
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
        return write_trace(&args, path, &plan, &topo);
    }
    let options = Options {
        sizes: parse_sizes(args.sizes.as_deref())?,
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Options::default()
    };
    let rows = search::evaluate_plan(&topo, &plan, &options).map_err(search_error)?;
    if let Some(path) = &args.plot {
        write_plot(path, &args.plan, &topo, &rows)?;
    }
    if !is_xml {
        report(&args.plan, &topo, &rows, args.json);
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
            "rows": rows,
            "compiler_rows": compiler_rows,
        }));
    } else {
        print!("{}", table(&args.plan, &topo, &rows));
        println!();
        print!(
            "{}",
            table(
                Path::new("(hcclc's own choice, not written)"),
                &topo,
                &ours.rows
            )
        );
        for (theirs, mine) in rows.iter().zip(&ours.rows) {
            if theirs.bytes == mine.bytes && mine.predicted_us > 0.0 {
                println!(
                    "  {:>5}: {} {:.2} us vs hcclc {} {:.2} us ({:.2}x)",
                    human(theirs.bytes),
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

/// `explain --plot`: the rows as bus bandwidth against size, one panel per collective.
fn write_plot(path: &Path, plan: &Path, topo: &Topology, rows: &[Row]) -> Result<(), CliError> {
    use hccl_compiler::plot::{Line, Panel, Series, busbw_chart};
    let mut panels: Vec<Panel> = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let kind = rows[i].collective;
        let block: Vec<&Row> = rows[i..]
            .iter()
            .take_while(|r| r.collective == kind)
            .collect();
        i += block.len();
        let busbw = |r: &Row, us: f64| {
            if us > 0.0 {
                r.bytes as f64 / (us * 1e3) * kind.busbw_factor(r.nranks)
            } else {
                0.0
            }
        };
        let series = |name: &str, line: Line, us: &dyn Fn(&Row) -> Option<f64>| Series {
            name: name.to_string(),
            line,
            points: block
                .iter()
                .filter_map(|r| us(r).map(|t| (r.bytes, busbw(r, t))))
                .collect(),
            notes: Vec::new(),
        };
        // The plan's algorithm, written where it changes.
        let mut notes: Vec<(u64, String)> = Vec::new();
        for (k, r) in block.iter().enumerate() {
            if k == 0 || block[k - 1].algorithm != r.algorithm {
                notes.push((r.bytes, r.algorithm.clone()));
            }
        }
        panels.push(Panel {
            title: kind.name().to_string(),
            series: vec![
                Series {
                    notes,
                    ..series("this plan", Line::Solid, &|r| Some(r.predicted_us))
                },
                series("NCCL's choice", Line::Dashed, &|r| r.baseline_us),
                series("lower bound", Line::Dotted, &|r| Some(r.bound_us)),
            ],
        });
    }
    let name = plan.file_name().map_or_else(
        || plan.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let title = format!(
        "{name} on {} ({} ranks): predicted bus bandwidth",
        topo.name,
        topo.nranks()
    );
    let svg = busbw_chart(&title, &panels).map_err(|e| CliError::Failed(e.to_string()))?;
    hccl_ir::write_atomic(path, svg.as_bytes())
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))
}

fn report(plan_path: &Path, topo: &Topology, rows: &[Row], json: bool) {
    if json {
        let rows: Vec<serde_json::Value> = rows.iter().map(row_json).collect();
        print_json(&serde_json::json!({
            "plan": plan_path.display().to_string(),
            "topology": topo.name,
            "rows": rows,
        }));
    } else {
        print!("{}", table(plan_path, topo, rows));
    }
}

fn row_json(r: &Row) -> serde_json::Value {
    serde_json::json!({
        "collective": r.collective.name(),
        "bytes": r.bytes,
        "algorithm": r.algorithm,
        "channels": r.channels,
        "chunks": r.chunks,
        "protocol": r.protocol.name(),
        "predicted_us": round3(r.predicted_us),
        "algbw_gbps": round3(r.algbw_gbps()),
        "busbw_gbps": round3(r.busbw_gbps()),
        "baseline_algorithm": r.baseline_algorithm,
        "baseline_protocol": r.baseline_protocol.map(|p| p.name()),
        "baseline_us": r.baseline_us.map(round3),
        "baseline_source": r.baseline_us.map(|_| if r.baseline_modelled { "nccl-model" } else { "simulated" }),
        "speedup": r.speedup().map(round3),
        "bound_us": round3(r.bound_us),
        "bound_ratio": round3(r.bound_ratio()),
        "synthesis": r.synthesis.as_ref().map(synthesis_json),
    })
}

/// Three decimals: keeps JSON stable and readable.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Human-readable size: `4K`, `1M`, or bytes.
pub fn human(bytes: u64) -> String {
    hccl_ir::units::format_bytes(bytes)
}

/// The text table: one block per collective, one line per size.
pub fn table(plan_path: &Path, topo: &Topology, rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan {} for {} ({} ranks)",
        plan_path.display(),
        topo.name,
        topo.nranks()
    );
    let mut i = 0;
    while i < rows.len() {
        let kind = rows[i].collective;
        let start = i;
        let _ = writeln!(out, "\n{kind}");
        let _ = writeln!(
            out,
            "{:>6} {:<15} {:>3} {:>6} {:<6} {:>11} {:>8} {:>8} {:<19} {:>11} {:>7} {:>11} {:>6}",
            "size",
            "algorithm",
            "ch",
            "chunks",
            "proto",
            "time_us",
            "algbw",
            "busbw",
            "nccl",
            "nccl_us",
            "speedup",
            "bound_us",
            "/bound"
        );
        while i < rows.len() && rows[i].collective == kind {
            let r = &rows[i];
            let nccl = match (&r.baseline_algorithm, r.baseline_protocol) {
                (Some(a), Some(p)) if r.baseline_modelled => format!("{a}/{p} (model)"),
                (Some(a), Some(p)) => format!("{a}/{p}"),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "{:>6} {:<15} {:>3} {:>6} {:<6} {:>11.2} {:>8.2} {:>8.2} {:<19} {:>11} {:>7} {:>11.2} {:>6.2}",
                human(r.bytes),
                r.algorithm,
                r.channels,
                r.chunks,
                r.protocol.name(),
                r.predicted_us,
                r.algbw_gbps(),
                r.busbw_gbps(),
                nccl,
                r.baseline_us.map_or("-".into(), |b| format!("{b:.2}")),
                r.speedup().map_or("-".into(), |s| format!("{s:.2}x")),
                r.bound_us,
                r.bound_ratio(),
            );
            i += 1;
        }
        if rows[start..i]
            .iter()
            .any(|r| r.baseline_modelled && r.baseline_us.is_some())
        {
            let _ = writeln!(
                out,
                "  (model): NCCL's own tuning formula, where its algorithm's schedules are too \
                 large to simulate here"
            );
        }
        // What the synthesizers behind this collective's entries proved, once per record.
        let mut seen: Vec<(&str, &Synthesis)> = Vec::new();
        for r in rows[start..i].iter() {
            if let Some(s) = &r.synthesis
                && !seen.iter().any(|(a, t)| *a == r.algorithm && *t == s)
            {
                seen.push((&r.algorithm, s));
            }
        }
        for (algorithm, s) in seen {
            let _ = writeln!(out, "  {algorithm}: {}", describe(s));
        }
    }
    out
}

/// One line on a synthesized schedule: method, its value and the proven optimum, objective.
pub fn describe(s: &Synthesis) -> String {
    format!(
        "{} gives {:.2} {}, {} {:.2}; objective: {}",
        s.method,
        s.value,
        s.unit,
        if s.proven {
            "proven optimum"
        } else {
            "best bound"
        },
        s.optimum,
        s.objective
    )
}

fn synthesis_json(s: &Synthesis) -> serde_json::Value {
    serde_json::json!({
        "method": s.method,
        "objective": s.objective,
        "value": round3(s.value),
        "optimum": round3(s.optimum),
        "unit": s.unit,
        "proven": s.proven,
    })
}
