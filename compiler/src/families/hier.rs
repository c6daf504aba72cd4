//! Hierarchical family: intra-host reduce-scatter, inter-host exchange among ranks with the
//! same local index (rail-aligned: local rank `i` of every host talks over its own NIC to
//! local rank `i` of the other hosts, so all rails run in parallel), intra-host all-gather.
//! AllGather and ReduceScatter use the inter-host and intra-host halves. Needs more than one
//! host, all of the same size.
//!
//! Every phase is a *direct* exchange: a rank sends each peer of its host (or of its rail)
//! the part that peer owns, and the owner folds the contributions in as they arrive. No
//! piece waits on a relay chain (a ring pays `g − 1` message latencies per piece, and with
//! all rings in lock-step the links idle during every one of them); a sender streams piece
//! after piece on each connection, limited only by the connection slots.
//!
//! The buffer is cut into `channels × pipeline` pieces that flow through the phases in order,
//! as a software pipeline: piece `s` of every phase runs on connection `s mod channels` of
//! that phase's own channel ids, so phases never share a stream (the rail exchange of piece
//! `s` overlaps the intra-host work of piece `s + 1`), and the last piece to leave the
//! NVLink phase is one piece, so the drain after it is one piece's rail exchange.
//!
//! Chunk layout: AllReduce puts piece `s` on chunks `s·n ..` with local rank `l` owning the
//! contiguous `s·n + l·hosts ..` (one message per peer and piece) and rail host `j` owning
//! chunk `j` of that. AllGather and ReduceScatter have their layout fixed by the output (rank
//! `r` owns chunks `r·m ..`); piece `s` is chunk `r·m + s` of every rank `r`, so local rank
//! `l` owns the `hosts` chunks of its rail (one message each).
//!
//! Size: per piece every rank exchanges `O(g + hosts)` messages (AllReduce) or
//! `O(nranks)` (AllGather, ReduceScatter: one per chunk of its rail and local peer).

use super::common::{candidate, uniform_hosts};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

/// Most chunks a hierarchical schedule may use on small rank counts (`nranks × pieces`).
const MAX_HIER_CHUNKS: u32 = 1024;
/// Most steps (roughly) a hierarchical candidate may have; larger pipelines are not offered.
const MAX_HIER_STEPS: u64 = 600_000;
/// Connection counts per phase offered: one keeps pieces strictly in order (the shortest
/// drain); two let a second piece start while the first finishes, which only pays on
/// shallow pipelines (at most [`MAX_TWO_CHANNEL_PIPELINE`] pieces per connection): deeper
/// ones keep every link busy on one connection.
const CHANNELS: [u32; 2] = [1, 2];
/// Deepest pipeline offered with two connections per phase.
const MAX_TWO_CHANNEL_PIPELINE: u32 = 2;
/// Pipeline depths offered (pieces per connection).
const PIPELINE: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The hierarchical family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hierarchical;

/// Ranks of the schedule's hosts and rails, and how the phases use connections.
struct Layout<'a> {
    /// Ranks of every host, in local-rank order.
    hosts: &'a [Vec<Rank>],
    /// `rails[l][h]`: local rank `l` of host `h`.
    rails: &'a [Vec<Rank>],
    /// Connections (channel ids) per phase.
    nch: u32,
}

impl Layout<'_> {
    /// Channel of piece `s` in phase `phase` (every phase has `nch` ids of its own).
    fn channel(&self, phase: u32, s: u32) -> u32 {
        phase * self.nch + s % self.nch
    }
}

impl Hierarchical {
    /// Hierarchical schedules for either buffer arrangement.
    pub fn schedules(
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
        let Some(hosts) = uniform_hosts(topo) else {
            return Vec::new();
        };
        let g = hosts[0].len();
        if g < 2 {
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
        };
        let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
        b.set_fusion(false);
        match kind {
            CollectiveKind::AllReduce => all_reduce(&mut b, &layout, m),
            CollectiveKind::AllGather => all_gather(&mut b, &layout, m, in_place),
            _ => reduce_scatter(&mut b, &layout, m, in_place),
        }
        candidate(self.name(), params, b)
    }
}

/// Owner `ring[j]` of each run `(start(j), count)` receives every other member's
/// contribution directly (from `contrib`) and folds it into `result`, starting from its own
/// contribution `first`; members are taken in ring order after the owner.
#[allow(clippy::too_many_arguments)]
fn direct_reduce(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    start: &dyn Fn(usize) -> u32,
    count: u32,
    channel: u32,
    contrib: &dyn Fn(Rank, u32) -> Loc,
    first: &dyn Fn(Rank, u32) -> Loc,
    result: &dyn Fn(Rank, u32) -> Loc,
) {
    let n = ring.len();
    for j in 0..n {
        let (owner, k) = (ring[j], start(j));
        for i in 1..n {
            let p = ring[(j + i) % n];
            let acc = if i == 1 {
                first(owner, k)
            } else {
                result(owner, k)
            };
            b.send(p, owner, contrib(p, k), count, channel);
            b.recv_reduce_copy(owner, p, acc, result(owner, k), count, channel);
        }
    }
}

/// Owner `ring[j]` sends each run of `starts(j)` (from `have`) to every other member (into
/// `put`), members in ring order after the owner.
fn direct_gather(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    starts: &dyn Fn(usize) -> Vec<u32>,
    count: u32,
    channel: u32,
    have: &dyn Fn(Rank, u32) -> Loc,
    put: &dyn Fn(Rank, u32) -> Loc,
) {
    let n = ring.len();
    for j in 0..n {
        let owner = ring[j];
        let ks = starts(j);
        for i in 1..n {
            let d = ring[(j + i) % n];
            for &k in &ks {
                b.send(owner, d, have(owner, k), count, channel);
                b.recv(d, owner, put(d, k), count, channel);
            }
        }
    }
}

/// AllReduce: per piece, intra-host reduce-scatter (channel phase 0), rail reduce-scatter
/// (1), rail all-gather (2), intra-host all-gather (3), all in `output`.
fn all_reduce(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32) {
    let nh = lay.rails[0].len() as u32;
    let n = nh * lay.hosts[0].len() as u32;
    let input = |_: Rank, k: u32| Loc::input(k);
    let output = |_: Rank, k: u32| Loc::output(k);
    for s in 0..m {
        let base = s * n;
        // Local rank `l` owns `base + l·nh .. + nh`; rail host `j` owns chunk `j` of that.
        let host_start = |l: usize| base + l as u32 * nh;
        for host in lay.hosts {
            let ch = lay.channel(0, s);
            direct_reduce(b, host, &host_start, nh, ch, &input, &input, &output);
        }
        for (l, rail) in lay.rails.iter().enumerate() {
            let start = |j: usize| host_start(l) + j as u32;
            let ch = lay.channel(1, s);
            direct_reduce(b, rail, &start, 1, ch, &output, &output, &output);
        }
        for (l, rail) in lay.rails.iter().enumerate() {
            let starts = |j: usize| vec![host_start(l) + j as u32];
            let ch = lay.channel(2, s);
            direct_gather(b, rail, &starts, 1, ch, &output, &output);
        }
        for host in lay.hosts {
            let starts = |l: usize| vec![host_start(l)];
            let ch = lay.channel(3, s);
            direct_gather(b, host, &starts, nh, ch, &output, &output);
        }
    }
}

/// AllGather: per piece, rail all-gather of every rank's chunk (channel phase 0), then
/// intra-host all-gather of what each rank holds for its rail (1).
fn all_gather(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32, in_place: bool) {
    let nh = lay.rails[0].len();
    let n = (nh * lay.hosts[0].len()) as u32;
    // A rank's own chunk `k` (of the output numbering), read where it starts.
    let own = |r: Rank, k: u32| {
        if in_place {
            Loc::output(k)
        } else {
            Loc::input(k - r * m)
        }
    };
    let output = |_: Rank, k: u32| Loc::output(k);
    // `have`: own chunks from `own`, the rest from `output`.
    let have = |r: Rank, k: u32| {
        if k / m == r {
            own(r, k)
        } else {
            Loc::output(k)
        }
    };
    if !in_place {
        for r in 0..n {
            b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
        }
    }
    for s in 0..m {
        for rail in lay.rails {
            let starts = |j: usize| vec![rail[j] * m + s];
            direct_gather(b, rail, &starts, 1, lay.channel(0, s), &have, &output);
        }
        for (h, host) in lay.hosts.iter().enumerate() {
            // Local rank `l` forwards its rail's chunks, its own first, then in the order
            // the rail exchange delivers them.
            let starts = |l: usize| {
                (0..nh)
                    .map(|t| lay.rails[l][(h + t) % nh] * m + s)
                    .collect()
            };
            direct_gather(b, host, &starts, 1, lay.channel(1, s), &have, &output);
        }
    }
}

/// ReduceScatter: per piece, intra-host reduce-scatter of every rail's chunks into scratch
/// (channel phase 0), then rail reduce-scatter into the owners' outputs (1).
fn reduce_scatter(b: &mut ScheduleBuilder, lay: &Layout<'_>, m: u32, in_place: bool) {
    let input = |_: Rank, k: u32| Loc::input(k);
    let scratch = |_: Rank, k: u32| Loc::scratch(k);
    let out = |r: Rank, k: u32| {
        if in_place {
            Loc::input(k)
        } else {
            Loc::output(k - r * m)
        }
    };
    for s in 0..m {
        for host in lay.hosts {
            // Local rank `l` reduces the chunks of its rail, one run per rail member.
            for t in 0..lay.rails[0].len() {
                let start = |l: usize| lay.rails[l][t] * m + s;
                let ch = lay.channel(0, s);
                direct_reduce(b, host, &start, 1, ch, &input, &input, &scratch);
            }
        }
        for rail in lay.rails {
            let start = |j: usize| rail[j] * m + s;
            let ch = lay.channel(1, s);
            direct_reduce(b, rail, &start, 1, ch, &scratch, &scratch, &out);
        }
    }
}

/// Step count of a hierarchical schedule with `pieces` pieces: per piece every rank sends
/// and receives one message per host peer and rail peer in each of its phases (AllReduce:
/// four), one per chunk of its rail for every host peer (AllGather, ReduceScatter).
fn step_estimate(topo: &Topology, kind: CollectiveKind, pieces: u32) -> u64 {
    let n = u64::from(topo.nranks());
    let hosts = topo.nhosts().max(1) as u64;
    let g = (n / hosts).max(1);
    let per_rank = match kind {
        CollectiveKind::AllReduce => 4 * (g + hosts).saturating_sub(2),
        _ => 2 * ((g - 1) * hosts + hosts - 1),
    };
    n.saturating_mul(per_rank)
        .saturating_mul(u64::from(pieces))
        .max(1)
}

impl Family for Hierarchical {
    fn name(&self) -> &'static str {
        "hierarchical"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        )
    }
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        let n = topo.nranks();
        let max_chunks = u64::from(MAX_HIER_CHUNKS.max(n));
        let mut out = Vec::new();
        for channels in CHANNELS {
            for pipeline in PIPELINE {
                let pieces = channels * pipeline;
                if (channels == 1 || pipeline <= MAX_TWO_CHANNEL_PIPELINE)
                    && u64::from(n) * u64::from(pieces) <= max_chunks
                    && step_estimate(topo, collective.kind(), pieces) <= MAX_HIER_STEPS
                {
                    out.push(FamilyParams { channels, pipeline });
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
    fn generate(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Vec<Candidate> {
        self.schedules(topo, collective, params, false)
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let pieces = params
            .channels
            .max(1)
            .saturating_mul(params.pipeline.max(1));
        Some(step_estimate(topo, collective.kind(), pieces))
    }
}
