//! The backends: what moves a group's bytes and how its ranks meet. Each implements what
//! the core defines ([`crate::comm::Backend`]: where ranks are, whether a rank's process
//! lives, how survivors regroup after a shrink; `Transport`: a transport between hosts)
//! on top of the core's region ([`crate::arena`]), engine and communicator; the core names
//! none of them. The crate root re-exports them (`hccl_executor::threads`, `::process`,
//! `::net`, `::cuda`).
//!
//! - [`threads`]: ranks as threads of one process, the region on the heap.
//! - [`process`]: ranks as processes; a TCP rendezvous, one `/dev/shm` region per host.
//! - [`net`]: connections between ranks on different hosts (TCP, and RDMA behind the
//!   `rdma` feature), driven by the engine through `Transport`.
//! - `cuda` (feature `cuda`): ranks as CUDA devices of one process, a plan lowered to
//!   per-stream commands and captured as CUDA graphs.
//! - [`fuzz`]: entry points for the fuzz targets into the backends' parsers.

#[cfg(feature = "cuda")]
pub mod cuda;
#[doc(hidden)]
pub mod fuzz;
pub mod net;
pub mod process;
pub mod threads;
