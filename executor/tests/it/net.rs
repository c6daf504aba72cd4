//! Ranks on different hosts: every rank of these groups is a thread of this test process,
//! but each claims a host of its own (`Bootstrap::host`, what `HCCL_HOST_ID` sets), so ranks
//! of one "host" share a `/dev/shm` region and the others talk over TCP on loopback — the
//! code path of a real multi-host job. Namespaced hosts and process faults are tested in the
//! workspace's `tests/multihost.rs`.

use crate::common;

use common::Case;
use hccl_executor::net::NetConfig;
use hccl_executor::{Communicator, Config, DataType, ReduceOp, fallback};
use hccl_ir::PlanFile;
use std::time::Duration;

/// Starts one rank per entry of `hosts` (its host name) and returns the communicators.
fn group(plan: &PlanFile, hosts: &[String], cfg: &Config) -> Vec<Communicator> {
    let ranks = hosts
        .iter()
        .map(|h| (plan.clone(), Some(h.clone()), cfg.clone()))
        .collect();
    common::join_group(ranks, "net-test-token")
        .into_iter()
        .enumerate()
        .map(|(r, c)| c.unwrap_or_else(|e| panic!("rank {r} failed to join: {e}")))
        .collect()
}

/// `hosts` × `per_host` ranks, host-major.
fn layout(tag: &str, hosts: usize, per_host: usize) -> Vec<String> {
    (0..hosts * per_host)
        .map(|r| format!("{tag}-h{}", r / per_host))
        .collect()
}

fn run(comms: Vec<Communicator>, cases: &[Case]) -> Vec<String> {
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for mut comm in comms {
            let errors = &errors;
            s.spawn(move || {
                for case in cases {
                    if let Err(e) = common::check(&mut comm, case) {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("rank {}: {e}", comm.rank()));
                        comm.abort();
                        return;
                    }
                }
            });
        }
    });
    errors.into_inner().unwrap()
}

fn cases(n: u32, bases: &[usize], seed: u64) -> Vec<Case> {
    let combos = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::I64, ReduceOp::Max),
        (DataType::BF16, ReduceOp::Avg),
    ];
    common::cases(n, &combos, bases, seed)
}

fn config() -> Config {
    Config::default().with_timeout(Duration::from_secs(60))
}

#[test]
fn every_collective_across_hosts() {
    // (hosts, ranks per host, element counts): odd and prime counts, and one that needs
    // several slot-sized segments.
    for (hosts, per_host, bases) in [
        (2usize, 1usize, &[1usize, 13, 70_001][..]),
        (2, 2, &[1, 65_537][..]),
        (3, 2, &[7, 1009][..]),
        (4, 2, &[3, 4099][..]),
    ] {
        let n = (hosts * per_host) as u32;
        let comms = group(
            &fallback::plan(n),
            &layout(&format!("every{hosts}x{per_host}"), hosts, per_host),
            &config(),
        );
        let errors = run(comms, &cases(n, bases, 1000 * n as u64));
        assert!(errors.is_empty(), "{hosts} hosts x {per_host}: {errors:#?}");
    }
}

#[test]
fn any_mapping_of_ranks_to_hosts_gives_the_same_results() {
    // Interleaved (0,2 | 1,3) and uneven (0 | 1,2,3) mappings of 4 ranks.
    for hosts in [vec!["a", "b", "a", "b"], vec!["x", "y", "y", "y"]] {
        let hosts: Vec<String> = hosts.iter().map(|h| format!("map-{h}")).collect();
        let comms = group(&fallback::plan(4), &hosts, &config());
        let errors = run(comms, &cases(4, &[5, 40_000], 77));
        assert!(errors.is_empty(), "{hosts:?}: {errors:#?}");
    }
}

#[test]
fn several_sockets_and_threads_split_large_messages() {
    let net = NetConfig {
        nsocks: 3,
        nthreads: 2,
        ..NetConfig::default()
    };
    let cfg = config().with_net(net).with_slot_bytes(1 << 20);
    let comms = group(&fallback::plan(4), &layout("socks", 2, 2), &cfg);
    let errors = run(comms, &cases(4, &[1, 300_001], 5));
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn tiny_slots_reuse_every_slot_many_times() {
    // 4 KiB slots: a 1 MiB call is hundreds of messages per connection, so credits and slot
    // reuse are exercised far beyond the two-slot window.
    let cfg = config().with_slot_bytes(4096);
    let comms = group(&fallback::plan(4), &layout("tiny", 2, 2), &cfg);
    let all = cases(4, &[65_537], 9);
    let some: Vec<Case> = all
        .into_iter()
        .filter(|c| c.dtype == DataType::F32 && !c.in_place)
        .collect();
    let errors = run(comms, &some);
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn a_rank_that_leaves_is_named_with_its_host() {
    let comms = group(&fallback::plan(2), &layout("leave", 2, 1), &config());
    let mut it = comms.into_iter();
    let (mut a, b) = (it.next().unwrap(), it.next().unwrap());
    let mut buf = vec![1.0f32; 1000];
    // Both ranks run one call together, then rank 1 leaves.
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            let mut b = b;
            let mut buf = vec![1.0f32; 1000];
            b.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            drop(b);
        });
        a.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        h.join().unwrap();
    });
    assert_eq!(buf, vec![2.0; 1000]);
    let err = a
        .all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .expect_err("the peer left");
    let text = err.to_string();
    assert!(text.contains("rank 1"), "{text}");
    assert!(text.contains("leave-h1"), "{text}");
}

/// Across hosts every data part carries its sender's call, which the receiving step compares
/// with its own: calls that differ only in count (whose ranks would exchange data and
/// finish) fail on the first message with an error naming both calls, under the default
/// `HCCL_CHECK_CALLS=waits`, and no rank returns a result.
#[test]
fn mismatched_calls_across_hosts_are_named() {
    for (hosts, per_host) in [(2usize, 1usize), (2, 2)] {
        let n = (hosts * per_host) as u32;
        let comms = group(
            &fallback::plan(n),
            &layout(&format!("calls{hosts}x{per_host}"), hosts, per_host),
            &config(),
        );
        let results: Vec<(u32, hccl_executor::Result<()>)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let r = c.rank();
                        // A matching call first, then counts that differ by host.
                        let first = c.all_reduce_in_place(&mut [1u8; 8], ReduceOp::Sum);
                        let len = if (r as usize) < per_host { 1000 } else { 2000 };
                        let mut buf = vec![1.0f32; len];
                        let second =
                            first.and_then(|()| c.all_reduce_in_place(&mut buf, ReduceOp::Sum));
                        (r, second)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let named: Vec<String> = results
            .iter()
            .filter_map(|(_, r)| match r {
                Err(e @ hccl_executor::ExecError::CallMismatch { .. }) => Some(e.to_string()),
                _ => None,
            })
            .collect();
        assert!(!named.is_empty(), "{hosts}x{per_host}: {results:#?}");
        for e in &named {
            assert!(
                e.contains("#2") && e.contains("1000 float") && e.contains("2000 float"),
                "{e}"
            );
        }
        for (r, res) in &results {
            assert!(
                res.is_err(),
                "{hosts}x{per_host}: rank {r} returned a result"
            );
        }
    }
}

/// A directory of this test's own, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(under: &std::path::Path, tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = under.join(format!("hccl-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).expect("a private directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ranks that claim one host but make their regions in different directories (containers
/// with a `/dev/shm` of their own, simulated by `HCCL_SHM_DIR`) are told apart at the
/// rendezvous and talk over the network; another path to the same directory (a symbolic
/// link to it) still shares the region.
#[test]
fn ranks_of_one_host_without_a_common_shm_directory_use_the_network() {
    let plan = fallback::plan(4);
    let shm = std::path::Path::new(hccl_executor::config::DEFAULT_SHM_DIR);
    let private = TempDir::new(shm, "private-shm");
    let links = TempDir::new(&std::env::temp_dir(), "shm-link");
    let link = links.0.join("shm");
    std::os::unix::fs::symlink(shm, &link).expect("a link to the shm directory");
    let host = "one-host-two-containers".to_string();
    for (dirs, split) in [
        ([shm, shm, private.0.as_path(), private.0.as_path()], true),
        ([shm, shm, link.as_path(), link.as_path()], false),
    ] {
        let ranks = dirs
            .iter()
            .map(|d| (plan.clone(), Some(host.clone()), config().with_shm_dir(*d)))
            .collect();
        let comms: Vec<Communicator> = common::join_group(ranks, "net-test-token")
            .into_iter()
            .enumerate()
            .map(|(r, c)| c.unwrap_or_else(|e| panic!("rank {r} failed to join: {e}")))
            .collect();
        for c in &comms {
            let hosts: Vec<String> = (0..4).map(|r| c.host_of(r)).collect();
            assert_eq!(hosts[0], hosts[1], "{hosts:?}");
            assert_eq!(hosts[2], hosts[3], "{hosts:?}");
            if split {
                assert_ne!(hosts[0], hosts[2], "{hosts:?}");
                assert!(hosts.iter().all(|h| h.starts_with(&format!("{host}+shm:"))));
            } else {
                assert!(hosts.iter().all(|h| *h == host), "{hosts:?}");
            }
        }
        let errors = run(comms, &cases(4, &[1, 4099], 900));
        assert!(errors.is_empty(), "split {split}: {errors:#?}");
    }
    // Nothing of the job is left in either directory.
    assert_eq!(
        std::fs::read_dir(&private.0).map(|d| d.count()).ok(),
        Some(0)
    );
}
