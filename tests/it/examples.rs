//! The examples' logic, run as tests (the examples themselves are built by `cargo test`).

#[path = "../../examples/custom_algorithm.rs"]
#[allow(dead_code)]
mod custom_algorithm;

use custom_algorithm::{compare, indirect_pairs, quad_relay_allgather};
use hccl::ir::Collective;
use hccl::ir::verify::verify_report;
use hccl::topologies::shipped_by_name;

#[test]
fn quad_relay_allgather_verifies_over_direct_links() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    for pieces in [1, 2, 4] {
        for in_place in [false, true] {
            let s = quad_relay_allgather(pieces, in_place).unwrap();
            assert_eq!(s.collective, Collective::AllGather);
            assert_eq!(s.in_place, in_place);
            assert!(indirect_pairs(&topo, &s).is_empty());
            let report = verify_report(&s).unwrap_or_else(|e| panic!("{pieces} {in_place}: {e:?}"));
            // Every block reaches 7 ranks: 4 direct sends and 3 relays per piece.
            assert_eq!(report.messages, u64::from(8 * 7 * pieces));
            // Two hops per piece; the relay of piece q follows its arrival.
            assert!(report.depth >= 2);
        }
    }
}

#[test]
fn quad_relay_is_costed_against_the_builtin_families() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let s = quad_relay_allgather(2, false).unwrap();
    let rows = compare(&topo, &s, &[1 << 20]);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.bytes, 1 << 20);
    assert!(row.custom_us.is_finite() && row.custom_us > 0.0);
    assert!(row.builtin_us.is_finite() && row.builtin_us > 0.0);
    assert_ne!(row.builtin, "none");
}
