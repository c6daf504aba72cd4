//! Entry points for the fuzz targets in `fuzz/` (cargo fuzz) and for the tests that replay
//! their corpus: every way a plan file or an MSCCL file is read, with what a reader does
//! next. Not part of the API. Each returns whether the input was accepted; malformed input
//! is an error, never a panic, and accepted input must satisfy what the comments say.

use crate::plan::PlanFile;
use crate::verify;

/// Steps a fuzzed plan may expand to: large enough for every seed, small enough that one
/// input takes milliseconds (the limit itself is what `from_ron_within` checks).
pub const MAX_STEPS: u64 = 1 << 14;

/// Reads `bytes` as a plan file in every way a reader does: the full load (symmetric entries
/// expanded within [`MAX_STEPS`]) followed by verification of every entry, the compact
/// load (templates kept) with two ranks' programs built, and the partial loads of ranks
/// `[0]` and `[1, 3]` with each held program checked alone. A plan that loads must load
/// again once written, to the same text.
pub fn plan(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let origin = "fuzz.plan.ron";
    let mut accepted = false;
    if let Ok(plan) = PlanFile::from_ron_within(text, origin, MAX_STEPS) {
        accepted = true;
        let _ = plan.identity();
        let _ = plan.sealed();
        for entry in &plan.entries {
            let _ = verify::verify_entry(entry);
        }
        let written = plan.to_ron();
        let again = PlanFile::from_ron_within(&written, origin, MAX_STEPS)
            .unwrap_or_else(|e| panic!("a plan written again does not read: {e}\n{written}"));
        assert_eq!(
            again.to_ron(),
            written,
            "a plan read again writes other text"
        );
    }
    if let Ok(mut plan) = PlanFile::from_ron_compact(text, origin) {
        accepted = true;
        for entry in &plan.entries {
            let _ = verify::verify_entry(entry);
        }
        let last = plan
            .entries
            .iter()
            .map(|e| e.schedule.nranks.saturating_sub(1))
            .max()
            .unwrap_or(0);
        let _ = plan.expand_ranks(&[0, last]);
    }
    for ranks in [&[0u32][..], &[1, 3]] {
        if let Ok(part) = PlanFile::from_ron_for_ranks(text, origin, ranks) {
            accepted = true;
            let _ = part.identity();
            for entry in &part.plan.entries {
                for &r in ranks {
                    if r < entry.schedule.nranks {
                        let _ = verify::check_rank(&entry.schedule, r);
                    }
                }
            }
        }
    }
    accepted
}

/// Imports `bytes` as an MSCCL XML algorithm; every imported entry is verified and exported
/// again, and what the exporter writes must import again.
pub fn msccl(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let Ok(imported) = crate::msccl::import_xml(text, "fuzz.xml") else {
        return false;
    };
    for entry in &imported.entries {
        if verify::verify_entry(entry).is_err() {
            continue;
        }
        if let Ok(exported) = crate::msccl::export_xml(entry)
            && let Err(e) = crate::msccl::import_xml(&exported.xml, "fuzz-export.xml")
        {
            panic!(
                "an exported algorithm does not import again: {e}\n{}",
                exported.xml
            );
        }
    }
    true
}
