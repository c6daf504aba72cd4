//! The fuzz targets' corpus (`fuzz/corpus/TARGET/`) replayed through the same entry points
//! as `cargo fuzz` calls (`hccl_ir::fuzz`, `hccl_topologies::fuzz`, `hccl_executor::fuzz`),
//! on stable and in every `cargo test`: none of these inputs may panic, and the well-formed
//! seeds among them must still be accepted. See fuzz/README.md.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The targets `fuzz/Cargo.toml` declares.
fn targets() -> Vec<String> {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    manifest
        .split("[[bin]]")
        .skip(1)
        .map(|bin| {
            let name = bin
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = \""))
                .expect("a [[bin]] with a name");
            name.trim_end_matches('"').to_string()
        })
        .collect()
}

/// Every file of `fuzz/corpus/target/`, sorted.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("corpus file");
            (p, bytes)
        })
        .collect()
}

/// Runs `entry` on every file of `target`'s corpus; returns how many it accepted.
fn replay(target: &str, entry: impl Fn(&[u8]) -> bool) -> usize {
    let files = corpus(target);
    assert!(!files.is_empty(), "no corpus for {target}");
    files
        .iter()
        .filter(|(path, bytes)| {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| entry(bytes)));
            ok.unwrap_or_else(|_| panic!("{target}: {} panicked", path.display()))
        })
        .count()
}

#[test]
fn every_target_has_a_corpus_and_a_replay_here() {
    let mut names = targets();
    names.sort();
    assert_eq!(
        names,
        ["frames", "msccl", "plan", "rendezvous", "topology"],
        "a target added to fuzz/Cargo.toml needs its corpus replayed here"
    );
    for t in &names {
        assert!(!corpus(t).is_empty(), "fuzz/corpus/{t} is empty");
    }
}

#[test]
fn topology_corpus() {
    let accepted = replay("topology", hccl::topologies::fuzz::topology);
    // The shipped machines in the corpus are accepted.
    assert!(accepted >= 5, "{accepted} topologies accepted");
}

#[test]
fn plan_corpus() {
    let accepted = replay("plan", hccl::ir::fuzz::plan);
    assert!(accepted >= 3, "{accepted} plans accepted");
}

#[test]
fn msccl_corpus() {
    let accepted = replay("msccl", hccl::ir::fuzz::msccl);
    assert!(accepted >= 5, "{accepted} MSCCL files accepted");
}

#[test]
fn frames_corpus() {
    let ended_in_goodbye = replay("frames", |b| hccl::executor::fuzz::frames(b).is_ok());
    assert!(
        ended_in_goodbye >= 4,
        "{ended_in_goodbye} streams ended in goodbye"
    );
}

#[test]
fn rendezvous_corpus() {
    replay("rendezvous", |b| {
        hccl::executor::fuzz::rendezvous(b);
        true
    });
}
