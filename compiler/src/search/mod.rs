//! The search: for every collective and message-size bucket, the fastest verified schedule.
//!
//! For each collective, candidates are every built-in family ([`all_families`]) × its
//! parameter space, plus the external candidates of [`Options::extra`] (imported
//! algorithms, synthesizers). Each candidate schedule is generated once, flattened once
//! ([`Simulator::prepare`]) and simulated under each protocol at every bucket's lower edge.
//! Large schedules are simulated at a geometric subsample of the sizes and interpolated
//! linearly in between (see [`Options::sim_budget`]); small ones at every size. Where an
//! interpolated time is close to a size's best, the size is simulated after all before the
//! winner is picked (`refine`), so a chord across sizes far apart does not decide it.
//!
//! Winners are chosen by predicted time; ties go to the earlier candidate (family registry
//! order, then parameter order, then extras in the order given) and protocol (LL, LL128,
//! Simple), so the same input always gives a byte-identical plan. Every emitted schedule is
//! checked with [`hccl_ir::verify::verify`]; a candidate that fails is dropped and the buckets
//! it won are decided again. Adjacent buckets with the same winner become one [`PlanEntry`]
//! with a [`CostFit`] through the predictions at its ends. The first entry of a collective
//! starts at 0 bytes and the last is unbounded, so a plan answers every size.
//!
//! Rooted collectives (Broadcast, Reduce) are compiled for root 0.
//!
//! The NCCL baseline's schedules (`ring`, `tree`, `pairwise`) are candidates too, so a winner is
//! never slower than the baseline under the model, as long as those schedules fit
//! [`MAX_CANDIDATE_STEPS`]. Schedules over that cap (ranks² families on large topologies,
//! e.g. the ring from about 512 ranks) are not generated; where NCCL's chosen family was
//! capped, the baseline's time is NCCL's own predicted time ([`NcclTopo::predict`]) and the
//! winner is compared with that (it can then be slower). So it is where even the family's
//! cheapest schedule is too large to simulate at [`BASELINE_MIN_SAMPLES`] sizes within the
//! per-candidate budget ([`modelled_baselines`]: the double binary tree from about 2048
//! ranks): its schedules then still compete, screened like any other family's, but the
//! baseline is NCCL's formula, marked as such in the rows ([`Row::baseline_modelled`]).
//!
//! Candidates are costed and winners verified on all available cores; results are collected
//! in candidate order, so the plan does not depend on the thread count.
//!
//! The search is a pipeline of named phases per collective ([`pipeline`]): `generate`
//! (families × parameters, [`generate`]), `screen` ([`screen`]), `cost` ([`costing`]),
//! `refine` ([`refine`]), `select and verify` ([`select`]) and `emit` (rows and entries,
//! [`emit`]). Each reports the candidates it took and handed on, its wall time and why
//! candidates stopped ([`SearchReport`], returned in [`CompiledPlan::report`]);
//! `HCCL_SEARCH_TRACE=1` prints the phases and every candidate as they go. The family
//! registry ([`registry`]) and NCCL's baseline ([`nccl`]) live here, above the families and
//! the cost model they combine.

mod context;
mod costing;
mod emit;
mod evaluate;
mod generate;
mod nccl;
mod options;
mod par;
mod pipeline;
pub mod plan_cache;
mod ready;
mod refine;
mod registry;
mod report;
mod row;
mod screen;
mod select;
#[cfg(test)]
mod tests;

pub use costing::{SCALE_RANKS, sim_budget};
pub use evaluate::{evaluate_plan, evaluate_schedule};
pub use generate::{FALLBACK_CANDIDATE_STEPS, MAX_CANDIDATE_STEPS};
pub use nccl::{BASELINE_MIN_SAMPLES, baseline, modelled_baselines, nccl_channels};
pub use options::{
    DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, Options, Progress, ROOT, SearchError, collective_of,
    geometric_sizes,
};
pub use par::par_map;
pub use pipeline::{compile, compile_to_text, compile_with_progress};
pub use registry::{all_families, families_for, generate_with};
pub use report::{CollectiveReport, Phase, PhaseReport, SearchReport, Stop, StopReason};
pub use row::{CompiledPlan, Row};
pub use screen::SCREEN_RANKS;
