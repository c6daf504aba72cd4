//! The tests of the `hccl-perf` command, one binary: each file here is a module. Run one
//! file's tests with a filter on its module, `cargo test -p hccl-perf --test it perf_cli::`.
//! Nothing here changes process-wide state (environment, working directory, signal handlers):
//! the tests run as threads of one process, each running `hccl-perf` as child processes.

#[path = "../../../tests/it/plan_builders.rs"]
mod plan_builders;

mod perf_cli;
mod synthesized_plans;
