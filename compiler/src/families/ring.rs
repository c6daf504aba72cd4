//! Ring family (one ring per channel, edge-disjoint over direct links where the topology
//! has them) and the double ring (two counter-rotating rings per channel, each with half the
//! data). AllReduce = reduce-scatter + all-gather; Broadcast and Reduce are pipelined chains
//! from / to the root along the ring.

use super::common::{
    Run, candidate, grid, ring_all_gather, ring_orders, ring_reduce_scatter, rotate_to, single_rank,
};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

/// Most chunks a ring schedule may use (bounds plan size for large rank counts).
const MAX_RING_CHUNKS: u32 = 4096;

/// Generates ring schedules over the given rings (one per channel). Every ring carries an
/// equal share of the data, cut into `pipeline` pieces.
pub fn ring_schedule(
    name: &str,
    rings: &[Vec<Rank>],
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
) -> Vec<Candidate> {
    let n = rings.first().map_or(0, |r| r.len()) as u32;
    if n == 0 {
        return Vec::new();
    }
    if n == 1 {
        return single_rank(name, collective, in_place, params);
    }
    let nch = rings.len() as u32;
    let pp = params.pipeline.max(1);
    let m = nch * pp;
    match collective {
        Collective::Broadcast { root } | Collective::Reduce { root } => {
            if root >= n {
                return Vec::new();
            }
            let mut b = ScheduleBuilder::new(collective, n, m, in_place);
            b.set_fusion(false);
            chains(&mut b, rings, root, pp);
            candidate(name, params, b)
        }
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter => {
            let chunks = n * m;
            let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
            let kind = collective.kind();
            if kind == CollectiveKind::AllGather && !in_place {
                for r in 0..n {
                    b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
                }
            }
            let in_loc = |r: Rank, k: u32| -> Loc {
                match (kind, in_place) {
                    (CollectiveKind::AllGather, false) => Loc::input(k - r * m),
                    _ => Loc::output(k),
                }
            };
            let rs_out = |r: Rank, k: u32| -> Loc {
                match (kind, in_place) {
                    (CollectiveKind::ReduceScatter, true) => Loc::input(k),
                    (CollectiveKind::ReduceScatter, false) => Loc::output(k - r * m),
                    _ => Loc::output(k),
                }
            };
            let input = |_: Rank, k: u32| Loc::input(k);
            let output = |_: Rank, k: u32| Loc::output(k);
            for q in 0..pp {
                for (c, ring) in rings.iter().enumerate() {
                    let c = c as u32;
                    let blocks: Vec<Vec<Run>> = ring
                        .iter()
                        .map(|&owner| vec![(owner * m + c * pp + q, 1)])
                        .collect();
                    match kind {
                        CollectiveKind::AllReduce => {
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &input, &output);
                            ring_all_gather(&mut b, ring, &blocks, c, &output, &output);
                        }
                        CollectiveKind::ReduceScatter => {
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &input, &rs_out);
                        }
                        _ => {
                            ring_all_gather(&mut b, ring, &blocks, c, &in_loc, &output);
                        }
                    }
                }
            }
            candidate(name, params, b)
        }
        Collective::AllToAll => Vec::new(),
    }
}

/// Pipelined chains from (Broadcast) or to (Reduce) the root, one per ring.
fn chains(b: &mut ScheduleBuilder, rings: &[Vec<Rank>], root: Rank, pp: u32) {
    let collective = b.collective();
    let in_place = b.in_place();
    let m = rings.len() as u32 * pp;
    let bcast = matches!(collective, Collective::Broadcast { .. });
    if bcast && !in_place {
        b.copy((root, Loc::input(0)), (root, Loc::output(0)), m, 0);
    }
    for q in 0..pp {
        for (c, ring) in rings.iter().enumerate() {
            let ch = c as u32;
            let k = ch * pp + q;
            let mut chain = rotate_to(ring, root);
            if !bcast {
                // Reduce: walk the ring backwards so the chain ends at the root.
                chain[1..].reverse();
                chain.reverse();
            }
            let n = chain.len();
            for i in 0..n - 1 {
                let (from, at) = (chain[i], chain[i + 1]);
                let to = chain.get(i + 2).copied();
                if i == 0 {
                    b.send(from, at, Loc::input(k), 1, ch);
                }
                match (bcast, to) {
                    (true, Some(to)) => b.recv_copy_send(at, from, to, Loc::output(k), 1, ch),
                    (true, None) => b.recv(at, from, Loc::output(k), 1, ch),
                    (false, Some(to)) => b.recv_reduce_send(at, from, to, Loc::input(k), 1, ch),
                    (false, None) => {
                        b.recv_reduce_copy(at, from, Loc::input(k), Loc::output(k), 1, ch)
                    }
                }
            }
        }
    }
}

fn ring_params(topo: &Topology, collective: Collective, channels: &[u32]) -> Vec<FamilyParams> {
    let n = topo.nranks().max(1);
    match collective.kind() {
        CollectiveKind::Broadcast | CollectiveKind::Reduce => {
            grid(channels, &[1, 2, 4, 8], 1, MAX_RING_CHUNKS)
        }
        _ => grid(channels, &[1, 2], n, MAX_RING_CHUNKS.max(n)),
    }
}

/// The ring family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ring;

impl Ring {
    /// Ring schedules for either buffer arrangement.
    pub fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let rings = ring_orders(topo, params.channels.max(1) as usize);
        ring_schedule(self.name(), &rings, collective, params, in_place)
    }
}

impl Family for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind != CollectiveKind::AllToAll
    }
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        ring_params(topo, collective, &[1, 2, 4])
    }
    fn generate(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Vec<Candidate> {
        self.schedules(topo, collective, params, false)
    }
}

/// Two counter-rotating rings per channel, each carrying half of the channel's data.
#[derive(Debug, Clone, Copy, Default)]
pub struct DoubleRing;

impl DoubleRing {
    /// Double-ring schedules for either buffer arrangement.
    pub fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if topo.nranks() < 3 {
            return Vec::new();
        }
        let base = ring_orders(topo, params.channels.max(1) as usize);
        let mut rings = Vec::new();
        for ring in base {
            let mut rev = ring.clone();
            rev[1..].reverse();
            rings.push(ring);
            rings.push(rev);
        }
        ring_schedule(self.name(), &rings, collective, params, in_place)
    }
}

impl Family for DoubleRing {
    fn name(&self) -> &'static str {
        "double_ring"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind != CollectiveKind::AllToAll
    }
    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        ring_params(topo, collective, &[1, 2])
    }
    fn generate(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Vec<Candidate> {
        self.schedules(topo, collective, params, false)
    }
}
