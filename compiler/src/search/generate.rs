//! The generate phase: every family's candidates under the step cap, the external ones, and
//! when nothing selectable fits the cap, the smallest schedules of the capped families.

use super::context::Search;
use super::par::par_map;
use super::report::{StopReason, traced_since, tracing};
use crate::families::{Candidate, Family, TEMPLATE_RANKS};
use hccl_ir::{Collective, CollectiveKind};
use hccl_topologies::Topology;

/// NCCL's families in our registry: the baseline needs them even when `--algo` excludes them.
pub(super) const BASELINE_FAMILIES: [&str; 3] = ["ring", "tree", "pairwise"];

/// What the generate phase hands on.
pub(super) struct Generation {
    /// The candidates, each with whether `--algo` lets it win (NCCL's families are
    /// generated for the baseline whatever `--algo` says), in family order, then the
    /// external candidates in the order given.
    pub(super) candidates: Vec<(Candidate, bool)>,
    /// NCCL's channel count: the most channels the ring family offers.
    pub(super) channels_hint: u32,
    /// Baseline families some of whose schedules were over the step cap.
    pub(super) capped: Vec<&'static str>,
    /// Families asked, and what stopped candidates (for the report).
    pub(super) families: usize,
    pub(super) stops: Vec<(StopReason, usize)>,
}

/// The generate phase for `collective`: families generate side by side (each is
/// deterministic; results in family order). `None` when cancelled.
pub(super) fn generate(search: &Search<'_>, collective: Collective) -> Option<Generation> {
    let kind = collective.kind();
    let options = search.options;
    let (topo, nranks) = (search.topo, search.topo.nranks());
    let wanted: Vec<&dyn Family> = search
        .families
        .iter()
        .map(|f| f.as_ref())
        .filter(|f| {
            f.supports(kind) && (search.allowed(f.name()) || BASELINE_FAMILIES.contains(&f.name()))
        })
        .collect();
    let generated_all = par_map(&wanted, |f| {
        if options.cancelled() {
            return Generated::default();
        }
        generate_capped(*f, topo, collective)
    });
    if options.cancelled() {
        return None;
    }
    let fits = |c: &Candidate| c.schedule.collective == collective && c.schedule.nranks == nranks;
    let mut out = Generation {
        candidates: Vec::new(),
        channels_hint: 1,
        capped: Vec::new(),
        families: wanted.len(),
        stops: Vec::new(),
    };
    let (mut left_out, mut offered_nothing) = (0, 0);
    for (family, generated) in wanted.iter().zip(generated_all) {
        let selectable = search.allowed(family.name());
        if family.name() == "ring" {
            out.channels_hint = out.channels_hint.max(generated.max_channels);
        }
        if generated.capped {
            out.capped.push(family.name());
        }
        left_out += generated.left_out;
        if generated.candidates.is_empty() && !generated.capped {
            offered_nothing += 1;
        }
        for c in generated.candidates {
            if fits(&c) {
                out.candidates.push((c, selectable));
            }
        }
    }
    for c in &options.extra {
        if fits(c) {
            out.candidates
                .push((c.clone(), search.allowed(&c.algorithm)));
        }
    }
    let fallback = fall_back(search, kind, collective, &mut out);
    let duplicates = drop_duplicates(&mut out.candidates);
    out.stops = vec![
        (StopReason::StepCap, left_out),
        (StopReason::OfferedNothing, offered_nothing),
        (StopReason::Fallback, fallback),
        (StopReason::Duplicate, duplicates),
    ];
    Some(out)
}

/// Drops every candidate that repeats an earlier one of the same family: the same schedule
/// (or template) from the least size on, equally selectable. Two parameter sets can lower to
/// one schedule (a packing too narrow for the wider channel counts falls back to the same
/// trees); the simulator is deterministic, so a repeat costs the same at every size and
/// never wins (ties go to the earlier candidate) but would be screened, costed and refined
/// again. NCCL's families stay whole: the baseline looks their parameter sets up. Returns
/// how many it dropped.
pub(super) fn drop_duplicates(candidates: &mut Vec<(Candidate, bool)>) -> usize {
    use std::hash::{Hash, Hasher};
    let fingerprint = |(c, selectable): &(Candidate, bool)| {
        let mut h = rustc_hash::FxHasher::default();
        (&c.algorithm, selectable, c.min_bytes).hash(&mut h);
        match &c.template {
            Some(t) => t.hash(&mut h),
            None => c.schedule.hash(&mut h),
        }
        h.finish()
    };
    let same = |a: &(Candidate, bool), b: &(Candidate, bool)| {
        a.1 == b.1
            && a.0.algorithm == b.0.algorithm
            && a.0.min_bytes == b.0.min_bytes
            && a.0.template == b.0.template
            && a.0.schedule == b.0.schedule
    };
    let whole = |c: &(Candidate, bool)| BASELINE_FAMILIES.contains(&c.0.algorithm.as_str());
    // Hashing walks every step (1.7M per rail family on the 4-node cluster): in parallel.
    let fingerprints = par_map(candidates, |c| (!whole(c)).then(|| fingerprint(c)));
    let mut seen: rustc_hash::FxHashMap<u64, Vec<usize>> = Default::default();
    let mut keep = vec![true; candidates.len()];
    for i in 0..candidates.len() {
        let Some(fingerprint) = fingerprints[i] else {
            continue;
        };
        let earlier = seen.entry(fingerprint).or_default();
        if earlier
            .iter()
            .any(|&j| same(&candidates[j], &candidates[i]))
        {
            keep[i] = false;
        } else {
            earlier.push(i);
        }
    }
    let before = candidates.len();
    let mut flags = keep.into_iter();
    candidates.retain(|_| flags.next().unwrap_or(true));
    before - candidates.len()
}

/// Nothing selectable under the step cap (an AllGather on a thousand ranks: every block
/// reaches every rank by a message of its own somewhere): each capped family's smallest
/// parameter set, up to the fallback cap, rather than no plan at all. Returns how many
/// candidates it added.
fn fall_back(
    search: &Search<'_>,
    kind: CollectiveKind,
    collective: Collective,
    out: &mut Generation,
) -> usize {
    if out.candidates.iter().any(|(_, selectable)| *selectable) {
        return 0;
    }
    let before = out.candidates.len();
    for family in &search.families {
        if family.supports(kind)
            && search.allowed(family.name())
            && out.capped.contains(&family.name())
        {
            for c in generate_smallest(family.as_ref(), search.topo, collective) {
                if c.schedule.collective == collective && c.schedule.nranks == search.topo.nranks()
                {
                    out.candidates.push((c, true));
                }
            }
        }
    }
    out.candidates.len() - before
}

/// Most steps (over all ranks) a built-in candidate may have. Families whose schedules grow
/// as ranks² (mesh and one-shot, rings with one chunk per rank, pairwise and Bruck
/// AllToAll) pass it somewhere between 256 and 1024 ranks and are then not generated (see
/// [`Family::estimated_steps`](crate::families::Family::estimated_steps)), so compile time
/// and plan size stop growing as ranks². Every schedule on up to 64 ranks is far below it
/// (the largest, a double ring on 64 ranks with 8 channels × 2 pieces, has 260 096 steps).
/// External candidates ([`Options::extra`](super::Options::extra)) are not capped.
pub const MAX_CANDIDATE_STEPS: u64 = 600_000;

/// Most steps of the one candidate per family the search falls back to when no family has
/// one under [`MAX_CANDIDATE_STEPS`] (see [`generate_smallest`]): an AllGather on 1024 ranks
/// (about 2M steps, 1.8 GB and half a minute to compile at one size) compiles rather than
/// fails; on 4096 ranks (about 33M) it still fails, saying so.
pub const FALLBACK_CANDIDATE_STEPS: u64 = 2_500_000;

/// What [`generate_capped`] produced for one family.
#[derive(Default)]
pub(super) struct Generated {
    /// Schedules within [`MAX_CANDIDATE_STEPS`], in parameter order.
    pub(super) candidates: Vec<Candidate>,
    /// Most channels of any parameter set offered (capped or not): NCCL's channel count.
    pub(super) max_channels: u32,
    /// Whether some parameter set or schedule was left out for its size.
    pub(super) capped: bool,
    /// How many parameter sets and schedules were left out for their size.
    pub(super) left_out: usize,
}

/// The schedules of the family's parameter set with the fewest estimated steps (the first
/// when it gives no estimate) within [`FALLBACK_CANDIDATE_STEPS`] and the verifier's limits.
pub(super) fn generate_smallest(
    family: &dyn Family,
    topo: &Topology,
    collective: Collective,
) -> Vec<Candidate> {
    let space = family.param_space(topo, collective);
    let Some(params) = space.iter().copied().min_by_key(|&p| {
        family
            .estimated_steps(topo, collective, p)
            .unwrap_or(u64::MAX)
    }) else {
        return Vec::new();
    };
    if family
        .estimated_steps(topo, collective, params)
        .is_some_and(|steps| steps > FALLBACK_CANDIDATE_STEPS)
    {
        return Vec::new();
    }
    let out: Vec<Candidate> = family
        .generate(topo, collective, params)
        .into_iter()
        .filter(|c| {
            c.schedule.step_count() as u64 <= FALLBACK_CANDIDATE_STEPS
                && hccl_ir::verify::check_limits_claimed(&c.schedule, c.symmetry.as_ref()).is_ok()
        })
        .collect();
    if tracing() {
        eprintln!(
            "trace [{:7.3} s]: fallback {} {collective} {params:?}: {} candidates",
            traced_since(),
            family.name(),
            out.len()
        );
    }
    out
}

/// The family's candidates for `collective` within [`MAX_CANDIDATE_STEPS`]: parameter sets
/// whose [`estimated_steps`](crate::families::Family::estimated_steps) exceed the cap are
/// not generated, and generated schedules over it, or over the verifier's size limits
/// ([`hccl_ir::verify::check_limits`]), are dropped.
pub(super) fn generate_capped(
    family: &dyn Family,
    topo: &Topology,
    collective: Collective,
) -> Generated {
    let mut out = Generated {
        candidates: Vec::new(),
        max_channels: 1,
        capped: false,
        left_out: 0,
    };
    let started = std::time::Instant::now();
    let space = family.param_space(topo, collective);
    // From TEMPLATE_RANKS on, symmetric families are built, costed and verified as
    // templates: the cap then applies to one rank's program.
    let templated = topo.nranks() >= TEMPLATE_RANKS
        && space
            .first()
            .is_some_and(|&p| family.template_steps(topo, collective, p).is_some());
    // Parameter sets are generated on all cores; results are taken in parameter order.
    let generated = par_map(&space, |&params| {
        let estimate = if templated {
            family.template_steps(topo, collective, params)
        } else {
            family.estimated_steps(topo, collective, params)
        };
        if estimate.is_some_and(|steps| steps > MAX_CANDIDATE_STEPS) {
            return None;
        }
        let made = if templated {
            family
                .template(topo, collective, params)
                .unwrap_or_default()
        } else {
            family.generate(topo, collective, params)
        };
        Some(
            made.into_iter()
                .map(|c| {
                    // Over the step cap, or too large for the verifier to model (which would
                    // only reject it after it had been costed).
                    let fits = c.work_steps() <= MAX_CANDIDATE_STEPS && c.fits_verifier();
                    fits.then_some(c)
                })
                .collect::<Vec<_>>(),
        )
    });
    for (params, made) in space.iter().zip(generated) {
        out.max_channels = out.max_channels.max(params.channels);
        let Some(made) = made else {
            out.capped = true;
            out.left_out += 1;
            continue;
        };
        for c in made {
            match c {
                Some(c) => out.candidates.push(c),
                None => {
                    out.capped = true;
                    out.left_out += 1;
                }
            }
        }
    }
    if tracing() {
        let steps: u64 = out.candidates.iter().map(Candidate::step_count).sum();
        eprintln!(
            "trace [{:7.3} s]: generate {} {}: {} candidates, {steps} steps, {:.3} s{}",
            traced_since(),
            family.name(),
            collective,
            out.candidates.len(),
            started.elapsed().as_secs_f64(),
            if out.capped {
                " (some over the step cap)"
            } else {
                ""
            }
        );
    }
    out
}
