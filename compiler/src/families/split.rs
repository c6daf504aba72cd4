//! The hierarchical family with a *split* rail: AllGather, ReduceScatter and AllReduce
//! (ReduceScatter then AllGather) that balance every rank's NIC against its NVLinks.
//!
//! In [`super::Hierarchical`]'s AllGather every block crosses the network once, to the rank
//! of the same local index on every other host, which then forwards it over NVLink to its
//! host's other ranks. A rank therefore receives `hosts − 1` blocks by NIC and
//! `n − hosts` over NVLink. Where the NVLinks are the busier (a DGX H100 cluster: 450 GB/s of
//! NVLink, 50 GB/s of NIC per GPU, 2 hosts: 14 blocks against 1), the bound (every rank's
//! `n − 1` blocks over NVLink and NIC together) is only reached when a rank takes
//! `x = N·(n − 1)/(V + N)` blocks by NIC (1.5 on two DGX H100): each rank also sends a
//! fraction `f = x/(hosts − 1) − 1` of its block straight to the rank of the *next* local
//! index on every other host, which then needs it from nobody on its host. NIC traffic in
//! and out of every rank becomes `(hosts − 1)(1 + f)` blocks, NVLink traffic
//! `n − 1 − (hosts − 1)(1 + f)`: the two finish together.
//!
//! Every piece (`channels × pipeline` per block) is `q` chunks, of which the last `k` also
//! take the direct path, `k/q` the nearest `f` ([`parts`]: 1 of 2 on two DGX H100), so every
//! piece loads NIC and NVLinks in the same proportion. ReduceScatter is the
//! reverse: a rank sends its contribution to such a piece of a block owned on another host
//! straight to the owner, not to its host peer of the owner's local index. AllReduce is the
//! ReduceScatter followed by the AllGather of every piece.
//!
//! Phases use channel ids of their own, so they overlap across pieces as in
//! [`super::hier`]: ReduceScatter's intra-host phase, then its rail and direct parts;
//! AllGather's rail and direct parts, then its intra-host phase in two (a rank's own pieces
//! apart from the remote ones: while the rail shares the NIC with the direct parts its
//! pieces come in at half speed, and the own pieces keep the NVLinks busy meanwhile).
//! Every rank's program is its translate on the `[hosts, local]` grid (peers by relative
//! offset), the same symmetry as the hierarchical AllGather.

use super::common::{candidate, uniform_hosts};
use super::hier::{MAX_HIER_STEPS, PIPELINE, max_hier_chunks, verifier_slots};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::verify::MAX_SLOTS;
use hccl_ir::{
    Action, BlockLabel, BlockLayout, ChunkMap, Collective, CollectiveKind, Loc, Rank, Symmetry,
};
use hccl_topologies::{Node, Topology};
use petgraph::Direction;
use petgraph::visit::EdgeRef;

/// Least direct fraction worth a family of its own (below it, the hierarchical family's
/// schedules are as good).
pub const MIN_FRACTION: f64 = 1.0 / 64.0;

/// The fraction `f` of every block sent straight to the next local index on every other
/// host (see the module docs), from every rank's NVLink ingress `V` (links from anything
/// but a NIC) and NIC rate `N` (its link to the NIC and the NIC itself); the least over
/// ranks. `None` on one host, hosts of fewer than three ranks, ranks without a NIC, or where
/// `f` is below [`MIN_FRACTION`].
pub fn split_fraction(topo: &Topology) -> Option<f64> {
    let hosts = uniform_hosts(topo)?;
    let (nh, g) = (hosts.len(), hosts[0].len());
    if g < 3 {
        return None;
    }
    let n = topo.nranks() as f64;
    let mut x = f64::INFINITY;
    for &node in &topo.ranks {
        let mut v = 0.0;
        for e in topo.graph.edges_directed(node, Direction::Incoming) {
            if !matches!(topo.graph[e.source()], Node::Nic { .. }) {
                v += e.weight().bw;
            }
        }
        let nic = topo
            .graph
            .edges_directed(node, Direction::Outgoing)
            .filter_map(|e| match &topo.graph[e.target()] {
                Node::Nic { bw, .. } => Some(e.weight().bw.min(*bw)),
                _ => None,
            })
            .fold(0.0, f64::max);
        if nic <= 0.0 || v <= 0.0 {
            return None;
        }
        x = x.min(nic * (n - 1.0) / (v + nic));
    }
    let f = (x / (nh - 1) as f64 - 1.0).min(1.0);
    (f >= MIN_FRACTION).then_some(f)
}

/// Most parts a piece is cut into for its direct share ([`parts`]).
pub const MAX_PARTS: u32 = 8;

/// The direct share of every piece as `(k, q)`: a piece is `q` chunks, of which the last `k`
/// also go straight to the next local index. The `k/q` nearest `f` with `q ≤`
/// [`MAX_PARTS`] (fewest parts on ties); `None` where even that is off `f` by more than a
/// quarter of `f`.
pub fn parts(f: f64) -> Option<(u32, u32)> {
    let mut best: Option<(f64, u32, u32)> = None;
    for q in 1..=MAX_PARTS {
        for k in 1..=q {
            let err = (f64::from(k) / f64::from(q) - f).abs();
            if best.is_none_or(|(e, _, _)| err < e - 1e-12) {
                best = Some((err, k, q));
            }
        }
    }
    let (err, k, q) = best?;
    (err <= f / 4.0).then_some((k, q))
}

/// Ranks and phase channels of one schedule.
struct Grid<'a> {
    hosts: &'a [Vec<Rank>],
    /// Pieces per block.
    m: u32,
    /// Chunks per piece (`q`), and how many of them, the last, go direct (`k`).
    q: u32,
    k: u32,
    /// Connections per phase.
    nch: u32,
}

impl Grid<'_> {
    fn nh(&self) -> usize {
        self.hosts.len()
    }
    fn g(&self) -> usize {
        self.hosts[0].len()
    }
    fn rank(&self, h: usize, l: usize) -> Rank {
        self.hosts[h % self.nh()][l % self.g()]
    }
    /// First chunk of piece `s` of the block of the rank at `(h, l)`.
    fn chunk(&self, h: usize, l: usize, s: u32) -> u32 {
        (self.rank(h, l) * self.m + s) * self.q
    }
    fn channel(&self, phase: u32, s: u32) -> u32 {
        phase * self.nch + s % self.nch
    }
}

/// AllGather of piece `s`: `own(r, k)` is where rank `r` holds its chunk `k`; everything
/// lands in the output. Phases on channel ids `base` (rail and direct), `base + 1` and
/// `base + 2` (intra-host: own pieces, remote ones).
fn gather_piece(
    b: &mut ScheduleBuilder,
    gr: &Grid<'_>,
    s: u32,
    base: u32,
    own: &dyn Fn(Rank, u32) -> Loc,
) {
    let (nh, g, q, k) = (gr.nh(), gr.g(), gr.q, gr.k);
    // Rail: every rank sends its piece to its rail peer on every other host; then its last
    // `k` chunks to the next local index there (on the same connection, behind the rail's
    // piece: on one of their own, the direct parts would take the NIC from the first rail
    // pieces, which the NVLinks wait for).
    let ch = gr.channel(base, s);
    for i in 1..nh {
        for h in 0..nh {
            for l in 0..g {
                let (r, c) = (gr.rank(h, l), gr.chunk(h, l, s));
                b.send(r, gr.rank(h + i, l), own(r, c), q, ch);
                b.send(r, gr.rank(h + i, l + 1), own(r, c + q - k), k, ch);
            }
        }
        for h in 0..nh {
            for l in 0..g {
                let from = (h + nh - i) % nh;
                let r = gr.rank(h, l);
                let c = gr.chunk(from, l, s);
                b.recv(r, gr.rank(from, l), Loc::output(c), q, ch);
                let (fl, c) = ((l + g - 1) % g, gr.chunk(from, (l + g - 1) % g, s));
                b.recv(r, gr.rank(from, fl), Loc::output(c + q - k), k, ch);
            }
        }
    }
    // Intra-host: local rank `p` forwards its rail's pieces (its own first, then in the
    // order the rail delivered them) to every local peer; the next local index gets only
    // the first `q − k` chunks of the remote ones (it has the rest).
    // The rank's own pieces on a connection of their own (`base + 1`), the remote ones on
    // another (`base + 2`): while the rail shares the NIC with the direct parts, its pieces
    // come in slowly, and the own ones keep the NVLinks busy meanwhile.
    let ch = |x: usize| gr.channel(base + 1 + u32::from(x > 0), s);
    let count = |x: usize, i: usize| if x > 0 && i == 1 { q - k } else { q };
    for h in 0..nh {
        for i in 1..g {
            for p in 0..g {
                let r = gr.rank(h, p);
                for x in 0..nh {
                    let c = gr.chunk(h + nh - x, p, s);
                    let at = if x == 0 { own(r, c) } else { Loc::output(c) };
                    if count(x, i) > 0 {
                        b.send(r, gr.rank(h, p + i), at, count(x, i), ch(x));
                    }
                }
            }
            for p in 0..g {
                let from = (p + g - i) % g;
                for x in 0..nh {
                    let c = gr.chunk(h + nh - x, from, s);
                    if count(x, i) > 0 {
                        let (r, src) = (gr.rank(h, p), gr.rank(h, from));
                        b.recv(r, src, Loc::output(c), count(x, i), ch(x));
                    }
                }
            }
        }
    }
}

/// ReduceScatter of piece `s`: contributions read at `input(r, k)`, the sum of owner `r`'s
/// piece left at `out(r, k)`; partials in scratch (`q` chunks per rail position `h − x`).
/// Phases on channel ids `base` (intra-host) and `base + 1` (rail and direct).
fn reduce_piece(
    b: &mut ScheduleBuilder,
    gr: &Grid<'_>,
    s: u32,
    base: u32,
    input: &dyn Fn(Rank, u32) -> Loc,
    out: &dyn Fn(Rank, u32) -> Loc,
) {
    let (nh, g, q, k) = (gr.nh(), gr.g(), gr.q, gr.k);
    let slot = |x: usize| Loc::scratch((s * nh as u32 + x as u32) * q);
    // Intra-host: local rank `o` sums its host's contributions to the piece of rail position
    // `h − x` (its own host's first, then in the order the rail sends them); to a remote
    // position's piece the next local index adds only the first `q − k` chunks, and sends
    // the rest straight to the owner.
    let ch = gr.channel(base, s);
    for h in 0..nh {
        for x in (0..nh).map(|i| (nh - i) % nh) {
            let j = h + nh - x;
            let count = |i: usize| if x > 0 && i == g - 1 { q - k } else { q };
            for i in 1..g {
                if count(i) == 0 {
                    continue;
                }
                for p in 0..g {
                    let o = (p + i) % g;
                    let r = gr.rank(h, p);
                    b.send(r, gr.rank(h, o), input(r, gr.chunk(j, o, s)), count(i), ch);
                }
                for o in 0..g {
                    let from = (o + g - i) % g;
                    let r = gr.rank(h, o);
                    let acc = if i == 1 {
                        input(r, gr.chunk(j, o, s))
                    } else {
                        slot(x)
                    };
                    b.recv_reduce_copy(r, gr.rank(h, from), acc, slot(x), count(i), ch);
                }
            }
        }
    }
    // Rail: every rank sends each rail peer its partial for it, and the next local index's
    // owner there its own contribution to the last `k` chunks; the owner folds them in.
    let ch = gr.channel(base + 1, s);
    for i in 1..nh {
        for h in 0..nh {
            for l in 0..g {
                // The peer `h + i` is rail position `h − x` for `x = nh − i`.
                let r = gr.rank(h, l);
                b.send(r, gr.rank(h + i, l), slot(nh - i), q, ch);
                let c = gr.chunk(h + i, l + g - 1, s) + q - k;
                b.send(r, gr.rank(h + i, l + g - 1), input(r, c), k, ch);
            }
        }
        for h in 0..nh {
            for l in 0..g {
                let r = gr.rank(h, l);
                let c = gr.chunk(h, l, s);
                let acc = if i == 1 { slot(0) } else { out(r, c) };
                b.recv_reduce_copy(r, gr.rank(h + nh - i, l), acc, out(r, c), q, ch);
                let (from, at) = (gr.rank(h + nh - i, l + 1), out(r, c + q - k));
                b.recv_reduce_copy(r, from, at, at, k, ch);
            }
        }
    }
}

/// The split hierarchical family.
#[derive(Debug, Clone, Copy, Default)]
pub struct HierarchicalSplit;

/// Steps per rank and piece: AllGather and ReduceScatter send and receive one message per
/// rail peer, direct peer and (local peer × hosts); AllReduce both.
fn steps_per_rank(kind: CollectiveKind, nh: u64, g: u64) -> u64 {
    let one = 2 * (2 * (nh - 1) + (g - 1) * nh);
    match kind {
        CollectiveKind::AllReduce => 2 * one,
        _ => one,
    }
}

impl Family for HierarchicalSplit {
    fn name(&self) -> &'static str {
        "hierarchical_split"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        )
    }

    /// One connection per phase (two for the two shallowest pipelines), pipelines whose
    /// chunks (a piece is `q` of them), verifier slots and steps fit the hierarchical
    /// family's limits; nothing where [`split_fraction`] or [`parts`] is `None`.
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        let Some((_, q)) = split_fraction(topo).and_then(parts) else {
            return Vec::new();
        };
        if !self.supports(collective.kind()) {
            return Vec::new();
        }
        let n = u64::from(topo.nranks());
        let nh = topo.nhosts() as u64;
        // Two connections only for the shallowest pipelines (the small sizes, where they
        // won on the 2-node cluster).
        [(2, 1), (2, 2)]
            .into_iter()
            .chain(PIPELINE.iter().map(|&pipeline| (1, pipeline)))
            .map(|(channels, pipeline)| FamilyParams { channels, pipeline })
            .filter(|p| {
                let pieces = p.channels * p.pipeline * q;
                n * u64::from(pieces) <= max_hier_chunks(topo.nranks())
                    && verifier_slots(n, nh, pieces) <= MAX_SLOTS
                    && self
                        .estimated_steps(topo, collective, *p)
                        .unwrap_or(u64::MAX)
                        <= MAX_HIER_STEPS
            })
            .collect()
    }

    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let kind = collective.kind();
        if !self.supports(kind) {
            return Vec::new();
        }
        let (Some(hosts), Some((k, q))) =
            (uniform_hosts(topo), split_fraction(topo).and_then(parts))
        else {
            return Vec::new();
        };
        let n = topo.nranks();
        let nch = params.channels.max(1);
        let Some(m) = nch.checked_mul(params.pipeline.max(1)) else {
            return Vec::new();
        };
        let Some(chunks) = n.checked_mul(m).and_then(|c| c.checked_mul(q)) else {
            return Vec::new();
        };
        let gr = Grid {
            hosts: &hosts,
            m,
            q,
            k,
            nch,
        };
        let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
        b.set_fusion(false);
        // Chunks per block.
        let mb = m * q;
        match kind {
            CollectiveKind::AllGather => {
                if !in_place {
                    for r in 0..n {
                        b.copy((r, Loc::input(0)), (r, Loc::output(r * mb)), mb, 0);
                    }
                }
                let own = |r: Rank, c: u32| {
                    if in_place {
                        Loc::output(c)
                    } else {
                        Loc::input(c - r * mb)
                    }
                };
                for s in 0..m {
                    gather_piece(&mut b, &gr, s, 0, &own);
                }
            }
            CollectiveKind::ReduceScatter => {
                let out = |r: Rank, c: u32| {
                    if in_place {
                        Loc::input(c)
                    } else {
                        Loc::output(c - r * mb)
                    }
                };
                let input = |_: Rank, c: u32| Loc::input(c);
                for s in 0..m {
                    reduce_piece(&mut b, &gr, s, 0, &input, &out);
                }
            }
            _ => {
                let input = |_: Rank, c: u32| Loc::input(c);
                let output = |_: Rank, c: u32| Loc::output(c);
                for s in 0..m {
                    reduce_piece(&mut b, &gr, s, 0, &input, &output);
                    gather_piece(&mut b, &gr, s, 2, &output);
                }
            }
        }
        let symmetry = Symmetry {
            dims: vec![hosts.len() as u32, hosts[0].len() as u32],
            actions: vec![Action::Cyclic, Action::Cyclic],
            ranks: hosts.concat(),
            chunks: Some(ChunkMap {
                layout: BlockLayout::BlockMajor,
                label: BlockLabel::Rank,
            }),
        };
        candidate(self.name(), params, b)
            .into_iter()
            .map(|c| c.with_symmetry(Some(symmetry.clone())))
            .collect()
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        let nh = (topo.nhosts() as u64).max(1);
        let per_rank = steps_per_rank(collective.kind(), nh, (n / nh).max(1));
        Some(
            n.saturating_mul(per_rank)
                .saturating_mul(u64::from(params.channels.max(1)))
                .saturating_mul(u64::from(params.pipeline.max(1))),
        )
    }
}
