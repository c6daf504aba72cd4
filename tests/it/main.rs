//! The workspace's integration tests of the facade crate, one binary: each file here is a
//! module (one link of the dependency graph for all of them instead of one per file). Run one
//! file's tests with a filter on its module, `cargo test -p hccl --test it synthesized_plans::`.
//! Nothing here changes process-wide state (environment, working directory, signal handlers):
//! the tests run as threads of one process.
//!
//! Two files stay test binaries of their own: `multihost.rs` and `netns_selftest.rs` start
//! their own executable again (behind `ip netns exec`) running one test by its exact name,
//! make and remove network namespaces, and stop or kill the processes they started.

#[path = "../../executor/tests/common/mod.rs"]
mod common;

mod env_table;
mod examples;
mod fuzz_corpus;
mod plan_builders;
mod soak;
mod synthesized_plans;
mod tidy;
mod verifier_ring;
