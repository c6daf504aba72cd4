//! Schedule families: generators that turn a topology and a collective into candidate
//! schedules (ring, double ring, trees, hybrid cube, mesh, hierarchical, link groups,
//! AllToAll variants).
//!
//! Interface shared with the search ([`crate::search`]): every family implements [`Family`]
//! ([`family`]); the search's registry ([`crate::search::all_families`]) lists them.
//! Candidates from outside the built-in families (imported MSCCL files, an LP synthesizer)
//! enter the search as plain [`Candidate`] values.

pub mod common;
pub mod cube;
pub mod family;
pub mod groups;
pub mod hier;
pub mod mesh;
pub mod oneshot;
pub mod rail;
pub mod ring;
pub mod split;
pub mod tree;

pub use cube::HybridCube;
pub use family::{Candidate, Family, FamilyParams, TEMPLATE_RANKS, steps_per_piece};
pub use groups::Groups;
pub use hier::{Hierarchical, HierarchicalHd, HierarchicalRd};
pub use mesh::{Bruck, Mesh, Pairwise, TwoPhase};
pub use oneshot::OneShot;
pub use rail::{RailChains, RailTrees};
pub use ring::{DoubleRing, Ring};
pub use split::HierarchicalSplit;
pub use tree::{DoubleBinaryTree, KaryTree};
