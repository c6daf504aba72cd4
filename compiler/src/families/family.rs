//! What every family shares with the search: the [`Family`] trait, its [`FamilyParams`],
//! and the [`Candidate`] through which any schedule (built-in, imported, synthesized) enters
//! the search.

use hccl_ir::{Collective, CollectiveKind, Schedule, SymmetricSchedule, Symmetry, Synthesis};
use hccl_topologies::Topology;
use std::sync::Arc;

/// Knobs a family is asked to generate for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FamilyParams {
    /// Parallel channels (independent rings/trees each carrying a share of the data).
    pub channels: u32,
    /// Pipelining depth: how many pieces each logical block is cut into.
    pub pipeline: u32,
}

/// A schedule offered to the search, with what produced it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Family (or imported algorithm) name, e.g. `ring`, `double_ring`, `hybrid_cube`.
    pub algorithm: String,
    /// Parameters it was generated with.
    pub params: FamilyParams,
    pub schedule: Schedule,
    /// A rank symmetry the schedule is claimed to have (see [`hccl_ir::Symmetry`]): the plan
    /// file stores the schedule as one template program when it really is invariant under
    /// it ([`hccl_ir::PlanEntry::is_compact`]), else in full. `None`: store in full.
    pub symmetry: Option<Symmetry>,
    /// Smallest size (bytes) the search costs the candidate at: below it the schedule's
    /// pieces are too small to compete (a deep pipeline of a few bytes per piece), and it is
    /// not simulated there. 0 for every size.
    pub min_bytes: u64,
    /// How a synthesizer found the schedule (recorded in the plan entry); `None` for
    /// hand-written families and imported algorithms.
    pub synthesis: Option<Synthesis>,
    /// The schedule as its template alone, for candidates generated that way
    /// ([`Family::template`], large rank counts): `schedule` then holds the header with
    /// every program empty, and [`Candidate::expanded`] instantiates the whole schedule.
    pub template: Option<Arc<SymmetricSchedule>>,
}

impl Candidate {
    /// A candidate from outside the built-in families: a plan entry (an imported MSCCL
    /// algorithm, a plan file's entry, an algorithm written in the Python language), competing
    /// under its own name for the collective it implements. Verify it first: the search
    /// trusts its candidates.
    pub fn imported(entry: hccl_ir::PlanEntry) -> Candidate {
        Candidate {
            algorithm: entry.algorithm,
            params: FamilyParams {
                channels: entry.schedule.channel_count().max(1),
                pipeline: 1,
            },
            schedule: entry.schedule,
            symmetry: entry.symmetry,
            min_bytes: 0,
            synthesis: None,
            template: None,
        }
    }

    /// Steps over all ranks (the template's times the ranks for a template candidate).
    pub fn step_count(&self) -> u64 {
        match &self.template {
            Some(t) => t.template_step_count() as u64 * u64::from(t.nranks),
            None => self.schedule.step_count() as u64,
        }
    }

    /// Steps a simulation or verification of the candidate walks: one rank's for a template
    /// candidate (costed and verified on the template), every rank's otherwise.
    pub fn work_steps(&self) -> u64 {
        match &self.template {
            Some(t) => t.template_step_count() as u64,
            None => self.schedule.step_count() as u64,
        }
    }

    /// Channels the schedule uses.
    pub fn channel_count(&self) -> u32 {
        match &self.template {
            Some(t) => {
                let mut chans: Vec<u32> = t.template.streams.iter().map(|s| s.channel).collect();
                chans.sort_unstable();
                chans.dedup();
                chans.len() as u32
            }
            None => self.schedule.channel_count(),
        }
    }

    /// The whole schedule: `schedule` itself, or the template expanded (`None` when the
    /// expansion is refused as too large, see [`hccl_ir::MAX_EXPANDED_STEPS`]).
    pub fn expanded(&self) -> Option<std::borrow::Cow<'_, Schedule>> {
        match &self.template {
            Some(t) => t.expand().ok().map(std::borrow::Cow::Owned),
            None => Some(std::borrow::Cow::Borrowed(&self.schedule)),
        }
    }

    /// Verifies the candidate: on its template ([`hccl_ir::verify::verify_symmetric`]) when
    /// it is one or compresses under its claimed symmetry, on the whole schedule otherwise.
    pub fn verify(&self) -> Result<hccl_ir::verify::Report, Vec<hccl_ir::verify::VerifyError>> {
        match &self.template {
            Some(t) => hccl_ir::verify::verify_symmetric(t),
            None => hccl_ir::verify::verify_claimed(&self.schedule, self.symmetry.as_ref()),
        }
    }

    /// Whether the verifier can model the candidate (see
    /// [`hccl_ir::verify::check_limits_claimed`]).
    pub fn fits_verifier(&self) -> bool {
        match &self.template {
            Some(t) => hccl_ir::verify::check_limits_symmetric(t).is_ok(),
            None => hccl_ir::verify::check_limits_claimed(&self.schedule, self.symmetry.as_ref())
                .is_ok(),
        }
    }

    /// The candidate with `symmetry` claimed for its schedule.
    pub fn with_symmetry(mut self, symmetry: Option<Symmetry>) -> Candidate {
        self.symmetry = symmetry;
        self
    }

    /// The candidate with its synthesis recorded (see [`Candidate::synthesis`]).
    pub fn synthesized(mut self, synthesis: Synthesis) -> Candidate {
        self.synthesis = Some(synthesis);
        self
    }

    /// The candidate costed only from `bytes` up (see [`Candidate::min_bytes`]).
    pub fn from_bytes(mut self, bytes: u64) -> Candidate {
        self.min_bytes = bytes;
        self
    }
}

/// A family of schedules.
pub trait Family: Send + Sync {
    /// Stable name, used in plan files and `--algo`.
    fn name(&self) -> &'static str;
    /// Whether the family has a schedule for this collective at all.
    fn supports(&self, kind: CollectiveKind) -> bool;
    /// Parameter combinations worth trying on this topology (channels × pipeline depth).
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams>;
    /// The schedules of this family (possibly several embeddings) for the given parameters,
    /// written for separate (`in_place == false`) or overlapping input and output buffers;
    /// an empty vector when the family does not apply to the topology.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate>;
    /// The out-of-place [`Family::schedules`]: what the search compiles (the executor adapts
    /// a plan to either placement).
    fn generate(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Vec<Candidate> {
        self.schedules(topo, collective, params, false)
    }
    /// Roughly how many steps (over all ranks) [`Family::generate`] would produce for these
    /// parameters, without generating them; `None` when the family does not say. The search
    /// skips parameter sets whose estimate exceeds its step cap
    /// ([`crate::search::MAX_CANDIDATE_STEPS`]) before generating them, so families whose size
    /// grows as ranks² cost nothing on large topologies. The estimate should be within a
    /// small factor of the real count (the search also checks the generated schedules).
    fn estimated_steps(
        &self,
        _topo: &Topology,
        _collective: Collective,
        _params: FamilyParams,
    ) -> Option<u64> {
        None
    }
    /// The out-of-place candidates as templates alone (see [`Candidate::template`]), for
    /// families whose schedules are rank-symmetric; `None` when the family does not build
    /// templates. The search uses it from [`TEMPLATE_RANKS`] ranks on, where building,
    /// costing and verifying every rank's program is what limits the pipelines it can try.
    fn template(
        &self,
        _topo: &Topology,
        _collective: Collective,
        _params: FamilyParams,
    ) -> Option<Vec<Candidate>> {
        None
    }
    /// Roughly how many steps the template of [`Family::template`] has (one rank's), for the
    /// search's step cap; `None` when the family does not build templates.
    fn template_steps(
        &self,
        _topo: &Topology,
        _collective: Collective,
        _params: FamilyParams,
    ) -> Option<u64> {
        None
    }
}

/// From this many ranks on, the search builds, costs and verifies rank-symmetric families
/// as templates ([`Family::template`]).
pub const TEMPLATE_RANKS: u32 = 256;

/// `channels × pipeline × per_piece`: the step estimate of a family whose every channel and
/// pipeline piece costs `per_piece` steps (saturating).
pub fn steps_per_piece(params: FamilyParams, per_piece: u64) -> u64 {
    per_piece
        .saturating_mul(u64::from(params.channels.max(1)))
        .saturating_mul(u64::from(params.pipeline.max(1)))
}
