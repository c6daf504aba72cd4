//! Symbolic chunk values of the semantic layer: which original chunk a buffer slot holds and
//! which ranks' contributions have been reduced into it.

use crate::schedule::Rank;
use std::fmt;
use std::rc::Rc;

/// A set of ranks: a single rank without allocation, or a shared bitset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RankSet {
    One(Rank),
    Many(Rc<Bits>),
}

/// A bitset of ranks with its population count cached.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Bits {
    words: Box<[u64]>,
    count: u32,
}

impl Bits {
    fn with(nranks: u32, ranks: impl IntoIterator<Item = Rank>) -> Bits {
        let mut words = vec![0u64; (nranks as usize).div_ceil(64).max(1)].into_boxed_slice();
        let mut count = 0;
        for r in ranks {
            let (w, b) = ((r / 64) as usize, r % 64);
            if let Some(word) = words.get_mut(w)
                && *word & (1 << b) == 0
            {
                *word |= 1 << b;
                count += 1;
            }
        }
        Bits { words, count }
    }

    fn contains(&self, r: Rank) -> bool {
        self.words
            .get((r / 64) as usize)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }
}

impl RankSet {
    /// Number of ranks in the set.
    pub(crate) fn len(&self) -> u32 {
        match self {
            RankSet::One(_) => 1,
            RankSet::Many(bits) => bits.count,
        }
    }

    pub(crate) fn contains(&self, r: Rank) -> bool {
        match self {
            RankSet::One(x) => *x == r,
            RankSet::Many(bits) => bits.contains(r),
        }
    }

    /// The ranks in increasing order.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = Rank> + '_> {
        match self {
            RankSet::One(x) => Box::new(std::iter::once(*x)),
            RankSet::Many(bits) => Box::new(bits.words.iter().enumerate().flat_map(|(i, &w)| {
                (0..64u32)
                    .filter(move |b| w & (1u64 << b) != 0)
                    .map(move |b| i as u32 * 64 + b)
            })),
        }
    }

    /// The union of two disjoint sets, or the ranks they share.
    pub(crate) fn disjoint_union(&self, other: &RankSet, nranks: u32) -> Result<RankSet, RankSet> {
        match (self, other) {
            (RankSet::One(a), RankSet::One(b)) => {
                if a == b {
                    Err(RankSet::One(*a))
                } else {
                    Ok(RankSet::Many(Rc::new(Bits::with(nranks, [*a, *b]))))
                }
            }
            (RankSet::One(a), RankSet::Many(bits)) | (RankSet::Many(bits), RankSet::One(a)) => {
                if bits.contains(*a) {
                    Err(RankSet::One(*a))
                } else {
                    let mut words = bits.words.clone();
                    if let Some(w) = words.get_mut((*a / 64) as usize) {
                        *w |= 1 << (*a % 64);
                    }
                    Ok(RankSet::Many(Rc::new(Bits {
                        words,
                        count: bits.count + 1,
                    })))
                }
            }
            (RankSet::Many(x), RankSet::Many(y)) => {
                let shared = x.words.iter().zip(y.words.iter()).any(|(a, b)| a & b != 0);
                if shared {
                    let words: Box<[u64]> = x
                        .words
                        .iter()
                        .zip(y.words.iter())
                        .map(|(a, b)| a & b)
                        .collect();
                    let count = words.iter().map(|w| w.count_ones()).sum();
                    Err(RankSet::Many(Rc::new(Bits { words, count })))
                } else {
                    let words: Box<[u64]> = x
                        .words
                        .iter()
                        .zip(y.words.iter())
                        .map(|(a, b)| a | b)
                        .collect();
                    Ok(RankSet::Many(Rc::new(Bits {
                        words,
                        count: x.count + y.count,
                    })))
                }
            }
        }
    }
}

impl fmt::Display for RankSet {
    /// Compact form: `{0-3,5,7-9}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        let mut first = true;
        let mut run: Option<(Rank, Rank)> = None;
        let mut flush = |f: &mut fmt::Formatter<'_>, (a, b): (Rank, Rank)| -> fmt::Result {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if a == b {
                write!(f, "{a}")
            } else {
                write!(f, "{a}-{b}")
            }
        };
        for r in self.iter() {
            run = match run {
                Some((a, b)) if b + 1 == r => Some((a, r)),
                Some(done) => {
                    flush(f, done)?;
                    Some((r, r))
                }
                None => Some((r, r)),
            };
        }
        if let Some(done) = run {
            flush(f, done)?;
        }
        f.write_str("}")
    }
}

/// What a buffer slot (one chunk) holds during symbolic execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// Never written (output and scratch buffers start so).
    Uninit,
    /// Derived from a value an error was already reported for; checks stay quiet on it.
    Poison,
    /// Original chunk `origin` summed over the contributions of `ranks`.
    Data { origin: u32, ranks: RankSet },
}

impl Value {
    /// Describes the value for messages, e.g. `chunk 3 of ranks {0-7}`.
    pub(crate) fn describe(&self, nranks: u32) -> String {
        match self {
            Value::Uninit => "uninitialised data".to_string(),
            Value::Poison => "data derived from an earlier error".to_string(),
            Value::Data { origin, ranks } => {
                if ranks.len() == nranks && nranks > 1 {
                    format!("chunk {origin} reduced over all {nranks} ranks")
                } else if let RankSet::One(r) = ranks {
                    format!("chunk {origin} of rank {r}")
                } else {
                    format!("chunk {origin} reduced over ranks {ranks}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_detects_overlap_and_formats_ranges() {
        let a = RankSet::One(1);
        let b = RankSet::One(2);
        let ab = a.disjoint_union(&b, 130).unwrap();
        assert_eq!(ab.len(), 2);
        let c = RankSet::Many(Rc::new(Bits::with(130, [3, 4, 5, 129])));
        let abc = ab.disjoint_union(&c, 130).unwrap();
        assert_eq!(abc.to_string(), "{1-5,129}");
        assert_eq!(abc.len(), 6);
        let shared = abc.disjoint_union(&ab, 130).unwrap_err();
        assert_eq!(shared.to_string(), "{1-2}");
        assert_eq!(a.disjoint_union(&abc, 130).unwrap_err(), RankSet::One(1));
        assert!(abc.contains(129) && !abc.contains(6));
    }

    #[test]
    fn describe_names_origin_and_ranks() {
        let v = Value::Data {
            origin: 3,
            ranks: RankSet::One(2),
        };
        assert_eq!(v.describe(4), "chunk 3 of rank 2");
        let all = RankSet::Many(Rc::new(Bits::with(4, 0..4)));
        let v = Value::Data {
            origin: 1,
            ranks: all,
        };
        assert_eq!(v.describe(4), "chunk 1 reduced over all 4 ranks");
    }
}
