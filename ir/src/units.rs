//! Message sizes as people write them: `4096`, `64K`, `1M`, `2G` (powers of 1024), the
//! convention of every command line in the workspace.

/// Parses `1024`, `4K`, `16M`, `1G` (suffixes are powers of 1024, case-insensitive).
/// `None` for anything else, including overflow.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// The shortest exact form: `4K`, `1M`, `3G`, or plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_trip() {
        for (text, bytes) in [("8", 8), ("4K", 4096), ("1m", 1 << 20), ("2G", 2 << 30)] {
            assert_eq!(parse_bytes(text), Some(bytes));
        }
        for bytes in [8u64, 4096, 3 << 20, 1000, 5 << 30] {
            assert_eq!(parse_bytes(&format_bytes(bytes)), Some(bytes));
        }
        for bad in ["", "K", "1.5M", "-1", "99999999999999999999G", "1T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }
}
