//! Executor.
