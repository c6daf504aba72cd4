//! The topology crate's integration tests, one binary: each file here is a module (one link
//! of the dependency graph for all of them instead of one per file). Run one file's tests with
//! a filter on its module, `cargo test -p hccl-topologies --test it bad_files::`; insta
//! snapshots are in `snapshots/`, named `it__<module>__<name>.snap`. Nothing here changes
//! process-wide state (environment, working directory, signal handlers): the tests run as
//! threads of one process.

mod bad_files;
mod detect;
mod fuzz;
mod generators;
mod shipped;
