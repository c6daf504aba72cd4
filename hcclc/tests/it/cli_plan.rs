//! `hcclc verify|show` on plan files: text and JSON snapshots and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs hcclc from the repository root so that paths in the output stay relative.
fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
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

/// A sealed 6-rank ring plan (every collective, two sizes) written with a rank index, in a
/// temporary file.
fn sealed_ring_plan(tag: &str) -> PathBuf {
    let topo = hccl_topologies::build(hccl_topologies::generate::ring(6, 50.0, 1.0), "ring-6")
        .expect("ring builds");
    let options = hccl_compiler::search::Options {
        sizes: vec![4096, 1 << 20],
        ..Default::default()
    };
    let plan = hccl_compiler::search::compile(&topo, &options)
        .expect("compiles")
        .plan;
    assert!(plan.sealed().iter().all(|s| *s));
    assert!(
        plan.entries.iter().any(|e| !e.is_compact()),
        "an explicit entry"
    );
    let path =
        std::env::temp_dir().join(format!("hcclc-rank-{tag}-{}.plan.ron", std::process::id()));
    std::fs::write(&path, plan.to_ron_indexed()).expect("written");
    path
}

#[test]
fn verify_one_rank_runs_and_times_the_start_checks() {
    let path = sealed_ring_plan("ok");
    let p = path.to_str().expect("utf-8 path");
    let out = hcclc(&["verify", p, "--rank", "2"]);
    let text = transcript(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(": rank 2: ok:") && text.contains("sealed"),
        "{text}"
    );
    let out = hcclc(&["verify", p, "--rank", "5", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", transcript(&out));
    let doc = json(&out);
    assert_eq!(doc["rank"], 5);
    assert_eq!(doc["ok"], true);
    let entries = doc["summary"]["entries"].as_u64().expect("entries");
    assert!(entries > 0);
    assert_eq!(doc["summary"]["sealed_entries"].as_u64(), Some(entries));
    assert!(doc["identity"].is_string());
    for t in ["load_ms", "checks_ms", "total_ms"] {
        assert!(
            doc["timings"][t].as_f64().is_some_and(|v| v >= 0.0),
            "{t}: {doc}"
        );
    }
    assert!(doc["entries"][0]["rank_steps"].is_u64());
    // No rank 6 in a 6-rank plan; --rank reads plan files only.
    let out = hcclc(&["verify", p, "--rank", "6"]);
    assert_eq!(out.status.code(), Some(2), "{}", transcript(&out));
    assert!(transcript(&out).contains("rank 6"), "{}", transcript(&out));
    let out = hcclc(&[
        "verify",
        "ir/tests/data/msccl/allgather_ring_r8_ch1_i1_ll128.xml",
        "--rank",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", transcript(&out));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn verify_one_rank_names_the_rank_whose_program_was_edited() {
    let path = sealed_ring_plan("edited");
    let mut plan = hccl_ir::PlanFile::load(&path).expect("loads");
    let i = plan
        .entries
        .iter()
        .position(|e| !e.is_compact() && !e.schedule.ranks[4].streams.is_empty())
        .expect("an explicit entry in which rank 4 works");
    plan.entries[i].schedule.ranks[4].streams[0].steps[0].count += 1;
    std::fs::write(&path, plan.to_ron_indexed()).expect("edited");
    let p = path.to_str().expect("utf-8 path");
    let out = hcclc(&["verify", p, "--rank", "4"]);
    let text = transcript(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("entry {i}")) && text.contains("rank 4's program"),
        "{text}"
    );
    // Rank 3 reads only its own programs, which are as sealed.
    let out = hcclc(&["verify", p, "--rank", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", transcript(&out));
    // The whole plan is refused as edited: a failed check, exit 1.
    let out = hcclc(&["verify", p]);
    assert_eq!(out.status.code(), Some(1), "{}", transcript(&out));
    let _ = std::fs::remove_file(&path);
}
