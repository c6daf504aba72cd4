//! `hcclc calibrate` and `hcclc topo gen host --calibration`: a fit from hccl-perf-shaped
//! JSON, the calibrated topology it writes, and located errors on bad input.

use hccl_compiler::cost::{CostModel, Network, Simulator};
use hccl_compiler::search::{self, Options};
use hccl_ir::{CollectiveKind, Protocol};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .output()
        .expect("hcclc runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hcclc-cal-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 4-rank host topology, a plan of two families compiled for it, and an hccl-perf-shaped
/// run whose times come from a known calibration: the fit must find times that match.
#[test]
fn fits_runs_of_a_plan_and_writes_a_calibrated_topology() {
    let dir = scratch("fit");
    let spec = hccl_topologies::generate::host(4, 8.0);
    let topo_path = dir.join("host4.ron");
    std::fs::write(&topo_path, hccl_topologies::to_ron(&spec)).unwrap();
    let topo = hccl_topologies::build(spec, "host4").unwrap();
    let plan = search::compile(
        &topo,
        &Options {
            collectives: vec![CollectiveKind::AllReduce],
            sizes: search::geometric_sizes(64, 16 << 20, 4),
            algorithms: Some(vec!["ring".into(), "mesh".into()]),
            model: CostModel::for_topology(&topo),
            ..Options::default()
        },
    )
    .unwrap()
    .plan;
    let plan_path = dir.join("host4.plan.ron");
    plan.save(&plan_path).unwrap();
    // "Measurements": the simulator with a calibration the fit does not know.
    let truth = hccl_topologies::Calibration {
        base_scale: 2.0,
        message_scale: [3.0, 1.0, 1.0],
        bandwidth: vec![(64, 1.0), (1 << 20, 3.0), (16 << 20, 0.8)],
        ..hccl_topologies::Calibration::identity("truth")
    };
    let sim = Simulator::new(
        Network::new(&topo),
        CostModel::uncalibrated_for(&topo).calibrated(&truth),
    );
    let mut rows = Vec::new();
    for (i, e) in plan.entries.iter().enumerate() {
        for bytes in [64u64, 4096, 1 << 20, 16 << 20] {
            if bytes >= e.min_bytes && e.max_bytes.is_none_or(|m| bytes < m) {
                let t = sim.simulate(&e.schedule, bytes, Protocol::Simple).unwrap();
                rows.push(serde_json::json!({"bytes": bytes, "time_us": t.time_us, "entry": i}));
            }
        }
    }
    let run = serde_json::json!({
        "collective": "allreduce", "root": null, "ranks": 4,
        "plan_file": plan_path.display().to_string(), "rows": rows,
    });
    let run_path = dir.join("run.json");
    std::fs::write(&run_path, run.to_string()).unwrap();
    let out_path = dir.join("host4.calibrated.ron");
    let out = hcclc(&[
        "calibrate",
        topo_path.to_str().unwrap(),
        "--from",
        run_path.to_str().unwrap(),
        "-o",
        out_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let after = doc["median_abs_error"].as_f64().unwrap();
    let before = doc["median_abs_error_before"].as_f64().unwrap();
    assert!(
        after < 0.05,
        "median error after the fit {after} (before {before})"
    );
    assert!(before > 0.2, "the data must need a fit: {before}");
    let written = hccl_topologies::load(&out_path).unwrap();
    assert!(written.spec.calibration.is_some());

    // `topo gen host --calibration` carries the calibration and the bandwidth it is relative to.
    let gen_path = dir.join("gen.ron");
    let out = hcclc(&[
        "topo",
        "gen",
        "host",
        "--ranks",
        "4",
        "--calibration",
        out_path.to_str().unwrap(),
        "-o",
        gen_path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let generated = hccl_topologies::load(&gen_path).unwrap();
    assert_eq!(generated.spec.calibration, written.spec.calibration);
    assert_eq!(generated.mem_bw(0), 8.0);
    let _ = std::fs::remove_dir_all(&dir);
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn bad_runs_are_refused_with_the_file_and_row_named() {
    let dir = scratch("bad");
    let topo = write(
        &dir,
        "h2.ron",
        &hccl_topologies::to_ron(&hccl_topologies::generate::host(2, 8.0)),
    );
    let t = topo.to_str().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("notjson.json", "{ rows: ", "not JSON"),
        (
            "noplan.json",
            r#"{"collective":"allreduce","ranks":2,"plan_file":null,"rows":[]}"#,
            "names no plan file",
        ),
        (
            "ranks.json",
            r#"{"collective":"allreduce","ranks":8,"plan_file":"x","rows":[]}"#,
            "measured on 8 ranks",
        ),
        (
            "coll.json",
            r#"{"collective":"allsum","ranks":2,"plan_file":"x","rows":[]}"#,
            "unknown `allsum`",
        ),
        // A rooted collective's run must say its root: a missing one is not read as 0.
        (
            "noroot.json",
            r#"{"collective":"broadcast","ranks":2,"plan_file":"x","rows":[]}"#,
            "no `root` field: a broadcast run must say its root",
        ),
        (
            "badroot.json",
            r#"{"collective":"reduce","root":5,"ranks":2,"plan_file":"x","rows":[]}"#,
            "root: `5` is not a rank of the 2 ranks",
        ),
    ];
    for (name, body, want) in cases {
        let p = write(&dir, name, body);
        let out = hcclc(&["calibrate", t, "--from", p.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
        let msg = text(&out);
        assert!(msg.contains(name) && msg.contains(want), "{name}: {msg}");
    }
    // A row naming an entry the plan does not have.
    let spec = hccl_topologies::generate::host(2, 8.0);
    let topo2 = hccl_topologies::build(spec, "h2").unwrap();
    let plan = search::compile(
        &topo2,
        &Options {
            collectives: vec![CollectiveKind::AllReduce],
            sizes: vec![64],
            ..Options::default()
        },
    )
    .unwrap()
    .plan;
    let plan_path = dir.join("p.plan.ron");
    plan.save(&plan_path).unwrap();
    let body = serde_json::json!({
        "collective": "allreduce", "ranks": 2, "plan_file": plan_path.display().to_string(),
        "rows": [{"bytes": 64, "time_us": 1.0, "entry": 0}, {"bytes": 64, "time_us": 1.0, "entry": 9}],
    });
    let p = write(&dir, "entry.json", &body.to_string());
    let out = hcclc(&["calibrate", t, "--from", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("rows[1]: entry 9 is not in"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
