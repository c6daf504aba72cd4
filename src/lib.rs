//! hccl: collective-communication schedules compiled ahead of time and executed.
//!
//! This facade re-exports the workspace crates:
//! - [`ir`]: schedules, plan files, the verifier, MSCCL XML interop;
//! - [`topologies`]: topology descriptions and the machine graph;
//! - [`compiler`]: the schedule builder, families, cost model and search;
//! - [`executor`]: the runtime that replays plans.
//!
//! A training job loads a plan at start and calls collectives on it:
//!
//! ```no_run
//! use hccl::executor::{PlanSource, ProcessGroup, ReduceOp};
//! # fn main() -> Result<(), hccl::executor::ExecError> {
//! // Rank and world size come from torchrun, mpirun or srun; HCCL_PLAN overrides the path.
//! let mut comm = ProcessGroup::init(PlanSource::Path("dgx1-v100.plan.ron".into()))?;
//! let mut grads = vec![0.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok(())
//! # }
//! ```
//!
//! Compiling a plan from a topology in code:
//!
//! ```
//! use hccl::compiler::search::{self, Options};
//! use hccl::ir::CollectiveKind;
//!
//! let topo = hccl::topologies::shipped_by_name("dgx-h100").unwrap();
//! let options = Options {
//!     collectives: vec![CollectiveKind::AllReduce],
//!     sizes: vec![1 << 20, 1 << 30],
//!     ..Options::default()
//! };
//! let compiled = search::compile(&topo, &options).unwrap();
//! assert!(hccl::ir::verify::verify_plan(&compiled.plan).is_ok());
//! ```

pub use hccl_compiler as compiler;
pub use hccl_executor as executor;
pub use hccl_ir as ir;
pub use hccl_topologies as topologies;

#[cfg(test)]
mod tests {
    /// The compiler's CPU model segments calls as the executor does: same slot sizes, same LL
    /// ring depth.
    #[test]
    fn cost_model_knows_the_executors_slot_size() {
        assert_eq!(
            crate::compiler::cost::EXECUTOR_SLOT_BYTES,
            crate::executor::config::DEFAULT_SLOT_BYTES as u64
        );
        assert_eq!(
            crate::compiler::cost::EXECUTOR_LL_BYTES,
            crate::executor::arena::LL_BYTES as u64
        );
        assert_eq!(
            crate::compiler::cost::EXECUTOR_LL_SLOTS,
            crate::executor::arena::LL_SLOTS
        );
    }
}
