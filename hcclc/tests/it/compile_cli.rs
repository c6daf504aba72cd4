//! `hcclc compile` and `hcclc explain` end to end: tables, JSON contract, exit codes.

use std::path::Path;
use std::process::{Command, Output};

fn hcclc(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("hcclc runs")
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hcclc-compile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dgx1_allreduce_table() {
    let dir = scratch("table");
    let out = hcclc(
        &[
            "compile",
            "dgx1-v100",
            "-c",
            "allreduce",
            "--sizes",
            "1K..1G",
        ],
        &dir,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Default output: <topology stem>.plan.ron in the current directory.
    assert!(dir.join("dgx1-v100.plan.ron").exists());
    insta::assert_snapshot!(stdout(&out));
    // docs/benchmarks.md's dgx1-v100 table is this output (it goes on to 4 GiB): every row is
    // there; the README quotes a few of its rows.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tables =
        std::fs::read_to_string(root.join("docs/benchmarks.md")).expect("docs/benchmarks.md");
    let text = stdout(&out);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 21, "1 KiB to 1 GiB");
    for row in &rows {
        assert!(
            tables.contains(&format!("\n{row}\n")),
            "docs/benchmarks.md's dgx1-v100 table lacks `{row}`: regenerate it \
             (scripts/readme-tables.sh)"
        );
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let quoted: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("  ") && l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(
        !quoted.is_empty(),
        "README.md quotes rows of the dgx1-v100 table"
    );
    for row in quoted {
        assert!(
            rows.contains(&row),
            "README.md quotes `{row}`, which hcclc compile no longer prints: copy the row from \
             docs/benchmarks.md"
        );
    }
    // Progress bars only go to terminals: stderr stays empty here.
    assert!(out.stderr.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_rows_follow_the_contract_and_explain_agrees() {
    let dir = scratch("json");
    let out = hcclc(
        &[
            "compile",
            "dgx-h100",
            "-c",
            "allgather,broadcast",
            "--sizes",
            "4K..64K",
            "-o",
            "h.plan.ron",
            "--json",
        ],
        &dir,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["plan"], "h.plan.ron");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 5);
    let keys = [
        "collective",
        "bytes",
        "algorithm",
        "channels",
        "chunks",
        "protocol",
        "predicted_us",
        "algbw_gbps",
        "busbw_gbps",
        "baseline_algorithm",
        "baseline_us",
        "baseline_source",
        "bound_us",
    ];
    for row in rows {
        for key in keys {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
    }
    // A shipped machine carries no calibration: the predictions say so, and how to get one.
    assert_eq!(doc["calibration"]["kind"], "none", "{}", doc["calibration"]);
    assert_eq!(doc["calibration"]["from"], "the shipped machine dgx-h100");
    assert!(
        doc["calibration"]["how_to_calibrate"]
            .as_str()
            .is_some_and(|h| h.contains("hccl-perf --calibrate")),
        "{}",
        doc["calibration"]
    );
    // NCCL's ring, simulated on one box.
    assert!(rows.iter().all(|r| r["baseline_source"] == "simulated"));
    assert_eq!(rows[0]["collective"], "allgather");
    assert_eq!(rows[0]["bytes"], 4096);
    assert_eq!(rows[9]["collective"], "broadcast");

    let ex = hcclc(
        &["explain", "h.plan.ron", "--sizes", "4K..64K", "--json"],
        &dir,
    );
    assert_eq!(
        ex.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ex.stderr)
    );
    let ex: serde_json::Value = serde_json::from_slice(&ex.stdout).unwrap();
    let ex_rows = ex["rows"].as_array().unwrap();
    assert_eq!(ex_rows.len(), rows.len());
    for (a, b) in ex_rows.iter().zip(rows) {
        for key in [
            "collective",
            "bytes",
            "algorithm",
            "protocol",
            "predicted_us",
            "bound_us",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_2() {
    let dir = scratch("bad");
    for args in [
        &["compile", "no-such-machine"][..],
        &["compile", "dgx1-v100", "-c", "gather"],
        &["compile", "dgx1-v100", "--sizes", "1G..1K"],
        &["compile", "dgx1-v100", "--sizes", "lots"],
        &[
            "compile",
            "dgx1-v100",
            "--algo",
            "warp_drive",
            "-c",
            "allreduce",
        ],
        &["explain", "missing.plan.ron"],
        &["compile", "dgx1-v100", "--proto", "LL256"],
        &["compile", "dgx1-v100", "--proto", ","],
    ] {
        let out = hcclc(args, &dir);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stdout(&out));
        assert!(!out.stderr.is_empty());
    }
    // A plan for 8 ranks explained against a 16-rank machine is bad input too.
    let out = hcclc(
        &[
            "compile",
            "dgx1-v100",
            "-c",
            "reduce",
            "--sizes",
            "1K",
            "-o",
            "p.ron",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(0));
    std::fs::write(
        dir.join("c.ron"),
        hccl_topologies::to_ron(&hccl_topologies::generate::ring(16, 25.0, 1.0)),
    )
    .unwrap();
    let out = hcclc(&["explain", "p.ron", "--topo", "c.ron"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--proto` restricts the protocols; a CPU host offers LL and Simple only, and asking it for
/// LL128 alone is bad input that says what it offers.
#[test]
fn proto_restricts_protocols_and_cpu_hosts_offer_ll_and_simple() {
    let dir = scratch("proto");
    std::fs::write(
        dir.join("h.ron"),
        hccl_topologies::to_ron(&hccl_topologies::generate::host(2, 6.0)),
    )
    .unwrap();
    let protocols = |args: &[&str]| -> Vec<String> {
        let mut full = vec!["compile", "h.ron", "-c", "allreduce", "--sizes", "8..16M"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "p.ron", "--json"]);
        let out = hcclc(&full, &dir);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stdout(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut seen: Vec<String> = doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["protocol"].as_str().unwrap().to_string())
            .collect();
        seen.dedup();
        seen
    };
    // The model's own choice: LL for small calls, Simple once LL's small slots cost more.
    assert_eq!(protocols(&[]), ["LL", "Simple"]);
    assert_eq!(protocols(&["--proto", "simple"]), ["Simple"]);
    assert_eq!(protocols(&["--proto", "LL"]), ["LL"]);
    let out = hcclc(
        &["compile", "h.ron", "-c", "allreduce", "--proto", "LL128"],
        &dir,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("offers LL, Simple"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A collective nothing schedules (here AllToAll with `--algo ring`) is left out: the plan of
/// the others is written and verifies, and the command exits 1 naming what is missing. With
/// nothing schedulable at all, nothing is written.
#[test]
fn unschedulable_collectives_are_left_out_and_named() {
    let dir = scratch("partial");
    let args = [
        "compile",
        "dgx1-v100",
        "-c",
        "allreduce,alltoall",
        "--algo",
        "ring",
        "--sizes",
        "1M..1M",
        "-o",
        "p.plan.ron",
    ];
    let out = hcclc(&args, &dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("wrote p.plan.ron without alltoall: no verified schedule for alltoall"),
        "{err}"
    );
    let plan = hccl_ir::PlanFile::load(&dir.join("p.plan.ron")).expect("the plan is written");
    assert!(!plan.entries.is_empty());
    assert!(
        plan.entries
            .iter()
            .all(|e| e.schedule.collective == hccl_ir::Collective::AllReduce)
    );
    let verify = hcclc(&["verify", "p.plan.ron"], &dir);
    assert_eq!(verify.status.code(), Some(0));

    let none = hcclc(
        &[
            "compile",
            "dgx1-v100",
            "-c",
            "alltoall",
            "--algo",
            "ring",
            "-o",
            "none.plan.ron",
        ],
        &dir,
    );
    assert_eq!(none.status.code(), Some(1));
    assert!(!dir.join("none.plan.ron").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where NCCL's algorithm is too large to simulate at 3 sizes within `--sim-budget` (the
/// double binary tree from about 2048 ranks by default), the `nccl` column is NCCL's own
/// formula, and the table and the JSON say so.
#[test]
fn a_baseline_too_large_to_simulate_is_nccls_formula_and_says_so() {
    let dir = scratch("modelled");
    let generated = hcclc(
        &[
            "topo", "gen", "cluster", "--nodes", "2", "--box", "dgx-h100", "-o", "c.ron",
        ],
        &dir,
    );
    assert_eq!(generated.status.code(), Some(0));
    let compile = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            "c.ron",
            "-c",
            "allreduce",
            "--sizes",
            "1K..4K",
            "-o",
            "c.plan.ron",
        ];
        args.extend_from_slice(extra);
        let out = hcclc(&args, &dir);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let sources = |out: &Output| -> Vec<(String, String)> {
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["baseline_algorithm"].as_str().unwrap_or("-").to_string(),
                    r["baseline_source"].as_str().unwrap_or("-").to_string(),
                )
            })
            .collect()
    };
    let tree = |source: &str| vec![("tree".to_string(), source.to_string()); 3];
    assert_eq!(sources(&compile(&["--json"])), tree("simulated"));
    // 100 steps: no tree of 16 ranks is simulated at 3 sizes.
    assert_eq!(
        sources(&compile(&["--sim-budget", "100", "--json"])),
        tree("nccl-model")
    );
    let table = stdout(&compile(&["--sim-budget", "100"]));
    assert_eq!(table.matches("tree/LL (model)").count(), 3, "{table}");
    assert!(
        table.contains("(model): NCCL's own tuning formula"),
        "{table}"
    );
    assert!(!stdout(&compile(&[])).contains("(model)"));
    let zero = hcclc(&["compile", "c.ron", "--sim-budget", "0"], &dir);
    assert_eq!(zero.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Predictions say which calibration they use: the built-in default (the development
/// machine's, with where and when it was measured, and how to calibrate), or the topology's
/// own (and from which file).
#[test]
fn predictions_say_which_calibration_they_use() {
    let dir = scratch("calibration");
    let builtin = {
        let mut spec = hccl_topologies::generate::host(2, 5.0);
        spec.calibration = Some(hccl_compiler::cost::calibrate::builtin_cpu_calibration(
            2, 2,
        ));
        spec
    };
    let own = {
        let mut spec = hccl_topologies::generate::host(2, 5.0);
        spec.calibration = Some(hccl_topologies::Calibration::identity(
            "hccl-perf --calibrate: allreduce on 2 ranks, host box7, 2026-12-04",
        ));
        spec
    };
    for (file, spec) in [("builtin.ron", builtin), ("own.ron", own)] {
        std::fs::write(dir.join(file), hccl_topologies::to_ron(&spec)).unwrap();
    }
    let run = |file: &str, json: bool| {
        let mut args = vec![
            "compile",
            file,
            "-c",
            "allreduce",
            "--sizes",
            "1K",
            "-o",
            "p.ron",
        ];
        if json {
            args.push("--json");
        }
        let out = hcclc(&args, &dir);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
    };
    let doc: serde_json::Value = serde_json::from_str(&run("builtin.ron", true)).unwrap();
    let cal = &doc["calibration"];
    assert_eq!(cal["kind"], "built-in", "{cal}");
    assert!(
        cal["source"]
            .as_str()
            .is_some_and(|s| s.contains("development VM") && s.contains("2026-12-01")),
        "{cal}"
    );
    assert!(
        cal["how_to_calibrate"]
            .as_str()
            .is_some_and(|h| h.contains("hccl-perf --calibrate")),
        "{cal}"
    );
    let text = run("builtin.ron", false);
    assert!(
        text.contains(
            "calibration: the built-in default, not measured on this machine (fitted on the \
             development VM (AMD EPYC, 2 cores, process backend, 2026-12-01), a core per rank); \
             to calibrate: `hccl-perf --calibrate OUT.ron`"
        ),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&run("own.ron", true)).unwrap();
    let cal = &doc["calibration"];
    assert_eq!(
        (&cal["kind"], &cal["from"], &cal["how_to_calibrate"]),
        (&"own".into(), &"own.ron".into(), &serde_json::Value::Null),
        "{cal}"
    );
    let text = run("own.ron", false);
    assert!(
        text.contains(
            "calibration: this machine's own, from own.ron (hccl-perf --calibrate: allreduce on \
             2 ranks, host box7, 2026-12-04)"
        ),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-v` prints the search's report on stderr (a line per phase of every collective) and
/// `--json` carries it as `search_report`: per collective the phases in order, each with
/// candidates in and out, its wall time and stop reasons; a collective left out says why.
#[test]
fn the_search_reports_its_phases() {
    let dir = scratch("report");
    let out = hcclc(
        &[
            "compile",
            "dgx1-v100",
            "-c",
            "allreduce,alltoall",
            "--algo",
            "ring",
            "--sizes",
            "4K..64K",
            "-o",
            "r.plan.ron",
            "-v",
            "--json",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(1), "alltoall has no ring");
    let err = String::from_utf8_lossy(&out.stderr);
    for phase in [
        "generate",
        "screen",
        "cost",
        "refine",
        "select and verify",
        "emit",
    ] {
        assert!(err.contains(&format!("  {phase} ")), "{phase}: {err}");
    }
    assert!(
        err.contains("alltoall: left out: no verified schedule"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // A plan with a collective left out is not kept in the plan cache.
    assert_eq!(doc["plan_cache"], "not_stored");
    let report = &doc["search_report"];
    assert!(report["wall_s"].as_f64().unwrap() >= 0.0);
    let collectives = report["collectives"].as_array().unwrap();
    assert_eq!(collectives.len(), 2);
    assert_eq!(collectives[0]["collective"], "AllReduce");
    assert!(collectives[0]["skipped"].is_null());
    let phases: Vec<&str> = collectives[0]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "generate",
            "screen",
            "cost",
            "refine",
            "select_and_verify",
            "emit"
        ]
    );
    let emit = &collectives[0]["phases"][5];
    assert_eq!(emit["candidates_in"], 5, "five sizes");
    assert!(emit["candidates_out"].as_u64().unwrap() >= 1);
    assert!(
        collectives[1]["skipped"]
            .as_str()
            .unwrap()
            .starts_with("no verified schedule")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
