//! `hcclc synth` end to end: the packing against its max-flow bound (AllReduce trees against
//! equal blocks), a plan that verifies, and located errors with exit code 2 for bad input.

use crate::synth_common;

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
    let dir = std::env::temp_dir().join(format!("hcclc-synth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn synth_reports_the_packing_and_writes_a_plan_that_verifies() {
    let dir = scratch("ok");
    for (coll, root) in [("broadcast", "0"), ("reduce", "5")] {
        let out = hcclc(
            &[
                "synth",
                "dgx1-v100",
                "-c",
                coll,
                "--root",
                root,
                "--pieces",
                "8",
                "--channels",
                "12",
                "-o",
                "s.plan.ron",
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
        assert_eq!(doc["collective"], coll);
        assert_eq!(
            (&doc["calibration"]["kind"], &doc["calibration"]["from"]),
            (&"none".into(), &"the shipped machine dgx1-v100".into()),
            "the predictions name their calibration"
        );
        let rate = doc["rate_gbps"].as_f64().unwrap();
        let flow = doc["max_flow_gbps"].as_f64().unwrap();
        assert!(
            rate > 0.0 && rate <= flow * (1.0 + 1e-9),
            "{rate} vs {flow}"
        );
        let trees = doc["trees"].as_array().unwrap();
        assert!(!trees.is_empty() && trees.len() <= 8);
        let shares: f64 = trees.iter().map(|t| t["share"].as_f64().unwrap()).sum();
        assert!((shares - 1.0).abs() < 1e-9);
        // Piece widths share the resolution (chunk units per piece round) by rate.
        let units = doc["resolution"].as_u64().unwrap();
        assert!(hccl_compiler::synth::RESOLUTIONS.contains(&(units as u32)));
        let widths: u64 = trees
            .iter()
            .map(|t| t["piece_chunks"].as_u64().unwrap())
            .sum();
        assert_eq!(widths, units);
        assert_eq!(doc["chunks"], 8 * units);
        assert!(doc["lp_bound_gbps"].as_f64().unwrap() >= rate * (1.0 - 1e-9));
        assert_eq!(doc["optimal"], true);
        for t in trees {
            let parents = t["parent"].as_array().unwrap();
            assert_eq!(parents.len(), 8);
            assert!(parents[root.parse::<usize>().unwrap()].is_null());
            assert_eq!(t["root"].as_u64().unwrap(), root.parse::<u64>().unwrap());
        }
        let predicted = doc["predicted"].as_array().unwrap();
        assert_eq!(predicted.len(), 3);
        for p in predicted {
            assert!(p["bound_ratio"].as_f64().unwrap() >= 1.0 - 1e-9);
        }
        let verify = hcclc(&["verify", "s.plan.ron"], &dir);
        assert_eq!(verify.status.code(), Some(0));
    }
    // AllGather packs trees from every root; its plan verifies too.
    let out = hcclc(
        &[
            "synth",
            "dgx1-v100",
            "-c",
            "allgather",
            "--max-trees",
            "2",
            "--pieces",
            "2",
            "-o",
            "ag.plan.ron",
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
    assert!(doc["root"].is_null() && doc["max_flow_gbps"].is_null());
    let trees = doc["trees"].as_array().unwrap();
    for r in 0..8u64 {
        let mine = trees.iter().filter(|t| t["root"] == r).count();
        assert!((1..=2).contains(&mine), "root {r}: {mine} trees");
    }
    assert_eq!(
        hcclc(&["verify", "ag.plan.ron"], &dir).status.code(),
        Some(0)
    );
    // The table form states the bound and that the schedule verified.
    let out = hcclc(&["synth", "dgx-h100"], &dir);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("LP bound") && text.contains("max-flow") && text.contains("verified"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a torus the link-disjoint trees reach the bound in as many trees as the root has
/// links, where the LP's support pruned to 8 trees carries 150 of 200 GB/s; `hcclc synth`
/// shows what the search lowers, and says so. DGX-1's are fewer than its LP's, and stay.
#[test]
fn synth_takes_the_link_disjoint_trees_where_they_reach_the_bound() {
    let dir = scratch("disjoint");
    let made = hcclc(
        &[
            "topo",
            "gen",
            "torus",
            "--dims",
            "4x4",
            "--bw",
            "50",
            "--latency",
            "1",
            "-o",
            "torus.ron",
        ],
        &dir,
    );
    assert_eq!(made.status.code(), Some(0));
    for (coll, trees) in [("broadcast", 4), ("reduce", 4), ("allgather", 64)] {
        let out = hcclc(&["synth", "torus.ron", "-c", coll, "--json"], &dir);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["method"], "disjoint-arborescences", "{coll}");
        let (rate, bound) = (
            doc["rate_gbps"].as_f64().unwrap(),
            doc["lp_bound_gbps"].as_f64().unwrap(),
        );
        assert!(rate >= bound * (1.0 - 1e-3), "{coll}: {rate} of {bound}");
        assert_eq!(doc["trees"].as_array().unwrap().len(), trees, "{coll}");
        let text = hcclc(&["synth", "torus.ron", "-c", coll], &dir);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("link-disjoint trees"), "{text}");
    }
    let out = hcclc(&["synth", "dgx1-v100", "-c", "broadcast", "--json"], &dir);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["method"], "lp-tree-packing");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let dir = scratch("bad");
    for (args, says) in [
        (
            &["synth", "dgx1-v100", "-c", "alltoall"][..],
            "broadcast, reduce, allgather, reducescatter and allreduce",
        ),
        (
            &["synth", "dgx1-v100", "-c", "gather"],
            "unknown collective",
        ),
        (&["synth", "dgx1-v100", "--root", "8"], "--root 8"),
        (&["synth", "dgx1-v100", "--max-trees", "0"], "--max-trees 0"),
        (&["synth", "dgx1-v100", "--pieces", "0"], "--pieces 0"),
        (&["synth", "dgx1-v100", "--pieces", "4096"], "--pieces 4096"),
        (
            &["synth", "dgx1-v100", "--max-trees", "4", "--channels", "3"],
            "--channels 3",
        ),
        (&["synth", "no-such-machine"], "no-such-machine"),
    ] {
        let out = hcclc(args, &dir);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hcclc compile --synth`: `off` leaves the synthesizers out, `auto` lets the packed trees
/// win where they are faster and records their synthesis in the plan, the table and the JSON
/// rows; `explain` shows the record again from the plan file; a bad level exits 2.
#[test]
fn compile_synth_levels_and_the_recorded_synthesis() {
    let dir = scratch("levels");
    let compile = |level: &str, out: &str| {
        hcclc(
            &[
                "compile",
                "dgx-h100",
                "-c",
                "broadcast",
                "--sizes",
                "1G..1G",
                "--synth",
                level,
                "-o",
                out,
                "--json",
            ],
            &dir,
        )
    };
    let off = compile("off", "off.plan.ron");
    assert_eq!(off.status.code(), Some(0));
    let off: serde_json::Value = serde_json::from_slice(&off.stdout).unwrap();
    let auto = compile("auto", "auto.plan.ron");
    assert_eq!(auto.status.code(), Some(0));
    let auto: serde_json::Value = serde_json::from_slice(&auto.stdout).unwrap();
    let (off, auto) = (&off["rows"][0], &auto["rows"][0]);
    assert_ne!(off["algorithm"], "packed_trees");
    assert!(off["synthesis"].is_null());
    assert_eq!(auto["algorithm"], "packed_trees");
    assert!(auto["predicted_us"].as_f64().unwrap() < off["predicted_us"].as_f64().unwrap());
    let record = &auto["synthesis"];
    // At 1 GiB the two equal-rate trees at the LP's 450 GB/s win over the LP's own four.
    assert_eq!(record["method"], "equal-rate-trees");
    assert_eq!(record["unit"], "GB/s");
    assert_eq!(record["proven"], true);
    let (value, optimum) = (
        record["value"].as_f64().unwrap(),
        record["optimum"].as_f64().unwrap(),
    );
    assert!(value > 0.0 && value <= optimum * (1.0 + 1e-9), "{record}");
    // The plan file keeps the record; explain reads it back and prints it under the table.
    let text = std::fs::read_to_string(dir.join("auto.plan.ron")).unwrap();
    assert!(text.contains("equal-rate-trees"));
    let explain = hcclc(&["explain", "auto.plan.ron", "--sizes", "1G..1G"], &dir);
    assert_eq!(explain.status.code(), Some(0));
    let shown = String::from_utf8_lossy(&explain.stdout);
    assert!(
        shown.contains("packed_trees: equal-rate-trees gives") && shown.contains("proven optimum"),
        "{shown}"
    );
    let bad = compile("most", "bad.plan.ron");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--synth most"));
    assert!(!dir.join("bad.plan.ron").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pareto_prints_sccls_dgx1_frontier_and_writes_plans_that_verify() {
    let dir = scratch("pareto");
    let out = hcclc(
        &[
            "synth",
            "dgx1-v100",
            "-c",
            "allgather",
            "--pareto",
            "--max-steps",
            "4",
            "-o",
            "front",
        ],
        &dir,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(">= 2 steps") && text.contains(">= 7/6"),
        "{text}"
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() > 9 && w[3].contains('.') && w[9].starts_with("least"))
        .collect();
    let points: Vec<(&str, &str, &str)> = rows.iter().map(|w| (w[0], w[1], w[2])).collect();
    assert_eq!(points, vec![("2", "3", "2"), ("3", "7", "6")], "{text}");
    assert!(text.contains("meets the bound"), "{text}");
    for name in ["allgather-s2-r3-c2.plan.ron", "allgather-s3-r7-c6.plan.ron"] {
        let path = format!("front/{name}");
        let verify = hcclc(&["verify", &path], &dir);
        assert_eq!(
            verify.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
        let xml = hcclc(&["export", &path, "--to", "msccl-xml"], &dir);
        assert_eq!(xml.status.code(), Some(0), "{name}");
        assert!(String::from_utf8_lossy(&xml.stdout).contains("coll=\"allgather\""));
    }
    // The JSON document: the bound, both points with predictions, and every instance tried.
    let out = hcclc(
        &[
            "synth",
            "dgx1-v100",
            "-c",
            "reducescatter",
            "--pareto",
            "--max-steps",
            "3",
            "--json",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["collective"], "reducescatter");
    assert_eq!(doc["bound"]["rounds"], 7);
    assert_eq!(doc["bound"]["chunks"], 6);
    assert_eq!(doc["least_steps"], 2);
    assert_eq!(doc["at_bound"], true);
    assert_eq!(doc["links"][0], serde_json::json!([0, 2, 1, 1, 2, 0, 0, 0]));
    let points = doc["points"].as_array().unwrap();
    let got: Vec<(u64, u64, u64)> = points
        .iter()
        .map(|p| {
            (
                p["steps"].as_u64().unwrap(),
                p["rounds"].as_u64().unwrap(),
                p["chunks"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, vec![(2, 3, 2), (3, 7, 6)]);
    for p in points {
        assert_eq!(p["verified"], true);
        assert_eq!(p["proven"], true);
        let split: u64 = p["rounds_per_step"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .sum();
        assert_eq!(split, p["rounds"].as_u64().unwrap());
        let predicted = p["predicted"].as_array().unwrap();
        assert_eq!(predicted.len(), 3);
        assert!(
            predicted
                .iter()
                .all(|t| t["time_us"].as_f64().unwrap() > 0.0)
        );
        assert!(p["solver_s"].as_f64().unwrap() >= 0.0);
    }
    let tried = doc["tried"].as_array().unwrap();
    assert!(tried.iter().any(|t| t["stop"] == "infeasible"));
    assert!(tried.iter().all(|t| t["stop"] != "time-limit"));
    // A time limit too short for any solve is reported as such, and is no failure.
    let out = hcclc(
        &[
            "synth",
            "dgx1-v100",
            "-c",
            "allgather",
            "--pareto",
            "--max-steps",
            "2",
            "--max-chunks",
            "2",
            "--time-limit",
            "0.000001",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("time-limit"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pareto_bad_input_exits_2_with_the_reason() {
    let dir = scratch("pareto-bad");
    // A machine whose GPUs meet only at a switch: no direct links for the model.
    let spec = hccl_topologies::generate::fat_tree(4, 4, 25.0, 1.0);
    std::fs::write(dir.join("switched.ron"), hccl_topologies::to_ron(&spec)).unwrap();
    let p = ["synth", "dgx1-v100", "--pareto"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v: Vec<&'static str> = p.to_vec();
        v.extend_from_slice(extra);
        v
    };
    for (args, says) in [
        (with(&["-c", "alltoall"]), "not alltoall"),
        (with(&["-c", "gather"]), "unknown collective"),
        (with(&["--max-steps", "0"]), "--max-steps 0"),
        (with(&["--max-steps", "1000"]), "--max-steps 1000"),
        (with(&["--max-chunks", "0"]), "--max-chunks 0"),
        (with(&["--time-limit", "0"]), "--time-limit 0"),
        (with(&["--time-limit=-3"]), "--time-limit -3"),
        (with(&["--time-limit", "NaN"]), "--time-limit NaN"),
        (with(&["--time-limit", "soon"]), "soon"),
        (with(&["-c", "broadcast", "--root", "8"]), "--root 8"),
        (
            vec!["synth", "switched.ron", "--pareto"],
            "no direct device-to-device links",
        ),
    ] {
        let out = hcclc(&args, &dir);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// AllReduce: trees carrying data both ways on a 6-ring with two slower chords reach the
/// gossip bound's 130 GB/s, against 120 for equal blocks; the plan written verifies.
#[test]
fn synth_packs_allreduce_trees_beyond_equal_blocks() {
    let dir = scratch("allreduce");
    std::fs::write(dir.join("chorded.ron"), synth_common::MIXED).unwrap();
    let out = hcclc(
        &[
            "synth",
            "chorded.ron",
            "-c",
            "allreduce",
            "--pieces",
            "8",
            "--channels",
            "16",
            "-o",
            "ar.plan.ron",
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
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rate = doc["rate_gbps"].as_f64().unwrap();
    let bound = doc["lp_bound_gbps"].as_f64().unwrap();
    let equal = doc["equal_blocks_gbps"].as_f64().unwrap();
    assert!((bound - 130.0).abs() < 0.1, "{doc}");
    assert!(
        rate <= bound * (1.0 + 1e-6) && rate >= 0.99 * bound,
        "{doc}"
    );
    assert!((equal - 120.0).abs() < 0.1, "{doc}");
    let verify = hcclc(&["verify", "ar.plan.ron"], &dir);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
