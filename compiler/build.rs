//! The compiler's build fingerprint: a blake3 hash of everything a compile's result depends on
//! besides its inputs: the sources of this crate and of the two it builds on (`hccl-ir`,
//! `hccl-topologies`), their manifests, the workspace's lock file (every dependency's
//! version) and the enabled features. The plan cache keys its entries with it
//! (`search::plan_cache`), so an entry written by one build is never read by another.
//! Cargo runs this again whenever one of those files changes.

use std::path::{Path, PathBuf};

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut hasher = blake3::Hasher::new();
    let mut inputs: Vec<PathBuf> = vec![here.join("src"), here.join("Cargo.toml")];
    for sibling in ["ir", "topologies"] {
        let dir = here.join("..").join(sibling);
        inputs.push(dir.join("src"));
        inputs.push(dir.join("Cargo.toml"));
    }
    inputs.push(here.join("..").join("Cargo.lock"));
    inputs.push(here.join("..").join("Cargo.toml"));
    for input in &inputs {
        // A path that does not exist (a packaged crate has no siblings) hashes as its name:
        // the crate's own sources and version still separate builds.
        println!("cargo:rerun-if-changed={}", input.display());
        let mut files = Vec::new();
        collect(input, &mut files);
        files.sort();
        for file in files {
            let rel = file.strip_prefix(&here).unwrap_or(&file);
            let bytes = std::fs::read(&file).unwrap_or_default();
            hasher.update(&(rel.as_os_str().len() as u64).to_le_bytes());
            hasher.update(rel.as_os_str().as_encoded_bytes());
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        }
    }
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(str::to_string))
        .collect();
    features.sort();
    hasher.update(features.join(",").as_bytes());
    hasher.update(std::env::var("PROFILE").unwrap_or_default().as_bytes());
    println!(
        "cargo:rustc-env=PLAN_CACHE_FINGERPRINT={}",
        hasher.finalize().to_hex()
    );
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for entry in entries.flatten() {
                collect(&entry.path(), out);
            }
        }
        Err(_) => out.push(path.to_path_buf()),
    }
}
