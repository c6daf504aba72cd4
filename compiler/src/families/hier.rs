//! Hierarchical family: intra-host reduce-scatter, inter-host exchange among ranks with the
//! same local index (rail-aligned: local rank `i` of every host talks over its own NIC to
//! local rank `i` of the other hosts, so all rails run in parallel), intra-host all-gather.
//! AllGather and ReduceScatter use the inter-host and intra-host halves. Needs more than one
//! host, all of the same size.
//!
//! The buffer is cut into `channels × pipeline` pieces that flow through the phases as a
//! software pipeline. Every phase (intra-host reduce-scatter, inter-host ring, intra-host
//! all-gather) runs on channel ids of its own, so the builder neither puts two phases in one
//! stream nor fuses a phase's last receive with the next phase's first send: the
//! reduce-scatter of later pieces never waits behind the rail exchange or all-gather of
//! earlier ones, and NVLink and NIC phases of different pieces overlap. The intra-host
//! phases of the `channels` run concurrently (hiding each other's per-message latency); the
//! inter-host exchange takes the pieces in pipeline order over two alternating connections,
//! so the first piece reaches the all-gather after `1/pieces` of the NIC time rather than
//! `1/pipeline` of it. Channels are
//! independent pipelines that hide each other's per-message latency.
//!
//! Size: every rank takes part in one intra-host ring of `g` ranks and one rail ring of
//! `hosts` ranks per piece, so a schedule has `O(nranks · (g + hosts) · pieces)` steps.

use super::common::{
    LocFn, Run, candidate, grid, ring_all_gather, ring_reduce_scatter, runs_of, uniform_hosts,
};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

/// Most channel ids (hence connections and streams) the inter-host exchange cycles through:
/// `min(hosts, 4)`, at least 2. More hide more of the network's per-message latency (a rail
/// ring has `hosts − 1` hops); fewer let the first pieces through the NIC sooner.
const MAX_RAIL_STREAMS: u32 = 4;
/// Most chunks a hierarchical schedule may use on small rank counts (`nranks × pieces`).
const MAX_HIER_CHUNKS: u32 = 1024;
/// Most steps (roughly) a hierarchical candidate may have; larger pipelines are not offered.
const MAX_HIER_STEPS: u64 = 600_000;

/// The hierarchical family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hierarchical;

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
        if !matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        ) {
            return Vec::new();
        }
        let Some(hosts) = uniform_hosts(topo) else {
            return Vec::new();
        };
        let (nh, g) = (hosts.len() as u32, hosts[0].len() as u32);
        if g < 2 {
            return Vec::new();
        }
        let n = topo.nranks();
        let nch = params.channels.max(1);
        let pp = params.pipeline.max(1);
        let m = nch * pp;
        let Some(chunks) = n.checked_mul(m) else {
            return Vec::new();
        };
        let rail_streams = nh.clamp(2, MAX_RAIL_STREAMS);
        let rails: Vec<Vec<Rank>> = (0..g as usize)
            .map(|l| hosts.iter().map(|h| h[l]).collect())
            .collect();
        let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
        let input = |_: Rank, k: u32| Loc::input(k);
        let output = |_: Rank, k: u32| Loc::output(k);
        let scratch = |_: Rank, k: u32| Loc::scratch(k);
        // Pieces in pipeline order: piece `q` of every channel before piece `q + 1`.
        // Channel ids: intra-host phases on `0..intra_span` (AllReduce's reduce-scatter: one
        // per channel; AllGather's and ReduceScatter's only intra phase: one per channel and
        // run, see `split_runs`) and `intra_span + rail_streams..` (AllReduce's all-gather);
        // the inter-host exchange of the `s`-th piece on `intra_span + s % rail_streams`, so
        // that the NIC serves pieces in order (a few at a time) instead of every channel's
        // first piece at once.
        let intra_span = if kind == CollectiveKind::AllReduce {
            nch
        } else {
            nch * nh
        };
        let pieces: Vec<(u32, u32, u32)> = (0..pp)
            .flat_map(|q| (0..nch).map(move |c| (c, c * pp + q)))
            .enumerate()
            .map(|(s, (c, idx))| (c, idx, intra_span + s as u32 % rail_streams))
            .collect();
        let ag_channel = |c: u32| intra_span + rail_streams + c;
        match kind {
            CollectiveKind::AllReduce => {
                for &(c, idx, rc) in &pieces {
                    // Piece `idx` holds chunks `base .. base + g·nh`; local rank `l` owns
                    // `base + l·nh ..` after the intra-host reduce-scatter, and rail host `j`
                    // owns its chunk `j` of that after the inter-host reduce-scatter.
                    let base = idx * g * nh;
                    let host_blocks: Vec<Vec<Run>> =
                        (0..g).map(|l| vec![(base + l * nh, nh)]).collect();
                    for ring in &hosts {
                        ring_reduce_scatter(&mut b, ring, &host_blocks, c, &input, &output);
                    }
                    for (l, ring) in rails.iter().enumerate() {
                        let blocks: Vec<Vec<Run>> = (0..nh)
                            .map(|j| vec![(base + l as u32 * nh + j, 1)])
                            .collect();
                        ring_reduce_scatter(&mut b, ring, &blocks, rc, &output, &output);
                        ring_all_gather(&mut b, ring, &blocks, rc, &output, &output);
                    }
                    for ring in &hosts {
                        ring_all_gather(
                            &mut b,
                            ring,
                            &host_blocks,
                            ag_channel(c),
                            &output,
                            &output,
                        );
                    }
                }
            }
            CollectiveKind::AllGather => {
                if !in_place {
                    for r in 0..n {
                        b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
                    }
                }
                for &(c, idx, rc) in &pieces {
                    for ring in &rails {
                        let blocks: Vec<Vec<Run>> =
                            ring.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                        ring_all_gather(&mut b, ring, &blocks, rc, &output, &output);
                    }
                    for ring in &hosts {
                        let blocks: Vec<Vec<Run>> = (0..g as usize)
                            .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                            .collect();
                        split_runs(&mut b, ring, &blocks, c * nh, false, &output, &output);
                    }
                }
            }
            _ => {
                let rs_out = |r: Rank, k: u32| {
                    if in_place {
                        Loc::input(k)
                    } else {
                        Loc::output(k - r * m)
                    }
                };
                for &(c, idx, rc) in &pieces {
                    for ring in &hosts {
                        let blocks: Vec<Vec<Run>> = (0..g as usize)
                            .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                            .collect();
                        split_runs(&mut b, ring, &blocks, c * nh, true, &input, &scratch);
                    }
                    for ring in &rails {
                        let blocks: Vec<Vec<Run>> =
                            ring.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                        ring_reduce_scatter(&mut b, ring, &blocks, rc, &scratch, &rs_out);
                    }
                }
            }
        }
        candidate(self.name(), params, b)
    }
}

/// The `u`-th run of every block (blocks without one get none).
fn run_part(blocks: &[Vec<Run>], u: usize) -> Vec<Vec<Run>> {
    blocks
        .iter()
        .map(|r| r.get(u).into_iter().copied().collect())
        .collect()
}

/// Ring reduce-scatter (or all-gather) of multi-run blocks with run `u` on channel
/// `base + u`: the runs travel concurrently over connections of their own instead of one
/// ring pass after the other on one connection (a block of `k` runs costs `n − 1` message
/// latencies, not `k·(n − 1)`). Rings that relay need their passes one at a time per
/// connection: a relaying receive waits for a free outgoing slot before it consumes.
fn split_runs(
    b: &mut ScheduleBuilder,
    ring: &[Rank],
    blocks: &[Vec<Run>],
    base: u32,
    reduce: bool,
    from: LocFn<'_>,
    to: LocFn<'_>,
) {
    let runs = blocks.iter().map(Vec::len).max().unwrap_or(0);
    for u in 0..runs {
        let part = run_part(blocks, u);
        if reduce {
            ring_reduce_scatter(b, ring, &part, base + u as u32, from, to);
        } else {
            ring_all_gather(b, ring, &part, base + u as u32, from, to);
        }
    }
}

/// Rough step count of a hierarchical schedule with `pieces` pieces: per piece every rank
/// runs a reduce-scatter and/or all-gather over its host ring and its rail ring.
fn step_estimate(topo: &Topology, pieces: u32) -> u64 {
    let n = u64::from(topo.nranks());
    let hosts = topo.nhosts().max(1) as u64;
    let g = (n / hosts).max(1);
    2 * n * (g + hosts) * u64::from(pieces)
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
    fn param_space(&self, topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        let n = topo.nranks();
        let mut out: Vec<FamilyParams> =
            grid(&[2, 4, 8], &[1, 2, 4, 8, 16], n, MAX_HIER_CHUNKS.max(n))
                .into_iter()
                .filter(|p| step_estimate(topo, p.channels * p.pipeline) <= MAX_HIER_STEPS)
                .collect();
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
}
