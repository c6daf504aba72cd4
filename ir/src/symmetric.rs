//! Rank-symmetric schedules (work in progress; documented fully below once complete).

use crate::schedule::Rank;
use serde::{Deserialize, Serialize};

/// How a translation acts on one grid dimension of extent `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// `y -> (y + x) mod d`.
    Cyclic,
    /// `y -> y ^ x`; `d` must be a power of two.
    Xor,
}

/// How chunk numbers split into a block label `b` in `0..nranks` and an offset `o` in `0..m`,
/// with `C = nranks * m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockLayout {
    /// `c = b * m + o`.
    BlockMajor,
    /// `c = o * nranks + b`.
    PieceMajor,
}

/// How a block label is read as a grid position.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockLabel {
    /// Label `b` is rank `b`: its coordinates are those of rank `b`'s grid position.
    Rank,
    /// Label `b` is a grid position written row-major over the dimensions taken in `order`
    /// (`order[0]` slowest); `order` is a permutation of `0..dims.len()`.
    Grid { order: Vec<u32> },
}

/// How translations move chunk numbers of the full collective buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkMap {
    pub layout: BlockLayout,
    pub label: BlockLabel,
}

/// A group of translations acting on ranks (and chunks) under which a schedule is invariant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Symmetry {
    /// Grid extents; their product is `nranks`.
    pub dims: Vec<u32>,
    /// How translations act on each dimension, one per dimension.
    pub actions: Vec<Action>,
    /// The rank at each grid position, row-major (last dimension fastest).
    pub ranks: Vec<Rank>,
    /// `None`: chunk offsets are not moved by translations.
    pub chunks: Option<ChunkMap>,
}
