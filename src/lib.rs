//! hccl: collective-communication schedules compiled ahead of time and executed.
//!
//! This facade re-exports the workspace crates:
//! - [`ir`]: schedules, plan files and the verifier;
//! - [`topologies`]: topology descriptions and the machine graph;
//! - [`compiler`]: schedule families, cost model and search;
//! - [`executor`]: the runtime that replays plans.

pub use hccl_compiler as compiler;
pub use hccl_executor as executor;
pub use hccl_ir as ir;
pub use hccl_topologies as topologies;
