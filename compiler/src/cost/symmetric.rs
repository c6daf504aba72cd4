//! Rank-class costing: the simulator run on the template program of a rank-symmetric
//! schedule, at the cost of one rank's steps instead of all ranks'.
//!
//! A [`SymmetricSchedule`] is a template program (rank `r0 = symmetry.ranks[0]`, grid
//! position 0) and a group of grid translations `T_P`: the rank at position `P` runs the
//! template translated by `x(P)`. When the network is invariant under the same translations
//! (each maps links and NIC directions onto ones of equal capacity, and the route between two
//! translated ranks is the translated route), [`Simulator::run`] on the expanded schedule is
//! invariant too: every rank's timeline is the template's. [`Simulator::run_symmetric`]
//! therefore simulates the template alone:
//!
//! - **Steps** are the template's: program order, dependencies, local work at rank `r0`'s
//!   memory bandwidth, fused and relaying receives and the connections'
//!   [`CONNECTION_SLOTS`], exactly as in [`super::sim`].
//! - **Messages** are the template's sends. A template receive from `q` (position `Q`) on
//!   channel `ch` takes what `q` sends to `r0`; `q` runs the template translated by `x(Q)`, so
//!   that message is the translate of the template's send to the peer `p'` with
//!   `T_Q(p') = r0` (found by search over the grid, so any mix of cyclic and XOR dimensions
//!   works), and the k-th receive from `q` on `ch` pairs with the k-th send on the template
//!   connection `(r0 → p', ch)`. Translations commute, so the receive that frees a slot of
//!   that connection (made by `p'`, at the same time by symmetry) is that same template
//!   receive: the template is a closed schedule of one rank.
//! - **Contention.** Every translate of an active template flow streams at the same time and
//!   rate. For a resource `R` and a template peer `p'`, `mult(p', R)` counts the positions `P`
//!   whose route from `T_P(r0)` to `T_P(p')` crosses `R` ([`Simulator::prepare_symmetric`]
//!   routes every translate of every template peer once). The full run's max-min fair rates
//!   are then the weighted max-min fair rates of the template's flows under
//!   `Σ_f mult(peer(f), R) · rate_f ≤ capacity(R)` for every `R`: progressive filling in which
//!   `R` saturates at `rem_R / Σ_{unfrozen f} mult(peer(f), R)`. Resources with the same
//!   capacity and multiplicities are one constraint; flows to one peer share their
//!   constraints and so their rate, so the filling runs over peers and is redone exactly at
//!   every flow start and end.
//! - **Latency** of a message is its template route's, as in [`super::sim`].
//! - **The estimate** is the full run's: time and base latency as simulated, messages and
//!   payload `nranks ×` the template's, and `resource_bytes[R] = Σ_m bytes(m) ·
//!   mult(peer(m), R)`: the whole network's traffic, which [`Simulator::lower_bound_us`]
//!   reads.
//!
//! Preparing costs `nranks × distinct template peers` routes (the ones the expanded schedule
//! needs too, cached in the [`super::Network`]); a run costs the template's events, each rate
//! computation `O(constraint entries)` (a 1024-rank hierarchical AllReduce: 112 template steps
//! instead of 114 688, 3 constraint rows).
//!
//! # Where it differs from the full run
//!
//! - Where the network is not invariant under the translations (rings rotated across hosts,
//!   whose template hop is NVLink where a translate's is a NIC; links of unequal capacity, as
//!   the DGX-1's doubled NVLinks; hosts that differ; routes whose ties the route search breaks
//!   by vertex number rather than by the translation), the full run is not symmetric. Here
//!   every translate of a flow still gets one rate, the largest no translate's resources
//!   exceed (a symmetric allocation), with the template route's latency, while the full run
//!   lets the other translates run at their own pace: estimates may differ by any factor (2×
//!   for rings across hosts). [`PreparedSymmetric::is_equivariant`] says whether the
//!   translations map the routes onto each other; a caller that needs the full run's estimate
//!   where they do not should simulate the expanded schedule.
//! - [`Simulator::run`] recomputes rates exactly only within components of at most
//!   [`super::sim::EXACT_COMPONENT`] interacting flows and approximates larger ones (slower:
//!   7.5% on a 1024-rank AllReduce pipelined 8 deep, which the two runs give identically
//!   when the full run is made exact); this module is always exact.
//! - Rounding breaks the full run's ties between ranks (a flow of one rank ends a few ulps
//!   before its translate's), and in long pipelines on many ranks those differences grow:
//!   within 0.5% on 32 ranks in the tests.
//! - On a CPU host model ([`super::CostModel::cpu`]) nothing is approximated: the schedule is
//!   expanded and simulated whole.

use super::CostError;
use super::contention::Contention;
use super::network::Route;
use super::prepared::{
    Estimate, FlatStep, Messages, NONE, Prepared, number_messages, step_kind, successors,
};
use super::sim::Simulator;
use super::steps::{Rates, Steps, total_order_key};
use hccl_ir::{Action, Protocol, StepRef, SymmetricSchedule, SymmetryTable};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

/// A symmetric schedule flattened for repeated simulation ([`Simulator::run_symmetric`]).
#[derive(Debug, Clone)]
pub struct PreparedSymmetric {
    form: Form,
    nranks: u32,
    template_steps: usize,
    equivariant: bool,
}

#[derive(Debug, Clone)]
enum Form {
    /// The template with its closed connections and contention constraints.
    Template(Box<Template>),
    /// The expanded schedule (CPU host models).
    Full(Box<Prepared>),
}

/// Per template peer, the resources its translates' routes cross, with multiplicities.
type ClassResources = Vec<Vec<(u32, u32)>>;

/// A translation group's generators (grid positions) and each position's predecessor and
/// generator (see [`generators`]).
type Generators = (Vec<usize>, Vec<(usize, usize)>);

#[derive(Debug, Clone)]
struct Template {
    /// The template's steps, and its connections `(r0 → p', ch)` with the route `r0 → p'`.
    prepared: Prepared,
    /// Number of resources of the network it was prepared for.
    resources: usize,
    /// Per connection: its peer class (one per distinct template peer `p'`).
    conn_class: Vec<u32>,
    /// The peer classes' resources and constraint rows (shared by the templates of one
    /// symmetry and peer set).
    contention: Arc<Contention>,
    /// Per resource: the chunks every rank's messages put on it in a whole run (the
    /// template's chunks per peer class times the class's multiplicity there), so a run's
    /// [`Estimate::resource_bytes`] is this times the chunk size.
    resource_chunks: Vec<f64>,
}

impl PreparedSymmetric {
    /// Steps one simulation runs: the template's, or every rank's where the schedule is
    /// simulated whole (CPU host models).
    pub fn step_count(&self) -> usize {
        match &self.form {
            Form::Template(t) => t.prepared.step_count(),
            Form::Full(p) => p.step_count(),
        }
    }

    /// Steps of the full schedule: `nranks ×` the template's.
    pub fn full_step_count(&self) -> usize {
        self.template_steps.saturating_mul(self.nranks as usize)
    }

    /// Whether runs simulate the template alone (`false`: the expanded schedule).
    pub fn is_template(&self) -> bool {
        matches!(self.form, Form::Template(_))
    }

    /// Whether the network and its routes are invariant under the symmetry's translations:
    /// each maps the resources the schedule's routes cross onto resources of equal capacity
    /// and routes onto routes (equal latency and link class), and every rank has the same
    /// memory bandwidth. Then the full run is symmetric and [`Simulator::run_symmetric`]
    /// gives its estimate (up to rounding, and where the full run computes rates exactly);
    /// otherwise the symmetric approximation of the [module documentation](crate::cost::symmetric). Always
    /// `true` for the expanded form.
    pub fn is_equivariant(&self) -> bool {
        self.equivariant
    }

    /// Distinct contention constraints of the template's flows (0 for the expanded form).
    pub fn constraint_rows(&self) -> usize {
        match &self.form {
            Form::Template(t) => t.contention.row_cap.len(),
            Form::Full(_) => 0,
        }
    }
}

impl Simulator {
    /// Flattens the template of `s` (see the [module documentation](crate::cost::symmetric)): checks the
    /// symmetry, peers and dependencies, pairs every template receive with the template send
    /// it mirrors, routes every translate of every template peer and builds the contention
    /// constraints. On a CPU host model, [`Simulator::prepare`] of the expanded schedule.
    pub fn prepare_symmetric(&self, s: &SymmetricSchedule) -> Result<PreparedSymmetric, CostError> {
        let n = self.network.nranks();
        if s.nranks != n {
            return Err(CostError::RankMismatch {
                schedule: s.nranks,
                topology: n,
            });
        }
        if s.chunks == 0 {
            return Err(CostError::NoChunks);
        }
        let bad = |e: hccl_ir::SymmetryError| CostError::BadSymmetry(e.to_string());
        let table = s.table().map_err(bad)?;
        let template_steps = s.template_step_count();
        if self.model.cpu.is_some() {
            let full = s.expand().map_err(bad)?;
            return Ok(PreparedSymmetric {
                form: Form::Full(Box::new(self.prepare(&full)?)),
                nranks: n,
                template_steps,
                equivariant: true,
            });
        }
        let r0 = table
            .rank_at(0)
            .ok_or_else(|| CostError::BadSymmetry("the grid has no position 0".into()))?;
        if template_steps >= NONE as usize {
            return Err(CostError::TooLarge {
                steps: template_steps,
            });
        }
        let prog = &s.template;
        let TemplateFlat {
            mut steps,
            step_ref,
            pending,
            edges,
            conn_peer,
            conn_sends,
            conn_recvs,
            send_pos,
            recv_pos,
        } = self.flatten_template(prog, &table, r0)?;
        let total = steps.len();
        let Messages {
            conn_base,
            conn_len,
            msg_conn,
            msg_count,
            msg_send,
            msg_recv,
        } = number_messages(&mut steps, &conn_sends, &conn_recvs, &send_pos, &recv_pos);
        let (succ_start, succ) = successors(total, &edges);
        let pairs: Vec<(u32, u32)> = conn_peer.iter().map(|&p| (r0, p)).collect();
        let conn_route = self.network.routes(&pairs)?;
        // Peer classes, and the multiplicity of every resource on the translated routes.
        let mut class_peer = conn_peer.clone();
        class_peer.sort_unstable();
        class_peer.dedup();
        let conn_class: Vec<u32> = conn_peer
            .iter()
            .map(|p| class_peer.binary_search(p).unwrap_or(0) as u32)
            .collect();
        let contention = self.contention(s, &table, r0, &class_peer)?;
        let nres = self.network.capacity.len();
        let prepared = Prepared {
            max_count: msg_count.iter().copied().max().unwrap_or(0),
            steps,
            step_ref,
            succ_start,
            succ,
            pending,
            msg_conn,
            msg_count,
            msg_send,
            msg_recv,
            conn_base,
            conn_len,
            conn_route,
            flow_routes: Default::default(),
            walk_order: Default::default(),
            path_points: Default::default(),
            chunks: s.chunks,
            collective: s.collective,
            max_scratch: prog.scratch_chunks,
        };
        let equivariant = contention.equivariant;
        let resource_chunks = resource_chunks(
            &prepared,
            (&conn_class, class_peer.len()),
            &contention,
            nres,
        );
        Ok(PreparedSymmetric {
            form: Form::Template(Box::new(Template {
                prepared,
                resources: nres,
                conn_class,
                contention,
                resource_chunks,
            })),
            nranks: n,
            template_steps,
            equivariant,
        })
    }

    /// The template `prog` of rank `r0` flattened: its steps, edges and connections
    /// `(r0 → peer, channel)`, a receive from `q` put on the connection of the template peer
    /// it mirrors (see [`Simulator::prepare_symmetric`]); checks peers and dependencies.
    fn flatten_template(
        &self,
        prog: &hccl_ir::RankProgram,
        table: &SymmetryTable,
        r0: u32,
    ) -> Result<TemplateFlat, CostError> {
        let n = self.network.nranks();
        // The template peer whose message a receive from `q` mirrors: p' with T_pos(q)(p') = r0.
        let mut mirrors: FxHashMap<u32, u32> = FxHashMap::default();
        let mut mirror = |q: u32| -> Result<u32, CostError> {
            if let Some(&p) = mirrors.get(&q) {
                return Ok(p);
            }
            // p' sits at the inverse of q's position (r0 is at position 0).
            let p = table
                .position_of(q)
                .and_then(|pos| table.rank_at(table.inverse_position(pos)));
            let p = p.ok_or_else(|| {
                CostError::BadSymmetry(format!(
                    "no rank translates to rank {r0} by the position of rank {q}"
                ))
            })?;
            mirrors.insert(q, p);
            Ok(p)
        };
        let mut stream_base = Vec::with_capacity(prog.streams.len());
        let mut total = 0u32;
        for st in &prog.streams {
            stream_base.push(total);
            total += st.steps.len() as u32;
        }
        let total = total as usize;
        let mut steps = Vec::with_capacity(total);
        let mut step_ref = Vec::with_capacity(total);
        let mut pending = vec![0u32; total];
        let mut edges: Vec<(u32, u32)> = Vec::with_capacity(total * 2);
        // Connections (r0 → peer, channel).
        let mut conn_index: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        let mut conn_peer: Vec<u32> = Vec::new();
        let mut conn_sends: Vec<Vec<u32>> = Vec::new();
        let mut conn_recvs: Vec<Vec<u32>> = Vec::new();
        let mut conn_of = |peer: u32, channel: u32| -> usize {
            *conn_index.entry((peer, channel)).or_insert_with(|| {
                conn_peer.push(peer);
                conn_sends.push(Vec::new());
                conn_recvs.push(Vec::new());
                (conn_peer.len() - 1) as u32
            }) as usize
        };
        let mut conn_steps: Vec<(Option<usize>, Option<usize>)> = Vec::with_capacity(total);
        for (si, stream) in prog.streams.iter().enumerate() {
            for (ti, step) in stream.steps.iter().enumerate() {
                let id = stream_base[si] + ti as u32;
                let at = StepRef {
                    rank: r0,
                    stream: si as u32,
                    step: ti as u32,
                };
                if ti > 0 {
                    edges.push((id - 1, id));
                    pending[id as usize] += 1;
                }
                for dep in &step.deps {
                    let target = prog
                        .streams
                        .get(dep.stream as usize)
                        .filter(|s| (dep.step as usize) < s.steps.len())
                        .map(|_| stream_base[dep.stream as usize] + dep.step)
                        .ok_or(CostError::BadDep { at })?;
                    edges.push((target, id));
                    pending[id as usize] += 1;
                }
                let mut halves = (None, None);
                if let Some(to) = step.op.send_peer() {
                    if to >= n || to == r0 {
                        return Err(CostError::BadPeer { from: r0, to });
                    }
                    halves.0 = Some(conn_of(to, stream.channel));
                }
                if let Some(from) = step.op.recv_peer() {
                    if from >= n || from == r0 {
                        return Err(CostError::BadPeer { from, to: r0 });
                    }
                    halves.1 = Some(conn_of(mirror(from)?, stream.channel));
                }
                conn_steps.push(halves);
                steps.push(FlatStep {
                    rank: r0,
                    count: step.count,
                    kind: step_kind(&step.op, &self.model),
                });
                step_ref.push(at);
            }
        }
        // Each step's (connection, position) of its send half and its receive half.
        let mut send_pos = Vec::with_capacity(total);
        let mut recv_pos = Vec::with_capacity(total);
        for (id, &(sc, rc)) in conn_steps.iter().enumerate() {
            let at = |c: Option<usize>, list: &mut Vec<Vec<u32>>| match c {
                Some(c) => {
                    list[c].push(id as u32);
                    (c as u32, (list[c].len() - 1) as u32)
                }
                None => (NONE, NONE),
            };
            send_pos.push(at(sc, &mut conn_sends));
            recv_pos.push(at(rc, &mut conn_recvs));
        }
        Ok(TemplateFlat {
            steps,
            step_ref,
            pending,
            edges,
            conn_peer,
            conn_sends,
            conn_recvs,
            send_pos,
            recv_pos,
        })
    }

    /// The contention constraints of a template whose distinct peers are `class_peer`
    /// (sorted): every translate of every peer's route, routed, counted per resource and
    /// folded into rows; and whether the translations are symmetries of those routes. The
    /// candidates of one family on one machine share their symmetry and peers (they differ
    /// in pipeline depth), so the result is cached per symmetry and peer list.
    fn contention(
        &self,
        s: &SymmetricSchedule,
        table: &SymmetryTable,
        r0: u32,
        class_peer: &[u32],
    ) -> Result<Arc<Contention>, CostError> {
        let key = (s.symmetry.clone(), class_peer.to_vec());
        if let Some(hit) = self.symmetric_cache.get(&key) {
            return Ok(hit);
        }
        let _turn = self
            .symmetric_cache
            .turn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(hit) = self.symmetric_cache.get(&key) {
            return Ok(hit);
        }
        let (class_resources, equivariant) =
            match self.class_resources_by_symmetry(s, table, r0, class_peer) {
                Some(found) => (found, self.uniform_memory(r0)),
                None => self.class_resources_searched(s, table, r0, class_peer)?,
            };
        let nres = self.network.capacity.len();
        // Constraint rows: resources with equal capacity and multiplicities are one.
        let mut res_classes: Vec<Vec<(u32, u32)>> = vec![Vec::new(); nres];
        for (c, list) in class_resources.iter().enumerate() {
            for &(r, k) in list {
                res_classes[r as usize].push((c as u32, k));
            }
        }
        let mut rows: FxHashMap<(u64, Vec<(u32, u32)>), u32> = FxHashMap::default();
        let mut class_rows = vec![Vec::new(); class_peer.len()];
        let mut row_classes = Vec::new();
        let mut row_cap = Vec::new();
        for (r, classes) in res_classes.into_iter().enumerate() {
            if classes.is_empty() {
                continue;
            }
            let cap = self.network.capacity[r];
            if let Entry::Vacant(v) = rows.entry((cap.to_bits(), classes)) {
                let row = row_cap.len() as u32;
                for &(c, k) in &v.key().1 {
                    class_rows[c as usize].push((row, k));
                }
                row_classes.push(v.key().1.clone());
                row_cap.push(cap);
                v.insert(row);
            }
        }
        let out = Arc::new(Contention {
            class_resources,
            class_rows,
            row_classes,
            row_cap,
            equivariant,
        });
        if let Ok(mut cache) = self.symmetric_cache.held.lock() {
            cache.insert(key, out.clone());
        }
        Ok(out)
    }

    /// Per template peer (of `class_peer`), the resources the routes of its translates
    /// cross with their multiplicities, every translate routed by a search; and whether
    /// the translations are symmetries of those routes ([`Simulator::equivariant`]).
    fn class_resources_searched(
        &self,
        s: &SymmetricSchedule,
        table: &SymmetryTable,
        r0: u32,
        class_peer: &[u32],
    ) -> Result<(ClassResources, bool), CostError> {
        let n = self.network.nranks();
        let mut translated = Vec::with_capacity(class_peer.len() * n as usize);
        for &peer in class_peer {
            for pos in 0..n as usize {
                let (Some(t), Some(from)) = (table.translation(pos), table.rank_at(pos)) else {
                    return Err(CostError::BadSymmetry(format!("no grid position {pos}")));
                };
                translated.push((from, t.rank(peer)));
            }
        }
        let routes = self.network.routes_uncached(&translated)?;
        let nres = self.network.capacity.len();
        let equivariant = self.equivariant(s, table, r0, &translated, &routes);
        let mut mult = vec![0u32; nres];
        let class_resources = routes
            .chunks(n as usize)
            .map(|class_routes| {
                multiplicities(class_routes.iter().flat_map(|r| &r.resources), &mut mult)
            })
            .collect();
        Ok((class_resources, equivariant))
    }

    /// [`Simulator::class_resources_searched`] without the searches, when the network's
    /// automorphisms carry the routes: each generator of the translation group extends to
    /// an [`Automorphism`](super::network::Automorphism) of the network, and the template's
    /// routes are each the only best path ([`super::Network::unique_routes`]). A translate's
    /// route is then its predecessor's mapped by one generator's automorphism (exactly the
    /// route a search finds), and the translations are symmetries of the routes. `None`
    /// when any of that fails: the caller searches every translate.
    fn class_resources_by_symmetry(
        &self,
        s: &SymmetricSchedule,
        table: &SymmetryTable,
        r0: u32,
        class_peer: &[u32],
    ) -> Option<ClassResources> {
        let net = &self.network;
        let n = s.nranks as usize;
        let (generators, steps) = generators(&s.symmetry, n)?;
        let autos = generators
            .iter()
            .map(|&g| {
                let t = table.translation(g)?;
                let image: Vec<u32> = (0..n as u32).map(|r| t.rank(r)).collect();
                net.automorphism(&image)
            })
            .collect::<Option<Vec<_>>>()?;
        let base = net.unique_routes(r0, class_peer)?;
        // `T_pos = T_g ∘ T_pred` for every step: a translation is the one by its offset, and
        // `r0` sits at position 0, so it suffices that `T_g` moves the rank at `pred` to the
        // rank at `pos`. Then every translate's ends are its predecessor's moved by `g`.
        let gens = generators
            .iter()
            .map(|&g| table.translation(g))
            .collect::<Option<Vec<_>>>()?;
        for (pos, &(pred, gi)) in steps.iter().enumerate().skip(1) {
            if table.rank_at(pred).map(|x| gens[gi].rank(x)) != table.rank_at(pos) {
                return None;
            }
        }
        let mut mult = vec![0u32; net.capacity.len()];
        let mut class_resources = Vec::with_capacity(class_peer.len());
        let mut at: Vec<u32> = Vec::new();
        for route in &base {
            let len = route.resources.len();
            at.clear();
            at.extend_from_slice(&route.resources);
            for &(pred, gi) in steps.iter().skip(1) {
                for k in 0..len {
                    let r = autos[gi].resource(at[pred * len + k]);
                    at.push(r);
                }
            }
            class_resources.push(multiplicities(&at, &mut mult));
        }
        Some(class_resources)
    }

    /// Whether every rank has `r0`'s memory bandwidth.
    fn uniform_memory(&self, r0: u32) -> bool {
        let bw = &self.network.mem_bw;
        bw.iter().all(|b| b.to_bits() == bw[r0 as usize].to_bits())
    }

    /// Whether the translations are symmetries of what the full run sees (see
    /// [`PreparedSymmetric::is_equivariant`]): for each generator `g` of the translation group
    /// (a unit step of every cyclic dimension, every bit of every XOR one), the routes of the
    /// translated pairs `(a, b)` (all of them, since they are closed under translation) map
    /// position by position onto the routes of `(T_g a, T_g b)` through one injective map of
    /// resources that keeps capacities, with equal latency and link class; and every rank
    /// has `r0`'s memory bandwidth.
    fn equivariant(
        &self,
        s: &SymmetricSchedule,
        table: &SymmetryTable,
        r0: u32,
        pairs: &[(u32, u32)],
        routes: &[Route],
    ) -> bool {
        let net = &self.network;
        if net
            .mem_bw
            .iter()
            .any(|&bw| bw.to_bits() != net.mem_bw[r0 as usize].to_bits())
        {
            return false;
        }
        // The pairs are laid out class by class, each class by grid position: the pair of
        // rank `a` at position `pos` sits at `class × n + pos`, and its translate by `g` at
        // the position of `T_g a` in the same class.
        let n = s.nranks as usize;
        let Some((generators, _)) = generators(&s.symmetry, n) else {
            return false;
        };
        let nres = net.capacity.len();
        let mut image = vec![NONE; nres];
        let mut preimage = vec![NONE; nres];
        let mut touched = Vec::new();
        let same = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-9);
        for g in generators {
            let Some(t) = table.translation(g) else {
                return false;
            };
            for &r in &touched {
                image[r as usize] = NONE;
                preimage[r as usize] = NONE;
            }
            touched.clear();
            for (i, &(a, b)) in pairs.iter().enumerate() {
                let Some(pos) = table.position_of(t.rank(a)) else {
                    return false;
                };
                let j = i - i % n + pos;
                if pairs.get(j) != Some(&(t.rank(a), t.rank(b))) {
                    return false;
                }
                let (x, y) = (&routes[i], &routes[j]);
                if x.resources.len() != y.resources.len()
                    || x.class != y.class
                    || !same(x.latency_us, y.latency_us)
                {
                    return false;
                }
                for (&rx, &ry) in x.resources.iter().zip(&y.resources) {
                    let (ix, iy) = (rx as usize, ry as usize);
                    if image[ix] == NONE && preimage[iy] == NONE {
                        if net.capacity[ix].to_bits() != net.capacity[iy].to_bits() {
                            return false;
                        }
                        image[ix] = ry;
                        preimage[iy] = rx;
                        touched.extend([rx, ry]);
                    } else if image[ix] != ry || preimage[iy] != rx {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Simulates a prepared symmetric schedule for a collective of `bytes` under `protocol`:
    /// the estimate [`Simulator::run`] gives for the expanded schedule wherever that run is
    /// symmetric (see the [module documentation](crate::cost::symmetric)). `p` must come from
    /// [`Simulator::prepare_symmetric`] on the same network and kind of model.
    pub fn run_symmetric(
        &self,
        p: &PreparedSymmetric,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        self.run_symmetric_noting(p, (bytes, protocol), false)
    }

    /// [`Simulator::run_symmetric`], the estimate with the run's course when `course` holds
    /// ([`Estimate::course`]).
    pub fn run_symmetric_noting(
        &self,
        p: &PreparedSymmetric,
        (bytes, protocol): (u64, Protocol),
        course: bool,
    ) -> Result<Estimate, CostError> {
        let mismatch = |what: &str| Err(CostError::BadSymmetry(format!("prepared for {what}")));
        if p.nranks != self.network.nranks() {
            return Err(CostError::RankMismatch {
                schedule: p.nranks,
                topology: self.network.nranks(),
            });
        }
        match &p.form {
            Form::Full(prepared) if course => self
                .run_limited(prepared, (bytes, protocol), f64::INFINITY, true)
                .and_then(|e| {
                    e.ok_or(CostError::PastLimit {
                        limit_us: f64::INFINITY,
                        at_us: f64::INFINITY,
                    })
                }),
            Form::Full(prepared) => self.run(prepared, bytes, protocol),
            Form::Template(_) if self.model.cpu.is_some() => mismatch("the flow model"),
            Form::Template(t) if t.resources != self.network.capacity.len() => {
                mismatch("another network")
            }
            Form::Template(t) => run_template(self, t, p.nranks, (bytes, protocol), course),
        }
    }
}

/// How many times each resource occurs in `resources`, as (resource, count) by resource;
/// `mult` is zero throughout before and after (scratch indexed by resource).
fn multiplicities<'a>(
    resources: impl IntoIterator<Item = &'a u32>,
    mult: &mut [u32],
) -> Vec<(u32, u32)> {
    let mut touched: Vec<u32> = Vec::new();
    for &r in resources {
        if mult[r as usize] == 0 {
            touched.push(r);
        }
        mult[r as usize] += 1;
    }
    touched.sort_unstable();
    touched
        .into_iter()
        .map(|r| (r, std::mem::take(&mut mult[r as usize])))
        .collect()
}

/// The generators of a symmetry's translation group as grid positions (a unit step of
/// every cyclic dimension, every bit of every XOR one), and for every position `pos > 0` a
/// predecessor `pred < pos` and the index `g` of a generator with `T_pos = T_g ∘ T_pred`
/// (the least significant coordinate that is not zero, stepped back by one or by its lowest
/// bit; entry 0 is unused). `None` when the grid does not hold `n` positions.
fn generators(sym: &hccl_ir::Symmetry, n: usize) -> Option<Generators> {
    let mut gens = Vec::new();
    // Per dimension, least significant first: stride, size, action, its first generator.
    let mut layout = Vec::new();
    let mut stride = 1usize;
    for (&d, &action) in sym.dims.iter().zip(&sym.actions).rev() {
        let d = d as usize;
        let first = gens.len();
        match action {
            Action::Cyclic if d > 1 => gens.push(stride),
            Action::Cyclic => {}
            Action::Xor if d.is_power_of_two() => {
                gens.extend((0..d.trailing_zeros()).map(|bit| (1usize << bit) * stride))
            }
            Action::Xor => return None,
        }
        layout.push((stride, d, action, first));
        stride = stride.checked_mul(d)?;
    }
    if stride != n {
        return None;
    }
    let mut steps = vec![(0, 0); n];
    for (pos, step) in steps.iter_mut().enumerate().skip(1) {
        let &(stride, d, action, first) = layout
            .iter()
            .find(|&&(stride, d, _, _)| (pos / stride) % d != 0)?;
        let k = (pos / stride) % d;
        *step = match action {
            Action::Cyclic => (pos - stride, first),
            Action::Xor => {
                let bit = k.trailing_zeros() as usize;
                (pos - (1 << bit) * stride, first + bit)
            }
        };
    }
    Some((gens, steps))
}

/// Weighted max-min fair rates of a template's flows (every translate of a flow at its
/// rate; see [`ClassRates::fill`]).
struct ClassRates<'a> {
    t: &'a Template,
    p: &'a Prepared,
    /// GB/s → bytes/µs under the protocol's efficiency and the bandwidth factor.
    cap_scale: f64,
    // flows (indexed by message)
    rate: Vec<f64>,
    remaining: Vec<f64>,
    last: Vec<f64>,
    /// Per flow: the push order of its live end event (0: none).
    end_seq: Vec<u32>,
    active: Vec<bool>,
    /// The active flows.
    flows: Vec<u32>,
    /// Flows started or finished since the last rate computation.
    dirty: bool,
    // scratch of the filling
    class_active: Vec<u64>,
    class_rate: Vec<f64>,
    class_frozen: Vec<bool>,
    row_rem: Vec<f64>,
    row_weight: Vec<u64>,
    row_seen: Vec<bool>,
    /// Bumped whenever a row's remainder or weight changes: heap entries of older stamps
    /// are stale.
    row_stamp: Vec<u32>,
    live_rows: Vec<u32>,
    /// Rows by fair share `(share key, row, stamp)`, least first (ties: lowest row).
    heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
}

impl<'a> ClassRates<'a> {
    fn new(sim: &Simulator, t: &'a Template, bytes: u64, protocol: Protocol) -> ClassRates<'a> {
        let p = &t.prepared;
        let nmsg = p.msg_conn.len();
        let (nclass, nrows) = (t.contention.class_rows.len(), t.contention.row_cap.len());
        let scale = sim.model.bandwidth_factor(bytes);
        ClassRates {
            t,
            p,
            cap_scale: sim.model.efficiency(protocol) * scale * 1e3,
            rate: vec![0.0; nmsg],
            remaining: vec![0.0; nmsg],
            last: vec![0.0; nmsg],
            end_seq: vec![0; nmsg],
            active: vec![false; nmsg],
            flows: Vec::new(),
            dirty: false,
            class_active: vec![0; nclass],
            class_rate: vec![0.0; nclass],
            class_frozen: vec![false; nclass],
            row_rem: vec![0.0; nrows],
            row_weight: vec![0; nrows],
            row_seen: vec![false; nrows],
            row_stamp: vec![0; nrows],
            live_rows: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    fn class_of(&self, m: u32) -> usize {
        self.t.conn_class[self.p.msg_conn[m as usize] as usize] as usize
    }
}

impl Rates for ClassRates<'_> {
    fn start(&mut self, st: &mut Steps<'_>, m: u32, bytes: f64) {
        let mi = m as usize;
        self.active[mi] = true;
        self.flows.push(m);
        self.remaining[mi] = bytes;
        self.rate[mi] = 0.0;
        self.last[mi] = st.now;
        self.dirty = true;
    }

    fn finish(&mut self, _st: &mut Steps<'_>, m: u32) {
        self.active[m as usize] = false;
        if let Some(pos) = self.flows.iter().position(|&f| f == m) {
            self.flows.swap_remove(pos);
        }
        self.dirty = true;
    }

    fn current(&self, m: u32, seq: u32) -> bool {
        self.active[m as usize] && self.end_seq[m as usize] == seq
    }

    fn dirty(&self) -> bool {
        self.dirty
    }

    fn recompute(&mut self, st: &mut Steps<'_>) {
        self.fill(st);
    }

    /// Rates are always exact: nothing is left to re-balance.
    fn revive(&mut self, _st: &mut Steps<'_>) -> bool {
        false
    }
}

/// Runs a template: the step logic of [`super::sim`], rates by [`ClassRates`]; counts and
/// resource bytes scaled to the whole network.
fn run_template(
    sim: &Simulator,
    t: &Template,
    nranks: u32,
    (bytes, protocol): (u64, Protocol),
    course: bool,
) -> Result<Estimate, CostError> {
    let p = &t.prepared;
    let mut st = super::buffers::with(|b| {
        Steps::new(&sim.network, &sim.model, p, (bytes, protocol), false, b)
    });
    st.tracking = course && sim.model.affine_in_size();
    let mut rates = ClassRates::new(sim, t, bytes, protocol);
    let result = st.execute(&mut rates);
    let (now, messages, payload, course) = (st.now, st.messages, st.payload, st.course);
    let tracking = st.tracking;
    super::buffers::with(|b| st.recycle(b));
    result?;
    let chunk_bytes = bytes as f64 / f64::from(p.chunks);
    let resource_bytes = t.resource_chunks.iter().map(|&c| c * chunk_bytes).collect();
    let n = nranks as usize;
    let base = sim.model.base_us(protocol);
    Ok(Estimate {
        time_us: base + now,
        base_us: base,
        messages: messages * n,
        payload_bytes: payload * n as f64,
        resource_bytes,
        course: tracking.then_some(course),
    })
}

impl<'a> ClassRates<'a> {
    /// Weighted max-min fair rates of the active flows: progressive filling over peer
    /// classes (flows to one peer share every constraint, so their rate), each constraint
    /// row saturating at `rem / Σ_{unfrozen classes} mult · active flows`.
    fn fill(&mut self, st: &mut Steps<'_>) {
        self.dirty = false;
        let t: &'a Template = self.t;
        self.class_active.iter_mut().for_each(|a| *a = 0);
        for i in 0..self.flows.len() {
            let c = self.class_of(self.flows[i]);
            self.class_active[c] += 1;
        }
        self.live_rows.clear();
        for (c, &active) in self.class_active.iter().enumerate() {
            self.class_frozen[c] = false;
            if active == 0 {
                continue;
            }
            for &(row, k) in &t.contention.class_rows[c] {
                let ri = row as usize;
                if !self.row_seen[ri] {
                    self.row_seen[ri] = true;
                    self.row_rem[ri] = t.contention.row_cap[ri] * self.cap_scale;
                    self.row_weight[ri] = 0;
                    self.live_rows.push(row);
                }
                self.row_weight[ri] += u64::from(k) * active;
            }
        }
        // The least share first, ties to the lowest row: a heap of every live row's share,
        // an entry dropped when its row changed since (stamp) or has nothing left to fill.
        self.heap.clear();
        for &row in &self.live_rows {
            let ri = row as usize;
            let w = self.row_weight[ri];
            if w > 0 {
                let key = total_order_key(self.row_rem[ri] / w as f64);
                self.heap.push(Reverse((key, row, self.row_stamp[ri])));
            }
        }
        while let Some(Reverse((_, row, stamp))) = self.heap.pop() {
            let ri = row as usize;
            let w = self.row_weight[ri];
            if stamp != self.row_stamp[ri] || w == 0 {
                continue;
            }
            let share = (self.row_rem[ri] / w as f64).max(0.0);
            for &(c, _) in &t.contention.row_classes[ri] {
                let ci = c as usize;
                let active = self.class_active[ci];
                if active == 0 || self.class_frozen[ci] {
                    continue;
                }
                self.class_frozen[ci] = true;
                self.class_rate[ci] = share;
                for &(row2, k) in &t.contention.class_rows[ci] {
                    let r2 = row2 as usize;
                    let w = u64::from(k) * active;
                    self.row_rem[r2] = (self.row_rem[r2] - share * w as f64).max(0.0);
                    self.row_weight[r2] -= w;
                    self.row_stamp[r2] = self.row_stamp[r2].wrapping_add(1);
                    if self.row_weight[r2] > 0 {
                        let key = total_order_key(self.row_rem[r2] / self.row_weight[r2] as f64);
                        self.heap.push(Reverse((key, row2, self.row_stamp[r2])));
                    }
                }
            }
        }
        for &row in &self.live_rows {
            self.row_seen[row as usize] = false;
        }
        for i in 0..self.flows.len() {
            let f = self.flows[i];
            let new = self.class_rate[self.class_of(f)];
            if new != self.rate[f as usize] || self.rate[f as usize] == 0.0 {
                self.set_rate(st, f, new);
            }
        }
    }

    /// Sets a flow's rate, settling its progress and scheduling its end.
    fn set_rate(&mut self, st: &mut Steps<'_>, f: u32, new: f64) {
        let fi = f as usize;
        let elapsed = st.now - self.last[fi];
        self.remaining[fi] = (self.remaining[fi] - self.rate[fi] * elapsed).max(0.0);
        self.last[fi] = st.now;
        self.rate[fi] = new;
        let finish = (new > 0.0).then(|| st.now + self.remaining[fi] / new);
        self.end_seq[fi] = st.replace_flow_end(f, self.end_seq[fi], finish);
    }
}

/// Per resource, the chunks every rank's messages put on it in a whole run: each peer
/// class's template chunks times the class's multiplicity on the resource.
fn resource_chunks(
    prepared: &Prepared,
    (conn_class, nclasses): (&[u32], usize),
    contention: &Contention,
    nres: usize,
) -> Vec<f64> {
    let mut class_chunks = vec![0u64; nclasses];
    for (&c, &count) in prepared.msg_conn.iter().zip(&prepared.msg_count) {
        if !prepared.conn_route[c as usize].resources.is_empty() {
            class_chunks[conn_class[c as usize] as usize] += u64::from(count);
        }
    }
    let mut resource_chunks = vec![0.0; nres];
    for (list, &chunks) in contention.class_resources.iter().zip(&class_chunks) {
        if chunks > 0 {
            for &(r, k) in list {
                resource_chunks[r as usize] += (chunks * u64::from(k)) as f64;
            }
        }
    }
    resource_chunks
}

/// A template flattened ([`Simulator::flatten_template`]), before messages are numbered.
struct TemplateFlat {
    steps: Vec<FlatStep>,
    step_ref: Vec<StepRef>,
    pending: Vec<u32>,
    edges: Vec<(u32, u32)>,
    /// Per connection: its peer; the sending and receiving steps on it, in order.
    conn_peer: Vec<u32>,
    conn_sends: Vec<Vec<u32>>,
    conn_recvs: Vec<Vec<u32>>,
    /// Per step: (connection, position) of its send half and its receive half.
    send_pos: Vec<(u32, u32)>,
    recv_pos: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostModel, Network};
    use crate::search::collective_of;
    use crate::search::families_for;
    use crate::synth::SynthLevel;
    use hccl_ir::CollectiveKind;
    use hccl_topologies::{Topology, generate};

    fn machines() -> Vec<(&'static str, Topology)> {
        let shipped = |name| hccl_topologies::shipped_by_name(name).expect("shipped machine");
        let build = |spec, name| hccl_topologies::build(spec, name).expect("generated machine");
        let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
        let dgx = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
        vec![
            ("dgx1-v100", shipped("dgx1-v100")),
            ("dgx-h100", shipped("dgx-h100")),
            ("ring-8", build(generate::ring(8, 25.0, 0.7), "ring-8")),
            ("torus-4x4", build(generate::torus(&[4, 4], 25.0, 0.7), "t")),
            ("cluster-4", build(generate::cluster(4, &dgx), "cluster-4")),
        ]
    }

    /// Routing translates through the network's automorphisms gives exactly the
    /// multiplicities that searching every translate gives, for every symmetric candidate
    /// of the hand-written families on five machines, and it is taken where the machines
    /// allow it (the cluster of DGX H100 and the torus), so the searches it saves on
    /// thousands of ranks are not traded for different routes.
    #[test]
    fn routes_carried_by_automorphisms_are_the_searched_ones() {
        let mut carried: Vec<&str> = Vec::new();
        let mut searched = 0;
        for (machine, topo) in machines() {
            let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
            for family in families_for(SynthLevel::Off) {
                for kind in [CollectiveKind::AllReduce, CollectiveKind::AllGather] {
                    if !family.supports(kind) {
                        continue;
                    }
                    let collective = collective_of(kind);
                    for params in family.param_space(&topo, collective) {
                        for c in family.generate(&topo, collective, params) {
                            let Some(compact) =
                                c.symmetry.as_ref().and_then(|s| c.schedule.compress(s))
                            else {
                                continue;
                            };
                            let what = format!("{} {kind} {params:?} on {machine}", c.algorithm);
                            let table = compact.table().expect("symmetry table");
                            let r0 = table.rank_at(0).expect("position 0");
                            let mut peers: Vec<u32> = compact
                                .template
                                .streams
                                .iter()
                                .flat_map(|s| &s.steps)
                                .filter_map(|st| st.op.send_peer())
                                .collect();
                            peers.sort_unstable();
                            peers.dedup();
                            let (slow, equivariant) = sim
                                .class_resources_searched(&compact, &table, r0, &peers)
                                .expect("every translate routes");
                            match sim.class_resources_by_symmetry(&compact, &table, r0, &peers) {
                                Some(fast) => {
                                    assert_eq!(fast, slow, "{what}");
                                    assert!(equivariant, "{what}");
                                    if !carried.contains(&machine) {
                                        carried.push(machine);
                                    }
                                }
                                None => searched += 1,
                            }
                        }
                    }
                }
            }
        }
        println!("carried by automorphisms on {carried:?}; {searched} candidates searched");
        for machine in ["cluster-4", "torus-4x4", "dgx-h100"] {
            assert!(carried.contains(&machine), "never carried on {machine}");
        }
    }

    #[test]
    fn every_position_steps_back_by_one_generator() {
        let sym = hccl_ir::Symmetry {
            dims: vec![3, 4],
            actions: vec![Action::Cyclic, Action::Xor],
            ranks: (0..12).collect(),
            chunks: None,
        };
        let (gens, steps) = generators(&sym, 12).expect("a 3 × 4 grid");
        // The XOR dimension (stride 1) has bits 1 and 2; the cyclic one a unit step of 4.
        assert_eq!(gens, vec![1, 2, 4]);
        assert_eq!(steps[1], (0, 0));
        assert_eq!(steps[3], (2, 0));
        assert_eq!(steps[2], (0, 1));
        assert_eq!(steps[4], (0, 2));
        assert_eq!(steps[11], (10, 0));
        assert!(
            steps
                .iter()
                .skip(1)
                .enumerate()
                .all(|(i, &(p, _))| p < i + 1)
        );
        assert!(generators(&sym, 24).is_none());
    }
}
