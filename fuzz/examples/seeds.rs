//! Writes the generated part of the seed corpus: frames and rendezvous messages made by the
//! executor's encoders, and plan files of every format version derived from plans `hcclc`
//! compiled (passed as arguments). Run from `fuzz/`:
//!
//! ```text
//! cargo run --example seeds -- PLAN.plan.ron...
//! ```
//!
//! Each plan given is written as it is (format 5: templates with `repeat` runs and
//! `rank_runs`), with a rank index, with its symmetric entries expanded (explicit), as that
//! explicit plan claiming formats 1 to 4, and as format 4's symmetric form (templates
//! written step by step, unsealed).

use hccl_ir::PlanFile;
use std::path::Path;

fn write(dir: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(dir);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(name), bytes).expect("seed written");
}

fn main() {
    for (i, seed) in hccl_executor::fuzz::frame_seeds().iter().enumerate() {
        write("frames", &format!("seed-{i}.bin"), seed);
    }
    for (i, seed) in hccl_executor::fuzz::rendezvous_seeds().iter().enumerate() {
        write("rendezvous", &format!("seed-{i}.bin"), seed);
    }
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).expect("plan text");
        let plan = PlanFile::from_ron(&text, &path).expect("a plan that loads");
        let stem = Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".plan.ron"))
            .expect("a .plan.ron file")
            .to_string();
        write("plan", &format!("{stem}.v5.ron"), plan.to_ron().as_bytes());
        write(
            "plan",
            &format!("{stem}.indexed.ron"),
            plan.to_ron_indexed().as_bytes(),
        );
        let mut explicit = plan.clone();
        explicit.verified.clear();
        for entry in &mut explicit.entries {
            entry.symmetry = None;
            entry.template = None;
        }
        let explicit = explicit.to_ron();
        assert!(!explicit.contains("symmetric:"));
        let current = format!("format_version: {}", hccl_ir::FORMAT_VERSION);
        for version in 1..=hccl_ir::FORMAT_VERSION {
            let old = explicit.replacen(
                &current,
                &format!("format_version: {version}"),
                1,
            );
            write(
                "plan",
                &format!("{stem}.explicit.v{version}.ron"),
                old.as_bytes(),
            );
        }
        // Format 4 wrote templates step by step (no runs), as serde writes the type.
        let entries: Vec<String> = plan
            .entries
            .iter()
            .map(|e| match e.compact() {
                Some(sym) => format!(
                    "(min_bytes: {}, max_bytes: {:?}, algorithm: {:?}, protocol: {:?}, symmetric: {})",
                    e.min_bytes,
                    e.max_bytes,
                    e.algorithm,
                    e.protocol,
                    ron::to_string(&sym).expect("serialises")
                ),
                None => String::new(),
            })
            .filter(|s| !s.is_empty())
            .collect();
        if !entries.is_empty() {
            let v4 = format!(
                "(format_version: 4, meta: (topology: \"t\", compiler: \"seeds\"), entries: [{}])",
                entries.join(", ")
            );
            PlanFile::from_ron(&v4, "v4").expect("the format 4 seed loads");
            write("plan", &format!("{stem}.symmetric.v4.ron"), v4.as_bytes());
        }
    }
}
