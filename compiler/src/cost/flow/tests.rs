//! Tests of the filling's share comparisons and of flow runs given a limit.

use super::{FillRes, run_flows, surely_not_below, total_order_key};
use crate::cost::{CostError, CostModel, Network, Simulator};
use crate::families::FamilyParams;
use crate::search::all_families;
use hccl_ir::{Collective, Protocol};
use proptest::prelude::*;

/// A run given a limit stops before its clock reaches it once what is left to start on
/// its busiest resources cannot cross them by then, and never stops a run that makes it
/// (given its own end as the limit, it runs to that end). DGX-1's ring and tree
/// AllReduce, 1 and 64 MiB, both protocols, limits of 50% to 99.9% of the run.
#[test]
fn a_losing_run_stops_before_its_clock_reaches_the_limit() {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").expect("shipped");
    let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
    let one = FamilyParams {
        channels: 1,
        pipeline: 1,
    };
    let (mut stopped, mut early) = (0, 0);
    for name in ["ring", "tree"] {
        let family = all_families()
            .into_iter()
            .find(|f| f.name() == name)
            .expect("registered");
        let cand = family
            .generate(&topo, Collective::AllReduce, one)
            .into_iter()
            .next()
            .expect("a candidate");
        let p = sim.prepare(&cand.schedule).expect("prepares");
        for bytes in [1u64 << 20, 64 << 20] {
            for protocol in [Protocol::LL, Protocol::Simple] {
                let what = format!("{name} at {bytes} B under {protocol:?}");
                let run = |limit: f64| {
                    run_flows(
                        sim.parts(),
                        &p,
                        (bytes, protocol),
                        &mut None,
                        (limit, None, false),
                    )
                };
                let (full, _) = run(f64::INFINITY).expect("runs");
                let end = full.time_us - full.base_us;
                let (within, _) = run(end).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(within, full, "{what}");
                for share in [0.5, 0.9, 0.99, 0.999] {
                    let limit = end * share;
                    match run(limit) {
                        Err(CostError::PastLimit { at_us, .. }) => {
                            stopped += 1;
                            early += usize::from(at_us <= limit);
                        }
                        other => panic!("{what}, limit {limit} µs: {other:?}"),
                    }
                }
            }
        }
    }
    assert_eq!(stopped, 32);
    assert!(early > 8, "only {early} of {stopped} runs stopped early");
}

/// `surely_not_below` never skips a division that would have found a lowered share: where
/// it says "sure", the rounded quotient's key is not below the representative's (above
/// it, but for an infinite representative and remainder, which it equals).
fn check(rep: f64, cnt: u32, rem: f64) {
    let r = FillRes {
        rem,
        rep_key: total_order_key(rep),
        cnt,
        rep_stamp: cnt,
    };
    if surely_not_below(&r) {
        let q = rem / f64::from(cnt);
        let above = total_order_key(q) > r.rep_key;
        assert!(
            above || (q == rep && rep.is_infinite()),
            "rem {rem:e} / cnt {cnt} = {q:e} is not above rep {rep:e}"
        );
    }
}

proptest! {
    /// Near the boundary, a few ulps either side of `rep × cnt`, where rounding decides.
    #[test]
    fn sure_shares_are_above_near_the_boundary(
        rep in 1e-12f64..1e12,
        cnt in 1u32..100_000,
        ulps in -64i64..64,
    ) {
        let exact = rep * f64::from(cnt);
        let rem = f64::from_bits((exact.to_bits() as i64 + ulps) as u64);
        check(rep, cnt, rem);
    }

    /// Anywhere, over many magnitudes, including a representative of zero and infinity.
    #[test]
    fn sure_shares_are_above_anywhere(
        rep in prop_oneof![Just(0.0), Just(f64::INFINITY), 1e-300f64..1e300],
        cnt in 1u32..1_000_000,
        rem in prop_oneof![Just(0.0), Just(f64::INFINITY), 0.0f64..1e300],
    ) {
        check(rep, cnt, rem);
    }
}

/// The filter does skip the common case: a share well above its representative.
#[test]
fn raised_shares_need_no_division() {
    let r = FillRes {
        rem: 300.0,
        rep_key: total_order_key(100.0),
        cnt: 2,
        rep_stamp: 3,
    };
    assert!(surely_not_below(&r));
    let tie = FillRes { rem: 200.0, ..r };
    assert!(
        !surely_not_below(&tie),
        "a share equal to its representative divides"
    );
}
