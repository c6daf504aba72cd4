//! The synthesis cache end to end: `hcclc compile` writes what its solvers found into
//! `HCCL_CACHE_DIR`, reads it back on the next compile, and the plan is byte for byte the same
//! cold, warm, with `--no-cache`, from a damaged entry and from two compiles at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh cache directory and working directory for one test, under a scratch directory
/// removed when the returned guard drops.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let (cache, work) = (root.path().join("cache"), root.path().join("work"));
    std::fs::create_dir_all(&work).unwrap();
    (root, cache, work)
}

/// `hcclc compile` of DGX-1's AllGather and AllReduce from 256 KiB to 2 MiB (where the MILP
/// schedules win) into `out`, with `cache` as the cache directory.
fn compile(cache: &Path, work: &Path, out: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", cache)
        .current_dir(work)
        .args([
            "compile",
            "dgx1-v100",
            "-c",
            "allgather,allreduce",
            "--sizes",
            "256K..2M",
            "-o",
            out,
        ])
        .args(extra)
        .output()
        .expect("hcclc runs")
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Empties the plan cache, so that the next compile searches (and reads the synthesis cache)
/// instead of reading its whole plan back.
fn forget_plans(cache: &Path) {
    let _ = std::fs::remove_dir_all(cache.join("plans"));
}

fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache.join("synth"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn cached_plans_are_byte_identical() {
    let (_root, cache, work) = dirs();
    ok(&compile(&cache, &work, "cold.plan.ron", &[]));
    let stored = entries(&cache);
    assert_eq!(
        stored.len(),
        1,
        "the AllGather frontier (AllReduce lowers it too)"
    );
    let stamp = std::fs::read(&stored[0]).unwrap();
    forget_plans(&cache);
    ok(&compile(&cache, &work, "warm.plan.ron", &[]));
    assert_eq!(std::fs::read(&stored[0]).unwrap(), stamp);
    // --no-cache neither reads nor writes.
    let elsewhere = cache.with_file_name("unused");
    ok(&compile(
        &elsewhere,
        &work,
        "nocache.plan.ron",
        &["--no-cache"],
    ));
    assert!(!elsewhere.exists());
    let cold = std::fs::read(work.join("cold.plan.ron")).unwrap();
    assert_eq!(cold, std::fs::read(work.join("warm.plan.ron")).unwrap());
    assert_eq!(cold, std::fs::read(work.join("nocache.plan.ron")).unwrap());
    // The MILP schedules are in the default plan.
    let text = String::from_utf8_lossy(&cold);
    assert!(text.contains("algorithm: \"milp\""), "no milp entry");

    // A damaged entry is ignored, solved again and written whole (each compile below
    // searches: the plan cache is emptied first).
    forget_plans(&cache);
    std::fs::write(&stored[0], &stamp[..stamp.len() / 2]).unwrap();
    ok(&compile(&cache, &work, "damaged.plan.ron", &[]));
    assert_eq!(cold, std::fs::read(work.join("damaged.plan.ron")).unwrap());
    assert_eq!(std::fs::read(&stored[0]).unwrap(), stamp);
    forget_plans(&cache);
    std::fs::write(&stored[0], b"not an entry").unwrap();
    ok(&compile(&cache, &work, "garbage.plan.ron", &[]));
    assert_eq!(cold, std::fs::read(work.join("garbage.plan.ron")).unwrap());
}

/// Two compiles into one empty cache at once both solve, both write, and agree.
#[test]
fn concurrent_compiles_share_one_cache() {
    let (_root, cache, work) = dirs();
    let runs: Vec<_> = ["a.plan.ron", "b.plan.ron"]
        .into_iter()
        .map(|out| {
            let (cache, work) = (cache.clone(), work.clone());
            std::thread::spawn(move || compile(&cache, &work, out, &[]))
        })
        .collect();
    for run in runs {
        ok(&run.join().unwrap());
    }
    assert_eq!(
        std::fs::read(work.join("a.plan.ron")).unwrap(),
        std::fs::read(work.join("b.plan.ron")).unwrap()
    );
    let stored = entries(&cache);
    assert_eq!(stored.len(), 1, "{stored:?}: no temporary file left behind");
    ok(&compile(&cache, &work, "c.plan.ron", &[]));
    assert_eq!(
        std::fs::read(work.join("a.plan.ron")).unwrap(),
        std::fs::read(work.join("c.plan.ron")).unwrap()
    );
}
