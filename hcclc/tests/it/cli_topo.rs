//! `hcclc topo show|gen`: text snapshots, JSON, exit codes on bad input, generated files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .output()
        .expect("hcclc runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn topologies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies")
}

#[test]
fn show_dgx1_text() {
    let out = hcclc(&["topo", "show", "dgx1-v100"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!(stdout(&out));
}

#[test]
fn show_h100_cluster_text() {
    let path = topologies_dir().join("machines/h100-cluster-2node.ron");
    let out = hcclc(&["topo", "show", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!(stdout(&out));
}

#[test]
fn every_shipped_machine_shows_as_one_json_document() {
    let dir = topologies_dir().join("machines");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 7);
    for f in files {
        let out = hcclc(&["topo", "show", f.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", f.display());
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let n = v["nranks"].as_u64().unwrap() as usize;
        assert_eq!(v["bw_matrix"].as_array().unwrap().len(), n);
        assert_eq!(v["injection_bw"].as_array().unwrap().len(), n);
        assert!(v["bisection"]["bw"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bad_files_exit_with_code_2_and_a_message() {
    let dir = topologies_dir().join("tests/bad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 20);
    for f in files {
        let out = hcclc(&["topo", "show", f.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", f.display());
        assert!(!err.contains("panicked"), "{err}");
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(err.contains(name.as_ref()), "{err}");
    }
    let out = hcclc(&["topo", "show", "no-such-machine-or-file"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bad_generator_parameters_exit_with_code_2() {
    for args in [
        &[
            "topo",
            "gen",
            "ring",
            "--ranks",
            "0",
            "--bw",
            "1",
            "--latency",
            "1",
        ][..],
        &[
            "topo",
            "gen",
            "ring",
            "--ranks",
            "4",
            "--bw",
            "-1",
            "--latency",
            "1",
        ],
        &[
            "topo",
            "gen",
            "ring",
            "--ranks",
            "4",
            "--bw",
            "NaN",
            "--latency",
            "1",
        ],
        &[
            "topo",
            "gen",
            "torus",
            "--dims",
            "4",
            "--bw",
            "1",
            "--latency",
            "1",
        ],
        &[
            "topo",
            "gen",
            "torus",
            "--dims",
            "4x0",
            "--bw",
            "1",
            "--latency",
            "1",
        ],
        &[
            "topo",
            "gen",
            "torus",
            "--dims",
            "99999x99999",
            "--bw",
            "1",
            "--latency",
            "1",
        ],
        &["topo", "gen", "cluster", "--nodes", "2", "--box", "nope"],
        &["topo", "gen", "host", "--ranks", "4", "--mem-bw", "0"],
        &[
            "topo",
            "gen",
            "fat-tree",
            "--ranks",
            "4",
            "--per-leaf",
            "0",
            "--bw",
            "1",
            "--latency",
            "1",
        ],
        &["topo", "gen", "ring", "--ranks", "4"],
    ] {
        let out = hcclc(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn generated_files_load_and_match_the_request() {
    let dir = std::env::temp_dir().join(format!("hcclc-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: &[(&[&str], u64)] = &[
        (
            &["ring", "--ranks", "5", "--bw", "20", "--latency", "0.5"],
            5,
        ),
        (
            &["torus", "--dims", "2x3x4", "--bw", "20", "--latency", "0.5"],
            24,
        ),
        (&["cluster", "--nodes", "3", "--box", "dgx1-v100"], 24),
        (
            &[
                "fat-tree",
                "--ranks",
                "12",
                "--per-leaf",
                "4",
                "--bw",
                "25",
                "--latency",
                "1",
            ],
            12,
        ),
        (&["host", "--ranks", "4", "--mem-bw", "10"], 4),
        (
            &["host", "--ranks", "2", "--mem-bw", "10", "--nic-bw", "1.25"],
            2,
        ),
    ];
    for (i, (args, ranks)) in cases.iter().enumerate() {
        let file = dir.join(format!("t{i}.ron"));
        let mut full = vec!["topo", "gen"];
        full.extend_from_slice(args);
        // To stdout: RON that parses.
        let out = hcclc(&full);
        assert!(out.status.success(), "{args:?}");
        let topo = hccl_topologies::from_ron(&stdout(&out), "stdout").unwrap();
        assert_eq!(u64::from(topo.nranks()), *ranks);
        // To a file, with --json.
        full.extend_from_slice(&["-o", file.to_str().unwrap(), "--json"]);
        let out = hcclc(&full);
        assert!(out.status.success(), "{args:?}");
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["nranks"].as_u64(), Some(*ranks));
        let loaded = hccl_topologies::load(&file).unwrap();
        assert_eq!(loaded.hash, topo.hash);
        assert_eq!(v["hash"].as_str(), Some(topo.hash.as_str()));
        let shown = hcclc(&["topo", "show", file.to_str().unwrap()]);
        assert!(shown.status.success());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gen_host_with_a_nic() {
    let out = hcclc(&[
        "topo",
        "gen",
        "host",
        "--ranks",
        "2",
        "--mem-bw",
        "20",
        "--nic-bw",
        "1.25",
        "--nic-latency",
        "25",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!(stdout(&out));
}

#[test]
fn bad_nic_flags_exit_with_code_2_and_say_why() {
    let host = ["topo", "gen", "host", "--ranks", "2", "--mem-bw", "20"];
    for (extra, message) in [
        (
            &["--nic-bw", "0"][..],
            "--nic-bw must be a finite number > 0, got 0",
        ),
        (
            &["--nic-bw", "-1.25"],
            "--nic-bw must be a finite number > 0, got -1.25",
        ),
        (
            &["--nic-bw", "NaN"],
            "--nic-bw must be a finite number > 0, got NaN",
        ),
        (
            &["--nic-bw", "inf"],
            "--nic-bw must be a finite number > 0, got inf",
        ),
        (
            &["--nic-bw", "1.25", "--nic-latency", "0"],
            "--nic-latency must be a finite number > 0, got 0",
        ),
        (
            &["--nic-bw", "1.25", "--nic-latency", "-3"],
            "--nic-latency must be a finite number > 0, got -3",
        ),
        (
            &["--nic-bw", "1.25", "--nic-latency", "NaN"],
            "--nic-latency must be a finite number > 0, got NaN",
        ),
        (&["--nic-latency", "25"], "--nic-latency needs --nic-bw"),
    ] {
        let mut args = host.to_vec();
        args.extend_from_slice(extra);
        let out = hcclc(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // A CPU host without a NIC cannot be networked; the message says how to give it one.
    let dir = std::env::temp_dir().join(format!("hcclc-topo-nonic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("h.ron");
    let mut args = host.to_vec();
    args.extend_from_slice(&["-o", file.to_str().unwrap()]);
    assert!(hcclc(&args).status.success());
    let out = hcclc(&[
        "topo",
        "gen",
        "cluster",
        "--nodes",
        "2",
        "--box",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no NICs") && err.contains("--nic-bw"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn detect_this_machine_and_recorded_nvidia_smi_outputs() {
    // This machine: a topology that builds (the memory bandwidth given, so no probe runs).
    let out = hcclc(&[
        "topo", "detect", "--mem-bw", "5", "--name", "here", "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(doc["name"], "here");
    assert!(doc["nranks"].as_u64().is_some_and(|n| n >= 1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hcclc: detected:"));
    // Every fact says where it was found or why it was assumed; the CPUs come from sysfs,
    // and the memory bandwidth given on the command line is labelled so (not a probe).
    let facts = doc["facts"].as_array().expect("facts");
    for f in facts {
        assert!(
            ["found", "given", "assumed"].contains(&f["origin"].as_str().unwrap_or_default())
                && !f["detail"].as_str().unwrap_or_default().is_empty(),
            "{f}"
        );
    }
    let cpus = facts
        .iter()
        .find(|f| f["fact"].as_str().is_some_and(|t| t.contains(" CPUs")))
        .expect("a CPU fact");
    assert_eq!(cpus["origin"], "found", "{cpus}");
    assert!(
        cpus["detail"]
            .as_str()
            .unwrap()
            .starts_with("/sys/devices/system/")
    );
    if let Some(bw) = facts.iter().find(|f| {
        f["fact"]
            .as_str()
            .is_some_and(|t| t.starts_with("memory bandwidth"))
    }) {
        assert_eq!(
            (bw["fact"].as_str().unwrap(), &bw["origin"], &bw["detail"]),
            (
                "memory bandwidth 5.0 GB/s per rank",
                &"given".into(),
                &"--mem-bw".into()
            ),
        );
    }
    // A sysfs root that cannot be read is an error, not "1 CPU".
    let out = hcclc(&["topo", "detect", "--sysfs", "/nonexistent", "--mem-bw", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sysfs: /nonexistent: cannot read the sysfs tree")
            && err.contains("give --sysfs the directory that holds devices/ and class/"),
        "{err}"
    );
    assert!(
        stdout(&out).is_empty(),
        "nothing is described: {}",
        stdout(&out)
    );
    // A DGX H100 from its recorded nvidia-smi outputs.
    let data = topologies_dir().join("tests/data/detect");
    let file = |name: &str| data.join(name).display().to_string();
    let (m, s, l) = (
        file("dgx-h100.topo-m.txt"),
        file("dgx-h100.nvlink-s.txt"),
        file("dgx-h100.L.txt"),
    );
    let out = hcclc(&[
        "topo",
        "detect",
        "--name",
        "h100",
        "--mem-bw",
        "5",
        "--topo-matrix",
        &m,
        "--nvlink-status",
        &s,
        "--gpu-list",
        &l,
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(doc["nranks"], 8);
    let ron = doc["ron"].as_str().expect("ron");
    assert!(
        ron.contains("NvSwitch") && ron.contains("count: 18"),
        "{ron}"
    );
    assert!(ron.contains("H100 80GB HBM3"), "{ron}");
    // Bad input: a malformed matrix, a missing file, --nvlink-status alone.
    let bad = std::env::temp_dir().join(format!("hcclc-bad-topo-m-{}.txt", std::process::id()));
    std::fs::write(&bad, "\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV1\t X \n").unwrap();
    let out = hcclc(&["topo", "detect", "--topo-matrix", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nvidia-smi topo -m"));
    let _ = std::fs::remove_file(&bad);
    let out = hcclc(&["topo", "detect", "--topo-matrix", "/nonexistent/topo.txt"]);
    assert_eq!(out.status.code(), Some(2));
    let out = hcclc(&["topo", "detect", "--nvlink-status", &s]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn show_dot_draws_every_device_and_link_and_summarises_large_machines() {
    let out = hcclc(&["topo", "show", "dgx1-v100", "--dot"]);
    assert_eq!(out.status.code(), Some(0));
    let dot = stdout(&out);
    assert!(dot.starts_with("graph \"dgx1-v100\" {") && dot.trim_end().ends_with('}'));
    for i in 0..8 {
        assert!(dot.contains(&format!("\"gpu{i}\" [shape=box")), "gpu{i}");
    }
    let spec = std::fs::read_to_string(topologies_dir().join("machines/dgx1-v100.ron")).unwrap();
    let links = spec
        .lines()
        .filter(|l| l.trim_start().starts_with("(a: "))
        .count();
    assert_eq!(dot.matches(" -- ").count(), links, "one edge per link");
    assert!(
        dot.contains("\"gpu0\" -- \"gpu1\" [label=\"NvLink 2×25 GB/s\"]"),
        "{dot}"
    );
    insta::assert_snapshot!("dot_dgx1", dot);
    // 1024 ranks: one node per host, merged links.
    let cluster = std::env::temp_dir().join(format!("hcclc-dot-{}.ron", std::process::id()));
    let c = cluster.to_str().unwrap();
    let out = hcclc(&[
        "topo", "gen", "cluster", "--nodes", "128", "--box", "dgx-h100", "-o", c,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let dot = stdout(&hcclc(&["topo", "show", c, "--dot"]));
    assert!(dot.contains("hosts summarised"));
    assert_eq!(dot.matches("[shape=box3d").count(), 128);
    assert!(!dot.contains("[shape=box, style"), "no device drawn alone");
    assert!(dot.lines().count() < 2000, "{} lines", dot.lines().count());
    let _ = std::fs::remove_file(&cluster);
    // --dot and --json exclude each other.
    assert_eq!(
        hcclc(&["topo", "show", "dgx1-v100", "--dot", "--json"])
            .status
            .code(),
        Some(2)
    );
}

/// The `<text>` contents of an SVG document (which must parse as XML).
fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("SVG written");
    let doc = roxmltree::Document::parse(&text).expect("the SVG is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or_default().trim().to_string())
        .collect()
}

#[test]
fn show_svg_draws_devices_by_host_and_links_by_kind() {
    let dir = std::env::temp_dir().join(format!("hcclc-topo-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // DGX-1: every device, NIC and switch of its one host; the legend names each kind and
    // bandwidth; the NVLinks between GPUs carry their bandwidth (one link or two).
    let svg = dir.join("dgx1.svg");
    let out = hcclc(&["topo", "show", "dgx1-v100", "--svg", svg.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).contains("dgx1-v100"),
        "the text report still comes"
    );
    let texts = svg_texts(&svg);
    let has = |t: &str| texts.iter().any(|x| x == t);
    for want in (0..8).map(|r| format!("gpu{r}")).chain([
        "ib0".into(),
        "pcie3".into(),
        "cpu1".into(),
        "host dgx1".into(),
        "GPU rank 7".into(),
        "NVLink 25 GB/s".into(),
        "NVLink 2×25 GB/s".into(),
        "PCIe 15.75 GB/s".into(),
    ]) {
        assert!(has(&want), "{want} not in {texts:?}");
    }
    // 16 NVLink pairs, each labelled on its arc.
    let arcs = texts
        .iter()
        .filter(|t| *t == "25 GB/s" || *t == "2×25 GB/s")
        .count();
    assert_eq!(arcs, 16, "{texts:?}");
    // Two hosts of 8 GPUs: both hosts, their ranks 0..15, the rail switches above them.
    let svg2 = dir.join("cluster.svg");
    let out = hcclc(&[
        "topo",
        "show",
        "h100-cluster-2node",
        "--svg",
        svg2.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let texts = svg_texts(&svg2);
    for want in [
        "host n0.dgx-h100",
        "host n1.dgx-h100",
        "GPU rank 15",
        "rail7",
        "InfiniBand 50 GB/s",
    ] {
        assert!(texts.iter().any(|x| x == want), "{want} not in {texts:?}");
    }
    // Beyond 64 ranks one box per host; beyond 24 hosts the rest are counted.
    let topo = dir.join("c40.ron");
    let out = hcclc(&[
        "topo",
        "gen",
        "cluster",
        "--nodes",
        "40",
        "--box",
        "dgx-h100",
        "-o",
        topo.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg3 = dir.join("c40.svg");
    let out = hcclc(&[
        "topo",
        "show",
        topo.to_str().unwrap(),
        "--svg",
        svg3.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let texts = svg_texts(&svg3);
    assert!(
        !texts.iter().any(|t| t.starts_with("gpu")),
        "no device drawn alone"
    );
    let hosts = texts.iter().filter(|t| *t == "8 GPU, 8 NICs").count();
    assert_eq!(hosts, 23, "{texts:?}");
    assert!(texts.iter().any(|t| t == "… 17 more"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t == "17 hosts and their links not drawn")
    );
    // --svg and --dot are one or the other; a directory is no file to write.
    let out = hcclc(&[
        "topo",
        "show",
        "dgx1-v100",
        "--dot",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = hcclc(&["topo", "show", "dgx1-v100", "--svg", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
