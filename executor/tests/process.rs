//! The process backend: real OS processes (this test executable re-executed with
//! `HCCL_TEST_ROLE` set) rendezvousing over TCP and exchanging data through `/dev/shm`, plus
//! in-process checks of the bootstrap (token refusal, plan mismatch).

mod common;

use common::{Case, wait_output};
use hccl_executor::{
    Bootstrap, Communicator, Config, DataType, ExecError, ProcessGroup, ReduceOp, fallback,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::Duration;

const ROLE: &str = "HCCL_TEST_ROLE";

fn spawn_ranks(role: &str, n: u32, extra: &[(&str, &str)]) -> Vec<Child> {
    let exe = std::env::current_exe().expect("test executable");
    let port = common::free_port().to_string();
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            common::rank_command(
                &mut cmd,
                "process_child",
                role,
                (r, n),
                ("127.0.0.1", &port),
                "secret-test-token",
            )
            .env_remove("HCCL_PLAN");
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
        (DataType::BF16, ReduceOp::Max),
        (DataType::I64, ReduceOp::Avg),
        (DataType::U8, ReduceOp::Prod),
    ];
    common::cases(n, &combos, &[0, 1, 13, 1000, 70_001], 100)
}

/// In a child process: the rank's role. Run directly: a one-rank process group.
#[test]
fn process_child() {
    if let Ok(role) = std::env::var(ROLE) {
        common::run_child(&role, &child_cases, 1 << 20);
    }
    let boot = Bootstrap {
        addr: format!("127.0.0.1:{}", common::free_port()),
        token: String::new(),
        host: None,
    };
    let mut comm = ProcessGroup::init_with(fallback::plan(1), 0, 1, &boot, Config::default())
        .expect("one-rank group");
    let mut buf = vec![3i32; 17];
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
    assert_eq!(buf, vec![3; 17]);
}

#[test]
fn four_processes_run_all_collectives() {
    let children = spawn_ranks("all", 4, &[("HCCL_TIMEOUT", "60")]);
    for (r, c) in children.into_iter().enumerate() {
        let (code, out) = wait_output(c, Duration::from_secs(180));
        assert_eq!(code, Some(0), "rank {r} failed:\n{out}");
        assert!(out.contains(&format!("DONE rank {r}")), "rank {r}:\n{out}");
    }
}

#[test]
fn killed_rank_is_named_by_the_others() {
    let mut children = spawn_ranks("loop", 4, &[("HCCL_TIMEOUT", "30")]);
    let mut victim = children.pop().expect("rank 3");
    let mut lines = BufReader::new(victim.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        let read = lines.read_line(&mut line).unwrap_or(0);
        assert!(read > 0, "rank 3 ended before its first collective");
        // The harness may print "test process_child ... " before it on the same line.
        if line.contains("READY") {
            break;
        }
    }
    victim.kill().expect("kill rank 3");
    let _ = victim.wait();
    for (r, c) in children.into_iter().enumerate() {
        let (code, out) = wait_output(c, Duration::from_secs(120));
        assert_eq!(code, Some(3), "rank {r} should report an error:\n{out}");
        let err = out
            .lines()
            // The line may follow libtest's "test <child> ... " when the rank
            // failed before printing anything else.
            .find_map(|l| l.find("ERROR:").map(|i| &l[i..]))
            .unwrap_or_default();
        assert!(err.contains("rank 3 failed"), "rank {r}: {err}");
    }
}

fn in_process_group(
    plans: Vec<hccl_ir::PlanFile>,
    token: &str,
) -> Vec<Result<Communicator, ExecError>> {
    let cfg = Config::default().with_timeout(Duration::from_secs(30));
    let ranks = plans.into_iter().map(|p| (p, None, cfg.clone())).collect();
    common::join_group(ranks, token)
}

#[test]
fn mismatched_plans_fail_on_every_rank() {
    let mut other = fallback::plan(2);
    other.meta.topology = "elsewhere".into();
    let results = in_process_group(vec![fallback::plan(2), other], "t");
    for (r, res) in results.into_iter().enumerate() {
        let err = res.expect_err("mismatch must fail");
        assert!(err.to_string().contains("same plan"), "rank {r}: {err}");
    }
}

#[test]
fn connection_without_token_is_refused() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let boot = Bootstrap {
        addr: addr.clone(),
        token: "right".into(),
        host: None,
    };
    let cfg = Config::default().with_timeout(Duration::from_secs(30));
    std::thread::scope(|s| {
        let (b0, c0) = (boot.clone(), cfg.clone());
        let lead = s.spawn(move || ProcessGroup::init_with(fallback::plan(2), 0, 2, &b0, c0));
        // An intruder with the wrong token: rank 0 must close its connection.
        let mut intruder = loop {
            match TcpStream::connect(&addr) {
                Ok(sock) => break sock,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let mut hello = b"HCCLBOOT".to_vec();
        hello.extend_from_slice(&1u32.to_le_bytes());
        hello.extend_from_slice(&5u32.to_le_bytes());
        hello.extend_from_slice(b"wrong");
        hello.extend_from_slice(&[0u8; 16]);
        intruder.write_all(&hello).unwrap();
        intruder
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut reply = Vec::new();
        let _ = intruder.read_to_end(&mut reply);
        assert!(reply.is_empty(), "the intruder got a reply: {reply:?}");
        // The real rank 1 still joins and the group works.
        let (b1, c1) = (boot.clone(), cfg.clone());
        let follow = s.spawn(move || ProcessGroup::init_with(fallback::plan(2), 1, 2, &b1, c1));
        let comms = [lead.join().unwrap(), follow.join().unwrap()];
        let results: Vec<Vec<u64>> = std::thread::scope(|s2| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s2.spawn(move || {
                        let mut c = c.expect("rank joins");
                        let r = u64::from(c.rank());
                        let mut buf = vec![r + 1; 5000];
                        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                        buf
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for buf in results {
            assert_eq!(buf, vec![3u64; 5000]);
        }
    });
}

/// The process backend compares calls through its shared region too: an AllReduce beside
/// a Broadcast fails on both ranks, one naming both calls, well before the 30 s timeout.
#[test]
fn mismatched_calls_fail_on_the_process_backend() {
    let comms = in_process_group(vec![fallback::plan(2), fallback::plan(2)], "t");
    let started = std::time::Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut c = c.expect("joins");
                    let mut buf = vec![1.0f32; 100];
                    let res = if c.rank() == 1 {
                        c.broadcast_in_place(&mut buf, 0)
                    } else {
                        c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    };
                    res.expect_err("the calls differ").to_string()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        errors.iter().any(|e| e.contains("call #1")
            && e.contains("allreduce of 100 float")
            && e.contains("broadcast(root=0) of 100 float")),
        "{errors:?}"
    );
}
