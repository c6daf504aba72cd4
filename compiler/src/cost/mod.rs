//! The cost model: a contention-aware discrete-event simulator of schedules on a topology,
//! lower bounds on what any schedule can reach, and the NCCL baseline.
//!
//! - [`model`]: the constants ([`CostModel`]), NCCL's protocol latencies and efficiencies;
//! - [`network`]: the topology as capacity-limited resources with routes ([`Network`]);
//! - [`sim`]: the simulator ([`Simulator`], [`Estimate`]);
//! - [`symmetric`]: the simulator on the template of a rank-symmetric schedule
//!   ([`Simulator::run_symmetric`], [`PreparedSymmetric`]);
//! - [`bounds`]: lower bounds ([`Bound`]);
//! - [`calibrate`]: fitting the model to measurements of one machine ([`calibrate::fit`]);
//! - [`baseline`]: what NCCL would pick and how fast that is in our model ([`Baseline`]);
//! - [`mcf`], [`packing`]: the linear programs over the simulator's routes whose optima bound
//!   AllToAll and the tree-shaped collectives (the synthesizers lower their solutions).
//!
//! One-shot entry points: [`simulate`], [`bounds`](fn@bounds) (NCCL's baseline schedule,
//! which needs the family registry, is assembled by the search: `search::baseline`).
//! For many evaluations on one topology build a [`Simulator`] once and reuse it (routes are
//! cached there).

pub mod arborescence;
pub mod baseline;
pub mod bounds;
mod buffers;
pub mod calibrate;
mod contention;
mod cpu;
mod error;
mod flow;
pub mod mcf;
pub(crate) mod memo;
pub mod model;
pub mod network;
pub mod packing;
mod path_points;
pub mod prepared;
pub mod reach;
pub mod sim;
mod steps;
pub mod symmetric;
pub mod tally;

pub use baseline::{Baseline, NcclAlgo, NcclChoice, NcclTopo};
pub use bounds::Bound;
pub use error::CostError;
pub use model::{
    CPU_LL_MESSAGE, CostModel, CpuModel, EXECUTOR_LL_BYTES, EXECUTOR_LL_SLOTS, EXECUTOR_SLOT_BYTES,
    LinkClass,
};
pub use network::{Network, Route};
pub use prepared::{Estimate, Prepared, ResourceUse, StepSpan, Timeline, Unrouted};
pub use sim::Simulator;
pub use symmetric::PreparedSymmetric;
pub use tally::{RunCounts, runs_for};

use hccl_ir::{Collective, Protocol, Schedule};
use hccl_topologies::Topology;

/// Simulates `schedule` on `topo` for a collective of `bytes` (nccl-tests size) under
/// `protocol`. Builds the resource network each call; see [`Simulator`] to reuse it.
pub fn simulate(
    topo: &Topology,
    schedule: &Schedule,
    bytes: u64,
    protocol: Protocol,
    model: &CostModel,
) -> Result<Estimate, CostError> {
    Simulator::new(Network::new(topo), model.clone()).simulate(schedule, bytes, protocol)
}

/// Lower bound on any schedule's time for `collective` of `bytes` on `topo` under the default
/// cost model.
pub fn bounds(topo: &Topology, collective: Collective, bytes: u64) -> Bound {
    bounds::bound(
        &Network::new(topo),
        &CostModel::default(),
        collective,
        bytes,
    )
}

/// Device model names of a topology, in rank order (for NCCL's architecture row).
pub fn device_models(topo: &Topology) -> Vec<String> {
    topo.spec
        .hosts
        .iter()
        .flat_map(|h| &h.devices)
        .map(|d| d.model.clone())
        .collect()
}
