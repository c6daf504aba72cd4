//! The compiler's integration tests, one binary: each file here is a module (one link of the
//! dependency graph for all of them instead of one per file, which took most of the build of
//! `cargo test --workspace`). Run one file's tests with a filter on its module,
//! `cargo test -p hccl-compiler --test it synth::`; insta snapshots are in `snapshots/`,
//! named `it__<module>__<name>.snap`. Nothing here changes process-wide state (environment,
//! working directory, signal handlers): the tests run as threads of one process.

mod cost_common;
mod synth_common;

mod compile_shipped;
mod cost_bounds;
mod cost_sim;
mod cpu_model;
mod families_cube;
mod families_snapshots;
mod families_verify;
mod front_end;
mod hier_scale;
mod msccl_export;
mod multinode_quality;
mod nccl_baseline;
mod plan_quality;
mod quality;
mod screen_bound;
mod sim_golden;
mod symmetric_cost;
mod symmetric_plans;
mod symmetric_verify;
mod synth;
mod synth_alltoall;
mod synth_pareto;
