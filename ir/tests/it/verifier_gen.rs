//! Generated schedules: every valid construction verifies (and the concrete oracle agrees),
//! and random single mutations are rejected unless they really are harmless.

use crate::common;

use common::{FAMILIES, MUTATIONS, Params, Rng, generate, mutate, oracle};
use hccl_ir::verify::{verify, verify_report};
use proptest::prelude::*;

fn params() -> impl Strategy<Value = Params> {
    params_below(3, 4, 3)
}

/// Parameters of [`generate`]'s schedules: every family, 2 to 6 ranks, `q`, channels and
/// pieces below the given bounds.
pub(crate) fn params_below(q: u32, nch: u32, pieces: u32) -> impl Strategy<Value = Params> {
    (
        0..FAMILIES,
        2u32..7,
        1u32..q,
        1u32..nch,
        1u32..pieces,
        0u32..8,
        any::<bool>(),
    )
        .prop_map(|(family, n, q, nch, pieces, root, in_place)| Params {
            family,
            n,
            q,
            nch,
            pieces,
            root,
            in_place,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn generated_schedules_verify(p in params()) {
        let s = generate(p);
        let report = verify_report(&s);
        prop_assert!(report.is_ok(), "{p:?}: {:#?}", report.err());
        prop_assert_eq!(oracle(&s, 7), Ok(()), "oracle disagrees for {:?}", p);
    }

    #[test]
    fn mutations_are_caught_or_harmless(p in params(), kind in 0..MUTATIONS.len(), seed in any::<u64>()) {
        let mut s = generate(p);
        let mut rng = Rng(seed);
        if let Some(what) = mutate(&mut s, kind, &mut rng) && verify(&s).is_ok() {
            // Accepted: it must really still implement the collective.
            for seed in [1, 2] {
                prop_assert_eq!(oracle(&s, seed), Ok(()), "{:?}: verifier accepted `{}`", p, what);
            }
        }
    }
}

/// A deterministic sweep: most mutations are caught, every rejection names a place, and
/// every accepted mutant passes the oracle (so the proptest above is not vacuous).
#[test]
fn mutation_sweep_catches_most() {
    let mut rng = Rng(42);
    let mut tried = 0usize;
    let mut caught = 0usize;
    let mut per_kind = [(0usize, 0usize); MUTATIONS.len()];
    for family in 0..FAMILIES - 1 {
        for n in [2u32, 3, 5] {
            for (q, nch, in_place) in [(1, 1, false), (2, 2, true), (1, 3, false)] {
                let p = Params {
                    family,
                    n,
                    q,
                    nch,
                    pieces: 2,
                    root: n - 1,
                    in_place,
                };
                let base = generate(p);
                for (kind, counts) in per_kind.iter_mut().enumerate() {
                    for _ in 0..3 {
                        let mut s = base.clone();
                        let Some(what) = mutate(&mut s, kind, &mut rng) else {
                            continue;
                        };
                        tried += 1;
                        counts.0 += 1;
                        match verify(&s) {
                            Err(errors) => {
                                caught += 1;
                                counts.1 += 1;
                                assert!(!errors.is_empty());
                            }
                            Ok(()) => {
                                assert_eq!(
                                    oracle(&s, 3),
                                    Ok(()),
                                    "{p:?}: verifier accepted `{what}`"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(tried > 500, "only {tried} mutations applied");
    // Neutral mutations exist (swapping independent sends, dropping a redundant copy), but
    // they are rare.
    assert!(
        caught * 100 >= tried * 85,
        "caught {caught} of {tried}: {per_kind:?}"
    );
    eprintln!("caught {caught} of {tried} mutations; per kind (tried, caught): {per_kind:?}");
    for (kind, &(t, c)) in per_kind.iter().enumerate() {
        if ["drop step", "change peer", "change op", "change channel"].contains(&MUTATIONS[kind]) {
            assert_eq!(t, c, "every `{}` must be caught", MUTATIONS[kind]);
        }
    }
}
