//! The hccl compiler: schedule families, a contention-aware cost model and the search that
//! picks the best schedule per collective and message-size range.

pub mod builder;
pub mod clock;
pub mod cost;
pub mod families;
pub mod lp;
pub mod plot;
pub mod report;
pub mod search;
pub mod synth;
