//! Every shipped machine loads, and its numbers match the documented hardware.

use hccl_topologies::{LinkKind, Node, load, shipped, shipped_by_name};
use std::path::Path;

#[test]
fn every_shipped_machine_builds_from_text_and_file() {
    for (name, _) in shipped() {
        let topo = shipped_by_name(name).unwrap_or_else(|| panic!("{name} does not build"));
        assert_eq!(&topo.name, name, "the name field matches the file stem");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("machines")
            .join(format!("{name}.ron"));
        let from_file = load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(from_file.hash, topo.hash);
    }
}

#[test]
fn machines_directory_and_shipped_list_agree() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("machines");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = shipped().iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

/// Sum of NVLink bandwidth out of each GPU, per direction (GB/s).
fn nvlink_out(name: &str) -> Vec<f64> {
    let topo = shipped_by_name(name).unwrap();
    topo.ranks
        .iter()
        .map(|&v| {
            topo.graph
                .edges(v)
                .filter(|e| e.weight().kind == LinkKind::NvLink)
                .map(|e| e.weight().bw)
                .sum()
        })
        .collect()
}

#[test]
fn dgx1_is_the_hybrid_cube_mesh() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    assert_eq!(topo.nranks(), 8);
    // 6 NVLink2 links × 25 GB/s per GPU.
    assert_eq!(nvlink_out("dgx1-v100"), vec![150.0; 8]);
    let doubled = [
        (0, 1),
        (0, 4),
        (1, 3),
        (2, 3),
        (2, 6),
        (4, 5),
        (5, 7),
        (6, 7),
    ];
    let single = [
        (0, 2),
        (0, 3),
        (1, 2),
        (1, 5),
        (3, 7),
        (4, 6),
        (4, 7),
        (5, 6),
    ];
    for a in 0..8u32 {
        for b in 0..8u32 {
            let count = topo.direct_edge(a, b).map(|e| topo.graph[e].count);
            let want = if doubled.contains(&(a.min(b), a.max(b))) {
                Some(2)
            } else if single.contains(&(a.min(b), a.max(b))) {
                Some(1)
            } else {
                None
            };
            assert_eq!(count, want, "NVLinks between {a} and {b}");
        }
    }
    let nics = topo
        .graph
        .node_weights()
        .filter(|n| matches!(n, Node::Nic { .. }))
        .count();
    assert_eq!(nics, 4);
}

#[test]
fn nvswitch_boxes_have_the_documented_per_gpu_nvlink_bandwidth() {
    assert_eq!(nvlink_out("dgx-a100"), vec![300.0; 8]);
    assert_eq!(nvlink_out("dgx-h100"), vec![450.0; 8]);
}

#[test]
fn default_memory_bandwidths_follow_the_model() {
    assert_eq!(shipped_by_name("dgx1-v100").unwrap().mem_bw(0), 900.0);
    assert_eq!(shipped_by_name("dgx-a100").unwrap().mem_bw(3), 1555.0);
    assert_eq!(shipped_by_name("dgx-h100").unwrap().mem_bw(7), 3350.0);
    assert_eq!(shipped_by_name("ascend910-8").unwrap().mem_bw(0), 1200.0);
}

#[test]
fn shipped_clusters_equal_the_cluster_generator() {
    let dgx = shipped_by_name("dgx-h100").unwrap().spec;
    for n in [2u32, 4] {
        let name = format!("h100-cluster-{n}node");
        let shipped = shipped_by_name(&name).unwrap();
        let mut generated = hccl_topologies::generate::cluster(n, &dgx);
        generated.name = shipped.spec.name.clone();
        generated.description = shipped.spec.description.clone();
        assert_eq!(generated, shipped.spec, "{name}");
        assert_eq!(shipped.nranks(), 8 * n);
        assert_eq!(shipped.nhosts(), n as usize);
    }
}
