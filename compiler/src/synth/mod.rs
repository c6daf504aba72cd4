//! Schedule synthesis by optimisation: schedules derived from the topology by a solver
//! rather than written by hand.
//!
//! - [`crate::cost::packing`] (re-exported here: [`grow_pool`], [`prune`], [`Packing`]): the
//!   bandwidth-optimal Broadcast and Reduce (spanning arborescences of one root) and
//!   AllGather and ReduceScatter (of every root at once): a linear program over trees of the
//!   rank graph (every ordered pair of ranks joined by its simulator route), priced by
//!   minimum-cost arborescences ([`crate::cost::arborescence`]), solved with `good_lp`
//!   (microlp) by column generation until its dual proves the packing optimal. It lives in
//!   the cost model because its optimum is also a lower bound.
//! - [`PackedTrees`]: the family that lowers a packing to chunk schedules ([`lower`]): every
//!   tree carries the same number of pieces, each as large as the tree's share of its root's
//!   rate, on channels of its own: a wider tree runs as several copies of nearly equal rates
//!   ([`copy_counts`]), since links share their bandwidth fairly among messages; pieces go
//!   round-robin over the trees so all pipelines advance together; deeper pipelines (more
//!   pieces) for larger sizes.
//! - [`packing_bound`]: the dual's proof, which [`crate::cost::bounds`] uses as a lower bound.
//! - [`allreduce`]: AllReduce over trees that carry data both ways, each owning a share
//!   of the buffer as large as its rate ([`allreduce::PackedAllReduce`]), where the ranks'
//!   ingress differs and equal blocks fall short.
//! - [`alltoall`]: AllToAll from the multi-commodity flow LP of [`crate::cost::mcf`] (split
//!   routes of every rank pair, pipelined on channels of their own): [`alltoall::FlowAllToAll`].
//!
//! A synthesizer is only a source of [`Candidate`]s: its schedules are costed by the
//! simulator, verified and chosen by the search like any hand-written family's.

pub mod allreduce;
pub mod alltoall;
pub mod cache;
pub mod disjoint;
pub mod milp;
pub mod rings;

use crate::builder::ScheduleBuilder;
use crate::cost::Network;
pub(crate) use crate::cost::memo::Memo;
pub use crate::cost::packing::{
    Direction, MAX_TREES, PackedTree, Packing, Pool, SYNTH_MAX_RANKS, SYNTH_MAX_RANKS_ALL,
    SynthError, grow_pool, pack, packing_bound, packing_of, pool, prune,
};
pub(crate) use crate::cost::packing::{PoolKey, auto_max_ranks, pool_for_topo};
use crate::families::common::{candidate, single_rank};
use crate::families::tree::Tree;
use crate::families::{Candidate, Family, FamilyParams};
use hccl_ir::{Collective, CollectiveKind, Loc, Synthesis};
use hccl_topologies::Topology;
use std::cmp::Reverse;
use std::sync::Arc;

/// Which synthesizers compete in a search (`hcclc compile --synth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SynthLevel {
    /// The hand-written families only.
    Off,
    /// Synthesizers within a time budget that keeps compiling an 8-rank machine under 2 s
    /// (release build): tree packing up to [`SYNTH_MAX_RANKS`] ranks for Broadcast and
    /// Reduce and [`SYNTH_MAX_RANKS_ALL`] for AllGather and ReduceScatter, and the MILP
    /// frontier ([`milp::MilpFrontier`]) up to [`milp::SEARCH_MAX_RANKS`] ranks, solved once
    /// per machine and then read from the synthesis cache ([`cache`]).
    #[default]
    Auto,
    /// Every synthesizer at every size it can solve: twice the rank limits of `Auto`, deeper
    /// pipelines and more channels (compiles take seconds to minutes).
    Full,
}

impl SynthLevel {
    /// Every level, in order.
    pub const ALL: [SynthLevel; 3] = [SynthLevel::Off, SynthLevel::Auto, SynthLevel::Full];

    /// The level's name (`off`, `auto`, `full`).
    pub fn name(self) -> &'static str {
        match self {
            SynthLevel::Off => "off",
            SynthLevel::Auto => "auto",
            SynthLevel::Full => "full",
        }
    }

    /// The level called `name`.
    pub fn from_name(name: &str) -> Option<SynthLevel> {
        SynthLevel::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// Pieces over all channels (pipeline depth × channels) Broadcast and Reduce are compiled
/// with; `full` adds [`DEEPEST_FULL`].
const TOTAL_PIECES: [u32; 4] = [16, 64, 256, 1024];
/// The deeper pipeline `--synth full` adds for Broadcast and Reduce.
const DEEPEST_FULL: u32 = 4096;
/// Pieces per tree AllGather and ReduceScatter are compiled with; `full` adds [`DEEPEST_ALL_FULL`].
const PIPELINES_ALL: [u32; 2] = [8, 32];
/// The deeper pipeline `--synth full` adds for AllGather and ReduceScatter.
const DEEPEST_ALL_FULL: u32 = 128;
/// Channels of the wider Broadcast and Reduce schedules (copies of the wider trees).
const WIDE_CHANNELS: u32 = 16;
/// Channels of the widest Broadcast and Reduce schedules, on machines of at least
/// [`WIDEST_MIN_RANKS`] ranks (their packings have more trees of more unequal rates to copy).
const WIDEST_CHANNELS: u32 = 32;
/// Least ranks of a machine whose Broadcast and Reduce also get [`WIDEST_CHANNELS`].
const WIDEST_MIN_RANKS: u32 = 16;
/// Pieces over all channels of the wider Broadcast and Reduce schedules.
const WIDE_PIECES: u32 = 2048;
/// Most trees a rooted packing keeps in a search; spare channels run copies of the wider
/// ones (more distinct trees lengthen the pipelines' tails more than they add rate).
const TREE_LIMIT: u32 = 8;
/// Least rate gain (factor) for which a wide rooted schedule runs more than [`TREE_LIMIT`]
/// trees: below it the [`TREE_LIMIT`] widest, copied, do as well with shallower tails.
const MORE_TREES_GAIN: f64 = 1.03;
/// Average piece size below which a packed schedule is not costed (the search leaves those
/// sizes to shallower pipelines): `pieces × channels × MIN_PIECE_BYTES` is its least size.
const MIN_PIECE_BYTES: u64 = 4096;
/// Least gain in rate over the pruned LP packings for which the link-disjoint trees of
/// [`disjoint`] are lowered too.
const DISJOINT_GAIN: f64 = 1.01;
/// Least pieces over all channels of the parameter sets that lower [`equal_packing`] too.
const EQUAL_LEAST_PIECES: u32 = 1024;
/// Pieces over all channels beyond which a schedule is costed only where its pieces are
/// at least [`DEEP_PIECE_BYTES`]: deeper pipelines win only at the largest sizes, where the
/// pipeline's fill outweighs the per-message latency.
const DEEP_PIECES: u64 = 1024;
/// Least average piece of the pipelines deeper than [`DEEP_PIECES`].
const DEEP_PIECE_BYTES: u64 = 1 << 16;
/// Most channels (all roots together) of an AllGather or ReduceScatter packing.
const MAX_CHANNELS_ALL: u32 = 32;

/// Largest rank count `collective` is packed for at `level` (twice [`auto_max_ranks`] at
/// `Full`).
pub(super) fn max_ranks(collective: Collective, level: SynthLevel) -> u32 {
    let auto = auto_max_ranks(collective);
    match level {
        SynthLevel::Off => 0,
        SynthLevel::Auto => auto,
        SynthLevel::Full => 2 * auto,
    }
}

/// `pool` pruned to `max_trees` trees per root ([`prune`]; the selection MILP is the costly
/// part), once per process.
fn pruned(key: PoolKey, pool: &Pool, max_trees: usize) -> Option<Arc<Packing>> {
    static PRUNED: Memo<(PoolKey, usize), Option<Arc<Packing>>> = Memo::new();
    PRUNED.get((key, max_trees), || {
        prune(pool, max_trees).ok().map(Arc::new)
    })
}

/// How [`disjoint`]'s packings are named ([`Packing::method`]).
pub const DISJOINT: &str = "disjoint-arborescences";

/// Whether `packing` reaches its proven bound (within the column generation's stopping gap).
pub fn reaches_bound(packing: &Packing) -> bool {
    packing.rate >= packing.bound * (1.0 - 1e-3)
}

/// Whether the link-disjoint `disjoint` packing is to be used instead of the LP's `pruned`
/// one: it reaches the bound, or carries at least 1% more.
pub fn prefer_disjoint(disjoint: &Packing, pruned: &Packing) -> bool {
    reaches_bound(disjoint) || disjoint.rate > pruned.rate * DISJOINT_GAIN
}

/// The link-disjoint arborescences of `roots` ([`disjoint`]: one root's, or every rank's
/// carried over the automorphisms) as a packing beside `pool`'s, once per process.
pub fn disjoint_packing(
    topo: &Topology,
    roots: &[u32],
    direction: Direction,
    pool: &Pool,
) -> Option<Arc<Packing>> {
    static DISJOINT_PACKINGS: Memo<PoolKey, Option<Arc<Packing>>> = Memo::new();
    DISJOINT_PACKINGS.get((topo.hash.clone(), roots.to_vec(), direction), || {
        let net = Network::new(topo);
        let (trees, rate) = match roots {
            [root] => {
                let d = disjoint::disjoint_arborescences(&net, *root, direction)?;
                let rate = d.rate();
                (d.trees, rate)
            }
            _ if roots.len() == net.nranks() as usize => {
                disjoint::every_root(topo, &net, direction)?
            }
            _ => return None,
        };
        Some(Arc::new(Packing {
            roots: roots.to_vec(),
            direction,
            rate,
            trees,
            pool_rate: pool.rate(),
            bound: pool.bound,
            pool: pool.len(),
            method: DISJOINT,
        }))
    })
}

/// How [`disjoint::equal_rate_trees`]' packings are named ([`Packing::method`]).
pub const EQUAL: &str = "equal-rate-trees";

/// Equal-rate trees of `root` at the LP's proven rate ([`disjoint::equal_rate_trees`]): the
/// fewest trees, from two, that the greedy completes (one tree only where none does), once
/// per process.
pub fn equal_packing(
    topo: &Topology,
    root: u32,
    direction: Direction,
    pool: &Pool,
) -> Option<Arc<Packing>> {
    static EQUAL_PACKINGS: Memo<PoolKey, Option<Arc<Packing>>> = Memo::new();
    EQUAL_PACKINGS.get((topo.hash.clone(), vec![root], direction), || {
        let net = Network::new(topo);
        let trees = (2..=disjoint::MAX_EQUAL_TREES)
            .chain([1])
            .find_map(|k| disjoint::equal_rate_trees(&net, root, direction, pool.bound, k))?;
        Some(Arc::new(Packing {
            roots: vec![root],
            direction,
            rate: pool.bound,
            trees,
            pool_rate: pool.rate(),
            bound: pool.bound,
            pool: pool.len(),
            method: EQUAL,
        }))
    })
}

/// Broadcast, Reduce, AllGather and ReduceScatter over an LP packing of spanning trees
/// ([`packing`]), at a [`SynthLevel`] (`Auto` by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct PackedTrees {
    pub level: SynthLevel,
}

impl PackedTrees {
    /// The family at `level`.
    pub fn at(level: SynthLevel) -> PackedTrees {
        PackedTrees { level }
    }
}

impl Family for PackedTrees {
    fn name(&self) -> &'static str {
        "packed_trees"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(
            kind,
            CollectiveKind::Broadcast
                | CollectiveKind::Reduce
                | CollectiveKind::AllGather
                | CollectiveKind::ReduceScatter
        )
    }

    /// Pieces per tree × tree limits: the LP's whole support (at most [`MAX_TREES`] per root)
    /// and the smaller limits below it.
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        let n = topo.nranks();
        if n < 2 || n > max_ranks(collective, self.level) {
            return Vec::new();
        }
        let Some((roots, direction)) = packing_of(collective, n) else {
            return Vec::new();
        };
        let Some(pool) = pool_for_topo(topo, &roots, direction) else {
            return Vec::new();
        };
        let support = (pool.support() as u32).clamp(1, MAX_TREES as u32);
        let mut out = Vec::new();
        if roots.len() > 1 {
            // Channels per root: the trees alone, and twice as many (copies of the wider
            // trees), within the verifier's and executors' reach.
            let most = (MAX_CHANNELS_ALL / n).max(1);
            let channels = support.min(most);
            for &pipeline in &PIPELINES_ALL {
                out.push(FamilyParams { channels, pipeline });
            }
            if self.level == SynthLevel::Full {
                out.push(FamilyParams {
                    channels,
                    pipeline: DEEPEST_ALL_FULL,
                });
            }
        } else {
            // Pieces per channel for the same piece counts in all; the wider budget (copies
            // of the wider trees) only for the deepest pipeline ([`WIDE_PIECES`]), costed at
            // the large sizes where it matters.
            for &total in &TOTAL_PIECES {
                out.push(FamilyParams {
                    channels: TREE_LIMIT,
                    pipeline: (total / TREE_LIMIT).max(1),
                });
            }
            out.push(FamilyParams {
                channels: WIDE_CHANNELS,
                pipeline: WIDE_PIECES / WIDE_CHANNELS,
            });
            if n >= WIDEST_MIN_RANKS {
                out.push(FamilyParams {
                    channels: WIDEST_CHANNELS,
                    pipeline: WIDE_PIECES / WIDEST_CHANNELS,
                });
            }
            if self.level == SynthLevel::Full {
                out.push(FamilyParams {
                    channels: WIDE_CHANNELS,
                    pipeline: DEEPEST_FULL / WIDE_CHANNELS,
                });
            }
        }
        out
    }

    /// For `params.channels` channels per root: the packing pruned to as many trees as
    /// channels (and, for rooted collectives, also to [`TREE_LIMIT`]), the wider trees copied
    /// onto the spare channels, lowered with `params.pipeline` pieces per tree.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let n = topo.nranks();
        if n == 1 && self.supports(collective.kind()) {
            return single_rank(self.name(), collective, in_place, params);
        }
        if n > max_ranks(collective, self.level) {
            return Vec::new();
        }
        let Some((roots, direction)) = packing_of(collective, n) else {
            return Vec::new();
        };
        let Some(pool) = pool_for_topo(topo, &roots, direction) else {
            return Vec::new();
        };
        let channels = params.channels.max(1);
        // Beyond TREE_LIMIT channels, two ways to fill them: more trees (closer to the LP
        // rate), or the TREE_LIMIT widest trees copied (fewer, shallower pipelines sharing
        // links fairly); which wins depends on the machine.
        let most = channels
            .min(MAX_TREES as u32)
            .min(pool.support() as u32)
            .max(1);
        let mut limits = vec![most];
        if roots.len() == 1 && most > TREE_LIMIT {
            limits.push(TREE_LIMIT);
        }
        let key = (topo.hash.clone(), roots.clone(), direction);
        // Link-disjoint trees of a single root: where they reach the LP's proven optimum,
        // they alone (no pruning of the LP's support, whose selection MILP is the costly
        // part of a compile); else beside the pruned packings where they carry more.
        let disjoint = disjoint_packing(topo, &roots, direction, &pool);
        let mut packings: Vec<Arc<Packing>> = match &disjoint {
            Some(d) if reaches_bound(d) => Vec::new(),
            _ => limits
                .iter()
                .filter_map(|&limit| pruned(key.clone(), &pool, limit as usize))
                .collect(),
        };
        // More trees only where they add rate enough to pay for their tails and copies.
        if let [wide, few] = packings.as_slice()
            && wide.rate < few.rate * MORE_TREES_GAIN
        {
            packings.remove(0);
        }
        if let Some(d) = &disjoint
            && packings.iter().all(|p| prefer_disjoint(d, p))
        {
            packings.push(d.clone());
        }
        // Equal-rate trees at the proven rate beside the LP's, for the deep pipelines of
        // the largest sizes (at 1–64 MiB the LP's fewer, shallower trees predict faster).
        if let [root] = roots.as_slice()
            && !disjoint.as_deref().is_some_and(reaches_bound)
            && channels * params.pipeline >= EQUAL_LEAST_PIECES
            && let Some(e) = equal_packing(topo, *root, direction, &pool)
        {
            packings.push(e);
        }

        let mut out = Vec::new();
        for packing in packings {
            // Rooted collectives: the parameters' pieces over all channels, shared by the
            // copies the trees get (fewer copies, deeper pipelines, for the same steps).
            let pieces = if roots.len() == 1 {
                let copies = channels_for(&packing, channels).max(1);
                (params.pipeline * channels / copies).max(1)
            } else {
                params.pipeline
            };
            // Every tree of a root gets a channel, however few the parameters ask for.
            let per_root = packing.trees_of(roots[0]).count() as u32;
            let budget = if packing.method == DISJOINT {
                channels.max(per_root)
            } else {
                channels
            };
            out.extend(lower(
                self.name(),
                &packing,
                collective,
                pieces,
                budget,
                in_place,
            ));
        }
        out
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        let roots = match collective.kind() {
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter => n,
            _ => 1,
        };
        let trees = u64::from(params.channels.max(1));
        Some(roots * trees * u64::from(params.pipeline) * 2 * n.saturating_sub(1))
    }
}

/// `units` chunk units shared among trees of the given rates so that the slowest tree
/// finishes first: each unit goes to the tree that would finish its load soonest with it
/// (`(w + 1) / rate` least), which is optimal for unit loads on machines of different
/// speeds. A tree too slow to deserve a unit gets none.
pub fn piece_widths(rates: &[f64], units: u32) -> Vec<u32> {
    let mut widths = vec![0u32; rates.len()];
    if !rates.iter().any(|r| r.is_finite() && *r > 0.0) {
        return widths;
    }
    for _ in 0..units {
        let best = (0..rates.len())
            .filter(|&t| rates[t].is_finite() && rates[t] > 0.0)
            .min_by(|&a, &b| {
                (f64::from(widths[a] + 1) / rates[a])
                    .total_cmp(&(f64::from(widths[b] + 1) / rates[b]))
                    .then(a.cmp(&b))
            });
        if let Some(t) = best {
            widths[t] += 1;
        }
    }
    widths
}

/// Most spread of the copies' rates (widest copy / narrowest) [`copy_counts`] settles for
/// when fewer copies reach it than the budget allows.
pub const COPY_SPREAD: f64 = 1.1;

/// Copies of every tree (channels running it, each with an equal part of its width) for at
/// most `budget` channels per root, chosen so that every copy carries nearly the same rate.
/// Links share their bandwidth fairly among the messages crossing them, so trees owed
/// unequal rates, sharing a link, would otherwise get equal shares of it: a tree owed three
/// times another's rate gets it by running as three flows of the same rate, not one. The
/// copies are `round(w / u)` (at least one) for a unit `u`: the fewest copies whose rates
/// spread by at most [`COPY_SPREAD`], else the least spread within the budget.
pub fn copy_counts(widths: &[u32], budget: u32) -> Vec<u32> {
    let ones: Vec<u32> = widths.iter().map(|&w| u32::from(w > 0)).collect();
    let widest = widths.iter().copied().max().unwrap_or(0);
    if widest == 0 || budget <= ones.iter().sum::<u32>() {
        return ones;
    }
    let spread = |copies: &[u32]| -> f64 {
        let per = widths
            .iter()
            .zip(copies)
            .filter(|(w, _)| **w > 0)
            .map(|(&w, &c)| f64::from(w) / f64::from(c));
        let (lo, hi) = per.fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
            (lo.min(r), hi.max(r))
        });
        hi / lo
    };
    let mut best = (spread(&ones), ones);
    for k in 2..=budget.min(widest) {
        let unit = f64::from(widest) / f64::from(k);
        let copies: Vec<u32> = widths
            .iter()
            .map(|&w| {
                if w == 0 {
                    0
                } else {
                    ((f64::from(w) / unit).round() as u32).clamp(1, w)
                }
            })
            .collect();
        if copies.iter().sum::<u32>() > budget {
            break;
        }
        let s = spread(&copies);
        if s < best.0 * (1.0 - 1e-9) {
            best = (s, copies);
        }
        if best.0 <= COPY_SPREAD {
            break;
        }
    }
    best.1
}

/// Channels (tree copies, [`copy_counts`]) the busiest root of `packing` runs on with at
/// most `budget` per root.
pub fn channels_for(packing: &Packing, budget: u32) -> u32 {
    let units = resolution(packing);
    packing
        .roots
        .iter()
        .map(|&root| {
            let rates: Vec<f64> = packing.trees_of(root).map(|t| t.rate).collect();
            copy_counts(&piece_widths(&rates, units), budget)
                .iter()
                .sum::<u32>()
        })
        .max()
        .unwrap_or(0)
}

/// Chunk units a root's buffer may be cut into per piece, least first: a tree's piece spans
/// its share of them ([`piece_widths`] of the trees' rates), so one root's buffer is
/// `pieces × resolution` chunks. [`resolution`] picks the least that rounds the shares
/// closely enough.
pub const RESOLUTIONS: [u32; 5] = [64, 128, 256, 512, 1024];
/// Most slowdown the rounding of the trees' shares to whole chunk units may cost: the
/// slowest tree finishes its whole-unit share this much later than exact shares would.
pub const ROUNDING_LOSS: f64 = 1.005;

/// How much later than with exact shares the slowest of trees of `rates` finishes when each
/// gets `units` chunk units by [`piece_widths`] (1 = no loss).
pub fn rounding_loss(rates: &[f64], units: u32) -> f64 {
    let total: f64 = rates.iter().filter(|r| r.is_finite() && **r > 0.0).sum();
    if total <= 0.0 || units == 0 {
        return f64::INFINITY;
    }
    piece_widths(rates, units)
        .iter()
        .zip(rates)
        .filter(|(w, _)| **w > 0)
        .map(|(&w, &r)| f64::from(w) / f64::from(units) * total / r)
        .fold(1.0, f64::max)
}

/// The least of [`RESOLUTIONS`] whose rounding of every root's tree shares costs at most
/// [`ROUNDING_LOSS`] (the finest otherwise).
pub fn resolution(packing: &Packing) -> u32 {
    let finest = RESOLUTIONS[RESOLUTIONS.len() - 1];
    RESOLUTIONS
        .into_iter()
        .find(|&units| {
            packing.roots.iter().all(|&root| {
                let rates: Vec<f64> = packing.trees_of(root).map(|t| t.rate).collect();
                rounding_loss(&rates, units) <= ROUNDING_LOSS
            })
        })
        .unwrap_or(finest)
}

/// Lowers a packing to a schedule in which every tree carries `pieces` pieces (see the
/// module docs). A tree's pieces are as large as its share of the root's rate: every tree
/// then spends the same time per piece on each hop, so all pipelines fill and drain
/// together (equal-sized pieces would leave a slow tree's few large pieces trailing). The
/// whole buffer is shared for Broadcast and Reduce, each rank's block for AllGather and
/// ReduceScatter.
pub fn lower(
    name: &str,
    packing: &Packing,
    collective: Collective,
    pieces: u32,
    copies_per_root: u32,
    in_place: bool,
) -> Vec<Candidate> {
    let n = packing.trees.first().map_or(0, |t| t.parents.len()) as u32;
    let expected = packing_of(collective, n);
    if n == 0
        || pieces == 0
        || expected.as_ref().map(|(r, d)| (r, *d)) != Some((&packing.roots, packing.direction))
    {
        return Vec::new();
    }
    let units = resolution(packing);
    let per_root_chunks = pieces * units;
    let rank_of: Vec<u32> = (0..n).collect();
    // Tree t of a root owns that root's chunks pieces·off .. pieces·(off + width): piece j
    // is the `width` chunks from pieces·off + j·width.
    struct Owned {
        root: u32,
        tree: Tree,
        channel: u32,
        off: u32,
        width: u32,
    }
    // Every tree has a channel of its own: trees of different roots on one channel would
    // share a stream on every rank they both pass through, and serialise.
    let mut owned: Vec<Owned> = Vec::new();
    for &root in &packing.roots {
        let mine: Vec<&PackedTree> = packing.trees_of(root).collect();
        let rates: Vec<f64> = mine.iter().map(|t| t.rate).collect();
        let widths = piece_widths(&rates, units);
        let copies = copy_counts(&widths, copies_per_root);
        let mut off = 0;
        for ((tree, &width), &copies) in mine.iter().zip(&widths).zip(&copies) {
            if width == 0 || copies == 0 {
                continue;
            }
            let vp: Vec<Option<usize>> =
                tree.parents.iter().map(|p| p.map(|u| u as usize)).collect();
            let Some(mut tree) = Tree::from_parents(&vp, &rank_of) else {
                return Vec::new();
            };
            critical_first(&mut tree, packing.direction);
            for c in 0..copies {
                let w = width / copies + u32::from(c < width % copies);
                let channel = owned.len() as u32;
                owned.push(Owned {
                    root,
                    tree: tree.clone(),
                    channel,
                    off,
                    width: w,
                });
                off += w;
            }
        }
    }
    let chunks = if packing.roots.len() > 1 {
        n * per_root_chunks
    } else {
        per_root_chunks
    };
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    match (collective, in_place) {
        (Collective::Broadcast { root }, false) => {
            b.copy((root, Loc::input(0)), (root, Loc::output(0)), chunks, 0);
        }
        (Collective::AllGather, false) => {
            for r in 0..n {
                b.copy(
                    (r, Loc::input(0)),
                    (r, Loc::output(r * per_root_chunks)),
                    per_root_chunks,
                    0,
                );
            }
        }
        _ => {}
    }
    for j in 0..pieces {
        for o in &owned {
            let k = pieces * o.off + j * o.width;
            let (w, ch) = (o.width, o.channel);
            match collective {
                Collective::Broadcast { .. } => {
                    down_piece(&mut b, &o.tree, Loc::input(k), Loc::output(k), w, ch);
                }
                Collective::Reduce { .. } => {
                    up_piece(&mut b, &o.tree, Loc::input(k), Loc::output(k), w, ch);
                }
                Collective::AllGather => {
                    let src = b.input_loc(o.root, k);
                    let dst = Loc::output(o.root * per_root_chunks + k);
                    down_piece(&mut b, &o.tree, src, dst, w, ch);
                }
                Collective::ReduceScatter => {
                    let src = Loc::input(o.root * per_root_chunks + k);
                    let out = b.output_loc(o.root, k);
                    up_piece(&mut b, &o.tree, src, out, w, ch);
                }
                _ => return Vec::new(),
            }
        }
    }
    let params = FamilyParams {
        channels: owned.len() as u32,
        pipeline: pieces,
    };
    let total = u64::from(pieces) * owned.len() as u64;
    let min_bytes = total
        * if total > DEEP_PIECES {
            DEEP_PIECE_BYTES
        } else {
            MIN_PIECE_BYTES
        };
    let record = record(packing);
    candidate(name, params, b)
        .into_iter()
        .map(|c| c.from_bytes(min_bytes).synthesized(record.clone()))
        .collect()
}

/// Orders every rank's children so that the critical path goes first: a rank relays a
/// piece to its children one after another on its channel, so down a tree (Broadcast) the
/// child with the deepest subtree is sent to first; up a tree (Reduce) it is received from
/// last, as its partial sum is the last to arrive.
pub(super) fn critical_first(tree: &mut Tree, direction: Direction) {
    let mut height = vec![0u32; tree.parent.len()];
    for &v in tree.top_down.iter().rev() {
        if let Some(p) = tree.parent[v as usize] {
            height[p as usize] = height[p as usize].max(height[v as usize] + 1);
        }
    }
    for cs in &mut tree.children {
        match direction {
            Direction::FromRoot | Direction::Both => {
                cs.sort_by_key(|&c| (Reverse(height[c as usize]), c))
            }
            Direction::ToRoot => cs.sort_by_key(|&c| (height[c as usize], c)),
        }
    }
    // `top_down` stays valid: every parent still precedes its children.
}

/// What a plan entry records of a packing: the rate its kept trees reach against the LP's
/// proven optimum.
pub fn record(packing: &Packing) -> Synthesis {
    let what = match (packing.roots.len() > 1, packing.direction) {
        (false, Direction::FromRoot) => "the root's data reaches every rank",
        (false, Direction::ToRoot) => "every rank's data is reduced into the root",
        (true, Direction::FromRoot) => "each rank's block reaches every other rank",
        (true, Direction::ToRoot) => "each block is reduced from every rank into its owner",
        (_, Direction::Both) => "every rank's data is reduced up a tree and sent back down it",
    };
    Synthesis {
        method: packing.method.into(),
        objective: match packing.method {
            DISJOINT => format!("the most link-disjoint spanning trees over which {what}"),
            EQUAL => format!(
                "trees of equal rate, at the LP's proven optimum together, over which {what}"
            ),
            _ => format!(
                "maximise the rate at which {what}, over spanning trees of the simulator's routes"
            ),
        },
        value: packing.rate,
        optimum: packing.bound,
        unit: "GB/s".into(),
        proven: packing.pool_rate >= packing.bound * (1.0 - 1e-3),
    }
}

/// One piece of `count` chunks down `tree`: the root sends `src`, every other rank stores it
/// at `dst` and forwards it to its children.
pub(super) fn down_piece(
    b: &mut ScheduleBuilder,
    tree: &Tree,
    src: Loc,
    dst: Loc,
    count: u32,
    channel: u32,
) {
    for &v in &tree.top_down {
        let cs = &tree.children[v as usize];
        match tree.parent[v as usize] {
            None => {
                for &c in cs {
                    b.send(v, c, src, count, channel);
                }
            }
            Some(p) => match cs.split_first() {
                None => b.recv(v, p, dst, count, channel),
                Some((&c0, rest)) => {
                    b.recv_copy_send(v, p, c0, dst, count, channel);
                    for &c in rest {
                        b.send(v, c, dst, count, channel);
                    }
                }
            },
        }
    }
}

/// One piece of `count` chunks up `tree`: every rank adds its `src` to what its children
/// send and passes the sum to its parent (accumulating in scratch when it has several
/// children); the root stores the total at `out`.
pub(super) fn up_piece(
    b: &mut ScheduleBuilder,
    tree: &Tree,
    src: Loc,
    out: Loc,
    count: u32,
    channel: u32,
) {
    for &v in tree.top_down.iter().rev() {
        let cs = tree.children[v as usize].clone();
        let Some((&last, before)) = cs.split_last() else {
            if let Some(p) = tree.parent[v as usize] {
                b.send(v, p, src, count, channel);
            }
            continue;
        };
        match tree.parent[v as usize] {
            None => {
                for (i, &c) in cs.iter().enumerate() {
                    let from = if i == 0 { src } else { out };
                    b.recv_reduce_copy(v, c, from, out, count, channel);
                }
            }
            Some(p) if before.is_empty() => b.recv_reduce_send(v, last, p, src, count, channel),
            Some(p) => {
                let acc = b.scratch(v, count);
                for (i, &c) in before.iter().enumerate() {
                    let from = if i == 0 { src } else { acc };
                    b.recv_reduce_copy(v, c, from, acc, count, channel);
                }
                b.recv_reduce_send(v, last, p, acc, count, channel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_follow_rates_and_add_up() {
        assert_eq!(piece_widths(&[1.0, 1.0], 16), vec![8, 8]);
        assert_eq!(piece_widths(&[3.0, 1.0], 16), vec![12, 4]);
        let w = piece_widths(&[5.0, 0.1, 0.1], 10);
        assert_eq!(w.iter().sum::<u32>(), 10);
        // The slow trees would finish last with a unit of their own.
        assert_eq!(w, vec![10, 0, 0]);
        // Nothing to share over: no widths.
        assert_eq!(piece_widths(&[0.0, f64::NAN], 4), vec![0, 0]);
        // The finishing time max(w / rate) is the least any split reaches (brute force).
        let rates = [7.0, 3.0, 2.5, 0.4];
        let w = piece_widths(&rates, 9);
        let time = |w: &[u32]| {
            w.iter()
                .zip(&rates)
                .map(|(&w, r)| f64::from(w) / r)
                .fold(0.0, f64::max)
        };
        let mut best = f64::INFINITY;
        for a in 0..=9u32 {
            for b in 0..=9 - a {
                for c in 0..=9 - a - b {
                    best = best.min(time(&[a, b, c, 9 - a - b - c]));
                }
            }
        }
        assert!((time(&w) - best).abs() < 1e-12, "{w:?}");
    }
}
