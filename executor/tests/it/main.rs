//! The executor's integration tests whose ranks are threads of this process, one binary: each
//! file here is a module (one link of the dependency graph for all of them instead of one per
//! file). Run one file's tests with a filter on its module,
//! `cargo test -p hccl-executor --test it threads::`; the CUDA suite (`cuda_collectives`) is
//! compiled only with `--features cuda`. Nothing here changes process-wide state (environment,
//! working directory, signal handlers, the fault injection of `hccl_executor::fault`).
//!
//! Three files stay test binaries of their own: `process.rs`, `checksum.rs` and `shrink.rs`
//! start this executable again as rank processes, running one test by its exact name
//! (`common::rank_command`), and stop or kill them (SIGSTOP, a rank that dies); `checksum.rs`
//! also arms the fault injection, which is process-wide, so it would corrupt the messages of
//! other tests running beside it here.

#[path = "../common/mod.rs"]
mod common;

mod alltoallv;
mod cuda_collectives;
mod net;
mod proptest;
mod threads;
