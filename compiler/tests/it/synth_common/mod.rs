//! The machines the synthesis tests run on: every shipped machine, generated ones of other
//! shapes, and one with mixed link speeds.

// Each test binary uses part of it (hcclc's `cli_synth` only the mixed machine's text).
#![allow(dead_code)]

use hccl_topologies::Topology;

/// Six GPUs on a 100 GB/s ring with two 25 GB/s chords (also `examples/synthesis.rs`).
pub const MIXED: &str = r#"(
  name: "mixed-6",
  description: "6 GPUs on a 100 GB/s ring with two 25 GB/s chords",
  hosts: [(id: "host0", devices: [
    (id: "gpu0", kind: Gpu), (id: "gpu1", kind: Gpu), (id: "gpu2", kind: Gpu),
    (id: "gpu3", kind: Gpu), (id: "gpu4", kind: Gpu), (id: "gpu5", kind: Gpu),
  ])],
  links: [
    (a: "gpu0", b: "gpu1", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu1", b: "gpu2", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu2", b: "gpu3", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu3", b: "gpu4", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu4", b: "gpu5", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu5", b: "gpu0", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu0", b: "gpu3", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "gpu1", b: "gpu4", kind: NvLink, bw: 25.0, latency: 1.0),
  ],
)"#;

/// Every shipped machine, an 8-ring, a 4×4 torus, a 16-rank fat tree and [`MIXED`].
pub fn machines() -> Vec<(String, Topology)> {
    let mut out: Vec<(String, Topology)> = hccl_topologies::shipped()
        .iter()
        .map(|(name, _)| {
            (
                name.to_string(),
                hccl_topologies::shipped_by_name(name).expect("shipped machines build"),
            )
        })
        .collect();
    let generated = |name: &str, spec| {
        (
            name.to_string(),
            hccl_topologies::build(spec, name).expect("generated topology builds"),
        )
    };
    out.push(generated(
        "ring-8",
        hccl_topologies::generate::ring(8, 100.0, 1.0),
    ));
    out.push(generated(
        "torus-4x4",
        hccl_topologies::generate::torus(&[4, 4], 50.0, 1.0),
    ));
    out.push(generated(
        "fat-tree-16",
        hccl_topologies::generate::fat_tree(16, 4, 50.0, 1.0),
    ));
    let spec = hccl_topologies::parse_spec(MIXED, "mixed-6").expect("the mixed machine parses");
    out.push(generated("mixed-6", spec));
    out
}
