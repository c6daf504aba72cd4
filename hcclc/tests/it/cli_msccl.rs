//! `hcclc verify|import|export` on MSCCL XML: every corpus file, the quirks, and a corpus of
//! damaged files made here by mutating good ones. Exit codes: 0 good, 1 a wrong algorithm
//! (located), 2 a malformed file (located); never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .output()
        .expect("hcclc runs")
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir/tests/data/msccl")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// No output of ours may come from a panic.
fn assert_no_panic(out: &Output) {
    let err = stderr(out);
    assert!(
        !err.contains("panicked") && out.status.code().is_some(),
        "{err}"
    );
}

fn xml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_good_file_verifies_from_the_command_line() {
    let mut files = xml_files(&corpus());
    files.extend(xml_files(&corpus().join("prebuilt")));
    assert_eq!(files.len(), 27);
    for file in files {
        let out = hcclc(&["verify", file.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            file.display(),
            stdout(&out)
        );
    }
}

#[test]
fn quirks_get_the_documented_exit_codes() {
    let q = corpus().join("quirks");
    let check = |name: &str, code: i32, needle: &str| {
        let path = q.join(name);
        let out = hcclc(&["verify", path.to_str().unwrap()]);
        assert_no_panic(&out);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let text = stdout(&out) + &stderr(&out);
        assert!(
            text.contains(needle),
            "{name}: expected {needle:?} in\n{text}"
        );
    };
    // Mislabeled pipeline: located at a rank/stream/step.
    check(
        "not_allreduce_pipeline_ring_r16_ch1_i1_ll128.xml",
        1,
        "expected chunk",
    );
    // Reduces output chunks nothing has written.
    check("bad_synth_allgather_dgx1_steps2_i2.xml", 1, "stream");
    // Read with documented defaults.
    check("legacy_format_allreduce_ring_r8_ch1_i1_ll128.xml", 0, "");
    // reduce_scatter accepted as reducescatter.
    check("synth_reducescatter_dgx1_steps2_legacy_collname.xml", 0, "");
}

/// Writes `text` to a temporary XML file and verifies it.
fn verify_text(name: &str, text: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    hcclc(&["verify", path.to_str().unwrap()])
}

#[test]
fn damaged_files_are_rejected_with_located_errors() {
    let text =
        std::fs::read_to_string(corpus().join("allreduce_ring_r8_ch1_i1_ll128.xml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();

    // Wrong algorithms (exit 1): the error names rank, stream and step.
    let last_step_of_gpu0 = lines.iter().position(|l| l.contains("</tb>")).unwrap() - 1;
    let mut removed = lines.clone();
    removed.remove(last_step_of_gpu0);
    let peer_changed = text.replacen("send=\"1\" recv=\"7\"", "send=\"2\" recv=\"7\"", 1);
    let ap = std::fs::read_to_string(corpus().join("allreduce_allpairs_r8_i1_ll.xml")).unwrap();
    let dep_line = ap
        .lines()
        .position(|l| l.contains("type=\"re\"") && !l.contains("depid=\"-1\""))
        .unwrap();
    let dep_cut: Vec<String> = ap
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == dep_line {
                let start = l.find("depid=").unwrap();
                let end = l.find("hasdep=").unwrap();
                format!("{}depid=\"-1\" deps=\"-1\" {}", &l[..start], &l[end..])
            } else {
                l.to_string()
            }
        })
        .collect();
    for (name, damaged) in [
        ("removed.xml", removed.join("\n")),
        ("peer.xml", peer_changed),
        ("depcut.xml", dep_cut.join("\n")),
    ] {
        let out = verify_text(name, &damaged);
        assert_no_panic(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(stdout(&out).contains("rank "), "{name}: {}", stdout(&out));
        assert!(stdout(&out).contains(" step "), "{name}: {}", stdout(&out));
    }

    // Malformed files (exit 2): the error names the file, line and column.
    let malformed = [
        ("truncated.xml", text[..text.len() / 2].to_string()),
        ("empty.xml", String::new()),
        ("garbage.xml", "\u{1}\u{2}binary\u{0}".to_string()),
        (
            "unknown_type.xml",
            text.replacen("type=\"rrs\"", "type=\"rrx\"", 1),
        ),
        (
            "unknown_attr.xml",
            text.replacen("<tb id=\"0\"", "<tb colour=\"red\" id=\"0\"", 1),
        ),
        (
            "bad_number.xml",
            text.replacen("cnt=\"1\"", "cnt=\"one\"", 1),
        ),
        (
            "gap_in_s.xml",
            text.replacen("<step s=\"2\"", "<step s=\"9\"", 1),
        ),
        (
            "missing_gpu.xml",
            text.replacen("ngpus=\"8\"", "ngpus=\"9\"", 1),
        ),
        (
            "deep.xml",
            format!("{}{}", "<a>".repeat(50_000), "</a>".repeat(50_000)),
        ),
    ];
    for (name, damaged) in malformed {
        let out = verify_text(name, &damaged);
        assert_no_panic(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let err = stderr(&out);
        assert!(err.contains(name), "{name}: {err}");
        assert!(
            err.split(name)
                .nth(1)
                .is_some_and(|rest| rest.starts_with(':')),
            "{name}: no line:col in {err}"
        );
    }
}

#[test]
fn import_then_export_round_trips_through_files() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let plan = dir.join("ag.plan.ron");
    let xml = dir.join("ag.xml");
    let src = corpus().join("allgather_ring_r16_ch2_i2_simple.xml");
    let out = hcclc(&[
        "import",
        src.to_str().unwrap(),
        "-o",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = hcclc(&[
        "export",
        plan.to_str().unwrap(),
        "--to",
        "msccl-xml",
        "-o",
        xml.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let a = hccl_ir::msccl::load_xml(&src).unwrap();
    let b = hccl_ir::msccl::load_xml(&xml).unwrap();
    assert_eq!(a.entries, b.entries);

    // A wrong algorithm is not imported, and nothing is written.
    let bad = corpus().join("quirks/not_allreduce_pipeline_ring_r16_ch1_i1_ll128.xml");
    let target = dir.join("never.plan.ron");
    let out = hcclc(&[
        "import",
        bad.to_str().unwrap(),
        "-o",
        target.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!target.exists());
}

#[test]
fn imported_algorithms_join_the_search_and_are_explained_beside_ours() {
    let ring = corpus().join("allreduce_ring_r8_ch1_i1_ll128.xml");
    let pairs = corpus().join("allreduce_allpairs_r8_i1_ll.xml");
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let plan = dir.join("with.plan.ron");

    // Forced to the imported algorithm, the plan holds it (and it verifies).
    let out = hcclc(&[
        "compile",
        "dgx1-v100",
        "-c",
        "allreduce",
        "--sizes",
        "64K..256K",
        "--with",
        pairs.to_str().unwrap(),
        "--algo",
        "allreduce_pairs",
        "-o",
        plan.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for row in doc["rows"].as_array().unwrap() {
        assert_eq!(row["algorithm"], "allreduce_pairs");
    }
    assert_eq!(
        hcclc(&["verify", plan.to_str().unwrap()]).status.code(),
        Some(0)
    );

    // In open competition every row is the faster of ours and theirs: never slower than
    // without the extra candidates.
    let with = hcclc(&[
        "compile",
        "dgx1-v100",
        "-c",
        "allreduce",
        "--sizes",
        "1K..1M",
        "--with",
        ring.to_str().unwrap(),
        "--with",
        pairs.to_str().unwrap(),
        "-o",
        plan.to_str().unwrap(),
        "--json",
    ]);
    let without = hcclc(&[
        "compile",
        "dgx1-v100",
        "-c",
        "allreduce",
        "--sizes",
        "1K..1M",
        "-o",
        plan.to_str().unwrap(),
        "--json",
    ]);
    let rows = |o: &Output| -> Vec<f64> {
        let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        d["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["predicted_us"].as_f64().unwrap())
            .collect()
    };
    for (a, b) in rows(&with).iter().zip(rows(&without)) {
        assert!(*a <= b + 1e-9, "{a} > {b}");
    }

    // A file for another rank count is refused as bad input.
    let r16 = corpus().join("allgather_ring_r16_ch2_i2_simple.xml");
    let out = hcclc(&[
        "compile",
        "dgx1-v100",
        "-c",
        "allgather",
        "--with",
        r16.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("16 ranks"), "{}", stderr(&out));

    // explain ALGO.xml --topo: its rows and hcclc's own, in one JSON document.
    let out = hcclc(&[
        "explain",
        ring.to_str().unwrap(),
        "--topo",
        "dgx1-v100",
        "--sizes",
        "1M..4M",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["rows"].as_array().unwrap().len(), 3);
    assert_eq!(doc["compiler_rows"].as_array().unwrap().len(), 3);
    assert_eq!(
        doc["rows"][0]["algorithm"],
        "allreduce_ring_1channelsperring"
    );
    assert!(doc["rows"][0]["bound_us"].as_f64().unwrap() > 0.0);
}
