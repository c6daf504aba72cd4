//! Message checksums (`HCCL_CHECKSUM=1`): results stay right with them on, a message
//! corrupted in flight is caught by its receiver and named (sender, receiver, channel,
//! step), and the same corruption without checksums gives a wrong result (so the fault the
//! tests inject is real). Corruption comes from the executor's test-only fault injection
//! (`hccl_executor::fault`): a bit flipped in a slot after the sender sealed it (the process
//! backend, ranks in separate processes) or in a network part before its receiver checked
//! it (ranks on emulated hosts talking TCP over loopback).
//!
//! A test binary of its own, not a module of `tests/it/`: it starts itself again as rank
//! processes that run `checksum_child` by its exact name, and arms the fault injection, which
//! is process-wide and would corrupt the messages of tests running beside it.

mod common;

use common::{Case, wait_output};
use hccl_executor::fault::{Site, arm};
use hccl_executor::{Communicator, Config, DataType, ExecError, ReduceOp, fallback};
use std::process::Command;
use std::time::Duration;

const ROLE: &str = "HCCL_TEST_ROLE";

fn cases(n: u32) -> Vec<Case> {
    let combos = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::I64, ReduceOp::Max),
        (DataType::BF16, ReduceOp::Avg),
    ];
    // Small counts travel in LL slots, large ones in regular slots and several segments.
    common::cases(n, &combos, &[1, 13, 4099, 70_001], 7 * u64::from(n))
}

/// In a child process: the rank's role (see `common::run_child`).
#[test]
fn checksum_child() {
    if let Ok(role) = std::env::var(ROLE) {
        common::run_child(&role, &cases, 1 << 16);
    }
}

#[test]
fn every_collective_is_right_with_checksums() {
    for n in [2u32, 3, 4] {
        let cfg = common::config().with_checksum(true);
        let errors = common::run_cases(fallback::plan(n), n, cfg, &cases(n));
        assert!(errors.is_empty(), "{n} ranks: {errors:#?}");
    }
}

/// Four rank processes playing every case, with `extra` in their environment; returns
/// each rank's exit code and output.
fn four_processes(extra: &[(&str, &str)]) -> Vec<(Option<i32>, String)> {
    let exe = std::env::current_exe().expect("test executable");
    let port = common::free_port().to_string();
    let children: Vec<_> = (0..4u32)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            common::rank_command(
                &mut cmd,
                "checksum_child",
                "all",
                (r, 4),
                ("127.0.0.1", &port),
                "checksum-token",
            )
            .env_remove("HCCL_PLAN")
            .env("HCCL_TIMEOUT", "60");
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect();
    children
        .into_iter()
        .map(|c| wait_output(c, Duration::from_secs(180)))
        .collect()
}

#[test]
fn a_corrupted_slot_is_caught_by_its_receiver() {
    // Rank 1's fourth message on its host is corrupted after it was sealed.
    let fault = ("HCCL_FAULT_CORRUPT", "slot:1:3");
    let runs = four_processes(&[("HCCL_CHECKSUM", "1"), fault]);
    let caught: Vec<&String> = runs
        .iter()
        .map(|(_, out)| out)
        .filter(|out| out.contains("is corrupt"))
        .collect();
    assert_eq!(caught.len(), 1, "one receiver reports it: {runs:#?}");
    let line = caught[0]
        .lines()
        .find(|l| l.contains("is corrupt"))
        .unwrap_or_default();
    for part in ["from rank 1 on channel", "received at stream", "CRC32C"] {
        assert!(line.contains(part), "{part:?} missing: {line}");
    }
    for (r, (code, out)) in runs.iter().enumerate() {
        assert_ne!(*code, Some(0), "rank {r} must not finish:\n{out}");
        assert!(!out.contains("DONE"), "rank {r}:\n{out}");
    }
    // The same fault without checksums: a wrong result, not an error.
    let runs = four_processes(&[("HCCL_CHECKSUM", "0"), fault]);
    let wrong = runs.iter().any(|(_, out)| out.contains("element"));
    assert!(wrong, "the corruption must change a result: {runs:#?}");
    assert!(
        runs.iter().all(|(_, out)| !out.contains("is corrupt")),
        "{runs:#?}"
    );
}

/// Ranks on `hosts`, as threads of this process (see `tests/it/net.rs`), each with its config.
fn group(hosts: &[&str], cfgs: &[Config]) -> Vec<Result<Communicator, ExecError>> {
    let n = hosts.len() as u32;
    let ranks = hosts
        .iter()
        .zip(cfgs)
        .map(|(h, cfg)| (fallback::plan(n), Some(h.to_string()), cfg.clone()))
        .collect();
    common::join_group(ranks, "checksum-net")
}

#[test]
fn a_corrupted_network_part_is_caught_and_named() {
    let hosts = ["ck-a", "ck-a", "ck-b", "ck-b"];
    let cfg = common::config().with_checksum(true);
    let comms: Vec<Communicator> = group(&hosts, &vec![cfg; 4])
        .into_iter()
        .map(|c| c.expect("rank joins"))
        .collect();
    // Rank 2 (host b) gets its first part from host a corrupted on arrival.
    arm(Site::Wire, 2, 0);
    let results: Vec<(u32, Result<(), ExecError>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32 + c.rank() as f32; 100_000];
                    let r = c.all_reduce_in_place(&mut buf, ReduceOp::Sum);
                    (c.rank(), r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let corrupt: Vec<&ExecError> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .filter(|e| matches!(e, ExecError::Corrupt { .. }))
        .collect();
    assert_eq!(corrupt.len(), 1, "{results:#?}");
    let ExecError::Corrupt {
        rank,
        sender,
        detail,
        ..
    } = corrupt[0]
    else {
        unreachable!()
    };
    assert_eq!(*rank, 2, "{}", corrupt[0]);
    assert!(
        *sender < 2,
        "the sender is on the other host: {}",
        corrupt[0]
    );
    assert!(detail.contains("network"), "{}", corrupt[0]);
    for (r, res) in &results {
        assert!(res.is_err(), "rank {r} must not return a result");
    }
}

#[test]
fn ranks_must_agree_on_checksums() {
    let on = common::config().with_checksum(true);
    let off = common::config();
    let results = group(&["ag", "ag"], &[on, off]);
    for (r, res) in results.into_iter().enumerate() {
        let err = res.expect_err("disagreement must fail");
        assert!(err.to_string().contains("HCCL_CHECKSUM"), "rank {r}: {err}");
    }
}
