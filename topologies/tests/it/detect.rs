//! `detect`: recorded `nvidia-smi` outputs of a DGX-1, a DGX A100 and a DGX H100 (written from
//! the vendors' documents: `tests/data/detect/`) give the shipped machines' NVLink matrices;
//! sysfs trees give CPUs, NUMA nodes and NICs; this machine is detected and compiles.

use hccl_topologies::detect::{self, Cpus, MemBw, NetDev, Origin, Sources};
use hccl_topologies::{LinkKind, TopologySpec, bandwidth_matrix, build};
use std::path::{Path, PathBuf};

fn data(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/detect")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Pairwise GPU bandwidth over NVLink alone (every other link removed).
fn nvlink_matrix(spec: &TopologySpec) -> Vec<Vec<f64>> {
    let mut spec = spec.clone();
    spec.links.retain(|l| l.kind == LinkKind::NvLink);
    for h in &mut spec.hosts {
        h.nics.clear();
    }
    spec.switches
        .retain(|s| spec.links.iter().any(|l| l.a == s.id || l.b == s.id));
    let topo = build(spec, "nvlink").expect("the NVLink fabric alone is a topology");
    bandwidth_matrix(&topo)
}

#[test]
fn recorded_nvidia_smi_outputs_give_the_shipped_nvlink_matrices() {
    for (machine, numa) in [
        ("dgx1-v100", vec![40, 40]),
        ("dgx-a100", vec![32; 8]),
        ("dgx-h100", vec![112, 112]),
    ] {
        let sources = Sources {
            topo_matrix: Some(data(&format!("{machine}.topo-m.txt"))),
            nvlink_status: Some(data(&format!("{machine}.nvlink-s.txt"))),
            gpu_list: Some(data(&format!("{machine}.L.txt"))),
            origin: Some("recorded".into()),
        };
        let nics = [NetDev {
            name: "ib0".into(),
            gbps: 25.0,
        }];
        let cpus = Cpus::given(&numa, Some(2), "the test");
        let detected = describe(machine, &cpus, &nics, &sources);
        let topo = build(detected.spec.clone(), machine).expect("the detected machine builds");
        assert_eq!(topo.nranks(), 8, "{machine}");
        let shipped = hccl_topologies::shipped_or_err(machine).expect("shipped");
        let want = nvlink_matrix(&shipped.spec);
        let got = nvlink_matrix(&detected.spec);
        assert!(want[0][1] >= 150.0, "{machine}: {want:?}");
        for i in 0..8 {
            for j in 0..8 {
                assert!(
                    (want[i][j] - got[i][j]).abs() < 1e-9,
                    "{machine}: GPU{i}-GPU{j}: shipped {} GB/s, detected {}",
                    want[i][j],
                    got[i][j]
                );
            }
        }
        // Without `nvlink -s` the same fabric is recognised (25 GB/s links assumed).
        let bare = Sources {
            topo_matrix: sources.topo_matrix.clone(),
            ..Sources::default()
        };
        let cpus = Cpus::given(&numa, None, "the test");
        let detected = describe(machine, &cpus, &nics, &bare);
        assert_eq!(
            nvlink_matrix(&detected.spec),
            got,
            "{machine} without nvlink -s"
        );
        let link = detected
            .facts
            .iter()
            .find(|f| f.fact.starts_with("NVLink 25 GB/s per link"))
            .expect("the NVLink rate is a fact");
        assert!(
            matches!(&link.origin, Origin::Assumed(why) if why.contains("no nvidia-smi nvlink -s")),
            "{link}"
        );
    }
}

fn describe(machine: &str, cpus: &Cpus, nics: &[NetDev], sources: &Sources) -> detect::Detected {
    let mem_bw = MemBw {
        gbps: 20.0,
        origin: Origin::Given("the test".into()),
    };
    detect::describe(
        machine,
        cpus,
        (nics, Path::new("/nonexistent")),
        &mem_bw,
        sources,
    )
    .expect("detects")
}

/// A sysfs tree in a temporary directory.
fn sysfs(tag: &str, nodes: &[&str], nets: &[(&str, &str, &str, bool)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("hccl-sysfs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (i, list) in nodes.iter().enumerate() {
        let dir = root.join(format!("devices/system/node/node{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpulist"), format!("{list}\n")).unwrap();
    }
    for (name, speed, state, physical) in nets {
        let dir = root.join("class/net").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("speed"), format!("{speed}\n")).unwrap();
        std::fs::write(dir.join("operstate"), format!("{state}\n")).unwrap();
        if *physical {
            std::fs::create_dir_all(dir.join("device")).unwrap();
        }
    }
    root
}

#[test]
fn sysfs_trees_give_numa_nodes_and_physical_interfaces_that_are_up() {
    let root = sysfs(
        "two",
        &["0-19,40-59", "20-39,60-79"],
        &[
            ("eth0", "100000", "up", true),
            ("eth1", "25000", "down", true),
            ("lo", "-1", "unknown", false),
            ("docker0", "10000", "up", false),
            ("eth2", "-1", "up", true),
        ],
    );
    assert_eq!(detect::numa_cpus(&root), Some(vec![40, 40]));
    for (cpu, package) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let dir = root.join(format!("devices/system/cpu/cpu{cpu}/topology"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("physical_package_id"), format!("{package}\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("devices/system/cpu/cpufreq")).unwrap();
    assert_eq!(detect::sockets(&root), Some(2));
    assert_eq!(
        detect::net_devices(&root),
        vec![NetDev {
            name: "eth0".into(),
            gbps: 12.5
        }]
    );
    // A CPU host: one rank per CPU, the NIC on the memory.
    let cpus = detect::cpus(&root).expect("the tree lists CPUs");
    assert_eq!(
        (cpus.per_node.as_slice(), cpus.sockets),
        (&[40, 40][..], Some(2))
    );
    let d = describe(
        "box",
        &Cpus::given(&[4], None, "the test"),
        &detect::net_devices(&root),
        &Sources::default(),
    );
    let topo = build(d.spec, "box").expect("builds");
    assert_eq!(topo.nranks(), 4);
    let _ = std::fs::remove_dir_all(&root);
    // No node directories: the online CPUs, and one NUMA node said to be assumed.
    let root = sysfs("none", &[], &[]);
    std::fs::create_dir_all(root.join("devices/system/cpu")).unwrap();
    std::fs::write(root.join("devices/system/cpu/online"), "0-7\n").unwrap();
    assert_eq!(detect::numa_cpus(&root), None);
    let cpus = detect::cpus(&root).expect("the online CPUs");
    assert_eq!(cpus.per_node, vec![8]);
    let online = root.join("devices/system/cpu/online").display().to_string();
    assert!(
        cpus.facts
            .iter()
            .any(|f| f.fact == "8 CPUs" && f.origin == Origin::Found(online.clone())),
        "{:?}",
        cpus.facts
    );
    assert!(
        cpus.facts
            .iter()
            .any(|f| f.fact == "1 NUMA node" && matches!(f.origin, Origin::Assumed(_))),
        "{:?}",
        cpus.facts
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A root that is missing, or that lists no CPU, is an error naming it, never "1 CPU".
#[test]
fn an_unreadable_or_empty_sysfs_is_an_error() {
    let missing = Path::new("/nonexistent/sysfs");
    let err = detect::detect(missing, &Sources::default(), Some("x"), Some(5.0))
        .expect_err("a missing root is an error")
        .to_string();
    assert!(
        err.contains("/nonexistent/sysfs: cannot read the sysfs tree") && err.contains("--sysfs"),
        "{err}"
    );
    let empty = sysfs("empty", &[], &[]);
    std::fs::create_dir_all(&empty).unwrap();
    let err = detect::detect(&empty, &Sources::default(), Some("x"), Some(5.0))
        .expect_err("a tree without CPUs is an error")
        .to_string();
    assert!(err.contains("no CPU listed"), "{err}");
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn this_machine_is_detected() {
    let sys = Path::new("/sys");
    let d = detect::detect(sys, &Sources::default(), Some("here"), Some(5.0)).expect("detects");
    assert!(
        d.facts.iter().all(|f| !f.origin.detail().is_empty()),
        "{:?}",
        d.facts
    );
    build(d.spec, "here").expect("this machine's description builds");
}
