//! The IR's integration tests, one binary: each file here is a module (one link of the
//! dependency graph for all of them instead of one per file). Run one file's tests with a
//! filter on its module, `cargo test -p hccl-ir --test it verifier_ring::`; insta snapshots are
//! in `snapshots/`, named `it__<module>__<name>.snap`. Nothing here changes process-wide state
//! (environment, working directory, signal handlers): the tests run as threads of one process.

mod common;

mod msccl_corpus;
mod plan_formats;
mod plan_one_rank;
mod plan_robustness;
mod relabel;
mod symmetric;
mod verifier_cases;
mod verifier_equiv;
mod verifier_gen;
mod verifier_merged;
mod verifier_ring;
