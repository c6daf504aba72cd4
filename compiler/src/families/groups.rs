//! Hierarchical-by-link-groups family (`groups`): the ranks joined by direct device links
//! (an HCCS full mesh of an Atlas 800, an NVLink island) form a *group*; groups talk over
//! whatever joins them (PCIe roots, the network). AllReduce = direct reduce-scatter inside
//! every group, direct all-reduce among the ranks with the same index in every group (all
//! such sets in parallel, each carrying `1/g` of the data), direct all-gather inside every
//! group; AllGather and ReduceScatter use the two halves. Pieces (`channels × pipeline`)
//! overlap: while one crosses between groups, the next is reduced inside them.
//!
//! Applies when there are at least two groups, all of the same size `g ≥ 2`.

use super::common::{Run, candidate, grid, runs_of};
use super::{Candidate, Family, FamilyParams};
use crate::builder::ScheduleBuilder;
use hccl_ir::{Collective, CollectiveKind, Loc, Rank};
use hccl_topologies::{Node, Topology};

/// Most chunks a groups schedule may use.
const MAX_GROUP_CHUNKS: u32 = 4096;

/// Where a rank keeps a run, given the run's first chunk.
type LocFn<'a> = &'a dyn Fn(Rank, u32) -> Loc;

/// Connected components of the direct device-to-device links inside each host (ranks
/// ascending; groups ordered by their first rank), when there are at least two and all have
/// the same size of at least two.
pub fn link_groups(topo: &Topology) -> Option<Vec<Vec<Rank>>> {
    let n = topo.nranks() as usize;
    let mut comp: Vec<usize> = (0..n).collect();
    fn find(comp: &mut [usize], x: usize) -> usize {
        let mut x = x;
        while comp[x] != x {
            comp[x] = comp[comp[x]];
            x = comp[x];
        }
        x
    }
    for a in 0..n {
        for b in a + 1..n {
            let Some(e) = topo.direct_edge(a as Rank, b as Rank) else {
                continue;
            };
            let both_devices = topo.graph.edge_endpoints(e).is_some_and(|(u, v)| {
                matches!(topo.graph[u], Node::Device { .. })
                    && matches!(topo.graph[v], Node::Device { .. })
            });
            if both_devices && topo.host_of[a] == topo.host_of[b] {
                let (ra, rb) = (find(&mut comp, a), find(&mut comp, b));
                comp[ra.max(rb)] = ra.min(rb);
            }
        }
    }
    let mut groups: Vec<Vec<Rank>> = Vec::new();
    let mut index_of = std::collections::BTreeMap::new();
    for r in 0..n {
        let root = find(&mut comp, r);
        let i = *index_of.entry(root).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(r as Rank);
    }
    let g = groups.first()?.len();
    (groups.len() > 1 && g >= 2 && groups.iter().all(|x| x.len() == g)).then_some(groups)
}

/// Direct reduce-scatter among `ranks`: runs `blocks[i]` end reduced on `ranks[i]`, every
/// other member sending its contribution straight to it.
fn direct_reduce_scatter(
    b: &mut ScheduleBuilder,
    ranks: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    contrib: LocFn<'_>,
    result: LocFn<'_>,
) {
    let n = ranks.len();
    for i in 1..n {
        for (j, &owner) in ranks.iter().enumerate() {
            let from = ranks[(j + i) % n];
            for &(s, c) in &blocks[j] {
                let acc = if i == 1 {
                    contrib(owner, s)
                } else {
                    result(owner, s)
                };
                b.send(from, owner, contrib(from, s), c, channel);
                b.recv_reduce_copy(owner, from, acc, result(owner, s), c, channel);
            }
        }
    }
}

/// Direct all-gather among `ranks`: runs `blocks[i]` start on `ranks[i]` at `have` and are
/// sent straight to every other member, stored at `put`.
fn direct_all_gather(
    b: &mut ScheduleBuilder,
    ranks: &[Rank],
    blocks: &[Vec<Run>],
    channel: u32,
    have: LocFn<'_>,
    put: LocFn<'_>,
) {
    let n = ranks.len();
    for i in 1..n {
        for (j, &owner) in ranks.iter().enumerate() {
            let to = ranks[(j + i) % n];
            for &(s, c) in &blocks[j] {
                b.send(owner, to, have(owner, s), c, channel);
                b.recv(to, owner, put(to, s), c, channel);
            }
        }
    }
}

/// The groups family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Groups;

impl Family for Groups {
    fn name(&self) -> &'static str {
        "groups"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        )
    }
    fn param_space(&self, topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(
            &[1, 2],
            &[1, 2, 4, 8, 16, 32],
            topo.nranks(),
            MAX_GROUP_CHUNKS.max(topo.nranks()),
        )
    }
    /// Groups schedules for either buffer arrangement.
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
        let Some(groups) = link_groups(topo) else {
            return Vec::new();
        };
        let (ng, g) = (groups.len() as u32, groups[0].len() as u32);
        let n = topo.nranks();
        let nch = params.channels.max(1);
        let pp = params.pipeline.max(1);
        let m = nch * pp;
        // Rails: the ranks with the same index in every group.
        let rails: Vec<Vec<Rank>> = (0..g as usize)
            .map(|l| groups.iter().map(|grp| grp[l]).collect())
            .collect();
        let mut b = ScheduleBuilder::new(collective, n, n * m, in_place);
        let input = |_: Rank, k: u32| Loc::input(k);
        let output = |_: Rank, k: u32| Loc::output(k);
        let scratch = |_: Rank, k: u32| Loc::scratch(k);
        match kind {
            CollectiveKind::AllReduce => {
                // Reduce-scatter halves on channel 2c, all-gather halves on 2c + 1: a
                // connection's ops run in order, so sharing one would hold the next piece's
                // reduce-scatter behind this piece's all-gather and defeat the pipeline.
                for q in 0..pp {
                    for c in 0..nch {
                        let (rs, ag) = (2 * c, 2 * c + 1);
                        let base = (c * pp + q) * n;
                        // Member l of a group reduces the run of its rail (ng chunks).
                        let group_blocks: Vec<Vec<Run>> =
                            (0..g).map(|l| vec![(base + l * ng, ng)]).collect();
                        for grp in &groups {
                            direct_reduce_scatter(&mut b, grp, &group_blocks, rs, &input, &output);
                        }
                        for (l, rail) in rails.iter().enumerate() {
                            let blocks: Vec<Vec<Run>> = (0..ng)
                                .map(|h| vec![(base + l as u32 * ng + h, 1)])
                                .collect();
                            direct_reduce_scatter(&mut b, rail, &blocks, rs, &output, &output);
                            direct_all_gather(&mut b, rail, &blocks, ag, &output, &output);
                        }
                        for grp in &groups {
                            direct_all_gather(&mut b, grp, &group_blocks, ag, &output, &output);
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
                        for rail in &rails {
                            let blocks: Vec<Vec<Run>> =
                                rail.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                            direct_all_gather(&mut b, rail, &blocks, c, &output, &output);
                        }
                        for grp in &groups {
                            let blocks: Vec<Vec<Run>> = (0..g as usize)
                                .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                                .collect();
                            direct_all_gather(&mut b, grp, &blocks, c, &output, &output);
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
                        for grp in &groups {
                            let blocks: Vec<Vec<Run>> = (0..g as usize)
                                .map(|l| runs_of(rails[l].iter().map(|&r| r * m + idx).collect()))
                                .collect();
                            direct_reduce_scatter(&mut b, grp, &blocks, c, &input, &scratch);
                        }
                        for rail in &rails {
                            let blocks: Vec<Vec<Run>> =
                                rail.iter().map(|&r| vec![(r * m + idx, 1)]).collect();
                            direct_reduce_scatter(&mut b, rail, &blocks, c, &scratch, &rs_out);
                        }
                    }
                }
            }
        }
        candidate(self.name(), params, b)
    }
}
