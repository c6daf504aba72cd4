//! Plans compiled for CPU clusters (`topo gen host --nic-bw` boxes joined by `topo gen
//! cluster`) run by rank processes on emulated hosts: network namespaces joined by veth pairs
//! (made and removed by the test; skipped with a message where that is not possible), and
//! hosts told apart by `HCCL_HOST_ID` on loopback. Faults: a killed rank on another host, a
//! host whose link goes down, a stranger at the rendezvous port.
//!
//! Ranks are this test executable re-executed (`multihost_child`) with launcher variables,
//! inside `ip netns exec` for namespaced hosts.
//!
//! A test binary of its own, not a module of `tests/it/`: it re-executes itself by exact test
//! name, makes and removes network namespaces, and kills the rank processes it started.

#[path = "../executor/tests/common/mod.rs"]
mod common;
mod netns;

use common::{Case, wait_output};
use hccl::compiler::cost::CostModel;
use hccl::compiler::search::{self, Options};
use hccl::executor::{DataType, ReduceOp};
use hccl::ir::Collective;
use hccl::topologies::{build, generate};
use netns::Cluster;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const ROLE: &str = "HCCL_TEST_ROLE";

/// Compiles every collective for `hosts` CPU hosts of `per_host` ranks with a 10 Gbit/s NIC
/// each, as `hcclc topo gen host --ranks P --nic-bw 1.25`, `topo gen cluster --nodes H` and
/// `hcclc compile` do, and writes the plan to a temporary file.
fn cluster_plan(hosts: u32, per_host: u32) -> PathBuf {
    let host = generate::host_with_nic(per_host, 10.0, 1.25, generate::TCP_NIC_LATENCY_US);
    let topo = build(generate::cluster(hosts, &host), "cpu cluster").expect("valid cluster");
    let options = Options {
        // Two size buckets keep the (debug-build) search short; the plan still holds a
        // small-message and a large-message winner per collective.
        sizes: vec![4096, 1 << 20],
        model: CostModel::for_topology(&topo),
        ..Options::default()
    };
    let mut plan = search::compile(&topo, &options).expect("compiles").plan;
    // Plans hold rooted collectives for root 0; derive every other root (as hccl-perf does).
    for root in 1..hosts * per_host {
        plan.ensure_root(Collective::Broadcast { root });
        plan.ensure_root(Collective::Reduce { root });
    }
    let path = std::env::temp_dir().join(format!(
        "hccl-multihost-{}-{hosts}x{per_host}.plan.ron",
        std::process::id()
    ));
    // With a rank index, as `hcclc compile` writes large plans: the ranks read their
    // programs through it.
    std::fs::write(&path, plan.to_ron_indexed()).expect("plan saved");
    path
}

/// The rendezvous port inside namespaced hosts (below Linux's ephemeral range, 32768–60999).
const NETNS_MASTER_PORT: u16 = 29500;

/// Where rank processes run.
enum Hosts<'a> {
    /// Namespaced hosts: rank `r` runs on host `r / per_host`.
    Netns(&'a Cluster, u32),
    /// Loopback, every rank on its own "host".
    Loopback,
}

fn spawn_ranks(
    hosts: &Hosts<'_>,
    role: &str,
    n: u32,
    plan: &PathBuf,
    extra: &[(&str, &str)],
) -> Vec<Child> {
    let exe = std::env::current_exe().expect("test executable");
    // In a cluster's own namespaces a fixed port below the ephemeral range cannot collide:
    // not with other tests (other namespaces), not with the ranks' data listeners (ephemeral
    // ports on the same address, one of which once took a "free" port picked outside).
    let (master, port) = match hosts {
        Hosts::Netns(c, _) => (c.addr(0), NETNS_MASTER_PORT.to_string()),
        Hosts::Loopback => ("127.0.0.1".to_string(), common::free_port().to_string()),
    };
    (0..n)
        .map(|r| {
            let (mut cmd, host) = match hosts {
                Hosts::Netns(c, per) => {
                    let h = (r / per) as usize;
                    (c.command(h, &exe), c.ns(h).to_string())
                }
                Hosts::Loopback => (Command::new(&exe), format!("lo-host{r}")),
            };
            common::rank_command(
                &mut cmd,
                "multihost_child",
                role,
                (r, n),
                (&master, &port),
                "multihost-token",
            )
            .env("HCCL_HOST_ID", host)
            .env("HCCL_PLAN", plan);
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect()
}

fn child_cases(n: u32) -> Vec<Case> {
    let combos = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::F16, ReduceOp::Avg),
    ];
    common::cases(n, &combos, &[1, 97, 40_009], 7000)
}

/// In a child process: the rank's role. Run directly: nothing to do.
#[test]
fn multihost_child() {
    if let Ok(role) = std::env::var(ROLE) {
        common::run_child(&role, &child_cases, 1 << 18);
    }
}

/// Waits for every rank; a failure names every rank that did not finish, with what each
/// printed (the first to fail is often not the first in rank order).
fn expect_all_done(children: Vec<Child>, what: &str) {
    let mut failed = String::new();
    for (r, c) in children.into_iter().enumerate() {
        let (code, out) = wait_output(c, Duration::from_secs(240));
        if code != Some(0) || !out.contains(&format!("DONE rank {r}")) {
            failed.push_str(&format!("rank {r} (exit {code:?}):\n{out}\n"));
        }
    }
    assert!(failed.is_empty(), "{what}:\n{failed}");
}

/// Reads a child's stdout until it prints READY (its first collective completed).
fn wait_ready(child: &mut Child) -> BufReader<std::process::ChildStdout> {
    let mut lines = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        let read = lines.read_line(&mut line).unwrap_or(0);
        assert!(read > 0, "a rank ended before its first collective");
        if line.contains("READY") {
            return lines;
        }
    }
}

#[test]
fn compiled_cluster_plans_run_on_namespaced_hosts() {
    for (hosts, per_host) in [(2u32, 1u32), (2, 2), (3, 2), (4, 2)] {
        let cluster = match Cluster::up(hosts as usize, None) {
            Ok(c) => c,
            Err(why) => {
                println!("skipped: no network namespaces ({why})");
                return;
            }
        };
        let plan = cluster_plan(hosts, per_host);
        let n = hosts * per_host;
        let children = spawn_ranks(
            &Hosts::Netns(&cluster, per_host),
            "all",
            n,
            &plan,
            &[("HCCL_TIMEOUT", "60")],
        );
        expect_all_done(children, &format!("{hosts} hosts x {per_host}"));
        let _ = std::fs::remove_file(&plan);
    }
}

#[test]
fn every_rank_its_own_host_on_loopback_despite_a_stranger() {
    let plan = cluster_plan(4, 1);
    let children = spawn_ranks(&Hosts::Loopback, "all", 4, &plan, &[("HCCL_TIMEOUT", "60")]);
    expect_all_done(children, "4 loopback hosts");
    let _ = std::fs::remove_file(&plan);
}

/// `HCCL_VERIFY=full`: every rank verifies the whole plan, its symmetric entries on their
/// templates (`PlanFile::load_compact`), and builds only its host's programs from them; the
/// job computes as with the default checks.
#[test]
fn full_verification_at_start_runs_the_plan_held_as_templates() {
    let plan = cluster_plan(2, 2);
    let compact = hccl::ir::PlanFile::load_compact(&plan).expect("loads compact");
    assert!(
        compact.entries.iter().any(|e| e.template.is_some()),
        "the plan has symmetric entries"
    );
    let children = spawn_ranks(
        &Hosts::Loopback,
        "all",
        4,
        &plan,
        &[("HCCL_TIMEOUT", "60"), ("HCCL_VERIFY", "full")],
    );
    expect_all_done(children, "HCCL_VERIFY=full, 4 loopback hosts");
    let _ = std::fs::remove_file(&plan);
}

#[test]
fn a_stranger_at_the_rendezvous_never_gets_in() {
    // The stranger connects to rank 0's rendezvous port before the real ranks and sends
    // garbage; the job still assembles and runs, and the stranger gets no byte back.
    let plan = cluster_plan(2, 1);
    let exe = std::env::current_exe().expect("test executable");
    let port = common::free_port();
    let mut ranks = Vec::new();
    for r in 0..2u32 {
        let mut cmd = Command::new(&exe);
        let port_text = port.to_string();
        common::rank_command(
            &mut cmd,
            "multihost_child",
            "all",
            (r, 2),
            ("127.0.0.1", &port_text),
            "the-right-token",
        )
        .env("HCCL_HOST_ID", format!("stranger-test-h{r}"))
        .env("HCCL_PLAN", &plan)
        .env("HCCL_TIMEOUT", "60");
        if r == 1 {
            // Rank 1 starts after the stranger has spoken.
            let mut stranger = loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(s) => break s,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            };
            stranger
                .write_all(b"HCCLBOOT\x01\x00\x00\x00\x05\x00\x00\x00wrong garbage garbage")
                .unwrap();
            stranger
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut reply = Vec::new();
            let _ = stranger.read_to_end(&mut reply);
            assert!(reply.is_empty(), "the stranger got a reply: {reply:?}");
        }
        ranks.push(cmd.spawn().expect("spawn a rank"));
    }
    expect_all_done(ranks, "2 ranks after a stranger");
    let _ = std::fs::remove_file(&plan);
}

#[test]
fn a_killed_rank_on_another_host_is_named_by_every_survivor() {
    let cluster = match Cluster::up(2, None) {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: no network namespaces ({why})");
            return;
        }
    };
    let plan = cluster_plan(2, 2);
    let mut children = spawn_ranks(
        &Hosts::Netns(&cluster, 2),
        "loop",
        4,
        &plan,
        &[("HCCL_TIMEOUT", "20")],
    );
    let mut victim = children.pop().expect("rank 3");
    let _lines = wait_ready(&mut victim);
    let killed = Instant::now();
    victim.kill().expect("kill rank 3");
    let _ = victim.wait();
    for (r, c) in children.into_iter().enumerate() {
        let (code, out) = wait_output(c, Duration::from_secs(60));
        assert_eq!(code, Some(3), "rank {r} should report an error:\n{out}");
        let err = out
            .lines()
            // The line may follow libtest's "test <child> ... " when the rank
            // failed before printing anything else.
            .find_map(|l| l.find("ERROR:").map(|i| &l[i..]))
            .unwrap_or_default();
        assert!(err.contains("rank 3 failed"), "rank {r}: {err}");
        assert!(
            err.contains(cluster.ns(1)),
            "rank {r} names rank 3's host: {err}"
        );
    }
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "within HCCL_TIMEOUT"
    );
    let _ = std::fs::remove_file(&plan);
}

#[test]
fn a_host_whose_link_goes_down_is_named_within_the_timeout() {
    let cluster = match Cluster::up(2, None) {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: no network namespaces ({why})");
            return;
        }
    };
    let plan = cluster_plan(2, 1);
    let mut children = spawn_ranks(
        &Hosts::Netns(&cluster, 1),
        "loop",
        2,
        &plan,
        &[("HCCL_TIMEOUT", "10")],
    );
    let mut readers = Vec::new();
    for c in &mut children {
        readers.push(wait_ready(c));
    }
    let down = Instant::now();
    cluster.link_down(1);
    for (r, (c, lines)) in children.into_iter().zip(readers).enumerate() {
        // The readers hold stdout now: wait for the exit, then read the rest.
        let mut c = c;
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            match c.try_wait() {
                Ok(Some(s)) => break s.code(),
                _ if Instant::now() > deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let rest: String = lines
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(code, Some(3), "rank {r} should report an error:\n{rest}");
        let other = 1 - r;
        assert!(
            rest.contains(&format!("rank {other}")) && rest.contains(cluster.ns(other)),
            "rank {r} names rank {other} and its host: {rest}"
        );
    }
    assert!(
        down.elapsed() < Duration::from_secs(15),
        "errors within HCCL_TIMEOUT (10 s), took {:?}",
        down.elapsed()
    );
    let _ = std::fs::remove_file(&plan);
}

/// A sealed cluster plan whose rank 3's program of an explicit entry was edited after it was
/// compiled (the seals kept): rank 3, which reads only its host's programs, refuses it, and
/// every rank learns why at the rendezvous; with `HCCL_VERIFY=full` every rank reads the
/// whole plan and refuses it itself.
#[test]
fn a_program_edited_after_sealing_is_refused_by_its_rank_and_named_to_all() {
    let path = cluster_plan(2, 2);
    let mut plan = hccl::ir::PlanFile::load(&path).expect("sealed plan loads");
    assert!(plan.sealed().iter().all(|s| *s));
    let entry = plan
        .entries
        .iter()
        .position(|e| !e.is_compact() && !e.schedule.ranks[3].streams.is_empty())
        .expect("an explicit entry in which rank 3 works");
    let step = &mut plan.entries[entry].schedule.ranks[3].streams[0].steps[0];
    step.deps.push(hccl::ir::Dep { stream: 0, step: 0 });
    // Saved as the tests' plans are, with an index.
    std::fs::write(&path, plan.to_ron_indexed()).expect("edited plan saved");
    for (verify, wants) in [
        ("auto", format!("entry {entry}")),
        (
            "full",
            "was changed after its plan was verified".to_string(),
        ),
    ] {
        let children = spawn_ranks(
            &Hosts::Loopback,
            "all",
            4,
            &path,
            &[("HCCL_TIMEOUT", "30"), ("HCCL_VERIFY", verify)],
        );
        for (r, c) in children.into_iter().enumerate() {
            let (code, out) = wait_output(c, Duration::from_secs(120));
            assert_eq!(code, Some(2), "HCCL_VERIFY={verify}: rank {r}:\n{out}");
            assert!(
                out.contains(&wants),
                "HCCL_VERIFY={verify}: rank {r}:\n{out}"
            );
            if verify == "auto" {
                assert!(
                    out.contains("rank 3's program was changed"),
                    "HCCL_VERIFY=auto: rank {r} learns it from rank 3:\n{out}"
                );
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}
