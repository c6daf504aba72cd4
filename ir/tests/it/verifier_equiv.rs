//! Pins the verifier's exact verdicts: thousands of generated schedules, most of them mutated
//! once or twice, are verified and every error (kind, location, message) goes into a digest.
//! The snapshot was recorded with the original verifier (one heap bitset per contributor set),
//! so any change of representation must reproduce it byte for byte; a sample of the verdicts
//! is listed in full so a mismatch can be traced.

use crate::common;

use common::{FAMILIES, MUTATIONS, Params, Rng, generate, mutate};
use hccl_ir::verify::verify;
use std::collections::BTreeMap;
use std::fmt::Write;

fn verdict(s: &hccl_ir::Schedule) -> String {
    match verify(s) {
        Ok(()) => "ok".to_string(),
        Err(errors) => errors
            .iter()
            .map(|e| format!("[{}] {e}", e.kind))
            .collect::<Vec<_>>()
            .join(" | "),
    }
}

#[test]
fn verdicts_match_the_recorded_ones() {
    let mut rng = Rng(7);
    let mut digest = blake3::Hasher::new();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut sample = String::new();
    let mut cases = 0usize;
    for family in 0..FAMILIES {
        for n in [2u32, 3, 4, 5, 6] {
            for (q, nch, pieces, in_place) in [(1, 1, 1, false), (2, 2, 2, true), (1, 3, 2, false)]
            {
                let p = Params {
                    family,
                    n,
                    q,
                    nch,
                    pieces,
                    root: n / 2,
                    in_place,
                };
                let base = generate(p);
                for variant in 0..13 {
                    let mut s = base.clone();
                    let mut what = Vec::new();
                    let mutations = match variant {
                        0 => 0,
                        1..=8 => 1,
                        _ => 2,
                    };
                    for _ in 0..mutations {
                        let kind = (rng.next() % MUTATIONS.len() as u64) as usize;
                        if let Some(w) = mutate(&mut s, kind, &mut rng) {
                            what.push(w);
                        }
                    }
                    let v = verdict(&s);
                    let first = v.split(" | ").next().unwrap_or("");
                    let kind = first
                        .strip_prefix('[')
                        .and_then(|k| k.split(']').next())
                        .unwrap_or(first);
                    *kinds.entry(kind.to_string()).or_default() += 1;
                    let line = format!("{p:?} {what:?}: {v}\n");
                    digest.update(line.as_bytes());
                    if cases.is_multiple_of(16) {
                        let short: String = line.chars().take(400).collect();
                        sample.push_str(short.trim_end());
                        sample.push('\n');
                    }
                    cases += 1;
                }
            }
        }
    }
    let mut out = format!("{cases} cases, digest {}\n", digest.finalize().to_hex());
    for (k, c) in &kinds {
        writeln!(out, "{k}: {c}").unwrap();
    }
    out.push_str("sample:\n");
    out.push_str(&sample);
    insta::assert_snapshot!(out);
}
