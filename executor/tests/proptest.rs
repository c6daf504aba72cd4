//! Property test: random rank counts, element counts, data types, operators, collectives,
//! placements, schedule shapes and protocols all match the sequential reference.

mod common;

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

/// Rank count, channels, pipelined parts, slot bytes, protocol (LL slots or regular), call.
type Scenario = (u32, u32, u32, usize, Protocol, Case);

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
            )
        })
        .prop_map(
            |(n, channels, parts, slot, proto, coll, base, d, o, in_place, seed)| {
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
                (n, channels, parts, slot, proto, case)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_calls_match_the_reference((n, channels, parts, slot, proto, case) in scenario()) {
        let cfg = config().with_slot_bytes(slot);
        let mut plan = fallback::plan_with(n, channels, parts);
        for e in &mut plan.entries {
            e.protocol = proto;
        }
        let errors = run_cases(plan, n, cfg, &[case]);
        prop_assert!(errors.is_empty(), "{:?}", errors);
    }
}
