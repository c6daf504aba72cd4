//! The rank index of a large plan file: where every rank program of the explicit entries
//! starts, so that a rank reads its own programs and the text around the rank lists, not the
//! other ranks' programs ([`crate::PlanFile::load_for_ranks`]).
//!
//! [`crate::PlanFile::to_ron`] writes it for plans of [`INDEX_MIN_BYTES`] and more, as the
//! line after `format_version`:
//!
//! ```text
//!   rank_index: "<L><open close n>×L<start>×Σn",
//! ```
//!
//! every number [`DIGITS`] lower-case hex digits and an absolute byte offset into the file:
//! `L` rank lists (in file order), each the byte after its `[`, the byte of its `]` and its
//! element count, then every element's first byte, list by list. The full reader ignores
//! the field. A reader trusts the index only as far as it can check it cheaply (offsets in
//! order and inside the file, elements that look like programs, a text that parses); anything
//! else, such as a file edited by hand after it was written, falls back to scanning the
//! whole text, and the seals still vouch for every program a rank loads.

use crate::plan_scan::{RankList, rank_lists};
use std::ops::Range;

/// The field's name.
pub(crate) const FIELD: &str = "rank_index";
/// Plans whose text is at least this long are written with an index.
pub const INDEX_MIN_BYTES: usize = 4 << 20;
/// Hex digits per number.
const DIGITS: usize = 12;

fn push(out: &mut String, v: usize) {
    use std::fmt::Write;
    let _ = write!(out, "{v:0w$x}", w = DIGITS);
}

/// Where the index line goes: after the line holding `format_version` (the first field).
fn insertion_point(text: &str) -> Option<usize> {
    let fv = text.find("format_version:")?;
    Some(fv + text[fv..].find('\n')? + 1)
}

fn prefix() -> String {
    format!("  {FIELD}: \"")
}

const SUFFIX: &str = "\",\n";

/// `text` with a rank index after its `format_version` line; `None` when it has no explicit
/// rank list or looks unexpected.
pub(crate) fn insert(text: &str) -> Option<String> {
    let lists = rank_lists(text)?;
    let (at, line) = placed(text, &lists)?;
    let mut out = String::with_capacity(text.len() + line.len());
    out.push_str(&text[..at]);
    out.push_str(&line);
    out.push_str(&text[at..]);
    Some(out)
}

/// Where the index of `text`'s rank lists `lists` (all of them, at their offsets in `text`)
/// goes and its line, its offsets those of the text with the line inserted there; `None`
/// when there is no list or the text looks unexpected.
pub(crate) fn placed(text: &str, lists: &[RankList]) -> Option<(usize, String)> {
    let at = insertion_point(text)?;
    if lists.first()?.open < at {
        return None;
    }
    Some((at, line(lists)))
}

/// The index line of `lists`, every offset moved past the line itself.
fn line(lists: &[RankList]) -> String {
    let numbers = 1 + 3 * lists.len() + lists.iter().map(|l| l.elems.len()).sum::<usize>();
    let prefix = prefix();
    let added = prefix.len() + numbers * DIGITS + SUFFIX.len();
    let mut out = String::with_capacity(added);
    out.push_str(&prefix);
    push(&mut out, lists.len());
    for l in lists {
        push(&mut out, l.open + added);
        push(&mut out, l.close + added);
        push(&mut out, l.elems.len());
    }
    for l in lists {
        for &(start, _) in &l.elems {
            push(&mut out, start + added);
        }
    }
    out.push_str(SUFFIX);
    out
}

/// Byte ranges of a plan file (or text).
pub(crate) trait Source {
    fn len(&self) -> usize;
    /// The text of `range`, `None` when it cannot be read or is not UTF-8.
    fn read(&self, range: Range<usize>) -> Option<String>;
}

impl Source for str {
    fn len(&self) -> usize {
        str::len(self)
    }
    fn read(&self, range: Range<usize>) -> Option<String> {
        self.get(range).map(str::to_string)
    }
}

/// A plan file read by positioned reads.
#[cfg(unix)]
pub(crate) struct FileSource {
    pub file: std::fs::File,
    pub len: usize,
}

#[cfg(unix)]
impl Source for FileSource {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, range: Range<usize>) -> Option<String> {
        use std::os::unix::fs::FileExt;
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let mut buf = vec![0u8; range.len()];
        self.file.read_exact_at(&mut buf, range.start as u64).ok()?;
        String::from_utf8(buf).ok()
    }
}

fn number(text: &str, i: usize) -> Option<usize> {
    let digits = text.get(i * DIGITS..(i + 1) * DIGITS)?;
    if !digits
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    usize::from_str_radix(digits, 16).ok()
}

/// The plan text with every rank program of the explicit entries other than those of
/// `ranks` (sorted) replaced by `()`, and without the index line, built from the index and
/// the byte ranges it names; `None` when `src` has no index or it does not check out.
pub(crate) fn shrink(src: &(impl Source + ?Sized), ranks: &[u32]) -> Option<String> {
    const HEAD: usize = 4096;
    let head = src.read(0..HEAD.min(src.len()))?;
    let at = insertion_point(&head)?;
    let prefix = prefix();
    if !head[at..].starts_with(&prefix) {
        return None;
    }
    let start = at + prefix.len();
    let count = |text: &str| number(text, 0);
    let first = src.read(start..(start + DIGITS).min(src.len()))?;
    let nlists = count(&first)?;
    if nlists == 0 || nlists > src.len() / 4 {
        return None;
    }
    let headers = src.read(start..(start + (1 + 3 * nlists) * DIGITS).min(src.len()))?;
    let mut lists = Vec::with_capacity(nlists);
    let mut total = 0usize;
    for l in 0..nlists {
        let (open, close, n) = (
            number(&headers, 1 + 3 * l)?,
            number(&headers, 2 + 3 * l)?,
            number(&headers, 3 + 3 * l)?,
        );
        // Every element takes bytes of the file: no list (nor all together) has more.
        total = total.checked_add(n).filter(|&t| t <= src.len())?;
        lists.push((open, close, n));
    }
    let numbers = 1 + 3 * nlists + total;
    let end = numbers.checked_mul(DIGITS)?.checked_add(start)?;
    if src.read(end..end + SUFFIX.len())? != SUFFIX {
        return None;
    }
    let starts = src.read(start + (1 + 3 * nlists) * DIGITS..end)?;
    let mut out = String::new();
    out.push_str(head.get(..at)?);
    let mut pos = end + SUFFIX.len();
    let mut base = 0usize;
    for &(open, close, n) in &lists {
        if open < pos || close < open || close > src.len() {
            return None;
        }
        out.push_str(&src.read(pos..open)?);
        let elem_start = |k: usize| number(&starts, base + k);
        for k in 0..n {
            if k > 0 {
                out.push_str(", ");
            }
            let keep = u32::try_from(k).is_ok_and(|k| ranks.binary_search(&k).is_ok());
            if !keep {
                out.push_str("()");
                continue;
            }
            let from = elem_start(k)?;
            let to = if k + 1 < n { elem_start(k + 1)? } else { close };
            if from < open || to <= from || to > close {
                return None;
            }
            let text = src.read(from..to)?;
            let elem = text.trim_end_matches(|c: char| c.is_ascii_whitespace() || c == ',');
            let first = elem.bytes().next()?;
            if !(first == b'(' || first.is_ascii_alphabetic()) || !elem.ends_with(')') {
                return None;
            }
            out.push_str(elem);
        }
        base += n;
        pos = close;
    }
    out.push_str(&src.read(pos..src.len())?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "(\n  format_version: 4,\n  meta: (x: \"ranks: [\"),\n  entries: [(\n    schedule: (\n      ranks: [(a: 1), (b: [2]), RankProgram(c: \")\")],\n    ),\n  ), (\n    schedule: (\n      ranks: [],\n    ),\n  ), (\n    schedule: (\n      ranks: [ (d: 4) , ],\n    ),\n  )],\n)\n";

    #[test]
    fn the_index_names_every_program_and_shrinks_like_the_scan() {
        let indexed = insert(TEXT).expect("indexed");
        assert!(indexed.contains("  rank_index: \""));
        for ranks in [vec![], vec![0], vec![1], vec![2], vec![0, 2]] {
            let fast = shrink(indexed.as_str(), &ranks).expect("index checks out");
            // The same rank programs kept as by the scan (separators may differ).
            let slow = crate::plan_scan::shrink(TEXT, &ranks).expect("scan");
            let squash = |s: &str| s.split_whitespace().collect::<String>().replace(",]", "]");
            assert_eq!(squash(&fast), squash(&slow), "{ranks:?}");
        }
    }

    #[test]
    fn a_stale_or_broken_index_is_not_trusted() {
        let indexed = insert(TEXT).expect("indexed");
        // Text inserted after the index shifts every offset.
        let shifted = indexed.replacen("meta: (", "meta: ( ", 1);
        for ranks in [vec![0], vec![1], vec![2]] {
            assert_eq!(shrink(shifted.as_str(), &ranks), None, "{ranks:?}");
        }
        // A digit that is no hex digit, a count past the file, no index at all.
        let bad = indexed.replacen("rank_index: \"0", "rank_index: \"g", 1);
        assert_eq!(shrink(bad.as_str(), &[0]), None);
        let big = indexed.replacen(
            "rank_index: \"000000000003",
            "rank_index: \"ffffffffffff",
            1,
        );
        assert_eq!(shrink(big.as_str(), &[0]), None);
        assert_eq!(shrink(TEXT, &[0]), None);
        assert_eq!(insert("(format_version: 4, entries: [])"), None);
    }
}
