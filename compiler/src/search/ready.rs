//! A candidate prepared once and simulated at any size ([`Ready`]).

use crate::cost::{CostError, Estimate, Prepared, PreparedSymmetric, Simulator};
use crate::families::Candidate;
use hccl_ir::Protocol;

/// A candidate ready to simulate at any size: its whole schedule, or (a template candidate)
/// its template, costed as one rank class ([`Simulator::run_symmetric`]).
/// A template whose translations do not map the network onto itself
/// ([`PreparedSymmetric::is_equivariant`]: some rank's translate sees other links) is costed
/// on its expansion instead.
pub(super) enum Ready {
    Full(Box<Prepared>),
    Template(PreparedSymmetric),
}

impl Ready {
    pub(super) fn new(sim: &Simulator, c: &Candidate) -> Result<Ready, CostError> {
        if let Some(t) = &c.template {
            let p = sim.prepare_symmetric(t)?;
            if p.is_equivariant() {
                return Ok(Ready::Template(p));
            }
        }
        let whole = c.expanded().ok_or(CostError::TooLarge {
            steps: c.step_count() as usize,
        })?;
        sim.prepare(&whole).map(|p| Ready::Full(Box::new(p)))
    }

    /// Steps one simulation walks.
    pub(super) fn step_count(&self) -> usize {
        match self {
            Ready::Full(p) => p.step_count(),
            Ready::Template(p) => p.step_count(),
        }
    }

    pub(super) fn run(
        &self,
        sim: &Simulator,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        match self {
            Ready::Full(p) => sim.run(p, bytes, protocol),
            Ready::Template(p) => sim.run_symmetric(p, bytes, protocol),
        }
    }

    /// [`Ready::run`], given up past `limit_us` (`Ok(None)`; [`Simulator::run_within`]; a
    /// template run is cheap and always runs to its end, then compared with the limit); with
    /// the run's course when `course` holds
    /// ([`Estimate::course`](crate::cost::Estimate::course)).
    pub(super) fn run_within(
        &self,
        sim: &Simulator,
        (bytes, protocol): (u64, Protocol),
        limit_us: f64,
        course: bool,
    ) -> Result<Option<Estimate>, CostError> {
        match self {
            Ready::Full(p) => sim.run_limited(p, (bytes, protocol), limit_us, course),
            Ready::Template(p) => sim
                .run_symmetric_noting(p, (bytes, protocol), course)
                .map(|e| (e.time_us <= limit_us).then_some(e)),
        }
    }

    /// The time (µs) at `bytes` under `protocol`, or infinity when the run fails or is sure
    /// to take longer than `limit_us` ([`Simulator::run_within`]; a template run is cheap
    /// and always runs to its end).
    pub(super) fn time_within(
        &self,
        sim: &Simulator,
        bytes: u64,
        protocol: Protocol,
        limit_us: f64,
    ) -> f64 {
        let estimate = match self {
            Ready::Full(p) => sim.run_within(p, bytes, protocol, limit_us),
            Ready::Template(p) => sim.run_symmetric(p, bytes, protocol).map(Some),
        };
        match estimate {
            Ok(Some(e)) => e.time_us,
            Ok(None) | Err(_) => f64::INFINITY,
        }
    }
}
