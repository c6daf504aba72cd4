//! hccl-executor: loads plan files and replays their schedules.
//!
//! # Overview
//!
//! A [`Communicator`] is one rank's handle on a group. It is built from a plan (a
//! [`hccl_ir::PlanFile`], a plan file, a directory of them, or the built-in
//! [`fallback`] plans), a rank and a world size; before any data moves the plan is verified
//! ([`hccl_ir::verify::verify`]), its world size checked, and — across processes — its content
//! hash compared between all ranks. Calls take typed buffers ([`Element`]: `f32`, `f64`,
//! `f16`, `bf16`, `i8`, `u8`, `i32`, `u32`, `i64`, `u64`) and an operator ([`ReduceOp`]), in
//! place or out of place, blocking ([`Communicator::run`] and the named methods) or not
//! ([`Communicator::start`]).
//!
//! ```
//! use hccl_executor::{ReduceOp, ThreadGroup, fallback};
//!
//! // Two ranks in this process, each driven by its own thread.
//! let comms = ThreadGroup::new(fallback::plan(2), 2)?;
//! std::thread::scope(|s| {
//!     for mut comm in comms {
//!         s.spawn(move || {
//!             let mut grads = vec![comm.rank() as f32 + 1.0; 1000];
//!             comm.all_reduce_in_place(&mut grads, ReduceOp::Sum).unwrap();
//!             assert!(grads.iter().all(|&g| g == 3.0));
//!         });
//!     }
//! });
//! # Ok::<(), hccl_executor::ExecError>(())
//! ```
//!
//! Processes use [`ProcessGroup::init`] instead (rank, world size and rendezvous from the
//! launcher's environment); everything else is the same.
//!
//! # Design
//!
//! - [`engine`] is the replay engine shared by all backends: how streams map to threads, how
//!   signalling works, how chunks map to elements and what scratch holds (see its docs).
//! - [`arena`] is the shared region a backend provides: per-connection message rings and
//!   counters. A backend only moves bytes and signals: [`threads`] keeps the region on the
//!   heap, [`process`] in `/dev/shm` after a TCP rendezvous.
//! - [`dtype`] holds the reduction kernels, monomorphised per element type × operator.
//! - [`affinity`] binds a rank's thread to a core, for launchers that place ranks as
//!   `mpirun` does.
//! - [`comm`] maps a call onto a plan entry: buffer checks, placement adaptation (an in-place
//!   call on an out-of-place schedule and vice versa), segmenting, the `avg` finishing pass.
//!
//! Failures never hang or panic: a rank that waits longer than the timeout reports the peer it
//! waits for and raises the shared abort word, so every other rank returns an error naming
//! the culprit; a dead process is detected through its pid. The survivors may then
//! [`Communicator::shrink`] the communicator into one of their own, with a plan for the new
//! world size.

pub mod affinity;
pub mod alltoallv;
pub mod arena;
mod backends;
mod calls;
pub mod comm;
pub mod config;
mod copy;
pub mod dtype;
pub mod engine;
pub mod env_vars;
pub mod error;
pub mod fallback;
#[doc(hidden)]
pub mod fault;
mod plan_checks;
pub mod program;
pub mod trace;
mod transport;
pub mod waits;

#[cfg(feature = "cuda")]
pub use backends::cuda;
#[doc(hidden)]
pub use backends::fuzz;
pub use backends::{net, process, threads};

pub use comm::{AbortHandle, Buffers, Communicator, EntryInfo, OwnedBuffers, Request};
pub use config::{CallCheck, Config, PlanOrigin, PlanSource, StreamWrites, VerifyMode};
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{ExecError, Result};
pub use process::{Bootstrap, ProcessGroup};
pub use threads::ThreadGroup;
pub use waits::{Culprit, PeerWaits, StragglerReport, WaitStats};
