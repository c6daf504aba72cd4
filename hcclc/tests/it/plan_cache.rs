//! The plan cache end to end: a compile of the same topology with the same options reads the
//! whole plan back (byte for byte what a search writes, with the same table and JSON), any
//! change of input searches again, and a damaged entry is a miss.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh cache directory and working directory for one test.
fn dirs(name: &str) -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("hcclc-plan-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (cache, work) = (root.join("cache"), root.join("work"));
    std::fs::create_dir_all(&work).unwrap();
    (cache, work)
}

/// `hcclc compile TOPO` of AllReduce and Broadcast, small sizes, into `out`.
fn compile(cache: &Path, work: &Path, topo: &str, out: &str, extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", cache)
        .current_dir(work)
        .args(["compile", topo, "-c", "allreduce,broadcast", "-o", out])
        .args(extra)
        .output()
        .expect("hcclc runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON document of a `--json` compile, and its plan cache state.
fn json(out: &Output) -> (serde_json::Value, String) {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let state = doc["plan_cache"].as_str().unwrap().to_string();
    (doc, state)
}

fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache.join("plans"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn a_second_compile_reads_the_plan_back() {
    let (cache, work) = dirs("hit");
    let small = ["--sizes", "1K..256K", "--json"];
    let (first, state) = json(&compile(&cache, &work, "dgx1-v100", "a.plan.ron", &small));
    assert_eq!(state, "stored");
    assert_eq!(entries(&cache).len(), 1);
    let (second, state) = json(&compile(&cache, &work, "dgx1-v100", "b.plan.ron", &small));
    assert_eq!(state, "hit");
    let plan = std::fs::read(work.join("a.plan.ron")).unwrap();
    assert_eq!(plan, std::fs::read(work.join("b.plan.ron")).unwrap());
    assert_eq!(first["rows"], second["rows"]);
    assert_eq!(first["search_report"], second["search_report"]);

    // The table of a hit is the table of a search, and so is the plan.
    let table = ["--sizes", "1K..256K"];
    let hit = compile(&cache, &work, "dgx1-v100", "c.plan.ron", &table);
    let mut searched = table.to_vec();
    searched.push("--no-cache");
    let fresh = compile(&cache, &work, "dgx1-v100", "c.plan.ron", &searched);
    assert_eq!(
        String::from_utf8_lossy(&hit.stdout),
        String::from_utf8_lossy(&fresh.stdout)
    );
    assert_eq!(plan, std::fs::read(work.join("c.plan.ron")).unwrap());

    // -v says where the plan came from, and no search ran.
    let mut verbose = table.to_vec();
    verbose.push("-v");
    let out = compile(&cache, &work, "dgx1-v100", "d.plan.ron", &verbose);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plan cache: hit, entry "), "{err}");
    assert!(!err.contains("  generate "), "{err}");
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn any_change_of_input_searches_again() {
    let (cache, work) = dirs("miss");
    let shipped =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies/machines/dgx1-v100.ron");
    let text = std::fs::read_to_string(shipped).unwrap();
    std::fs::write(work.join("mine.ron"), &text).unwrap();
    let small = ["--sizes", "1K..64K", "--json"];
    let (base, state) = json(&compile(&cache, &work, "mine.ron", "a.plan.ron", &small));
    assert_eq!(state, "stored");
    // The same machine by name: the same topology, so the same entry.
    let (_, state) = json(&compile(&cache, &work, "dgx1-v100", "a.plan.ron", &small));
    assert_eq!(state, "hit");
    // Other sizes.
    let (_, state) = json(&compile(
        &cache,
        &work,
        "mine.ron",
        "b.plan.ron",
        &["--sizes", "1K..32K", "--json"],
    ));
    assert_eq!(state, "stored");
    // Another protocol set.
    let mut proto = small.to_vec();
    proto.extend(["--proto", "Simple"]);
    let (_, state) = json(&compile(&cache, &work, "mine.ron", "c.plan.ron", &proto));
    assert_eq!(state, "stored");
    // The file edited in place: every NVLink at half its bandwidth.
    std::fs::write(
        work.join("mine.ron"),
        text.replace("kind: NvLink, bw: 25.0", "kind: NvLink, bw: 12.5"),
    )
    .unwrap();
    let (slower, state) = json(&compile(&cache, &work, "mine.ron", "d.plan.ron", &small));
    assert_eq!(state, "stored");
    assert_ne!(
        base["rows"], slower["rows"],
        "the edit changes the predictions"
    );
    assert_eq!(entries(&cache).len(), 4);
    // --no-cache neither reads nor writes.
    let mut off = small.to_vec();
    off.push("--no-cache");
    let (_, state) = json(&compile(&cache, &work, "mine.ron", "e.plan.ron", &off));
    assert_eq!(state, "off");
    assert_eq!(entries(&cache).len(), 4);
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn a_damaged_entry_is_a_miss() {
    let (cache, work) = dirs("damaged");
    let small = ["--sizes", "1K..64K", "--json"];
    let (_, state) = json(&compile(&cache, &work, "dgx1-v100", "a.plan.ron", &small));
    assert_eq!(state, "stored");
    let entry = entries(&cache).pop().unwrap();
    let whole = std::fs::read(&entry).unwrap();
    for damaged in [&whole[..whole.len() - 1], &whole[..40], b"not an entry"] {
        std::fs::write(&entry, damaged).unwrap();
        let (_, state) = json(&compile(&cache, &work, "dgx1-v100", "b.plan.ron", &small));
        assert_eq!(state, "stored", "searched and written again");
        let (_, state) = json(&compile(&cache, &work, "dgx1-v100", "c.plan.ron", &small));
        assert_eq!(state, "hit", "the entry is whole again");
        assert_eq!(
            std::fs::read(work.join("a.plan.ron")).unwrap(),
            std::fs::read(work.join("b.plan.ron")).unwrap()
        );
        assert_eq!(
            std::fs::read(work.join("a.plan.ron")).unwrap(),
            std::fs::read(work.join("c.plan.ron")).unwrap()
        );
    }
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

/// `hcclc cache show` counts each area's entries; `clear` empties one area or both.
#[test]
fn the_cache_command_shows_and_clears_the_areas() {
    let (cache, work) = dirs("command");
    let cmd = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hcclc"))
            .env("HCCL_CACHE_DIR", &cache)
            .current_dir(&work)
            .args(args)
            .output()
            .expect("hcclc runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let areas = |doc: &serde_json::Value, key: &str| -> Vec<(String, u64)> {
        doc[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["area"].as_str().unwrap().to_string(),
                    a["entries"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (code, out) = cmd(&["cache", "show", "--json"]);
    assert_eq!(code, Some(0));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        areas(&doc, "areas"),
        [("synth".into(), 0), ("plans".into(), 0)]
    );
    compile(
        &cache,
        &work,
        "dgx1-v100",
        "a.plan.ron",
        &["--sizes", "1K..8K"],
    );
    let (_, out) = cmd(&["cache", "show"]);
    assert!(out.contains("plans  1 entry, "), "{out}");
    let (code, out) = cmd(&["cache", "clear", "--area", "plans", "--json"]);
    assert_eq!(code, Some(0));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(areas(&doc, "removed"), [("plans".into(), 1)]);
    let (_, out) = cmd(&["cache", "show"]);
    assert!(out.contains("plans  0 entries, 0 B"), "{out}");
    let (code, _) = cmd(&["cache", "clear", "--area", "elsewhere"]);
    assert_eq!(code, Some(2));
    let (code, _) = cmd(&["cache", "clear"]);
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}
