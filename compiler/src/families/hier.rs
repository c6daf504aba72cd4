//! Hierarchical family: intra-host reduce-scatter, inter-host ring among ranks with the same
//! local index (rail-aligned), intra-host all-gather. AllGather and ReduceScatter use the
//! inter-host and intra-host halves. Needs more than one host, all of the same size.

use super::common::{
    Run, candidate, grid, ring_all_gather, ring_reduce_scatter, runs_of, uniform_hosts,
};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::Topology;

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
        let rails: Vec<Vec<Rank>> = (0..g as usize)
            .map(|l| hosts.iter().map(|h| h[l]).collect())
            .collect();
        let mut b = ScheduleBuilder::new(collective, n, n * m, in_place);
        let input = |_: Rank, k: u32| Loc::input(k);
        let output = |_: Rank, k: u32| Loc::output(k);
        let scratch = |_: Rank, k: u32| Loc::scratch(k);
        match kind {
            CollectiveKind::AllReduce => {
                for q in 0..pp {
                    for c in 0..nch {
                        let base = (c * pp + q) * g * nh;
                        let host_blocks: Vec<Vec<Run>> =
                            (0..g).map(|l| vec![(base + l * nh, nh)]).collect();
                        for ring in &hosts {
                            ring_reduce_scatter(&mut b, ring, &host_blocks, c, &input, &output);
                        }
                        for (l, ring) in rails.iter().enumerate() {
                            let blocks: Vec<Vec<Run>> = (0..nh)
                                .map(|j| vec![(base + l as u32 * nh + j, 1)])
                                .collect();
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &output, &output);
                            ring_all_gather(&mut b, ring, &blocks, c, &output, &output);
                        }
                        for ring in &hosts {
                            ring_all_gather(&mut b, ring, &host_blocks, c, &output, &output);
                        }
                    }
                }
            }
            CollectiveKind::AllGather => {
                if !in_place {
                    for r in 0..n {
                        b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
                    }
                }
                for q in 0..pp {
                    for c in 0..nch {
                        let idx = c * pp + q;
                        for ring in &rails {
                            let blocks: Vec<Vec<Run>> =
                                ring.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                            ring_all_gather(&mut b, ring, &blocks, c, &output, &output);
                        }
                        for ring in &hosts {
                            let blocks: Vec<Vec<Run>> = (0..g as usize)
                                .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                                .collect();
                            ring_all_gather(&mut b, ring, &blocks, c, &output, &output);
                        }
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
                for q in 0..pp {
                    for c in 0..nch {
                        let idx = c * pp + q;
                        for ring in &hosts {
                            let blocks: Vec<Vec<Run>> = (0..g as usize)
                                .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                                .collect();
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &input, &scratch);
                        }
                        for ring in &rails {
                            let blocks: Vec<Vec<Run>> =
                                ring.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                            ring_reduce_scatter(&mut b, ring, &blocks, c, &scratch, &rs_out);
                        }
                    }
                }
            }
        }
        candidate(self.name(), params, b)
    }
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
        grid(&[1, 2], &[1, 2], topo.nranks(), 4096.max(topo.nranks()))
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
