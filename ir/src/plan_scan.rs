//! A byte-level pre-pass for one-rank plan loading: shrinks the other ranks' programs of
//! explicit entries before the RON parser sees them.
//!
//! [`shrink`] lexes the plan text just enough to find every explicit entry's rank list (the
//! `ranks: [ … ]` of an entry's `schedule: ( … )`, at exactly that nesting, so the integer
//! `ranks` list inside a symmetric entry's `symmetry` is never touched) and replaces each
//! element other than the wanted rank's by `()`, which the one-rank parser skips as cheaply
//! as any value. The lexer follows RON's rules for what can hide brackets: strings with
//! escapes, raw strings (`r#"…"#`, also `b`/`br` forms), char literals, line comments and
//! nested block comments. Anything it does not expect (an unbalanced or mismatched bracket,
//! an unterminated string or comment, a stray `/`, non-ASCII outside strings and comments in
//! the file's structure, a rank-list element that is not a parenthesised value) makes it
//! give up (`None`), and the caller parses the original text instead.
//!
//! Whatever comes back only shortens skipped elements, element count and everything else
//! stay as they were, so parsing it yields what parsing the original yields, except that
//! syntax errors inside a skipped element go unnoticed.

/// The element a skipped rank program is replaced by.
const SKIPPED: &str = "()";

/// Deepest bracket nesting the scanner follows inside one rank program (RON's own limit in
/// this crate is 64).
const MAX_DEPTH: usize = 256;

/// `text` with every explicit entry's rank programs other than those of `ranks` (sorted)
/// replaced by `()`; `None` when the text holds no explicit rank list or looks unexpected
/// (see the module docs).
pub(crate) fn shrink(text: &str, ranks: &[u32]) -> Option<String> {
    if !may_have_explicit(text) {
        return None;
    }
    let lists = rank_lists(text)?;
    if lists.is_empty() {
        return None;
    }
    let mut out = String::new();
    let mut copied = 0usize;
    for list in &lists {
        for (k, &(start, end)) in list.elems.iter().enumerate() {
            out.push_str(&text[copied..start]);
            if u32::try_from(k).is_ok_and(|k| ranks.binary_search(&k).is_ok()) {
                out.push_str(&text[start..end]);
            } else {
                out.push_str(SKIPPED);
            }
            copied = end;
        }
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// Whether `text` may hold an explicit entry: `false` only when every `schedule` in it is a
/// seal's (`schedule: "…"`), so that a plan of symmetric entries alone is not scanned (the
/// scan would find nothing to shrink). Conservative: anything else says `true`.
fn may_have_explicit(text: &str) -> bool {
    text.match_indices("schedule").any(|(at, word)| {
        let rest = text[at + word.len()..].trim_start_matches(|c: char| c.is_ascii_whitespace());
        match rest.strip_prefix(':') {
            Some(value) => !value
                .trim_start_matches(|c: char| c.is_ascii_whitespace())
                .starts_with('"'),
            None => true,
        }
    })
}

/// An explicit entry's rank list in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankList {
    /// Byte just after its `[`.
    pub open: usize,
    /// Byte of its `]`.
    pub close: usize,
    /// Byte range of each element (a rank program), in order.
    pub elems: Vec<(usize, usize)>,
}

impl RankList {
    /// The same list `by` bytes further on (its text's place in a larger one).
    pub(crate) fn moved(&self, by: usize) -> RankList {
        RankList {
            open: self.open + by,
            close: self.close + by,
            elems: self.elems.iter().map(|&(a, b)| (a + by, b + by)).collect(),
        }
    }
}

/// Every explicit entry's rank list, in the order of the text; `None` when the text looks
/// unexpected (see the module docs).
pub(crate) fn rank_lists(text: &str) -> Option<Vec<RankList>> {
    scan(text, Vec::new())
}

/// The rank lists of one plan entry's text alone (as the plan's writer makes it: from its
/// `(` to its `)`), at the offsets of that text: what [`rank_lists`] finds of that entry in
/// the whole plan. `None` when the text looks unexpected or is not one whole value.
pub(crate) fn entry_rank_lists(text: &str) -> Option<Vec<RankList>> {
    scan(text, vec![(b'(', None), (b'[', Some(b"entries"))])
}

/// [`rank_lists`] of a text that starts inside the brackets `outer` (outermost first) and
/// ends there too.
fn scan<'t>(text: &'t str, outer: Vec<(u8, Option<&'t [u8]>)>) -> Option<Vec<RankList>> {
    let bytes = text.as_bytes();
    let mut lists = Vec::new();
    let depth = outer.len();
    // (opening bracket, field name the bracket is the value of)
    let mut frames: Vec<(u8, Option<&[u8]>)> = outer;
    let mut pending: Option<&[u8]> = None;
    let mut last_ident: Option<&[u8]> = None;
    let mut i = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C => i += 1,
            b'/' => i = skip_comment(bytes, i)?,
            b'"' => {
                i = skip_string(bytes, i)?;
                last_ident = None;
            }
            b'\'' => {
                i = skip_char(bytes, i)?;
                last_ident = None;
            }
            b':' => {
                pending = last_ident.take();
                i += 1;
            }
            b',' => {
                pending = None;
                last_ident = None;
                i += 1;
            }
            b'(' | b'[' | b'{' => {
                if frames.len() >= MAX_DEPTH {
                    return None;
                }
                frames.push((b, pending.take()));
                last_ident = None;
                i += 1;
                if is_rank_list(&frames) {
                    let list = list_elements(text, i)?;
                    i = list.close + 1;
                    lists.push(list);
                    frames.pop();
                }
            }
            b')' | b']' | b'}' => {
                if frames.len() == depth {
                    return None;
                }
                let (open, _) = frames.pop()?;
                if closer(open) != b {
                    return None;
                }
                pending = None;
                last_ident = None;
                i += 1;
            }
            _ if is_ident_byte(b) => {
                let start = i;
                while i < bytes.len() && is_ident_byte(bytes[i]) {
                    i += 1;
                }
                last_ident = Some(&bytes[start..i]);
            }
            _ if b.is_ascii() => {
                last_ident = None;
                i += 1;
            }
            _ => return None,
        }
    }
    if frames.len() != depth {
        return None;
    }
    Some(lists)
}

/// Whether the innermost bracket is an explicit entry's rank list:
/// `( entries: [ ( schedule: ( ranks: [`.
fn is_rank_list(frames: &[(u8, Option<&[u8]>)]) -> bool {
    matches!(
        frames,
        [
            (b'(', None),
            (b'[', Some(b"entries")),
            (b'(', None),
            (b'(', Some(b"schedule")),
            (b'[', Some(b"ranks")),
        ]
    )
}

fn closer(open: u8) -> u8 {
    match open {
        b'(' => b')',
        b'[' => b']',
        _ => b'}',
    }
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The elements of the rank list whose `[` ends just before `start`.
fn list_elements(text: &str, start: usize) -> Option<RankList> {
    let bytes = text.as_bytes();
    let mut elems = Vec::new();
    let mut i = skip_ws(bytes, start)?;
    if bytes.get(i) == Some(&b']') {
        return Some(RankList {
            open: start,
            close: i,
            elems,
        });
    }
    loop {
        let next = i;
        match *bytes.get(i)? {
            b'(' => {}
            b if b.is_ascii_alphabetic() || b == b'_' => {
                // A struct name (`RankProgram(…)`).
                while i < bytes.len() && is_ident_byte(bytes[i]) {
                    i += 1;
                }
                i = skip_ws(bytes, i)?;
                if bytes.get(i) != Some(&b'(') {
                    return None;
                }
            }
            _ => return None,
        }
        let end = skip_balanced(bytes, i)?;
        elems.push((next, end));
        i = skip_ws(bytes, end)?;
        match *bytes.get(i)? {
            b',' => {
                i = skip_ws(bytes, i + 1)?;
                if bytes.get(i) == Some(&b']') {
                    break;
                }
            }
            b']' => break,
            _ => return None,
        }
    }
    Some(RankList {
        open: start,
        close: i,
        elems,
    })
}

/// The index after the bracket matching the one at `start`, skipping strings, chars and
/// comments.
fn skip_balanced(bytes: &[u8], start: usize) -> Option<usize> {
    let mut stack: Vec<u8> = Vec::with_capacity(16);
    let mut i = start;
    while i < bytes.len() {
        let b = bytes[i];
        if !SPECIAL[b as usize] {
            i += 1;
            continue;
        }
        match b {
            b'(' | b'[' | b'{' => {
                if stack.len() >= MAX_DEPTH {
                    return None;
                }
                stack.push(closer(b));
                i += 1;
            }
            b')' | b']' | b'}' => {
                if stack.pop()? != b {
                    return None;
                }
                i += 1;
                if stack.is_empty() {
                    return Some(i);
                }
            }
            b'"' => i = skip_string(bytes, i)?,
            b'\'' => i = skip_char(bytes, i)?,
            _ => i = skip_comment(bytes, i)?,
        }
    }
    None
}

/// Bytes [`skip_balanced`] must look at.
static SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'(' as usize] = true;
    t[b')' as usize] = true;
    t[b'[' as usize] = true;
    t[b']' as usize] = true;
    t[b'{' as usize] = true;
    t[b'}' as usize] = true;
    t[b'"' as usize] = true;
    t[b'\'' as usize] = true;
    t[b'/' as usize] = true;
    t
};

/// The index after whitespace and comments from `i`.
fn skip_ws(bytes: &[u8], mut i: usize) -> Option<usize> {
    loop {
        match bytes.get(i) {
            Some(b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C) => i += 1,
            Some(b'/') => i = skip_comment(bytes, i)?,
            _ => return Some(i),
        }
    }
}

/// The index after the comment starting at `i` (a `/`); `None` if it is no comment or is an
/// unterminated block comment.
fn skip_comment(bytes: &[u8], i: usize) -> Option<usize> {
    match bytes.get(i + 1)? {
        b'/' => Some(
            bytes[i + 2..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(bytes.len(), |p| i + 2 + p + 1),
        ),
        b'*' => {
            let mut level = 1u32;
            let mut j = i + 2;
            while level > 0 {
                match (bytes.get(j)?, bytes.get(j + 1)) {
                    (b'/', Some(b'*')) => {
                        level += 1;
                        j += 2;
                    }
                    (b'*', Some(b'/')) => {
                        level -= 1;
                        j += 2;
                    }
                    _ => j += 1,
                }
            }
            Some(j)
        }
        _ => None,
    }
}

/// The index after the string whose closing-side `"` is at `i`: a raw string when the quote
/// follows `r` (or `br`) and `#`s that start a token, an escaped string otherwise.
fn skip_string(bytes: &[u8], i: usize) -> Option<usize> {
    let mut hashes = 0usize;
    while i > hashes && bytes[i - hashes - 1] == b'#' {
        hashes += 1;
    }
    let r = i.checked_sub(hashes + 1);
    let raw = r.is_some_and(|r| {
        bytes[r] == b'r' && {
            let before = r.checked_sub(1).map(|p| bytes[p]);
            let before = if before == Some(b'b') {
                r.checked_sub(2).map(|p| bytes[p])
            } else {
                before
            };
            before.is_none_or(|c| !is_ident_byte(c) && c.is_ascii())
        }
    });
    if hashes > 0 && !raw {
        return None;
    }
    let mut j = i + 1;
    if raw {
        loop {
            let p = bytes.get(j..)?.iter().position(|&c| c == b'"')?;
            let close = j + p + 1;
            if bytes.len() >= close + hashes
                && bytes[close..close + hashes].iter().all(|&c| c == b'#')
            {
                return Some(close + hashes);
            }
            j = close;
        }
    }
    loop {
        match *bytes.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The index after the char literal starting at `i` (a `'`).
fn skip_char(bytes: &[u8], i: usize) -> Option<usize> {
    let j = if bytes.get(i + 1)? == &b'\\' {
        i + 3
    } else {
        i + 2
    };
    let p = bytes.get(j..)?.iter().position(|&c| c == b'\'')?;
    Some(j + p + 1)
}

#[cfg(test)]
mod tests {
    use super::{entry_rank_lists, may_have_explicit, rank_lists, shrink};

    /// An entry's text alone gives the lists the whole plan's scan finds of it, moved by
    /// where the entry starts; text that is not one whole entry gives none.
    #[test]
    fn an_entry_alone_gives_its_lists_of_the_whole() {
        let entries = [
            "(algorithm: \"ranks: [\", schedule: (ranks: [(a: [1]), RankProgram(b: \")\")]))",
            "(schedule: (ranks: []), symmetry: (ranks: [0, 1]))",
            "(symmetric: (ranks: [()]))",
            "(schedule: (ranks: [ (c: 2) , ]))",
        ];
        let head = "(format_version: 4, meta: (x: \"ranks: [\"), entries: [";
        let whole = format!("{head}{}])", entries.join(", "));
        let all = rank_lists(&whole).expect("whole scans");
        let mut base = head.len();
        let mut from_entries = Vec::new();
        for e in entries {
            for l in entry_rank_lists(e).expect("entry scans") {
                from_entries.push(l.moved(base));
            }
            base += e.len() + 2;
        }
        assert_eq!(from_entries, all);
        assert_eq!(all.len(), 3);
        for bad in [
            "(schedule: (ranks: [()]))]",
            "(schedule: (ranks: [()])",
            ")(",
        ] {
            assert_eq!(entry_rank_lists(bad), None, "{bad}");
        }
    }

    #[test]
    fn shrinks_only_explicit_rank_lists() {
        let text = r##"(format_version: 2, meta: (topology: "a)]", compiler: "x"),
            entries: [
              (algorithm: "ranks: [", schedule: (nranks: 3, ranks: [
                 (streams: [(channel: 0, steps: [])]), // ranks: [ ) ]
                 (scratch_chunks: 1, streams: [/* ( */]),
                 RankProgram(streams: ['"', ')', r#"]"#]),
              ])),
              (symmetric: (symmetry: (ranks: [0, 1, 2]), template: (streams: []))),
            ])"##;
        let got = shrink(text, &[1]).expect("shrinks");
        assert!(got.contains("ranks: [\n                 (),"), "{got}");
        assert!(
            got.contains("(scratch_chunks: 1, streams: [/* ( */]),"),
            "{got}"
        );
        assert!(got.contains("(),\n              ]"), "{got}");
        assert!(got.contains("symmetry: (ranks: [0, 1, 2])"), "{got}");
        assert!(got.contains(r#"topology: "a)]""#), "{got}");
    }

    #[test]
    fn plans_without_explicit_entries_are_not_scanned() {
        let seals_only = "(entries: [(symmetric: (ranks: [0])), ], verified: [(schedule: \"ab\"), (schedule : \"cd\")])";
        assert!(!may_have_explicit(seals_only));
        assert_eq!(shrink(seals_only, &[0]), None);
        for text in [
            "(entries: [(schedule: (ranks: [()]))])",
            "(entries: [(schedule /* c */ : (ranks: [()]))])",
            "(entries: [(schedule:(ranks: [()]))])",
            "(entries: [(schedules: 1)])",
        ] {
            assert!(may_have_explicit(text), "{text}");
        }
    }

    #[test]
    fn gives_up_on_unexpected_text() {
        for bad in [
            "(entries: [(schedule: (ranks: [(), ",
            "(entries: [(schedule: (ranks: [(\"), ]))])",
            "(entries: [(schedule: (ranks: [(/* ), ]))])",
            "(entries: [(schedule: (ranks: [5, ()]))])",
            "(entries: [(schedule: (ranks: [(]]))])",
            "(entries: [(schedule: (ranks: [()]))]))",
            "(entries: [(symmetric: (ranks: [()]))])",
            "(a: 'x",
        ] {
            assert_eq!(shrink(bad, &[0]), None, "{bad}");
        }
    }
}
