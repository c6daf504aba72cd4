//! Property test: random rank counts, element counts, data types, operators, collectives,
//! placements, schedule shapes and protocols all match the sequential reference.

use crate::common;

use common::{Case, config, run_cases};
use hccl_executor::{DataType, ReduceOp, fallback};
use hccl_ir::{Collective, Protocol};
use proptest::prelude::*;

fn collective(n: u32) -> impl Strategy<Value = Collective> {
    prop_oneof![
        Just(Collective::AllReduce),
        Just(Collective::AllGather),
        Just(Collective::ReduceScatter),
        Just(Collective::AllToAll),
        (0..n).prop_map(|root| Collective::Broadcast { root }),
        (0..n).prop_map(|root| Collective::Reduce { root }),
    ]
}

/// Rank count, channels, pipelined parts, slot bytes, protocol (LL slots or regular), call,
/// and whether the plan keeps only its out-of-place entries (as compiled plans do: an
/// in-place call then runs an out-of-place schedule on one buffer, or stages a copy).
type Scenario = (u32, u32, u32, usize, Protocol, Case, bool);

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1u32..=5,
        1u32..=3,
        1u32..=3,
        prop_oneof![Just(64usize), Just(4096), Just(1 << 20)],
        prop_oneof![Just(Protocol::LL), Just(Protocol::Simple)],
    )
        .prop_flat_map(|(n, channels, parts, slot, proto)| {
            (
                Just(n),
                Just(channels),
                Just(parts),
                Just(slot),
                Just(proto),
                collective(n),
                0usize..400,
                0usize..DataType::ALL.len(),
                0usize..ReduceOp::ALL.len(),
                any::<bool>(),
                any::<u64>(),
                any::<bool>(),
            )
        })
        .prop_map(
            |(n, channels, parts, slot, proto, coll, base, d, o, in_place, seed, oop)| {
                let count = match coll {
                    Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                        base / n as usize * n as usize
                    }
                    _ => base,
                };
                let case = Case {
                    collective: coll,
                    dtype: DataType::ALL[d],
                    op: ReduceOp::ALL[o],
                    in_place,
                    count,
                    seed,
                };
                (n, channels, parts, slot, proto, case, oop)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_calls_match_the_reference((n, channels, parts, slot, proto, case, oop) in scenario()) {
        let cfg = config().with_slot_bytes(slot);
        let mut plan = fallback::plan_with(n, channels, parts);
        if oop {
            plan.entries.retain(|e| !e.schedule.in_place);
        }
        for e in &mut plan.entries {
            e.protocol = proto;
        }
        let errors = run_cases(plan, n, cfg, &[case]);
        prop_assert!(errors.is_empty(), "{:?}", errors);
    }
}

/// A call with arbitrary buffer lengths and root, made alike by every rank: its validity
/// follows from the lengths alone.
#[derive(Debug, Clone)]
struct BadCall {
    n: u32,
    collective: Collective,
    in_len: usize,
    out_len: usize,
    in_place: bool,
}

fn bad_call() -> impl Strategy<Value = BadCall> {
    (1u32..=4)
        .prop_flat_map(|n| {
            (
                Just(n),
                prop_oneof![
                    Just(Collective::AllReduce),
                    Just(Collective::AllGather),
                    Just(Collective::ReduceScatter),
                    Just(Collective::AllToAll),
                    (0..n + 3).prop_map(|root| Collective::Broadcast { root }),
                    (0..n + 3).prop_map(|root| Collective::Reduce { root }),
                ],
                0usize..40,
                0usize..40,
                any::<bool>(),
            )
        })
        .prop_map(|(n, collective, in_len, out_len, in_place)| BadCall {
            n,
            collective,
            in_len,
            out_len,
            in_place,
        })
}

/// Whether the executor must accept `c` (the rules of `Communicator::run`).
fn valid(c: &BadCall) -> bool {
    let n = c.n as usize;
    if c.collective.root().is_some_and(|r| r >= c.n) {
        return false;
    }
    let blocked = matches!(
        c.collective,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll
    );
    let total = if c.in_place {
        c.out_len
    } else {
        match c.collective {
            Collective::AllGather if c.in_len * n != c.out_len => return false,
            Collective::AllGather => c.out_len,
            Collective::ReduceScatter if c.out_len * n != c.in_len => return false,
            Collective::ReduceScatter => c.in_len,
            _ if c.in_len != c.out_len => return false,
            _ => c.in_len,
        }
    };
    !blocked || total % n == 0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Arbitrary buffer lengths and roots: every rank gets the same verdict, an error is a
    /// typed argument error (never a panic, an out-of-bounds access or a hang), and the
    /// communicator still computes right afterwards.
    #[test]
    fn bad_buffers_and_roots_are_clear_errors(c in bad_call()) {
        use hccl_executor::{Buffers, ExecError, ThreadGroup};
        let comms = ThreadGroup::with_config(fallback::plan(c.n), c.n, config()).unwrap();
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    let c = c.clone();
                    s.spawn(move || {
                        let mut input = vec![1.0f32; c.in_len];
                        let mut output = vec![0.0f32; c.out_len];
                        let buffers = if c.in_place {
                            Buffers::InPlace(&mut output)
                        } else {
                            Buffers::OutOfPlace { input: &input, output: &mut output }
                        };
                        let first = comm.run(c.collective, ReduceOp::Sum, buffers);
                        let verdict = match first {
                            Ok(()) => Ok(()),
                            Err(e @ (ExecError::BadBuffers { .. } | ExecError::Invalid(_))) => {
                                Err(e.to_string())
                            }
                            Err(e) => return Err(format!("unexpected error: {e}")),
                        };
                        // Still usable: an AllReduce of the ranks' ones.
                        input.resize(7, 1.0);
                        comm.all_reduce_in_place(&mut input[..7], ReduceOp::Sum)
                            .map_err(|e| format!("after the call: {e}"))?;
                        if input[..7].iter().any(|&x| x != c.n as f32) {
                            return Err(format!("after the call: {:?}", &input[..7]));
                        }
                        verdict
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        for r in &results {
            prop_assert!(!r.as_ref().is_err_and(|e| e.starts_with("unexpected") || e.starts_with("after")), "{:?}: {:?}", c, results);
            prop_assert_eq!(r.is_ok(), valid(&c), "{:?}: {:?}", c, results);
        }
    }
}
