//! `hcclc synth` end to end: the packing against its max-flow bound, a plan that verifies,
//! and located errors with exit code 2 for bad input.

use std::path::Path;
use std::process::{Command, Output};

fn hcclc(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
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

#[test]
fn bad_input_exits_2_with_the_reason() {
    let dir = scratch("bad");
    for (args, says) in [
        (
            &["synth", "dgx1-v100", "-c", "alltoall"][..],
            "broadcast, reduce, allgather and reducescatter",
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
