//! No input makes parsing or building panic: arbitrary bytes, and shipped files with bytes
//! mutated, deleted or inserted.

use hccl_topologies::{from_bytes, shipped};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = from_bytes(&bytes, "fuzz");
    }

    #[test]
    fn mutated_shipped_files_never_panic(
        which in 0usize..7,
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..6),
    ) {
        let (_, text) = shipped()[which % shipped().len()];
        let mut bytes = text.as_bytes().to_vec();
        for (at, op, byte) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at.index(bytes.len());
            match op {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
        }
        if let Ok(topo) = from_bytes(&bytes, "fuzz") {
            // Anything accepted is a consistent topology.
            prop_assert_eq!(topo.ranks.len(), topo.host_of.len());
            prop_assert!(topo.nranks() > 0);
        }
    }

    #[test]
    fn mutated_numbers_never_panic(
        which in 0usize..7,
        value in prop::sample::select(vec![
            "0", "-1", "0.0", "-0.0", "1e400", "-1e400", "NaN", "inf", "1e-320",
            "4294967296", "18446744073709551616", "\"x\"", "[]", "()", "None",
        ]),
        at in any::<prop::sample::Index>(),
    ) {
        let (_, text) = shipped()[which % shipped().len()];
        // Replace one number in the text.
        let numbers: Vec<(usize, usize)> = text
            .match_indices(|c: char| c.is_ascii_digit())
            .map(|(i, _)| i)
            .filter(|&i| i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric())
            .map(|i| {
                let end = text[i..]
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .map_or(text.len(), |e| i + e);
                (i, end)
            })
            .collect();
        prop_assume!(!numbers.is_empty());
        let (s, e) = numbers[at.index(numbers.len())];
        let mutated = format!("{}{}{}", &text[..s], value, &text[e..]);
        let _ = from_bytes(mutated.as_bytes(), "fuzz");
    }
}
