//! Direct (one-shot) families: `mesh` (every rank talks to every other directly: AllReduce as
//! reduce-own-slice-from-all-peers then all-gather it, direct AllGather, ReduceScatter,
//! AllToAll, Broadcast, Reduce), and the AllToAll families `pairwise` (n-1 fenced rounds,
//! round i sends to (r+i) mod n), `bruck` (⌈log2 n⌉ rounds through scratch) and `two_phase`
//! (intra-host gather, aggregated inter-host exchange).

use super::common::{candidate, grid, runs_of, single_rank, uniform_hosts};
use super::{Candidate, Family, FamilyParams, steps_per_piece};
use crate::builder::ScheduleBuilder;
use hccl_ir::{BlockLabel, BlockLayout, ChunkMap, Collective, CollectiveKind, Loc, Symmetry};
use hccl_topologies::Topology;

/// Direct schedules; `rounds` adds a fence after every round (pairwise ordering).
fn direct(
    name: &str,
    n: u32,
    collective: Collective,
    params: FamilyParams,
    in_place: bool,
    rounds: bool,
) -> Vec<Candidate> {
    if n == 1 {
        return single_rank(name, collective, in_place, params);
    }
    let nch = params.channels.max(1);
    let pp = params.pipeline.max(1);
    let m = nch * pp;
    let kind = collective.kind();
    let rooted = collective.root();
    if rooted.is_some_and(|r| r >= n) {
        return Vec::new();
    }
    let chunks = if rooted.is_some() { m } else { n * m };
    let mut b = ScheduleBuilder::new(collective, n, chunks, in_place);
    b.set_fusion(false);
    if !in_place {
        out_of_place_locals(&mut b, collective, n, m);
    }
    for q in 0..pp {
        for c in 0..nch {
            let idx = c * pp + q;
            match collective {
                Collective::Broadcast { root } | Collective::Reduce { root } => {
                    rooted_piece(&mut b, kind, root, n, idx, c);
                }
                _ => exchange_piece(&mut b, kind, (n, m), (idx, c), in_place, rounds),
            }
        }
    }
    if in_place && kind == CollectiveKind::AllToAll {
        for r in 0..n {
            for o in (0..n).filter(|&o| o != r) {
                b.copy((r, Loc::scratch(o * m)), (r, Loc::output(o * m)), m, 0);
            }
        }
    }
    let symmetry = direct_symmetry(n, collective);
    candidate(name, params, b)
        .into_iter()
        .map(|c| c.with_symmetry(symmetry.clone()))
        .collect()
}

/// The local parts of an out-of-place direct schedule: a rank's own block copied to its
/// output (AllGather, AllToAll; Broadcast at the root).
fn out_of_place_locals(b: &mut ScheduleBuilder, collective: Collective, n: u32, m: u32) {
    match collective.kind() {
        CollectiveKind::AllGather => {
            for r in 0..n {
                b.copy((r, Loc::input(0)), (r, Loc::output(r * m)), m, 0);
            }
        }
        CollectiveKind::AllToAll => {
            for r in 0..n {
                b.copy((r, Loc::input(r * m)), (r, Loc::output(r * m)), m, 0);
            }
        }
        CollectiveKind::Broadcast => {
            if let Some(root) = collective.root() {
                b.copy((root, Loc::input(0)), (root, Loc::output(0)), m, 0);
            }
        }
        _ => {}
    }
}

/// Piece `idx` of a direct Broadcast or Reduce on channel `c`: the root and every other
/// rank, in rank order from the root's next.
fn rooted_piece(
    b: &mut ScheduleBuilder,
    kind: CollectiveKind,
    root: u32,
    n: u32,
    idx: u32,
    c: u32,
) {
    for i in 1..n {
        let d = (root + i) % n;
        if kind == CollectiveKind::Broadcast {
            b.send(root, d, Loc::input(idx), 1, c);
            b.recv(d, root, Loc::output(idx), 1, c);
        } else {
            let src = if i == 1 {
                Loc::input(idx)
            } else {
                Loc::output(idx)
            };
            b.send(d, root, Loc::input(idx), 1, c);
            b.recv_reduce_copy(root, d, src, Loc::output(idx), 1, c);
        }
    }
}

/// Piece `idx` of a direct all-to-all exchange (AllReduce, ReduceScatter, AllGather,
/// AllToAll) on channel `c`, over `n` ranks with `m` pieces per block. Round `i`: every
/// rank `r` sends to `r + i` and receives from `r − i`. All sends of a round are recorded
/// before its receives, so every rank's ops come in the same relative order: the schedule is
/// invariant under rotations of the ranks (see `direct_symmetry`). With `rounds`, a fence
/// ends every round; AllReduce gathers its reduced pieces in a second set of rounds.
fn exchange_piece(
    b: &mut ScheduleBuilder,
    kind: CollectiveKind,
    (n, m): (u32, u32),
    (idx, c): (u32, u32),
    in_place: bool,
    rounds: bool,
) {
    let fence = |b: &mut ScheduleBuilder| {
        if rounds {
            for r in 0..n {
                b.fence(r);
            }
        }
    };
    let a2a_dst = |k: u32| {
        if in_place {
            Loc::scratch(k)
        } else {
            Loc::output(k)
        }
    };
    for i in 1..n {
        for send in [true, false] {
            for r in 0..n {
                let d = (r + i) % n;
                match kind {
                    CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                        let k = d * m + idx;
                        let out = match (kind, in_place) {
                            (CollectiveKind::ReduceScatter, false) => Loc::output(idx),
                            (CollectiveKind::ReduceScatter, true) => Loc::input(k),
                            _ => Loc::output(k),
                        };
                        let src = if i == 1 { Loc::input(k) } else { out };
                        if send {
                            b.send(r, d, Loc::input(k), 1, c);
                        } else {
                            b.recv_reduce_copy(d, r, src, out, 1, c);
                        }
                    }
                    CollectiveKind::AllGather => {
                        let src = if in_place {
                            Loc::output(r * m + idx)
                        } else {
                            Loc::input(idx)
                        };
                        if send {
                            b.send(r, d, src, 1, c);
                        } else {
                            b.recv(d, r, Loc::output(r * m + idx), 1, c);
                        }
                    }
                    _ => {
                        if send {
                            b.send(r, d, Loc::input(d * m + idx), 1, c);
                        } else {
                            b.recv(d, r, a2a_dst(r * m + idx), 1, c);
                        }
                    }
                }
            }
        }
        fence(b);
    }
    if kind == CollectiveKind::AllReduce {
        for i in 1..n {
            for send in [true, false] {
                for r in 0..n {
                    let d = (r + i) % n;
                    let k = r * m + idx;
                    if send {
                        b.send(r, d, Loc::output(k), 1, c);
                    } else {
                        b.recv(d, r, Loc::output(k), 1, c);
                    }
                }
            }
            fence(b);
        }
    }
}

/// The rotation symmetry of a direct schedule (ranks in their natural order, blocks numbered
/// by rank); rooted collectives have none.
fn direct_symmetry(n: u32, collective: Collective) -> Option<Symmetry> {
    if collective.root().is_some() {
        return None;
    }
    Some(Symmetry::ring(
        (0..n).collect(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        }),
    ))
}

/// Direct one-shot schedules (best on full meshes: NVSwitch, HCCS).
#[derive(Debug, Clone, Copy, Default)]
pub struct Mesh;

impl Family for Mesh {
    fn name(&self) -> &'static str {
        "mesh"
    }
    fn supports(&self, _kind: CollectiveKind) -> bool {
        true
    }
    fn param_space(&self, topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1, 2], topo.nranks(), 4096.max(topo.nranks()))
    }
    /// Mesh schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        direct(
            self.name(),
            topo.nranks(),
            collective,
            params,
            in_place,
            false,
        )
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        // Every rank exchanges with every other: n² steps per piece.
        let per_piece = match collective.kind() {
            CollectiveKind::AllReduce => 4 * n * n.saturating_sub(1),
            CollectiveKind::AllGather | CollectiveKind::AllToAll => n * (2 * n).saturating_sub(1),
            CollectiveKind::ReduceScatter => 2 * n * n.saturating_sub(1),
            CollectiveKind::Broadcast | CollectiveKind::Reduce => 2 * n,
        };
        Some(steps_per_piece(params, per_piece))
    }
}

/// Pairwise AllToAll: n-1 rounds separated by fences, round i sends to (r+i) mod n.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pairwise;

impl Family for Pairwise {
    fn name(&self) -> &'static str {
        "pairwise"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllToAll
    }
    fn param_space(&self, topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1], topo.nranks(), 4096.max(topo.nranks()))
    }
    /// Pairwise schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if collective != Collective::AllToAll {
            return Vec::new();
        }
        direct(
            self.name(),
            topo.nranks(),
            collective,
            params,
            in_place,
            true,
        )
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        (collective == Collective::AllToAll)
            .then(|| steps_per_piece(params, n * (3 * n).saturating_sub(2)))
    }
}

/// Bruck AllToAll: ⌈log2 n⌉ rounds through a rotated scratch copy (small messages).
#[derive(Debug, Clone, Copy, Default)]
pub struct Bruck;

impl Family for Bruck {
    fn name(&self) -> &'static str {
        "bruck"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllToAll
    }
    fn param_space(&self, _topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1], 1, u32::MAX)
    }
    /// Bruck schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let n = topo.nranks();
        if collective != Collective::AllToAll || n == 0 {
            return Vec::new();
        }
        if n == 1 {
            return single_rank(self.name(), collective, in_place, params);
        }
        let m = params.channels.max(1);
        let mut b = ScheduleBuilder::new(collective, n, n * m, in_place);
        b.set_fusion(false);
        for r in 0..n {
            for j in 1..n {
                let blk = (r + j) % n;
                b.copy((r, Loc::input(blk * m)), (r, Loc::scratch(j * m)), m, 0);
            }
            if !in_place {
                b.copy((r, Loc::input(r * m)), (r, Loc::output(r * m)), m, 0);
            }
        }
        let mut dist = 1;
        while dist < n {
            for c in 0..m {
                let chunks: Vec<u32> = (1..n)
                    .filter(|j| j & dist != 0)
                    .map(|j| j * m + c)
                    .collect();
                let runs = if m == 1 {
                    runs_of(chunks)
                } else {
                    chunks.into_iter().map(|k| (k, 1)).collect()
                };
                // All sends of the round read the blocks before any receive overwrites them.
                for r in 0..n {
                    for &(s, cnt) in &runs {
                        b.send(r, (r + dist) % n, Loc::scratch(s), cnt, c);
                    }
                }
                for r in 0..n {
                    for &(s, cnt) in &runs {
                        b.recv((r + dist) % n, r, Loc::scratch(s), cnt, c);
                    }
                }
            }
            dist *= 2;
        }
        for r in 0..n {
            for j in 1..n {
                let origin = (r + n - j) % n;
                b.copy((r, Loc::scratch(j * m)), (r, Loc::output(origin * m)), m, 0);
            }
        }
        candidate(self.name(), params, b)
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        let m = u64::from(params.channels.max(1));
        (collective == Collective::AllToAll)
            .then(|| (n * (4 * n).saturating_sub(3)).saturating_mul(m * m))
    }
}

/// Hierarchical AllToAll: gather per host by destination local index, then one aggregated
/// message per remote host. Needs more than one host, all of the same size (> 1 rank).
#[derive(Debug, Clone, Copy, Default)]
pub struct TwoPhase;

impl Family for TwoPhase {
    fn name(&self) -> &'static str {
        "two_phase"
    }
    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllToAll
    }
    fn param_space(&self, _topo: &Topology, _collective: Collective) -> Vec<FamilyParams> {
        grid(&[1, 2], &[1], 1, u32::MAX)
    }
    /// Two-phase schedules for either buffer arrangement.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        if collective != Collective::AllToAll {
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
        let m = params.channels.max(1);
        let mut b = ScheduleBuilder::new(collective, n, n * m, in_place);
        b.set_fusion(false);
        let stage = |h2: u32, l: u32| Loc::scratch((h2 * g + l) * m);
        let land = nh * g * m;
        if !in_place {
            for r in 0..n {
                b.copy((r, Loc::input(r * m)), (r, Loc::output(r * m)), m, 0);
            }
        }
        for c in 0..m {
            // Phase 1: (h, l) → (h, l') the blocks for every (h'', l').
            for ranks in &hosts {
                for (l, &r) in ranks.iter().enumerate() {
                    for (lp, &rp) in ranks.iter().enumerate() {
                        for (h2, dest_host) in hosts.iter().enumerate() {
                            let dest = dest_host[lp];
                            if dest == r {
                                continue;
                            }
                            let src = Loc::input(dest * m + c);
                            let dst = Loc::scratch(stage(h2 as u32, l as u32).off + c);
                            b.copy((r, src), (rp, dst), 1, c);
                        }
                    }
                }
            }
            // Phase 2: (h, l') → (h'', l') everything gathered for it.
            for (h, ranks) in hosts.iter().enumerate() {
                for (lp, &r) in ranks.iter().enumerate() {
                    for (h2, dest_host) in hosts.iter().enumerate() {
                        let dest = dest_host[lp];
                        for (l, &origin) in ranks.iter().enumerate() {
                            if origin == dest {
                                continue;
                            }
                            let src = Loc::scratch(stage(h2 as u32, l as u32).off + c);
                            if h2 == h {
                                b.copy((r, src), (r, Loc::output(origin * m + c)), 1, c);
                            } else {
                                let at = Loc::scratch(land + (h as u32 * g + l as u32) * m + c);
                                b.copy((r, src), (dest, at), 1, c);
                            }
                        }
                    }
                }
            }
            // Landing zone → output.
            for (h, ranks) in hosts.iter().enumerate() {
                for (hs, src_host) in hosts.iter().enumerate() {
                    if hs == h {
                        continue;
                    }
                    for &r in ranks {
                        for (l, &origin) in src_host.iter().enumerate() {
                            let at = Loc::scratch(land + (hs as u32 * g + l as u32) * m + c);
                            b.copy((r, at), (r, Loc::output(origin * m + c)), 1, c);
                        }
                    }
                }
            }
        }
        candidate(self.name(), params, b)
    }
    fn estimated_steps(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        (collective == Collective::AllToAll).then(|| steps_per_piece(params, 5 * n * n))
    }
}
