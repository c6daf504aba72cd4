//! What a compile returns: the plan, its rows ([`Row`], one per collective and size) and the
//! search's report.

use super::options::SearchError;
use super::report::SearchReport;
use crate::families::FamilyParams;
use hccl_ir::{CollectiveKind, PlanFile, Protocol, Synthesis};

/// One line of the compile table: the winner at one size, with the baseline and the bound.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub collective: CollectiveKind,
    /// Size (bytes, nccl-tests convention): the bucket's lower edge.
    pub bytes: u64,
    pub algorithm: String,
    pub params: FamilyParams,
    /// Channels the schedule uses.
    pub channels: u32,
    /// Chunks the buffer is cut into.
    pub chunks: u32,
    pub protocol: Protocol,
    /// Predicted time (µs).
    pub predicted_us: f64,
    /// NCCL's algorithm family (`None` when it is not available here).
    pub baseline_algorithm: Option<String>,
    /// Its protocol.
    pub baseline_protocol: Option<Protocol>,
    /// Its time in our model (µs).
    pub baseline_us: Option<f64>,
    /// Whether `baseline_us` is NCCL's own tuning-model time ([`NcclChoice::nccl_model_us`](crate::cost::NcclChoice::nccl_model_us))
    /// rather than our simulation of its algorithm: where its family was over the step cap
    /// or too large to simulate at enough sizes ([`modelled_baselines`](super::modelled_baselines)).
    pub baseline_modelled: bool,
    /// Lower bound (µs).
    pub bound_us: f64,
    /// Number of ranks (for bus bandwidth).
    pub nranks: u32,
    /// How a synthesizer found the schedule, when one did.
    pub synthesis: Option<Synthesis>,
}

impl Row {
    /// Algorithm bandwidth (GB/s): bytes / time.
    pub fn algbw_gbps(&self) -> f64 {
        if self.predicted_us > 0.0 {
            self.bytes as f64 / (self.predicted_us * 1e3)
        } else {
            0.0
        }
    }

    /// Bus bandwidth (GB/s), nccl-tests convention.
    pub fn busbw_gbps(&self) -> f64 {
        self.algbw_gbps() * self.collective.busbw_factor(self.nranks)
    }

    /// Baseline time over ours (> 1 means we are faster).
    pub fn speedup(&self) -> Option<f64> {
        self.baseline_us
            .filter(|_| self.predicted_us > 0.0)
            .map(|b| b / self.predicted_us)
    }

    /// Our time over the lower bound (≥ 1).
    pub fn bound_ratio(&self) -> f64 {
        if self.bound_us > 0.0 {
            self.predicted_us / self.bound_us
        } else {
            1.0
        }
    }
}

/// The result of a compilation.
#[derive(Debug, Clone)]
pub struct CompiledPlan {
    pub plan: PlanFile,
    /// One row per collective and size, in [`Options::collectives`](super::Options::collectives) × size order.
    pub rows: Vec<Row>,
    /// With [`Options::partial`](super::Options::partial): the collectives left out, each
    /// with why.
    pub skipped: Vec<SearchError>,
    /// What the search did, phase by phase (see [`SearchReport`]).
    pub report: SearchReport,
}
