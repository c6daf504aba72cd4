//! The tests of the `hcclc` command, one binary: each file here is a module. Run one file's
//! tests with a filter on its module, `cargo test -p hcclc --test it cli_plan::`; insta
//! snapshots are in `snapshots/`, named `it__<module>__<name>.snap`. Nothing here changes
//! process-wide state (environment, working directory, signal handlers): the tests run as
//! threads of one process, each running `hcclc` as child processes.

// The mixed-speed machine the compiler's synthesis tests use too.
#[path = "../../../compiler/tests/it/synth_common/mod.rs"]
mod synth_common;

/// The synthesis cache every `hcclc` these tests run reads and writes (`HCCL_CACHE_DIR`):
/// one of this test process's own, never the user's, in Cargo's scratch directory for
/// integration tests (`target/tmp`, emptied by `cargo clean`) rather than the system's.
pub fn test_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hcclc-test-cache-{}", std::process::id()))
}

mod cli_calibrate;
mod cli_msccl;
mod cli_plan;
mod cli_synth;
mod cli_topo;
mod cli_trace;
mod compile_cli;
mod cpu_cluster;
mod plan_cache;
mod synth_cache;
