//! Hierarchical families: intra-host reduce-scatter, inter-host exchange among ranks with the
//! same local index (rail-aligned: local rank `i` of every host talks over its own NIC to
//! local rank `i` of the other hosts, so all rails run in parallel), intra-host all-gather.
//! AllGather and ReduceScatter use the inter-host and intra-host halves. Needs more than one
//! host, all of the same size.
//!
//! Two families share this code and differ in the rail (inter-host) phase:
//!
//! - [`Hierarchical`] (`hierarchical`): a *direct* exchange: a rank sends each rail peer the
//!   part that peer owns, and the owner folds the contributions in as they arrive —
//!   `O(hosts)` messages per rank and piece.
//! - [`HierarchicalHd`] (`hierarchical_hd`): recursive halving (reduce-scatter) and
//!   recursive doubling (all-gather) over the rail, Rabenseifner's algorithm as in Huawei
//!   HCCL's H-D: in round `k` rail position `p` exchanges one message with `p ^ 2^k`, so the
//!   rail costs `O(log hosts)` messages per rank and piece. It needs a power-of-two host
//!   count; on other counts it offers only the unpipelined parameters and
//!   [`HierarchicalHd::schedules`] falls back to the direct rail exchange (documented
//!   choice: no fold-in step).
//! - [`HierarchicalRd`] (`hierarchical_rd`, AllReduce only): recursive doubling of the
//!   whole rail share: in round `k` rail position `p` sends everything it has reduced so
//!   far to `p ^ 2^k` and folds in what that partner sends, so after `log2 hosts` rounds
//!   every rail position holds the rail's sum. Half the network rounds of halving-doubling
//!   (each one carrying the whole share instead of a halving part): the latency-bound
//!   middle sizes of large clusters, where a rail message costs several microseconds and
//!   the share is small (MPICH's choice for short AllReduce messages). Power-of-two host
//!   counts only (elsewhere it has no schedule).
//!
//! The intra-host phases are always direct: at step `i` local rank `l` sends to `l + i` and
//! receives from `l − i` (mod the host size), so no rank is incast and every rank's program
//! is the same up to translation.
//!
//! The buffer is cut into `channels × pipeline` pieces that flow through the phases in order,
//! as a software pipeline: piece `s` of every phase runs on connection `s mod channels` of
//! that phase's own channel ids, so phases never share a stream (the rail exchange of piece
//! `s` overlaps the intra-host work of piece `s + 1`), and the last piece to leave the
//! NVLink phase is one piece, so the drain after it is one piece's rail exchange.
//!
//! Chunk layout: AllReduce puts piece `s` on chunks `s·n ..` with local rank `l` owning the
//! contiguous `s·n + l·hosts ..` (one message per peer and piece) and rail host `j` owning
//! chunk `j` of that; halving-doubling halves are contiguous aligned ranges of it (one
//! message per round). AllGather and ReduceScatter have their layout fixed by the output
//! (rank `r` owns chunks `r·m ..`); piece `s` is chunk `r·m + s` of every rank `r`, so local
//! rank `l` owns the `hosts` chunks of its rail. Their halving-doubling rail phase stages the
//! rail's chunks in scratch by relative position (slot `x` holds rail position `p ^ x`), so
//! each round is one contiguous message.
//!
//! Symmetry: every rank's program is its grid translate of rank `hosts[0][0]`'s on the grid
//! `[hosts, local]` (see [`symmetry`]): peers are chosen by relative offset (`±i` for direct
//! phases, `^ 2^k` for halving-doubling), scratch slots by relative position.
//!
//! Size: per piece every rank exchanges `O(g + hosts)` messages (AllReduce, direct),
//! `O(g + log hosts)` (AllReduce, halving-doubling) or `O(nranks)` (AllGather,
//! ReduceScatter: one per chunk of its rail and local peer).

use super::common::{candidate, uniform_hosts};
use super::{Candidate, Family, FamilyParams, TEMPLATE_RANKS};
use crate::builder::ScheduleBuilder;
use hccl_ir::verify::MAX_SLOTS;
use hccl_ir::{
    Action, BlockLabel, BlockLayout, ChunkMap, Collective, CollectiveKind, Loc, Rank, RankProgram,
    SymmetricSchedule, Symmetry,
};
use hccl_topologies::Topology;
use std::sync::Arc;

/// Most chunks a direct hierarchical schedule may use (`nranks × pieces`; at least one
/// piece per rank): [`SMALL_HIER_CHUNKS`] up to [`SMALL_HIER_RANKS`] ranks, this above.
pub(super) const MAX_HIER_CHUNKS: u32 = 1024;
/// Most chunks on clusters of at most [`SMALL_HIER_RANKS`] ranks: 64 pieces at 32 ranks,
/// whose drain (about one piece) keeps a 4-node DGX H100 cluster's AllGather and
/// ReduceScatter at 1 GiB within 1.03 of the bound (1.035 and 1.029 with 32 pieces).
pub(super) const SMALL_HIER_CHUNKS: u32 = 2048;
/// Largest rank count that gets [`SMALL_HIER_CHUNKS`].
pub(super) const SMALL_HIER_RANKS: u32 = 64;

/// Most chunks a direct hierarchical schedule of `nranks` ranks may use.
pub(super) fn max_hier_chunks(nranks: u32) -> u64 {
    let cap = if nranks <= SMALL_HIER_RANKS {
        SMALL_HIER_CHUNKS
    } else {
        MAX_HIER_CHUNKS
    };
    u64::from(cap.max(nranks))
}
/// Most pieces a halving-doubling schedule may use.
const MAX_HD_PIECES: u32 = 64;
/// Most steps (roughly) a hierarchical candidate may have; larger pipelines are not offered.
pub(super) const MAX_HIER_STEPS: u64 = 600_000;
/// From [`TEMPLATE_RANKS`] ranks: most steps (roughly) of one rank's program (what the
/// search simulates and verifies)...
pub(super) const MAX_HIER_TEMPLATE_STEPS: u64 = 20_000;
/// ...and the routes costing a template computes (every translate of each of its peers:
/// the direct rail exchange has a peer per host, so it stops at a few thousand ranks)...
pub(super) const MAX_TRANSLATED_ROUTES: u64 = 1 << 22;
/// ...and of the whole schedule, which a reader of the plan file expands.
pub(super) const MAX_HIER_EXPANDED_STEPS: u64 = 1 << 23;
/// Connection counts per phase offered: one keeps pieces strictly in order (the shortest
/// drain); two let a second piece start while the first finishes, which only pays on
/// shallow pipelines (at most [`MAX_TWO_CHANNEL_PIPELINE`] pieces per connection): deeper
/// ones keep every link busy on one connection.
const CHANNELS: [u32; 2] = [1, 2];
/// Deepest pipeline offered with two connections per phase.
const MAX_TWO_CHANNEL_PIPELINE: u32 = 2;
/// Pipeline depths offered (pieces per connection) by the direct family.
pub(super) const PIPELINE: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Pipeline depths offered by the halving-doubling family: finer steps, so that on large
/// clusters the deepest pipeline under the step cap is close to it.
const PIPELINE_HD: [u32; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];
/// Pipeline depths offered by the recursive-doubling family: every rail round carries the
/// whole share, so it only competes where latency dominates and deep pipelines only add
/// rounds.
const PIPELINE_RD: [u32; 5] = [1, 2, 4, 8, 16];

/// How the rail (inter-host) phase exchanges data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rail {
    /// Every rank sends each rail peer its share directly.
    Direct,
    /// Recursive halving (reduce-scatter) and doubling (all-gather); power-of-two hosts.
    HalvingDoubling,
    /// Recursive doubling of the whole share (AllReduce); power-of-two hosts.
    RecursiveDoubling,
}

/// The hierarchical family with a direct rail exchange.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hierarchical;

/// The hierarchical family with a halving-doubling rail exchange.
#[derive(Debug, Clone, Copy, Default)]
pub struct HierarchicalHd;

/// The hierarchical AllReduce with a recursive-doubling rail exchange of the whole share.
#[derive(Debug, Clone, Copy, Default)]
pub struct HierarchicalRd;

/// Ranks of the schedule's hosts and rails, and how the phases use connections.
struct Layout<'a> {
    /// Ranks of every host, in local-rank order.
    hosts: &'a [Vec<Rank>],
    /// `rails[l][h]`: local rank `l` of host `h`.
    rails: &'a [Vec<Rank>],
    /// Connections (channel ids) per phase.
    nch: u32,
    /// The rail exchange.
    rail: Rail,
    /// Building a template: only the host and rail of this rank record ops (the others'
    /// ops would be dropped by [`ScheduleBuilder::keep_only`] anyway).
    only: Option<Rank>,
}

impl Layout<'_> {
    /// The hosts (with their index) whose ops are recorded.
    fn used_hosts(&self) -> impl Iterator<Item = (usize, &Vec<Rank>)> {
        let only = self.only;
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, h)| only.is_none_or(|r| h.contains(&r)))
    }

    /// The rails (with their local index) whose ops are recorded.
    fn used_rails(&self) -> impl Iterator<Item = (usize, &Vec<Rank>)> {
        let only = self.only;
        self.rails
            .iter()
            .enumerate()
            .filter(move |(_, h)| only.is_none_or(|r| h.contains(&r)))
    }

    /// Channel of piece `s` in phase `phase` (every phase has `nch` ids of its own).
    fn channel(&self, phase: u32, s: u32) -> u32 {
        phase * self.nch + s % self.nch
    }

    /// Number of hosts.
    fn nh(&self) -> usize {
        self.rails[0].len()
    }

    /// Rail position at relative offset `x` from position `p`: `p ^ x` (halving-doubling),
    /// `p − x` (direct: the order in which the direct exchange delivers).
    fn rel(&self, p: usize, x: usize) -> usize {
        let nh = self.nh();
        match self.rail {
            Rail::HalvingDoubling | Rail::RecursiveDoubling => p ^ x,
            Rail::Direct => (p + nh - x % nh) % nh,
        }
    }
}

/// The rail exchange usable for `rail` on `nh` hosts (halving-doubling falls back to direct
/// on host counts that are not powers of two; recursive doubling has no schedule there, see
/// [`applies`]).
fn effective_rail(rail: Rail, nh: usize) -> Rail {
    if rail != Rail::Direct && nh.is_power_of_two() {
        rail
    } else {
        Rail::Direct
    }
}

/// Whether the family with the rail exchange `rail` has a schedule for `kind` on `nh`
/// hosts: recursive doubling only for AllReduce on a power-of-two host count.
fn applies(rail: Rail, kind: CollectiveKind, nh: usize) -> bool {
    supports(kind)
        && (rail != Rail::RecursiveDoubling
            || (kind == CollectiveKind::AllReduce && nh.is_power_of_two()))
}

/// Hierarchical schedules with the given rail exchange, for either buffer arrangement;
/// `template`: only the template (the program of `hosts[0][0]`, see [`Candidate::template`]).
fn schedules(
    name: &str,
    rail: Rail,
    topo: &Topology,
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
    template: bool,
) -> Vec<Candidate> {
    let kind = collective.kind();
    if !supports(kind) {
        return Vec::new();
    }
    let Some(hosts) = uniform_hosts(topo) else {
        return Vec::new();
    };
    let g = hosts[0].len();
    if g < 2 || !applies(rail, kind, hosts.len()) {
        return Vec::new();
    }
    let n = topo.nranks();
    let nch = params.channels.max(1);
    let Some(m) = nch.checked_mul(params.pipeline.max(1)) else {
        return Vec::new();
    };
    let Some(chunks) = n.checked_mul(m) else {
        return Vec::new();
    };
    let rails: Vec<Vec<Rank>> = (0..g)
        .map(|l| hosts.iter().map(|h| h[l]).collect())
        .collect();
    let layout = Layout {
        hosts: &hosts,
        rails: &rails,
        nch,
        rail: effective_rail(rail, hosts.len()),
        only: template.then_some(hosts[0][0]),
    };
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    b.set_fusion(false);
    let r0 = hosts[0][0];
    if template {
        b.keep_only(r0);
    }
    match kind {
        CollectiveKind::AllReduce => all_reduce(&mut b, &layout, m),
        CollectiveKind::AllGather => all_gather(&mut b, &layout, m, in_place),
        _ => reduce_scatter(&mut b, &layout, m, in_place),
    }
    let sym = symmetry(rail, topo, collective, params);
    let mut out: Vec<Candidate> = candidate(name, params, b)
        .into_iter()
        .map(|c| c.with_symmetry(sym.clone()))
        .collect();
    if template {
        let Some(sym) = sym else {
            return Vec::new();
        };
        for c in &mut out {
            let s = &mut c.schedule;
            let program = std::mem::replace(
                &mut s.ranks[r0 as usize],
                RankProgram {
                    scratch_chunks: 0,
                    streams: Vec::new(),
                },
            );
            c.template = Some(Arc::new(SymmetricSchedule::from_header(
                s.header(),
                sym.clone(),
                program,
            )));
        }
    }
    out
}

/// The rank symmetry of a hierarchical schedule with the rail exchange `rail`: the grid is
/// `[hosts, local]` with the rank at `(h, l)` local rank `l` of host `h`; hosts translate by
/// XOR under halving-doubling and recursive doubling (partners `p ^ 2^k`) and cyclically under the direct exchange
/// (peers `p ± i`), local ranks cyclically. AllReduce chunks are piece-major with block
/// label `l·hosts + h` (`Grid { order: [1, 0] }`); AllGather and ReduceScatter chunks are
/// rank blocks (`BlockMajor`, label `Rank`). `None` where the family has no schedule.
pub fn symmetry(
    rail: Rail,
    topo: &Topology,
    collective: Collective,
    params: FamilyParams,
) -> Option<Symmetry> {
    let kind = collective.kind();
    if !supports(kind) {
        return None;
    }
    let hosts = uniform_hosts(topo)?;
    let g = hosts[0].len();
    if g < 2 || !applies(rail, kind, hosts.len()) {
        return None;
    }
    params.channels.max(1).checked_mul(params.pipeline.max(1))?;
    let nh = hosts.len();
    let host_action = match effective_rail(rail, nh) {
        Rail::HalvingDoubling | Rail::RecursiveDoubling => Action::Xor,
        Rail::Direct => Action::Cyclic,
    };
    let chunks = match kind {
        CollectiveKind::AllReduce => ChunkMap {
            layout: BlockLayout::PieceMajor,
            label: BlockLabel::Grid { order: vec![1, 0] },
        },
        _ => ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        },
    };
    Some(Symmetry {
        dims: vec![u32::try_from(nh).ok()?, u32::try_from(g).ok()?],
        actions: vec![host_action, Action::Cyclic],
        ranks: hosts.concat(),
        chunks: Some(chunks),
    })
}

/// Where member `at` of a group keeps (or puts) the run of the member at position `owner`.
type PairLoc<'a> = &'a dyn Fn(usize, usize) -> Loc;

/// Direct reduce within `group`: the member at position `o` receives every other member's
/// contribution `contrib(p, o)` and folds it into `result(o, o)`, starting from its own
/// `first(o, o)`. At step `i` member `p` sends to `p + i` and receives from `p − i`.
#[allow(clippy::too_many_arguments)]
fn direct_reduce(
    b: &mut ScheduleBuilder,
    group: &[Rank],
    count: u32,
    channel: u32,
    contrib: PairLoc<'_>,
    first: PairLoc<'_>,
    result: PairLoc<'_>,
) {
    let g = group.len();
    for i in 1..g {
        for p in 0..g {
            let o = (p + i) % g;
            b.send(group[p], group[o], contrib(p, o), count, channel);
        }
        for p in 0..g {
            let from = (p + g - i) % g;
            let acc = if i == 1 { first(p, p) } else { result(p, p) };
            b.recv_reduce_copy(group[p], group[from], acc, result(p, p), count, channel);
        }
    }
}

/// Where member `at` keeps run `idx` of the member at position `owner`.
type RunLoc<'a> = &'a dyn Fn(usize, usize, usize) -> Loc;

/// Direct gather within `group`: every member sends its `runs` runs (`have(o, o, idx)`) to
/// every other member (into `put(p, o, idx)`). At step `i` member `p` sends to `p + i` and
/// receives from `p − i`.
fn direct_gather(
    b: &mut ScheduleBuilder,
    group: &[Rank],
    runs: usize,
    count: u32,
    channel: u32,
    have: RunLoc<'_>,
    put: RunLoc<'_>,
) {
    let g = group.len();
    for i in 1..g {
        for p in 0..g {
            let d = (p + i) % g;
            for idx in 0..runs {
                b.send(group[p], group[d], have(p, p, idx), count, channel);
            }
        }
        for p in 0..g {
            let from = (p + g - i) % g;
            for idx in 0..runs {
                b.recv(group[p], group[from], put(p, from, idx), count, channel);
            }
        }
    }
}

/// Recursive halving over `rail` (power-of-two length `nh`): in the round of `bit`
/// (`nh/2, nh/4, …, 1`) position `p` sends `send(p, bit)` (`bit` chunks) to `p ^ bit` and
/// folds what it receives into `acc(p, bit)`, storing at `dst(p, bit)`.
fn halving(
    b: &mut ScheduleBuilder,
    rail: &[Rank],
    channel: u32,
    send: &dyn Fn(usize, usize) -> Loc,
    acc: &dyn Fn(usize, usize) -> Loc,
    dst: &dyn Fn(usize, usize) -> Loc,
) {
    let nh = rail.len();
    let mut bit = nh / 2;
    while bit >= 1 {
        let count = bit as u32;
        for p in 0..nh {
            b.send(rail[p], rail[p ^ bit], send(p, bit), count, channel);
        }
        for p in 0..nh {
            let (a, d) = (acc(p, bit), dst(p, bit));
            b.recv_reduce_copy(rail[p], rail[p ^ bit], a, d, count, channel);
        }
        bit /= 2;
    }
}

/// Recursive doubling over `rail` (power-of-two length `nh`): in the round of `bit`
/// (`1, 2, …, nh/2`) position `p` sends `send(p, bit)` (`bit` chunks) to `p ^ bit` and
/// stores what it receives at `put(p, bit)`.
fn doubling(
    b: &mut ScheduleBuilder,
    rail: &[Rank],
    channel: u32,
    send: &dyn Fn(usize, usize) -> Loc,
    put: &dyn Fn(usize, usize) -> Loc,
) {
    let nh = rail.len();
    let mut bit = 1;
    while bit < nh {
        let count = bit as u32;
        for p in 0..nh {
            b.send(rail[p], rail[p ^ bit], send(p, bit), count, channel);
        }
        for p in 0..nh {
            b.recv(rail[p], rail[p ^ bit], put(p, bit), count, channel);
        }
        bit *= 2;
    }
}

/// Recursive doubling AllReduce over `rail` (power-of-two length `nh`): in the round of
/// `bit` (`1, 2, …, nh/2`) position `p` sends its partial sum `at` (`count` chunks) to
/// `p ^ bit` and folds the partner's into it. The builder orders each round's fold after
/// its send (they touch the same chunks).
fn recursive_doubling(b: &mut ScheduleBuilder, rail: &[Rank], channel: u32, at: Loc, count: u32) {
    let nh = rail.len();
    let mut bit = 1;
    while bit < nh {
        for p in 0..nh {
            b.send(rail[p], rail[p ^ bit], at, count, channel);
        }
        for p in 0..nh {
            b.recv_reduce_copy(rail[p], rail[p ^ bit], at, at, count, channel);
        }
        bit *= 2;
    }
}

/// AllReduce: per piece, intra-host reduce-scatter (channel phase 0), rail reduce-scatter
/// (1), rail all-gather (2), intra-host all-gather (3), all in `output` (recursive doubling:
/// the whole rail AllReduce in phase 1, nothing in phase 2).
fn all_reduce(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32) {
    let nh = lay.nh();
    let n = (nh * lay.hosts[0].len()) as u32;
    let nh32 = nh as u32;
    for s in 0..m {
        let base = s * n;
        // Local rank `l` owns `base + l·nh .. + nh`; rail host `j` owns chunk `j` of that.
        let host_start = |l: usize| base + l as u32 * nh32;
        let input = |_: usize, o: usize| Loc::input(host_start(o));
        let output = |_: usize, o: usize| Loc::output(host_start(o));
        for (_, host) in lay.used_hosts() {
            let ch = lay.channel(0, s);
            direct_reduce(b, host, nh32, ch, &input, &input, &output);
        }
        for (l, rail) in lay.used_rails() {
            let ch = lay.channel(1, s);
            match lay.rail {
                Rail::Direct => {
                    let at = |_: usize, o: usize| Loc::output(host_start(l) + o as u32);
                    direct_reduce(b, rail, 1, ch, &at, &at, &at);
                }
                Rail::HalvingDoubling => {
                    // Before the round of `bit`, `p` holds the aligned `2·bit` block around
                    // it; it sends its partner's half and keeps its own.
                    let half =
                        |p: usize, bit: usize| Loc::output(host_start(l) + (p & !(bit - 1)) as u32);
                    let other = |p: usize, bit: usize| half(p ^ bit, bit);
                    halving(b, rail, ch, &other, &half, &half);
                }
                Rail::RecursiveDoubling => {
                    let at = Loc::output(host_start(l));
                    recursive_doubling(b, rail, ch, at, nh32);
                }
            }
        }
        for (l, rail) in lay.used_rails() {
            let ch = lay.channel(2, s);
            match lay.rail {
                Rail::RecursiveDoubling => {}
                Rail::Direct => {
                    let at = |_: usize, o: usize, _: usize| Loc::output(host_start(l) + o as u32);
                    direct_gather(b, rail, 1, 1, ch, &at, &at);
                }
                Rail::HalvingDoubling => {
                    let mine =
                        |p: usize, bit: usize| Loc::output(host_start(l) + (p & !(bit - 1)) as u32);
                    let theirs = |p: usize, bit: usize| mine(p ^ bit, bit);
                    doubling(b, rail, ch, &mine, &theirs);
                }
            }
        }
        for (_, host) in lay.used_hosts() {
            let at = |_: usize, o: usize, _: usize| Loc::output(host_start(o));
            direct_gather(b, host, 1, nh32, lay.channel(3, s), &at, &at);
        }
    }
}

/// AllGather: per piece, rail all-gather of every rank's chunk (channel phase 0), then
/// intra-host all-gather of what each rank holds for its rail (1).
fn all_gather(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32, in_place: bool) {
    let nh = lay.nh();
    let n = (nh * lay.hosts[0].len()) as u32;
    // A rank's own chunk `k` (of the output numbering), read where it starts.
    let own = |r: Rank, k: u32| {
        if in_place {
            Loc::output(k)
        } else {
            Loc::input(k - r * m)
        }
    };
    if !in_place {
        for r in 0..n {
            b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
        }
    }
    for s in 0..m {
        let chunk = |l: usize, j: usize| lay.rails[l][j] * m + s;
        // Scratch slot of relative rail position `x` (halving-doubling staging).
        let slot = |x: usize| Loc::scratch(s * nh as u32 + x as u32);
        for (l, rail) in lay.used_rails() {
            let ch = lay.channel(0, s);
            match lay.rail {
                Rail::Direct => {
                    let have = |p: usize, _: usize, _: usize| own(rail[p], chunk(l, p));
                    let put = |_: usize, o: usize, _: usize| Loc::output(chunk(l, o));
                    direct_gather(b, rail, 1, 1, ch, &have, &put);
                }
                Rail::HalvingDoubling | Rail::RecursiveDoubling => {
                    // Slot `x` holds rail position `p ^ x`: own chunk in slot 0, the
                    // partner's `bit` slots arrive behind this rank's.
                    for (p, &r) in rail.iter().enumerate() {
                        b.copy((r, own(r, chunk(l, p))), (r, slot(0)), 1, ch);
                    }
                    let mine = |_: usize, _: usize| slot(0);
                    let theirs = |_: usize, bit: usize| slot(bit);
                    doubling(b, rail, ch, &mine, &theirs);
                }
            }
        }
        for (h, host) in lay.used_hosts() {
            // Local rank `l` forwards its rail's chunks, its own first, then in the order
            // the rail exchange delivers them (relative position `x`).
            let have = |l: usize, _: usize, x: usize| {
                let r = host[l];
                match (x, lay.rail) {
                    (0, _) => own(r, chunk(l, h)),
                    (_, Rail::Direct) => Loc::output(chunk(l, lay.rel(h, x))),
                    (_, Rail::HalvingDoubling | Rail::RecursiveDoubling) => slot(x),
                }
            };
            let put = |_: usize, o: usize, x: usize| Loc::output(chunk(o, lay.rel(h, x)));
            direct_gather(b, host, nh, 1, lay.channel(1, s), &have, &put);
            if lay.rail != Rail::Direct {
                for (l, &r) in host.iter().enumerate() {
                    for x in 1..nh {
                        let to = Loc::output(chunk(l, lay.rel(h, x)));
                        b.copy((r, slot(x)), (r, to), 1, lay.channel(1, s));
                    }
                }
            }
        }
    }
}

/// ReduceScatter: per piece, intra-host reduce-scatter of every rail's chunks into scratch
/// (channel phase 0), then rail reduce-scatter into the owners' outputs (1). Scratch slot
/// `s·hosts + x` holds the partial of rail position `rel(p, x)`.
fn reduce_scatter(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32, in_place: bool) {
    let nh = lay.nh();
    let out = |r: Rank, k: u32| {
        if in_place {
            Loc::input(k)
        } else {
            Loc::output(k - r * m)
        }
    };
    for s in 0..m {
        let chunk = |l: usize, j: usize| lay.rails[l][j] * m + s;
        let slot = |x: usize| Loc::scratch(s * nh as u32 + x as u32);
        // Intra-host order of the relative positions: what the rail sends first comes first.
        // (Direct: own slot, then the slot sent at step `i`, `nh − i`, for `i = 1, 2, …`.)
        let order: Vec<usize> = match lay.rail {
            Rail::Direct => (0..nh).map(|i| (nh - i) % nh).collect(),
            Rail::HalvingDoubling | Rail::RecursiveDoubling => (0..nh).rev().collect(),
        };
        for (h, host) in lay.used_hosts() {
            for &x in &order {
                // Local rank `l` reduces the chunk of rail position `rel(h, x)`.
                let contrib = |_: usize, o: usize| Loc::input(chunk(o, lay.rel(h, x)));
                let res = |_: usize, _: usize| slot(x);
                let ch = lay.channel(0, s);
                direct_reduce(b, host, 1, ch, &contrib, &contrib, &res);
            }
        }
        for (l, rail) in lay.used_rails() {
            let ch = lay.channel(1, s);
            match lay.rail {
                Rail::Direct => {
                    // Member `p` sends `o` the partial it holds for it: position `o` is
                    // `rel(p, x)` for `x = p − o`.
                    let contrib = |p: usize, o: usize| slot((p + nh - o) % nh);
                    let first = |_: usize, _: usize| slot(0);
                    let res = |p: usize, _: usize| out(rail[p], chunk(l, p));
                    direct_reduce(b, rail, 1, ch, &contrib, &first, &res);
                }
                Rail::HalvingDoubling | Rail::RecursiveDoubling => {
                    // Round `bit`: slots `bit..2·bit` go to the partner, whose slots
                    // `0..bit` they match; the last round stores the result.
                    let send = |_: usize, bit: usize| slot(bit);
                    let acc = |_: usize, _: usize| slot(0);
                    let dst = |p: usize, bit: usize| {
                        if bit == 1 {
                            out(rail[p], chunk(l, p))
                        } else {
                            slot(0)
                        }
                    };
                    halving(b, rail, ch, &send, &acc, &dst);
                }
            }
        }
    }
}

/// Which collectives the hierarchical families implement.
fn supports(kind: CollectiveKind) -> bool {
    matches!(
        kind,
        CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
    )
}

/// `⌈log2 x⌉`.
fn log2_ceil(x: u64) -> u64 {
    u64::from(x.max(1).next_power_of_two().trailing_zeros())
}

/// Step count of a hierarchical schedule with `pieces` pieces. Per piece every rank sends
/// and receives one message per host peer and rail peer in each of its phases (AllReduce,
/// direct: four), one per rail round (halving-doubling: `log2 hosts` per rail phase), and one
/// per chunk of its rail for every host peer (AllGather, ReduceScatter; halving-doubling
/// AllGather also copies its rail's chunks out of scratch).
fn step_estimate(topo: &Topology, kind: CollectiveKind, rail: Rail, pieces: u32) -> u64 {
    let n = u64::from(topo.nranks());
    let hosts = topo.nhosts().max(1) as u64;
    let g = (n / hosts).max(1);
    let rail = effective_rail(rail, hosts as usize);
    let per_rank = match (kind, rail) {
        (CollectiveKind::AllReduce, Rail::Direct) => 4 * (g + hosts).saturating_sub(2),
        (CollectiveKind::AllReduce, Rail::HalvingDoubling) => 4 * (g - 1) + 4 * log2_ceil(hosts),
        (CollectiveKind::AllReduce, Rail::RecursiveDoubling) => 4 * (g - 1) + 2 * log2_ceil(hosts),
        (_, Rail::Direct) => 2 * ((g - 1) * hosts + hosts - 1),
        (CollectiveKind::AllGather, Rail::HalvingDoubling | Rail::RecursiveDoubling) => {
            2 * (g - 1) * hosts + hosts + 2 * log2_ceil(hosts)
        }
        (_, Rail::HalvingDoubling | Rail::RecursiveDoubling) => {
            2 * (g - 1) * hosts + 2 * log2_ceil(hosts)
        }
    };
    n.saturating_mul(per_rank)
        .saturating_mul(u64::from(pieces))
        .max(1)
}

/// Buffer slots the verifier models for a schedule with `pieces` pieces (out of place):
/// every rank's input and output (one of them `nranks` times the other for AllGather and
/// ReduceScatter, both full-size for AllReduce) plus at most `hosts` scratch chunks per
/// piece. Pipelines past the verifier's [`MAX_SLOTS`] could never be chosen.
pub(super) fn verifier_slots(n: u64, hosts: u64, pieces: u32) -> u64 {
    let m = u64::from(pieces);
    let per_rank = (2 * n * m).max(n * m + m + hosts * m);
    n.saturating_mul(per_rank)
}

/// Pieces of a parameter set (`channels × pipeline`, saturating).
fn pieces(params: FamilyParams) -> u32 {
    params
        .channels
        .max(1)
        .saturating_mul(params.pipeline.max(1))
}

/// The parameter sets offered: one or two connections per phase (two only for shallow
/// pipelines), pipelines from `depths` whose chunk count fits `max_chunks`, whose buffers
/// the verifier can model ([`verifier_slots`]) and whose step estimate fits
/// [`MAX_HIER_STEPS`]; always at least the unpipelined one. From [`TEMPLATE_RANKS`] ranks
/// the limits are one rank's (templates), and nothing is offered where costing a template
/// would route more than [`MAX_TRANSLATED_ROUTES`] translated pairs.
fn param_space(
    topo: &Topology,
    collective: Collective,
    rail: Rail,
    depths: &[u32],
    max_chunks: u64,
) -> Vec<FamilyParams> {
    let n = u64::from(topo.nranks());
    // From TEMPLATE_RANKS on the search builds, costs and verifies templates: the verifier
    // models one rank, and the whole schedule is only built for the winners.
    let templated = topo.nranks() >= TEMPLATE_RANKS;
    // Costing a template routes every translate of each of its peers.
    let peers = (n / topo.nhosts().max(1) as u64)
        + match effective_rail(rail, topo.nhosts()) {
            Rail::Direct => topo.nhosts() as u64,
            Rail::HalvingDoubling | Rail::RecursiveDoubling => log2_ceil(topo.nhosts() as u64),
        };
    if templated && n.saturating_mul(peers) > MAX_TRANSLATED_ROUTES {
        return Vec::new();
    }
    let mut out = Vec::new();
    for channels in CHANNELS {
        for &pipeline in depths {
            let p = FamilyParams { channels, pipeline };
            let pieces = pieces(p);
            let steps = step_estimate(topo, collective.kind(), rail, pieces);
            let slots = verifier_slots(n, topo.nhosts() as u64, pieces);
            let fits = if templated {
                slots / n <= MAX_SLOTS
                    && steps / n <= MAX_HIER_TEMPLATE_STEPS
                    && steps <= MAX_HIER_EXPANDED_STEPS
            } else {
                slots <= MAX_SLOTS && steps <= MAX_HIER_STEPS
            };
            // Templates cost one rank's program: two connections per phase are offered at
            // every depth there (more messages in flight per rail round).
            if (channels == 1 || pipeline <= MAX_TWO_CHANNEL_PIPELINE || templated)
                && n * u64::from(pieces) <= max_chunks
                && fits
            {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        out.push(FamilyParams {
            channels: 1,
            pipeline: 1,
        });
    }
    out
}

/// Parameter sets of the direct family.
fn direct_space(topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
    let max_chunks = max_hier_chunks(topo.nranks());
    param_space(topo, collective, Rail::Direct, &PIPELINE, max_chunks)
}

/// Parameter sets of the halving-doubling family: only the unpipelined schedule unless the
/// hosts are a power of two in number (elsewhere the schedules would be the direct
/// family's).
fn hd_space(topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
    match uniform_hosts(topo) {
        Some(h) if h.len().is_power_of_two() => {
            let max_chunks = u64::from(topo.nranks()) * u64::from(MAX_HD_PIECES);
            let rail = Rail::HalvingDoubling;
            param_space(topo, collective, rail, &PIPELINE_HD, max_chunks)
        }
        _ => vec![FamilyParams {
            channels: 1,
            pipeline: 1,
        }],
    }
}

/// Parameter sets of the recursive-doubling family: AllReduce on a power-of-two host count
/// only (nothing elsewhere).
fn rd_space(topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
    match uniform_hosts(topo) {
        Some(h) if applies(Rail::RecursiveDoubling, collective.kind(), h.len()) => {
            let max_chunks = u64::from(topo.nranks()) * u64::from(MAX_HD_PIECES);
            let rail = Rail::RecursiveDoubling;
            param_space(topo, collective, rail, &PIPELINE_RD, max_chunks)
        }
        _ => Vec::new(),
    }
}

/// The [`Family`] of a hierarchical family: its name, rail exchange (halving-doubling falls
/// back to the direct exchange when the host count is not a power of two) and parameter
/// sets. Schedules for either buffer arrangement, and templates (see [`Family::template`]).
macro_rules! hier_family {
    ($ty:ty, $name:literal, $rail:expr, $space:path) => {
        impl $ty {
            /// The rank symmetry of what the family's `schedules` produce for these
            /// arguments (the same for either buffer arrangement); see [`symmetry`].
            pub fn symmetry(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
            ) -> Option<Symmetry> {
                symmetry($rail, topo, collective, params)
            }
        }

        impl Family for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn supports(&self, kind: CollectiveKind) -> bool {
                supports(kind)
                    && ($rail != Rail::RecursiveDoubling || kind == CollectiveKind::AllReduce)
            }
            fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
                $space(topo, collective)
            }
            fn schedules(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
                in_place: bool,
            ) -> Vec<Candidate> {
                schedules($name, $rail, topo, collective, params, in_place, false)
            }
            fn template(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
            ) -> Option<Vec<Candidate>> {
                Some(schedules(
                    $name, $rail, topo, collective, params, false, true,
                ))
            }
            fn template_steps(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
            ) -> Option<u64> {
                self.estimated_steps(topo, collective, params)
                    .map(|all| all / u64::from(topo.nranks().max(1)))
            }
            fn estimated_steps(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
            ) -> Option<u64> {
                let kind = collective.kind();
                Some(step_estimate(topo, kind, $rail, pieces(params)))
            }
        }
    };
}

hier_family!(Hierarchical, "hierarchical", Rail::Direct, direct_space);
hier_family!(
    HierarchicalHd,
    "hierarchical_hd",
    Rail::HalvingDoubling,
    hd_space
);
hier_family!(
    HierarchicalRd,
    "hierarchical_rd",
    Rail::RecursiveDoubling,
    rd_space
);
