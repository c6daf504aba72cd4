//! `hcclc explain PLAN --trace FILE --size SIZE`: the simulator's timeline of one call as
//! Chrome trace-event JSON, on a GPU-model ring and a CPU host.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
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
    let procs: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
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
