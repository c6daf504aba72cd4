//! What the front ends print and write about plans: the compile table and its JSON rows, the
//! predicted timeline of one call as a trace file, and the bus-bandwidth chart. `hcclc` and
//! the Python package both call these, so a plan reads the same from either.

use crate::cost::{CostModel, network::Network, sim::Simulator};
use crate::plot::PlotError;
use crate::search::Row;
use hccl_ir::trace::TraceFile;
use hccl_ir::units::format_bytes;
use hccl_ir::{CollectiveKind, PlanFile, Synthesis};
use hccl_topologies::Topology;

/// Why a report could not be made: bad input (exit 2 in `hcclc`) or a failure of the model
/// (exit 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
}

/// The predicted timeline of one call ([`predicted_trace`]).
#[derive(Debug, Clone)]
pub struct PredictedTrace {
    /// The trace file (Chrome trace events, `hccl_ir::trace`'s layout).
    pub doc: TraceFile,
    /// What it shows, as JSON: collective, algorithm, protocol, bytes, predicted_us, steps,
    /// segments, links.
    pub summary: serde_json::Value,
}

/// How to give a machine a calibration of its own (the end of every prediction's
/// calibration line that is not the machine's own).
pub const HOW_TO_CALIBRATE: &str = "to calibrate: `hccl-perf --calibrate OUT.ron` on the \
     machine (CPU hosts), or `hcclc calibrate TOPO --from RUN.json` from `hccl-perf --json \
     --plan` runs, then compile for OUT.ron (hccl-perf: --topo OUT.ron)";

/// Which calibration a topology's predictions use: `own` (the topology carries one that was
/// measured: `from` says where the topology was read, the calibration's source where and when
/// it was measured), `built-in` (the default fitted on the development machine, not this
/// one: its source says where and when) or `none` (the model's nominal figures). As JSON:
/// `{kind, source, from, how_to_calibrate}` (the last null for `own`).
pub fn calibration_json(topo: &Topology, from: &str) -> serde_json::Value {
    let (kind, source) = calibration_kind(topo);
    serde_json::json!({
        "kind": kind,
        "source": source,
        "from": from,
        "how_to_calibrate": (kind != "own").then_some(HOW_TO_CALIBRATE),
    })
}

/// [`calibration_json`] as one line for people.
pub fn calibration_line(topo: &Topology, from: &str) -> String {
    match calibration_kind(topo) {
        ("own", source) => format!(
            "calibration: this machine's own, from {from} ({})",
            source.unwrap_or("its source not recorded")
        ),
        ("built-in", source) => format!(
            "calibration: the built-in default, not measured on this machine ({}); \
             {HOW_TO_CALIBRATE}",
            source
                .and_then(|s| s.strip_prefix(crate::cost::calibrate::BUILTIN_SOURCE))
                .map_or("", str::trim_start)
        ),
        _ => format!(
            "calibration: none, the model's nominal link figures ({from}); {HOW_TO_CALIBRATE}"
        ),
    }
}

fn calibration_kind(topo: &Topology) -> (&'static str, Option<&str>) {
    match &topo.spec.calibration {
        None => ("none", None),
        Some(c) if c.source.starts_with(crate::cost::calibrate::BUILTIN_SOURCE) => {
            ("built-in", Some(c.source.as_str()))
        }
        Some(c) => ("own", (!c.source.is_empty()).then_some(c.source.as_str())),
    }
}

/// One row as JSON: the fields of `hcclc compile --json` and `hcclc explain --json`.
pub fn row_json(r: &Row) -> serde_json::Value {
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
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The text table of `hcclc compile` and `hcclc explain`: one block per collective, one line
/// per size; `title` names the plan (its path).
pub fn table(title: &str, topo: &Topology, rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan {} for {} ({} ranks)",
        title,
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
                format_bytes(r.bytes),
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

/// A synthesis record as JSON.
pub fn synthesis_json(s: &Synthesis) -> serde_json::Value {
    serde_json::json!({
        "method": s.method,
        "objective": s.objective,
        "value": round3(s.value),
        "optimum": round3(s.optimum),
        "unit": s.unit,
        "proven": s.proven,
    })
}

/// The simulator's timeline of one call of `plan` on `topo` at `bytes`, as Chrome trace-event
/// JSON (`hcclc explain --trace`, the Python `Plan.trace`): a process per rank, a slice per
/// step, and counter tracks of the `links` busiest links' utilisation. `collective` picks the
/// collective when the plan holds several; `plan_label` names the plan in the file.
pub fn predicted_trace(
    plan: &PlanFile,
    plan_label: &str,
    topo: &Topology,
    bytes: u64,
    collective: Option<CollectiveKind>,
    links: usize,
) -> Result<PredictedTrace, ReportError> {
    use serde_json::json;
    let entry = traced_entry(plan, plan_label, bytes, collective)?;
    let s = &entry.schedule;
    if s.nranks != topo.nranks() {
        return Err(ReportError::Input(format!(
            "the plan is for {} ranks, topology {} has {}",
            s.nranks,
            topo.name,
            topo.nranks()
        )));
    }
    let sim = Simulator::new(Network::new(topo), CostModel::for_topology(topo));
    let fail = |e: crate::cost::CostError| ReportError::Failed(format!("simulating: {e}"));
    let prepared = sim.prepare(s).map_err(fail)?;
    let timeline = sim
        .timeline(&prepared, bytes, entry.protocol)
        .map_err(fail)?;
    let chunk_bytes = bytes as f64 / f64::from(s.chunks.max(1)) / timeline.segments as f64;
    // The layout and names of `hccl_ir::trace`, which measured traces (`HCCL_TRACE`) share.
    let mut events = step_events(s, &timeline, chunk_bytes);
    let (link_events, links) = link_events(topo, &sim.network, &timeline, links);
    events.extend(link_events);
    let other = json!({
        "source": "predicted",
        "plan": plan_label,
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
    let doc =
        hccl_ir::trace::TraceFile::new(events, other.as_object().cloned().unwrap_or_default());
    let summary = json!({
        "collective": s.collective.to_string(),
        "algorithm": entry.algorithm,
        "protocol": entry.protocol.name(),
        "bytes": bytes,
        "predicted_us": timeline.estimate.time_us,
        "steps": timeline.steps.len(),
        "segments": timeline.segments,
        "links": links.len(),
    });
    Ok(PredictedTrace { doc, summary })
}

/// The entry of `plan` a call of `bytes` runs for `collective` (the plan's only one when
/// `None`): out of place, the lowest root's for rooted ones.
fn traced_entry<'p>(
    plan: &'p PlanFile,
    plan_label: &str,
    bytes: u64,
    collective: Option<CollectiveKind>,
) -> Result<&'p hccl_ir::PlanEntry, ReportError> {
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
    let kind = match collective {
        Some(k) if kinds.contains(&k) => k,
        Some(k) => {
            return Err(ReportError::Input(format!(
                "collective {k}: the plan has {}",
                names()
            )));
        }
        None if kinds.len() == 1 => kinds[0],
        None => {
            return Err(ReportError::Input(format!(
                "the plan has several collectives ({}): pick one",
                names()
            )));
        }
    };
    // The entry a call of this size runs (out of place, the lowest root's for rooted ones).
    plan.entries
        .iter()
        .filter(|e| e.schedule.collective.kind() == kind && e.covers(bytes))
        .min_by_key(|e| (e.schedule.in_place, e.schedule.collective.root()))
        .ok_or_else(|| {
            ReportError::Input(format!(
                "{plan_label}: no {} entry covers {bytes} bytes",
                kind.name()
            ))
        })
}

/// The trace's processes (a rank each), threads (a stream each) and step slices.
fn step_events(
    s: &hccl_ir::Schedule,
    timeline: &crate::cost::Timeline,
    chunk_bytes: f64,
) -> Vec<hccl_ir::trace::Event> {
    use hccl_ir::trace::{process_meta, step_slice, thread_meta, thread_name};
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
    events
}

/// Counter tracks of the `links` busiest resources (by their utilisation over the call), in
/// a process of their own, each one's utilisation as a step function; and each one's
/// summary.
fn link_events(
    topo: &Topology,
    net: &Network,
    timeline: &crate::cost::Timeline,
    links: usize,
) -> (Vec<hccl_ir::trace::Event>, Vec<serde_json::Value>) {
    use hccl_ir::trace::Event;
    use serde_json::json;
    let mut events = Vec::new();
    let mut busiest: Vec<(f64, &crate::cost::ResourceUse)> = timeline
        .resources
        .iter()
        .map(|u| (timeline.estimate.utilisation(net, u.resource), u))
        .filter(|(util, _)| *util > 0.0)
        .collect();
    busiest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.resource.cmp(&b.1.resource)));
    busiest.truncate(links);
    let links_pid = topo.nranks();
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
    (events, links)
}

/// The rows as an SVG chart of bus bandwidth against size, one panel per collective: the
/// plan, NCCL's choice and the lower bound (`hcclc explain --plot`); `name` names the plan.
pub fn busbw_svg(name: &str, topo: &Topology, rows: &[Row]) -> Result<String, PlotError> {
    use crate::plot::{Line, Panel, Series, busbw_chart};
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
    let title = format!(
        "{name} on {} ({} ranks): predicted bus bandwidth",
        topo.name,
        topo.nranks()
    );
    busbw_chart(&title, &panels)
}
