//! Symbolic chunk values of the semantic layer: which original chunk a buffer slot holds and
//! which ranks' contributions have been reduced into it.
//!
//! A [`Value`] is 8 bytes: the origin chunk and a [`SetId`] naming its contributor set. Sets
//! are hash-consed in a per-verification [`Sets`] table: a single rank `r` is the reserved id
//! `2 + r` and needs no storage; every larger set is stored once, as a bitset of `nranks`
//! bits in one flat arena, however many slots hold it. Unions are memoised on the id pair,
//! so reducing a run of chunks whose sets are equal (the common case: "all ranks of this
//! host", "this subcube") costs one bitset union. Sets no slot or message refers to any more
//! are reclaimed by [`Sets::collect`], which the simulation runs between steps once the
//! arena has grown past [`Sets::wants_collect`]'s threshold.

use crate::schedule::Rank;
use std::fmt;

/// Names a contributor set in a [`Sets`] table, or one of the markers [`UNINIT`], [`POISON`].
pub(crate) type SetId = u32;

/// Set id of a slot never written.
pub(crate) const UNINIT: SetId = 0;
/// Set id of a value derived from an error already reported.
pub(crate) const POISON: SetId = 1;
/// Ids at or above this name stored sets (`MANY + index`); below it, `2 + r` is `{r}`.
/// Schedules that pass the limits have fewer than `MANY - 2` ranks (every rank holds at
/// least one buffer slot) and fewer than `MANY` stored sets (live sets are bounded by
/// [`super::MAX_SET_WORDS`]).
const MANY: SetId = 1 << 31;

/// What a buffer slot (one chunk) holds during symbolic execution: original chunk `origin`
/// summed over the contributions of the set `set`, or a marker ([`UNINIT`]: never written,
/// output and scratch buffers start so; [`POISON`]: derived from a value an error was
/// already reported for, checks stay quiet on it; `origin` is 0 then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Value {
    pub origin: u32,
    pub set: SetId,
}

impl Value {
    /// A slot never written.
    pub(crate) const UNINIT: Value = Value {
        origin: 0,
        set: UNINIT,
    };
    /// A value derived from an earlier error.
    pub(crate) const POISON: Value = Value {
        origin: 0,
        set: POISON,
    };

    /// Chunk `origin` of rank `r` alone.
    pub(crate) fn one(origin: u32, r: Rank) -> Value {
        Value {
            origin,
            set: r.saturating_add(2).min(MANY - 1),
        }
    }

    /// Whether the value is real data (neither marker).
    pub(crate) fn is_data(self) -> bool {
        self.set > POISON
    }
}

/// Entries of the direct-mapped union memo.
const MEMO_SIZE: usize = 1 << 12;
const EMPTY: u32 = u32::MAX;

/// One memoised union: `a ∪ b = c` (ids as they were when recorded; cleared on collection).
#[derive(Debug, Clone, Copy)]
struct Memo {
    a: SetId,
    b: SetId,
    c: SetId,
}

/// The hash-consing table of contributor sets of one verification.
#[derive(Debug)]
pub(crate) struct Sets {
    nranks: u32,
    /// 64-bit words per stored set.
    width: usize,
    /// Stored set `i` is `words[i * width ..][.. width]`.
    words: Vec<u64>,
    /// Population count of each stored set.
    counts: Vec<u32>,
    /// Open-addressing hash table of (stored set index, low half of its hash) (`EMPTY`
    /// index: free bucket); its length is a power of two at least twice the number of
    /// stored sets.
    table: Vec<(u32, u32)>,
    memo: Vec<Memo>,
    /// Scratch bitset for unions.
    scratch: Vec<u64>,
    /// Arena size (words) past which [`Sets::wants_collect`] asks for a collection.
    collect_at: usize,
    /// Lower bound of `collect_at`.
    floor: usize,
}

/// Hash of a bitset: four independent multiply lanes (no serial dependency between words),
/// folded at the end.
fn hash(words: &[u64]) -> u64 {
    const K: [u64; 4] = [
        0x517C_C1B7_2722_0A95,
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
    ];
    let mut lanes = [0x243F_6A88_85A3_08D3u64; 4];
    for (i, &w) in words.iter().enumerate() {
        let l = &mut lanes[i % 4];
        *l = (*l ^ w).wrapping_mul(K[i % 4]).rotate_left(29);
    }
    let h = lanes
        .iter()
        .fold(0u64, |h, &l| (h ^ l).wrapping_mul(K[0]).rotate_left(31));
    h ^ (h >> 32)
}

impl Sets {
    /// An empty table for `nranks` ranks; `floor` (words) is the arena size below which no
    /// collection is asked for (callers pass a size proportional to their slot count, so
    /// collections cost amortised time linear in the work done). With a floor of 0 a
    /// collection runs whenever the arena doubled since the last one (tests).
    pub(crate) fn new(nranks: u32, floor: usize) -> Sets {
        let width = (nranks as usize).div_ceil(64).max(1);
        Sets {
            nranks,
            width,
            words: Vec::new(),
            counts: Vec::new(),
            table: vec![(EMPTY, 0); 16],
            memo: vec![
                Memo {
                    a: EMPTY,
                    b: EMPTY,
                    c: EMPTY
                };
                MEMO_SIZE
            ],
            scratch: vec![0; width],
            collect_at: floor,
            floor,
        }
    }

    /// Stored sets.
    fn stored(&self) -> usize {
        self.counts.len()
    }

    /// Number of ranks in a set (0 for the markers).
    pub(crate) fn len(&self, id: SetId) -> u32 {
        match id {
            UNINIT | POISON => 0,
            id if id < MANY => 1,
            id => self.counts[(id - MANY) as usize],
        }
    }

    /// The only rank of a one-rank set.
    pub(crate) fn single(&self, id: SetId) -> Option<Rank> {
        (id > POISON && id < MANY).then(|| id - 2)
    }

    fn bits(&self, id: SetId) -> &[u64] {
        let i = (id - MANY) as usize * self.width;
        &self.words[i..i + self.width]
    }

    /// Whether rank `r` is in the set.
    #[cfg(test)]
    pub(crate) fn contains(&self, id: SetId, r: Rank) -> bool {
        match self.single(id) {
            Some(x) => x == r,
            None if id >= MANY => self
                .bits(id)
                .get((r / 64) as usize)
                .is_some_and(|w| w & (1 << (r % 64)) != 0),
            None => false,
        }
    }

    /// Loads set `id` into `out` (cleared first).
    fn load(&self, id: SetId, out: &mut [u64]) {
        match self.single(id) {
            Some(r) => {
                out.fill(0);
                if let Some(w) = out.get_mut((r / 64) as usize) {
                    *w |= 1 << (r % 64);
                }
            }
            None if id >= MANY => out.copy_from_slice(self.bits(id)),
            None => out.fill(0),
        }
    }

    /// The ranks of a set in increasing order.
    pub(crate) fn ranks(&self, id: SetId) -> Vec<Rank> {
        let mut bits = vec![0; self.width];
        self.load(id, &mut bits);
        bits_to_ranks(&bits)
    }

    /// The union of two disjoint sets, or the ranks they share (in increasing order).
    pub(crate) fn disjoint_union(&mut self, a: SetId, b: SetId) -> Result<SetId, Vec<Rank>> {
        let (lo, hi) = (a.min(b), a.max(b));
        let slot = (u64::from(lo).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(hi).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
            >> 52;
        let slot = slot as usize % MEMO_SIZE;
        let m = self.memo[slot];
        if m.a == lo && m.b == hi {
            return Ok(m.c);
        }
        let mut acc = std::mem::take(&mut self.scratch);
        self.load(lo, &mut acc);
        let shared = match self.single(hi) {
            Some(r) => {
                let (w, bit) = ((r / 64) as usize, 1u64 << (r % 64));
                match acc.get_mut(w) {
                    Some(word) if *word & bit != 0 => Some(vec![r]),
                    Some(word) => {
                        *word |= bit;
                        None
                    }
                    None => None,
                }
            }
            None => {
                let other = self.bits(hi);
                if acc.iter().zip(other).any(|(x, y)| x & y != 0) {
                    let common: Vec<u64> = acc.iter().zip(other).map(|(x, y)| x & y).collect();
                    Some(bits_to_ranks(&common))
                } else {
                    for (x, y) in acc.iter_mut().zip(other) {
                        *x |= y;
                    }
                    None
                }
            }
        };
        let result = match shared {
            Some(ranks) => Err(ranks),
            None => {
                let count = self.len(lo) + self.len(hi);
                let c = self.intern(&acc, count);
                self.memo[slot] = Memo { a: lo, b: hi, c };
                Ok(c)
            }
        };
        self.scratch = acc;
        result
    }

    /// The set `{f(r) : r in id}` for a permutation `f` of the ranks; markers are unchanged.
    /// Costs one pass over the set's bits (callers memoise).
    pub(crate) fn map(&mut self, id: SetId, f: impl Fn(Rank) -> Rank) -> SetId {
        match id {
            UNINIT | POISON => id,
            id if id < MANY => f(id - 2).saturating_add(2).min(MANY - 1),
            id => {
                let count = self.counts[(id - MANY) as usize];
                let mut out = std::mem::take(&mut self.scratch);
                out.fill(0);
                for (w, &word) in self.bits(id).iter().enumerate() {
                    let mut rest = word;
                    while rest != 0 {
                        let r = (w * 64) as u32 + rest.trailing_zeros();
                        rest &= rest - 1;
                        let t = f(r);
                        if let Some(x) = out.get_mut((t / 64) as usize) {
                            *x |= 1 << (t % 64);
                        }
                    }
                }
                let c = self.intern(&out, count);
                self.scratch = out;
                c
            }
        }
    }

    /// The id of the set `bits` (with `count` members, at least two), storing it if new.
    fn intern(&mut self, bits: &[u64], count: u32) -> SetId {
        let mask = self.table.len() - 1;
        let h = hash(bits);
        let mut b = h as usize & mask;
        loop {
            match self.table[b] {
                (EMPTY, _) => break,
                (i, low) => {
                    if low == h as u32 && self.bits(MANY + i) == bits {
                        return MANY + i;
                    }
                }
            }
            b = (b + 1) & mask;
        }
        let i = self.stored() as u32;
        self.words.extend_from_slice(bits);
        self.counts.push(count);
        self.table[b] = (i, h as u32);
        if self.stored() * 2 > self.table.len() {
            self.rehash(self.table.len() * 2);
        }
        MANY + i
    }

    /// Rebuilds the hash table with `buckets` buckets (a power of two).
    fn rehash(&mut self, buckets: usize) {
        let mut table = vec![(EMPTY, 0); buckets];
        let mask = buckets - 1;
        for i in 0..self.stored() {
            let h = hash(self.bits(MANY + i as u32));
            let mut b = h as usize & mask;
            while table[b].0 != EMPTY {
                b = (b + 1) & mask;
            }
            table[b] = (i as u32, h as u32);
        }
        self.table = table;
    }

    /// Words held by stored sets (the arena; the hash table adds 4 to 8 bytes a set).
    #[cfg(test)]
    pub(crate) fn words(&self) -> usize {
        self.words.len()
    }

    /// Whether the arena grew enough since the last [`Sets::collect`] to run one.
    pub(crate) fn wants_collect(&self) -> bool {
        self.words.len() > self.collect_at
    }

    /// Reclaims stored sets no value refers to. `visit` must call its argument on every live
    /// value (all buffer slots and queued messages); it is called twice, first to mark, then
    /// to rewrite ids. Returns the words still held.
    pub(crate) fn collect(&mut self, mut visit: impl FnMut(&mut dyn FnMut(&mut Value))) -> usize {
        let mut live = vec![false; self.stored()];
        visit(&mut |v: &mut Value| {
            if v.set >= MANY
                && let Some(l) = live.get_mut((v.set - MANY) as usize)
            {
                *l = true;
            }
        });
        let mut remap = vec![EMPTY; self.stored()];
        let mut kept = 0usize;
        for (i, &alive) in live.iter().enumerate() {
            if alive {
                if kept != i {
                    self.words
                        .copy_within(i * self.width..(i + 1) * self.width, kept * self.width);
                    self.counts[kept] = self.counts[i];
                }
                remap[i] = kept as u32;
                kept += 1;
            }
        }
        self.words.truncate(kept * self.width);
        self.counts.truncate(kept);
        self.collect_at = (self.words.len() * 2).max(self.floor);
        // Size the table for the sets stored until the next collection, so it does not grow
        // (and rehash) again and again in between.
        let until_next = self.collect_at / self.width + 1;
        self.rehash((until_next * 2).next_power_of_two().max(16));
        for m in &mut self.memo {
            m.a = EMPTY;
            m.b = EMPTY;
        }
        visit(&mut |v: &mut Value| {
            if v.set >= MANY
                && let Some(&to) = remap.get((v.set - MANY) as usize)
            {
                v.set = MANY + to;
            }
        });
        self.words.len()
    }

    /// Describes a value for messages, e.g. `chunk 3 of ranks {0-7}`.
    pub(crate) fn describe(&self, v: Value) -> String {
        let n = self.nranks;
        match v.set {
            UNINIT => "uninitialised data".to_string(),
            POISON => "data derived from an earlier error".to_string(),
            set => {
                let origin = v.origin;
                if self.len(set) == n && n > 1 {
                    format!("chunk {origin} reduced over all {n} ranks")
                } else if let Some(r) = self.single(set) {
                    format!("chunk {origin} of rank {r}")
                } else {
                    format!(
                        "chunk {origin} reduced over ranks {}",
                        Ranks(&self.ranks(set))
                    )
                }
            }
        }
    }
}

fn bits_to_ranks(bits: &[u64]) -> Vec<Rank> {
    bits.iter()
        .enumerate()
        .flat_map(|(i, &w)| {
            (0..64u32)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i as u32 * 64 + b)
        })
        .collect()
}

/// Ranks in increasing order, displayed compactly: `{0-3,5,7-9}`.
pub(crate) struct Ranks<'a>(pub &'a [Rank]);

impl fmt::Display for Ranks<'_> {
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
        for &r in self.0 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The reference: plain sets, the union as the old bitset verifier computed it.
    fn reference_union(
        a: &BTreeSet<Rank>,
        b: &BTreeSet<Rank>,
    ) -> Result<BTreeSet<Rank>, Vec<Rank>> {
        let shared: Vec<Rank> = a.intersection(b).copied().collect();
        if shared.is_empty() {
            Ok(a.union(b).copied().collect())
        } else {
            Err(shared)
        }
    }

    #[test]
    fn equal_sets_get_equal_ids_and_unions_are_memoised() {
        let mut sets = Sets::new(130, 0);
        let (a, b, c) = (
            Value::one(0, 1).set,
            Value::one(0, 2).set,
            Value::one(0, 129).set,
        );
        let ab = sets.disjoint_union(a, b).unwrap();
        let ba = sets.disjoint_union(b, a).unwrap();
        assert_eq!(ab, ba);
        let abc = sets.disjoint_union(ab, c).unwrap();
        let bc = sets.disjoint_union(b, c).unwrap();
        assert_eq!(
            sets.disjoint_union(a, bc).unwrap(),
            abc,
            "same set, other order"
        );
        assert_eq!(sets.ranks(abc), vec![1, 2, 129]);
        assert_eq!(sets.len(abc), 3);
        assert!(sets.contains(abc, 129) && !sets.contains(abc, 3));
        assert_eq!(sets.words(), 3 * 3, "three stored sets of three words");
        // A run of equal unions stores nothing new.
        for _ in 0..100 {
            assert_eq!(sets.disjoint_union(ab, c).unwrap(), abc);
        }
        assert_eq!(sets.words(), 9);
    }

    #[test]
    fn overlaps_name_the_shared_ranks_as_before() {
        let mut sets = Sets::new(130, 0);
        let one = |r| Value::one(0, r).set;
        let ab = sets.disjoint_union(one(1), one(2)).unwrap();
        let cd = sets.disjoint_union(one(3), one(129)).unwrap();
        let abcd = sets.disjoint_union(ab, cd).unwrap();
        assert_eq!(sets.disjoint_union(one(5), one(5)), Err(vec![5]));
        assert_eq!(sets.disjoint_union(one(129), abcd), Err(vec![129]));
        assert_eq!(sets.disjoint_union(abcd, one(1)), Err(vec![1]));
        assert_eq!(sets.disjoint_union(abcd, ab), Err(vec![1, 2]));
        assert_eq!(Ranks(&sets.ranks(abcd)).to_string(), "{1-3,129}");
        assert_eq!(Ranks(&[]).to_string(), "{}");
    }

    #[test]
    fn describe_names_origin_and_ranks() {
        let mut sets = Sets::new(4, 0);
        assert_eq!(sets.describe(Value::one(3, 2)), "chunk 3 of rank 2");
        assert_eq!(sets.describe(Value::UNINIT), "uninitialised data");
        assert_eq!(
            sets.describe(Value::POISON),
            "data derived from an earlier error"
        );
        let mut all = Value::one(1, 0).set;
        for r in 1..4 {
            all = sets.disjoint_union(all, Value::one(1, r).set).unwrap();
        }
        let v = Value {
            origin: 1,
            set: all,
        };
        assert_eq!(sets.describe(v), "chunk 1 reduced over all 4 ranks");
        let some = sets
            .disjoint_union(Value::one(0, 0).set, Value::one(0, 2).set)
            .unwrap();
        let v = Value {
            origin: 7,
            set: some,
        };
        assert_eq!(sets.describe(v), "chunk 7 reduced over ranks {0,2}");
    }

    #[test]
    fn collection_keeps_live_sets_and_renumbers_them() {
        let mut sets = Sets::new(70, 0);
        let one = |r| Value::one(0, r).set;
        let dead = sets.disjoint_union(one(0), one(1)).unwrap();
        let live = sets.disjoint_union(one(2), one(69)).unwrap();
        let live2 = sets.disjoint_union(live, one(5)).unwrap();
        let mut vals = [
            Value {
                origin: 4,
                set: live2,
            },
            Value::UNINIT,
            Value::one(1, 3),
            Value {
                origin: 2,
                set: live,
            },
        ];
        let _ = dead;
        let words = sets.collect(|f| vals.iter_mut().for_each(f));
        assert_eq!(words, 2 * 2, "two live sets of two words");
        assert_eq!(sets.ranks(vals[0].set), vec![2, 5, 69]);
        assert_eq!(sets.ranks(vals[3].set), vec![2, 69]);
        assert_eq!(vals[1], Value::UNINIT);
        assert_eq!(vals[2], Value::one(1, 3));
        // Interning after a collection finds the renumbered sets and stores new ones.
        assert_eq!(sets.disjoint_union(one(2), one(69)).unwrap(), vals[3].set);
        let again = sets.disjoint_union(one(0), one(1)).unwrap();
        assert_eq!(sets.ranks(again), vec![0, 1]);
        assert_eq!(sets.words(), 3 * 2);
    }

    proptest! {
        /// Random unions agree with plain sets: same members, equal ids exactly for equal
        /// sets, the same shared ranks on overlap, also across collections.
        #[test]
        fn interner_matches_plain_sets(
            nranks in 1u32..200,
            ops in proptest::collection::vec((any::<u16>(), any::<u16>(), any::<bool>()), 1..300),
        ) {
            let mut sets = Sets::new(nranks, 0);
            let mut pool: Vec<(Value, BTreeSet<Rank>)> = (0..nranks.min(12))
                .map(|r| {
                    let r = r * 7 % nranks;
                    (Value::one(0, r), BTreeSet::from([r]))
                })
                .collect();
            for (x, y, collect) in ops {
                let (va, ra) = pool[x as usize % pool.len()].clone();
                let (vb, rb) = pool[y as usize % pool.len()].clone();
                match (sets.disjoint_union(va.set, vb.set), reference_union(&ra, &rb)) {
                    (Ok(id), Ok(r)) => {
                        prop_assert_eq!(sets.ranks(id), r.iter().copied().collect::<Vec<_>>());
                        prop_assert_eq!(sets.len(id), r.len() as u32);
                        pool.push((Value { origin: 0, set: id }, r));
                    }
                    (Err(shared), Err(r)) => prop_assert_eq!(shared, r),
                    (got, want) => prop_assert!(false, "{got:?} vs {want:?}"),
                }
                if collect {
                    // Keep every other pool entry alive.
                    let mut kept: Vec<(Value, BTreeSet<Rank>)> =
                        pool.iter().step_by(2).cloned().collect();
                    sets.collect(|f| kept.iter_mut().for_each(|(v, _)| f(v)));
                    pool = kept;
                }
                for (v, r) in &pool {
                    prop_assert_eq!(sets.ranks(v.set), r.iter().copied().collect::<Vec<_>>());
                }
                for (v, r) in &pool {
                    for (w, s) in &pool {
                        prop_assert_eq!(v.set == w.set, r == s);
                    }
                }
            }
        }
    }
}
