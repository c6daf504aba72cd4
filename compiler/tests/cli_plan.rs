//! `hcclc verify|show` on plan files: text and JSON snapshots and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs hcclc from the repository root so that paths in the output stay relative.
fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("hcclc runs")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Exit code, stdout and stderr in one snapshot-friendly text.
fn transcript(out: &Output) -> String {
    format!(
        "exit: {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

#[test]
fn verify_good_plans() {
    let out = hcclc(&["verify", "tests/data/ring_allreduce_8.plan.ron"]);
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!(transcript(&out));
    let out = hcclc(&["verify", "tests/data/pair_allreduce.plan.ron"]);
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!("verify_pair", transcript(&out));
}

#[test]
fn verify_failing_plan_lists_located_errors() {
    let out = hcclc(&["verify", "tests/data/bad_verify.plan.ron"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().all(|l| l.starts_with("entry ")), "{text}");
    assert!(text.contains("entry 1 (allreduce 1M.. direct): rank 1 stream 0 (channel 0) step 1: "));
    insta::assert_snapshot!(transcript(&out));
}

#[test]
fn verify_json() {
    let out = hcclc(&["verify", "--json", "tests/data/bad_verify.plan.ron"]);
    assert_eq!(out.status.code(), Some(1));
    let doc = json(&out);
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["summary"]["entries"], 3);
    assert_eq!(doc["summary"]["failed_entries"], 2);
    assert_eq!(doc["entries"][1]["errors"][0]["kind"], "bad_reduction");
    assert_eq!(doc["entries"][1]["errors"][0]["rank"], 1);
    insta::assert_json_snapshot!(doc);

    let out = hcclc(&["verify", "--json", "tests/data/ring_allreduce_8.plan.ron"]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json(&out);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["summary"]["steps"], 232);
    assert_eq!(doc["entries"][0]["report"]["depth"], 29);
}

#[test]
fn malformed_and_missing_files_exit_2() {
    for (name, path) in [
        ("truncated", "ir/tests/bad_plans/truncated.ron"),
        ("newer_version", "ir/tests/bad_plans/newer_version.ron"),
        ("missing", "tests/data/no_such.plan.ron"),
    ] {
        for cmd in ["verify", "show"] {
            let out = hcclc(&[cmd, path]);
            assert_eq!(out.status.code(), Some(2), "{cmd} {path}");
            assert!(out.stdout.is_empty());
            if cmd == "verify" {
                insta::assert_snapshot!(format!("bad_input_{name}"), transcript(&out));
            }
        }
    }
}

#[test]
fn show_text() {
    let out = hcclc(&["show", "tests/data/bad_verify.plan.ron"]);
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!(transcript(&out));
}

#[test]
fn show_json() {
    let out = hcclc(&["show", "--json", "tests/data/ring_allreduce_8.plan.ron"]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json(&out);
    let entry = &doc["entries"][0];
    assert_eq!(entry["collective"], "allreduce");
    assert_eq!(entry["ranks"], 8);
    assert_eq!(
        entry["programs"][3]["streams"][1]["steps"][0],
        "rrc from 2 o[2]->o[2] x1 deps [s0:0]"
    );
    assert_eq!(
        entry["programs"][3]["streams"][0]["steps"][2],
        "s to 4 o[2]-> x1 deps [s1:0]"
    );
    let out = hcclc(&["show", "--json", "tests/data/pair_allreduce.plan.ron"]);
    insta::assert_json_snapshot!(json(&out));
}

#[test]
fn verify_msccl_xml() {
    let out = hcclc(&[
        "verify",
        "ir/tests/data/msccl/allgather_ring_r8_ch1_i1_ll128.xml",
    ]);
    insta::assert_snapshot!(transcript(&out));
    assert_eq!(out.status.code(), Some(0));
    let out = hcclc(&[
        "show",
        "--json",
        "ir/tests/data/msccl/allgather_ring_r8_ch1_i1_ll128.xml",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["entries"][0]["collective"], "allgather");
}
