//! Byte edits of plan texts for robustness tests: flips, truncation, insertions of hostile
//! snippets, deletions and number replacements.

use proptest::prelude::*;

/// One edit of a text; positions wrap around the text's length.
#[derive(Debug, Clone)]
pub enum Edit {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, String),
    Delete(usize, usize),
    /// Replaces the number nearest after the position with other digits.
    Digits(usize, String),
}

/// Random edits; insertions are one of `snippets` or short random punctuation.
pub fn edit(snippets: Vec<String>) -> impl Strategy<Value = Edit> {
    let snippet = prop_oneof![
        proptest::sample::select(snippets),
        "[a-z:(),\\[\\] 0-9]{0,12}",
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), snippet).prop_map(|(i, s)| Edit::Insert(i, s)),
        (any::<usize>(), 0usize..40).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<usize>(), "[0-9]{1,11}").prop_map(|(i, s)| Edit::Digits(i, s)),
    ]
}

/// `text` with `edits` applied in order (invalid UTF-8 replaced lossily).
pub fn apply(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for e in edits {
        let len = bytes.len().max(1);
        match e {
            Edit::Flip(i, b) => {
                if let Some(x) = bytes.get_mut(i % len) {
                    *x ^= b;
                }
            }
            Edit::Truncate(i) => bytes.truncate(i % len),
            Edit::Insert(i, s) => {
                let at = (i % len).min(bytes.len());
                bytes.splice(at..at, s.bytes());
            }
            Edit::Delete(i, n) => {
                let at = (i % len).min(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            Edit::Digits(i, s) => {
                let start = (i % len..bytes.len()).find(|&j| bytes[j].is_ascii_digit());
                if let Some(start) = start {
                    let end = (start..bytes.len())
                        .find(|&j| !bytes[j].is_ascii_digit())
                        .unwrap_or(bytes.len());
                    bytes.splice(start..end, s.bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
