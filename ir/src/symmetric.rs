//! Rank-symmetric schedules: one template program and the translations that give every rank
//! its own.
//!
//! Ring, hierarchical and halving-doubling schedules treat every rank alike: rank `r`'s
//! program is rank `r0`'s program with every peer and every block of data renamed. Storing
//! all `nranks` programs costs `nranks²` steps; a [`SymmetricSchedule`] stores one program
//! (the *template*) and a [`Symmetry`] that says how to rename it for each rank. Plan files
//! write such schedules in this form (see [`crate::plan`]).
//!
//! # The grid
//!
//! A [`Symmetry`] lays the ranks out on a grid of extents [`Symmetry::dims`] (their product is
//! `nranks`): [`Symmetry::ranks`]`[p]` is the rank at grid position `p`, positions written
//! row-major (the last dimension varies fastest), so position `p` has coordinates
//! `x(p) = (x_0, …, x_{k-1})` with `p = Σ x_i · Π_{j>i} dims[j]`. `ranks` is a permutation of
//! `0..nranks`; `pos(r)` denotes the position of rank `r`.
//!
//! A *translation* by coordinates `t` moves coordinates `y` to `y ⊕ t`, per dimension by its
//! [`Action`]: [`Action::Cyclic`] is `(y_i + t_i) mod dims[i]` (a ring or torus dimension),
//! [`Action::Xor`] is `y_i ^ t_i` (a hypercube dimension; its extent must be a power of two).
//!
//! # Which program each rank runs
//!
//! The template is the program of the rank at position 0 (`ranks[0]`). The rank at position
//! `p` runs the template translated by `t = x(p)`:
//!
//! - every peer `q` (a `to` or `from` of an op) becomes `ranks[pos⁻¹(x(pos(q)) ⊕ t)]`, the rank
//!   at the translated position;
//! - every location in a *mapped buffer* moves (below); locations in other buffers (always
//!   the scratch buffer) keep their offsets;
//! - everything else is copied unchanged: op kinds, counts, channels, stream order,
//!   dependencies and the scratch size.
//!
//! # Which chunks move
//!
//! Chunks move only when [`Symmetry::chunks`] is `Some(map)` (which requires `nranks` to
//! divide the schedule's chunk count `C`; let `m = C / nranks`). The mapped buffers are those
//! that hold the whole collective buffer indexed by chunk number: the input when
//! `input_chunks == C`, the output when `output_chunks == C`. A smaller buffer (the AllGather
//! input, the ReduceScatter output: one rank's share) and the scratch buffer are rank-local
//! and never move.
//!
//! A chunk number `c` in `0..C` is split into a block label `b` in `0..nranks` and an offset
//! `o` in `0..m` by [`ChunkMap::layout`]: [`BlockLayout::BlockMajor`] is `c = b·m + o`
//! (rank-sized blocks), [`BlockLayout::PieceMajor`] is `c = o·nranks + b` (the blocks are
//! interleaved). The label is read as grid coordinates by [`ChunkMap::label`]:
//! [`BlockLabel::Rank`] reads `b` as a rank (coordinates `x(pos(b))`);
//! [`BlockLabel::Grid`]`{ order }` reads `b` as coordinates written row-major over the
//! dimensions taken in `order` (`order[0]` slowest), so `b = Σ_j y_{order[j]} · Π_{j'>j}
//! dims[order[j']]`. The coordinates are translated by `t` and written back as a label `b'`
//! the same way; the chunk becomes `c' = (b', o)` in the same layout.
//!
//! A step addresses a run of `count` chunks starting at `off`; in a mapped buffer the run
//! becomes `(min of the images of off..off+count, count)`. Translations of the schedules this
//! encoding is meant for keep runs contiguous; a schedule whose runs do not survive the
//! translation simply does not compress ([`Schedule::compress`] checks every rank).
//!
//! # Checking and compressing
//!
//! [`Symmetry::validate`] checks a symmetry against `nranks` and `C` (it never panics and does
//! no arithmetic that can overflow). [`SymmetricSchedule::table`] validates a whole symmetric
//! schedule (symmetry and template: peers in range, runs in mapped buffers inside the buffer)
//! and precomputes the tables that make instantiating one rank's program linear in its size;
//! [`SymmetricSchedule::program`] and [`SymmetricSchedule::expand`] instantiate one rank or
//! all. [`Schedule::compress`] goes the other way: it returns the symmetric form only when
//! every rank's program equals the translated template exactly, so that `expand` gives back
//! the original schedule.

use crate::schedule::{
    Buf, Collective, Loc, Op, Rank, RankProgram, Schedule, ScheduleHeader, Step, Stream,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most grid dimensions a symmetry may have (extents of 2 or more multiply past `u32` long
/// before; the cap bounds the tables built from a hostile file).
pub const MAX_DIMS: usize = 64;

/// Most steps [`SymmetricSchedule::expand`] builds (`nranks` × template steps): a bound on
/// what a small hostile file can make the loader allocate. One rank's program
/// ([`SymmetricSchedule::program`]) is not limited.
pub const MAX_EXPANDED_STEPS: u64 = 1 << 28;

/// How a translation acts on one grid dimension of extent `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// `y -> (y + x) mod d`.
    Cyclic,
    /// `y -> y ^ x`; `d` must be a power of two.
    Xor,
}

/// How chunk numbers split into a block label `b` in `0..nranks` and an offset `o` in `0..m`,
/// with `C = nranks · m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockLayout {
    /// `c = b · m + o`.
    BlockMajor,
    /// `c = o · nranks + b`.
    PieceMajor,
}

/// How a block label is read as a grid position.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockLabel {
    /// Label `b` is rank `b`: its coordinates are those of rank `b`'s grid position.
    Rank,
    /// Label `b` is a grid position written row-major over the dimensions taken in `order`
    /// (`order[0]` slowest); `order` is a permutation of `0..dims.len()`.
    Grid {
        /// The dimensions, slowest first.
        order: Vec<u32>,
    },
}

/// How translations move chunk numbers of the full collective buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkMap {
    /// How a chunk number splits into (block label, offset).
    pub layout: BlockLayout,
    /// How a block label is read as grid coordinates.
    pub label: BlockLabel,
}

/// A group of translations of a rank grid (and of the chunks) under which a schedule is
/// invariant. See the module documentation for the exact semantics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Symmetry {
    /// Grid extents; their product is `nranks`.
    pub dims: Vec<u32>,
    /// How translations act on each dimension, one per dimension.
    pub actions: Vec<Action>,
    /// The rank at each grid position, row-major (last dimension fastest); a permutation of
    /// `0..nranks`.
    pub ranks: Vec<Rank>,
    /// `None`: chunk offsets are not moved by translations.
    pub chunks: Option<ChunkMap>,
}

/// Why a symmetry or a symmetric schedule is malformed. Messages name the offending field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SymmetryError {
    /// More than [`MAX_DIMS`] grid dimensions.
    #[error("symmetry.dims has {0} dimensions; at most {MAX_DIMS} are allowed")]
    TooManyDims(usize),
    /// Not one action per dimension.
    #[error("symmetry.actions has {actions} entries but symmetry.dims has {dims}")]
    ActionCount { dims: usize, actions: usize },
    /// A dimension of extent 0.
    #[error("symmetry.dims[{dim}] is 0; extents must be positive")]
    ZeroDim { dim: usize },
    /// The grid does not have `nranks` positions.
    #[error("symmetry.dims {dims:?} multiply to {product}, not nranks {nranks}")]
    DimsProduct {
        dims: Vec<u32>,
        /// The product, or a note that it overflows.
        product: String,
        nranks: u32,
    },
    /// An `Xor` dimension whose extent is not a power of two.
    #[error("symmetry.dims[{dim}] is {extent}, not a power of two, but its action is Xor")]
    XorNotPowerOfTwo { dim: usize, extent: u32 },
    /// `ranks` does not name one rank per position.
    #[error("symmetry.ranks has {len} entries, not nranks {nranks}")]
    RanksLength { len: usize, nranks: u32 },
    /// `ranks` repeats a rank or names one out of range.
    #[error(
        "symmetry.ranks is not a permutation of 0..{nranks}: rank {rank} at position {position} is {why}"
    )]
    NotAPermutation {
        position: usize,
        rank: Rank,
        nranks: u32,
        /// `out of range` or `repeated`.
        why: &'static str,
    },
    /// A `Grid` label's order is not a permutation of the dimensions.
    #[error("symmetry.chunks.label order {order:?} is not a permutation of 0..{dims}")]
    BadOrder { order: Vec<u32>, dims: usize },
    /// A chunk map on a chunk count that `nranks` does not divide.
    #[error(
        "symmetry.chunks maps chunks, but chunks {chunks} is not a multiple of nranks {nranks}"
    )]
    ChunksNotDivisible { chunks: u32, nranks: u32 },
    /// A template step names a peer outside `0..nranks`.
    #[error("template stream {stream} step {step}: peer {peer} is out of range (nranks {nranks})")]
    PeerOutOfRange {
        stream: usize,
        step: usize,
        peer: Rank,
        nranks: u32,
    },
    /// A template step's run in a mapped buffer extends past it.
    #[error(
        "template stream {stream} step {step}: {count} chunks at {loc} run past the mapped buffer's {len} chunks"
    )]
    RunOutOfRange {
        stream: usize,
        step: usize,
        loc: Loc,
        count: u32,
        len: u32,
    },
    /// The expansion would exceed [`MAX_EXPANDED_STEPS`].
    #[error(
        "expanding {nranks} ranks × {steps} template steps exceeds the limit of {MAX_EXPANDED_STEPS} steps"
    )]
    TooLarge { nranks: u32, steps: usize },
    /// A program was asked for a rank the schedule does not have.
    #[error("rank {rank} is out of range: the schedule has {nranks} ranks")]
    NoSuchRank { rank: Rank, nranks: u32 },
}

impl Symmetry {
    /// A one-dimensional cyclic symmetry: the ranks in ring order `ranks`, translations are
    /// rotations of the ring.
    pub fn ring(ranks: Vec<Rank>, chunks: Option<ChunkMap>) -> Symmetry {
        Symmetry {
            dims: vec![ranks.len().try_into().unwrap_or(u32::MAX)],
            actions: vec![Action::Cyclic],
            ranks,
            chunks,
        }
    }

    /// A one-dimensional xor symmetry (a hypercube written as one dimension of extent
    /// `2^k`): the rank at position `p` exchanges with the rank at position `p ^ 2^j` in
    /// round `j` of recursive doubling or halving.
    pub fn xor(ranks: Vec<Rank>, chunks: Option<ChunkMap>) -> Symmetry {
        Symmetry {
            dims: vec![ranks.len().try_into().unwrap_or(u32::MAX)],
            actions: vec![Action::Xor],
            ranks,
            chunks,
        }
    }

    /// Checks the symmetry against a schedule of `nranks` ranks and `chunks` chunks: dims
    /// multiply to `nranks` (positive, at most [`MAX_DIMS`]), one action per dim, `Xor` dims
    /// are powers of two, `ranks` is a permutation of `0..nranks`, a `Grid` label's order is a
    /// permutation of the dims, and a chunk map needs `nranks` to divide `chunks`.
    pub fn validate(&self, nranks: u32, chunks: u32) -> Result<(), SymmetryError> {
        let k = self.dims.len();
        if k > MAX_DIMS {
            return Err(SymmetryError::TooManyDims(k));
        }
        if self.actions.len() != k {
            return Err(SymmetryError::ActionCount {
                dims: k,
                actions: self.actions.len(),
            });
        }
        if let Some(dim) = self.dims.iter().position(|&d| d == 0) {
            return Err(SymmetryError::ZeroDim { dim });
        }
        let product = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)));
        if product != Some(u64::from(nranks)) {
            return Err(SymmetryError::DimsProduct {
                dims: self.dims.clone(),
                product: product.map_or_else(|| "more than 2^64".to_string(), |p| p.to_string()),
                nranks,
            });
        }
        for (dim, (&extent, action)) in self.dims.iter().zip(&self.actions).enumerate() {
            if *action == Action::Xor && !extent.is_power_of_two() {
                return Err(SymmetryError::XorNotPowerOfTwo { dim, extent });
            }
        }
        if self.ranks.len() != nranks as usize {
            return Err(SymmetryError::RanksLength {
                len: self.ranks.len(),
                nranks,
            });
        }
        let mut seen = vec![false; nranks as usize];
        for (position, &rank) in self.ranks.iter().enumerate() {
            let why = match seen.get_mut(rank as usize) {
                None => "out of range",
                Some(true) => "repeated",
                Some(s) => {
                    *s = true;
                    continue;
                }
            };
            return Err(SymmetryError::NotAPermutation {
                position,
                rank,
                nranks,
                why,
            });
        }
        if let Some(map) = &self.chunks {
            if let BlockLabel::Grid { order } = &map.label {
                let mut used = vec![false; k];
                let ok = order.len() == k
                    && order.iter().all(|&d| match used.get_mut(d as usize) {
                        Some(u) if !*u => {
                            *u = true;
                            true
                        }
                        _ => false,
                    });
                if !ok {
                    return Err(SymmetryError::BadOrder {
                        order: order.clone(),
                        dims: k,
                    });
                }
            }
            if nranks == 0 || !chunks.is_multiple_of(nranks) {
                return Err(SymmetryError::ChunksNotDivisible { chunks, nranks });
            }
        }
        Ok(())
    }

    /// The grid position of `rank` (a linear search; [`SymmetryTable::position_of`] is the
    /// constant-time form).
    pub fn position_of(&self, rank: Rank) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }

    /// The coordinates of grid position `position`, or `None` past the grid.
    pub fn coords(&self, position: usize) -> Option<Vec<u32>> {
        if position >= self.ranks.len() || self.dims.contains(&0) {
            return None;
        }
        let mut rest = position;
        let mut out = vec![0; self.dims.len()];
        for (x, &d) in out.iter_mut().zip(&self.dims).rev() {
            *x = (rest % d as usize) as u32;
            rest /= d as usize;
        }
        Some(out)
    }

    /// The rank that `rank` becomes under the translation by the coordinates of grid position
    /// `by_position`; `None` when the symmetry is malformed (see [`Symmetry::validate`]) or an
    /// argument is out of range.
    pub fn translate_rank(&self, rank: Rank, by_position: usize) -> Option<Rank> {
        let nranks = u32::try_from(self.ranks.len()).ok()?;
        self.validate(nranks, 0).ok()?;
        let from = self.coords(self.position_of(rank)?)?;
        let by = self.coords(by_position)?;
        let mut p = 0usize;
        for i in 0..self.dims.len() {
            let d = self.dims[i];
            p = p * d as usize + act(self.actions[i], from[i], by[i], d) as usize;
        }
        self.ranks.get(p).copied()
    }
}

/// `y ⊕ x` in a dimension of extent `d` (`y, x < d`).
fn act(action: Action, y: u32, x: u32, d: u32) -> u32 {
    match action {
        Action::Cyclic => ((u64::from(y) + u64::from(x)) % u64::from(d)) as u32,
        Action::Xor => y ^ x,
    }
}

/// A symmetric schedule: the [`Schedule`] header (the fields of a [`ScheduleHeader`], kept
/// flat), a [`Symmetry`] and the program of the rank at grid position 0. Field order is the
/// RON order of plan files.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymmetricSchedule {
    /// The collective the schedule implements.
    pub collective: Collective,
    /// Number of ranks.
    pub nranks: u32,
    /// `C`: how many chunks the whole collective buffer is cut into.
    pub chunks: u32,
    /// Input buffer extent in chunks.
    pub input_chunks: u32,
    /// Output buffer extent in chunks.
    pub output_chunks: u32,
    /// Whether the schedule is written for overlapping input and output.
    pub in_place: bool,
    /// How the template is translated for each rank.
    pub symmetry: Symmetry,
    /// The program of rank `symmetry.ranks[0]`.
    pub template: RankProgram,
}

/// Precomputed lookups of a validated symmetry for one schedule shape: coordinates of every
/// position, the position of every rank, block labels' positions, and which buffers move.
#[derive(Debug, Clone)]
pub struct SymmetryTable {
    dims: Vec<u32>,
    actions: Vec<Action>,
    /// Rank at each position.
    ranks: Vec<Rank>,
    /// Position of each rank.
    position: Vec<u32>,
    /// `coords[p * k + i]`: coordinate `i` of position `p`.
    coords: Vec<u32>,
    chunks: Option<ChunkTable>,
}

#[derive(Debug, Clone)]
struct ChunkTable {
    layout: BlockLayout,
    /// Chunks per block.
    m: u32,
    /// `C`.
    total: u32,
    /// Grid position of each block label.
    label_position: Vec<u32>,
    /// Block label of each grid position.
    position_label: Vec<u32>,
    map_input: bool,
    map_output: bool,
}

impl SymmetryTable {
    /// Validates `symmetry` for a schedule of this shape and builds its tables
    /// (`O(nranks · dims)` time and memory).
    pub fn new(
        symmetry: &Symmetry,
        nranks: u32,
        chunks: u32,
        input_chunks: u32,
        output_chunks: u32,
    ) -> Result<SymmetryTable, SymmetryError> {
        symmetry.validate(nranks, chunks)?;
        let n = nranks as usize;
        let k = symmetry.dims.len();
        // Row-major: coordinate i is constant over runs of Π_{j>i} dims[j] positions.
        let mut coords = vec![0u32; n * k];
        let mut stride = 1usize;
        for i in (0..k).rev() {
            let d = symmetry.dims[i] as usize;
            let (mut x, mut left) = (0u32, stride);
            for p in 0..n {
                coords[p * k + i] = x;
                left -= 1;
                if left == 0 {
                    left = stride;
                    x = if x as usize + 1 == d { 0 } else { x + 1 };
                }
            }
            stride *= d;
        }
        let mut position = vec![0u32; n];
        for (p, &r) in symmetry.ranks.iter().enumerate() {
            position[r as usize] = p as u32;
        }
        let chunks_table = symmetry.chunks.as_ref().map(|map| {
            let (label_position, position_label) = match &map.label {
                BlockLabel::Rank => (position.clone(), symmetry.ranks.clone()),
                BlockLabel::Grid { order } => {
                    // Label of position p: its coordinates written in `order`.
                    let mut position_label = vec![0u32; n];
                    for (p, label) in position_label.iter_mut().enumerate() {
                        let mut b = 0usize;
                        for &dim in order {
                            let dim = dim as usize;
                            b = b * symmetry.dims[dim] as usize + coords[p * k + dim] as usize;
                        }
                        *label = b as u32;
                    }
                    let mut label_position = vec![0u32; n];
                    for (p, &b) in position_label.iter().enumerate() {
                        label_position[b as usize] = p as u32;
                    }
                    (label_position, position_label)
                }
            };
            ChunkTable {
                layout: map.layout,
                m: chunks / nranks,
                total: chunks,
                label_position,
                position_label,
                map_input: input_chunks == chunks,
                map_output: output_chunks == chunks,
            }
        });
        Ok(SymmetryTable {
            dims: symmetry.dims.clone(),
            actions: symmetry.actions.clone(),
            ranks: symmetry.ranks.clone(),
            position,
            coords,
            chunks: chunks_table,
        })
    }

    /// Number of ranks (grid positions).
    pub fn nranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// The grid position of `rank`.
    pub fn position_of(&self, rank: Rank) -> Option<usize> {
        self.position.get(rank as usize).map(|&p| p as usize)
    }

    /// The rank at grid position `position`.
    pub fn rank_at(&self, position: usize) -> Option<Rank> {
        self.ranks.get(position).copied()
    }

    /// The position of `p` translated by the coordinates of `by`.
    fn translate_position(&self, p: usize, by: usize) -> usize {
        let k = self.dims.len();
        let mut out = 0usize;
        for i in 0..k {
            let d = self.dims[i];
            out = out * d as usize
                + act(
                    self.actions[i],
                    self.coords[p * k + i],
                    self.coords[by * k + i],
                    d,
                ) as usize;
        }
        out
    }

    /// The position whose translation undoes the translation by `by`'s coordinates (the
    /// group inverse): translating by `by` and then by it gives every position back.
    pub fn inverse_position(&self, by: usize) -> usize {
        let k = self.dims.len();
        let mut out = 0usize;
        for i in 0..k {
            let d = self.dims[i];
            let x = self.coords[by * k + i];
            let inv = match self.actions[i] {
                Action::Cyclic => (d - x) % d,
                Action::Xor => x,
            };
            out = out * d as usize + inv as usize;
        }
        out
    }

    /// Positions whose translations generate the group: per cyclic dimension its unit
    /// step, per xor dimension every power of two below its extent.
    pub(crate) fn generators(&self) -> Vec<usize> {
        let k = self.dims.len();
        let mut out = Vec::new();
        for i in 0..k {
            let stride: usize = self.dims[i + 1..].iter().map(|&d| d as usize).product();
            let d = self.dims[i] as usize;
            match self.actions[i] {
                Action::Cyclic if d > 1 => out.push(stride),
                Action::Cyclic => {}
                Action::Xor => {
                    let mut bit = 1;
                    while bit < d {
                        out.push(bit * stride);
                        bit *= 2;
                    }
                }
            }
        }
        out
    }

    /// A representative of the runs every translation reorders as it reorders `run` (of
    /// `count` chunks): in a piece-major layout, a run within one row of `nranks` chunks
    /// moves within its row by the row's labels alone, so runs at the same place of
    /// different rows reorder alike; other runs represent themselves.
    pub(crate) fn lane_class(&self, run: Loc, count: u32) -> Loc {
        match &self.chunks {
            Some(c) if c.layout == BlockLayout::PieceMajor && self.maps(run.buf) => {
                let n = self.ranks.len() as u32;
                let first = run.off / n;
                let last = (u64::from(run.off) + u64::from(count.max(1)) - 1) / u64::from(n);
                if u64::from(first) == last {
                    Loc {
                        off: run.off % n,
                        ..run
                    }
                } else {
                    run
                }
            }
            _ => run,
        }
    }

    /// Whether translations move the chunks of `buf` (see the module docs).
    pub(crate) fn maps(&self, buf: Buf) -> bool {
        self.chunks.as_ref().is_some_and(|c| match buf {
            Buf::Input => c.map_input,
            Buf::Output => c.map_output,
            Buf::Scratch => false,
        })
    }

    /// The translation by the coordinates of grid position `by_position` (no setup cost;
    /// each lookup costs `O(dims)`); `None` past the grid.
    pub fn translation(&self, by_position: usize) -> Option<Translation<'_>> {
        (by_position < self.ranks.len()).then_some(Translation {
            table: self,
            by: by_position,
            memo: None,
        })
    }

    /// The lookups of the translation by `by_position`'s coordinates, precomputed
    /// (`O(nranks · (dims + log nranks))`): with them ([`SymmetryTable::translation_with`]),
    /// a rank costs `O(1)` instead of `O(dims)` and a run of chunks `O(1)` instead of
    /// `O(count · dims)`. Worth it for a whole program.
    pub fn memo(&self, by_position: usize) -> Option<TranslationMemo> {
        self.memo_for_runs(by_position, [u32::MAX])
    }

    /// [`SymmetryTable::memo`] for a program whose steps address runs of `counts` chunks:
    /// range minima are built only as wide as those runs, and only when looking the runs'
    /// labels up one by one would cost more than building them (any run still translates
    /// correctly).
    pub fn memo_for_runs(
        &self,
        by_position: usize,
        counts: impl IntoIterator<Item = u32>,
    ) -> Option<TranslationMemo> {
        if by_position >= self.ranks.len() {
            return None;
        }
        let n = self.ranks.len();
        let k = self.dims.len();
        // Position p's translation is Σ_i act(x_i(p), by_i) · stride_i: one table per
        // dimension, summed over the positions in row-major order.
        let mut positions = vec![0u32; n];
        let mut stride = 1usize;
        for i in (0..k).rev() {
            let d = self.dims[i] as usize;
            let by = self.coords[by_position * k + i];
            let moved: Vec<u32> = (0..d as u32)
                .map(|x| act(self.actions[i], x, by, d as u32) * stride as u32)
                .collect();
            // Coordinate i is constant over runs of `stride` positions and cycles through
            // 0..d.
            for (block, run) in positions.chunks_mut(stride).enumerate() {
                let add = moved[block % d];
                run.iter_mut().for_each(|slot| *slot += add);
            }
            stride *= d;
        }
        let labels = self.chunks.as_ref().map(|c| {
            let images: Vec<u32> = c
                .label_position
                .iter()
                .map(|&p| c.position_label[positions[p as usize] as usize])
                .collect();
            // Labels a run of `count` chunks looks up: its blocks (block-major), or its
            // chunks within one row (piece-major).
            let width = |count: u32| match c.layout {
                BlockLayout::BlockMajor => (count / c.m.max(1)).saturating_add(2),
                BlockLayout::PieceMajor => count.min(n as u32),
            } as usize;
            let (mut widest, mut scans) = (1usize, 0usize);
            for count in counts {
                let w = width(count);
                widest = widest.max(w);
                scans = scans.saturating_add(2 * w);
            }
            let build = n.saturating_mul(widest.ilog2() as usize + 1);
            let cap = if scans > 2 * build { widest } else { 1 };
            RangeMin::new(images, cap)
        });
        Some(TranslationMemo {
            by: by_position,
            positions,
            labels,
        })
    }

    /// The translation whose lookups `memo` holds ([`SymmetryTable::memo`] of this table).
    pub fn translation_with<'a>(&'a self, memo: &'a TranslationMemo) -> Option<Translation<'a>> {
        (memo.by < self.ranks.len()
            && memo.positions.len() == self.ranks.len()
            && memo.labels.as_ref().map(|l| l.len())
                == self.chunks.as_ref().map(|_| self.ranks.len()))
        .then_some(Translation {
            table: self,
            by: memo.by,
            memo: Some(memo),
        })
    }
}

/// One translation's lookups, precomputed ([`SymmetryTable::memo`]).
#[derive(Debug, Clone)]
pub struct TranslationMemo {
    by: usize,
    /// Every position translated.
    positions: Vec<u32>,
    /// Every block label's image, with range minima (when chunks move).
    labels: Option<RangeMin>,
}

/// Range minima of a list in `O(1)` per query (a sparse table).
#[derive(Debug, Clone)]
struct RangeMin {
    /// `levels[j][i]`: the least of `levels[0][i..i + 2^j]`.
    levels: Vec<Vec<u32>>,
}

impl RangeMin {
    /// The table for queries of up to `max_width` values (wider ones take several lookups).
    fn new(values: Vec<u32>, max_width: usize) -> RangeMin {
        let mut levels = vec![values];
        let mut width = 1usize;
        while width * 2 <= levels[0].len() && width * 2 <= max_width {
            let prev = &levels[levels.len() - 1];
            let next: Vec<u32> = (0..prev.len() - width)
                .map(|i| prev[i].min(prev[i + width]))
                .collect();
            levels.push(next);
            width *= 2;
        }
        RangeMin { levels }
    }

    fn len(&self) -> usize {
        self.levels[0].len()
    }

    fn get(&self, i: usize) -> u32 {
        self.levels[0][i]
    }

    /// The least value of `a..b` (`a < b ≤ len`).
    fn min(&self, a: usize, b: usize) -> u32 {
        let j = ((usize::BITS - 1 - (b - a).leading_zeros()) as usize).min(self.levels.len() - 1);
        let (level, w) = (&self.levels[j], 1usize << j);
        // Blocks of `w` from `a`, and the last `w` before `b` for the rest.
        let mut least = level[b - w];
        let mut i = a;
        while i + w <= b {
            least = least.min(level[i]);
            i += w;
        }
        least
    }
}

/// One translation of a [`SymmetryTable`], ready to apply to ranks, chunks and programs.
#[derive(Debug, Clone, Copy)]
pub struct Translation<'a> {
    table: &'a SymmetryTable,
    /// The grid position whose coordinates translate.
    by: usize,
    /// The lookups, when precomputed ([`SymmetryTable::memo`]).
    memo: Option<&'a TranslationMemo>,
}

impl Translation<'_> {
    /// Position `p` translated.
    fn position(&self, p: usize) -> usize {
        match self.memo {
            Some(m) => m.positions[p] as usize,
            None => self.table.translate_position(p, self.by),
        }
    }

    /// The rank `rank` becomes; ranks past the grid are left unchanged.
    pub fn rank(&self, rank: Rank) -> Rank {
        let t = self.table;
        match t.position.get(rank as usize) {
            Some(&p) => t.ranks[self.position(p as usize)],
            None => rank,
        }
    }

    /// The block label `b` becomes (`b < nranks`).
    fn label(&self, chunks: &ChunkTable, b: u32) -> u32 {
        if let Some(l) = self.memo.and_then(|m| m.labels.as_ref()) {
            return l.get(b as usize);
        }
        let p = chunks.label_position[b as usize] as usize;
        chunks.position_label[self.position(p)]
    }

    /// The chunk `c` of the full buffer becomes (when chunks move and `c < C`).
    fn chunk(&self, chunks: &ChunkTable, c: u32) -> u32 {
        let n = self.table.ranks.len() as u32;
        match chunks.layout {
            BlockLayout::BlockMajor => self.label(chunks, c / chunks.m) * chunks.m + c % chunks.m,
            BlockLayout::PieceMajor => (c / n) * n + self.label(chunks, c % n),
        }
    }

    /// Where chunk `c` of the full collective buffer goes (unchanged when chunks do not
    /// move or `c` is past the buffer): how a translation renames the origin of a value.
    pub(crate) fn origin(&self, c: u32) -> u32 {
        match &self.table.chunks {
            Some(chunks) if c < chunks.total => self.chunk(chunks, c),
            _ => c,
        }
    }

    /// Where slot `c` of buffer `buf` goes: moved as [`Translation::origin`] in a mapped
    /// buffer, unchanged elsewhere.
    pub(crate) fn slot(&self, buf: Buf, c: u32) -> u32 {
        if self.table.maps(buf) {
            self.origin(c)
        } else {
            c
        }
    }

    /// The location a run of `count` chunks at `loc` moves to: in a mapped buffer the least
    /// image of the run's chunks, elsewhere (and for runs past the buffer) `loc` itself.
    pub fn loc(&self, loc: Loc, count: u32) -> Loc {
        let Some(chunks) = &self.table.chunks else {
            return loc;
        };
        let mapped = match loc.buf {
            Buf::Input => chunks.map_input,
            Buf::Output => chunks.map_output,
            Buf::Scratch => false,
        };
        let count = count.max(1);
        if !mapped || u64::from(loc.off) + u64::from(count) > u64::from(chunks.total) {
            return loc;
        }
        let (off, m, n) = (loc.off, chunks.m, self.table.ranks.len() as u32);
        let end = off + count; // ≤ C, no overflow
        let least = match chunks.layout {
            // Blocks touched: the first from off % m, the others from their start.
            BlockLayout::BlockMajor => {
                let first = self.chunk(chunks, off);
                let (a, b) = (off / m + 1, end.div_ceil(m));
                if let Some(l) = self.memo.and_then(|m| m.labels.as_ref())
                    && a < b
                {
                    return Loc {
                        off: first.min(l.min(a as usize, b as usize) * m),
                        ..loc
                    };
                }
                (a..b)
                    .map(|b| self.label(chunks, b) * m)
                    .fold(first, u32::min)
            }
            // The least offset row (off / n) holds the least images; scan that row's part of
            // the run.
            BlockLayout::PieceMajor => {
                let row = off / n;
                let row_end = end.min((row + 1).saturating_mul(n));
                if let Some(l) = self.memo.and_then(|m| m.labels.as_ref()) {
                    let (a, b) = ((off - row * n) as usize, (row_end - row * n) as usize);
                    return Loc {
                        off: row * n + l.min(a, b),
                        ..loc
                    };
                }
                (off..row_end)
                    .map(|c| row * n + self.label(chunks, c % n))
                    .min()
                    .unwrap_or(off)
            }
        };
        Loc { off: least, ..loc }
    }

    /// The op translated: peers renamed, mapped locations moved.
    pub fn op(&self, op: Op, count: u32) -> Op {
        let l = |loc: Loc| self.loc(loc, count);
        op.map_peers(|r| self.rank(r)).map_locs(l, l)
    }

    /// The step translated (count and dependencies unchanged).
    pub fn step(&self, step: &Step) -> Step {
        Step {
            op: self.op(step.op, step.count),
            count: step.count,
            deps: step.deps.clone(),
        }
    }

    /// Whether `template`'s step translated equals `actual` (no allocation).
    fn step_matches(&self, template: &Step, actual: &Step) -> bool {
        template.count == actual.count
            && template.deps == actual.deps
            && self.op(template.op, template.count) == actual.op
    }

    /// The program translated.
    pub fn program(&self, template: &RankProgram) -> RankProgram {
        RankProgram {
            scratch_chunks: template.scratch_chunks,
            streams: template
                .streams
                .iter()
                .map(|s| Stream {
                    channel: s.channel,
                    steps: s.steps.iter().map(|st| self.step(st)).collect(),
                })
                .collect(),
        }
    }

    /// Whether `template` translated equals `actual`, stopping at the first difference.
    pub fn program_matches(&self, template: &RankProgram, actual: &RankProgram) -> bool {
        template.scratch_chunks == actual.scratch_chunks
            && template.streams.len() == actual.streams.len()
            && template.streams.iter().zip(&actual.streams).all(|(t, a)| {
                t.channel == a.channel
                    && t.steps.len() == a.steps.len()
                    && t.steps
                        .iter()
                        .zip(&a.steps)
                        .all(|(ts, as_)| self.step_matches(ts, as_))
            })
    }
}

impl SymmetricSchedule {
    /// The schedule's fields besides its symmetry and template.
    pub fn header(&self) -> ScheduleHeader {
        ScheduleHeader {
            collective: self.collective,
            nranks: self.nranks,
            chunks: self.chunks,
            input_chunks: self.input_chunks,
            output_chunks: self.output_chunks,
            in_place: self.in_place,
        }
    }

    /// The symmetric schedule with header `header`, `symmetry` and `template` (unchecked:
    /// see [`SymmetricSchedule::table`]).
    pub fn from_header(
        header: ScheduleHeader,
        symmetry: Symmetry,
        template: RankProgram,
    ) -> SymmetricSchedule {
        let ScheduleHeader {
            collective,
            nranks,
            chunks,
            input_chunks,
            output_chunks,
            in_place,
        } = header;
        SymmetricSchedule {
            collective,
            nranks,
            chunks,
            input_chunks,
            output_chunks,
            in_place,
            symmetry,
            template,
        }
    }

    /// Validates the symmetry and the template (peers in `0..nranks`, runs in mapped
    /// buffers inside `0..C`) and builds the tables that instantiate programs.
    pub fn table(&self) -> Result<SymmetryTable, SymmetryError> {
        let table = SymmetryTable::new(
            &self.symmetry,
            self.nranks,
            self.chunks,
            self.input_chunks,
            self.output_chunks,
        )?;
        for (si, stream) in self.template.streams.iter().enumerate() {
            for (ti, step) in stream.steps.iter().enumerate() {
                for peer in [step.op.send_peer(), step.op.recv_peer()]
                    .into_iter()
                    .flatten()
                {
                    if peer >= self.nranks {
                        return Err(SymmetryError::PeerOutOfRange {
                            stream: si,
                            step: ti,
                            peer,
                            nranks: self.nranks,
                        });
                    }
                }
                if let Some(chunks) = &table.chunks {
                    for loc in [step.op.src(), step.op.dst()].into_iter().flatten() {
                        let mapped = match loc.buf {
                            Buf::Input => chunks.map_input,
                            Buf::Output => chunks.map_output,
                            Buf::Scratch => false,
                        };
                        let end = u64::from(loc.off) + u64::from(step.count.max(1));
                        if mapped && end > u64::from(chunks.total) {
                            return Err(SymmetryError::RunOutOfRange {
                                stream: si,
                                step: ti,
                                loc,
                                count: step.count,
                                len: chunks.total,
                            });
                        }
                    }
                }
            }
        }
        Ok(table)
    }

    /// The program of `rank`: the template translated by the coordinates of `rank`'s grid
    /// position.
    pub fn program(&self, rank: Rank) -> Result<RankProgram, SymmetryError> {
        let table = self.table()?;
        self.program_with(&table, rank)
    }

    /// [`SymmetricSchedule::program`] with a table from [`SymmetricSchedule::table`].
    pub fn program_with(
        &self,
        table: &SymmetryTable,
        rank: Rank,
    ) -> Result<RankProgram, SymmetryError> {
        let missing = SymmetryError::NoSuchRank {
            rank,
            nranks: self.nranks,
        };
        let by = table.position_of(rank).ok_or(missing.clone())?;
        let counts = self.template.streams.iter().flat_map(|s| &s.steps);
        let memo = table
            .memo_for_runs(by, counts.map(|s| s.count))
            .ok_or(missing.clone())?;
        let translation = table.translation_with(&memo).ok_or(missing)?;
        Ok(translation.program(&self.template))
    }

    /// [`SymmetricSchedule::program_with`] into `program`, which must hold the template:
    /// translated in place, without allocating another program.
    pub fn translate_in_place(
        &self,
        table: &SymmetryTable,
        rank: Rank,
        program: &mut RankProgram,
    ) -> Result<(), SymmetryError> {
        let missing = SymmetryError::NoSuchRank {
            rank,
            nranks: self.nranks,
        };
        let by = table.position_of(rank).ok_or(missing.clone())?;
        let counts = program.streams.iter().flat_map(|s| &s.steps);
        let memo = table
            .memo_for_runs(by, counts.map(|s| s.count))
            .ok_or(missing.clone())?;
        let translation = table.translation_with(&memo).ok_or(missing)?;
        for step in program.streams.iter_mut().flat_map(|s| &mut s.steps) {
            step.op = translation.op(step.op, step.count);
        }
        Ok(())
    }

    /// Number of steps of the template.
    pub fn template_step_count(&self) -> usize {
        self.template.streams.iter().map(|s| s.steps.len()).sum()
    }

    /// The schedule with every rank's program instantiated. Refuses expansions past
    /// [`MAX_EXPANDED_STEPS`] steps.
    pub fn expand(&self) -> Result<Schedule, SymmetryError> {
        self.expand_within(MAX_EXPANDED_STEPS)
    }

    /// [`SymmetricSchedule::expand`] refusing expansions past `max_steps` steps instead.
    pub fn expand_within(&self, max_steps: u64) -> Result<Schedule, SymmetryError> {
        let table = self.table()?;
        let steps = self.template_step_count();
        if u64::from(self.nranks).saturating_mul(steps as u64) > max_steps {
            return Err(SymmetryError::TooLarge {
                nranks: self.nranks,
                steps,
            });
        }
        let mut ranks = vec![
            RankProgram {
                scratch_chunks: 0,
                streams: Vec::new(),
            };
            self.nranks as usize
        ];
        for (p, &rank) in self.symmetry.ranks.iter().enumerate() {
            if let Some(t) = table.translation(p) {
                ranks[rank as usize] = t.program(&self.template);
            }
        }
        Ok(Schedule::from_header(self.header(), ranks))
    }
}

impl Schedule {
    /// The symmetric form of this schedule under `symmetry`: `Some` only when the symmetry
    /// is valid for it and every rank's program equals the template (the program of
    /// `symmetry.ranks[0]`) translated to that rank exactly, so that
    /// [`SymmetricSchedule::expand`] gives back `self`. Stops at the first mismatch.
    pub fn compress(&self, symmetry: &Symmetry) -> Option<SymmetricSchedule> {
        if self.ranks.len() != self.nranks as usize {
            return None;
        }
        let first = *symmetry.ranks.first()?;
        let symmetric = SymmetricSchedule::from_header(
            self.header(),
            symmetry.clone(),
            self.ranks.get(first as usize)?.clone(),
        );
        let table = symmetric.table().ok()?;
        for (p, &rank) in symmetry.ranks.iter().enumerate().skip(1) {
            let t = table.translation(p)?;
            if !t.program_matches(&symmetric.template, &self.ranks[rank as usize]) {
                return None;
            }
        }
        Some(symmetric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(dims: Vec<u32>, actions: Vec<Action>, chunks: Option<ChunkMap>) -> Symmetry {
        let n: u32 = dims.iter().product();
        Symmetry {
            dims,
            actions,
            ranks: (0..n).collect(),
            chunks,
        }
    }

    #[test]
    fn validate_rejects_malformed_symmetries() {
        use Action::*;
        let ok = grid(vec![2, 4], vec![Cyclic, Xor], None);
        assert_eq!(ok.validate(8, 8), Ok(()));
        let cases: Vec<(Symmetry, u32, u32, &str)> = vec![
            (grid(vec![2, 4], vec![Cyclic], None), 8, 8, "actions"),
            (ok.clone(), 6, 8, "multiply to 8, not nranks 6"),
            (
                Symmetry {
                    dims: vec![u32::MAX; 3],
                    actions: vec![Cyclic; 3],
                    ranks: vec![],
                    chunks: None,
                },
                8,
                8,
                "more than 2^64",
            ),
            (
                grid(vec![3, 2], vec![Xor, Cyclic], None),
                6,
                6,
                "power of two",
            ),
            (
                Symmetry {
                    ranks: vec![0, 1, 2, 3, 4, 5, 6, 6],
                    ..ok.clone()
                },
                8,
                8,
                "repeated",
            ),
            (
                Symmetry {
                    ranks: vec![0, 1, 2, 3, 4, 5, 6, 8],
                    ..ok.clone()
                },
                8,
                8,
                "out of range",
            ),
            (
                Symmetry {
                    ranks: vec![0, 1],
                    ..ok.clone()
                },
                8,
                8,
                "2 entries",
            ),
            (
                grid(
                    vec![2, 4],
                    vec![Cyclic, Cyclic],
                    Some(ChunkMap {
                        layout: BlockLayout::BlockMajor,
                        label: BlockLabel::Grid { order: vec![0, 0] },
                    }),
                ),
                8,
                8,
                "order",
            ),
            (
                grid(
                    vec![8],
                    vec![Cyclic],
                    Some(ChunkMap {
                        layout: BlockLayout::BlockMajor,
                        label: BlockLabel::Rank,
                    }),
                ),
                8,
                12,
                "not a multiple",
            ),
            (grid(vec![0], vec![Cyclic], None), 0, 0, "is 0"),
            (grid(vec![1; 65], vec![Cyclic; 65], None), 1, 1, "at most"),
        ];
        for (sym, n, c, fragment) in cases {
            let err = sym.validate(n, c).expect_err(fragment).to_string();
            assert!(err.contains(fragment), "{err} lacks {fragment}");
        }
    }

    #[test]
    fn translations_act_per_dimension() {
        use Action::*;
        // 2 × 4 grid, ranks reversed: position p holds rank 7 - p.
        let sym = Symmetry {
            ranks: (0..8).rev().collect(),
            ..grid(vec![2, 4], vec![Xor, Cyclic], None)
        };
        // Rank 6 is at position 1 = (0, 1); translating by position 7 = (1, 3) gives (1, 0)
        // = position 4, which holds rank 3.
        assert_eq!(sym.position_of(6), Some(1));
        assert_eq!(sym.coords(7), Some(vec![1, 3]));
        assert_eq!(sym.translate_rank(6, 7), Some(3));
        let table = SymmetryTable::new(&sym, 8, 8, 8, 8).expect("valid");
        let t = table.translation(7).expect("in range");
        assert_eq!(t.rank(6), 3);
        assert_eq!(t.rank(9), 9);
        assert!(table.translation(8).is_none());
        assert_eq!(sym.translate_rank(6, 8), None);
    }

    #[test]
    fn memoised_translations_agree_with_plain_ones() {
        use Action::*;
        for (dims, actions) in [
            (vec![8], vec![Cyclic]),
            (vec![2, 4], vec![Xor, Cyclic]),
            (vec![4, 2], vec![Cyclic, Cyclic]),
        ] {
            for layout in [BlockLayout::BlockMajor, BlockLayout::PieceMajor] {
                for label in [BlockLabel::Rank, BlockLabel::Grid { order: vec![0, 1] }] {
                    let label = match label {
                        BlockLabel::Grid { .. } if dims.len() == 2 => {
                            BlockLabel::Grid { order: vec![1, 0] }
                        }
                        BlockLabel::Grid { .. } => BlockLabel::Grid { order: vec![0] },
                        l => l,
                    };
                    let sym = Symmetry {
                        ranks: vec![3, 1, 4, 0, 5, 2, 7, 6],
                        ..grid(
                            dims.clone(),
                            actions.clone(),
                            Some(ChunkMap { layout, label }),
                        )
                    };
                    let table = SymmetryTable::new(&sym, 8, 24, 24, 24).expect("valid");
                    for by in 0..8 {
                        let slow = table.translation(by).expect("in range");
                        for counts in [vec![u32::MAX], vec![], vec![1], vec![3; 100], vec![3]] {
                            let cap = counts.clone();
                            let memo = table.memo_for_runs(by, counts).expect("in range");
                            let fast = table.translation_with(&memo).expect("matches");
                            for r in 0..9 {
                                assert_eq!(fast.rank(r), slow.rank(r));
                            }
                            for off in 0..26 {
                                for count in 0..26 {
                                    for loc in
                                        [Loc::input(off), Loc::output(off), Loc::scratch(off)]
                                    {
                                        assert_eq!(
                                            fast.loc(loc, count),
                                            slow.loc(loc, count),
                                            "{sym:?} by {by} counts {cap:?}: {loc}+{count}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                    assert!(table.memo(8).is_none());
                }
            }
        }
    }

    #[test]
    fn runs_move_to_their_least_image() {
        // Ring of 4, two chunks per block.
        for (layout, off, count, expected) in [
            // Block 1 (chunks 2, 3) moves to block 2 under +1.
            (BlockLayout::BlockMajor, 2, 2, 4),
            (BlockLayout::BlockMajor, 3, 1, 5),
            // Blocks 3 and 0 → 0 and 1: the least image is chunk 0's.
            (BlockLayout::BlockMajor, 6, 2, 0),
            // Piece-major: chunk 3 is (o 0, b 3) → (0, 0) = 0; chunk 4 is (1, 0) → (1, 1) = 5.
            (BlockLayout::PieceMajor, 3, 1, 0),
            (BlockLayout::PieceMajor, 4, 1, 5),
            (BlockLayout::PieceMajor, 1, 2, 2),
            // Chunks 2, 3, 4 → 3, 0, 5.
            (BlockLayout::PieceMajor, 2, 3, 0),
        ] {
            let sym = grid(
                vec![4],
                vec![Action::Cyclic],
                Some(ChunkMap {
                    layout,
                    label: BlockLabel::Rank,
                }),
            );
            let table = SymmetryTable::new(&sym, 4, 8, 8, 8).expect("valid");
            let t = table.translation(1).expect("in range");
            assert_eq!(
                t.loc(Loc::output(off), count),
                Loc::output(expected),
                "{layout:?} {off}+{count}"
            );
            assert_eq!(t.loc(Loc::input(off), count), Loc::input(expected));
            // Rank-local buffers do not move.
            assert_eq!(t.loc(Loc::scratch(off), count), Loc::scratch(off));
        }
        let sym = grid(
            vec![4],
            vec![Action::Cyclic],
            Some(ChunkMap {
                layout: BlockLayout::BlockMajor,
                label: BlockLabel::Rank,
            }),
        );
        // An AllGather shape: the input holds one rank's share and stays put.
        let table = SymmetryTable::new(&sym, 4, 8, 2, 8).expect("valid");
        let t = table.translation(1).expect("in range");
        assert_eq!(t.loc(Loc::input(1), 1), Loc::input(1));
        // Runs past the buffer are left alone (validation rejects them in templates).
        assert_eq!(t.loc(Loc::output(7), 2), Loc::output(7));
    }
}
