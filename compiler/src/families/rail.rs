//! Broadcast and Reduce over the rails of a multi-host cluster (`rail_chains`, `rail_trees`).
//!
//! Broadcast from the root `(h₀, l₀)` (host, local index): the buffer is cut into one part
//! per local index, each in `pieces` pieces. Per piece, the root hands part `k` to its host
//! peer of local index `k` over NVLink (the scatter), which starts a chain along rail `k`
//! through every host in turn (`h₀ → h₀+1 → …`, one NIC hop each); on every host the rank of
//! local index `k` then sends part `k` to its host peers (the root excepted, which has it).
//! The root's own part returns to its host from the far end of its rail, by NIC, to a
//! helper (a different peer for every piece) that shares it there: the root's NVLinks carry
//! only the scatter, and its host's NICs, which receive nothing else, carry the return.
//! Every NIC sends and receives each part at most once, so the rails carry the whole buffer
//! at `g` NICs' rate, the bound of a cluster whose hosts are joined by their NICs, while
//! each rank's NVLinks carry `g − 1` parts in and out: on DGX H100 nodes 350 of 450 GB/s,
//! the slack that lets every pipeline keep its NIC busy (the tree packings' equal-rate trees
//! fill NVLink and NIC alike, and stall). Reduce is the reverse: every host sums each part
//! on the rank of its local index, the rail chains add the hosts' partial sums towards
//! `h₀`, and the root folds the parts in (its own part summed on its host by the helper).
//!
//! `rail_trees` replaces each chain by two-level trees ([`Shape::Fan`]): piece `s` goes
//! from `h₀` to one relay host, which sends it on to every other host; the relays take the
//! pieces in turn. Every NIC still receives each part once and sends it at most once, but a
//! piece crosses two NIC hops on any number of hosts, not `nh − 1` (`nh` for the root's own
//! part): on the 4-node H100 cluster at 1 GiB, 1.025 of the bound against the chains' 1.056.
//!
//! Phases use channel ids of their own (scatter 0, rail 1, intra-host 2, each `channels`
//! wide; pieces go round the channels), so they overlap across pieces; with as many
//! channels as relays, each relay's pieces keep to connections of their own. Broadcast's
//! scatter and Reduce's sums within a host use one connection per peer instead: concurrent
//! pieces there would share the rank's links and the first piece would leave its host later.

use super::common::{candidate, single_rank, uniform_hosts};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

/// Parameter sets offered (connections per phase, pieces per part and connection): the
/// ones that won a size on the H100 and NDv2 clusters. Two connections suit the shallow
/// pipelines of the small sizes; the deep ones of 1 GiB and up take three, as many as the
/// 4-node cluster's relays ([`Shape::Fan`]), so that each relay's pieces keep to streams of
/// their own (with 432 pieces of 0.3 MiB at 1 GiB, just above the size where two slots per
/// connection stop covering a NIC hop's latency).
const PARAMS: [(u32, u32); 14] = [
    (2, 4),
    (2, 8),
    (2, 16),
    (2, 32),
    (1, 64),
    (1, 128),
    (2, 128),
    (3, 96),
    (3, 112),
    (3, 128),
    (3, 144),
    (2, 256),
    (4, 128),
    (6, 64),
];
/// Least average chunk at which a schedule is costed (see [`Candidate::min_bytes`]).
const MIN_CHUNK_BYTES: u64 = 4 << 10;
/// Chunks beyond which a schedule is costed only from [`DEEP_CHUNK_BYTES`] a chunk: the
/// deepest pipelines win only where a piece keeps a NIC busy for about a message's latency,
/// and below that their time grows faster than linearly towards small sizes, so a chord
/// from a small size misjudges the sizes they win at. With this floor the 4-node H100
/// cluster's whole-range compile picks at 1 GiB what a compile of 1 GiB alone does (1.025
/// and 1.026 of the bound for Broadcast and Reduce), and simulates fewer small sizes.
const DEEP_CHUNKS: u32 = 1024;
/// See [`DEEP_CHUNKS`].
const DEEP_CHUNK_BYTES: u64 = 256 << 10;
/// Most chunks a schedule may use.
const MAX_CHUNKS: u64 = 4096;
/// Most steps (roughly) a candidate may have.
const MAX_STEPS: u64 = 600_000;

/// The rail chains family: every part crosses the hosts in a chain ([`Shape::Chain`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct RailChains;

/// The rail trees family (`rail_trees`): as [`RailChains`], but every piece crosses the
/// hosts in a two-level tree through a relay host ([`Shape::Fan`]), so that its pipeline is
/// two NIC hops deep on any number of hosts rather than one per host. Offered on three or
/// more hosts (on two, the tree is the chain).
#[derive(Debug, Clone, Copy, Default)]
pub struct RailTrees;

/// Ranks and channels of one schedule.
struct Rails<'a> {
    hosts: &'a [Vec<Rank>],
    /// The root's host and local index.
    h0: usize,
    l0: usize,
    /// Connections per phase (pieces go round them). Chunk `s·g + k` is piece `s` of part
    /// `k` (one part per local index).
    nch: u32,
    /// How a part crosses the hosts: a chain through every host, or two-level trees.
    shape: Shape,
}

/// How a rail carries a piece across the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `h₀ → h₀+1 → …`: `nh − 1` NIC hops (the root's own part `nh`, back to its host).
    Chain,
    /// `h₀ → relay → every other host`, the relay of piece `s` the `1 + s mod (nh − 1)`-th
    /// host after `h₀`: two NIC hops for every part. Each NIC still receives each piece
    /// once; `h₀`'s sends each piece once, and a relay `nh − 2` times for its `1/(nh − 1)`
    /// of the pieces (`nh − 1` on the root's rail, which also returns them to `h₀`).
    Fan,
}

impl Shape {
    /// Fewest hosts the shape is offered on: on two, the trees are the chain.
    fn min_hosts(self) -> usize {
        match self {
            Shape::Chain => 1,
            Shape::Fan => 3,
        }
    }
}

impl Rails<'_> {
    fn nh(&self) -> usize {
        self.hosts.len()
    }
    fn g(&self) -> usize {
        self.hosts[0].len()
    }
    /// The rank of local index `l` on the `j`-th host of the chain (`j = 0` the root's).
    fn at(&self, j: usize, l: usize) -> Rank {
        self.hosts[(self.h0 + j) % self.nh()][l % self.g()]
    }
    fn chunk(&self, s: u32, k: usize) -> u32 {
        s * self.g() as u32 + k as u32
    }
    fn channel(&self, phase: u32, s: u32) -> u32 {
        phase * self.nch + s % self.nch
    }
    fn is_root(&self, j: usize, l: usize) -> bool {
        j == 0 && l == self.l0
    }
    /// The host (counted from the root's) that relays piece `s` in a [`Shape::Fan`].
    fn relay(&self, s: u32) -> usize {
        1 + s as usize % (self.nh() - 1)
    }
    /// The root's host peer that shares piece `s` of the root's own part on the root's
    /// host (round-robin over the peers, so that the root sends each peer as much).
    fn helper(&self, s: u32) -> usize {
        let g = self.g();
        (self.l0 + 1 + s as usize % (g - 1)) % g
    }
}

fn broadcast(b: &mut ScheduleBuilder, r: &Rails<'_>, pieces: u32, in_place: bool) {
    let (nh, g) = (r.nh(), r.g());
    let root = r.at(0, r.l0);
    let m = pieces * g as u32;
    if !in_place {
        b.copy((root, Loc::input(0)), (root, Loc::output(0)), m, 0);
    }
    for s in 0..pieces {
        for k in 0..g {
            let c = r.chunk(s, k);
            // Scatter: the root hands part k to its rail's first rank.
            if k != r.l0 {
                // One connection per peer: pieces leave the root one after another, so the
                // first reaches its rail after one piece's time, not `channels` pieces'.
                let ch = r.channel(0, 0);
                b.send(root, r.at(0, k), Loc::input(c), 1, ch);
                b.recv(r.at(0, k), root, Loc::output(c), 1, ch);
            }
            let ch = r.channel(1, s);
            let helper = r.helper(s);
            let src = |j: usize| {
                if r.is_root(j, k) {
                    Loc::input(c)
                } else {
                    Loc::output(c)
                }
            };
            match r.shape {
                // Rail chain through every host.
                Shape::Chain => {
                    for j in 0..nh - 1 {
                        b.send(r.at(j, k), r.at(j + 1, k), src(j), 1, ch);
                        b.recv(r.at(j + 1, k), r.at(j, k), Loc::output(c), 1, ch);
                    }
                    // The root's own part comes back to its host by the last host's NIC, to
                    // a helper (the root's NVLinks are busy with the scatter; the NICs of its
                    // host receive nothing else).
                    if k == r.l0 {
                        let last = r.at(nh - 1, k);
                        b.send(last, r.at(0, helper), Loc::output(c), 1, ch);
                        b.recv(r.at(0, helper), last, Loc::output(c), 1, ch);
                    }
                }
                // The root's host hands the piece to the relay, which sends it on to every
                // other host (the root's own part: to the helper on the root's host too).
                Shape::Fan => {
                    let j = r.relay(s);
                    b.send(r.at(0, k), r.at(j, k), src(0), 1, ch);
                    b.recv(r.at(j, k), r.at(0, k), Loc::output(c), 1, ch);
                    for i in (1..nh).filter(|&i| i != j) {
                        b.send(r.at(j, k), r.at(i, k), Loc::output(c), 1, ch);
                        b.recv(r.at(i, k), r.at(j, k), Loc::output(c), 1, ch);
                    }
                    if k == r.l0 {
                        b.send(r.at(j, k), r.at(0, helper), Loc::output(c), 1, ch);
                        b.recv(r.at(0, helper), r.at(j, k), Loc::output(c), 1, ch);
                    }
                }
            }
            // Every host's rank of local index k shares the part with its peers (the
            // helper, the root's own part on the root's host).
            let ch = r.channel(2, s);
            for j in 0..nh {
                let from = if r.is_root(j, k) { helper } else { k };
                for i in 1..g {
                    let to = (from + i) % g;
                    if (j == 0 && to == r.l0) || to == k {
                        continue;
                    }
                    b.send(r.at(j, from), r.at(j, to), Loc::output(c), 1, ch);
                    b.recv(r.at(j, to), r.at(j, from), Loc::output(c), 1, ch);
                }
            }
        }
    }
}

fn reduce(b: &mut ScheduleBuilder, r: &Rails<'_>, pieces: u32) {
    let (nh, g) = (r.nh(), r.g());
    let root = r.at(0, r.l0);
    for s in 0..pieces {
        for k in 0..g {
            let c = r.chunk(s, k);
            // Where the rank of local index k on the j-th host sums the part: the root in its
            // output, the others in scratch.
            let sum = |j: usize| {
                if r.is_root(j, k) {
                    Loc::output(c)
                } else {
                    Loc::scratch(s)
                }
            };
            // What it holds so far (its own contribution until something is added).
            let mut held: Vec<Loc> = vec![Loc::input(c); nh];
            // Every host sums the part on its rank of local index k (the root's host
            // without the root, which adds the total last); on the root's host, the root's
            // own part is summed on a helper, which the root adds last.
            // One connection per peer: the sums of concurrent pieces do not share each
            // rank's ingress, so the first piece leaves its host soonest (4-node cluster at
            // 1 GiB: 1.026 of the bound against 1.031 with `channels` connections).
            let ch = r.channel(2, 0);
            let helper = r.helper(s);
            let mut helped = Loc::input(c);
            for (j, h) in held.iter_mut().enumerate() {
                let (to, acc, at) = if r.is_root(j, k) {
                    (helper, &mut helped, Loc::scratch(pieces + s))
                } else {
                    (k, h, sum(j))
                };
                for i in 1..g {
                    let from = (to + g - i) % g;
                    if (j == 0 && from == r.l0) || from == k {
                        continue;
                    }
                    b.send(r.at(j, from), r.at(j, to), Loc::input(c), 1, ch);
                    b.recv_reduce_copy(r.at(j, to), r.at(j, from), *acc, at, 1, ch);
                    *acc = at;
                }
            }
            let ch = r.channel(1, s);
            match r.shape {
                // The rail chain adds the hosts' sums towards the root's host.
                Shape::Chain => {
                    for j in (1..nh).rev() {
                        b.send(r.at(j, k), r.at(j - 1, k), held[j], 1, ch);
                        b.recv_reduce_copy(
                            r.at(j - 1, k),
                            r.at(j, k),
                            held[j - 1],
                            sum(j - 1),
                            1,
                            ch,
                        );
                        held[j - 1] = sum(j - 1);
                    }
                }
                // The relay adds the other hosts' sums to its own and hands the total to
                // the root's host.
                Shape::Fan => {
                    let j = r.relay(s);
                    for i in (1..nh).filter(|&i| i != j) {
                        b.send(r.at(i, k), r.at(j, k), held[i], 1, ch);
                        b.recv_reduce_copy(r.at(j, k), r.at(i, k), held[j], sum(j), 1, ch);
                        held[j] = sum(j);
                    }
                    b.send(r.at(j, k), r.at(0, k), held[j], 1, ch);
                    b.recv_reduce_copy(r.at(0, k), r.at(j, k), held[0], sum(0), 1, ch);
                    held[0] = sum(0);
                }
            }
            // The root folds the parts in (its own: the helper's sum). Unlike Broadcast's,
            // the helper's sum does not travel round by the far end of the rail: that
            // predicts slower (4-node cluster at 1 GiB: 1.082 against 1.050).
            let ch = r.channel(0, s);
            if k != r.l0 {
                b.send(r.at(0, k), root, held[0], 1, ch);
                b.recv_reduce_copy(root, r.at(0, k), Loc::input(c), Loc::output(c), 1, ch);
            } else {
                b.send(r.at(0, helper), root, helped, 1, ch);
                b.recv_reduce_copy(root, r.at(0, helper), held[0], Loc::output(c), 1, ch);
            }
        }
    }
}

/// Steps of one piece of every part: per part, the scatter (2), the chain (2 per hop) and
/// the intra-host exchange (2 per peer and host).
fn steps_per_piece(nh: u64, g: u64) -> u64 {
    g * (2 + 2 * (nh - 1) + 2 * (g - 1) * nh)
}

/// The [`Family`] of a rail family whose pieces cross the hosts in `$shape`.
macro_rules! rail_family {
    ($family:ty, $name:literal, $shape:expr) => {
        impl Family for $family {
            fn name(&self) -> &'static str {
                $name
            }

            fn supports(&self, kind: CollectiveKind) -> bool {
                supports(kind)
            }

            /// [`PARAMS`] within the chunk and step caps, on uniform hosts of two ranks or
            /// more, and enough of them.
            fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
                param_space(topo, collective, $shape)
            }

            fn schedules(
                &self,
                topo: &Topology,
                collective: Collective,
                params: FamilyParams,
                in_place: bool,
            ) -> Vec<Candidate> {
                schedules($name, $shape, topo, collective, params, in_place)
            }

            fn estimated_steps(
                &self,
                topo: &Topology,
                _collective: Collective,
                params: FamilyParams,
            ) -> Option<u64> {
                Some(estimated_steps(topo, params))
            }
        }
    };
}

rail_family!(RailChains, "rail_chains", Shape::Chain);
rail_family!(RailTrees, "rail_trees", Shape::Fan);

fn supports(kind: CollectiveKind) -> bool {
    matches!(kind, CollectiveKind::Broadcast | CollectiveKind::Reduce)
}

/// [`PARAMS`] within the chunk and step caps, on uniform hosts of two ranks or more and at
/// least [`Shape::min_hosts`] of them.
fn param_space(topo: &Topology, collective: Collective, shape: Shape) -> Vec<FamilyParams> {
    if !supports(collective.kind()) {
        return Vec::new();
    }
    let Some(hosts) = uniform_hosts(topo) else {
        return Vec::new();
    };
    if hosts.len() < shape.min_hosts() {
        return Vec::new();
    }
    let (nh, g) = (hosts.len() as u64, hosts[0].len() as u64);
    if g < 2 {
        return Vec::new();
    }
    PARAMS
        .iter()
        .filter(|&&(channels, pipeline)| {
            let pieces = u64::from(channels * pipeline);
            pieces * g <= MAX_CHUNKS && pieces * steps_per_piece(nh, g) <= MAX_STEPS
        })
        .map(|&(channels, pipeline)| FamilyParams { channels, pipeline })
        .collect()
}

fn schedules(
    name: &'static str,
    shape: Shape,
    topo: &Topology,
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Vec<Candidate> {
    let (Collective::Broadcast { root } | Collective::Reduce { root }) = collective else {
        return Vec::new();
    };
    let n = topo.nranks();
    if n == 1 {
        return single_rank(name, collective, in_place, params);
    }
    let Some(hosts) = uniform_hosts(topo) else {
        return Vec::new();
    };
    let g = hosts[0].len();
    let Some((h0, l0)) = hosts
        .iter()
        .enumerate()
        .find_map(|(h, ranks)| ranks.iter().position(|&x| x == root).map(|l| (h, l)))
    else {
        return Vec::new();
    };
    if g < 2 || hosts.len() < shape.min_hosts() {
        return Vec::new();
    }
    let nch = params.channels.max(1);
    let Some(pieces) = nch.checked_mul(params.pipeline.max(1)) else {
        return Vec::new();
    };
    let Some(chunks) = pieces.checked_mul(g as u32) else {
        return Vec::new();
    };
    let rails = Rails {
        hosts: &hosts,
        h0,
        l0,
        nch,
        shape,
    };
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    b.set_fusion(false);
    match collective {
        Collective::Broadcast { .. } => broadcast(&mut b, &rails, pieces, in_place),
        _ => reduce(&mut b, &rails, pieces),
    }
    let min = u64::from(chunks)
        * if chunks > DEEP_CHUNKS {
            DEEP_CHUNK_BYTES
        } else {
            MIN_CHUNK_BYTES
        };
    candidate(name, params, b)
        .into_iter()
        .map(|c| c.from_bytes(min))
        .collect()
}

fn estimated_steps(topo: &Topology, params: FamilyParams) -> u64 {
    let n = u64::from(topo.nranks());
    let nh = (topo.nhosts() as u64).max(1);
    let g = (n / nh).max(1);
    steps_per_piece(nh, g)
        .saturating_mul(u64::from(params.channels.max(1)))
        .saturating_mul(u64::from(params.pipeline.max(1)))
}
