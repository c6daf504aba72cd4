//! Clusters of CPU hosts (`topo gen host --nic-bw` boxes joined by `topo gen cluster`):
//! `hcclc compile` gives verified plans for every collective, and the cost model prices the
//! network: the TCP latency of the NICs' port and their bandwidth.

use hccl_compiler::cost::CostModel;
use hccl_compiler::search::{self, Options};
use hccl_ir::CollectiveKind;
use hccl_topologies::{Topology, build, generate};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hcclc(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcclc"))
        .env("HCCL_CACHE_DIR", crate::test_cache_dir())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("hcclc runs")
}

fn ok(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hcclc-cpu-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn cpu_cluster(hosts: u32, per_host: u32) -> Topology {
    let host = generate::host_with_nic(per_host, 10.0, 1.25, generate::TCP_NIC_LATENCY_US);
    build(generate::cluster(hosts, &host), "cpu cluster").unwrap()
}

/// The documented commands, end to end: host box, cluster, compile, verify, for 2-4 hosts of
/// one and of two ranks; every collective gets entries, and no prediction beats its bound.
#[test]
fn hcclc_compiles_verified_plans_for_cpu_clusters() {
    let dir = scratch("compile");
    let collectives = [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
    ];
    for per_host in [1u32, 2] {
        let host = format!("host{per_host}.ron");
        let out = hcclc(
            &[
                "topo",
                "gen",
                "host",
                "--ranks",
                &per_host.to_string(),
                "--mem-bw",
                "10",
                "--nic-bw",
                "1.25",
                "-o",
                &host,
            ],
            &dir,
        );
        ok(&out, "topo gen host");
        for hosts in [2u32, 3, 4] {
            let what = format!("{hosts} hosts × {per_host} ranks");
            let cluster = format!("c{hosts}x{per_host}.ron");
            let plan = format!("c{hosts}x{per_host}.plan.ron");
            let out = hcclc(
                &[
                    "topo",
                    "gen",
                    "cluster",
                    "--nodes",
                    &hosts.to_string(),
                    "--box",
                    &host,
                    "-o",
                    &cluster,
                ],
                &dir,
            );
            ok(&out, &what);
            let out = hcclc(
                &[
                    "compile", &cluster, "--sizes", "16K..1M", "-o", &plan, "--json",
                ],
                &dir,
            );
            ok(&out, &what);
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let rows = doc["rows"].as_array().unwrap();
            for c in collectives {
                assert!(
                    rows.iter().any(|r| r["collective"] == c),
                    "{what}: no {c} rows"
                );
            }
            for r in rows {
                let (t, b) = (
                    r["predicted_us"].as_f64().unwrap(),
                    r["bound_us"].as_f64().unwrap(),
                );
                assert!(t.is_finite() && t >= b * (1.0 - 1e-9), "{what}: {r}");
            }
            let out = hcclc(&["verify", &plan], &dir);
            ok(&out, &what);
            // The plan names the cluster and covers every rank.
            let loaded = hccl_ir::PlanFile::load(&dir.join(&plan)).unwrap();
            let topo = hccl_topologies::load(&dir.join(&cluster)).unwrap();
            assert_eq!(topo.nranks(), hosts * per_host, "{what}");
            assert_eq!(loaded.meta.topology_hash, topo.hash, "{what}");
            for e in &loaded.entries {
                assert_eq!(e.schedule.nranks, hosts * per_host, "{what}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Across hosts the CPU model prices TCP: a small AllReduce costs about one NIC-to-NIC
/// latency per message exchanged, a large one the NIC's bandwidth (on 2 hosts of one rank,
/// every byte crosses the 1.25 GB/s NIC once each way: M / 1.25 GB/s). Inside a host it stays
/// the shared-memory model.
#[test]
fn predictions_follow_the_network() {
    let topo = cpu_cluster(2, 1);
    let model = CostModel::for_topology(&topo);
    assert_eq!(model, CostModel::cpu_cluster());
    let big = 16u64 << 20;
    let options = Options {
        collectives: vec![CollectiveKind::AllReduce],
        sizes: vec![8, big],
        model,
        ..Options::default()
    };
    let rows = search::compile(&topo, &options).unwrap().rows;
    let small = &rows[0];
    assert!(
        small.predicted_us > generate::TCP_NIC_LATENCY_US
            && small.predicted_us < 4.0 * generate::TCP_NIC_LATENCY_US,
        "{small:?}"
    );
    let large = &rows[1];
    let wire_us = big as f64 / 1.25e3;
    assert!(
        large.predicted_us >= wire_us && large.predicted_us < 1.1 * wire_us,
        "{large:?}"
    );

    // The same ranks on one host (no NIC on the way) are faster: each rank's thread copies
    // and reduces 4 passes over the buffer at 10 GB/s, against one pass over a 1.25 GB/s NIC.
    let one_host = build(generate::host(2, 10.0), "h").unwrap();
    let options = Options {
        model: CostModel::for_topology(&one_host),
        ..options
    };
    let local = search::compile(&one_host, &options).unwrap().rows;
    assert!(local[0].predicted_us < 1.0, "{:?}", local[0]);
    assert!(
        local[1].predicted_us < 0.6 * large.predicted_us,
        "{:?} vs {large:?}",
        local[1]
    );
}
