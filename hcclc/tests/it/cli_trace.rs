//! `hcclc explain PLAN --trace FILE --size SIZE`: the simulator's timeline of one call as
//! Chrome trace-event JSON (steps, and counter tracks of the busiest links), on a GPU-model
//! ring and a CPU host; `hcclc explain PLAN --plot FILE.svg`: the predicted bandwidth chart.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .output()
        .expect("hcclc runs")
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hcclc-trace-{}-{name}", std::process::id()))
}

/// A topology file and an AllReduce plan for it (two sizes), both in temporary files.
fn plan_for(spec: hccl_topologies::TopologySpec, tag: &str) -> (PathBuf, PathBuf) {
    let topo = hccl_topologies::build(spec, tag).expect("builds");
    let topo_path = tmp(&format!("{tag}.ron"));
    std::fs::write(&topo_path, hccl_topologies::to_ron(&topo.spec)).expect("topology written");
    let options = hccl_compiler::search::Options {
        collectives: vec![hccl_ir::CollectiveKind::AllReduce],
        sizes: vec![4096, 1 << 20],
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        ..Default::default()
    };
    let plan = hccl_compiler::search::compile(&topo, &options)
        .expect("compiles")
        .plan;
    let plan_path = tmp(&format!("{tag}.plan.ron"));
    plan.save(&plan_path).expect("plan written");
    (topo_path, plan_path)
}

/// Checks the trace-event document and returns its step slices.
fn check_trace(path: &Path, nranks: u64) -> (Vec<Value>, Value) {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("trace written")).expect("JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    // Rank processes (the busiest links have one of their own, after them).
    let procs: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter(|e| {
            e["args"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("rank "))
        })
        .map(|e| e["pid"].as_u64().expect("pid"))
        .collect();
    assert_eq!(
        procs,
        (0..nranks).collect::<Vec<_>>(),
        "one process per rank"
    );
    let threads: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    let slices: Vec<Value> = events.iter().filter(|e| e["ph"] == "X").cloned().collect();
    assert!(!slices.is_empty());
    let other = doc["otherData"].clone();
    let span = other["predicted_us"].as_f64().unwrap() - other["base_us"].as_f64().unwrap();
    for s in &slices {
        for key in ["name", "cat", "ts", "dur", "pid", "tid", "args"] {
            assert!(!s[key].is_null(), "{key} missing in {s}");
        }
        let (ts, dur) = (s["ts"].as_f64().unwrap(), s["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{s}");
        let segments = other["segments"].as_f64().unwrap();
        assert!(
            ts + dur <= span / segments + 1e-6,
            "{s} past the call's end"
        );
        let (pid, tid) = (s["pid"].as_u64().unwrap(), s["tid"].as_u64().unwrap());
        assert!(threads.contains(&(pid, tid)), "thread of {s} is named");
    }
    (slices, other)
}

#[test]
fn a_predicted_timeline_has_a_slice_per_step() {
    let (topo, plan) = plan_for(hccl_topologies::generate::ring(4, 50.0, 1.0), "ring4");
    let trace = tmp("ring4.json");
    let (t, p, f) = (
        topo.to_str().unwrap(),
        plan.to_str().unwrap(),
        trace.to_str().unwrap(),
    );
    let out = hcclc(&[
        "explain", p, "--topo", t, "--trace", f, "--size", "1M", "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    // A generated ring carries no calibration, and the prediction says so.
    assert_eq!(summary["calibration"]["kind"], "none", "{summary}");
    assert_eq!(summary["calibration"]["from"], t);
    let (slices, other) = check_trace(&trace, 4);
    assert_eq!(summary["steps"].as_u64(), Some(slices.len() as u64));
    assert_eq!(other["source"], "predicted");
    assert_eq!(other["bytes"], 1 << 20);
    // The plan's own entry for 1 MiB, whose every step is a slice.
    let loaded = hccl_ir::PlanFile::load(&plan).expect("plan");
    let entry = loaded
        .entries
        .iter()
        .find(|e| e.covers(1 << 20) && !e.schedule.in_place)
        .expect("an entry");
    assert_eq!(slices.len(), entry.schedule.step_count());
    // Threads are named as measured traces name them (`hccl_ir::trace::thread_name`).
    let doc = hccl_ir::trace::TraceFile::load(&trace).expect("a trace file");
    for (r, prog) in entry.schedule.ranks.iter().enumerate() {
        for (i, st) in prog.streams.iter().enumerate() {
            let name = hccl_ir::trace::thread_name(i as u32, st.channel);
            assert!(
                doc.events.iter().any(|e| e.name == "thread_name"
                    && e.pid == r as u32
                    && e.tid == Some(i as u32)
                    && e.args["name"] == name.as_str()),
                "rank {r} stream {i}: {name}"
            );
        }
    }
    assert_eq!(other["algorithm"], entry.algorithm.as_str());
    // Counter tracks: the busiest links of the ring (each rank sends to the next), named by
    // kind and ends, at most --links of them, each a step function whose integral is the
    // bytes the link carried: its utilisation over the whole call.
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let links = other["links"].as_array().expect("links");
    assert!(!links.is_empty() && links.len() <= 8, "{links:?}");
    assert_eq!(summary["links"].as_u64(), Some(links.len() as u64));
    let predicted = other["predicted_us"].as_f64().unwrap();
    for link in links {
        let name = link["name"].as_str().unwrap();
        assert!(
            name.starts_with("NVLink gpu") && name.contains('→'),
            "{name}"
        );
        let points: Vec<(f64, f64)> = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["used %"].as_f64().unwrap(),
                )
            })
            .collect();
        assert!(points.len() >= 2, "{name}: {points:?}");
        assert!(points.iter().all(|p| (0.0..=100.0 + 1e-9).contains(&p.1)));
        assert_eq!(points.last().unwrap().1, 0.0, "{name} ends idle");
        let busy: f64 = points
            .windows(2)
            .map(|w| (w[1].0 - w[0].0) * w[0].1 / 100.0)
            .sum();
        let util = link["utilisation"].as_f64().unwrap();
        assert!(
            (busy - util * predicted).abs() <= 0.01 * util * predicted + 1e-3,
            "{name}: busy {busy} us, utilisation {util} of {predicted} us"
        );
    }
    let out = hcclc(&[
        "explain", p, "--topo", t, "--trace", f, "--size", "1M", "--links", "1", "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(summary["links"], 1);
    // Slices are named by the op in words; messages have a peer and bytes.
    assert!(slices.iter().any(|s| s["name"] == "send"), "{slices:?}");
    assert!(
        slices
            .iter()
            .any(|s| !s["args"]["to"].is_null() && s["args"]["bytes"].as_f64() > Some(0.0))
    );
    // Bad input: no size, a collective the plan lacks.
    assert_eq!(
        hcclc(&["explain", p, "--topo", t, "--trace", f])
            .status
            .code(),
        Some(2)
    );
    let out = hcclc(&[
        "explain",
        p,
        "--topo",
        t,
        "--trace",
        f,
        "--size",
        "1M",
        "--collective",
        "broadcast",
    ]);
    assert_eq!(out.status.code(), Some(2));
    for f in [topo, plan, trace] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn cpu_hosts_get_a_timeline_of_one_segment() {
    let (topo, plan) = plan_for(hccl_topologies::generate::host(3, 5.0), "host3");
    let trace = tmp("host3.json");
    let (t, p, f) = (
        topo.to_str().unwrap(),
        plan.to_str().unwrap(),
        trace.to_str().unwrap(),
    );
    let out = hcclc(&["explain", p, "--topo", t, "--trace", f, "--size", "1M"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("predicted"));
    let (slices, other) = check_trace(&trace, 3);
    assert!(other["segments"].as_u64().is_some_and(|s| s >= 1));
    // The CPU model's times do not come from links: no counter tracks.
    assert_eq!(other["links"].as_array().map(Vec::len), Some(0));
    assert!(slices.iter().all(|s| s["ts"].is_number()));
    for f in [topo, plan, trace] {
        let _ = std::fs::remove_file(f);
    }
}

/// `hcclc trace merge DIR`: rank files checked and joined; a missing directory, an empty one,
/// a malformed file or a file holding another rank's events is bad input (exit 2) naming it.
#[test]
fn trace_merge_joins_rank_files_and_names_the_bad_one() {
    use hccl_ir::trace::{Event, TraceFile, process_meta, rank_file, thread_meta};
    let dir = tmp("merge");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = hcclc(&["trace", "merge", d]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(d));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(
        hcclc(&["trace", "merge", d]).status.code(),
        Some(2),
        "no rank files"
    );
    let rank_doc = |pid: u32, r: u32, ts: f64| {
        let mut events: Vec<Event> = process_meta(pid).into();
        events.push(thread_meta(pid, 0, "stream 0 (channel 0)"));
        events.push(Event::slice("send", "step", pid, 0, ts, 2.0));
        let mut other = serde_json::Map::new();
        other.insert("world".into(), serde_json::json!(3));
        TraceFile::new(events, other)
            .save(&rank_file(&dir, r))
            .unwrap();
    };
    rank_doc(0, 0, 100.0);
    rank_doc(1, 1, 101.5);
    std::fs::write(dir.join("notes.txt"), "not a rank file").unwrap();
    let merged = dir.join("all.json");
    let out = hcclc(&[
        "trace",
        "merge",
        d,
        "-o",
        merged.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(summary["ranks"], serde_json::json!([0, 1]));
    assert_eq!(summary["missing_ranks"], serde_json::json!([2]));
    let doc = TraceFile::load(&merged).expect("merged");
    assert_eq!(doc.check().unwrap().processes, vec![0, 1]);
    let ts: Vec<f64> = doc.events.iter().filter_map(|e| e.ts).collect();
    assert_eq!(ts, vec![0.0, 1.5], "rebased to the earliest event");
    // Another rank's events in a rank file; then a file that is not JSON.
    rank_doc(0, 2, 5.0);
    let out = hcclc(&["trace", "merge", d]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank-2.json"));
    std::fs::write(rank_file(&dir, 2), "{\"traceEvents\": [").unwrap();
    let out = hcclc(&["trace", "merge", d]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank-2.json:1:"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `<text>` contents of an SVG document, and how many elements of each name it has in
/// each stroke or fill colour.
fn svg_texts(svg: &str) -> (Vec<String>, Vec<(String, String)>) {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or_default().trim().to_string())
        .collect();
    let shapes = doc
        .descendants()
        .filter(|n| n.is_element())
        .map(|n| {
            let colour = [n.attribute("stroke"), n.attribute("fill")]
                .into_iter()
                .flatten()
                .find(|c| *c != "none")
                .unwrap_or("");
            (n.tag_name().name().to_string(), colour.to_ascii_uppercase())
        })
        .collect();
    (texts, shapes)
}

#[test]
fn explain_plots_the_plan_against_nccl_and_the_bound() {
    let (topo, plan) = plan_for(hccl_topologies::generate::ring(4, 50.0, 1.0), "plot4");
    let svg_path = tmp("plot4.svg");
    let (t, p, f) = (
        topo.to_str().unwrap(),
        plan.to_str().unwrap(),
        svg_path.to_str().unwrap(),
    );
    let out = hcclc(&[
        "explain", p, "--topo", t, "--sizes", "4K..1M", "--plot", f, "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The table still comes, and the chart shows its rows.
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = doc["rows"].as_array().unwrap().len();
    assert_eq!(rows, 9, "4K..1M by factors of 2");
    let (texts, shapes) = svg_texts(&std::fs::read_to_string(&svg_path).unwrap());
    for want in [
        "allreduce",
        "this plan",
        "NCCL's choice",
        "lower bound",
        "message size (bytes, log scale)",
        "bus bandwidth (GB/s, log scale)",
        "4K",
        "1M",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want} not in {texts:?}");
    }
    assert!(texts.iter().any(|t| t.contains("4 ranks")), "{texts:?}");
    // The plan's algorithm is written where it changes: at the first size at least.
    let rows_json = doc["rows"].as_array().unwrap();
    let mut changes = 0;
    for (k, r) in rows_json.iter().enumerate() {
        let algorithm = r["algorithm"].as_str().unwrap();
        if k == 0 || rows_json[k - 1]["algorithm"] != r["algorithm"] {
            changes += 1;
            assert!(
                texts.iter().any(|t| t == algorithm),
                "{algorithm}: {texts:?}"
            );
        }
    }
    assert!(changes >= 1);
    // The plan's series: a line and a marker per size (blue); NCCL's and the bound's lines
    // (orange, grey).
    let count = |tag: &str, colour: &str| {
        shapes
            .iter()
            .filter(|(t, c)| t == tag && c == colour)
            .count()
    };
    assert_eq!(count("circle", "#1F77B4"), rows, "{shapes:?}");
    assert!(count("polyline", "#1F77B4") >= 1);
    assert!(count("polyline", "#E6780A") >= 1);
    assert!(count("polyline", "#646464") >= 1);
    // --plot and --trace are one or the other; a directory is no file to write.
    let out = hcclc(&[
        "explain", p, "--topo", t, "--plot", f, "--trace", f, "--size", "1M",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let dir = std::env::temp_dir();
    let out = hcclc(&[
        "explain",
        p,
        "--topo",
        t,
        "--sizes",
        "4K",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [topo, plan, svg_path] {
        let _ = std::fs::remove_file(f);
    }
}

/// `hcclc trace show TRACE --svg FILE`: a predicted trace drawn as a timeline, a row per
/// stream of each rank named as the trace names it, a bar per step in its operation's
/// colour, the operations in the legend; a missing or malformed trace is bad input.
#[test]
fn trace_show_draws_a_row_per_stream_and_a_bar_per_step() {
    let (topo, plan) = plan_for(hccl_topologies::generate::ring(4, 50.0, 1.0), "show4");
    let (trace, svg) = (tmp("show4.json"), tmp("show4.svg"));
    let (t, p, f, s) = (
        topo.to_str().unwrap(),
        plan.to_str().unwrap(),
        trace.to_str().unwrap(),
        svg.to_str().unwrap(),
    );
    let out = hcclc(&["explain", p, "--topo", t, "--trace", f, "--size", "64K"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (slices, _) = check_trace(&trace, 4);
    let out = hcclc(&["trace", "show", f, "--svg", s, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(summary["slices"].as_u64(), Some(slices.len() as u64));
    let text = std::fs::read_to_string(&svg).expect("the picture");
    let (texts, shapes) = svg_texts(&text);
    // Every thread the trace names is a row label; every op a legend entry.
    let doc = hccl_ir::trace::TraceFile::load(&trace).expect("trace");
    let mut rows = 0;
    for e in doc.events.iter().filter(|e| e.name == "thread_name") {
        let name = e.args["name"].as_str().unwrap();
        let label = format!("rank {} · {name}", e.pid);
        assert!(texts.contains(&label), "no row {label:?} in {texts:?}");
        rows += 1;
    }
    assert_eq!(summary["rows"].as_u64(), Some(rows));
    let ops = summary["ops"].as_array().expect("ops");
    assert!(!ops.is_empty());
    for op in ops {
        assert!(
            texts.contains(&op.as_str().unwrap().to_string()),
            "{op} not in the legend"
        );
    }
    assert!(texts.iter().any(|t| t == "time (µs)"), "{texts:?}");
    // A filled bar per step (plus the legend's swatches and the background).
    let bars = shapes.iter().filter(|(name, _)| name == "rect").count();
    assert!(
        bars >= slices.len() + ops.len(),
        "{bars} rects for {} slices",
        slices.len()
    );
    // Bad input: a missing trace, a file that is not one.
    assert_eq!(
        hcclc(&["trace", "show", "/nonexistent.json", "--svg", s])
            .status
            .code(),
        Some(2)
    );
    std::fs::write(&trace, "{\"traceEvents\": [}").unwrap();
    let out = hcclc(&["trace", "show", f, "--svg", s]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(f));
    for x in [topo, plan, trace, svg] {
        let _ = std::fs::remove_file(x);
    }
}
