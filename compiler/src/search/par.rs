//! The one helper every phase runs its work through: [`par_map`] (in `hccl_ir`, which writes
//! plan text with it as well).

pub use hccl_ir::par::par_map;
