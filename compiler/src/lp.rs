//! The solver behind every linear and mixed-integer program of the compiler (tree packing,
//! the selection MILP, the multi-commodity flow, SCCL's MILP): `microlp`, pure Rust, by
//! default; HiGHS with the cargo feature `highs` (C++, built by `highs-sys` with cmake and a
//! C++ compiler; much faster on the large instances: 4×4 tori, 32-rank clusters, SCCL
//! instances of many steps). Both are `good_lp` solvers; models are written once.

#[cfg(feature = "highs")]
pub use good_lp::highs as solver;
#[cfg(not(feature = "highs"))]
pub use good_lp::microlp as solver;

/// The solver's name, as `hcclc` reports it.
pub const NAME: &str = if cfg!(feature = "highs") {
    "highs"
} else {
    "microlp"
};
