//! Verification on merged chunks against the run that models every chunk: generated schedules
//! with each chunk split in several (so that the ops move runs of chunks, as the compiler's
//! pipelines do), mutated or not, get the same verdict, report and errors both ways, and
//! whatever the merged run accepts passes the concrete oracle.

use crate::common;

use common::{FAMILIES, MUTATIONS, Params, Rng, generate, mutate, oracle};
use hccl_ir::verify::{merged_chunks, verify_report, verify_report_unmerged};
use hccl_ir::{Loc, Schedule};
use proptest::prelude::*;

/// `s` over `u` times as many chunks, every range `u` times as long and as far in.
fn split(s: &Schedule, u: u32) -> Schedule {
    let mut t = s.clone();
    t.chunks *= u;
    t.input_chunks *= u;
    t.output_chunks *= u;
    let scaled = |l: Loc| Loc::new(l.buf, l.off * u);
    for prog in &mut t.ranks {
        prog.scratch_chunks *= u;
        for step in prog.streams.iter_mut().flat_map(|st| &mut st.steps) {
            step.count *= u;
            step.op = step.op.map_locs(scaled, scaled);
        }
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn merged_runs_agree_with_every_chunk(
        p in crate::verifier_gen::params_below(3, 4, 3),
        u in 2u32..6,
        kind in 0..=MUTATIONS.len(),
        seed in any::<u64>(),
    ) {
        let mut s = split(&generate(p), u);
        let what = if kind < MUTATIONS.len() {
            mutate(&mut s, kind, &mut Rng(seed))
        } else {
            None
        };
        let merged = verify_report(&s);
        prop_assert_eq!(&merged, &verify_report_unmerged(&s), "{:?} split {}, {:?}", p, u, what);
        if merged.is_ok() {
            prop_assert_eq!(oracle(&s, seed), Ok(()), "{:?} split {}: accepted {:?}", p, u, what);
        }
    }
}

/// The property above is not vacuous: split schedules are merged back to at most their own
/// chunks, and a mutant that moves one range by a
/// chunk is merged less (or not at all) and still judged as the run over every chunk judges it.
#[test]
fn split_schedules_merge_back() {
    let mut merged = 0usize;
    let mut rng = Rng(7);
    for family in 0..FAMILIES - 1 {
        for (n, q, nch, pieces, in_place) in [(3u32, 1u32, 1u32, 2u32, false), (4, 2, 2, 1, true)] {
            let p = Params {
                family,
                n,
                q,
                nch,
                pieces,
                root: 1,
                in_place,
            };
            let base = generate(p);
            let s = split(&base, 4);
            assert_eq!(verify_report(&s), verify_report_unmerged(&s), "{p:?}");
            assert!(verify_report(&s).is_ok(), "{p:?}");
            // At most its own chunks (fewer where its ops already move runs of them).
            let chunks = merged_chunks(&s);
            assert!(
                chunks.is_some_and(|c| c <= base.chunks),
                "{p:?}: {chunks:?}"
            );
            merged += 1;
            for kind in 0..MUTATIONS.len() {
                let mut m = s.clone();
                if mutate(&mut m, kind, &mut rng).is_some() {
                    assert_eq!(
                        verify_report(&m),
                        verify_report_unmerged(&m),
                        "{p:?} {kind}"
                    );
                }
            }
        }
    }
    assert!(merged >= 20, "only {merged} schedules merged");
}
