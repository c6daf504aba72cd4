//! AllToAllv on every host backend: random counts (zeros included) with scattered
//! displacements, given or exchanged receive counts, block-by-block and padded replays,
//! LL and Simple, checksums, emulated hosts over loopback; counts that disagree and bad
//! displacements give typed errors and leave the communicator usable.

use crate::common;

use hccl_executor::{CallCheck, Communicator, Config, ExecError, ThreadGroup, fallback};
use hccl_ir::{Collective, PlanFile, Protocol};
use std::time::Duration;

/// A small deterministic generator.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 31;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// `counts[s][d]`: elements rank `s` sends rank `d`, about a third of them zero, up to `max`.
fn counts(n: usize, max: usize, seed: u64) -> Vec<Vec<usize>> {
    (0..n)
        .map(|s| {
            (0..n)
                .map(|d| {
                    let h = mix(seed ^ ((s as u64) << 20) ^ d as u64);
                    if h.is_multiple_of(3) {
                        0
                    } else {
                        (h >> 8) as usize % (max + 1)
                    }
                })
                .collect()
        })
        .collect()
}

/// Displacements of `counts` laid out in reverse peer order with a gap of `gap` elements
/// before each block, and the buffer length.
fn scattered(counts: &[usize], gap: usize) -> (Vec<usize>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut at = 0;
    for p in (0..counts.len()).rev() {
        at += gap;
        displs[p] = at;
        at += counts[p];
    }
    (displs, at + gap)
}

/// The value rank `s` sends as element `i` of its block for rank `d`.
fn value(s: usize, d: usize, i: usize) -> i64 {
    ((s * 1_000_003 + d * 7919 + i) % 1_000_000) as i64
}

const FILL: i64 = -1;

/// Runs one AllToAllv (given receive counts unless `exchanged`) of `counts` on `comm` and
/// checks every element it received and that gaps were left alone.
fn one_call(comm: &mut Communicator, c: &[Vec<usize>], exchanged: bool) -> Result<(), String> {
    let n = c.len();
    let r = comm.rank() as usize;
    let send: Vec<usize> = c[r].clone();
    let recv: Vec<usize> = (0..n).map(|s| c[s][r]).collect();
    let (sdispl, slen) = scattered(&send, 3);
    let mut input = vec![FILL; slen];
    for d in 0..n {
        for i in 0..send[d] {
            input[sdispl[d] + i] = value(r, d, i);
        }
    }
    let (out, rdispl, got_counts) = if exchanged {
        let (out, got) = comm
            .all_to_all_v_exchanged(&input, &send, &sdispl)
            .map_err(|e| e.to_string())?;
        let mut displs = Vec::new();
        let mut at = 0;
        for &k in &got {
            displs.push(at);
            at += k;
        }
        if out.len() != at {
            return Err(format!("output of {} for {at} received", out.len()));
        }
        (out, displs, got)
    } else {
        let (rdispl, rlen) = scattered(&recv, 2);
        let mut out = vec![FILL; rlen];
        comm.all_to_all_v(&input, &send, &sdispl, &mut out, &recv, &rdispl)
            .map_err(|e| e.to_string())?;
        (out, rdispl, recv.clone())
    };
    if got_counts != recv {
        return Err(format!("received counts {got_counts:?}, expected {recv:?}"));
    }
    let mut want = vec![FILL; out.len()];
    for s in 0..n {
        for i in 0..recv[s] {
            want[rdispl[s] + i] = value(s, r, i);
        }
    }
    if let Some(i) = (0..out.len()).find(|&i| out[i] != want[i]) {
        return Err(format!(
            "rank {r}: element {i} is {}, expected {} (counts {c:?})",
            out[i], want[i]
        ));
    }
    Ok(())
}

/// Every rank runs every call of `calls` (counts, exchanged); the errors.
fn run(comms: Vec<Communicator>, calls: &[(Vec<Vec<usize>>, bool)]) -> Vec<String> {
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for mut comm in comms {
            let errors = &errors;
            s.spawn(move || {
                for (c, exchanged) in calls {
                    if let Err(e) = one_call(&mut comm, c, *exchanged) {
                        errors.lock().unwrap().push(e);
                        comm.abort();
                        return;
                    }
                }
            });
        }
    });
    errors.into_inner().unwrap()
}

/// Send counts, send displacements, receive counts, receive displacements, and what the
/// error says.
type Args<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize], &'a str);

fn config() -> Config {
    Config::default().with_timeout(Duration::from_secs(60))
}

/// Calls on `n` ranks: small and zero-heavy ones, all-zero, and blocks up to `max`.
fn calls(n: usize, max: usize, seed: u64) -> Vec<(Vec<Vec<usize>>, bool)> {
    vec![
        (counts(n, 5, seed), false),
        (counts(n, 5, seed + 1), true),
        (vec![vec![0; n]; n], false),
        (counts(n, max, seed + 2), false),
        (counts(n, max, seed + 3), true),
    ]
}

/// The fallback plan with its AllToAll entries replaced by the in-place pairwise schedule
/// alone, which cannot run block by block (its own block is never copied): AllToAllv pads.
fn padded_plan(n: u32) -> PlanFile {
    let mut plan = fallback::plan(n);
    plan.entries
        .retain(|e| e.schedule.collective != Collective::AllToAll || e.schedule.in_place);
    plan
}

fn ll_plan(n: u32) -> PlanFile {
    let mut plan = fallback::plan(n);
    for e in &mut plan.entries {
        e.protocol = Protocol::LL;
    }
    plan
}

#[test]
fn threads_random_counts_every_replay() {
    // Block by block (Simple: 300k-element blocks take two segments of 256 KiB slots; LL),
    // padded; 2 to 4 ranks.
    for (plan, n, max, seed) in [
        (fallback::plan(3), 3u32, 100_000usize, 1u64),
        (ll_plan(4), 4, 3000, 2),
        (padded_plan(2), 2, 70_000, 3),
        (fallback::plan_with(4, 2, 3), 4, 5000, 4),
    ] {
        let comms = ThreadGroup::with_config(plan, n, config()).unwrap();
        let errors = run(comms, &calls(n as usize, max, seed));
        assert!(errors.is_empty(), "{n} ranks: {errors:?}");
    }
}

#[test]
fn process_backend_with_checksums_and_across_hosts() {
    // One host (shared memory, checksums on), then 2 emulated hosts of 2 ranks over
    // loopback TCP (both replays).
    let cfg = config().with_checksum(true);
    let ranks = (0..3)
        .map(|_| (fallback::plan(3), None, cfg.clone()))
        .collect();
    let comms: Vec<_> = common::join_group(ranks, "a2av-token")
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    let errors = run(comms, &calls(3, 90_000, 10));
    assert!(errors.is_empty(), "one host: {errors:?}");
    for plan in [fallback::plan(4), padded_plan(4)] {
        let ranks = (0..4)
            .map(|r| (plan.clone(), Some(format!("a2av-h{}", r / 2)), config()))
            .collect();
        let comms: Vec<_> = common::join_group(ranks, "a2av-token")
            .into_iter()
            .map(|c| c.unwrap())
            .collect();
        let errors = run(comms, &calls(4, 40_000, 20));
        assert!(errors.is_empty(), "two hosts: {errors:?}");
    }
}

#[test]
fn disagreeing_counts_name_both_ranks_and_the_rest_computes() {
    let n = 3;
    let comms = ThreadGroup::with_config(fallback::plan(n), n, config()).unwrap();
    let good = counts(3, 50, 7);
    std::thread::scope(|s| {
        for mut comm in comms {
            let good = &good;
            s.spawn(move || {
                let r = comm.rank() as usize;
                let send = good[r].clone();
                let mut recv: Vec<usize> = (0..3).map(|s| good[s][r]).collect();
                if r == 1 {
                    recv[0] += 2; // rank 1 expects two more than rank 0 sends
                }
                let (sd, sl) = scattered(&send, 1);
                let (rd, rl) = scattered(&recv, 1);
                let input = vec![1i32; sl];
                let mut out = vec![0i32; rl];
                let res = comm.all_to_all_v(&input, &send, &sd, &mut out, &recv, &rd);
                let want = format!(
                    "rank 0 sends {} elements to rank 1, which expects {}",
                    good[0][1],
                    good[0][1] + 2
                );
                match (r, res) {
                    (0 | 1, Err(ExecError::BadBuffers { message, .. })) => {
                        assert!(message.contains(&want), "rank {r}: {message}");
                    }
                    (2, Ok(())) => {}
                    (r, res) => panic!("rank {r}: {res:?}"),
                }
                // Not poisoned: the next call computes.
                one_call(&mut comm, good, false).unwrap();
            });
        }
    });
}

#[test]
fn bad_arguments_are_typed_errors_and_an_alltoall_is_not_an_alltoallv() {
    let n = 2;
    // Calls compared as they end (`HCCL_CHECK_CALLS=1`): the two calls below exchange
    // messages that fit their slots, so no rank waits (the default compares on waits).
    let cfg = config().with_check_calls(CallCheck::EveryCall);
    let comms = ThreadGroup::with_config(fallback::plan(n), n, cfg).unwrap();
    std::thread::scope(|s| {
        for mut comm in comms {
            s.spawn(move || {
                let input = vec![0u8; 8];
                let mut out = vec![0u8; 8];
                let cases: [Args<'_>; 4] = [
                    (&[2, 2], &[0, 7], &[2, 2], &[0, 2], "send block 1"),
                    (
                        &[2, 2],
                        &[0, 2],
                        &[2, 2],
                        &[0, 1],
                        "receive blocks 0 and 1 overlap",
                    ),
                    (&[2], &[0], &[2, 2], &[0, 2], "1 send counts for 2 ranks"),
                    (
                        &[2, 2],
                        &[0, 2],
                        &[2, 2],
                        &[usize::MAX, 0],
                        "receive block 0",
                    ),
                ];
                for (sc, sd, rc, rd, want) in cases {
                    match comm.all_to_all_v(&input, sc, sd, &mut out, rc, rd) {
                        Err(ExecError::BadBuffers { message, .. }) => {
                            assert!(message.contains(want), "{message}")
                        }
                        other => panic!("{want}: {other:?}"),
                    }
                }
                one_call(&mut comm, &counts(2, 9, 3), false).unwrap();
                // Rank 0 calls AllToAllv, rank 1 a plain AllToAll: both fail, naming the
                // AllToAllv, instead of exchanging garbage.
                let res = if comm.rank() == 0 {
                    comm.all_to_all_v(&input, &[4, 4], &[0, 4], &mut out, &[4, 4], &[0, 4])
                } else {
                    comm.all_to_all(&input, &mut out)
                };
                match res {
                    Err(e @ ExecError::CallMismatch { .. }) => {
                        let e = e.to_string();
                        assert!(e.contains("alltoallv (its count exchange)"), "{e}");
                    }
                    other => panic!("rank {}: {other:?}", comm.rank()),
                }
            });
        }
    });
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// Ranks, channels, parts per channel, slot bytes, protocol, counts, exchanged.
    type Scenario = (u32, u32, u32, usize, Protocol, Vec<Vec<usize>>, bool);

    fn scenario() -> impl Strategy<Value = Scenario> {
        (1u32..=4, 1u32..=2, 1u32..=3).prop_flat_map(|(n, channels, parts)| {
            let row = proptest::collection::vec(prop_oneof![Just(0usize), 0usize..60], n as usize);
            (
                Just(n),
                Just(channels),
                Just(parts),
                prop_oneof![Just(64usize), Just(4096)],
                prop_oneof![Just(Protocol::LL), Just(Protocol::Simple)],
                proptest::collection::vec(row, n as usize),
                any::<bool>(),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// Random counts (zeros often), schedule shapes, slot sizes (64-byte slots cut
        /// blocks into many segments) and protocols: every element lands where it should.
        #[test]
        fn random_counts_match_the_reference(
            (n, channels, parts, slot, proto, c, exchanged) in scenario()
        ) {
            let mut plan = fallback::plan_with(n, channels, parts);
            for e in &mut plan.entries {
                e.protocol = proto;
            }
            let comms =
                ThreadGroup::with_config(plan, n, config().with_slot_bytes(slot)).unwrap();
            let errors = run(comms, &[(c, exchanged)]);
            prop_assert!(errors.is_empty(), "{:?}", errors);
        }
    }
}
