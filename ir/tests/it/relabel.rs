//! Deriving a Broadcast or Reduce for another root by swapping rank labels keeps it correct.

use crate::common;

use hccl_ir::Collective;
use hccl_ir::verify::verify;

#[test]
fn every_root_derived_from_root_zero_verifies() {
    for n in [2u32, 3, 5, 8] {
        for in_place in [false, true] {
            let sources = [
                common::ring_broadcast(n, 0, 2, 2, 3, in_place),
                common::ring_reduce(n, 0, 2, 2, 3, in_place),
                common::direct_broadcast(n, 0, 2, 1, 2, in_place),
                common::direct_reduce(n, 0, 2, 1, 2, in_place),
            ];
            for source in &sources {
                verify(source).unwrap();
                for root in 0..n {
                    let derived = source.with_root(root).unwrap();
                    assert_eq!(derived.collective.root(), Some(root));
                    if let Err(errors) = verify(&derived) {
                        panic!("n={n} root={root}: {}", errors[0]);
                    }
                }
                assert!(source.with_root(n).is_none());
            }
        }
    }
    assert!(
        common::ring_allreduce(4, 1, 1, false)
            .with_root(1)
            .is_none()
    );
}

#[test]
fn ensure_root_adds_entries_only_when_missing() {
    let mut plan = common::plan_of(common::ring_broadcast(4, 0, 2, 1, 2, false), None);
    assert_eq!(plan.ensure_root(Collective::Broadcast { root: 3 }), 1);
    assert_eq!(plan.ensure_root(Collective::Broadcast { root: 3 }), 0);
    assert_eq!(plan.ensure_root(Collective::Reduce { root: 1 }), 0);
    assert_eq!(plan.ensure_root(Collective::AllReduce), 0);
    let derived = plan
        .lookup(Collective::Broadcast { root: 3 }, 1 << 20, false)
        .unwrap();
    verify(&derived.schedule).unwrap();
}
