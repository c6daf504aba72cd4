//! Discrete-event simulation of a schedule on a [`Network`].
//!
//! Semantics follow `hccl_ir::schedule`: the steps of a stream run in order, a step also waits
//! for its dependencies, and the `(from, to, channel)` connections are FIFOs where the k-th
//! send pairs with the k-th receive and at most [`CONNECTION_SLOTS`](hccl_ir::CONNECTION_SLOTS) messages may be sent but
//! not yet received.
//!
//! Timing of one message of `b` payload bytes under protocol `p`:
//! 1. it *starts* when its send step (or the send half of a relaying receive) is ready and a
//!    slot is free;
//! 2. it *streams* over its route as a fluid flow: every resource (link, NIC direction) gives
//!    its flows a max-min fair share of `capacity × efficiency(p)`, recomputed whenever a flow
//!    starts or ends (only over the flows that share resources with it, transitively);
//! 3. when the last byte has left, the send step is done; the message *arrives*
//!    `message_us(class, p) + route latency` later, and the matching receive may consume it.
//!
//! Local work costs memory bandwidth of the rank: a copy `copy_passes × b / mem_bw`, a reduce
//! `reduce_passes × b / mem_bw`, a reduction fused into a receive `fused_reduce_passes × b /
//! mem_bw`, overlapped with the transfer (it may start once the data starts streaming and the
//! step is ready); a relaying receive starts its outgoing message as soon as it consumes the
//! incoming one, and neither the step nor that message ends before the local work does.
//! Receiving without reducing costs nothing beyond the transfer. The
//! collective's time is `base_us(p)` plus the time the last step completes.
//!
//! The pieces: [`Prepared`] and the flattening helpers (`prepared.rs`), the step machine
//! (`steps.rs`), max-min fair flows (`flow.rs`), the CPU model (`cpu.rs`), the route-free
//! bound (`reach.rs`); this file is the [`Simulator`] that runs them.

use super::error::CostError;
use super::flow::{resource_uses, run_flows};
use super::model::CostModel;
use super::network::Network;
use super::prepared::{
    Estimate, FlatStep, Messages, Prepared, StepSpan, Timeline, Unrouted, number_messages,
    step_kind,
};
use super::tally::{Outcome, RunCounts, RunTally};
use hccl_ir::{Protocol, Schedule, StepRef};

pub use super::flow::EXACT_COMPONENT;

/// Simulates schedules on one topology; reuses routes between runs.
#[derive(Debug)]
pub struct Simulator {
    /// The resource network.
    pub network: Network,
    /// The cost constants.
    pub model: CostModel,
    /// Contention constraints of symmetric templates, shared by the candidates of a family
    /// ([`Simulator::prepare_symmetric`]).
    pub(super) symmetric_cache: super::contention::ContentionCache,
    /// What [`Unrouted::bound_us`] knows of the ranks, computed on first use.
    reach: std::sync::OnceLock<super::reach::RankReach>,
    /// What its flow runs cost, by purpose and outcome ([`Simulator::run_counts`]).
    tally: RunTally,
}

impl Unrouted {
    /// Looks up the routes: the [`Prepared`] schedule.
    pub fn route(mut self, sim: &Simulator) -> Result<Prepared, CostError> {
        self.prepared.conn_route = sim.network.routes(&self.pairs)?;
        Ok(self.prepared)
    }

    /// A lower bound on [`Simulator::run`]'s time (µs) for `bytes` under `protocol`, from the
    /// schedule's critical path alone, without routes (see [`super::reach`]); infinite for
    /// a schedule the simulator would find deadlocked, 0 on a CPU host model.
    pub fn bound_us(&self, sim: &Simulator, bytes: u64, protocol: Protocol) -> f64 {
        if sim.model.cpu.is_some() {
            return 0.0;
        }
        super::reach::critical_path_us(
            (&sim.model, sim.reach()),
            &self.prepared,
            &self.pairs,
            bytes,
            protocol,
        )
    }
}

impl Simulator {
    /// A simulator for `network` with `model`.
    pub fn new(network: Network, model: CostModel) -> Simulator {
        Simulator {
            network,
            model,
            symmetric_cache: Default::default(),
            reach: std::sync::OnceLock::new(),
            tally: RunTally::default(),
        }
    }

    /// The network and the model, as the runs of `flow.rs` and `cpu.rs` take them.
    pub(super) fn parts(&self) -> (&Network, &CostModel) {
        (&self.network, &self.model)
    }

    /// A lower bound on [`Simulator::run`]'s time (µs) for `bytes` under `protocol`: the
    /// critical path of `prepared`'s steps with every message at its route's bottleneck and
    /// latency, without contention ([`super::reach`]); infinite for a schedule the
    /// simulator would find deadlocked, 0 on a CPU host model.
    pub fn routed_bound_us(&self, prepared: &Prepared, bytes: u64, protocol: Protocol) -> f64 {
        super::reach::routed_path_us(
            (&self.model, &self.network.capacity),
            prepared,
            bytes,
            protocol,
        )
    }

    /// Per-rank capacities and link-class components (see [`super::reach`]).
    pub(super) fn reach(&self) -> &super::reach::RankReach {
        self.reach
            .get_or_init(|| super::reach::RankReach::new(&self.network))
    }

    /// Flattens `schedule`: checks peers and dependencies, pairs sends with receives and
    /// looks up routes.
    pub fn prepare(&self, schedule: &Schedule) -> Result<Prepared, CostError> {
        self.unrouted(schedule)?.route(self)
    }

    /// [`Simulator::prepare`] up to looking up routes (the dear part on thousands of ranks):
    /// enough for [`Unrouted::bound_us`].
    pub fn unrouted(&self, schedule: &Schedule) -> Result<Unrouted, CostError> {
        let n = self.network.nranks();
        if schedule.nranks != n || schedule.ranks.len() != n as usize {
            return Err(CostError::RankMismatch {
                schedule: schedule.nranks,
                topology: n,
            });
        }
        if schedule.chunks == 0 {
            return Err(CostError::NoChunks);
        }
        // Step ids, program order, dependencies and connections as the verifier numbers them.
        let dag = hccl_ir::StepDag::new(schedule).map_err(|e| match e {
            hccl_ir::DagError::TooLarge { steps } => CostError::TooLarge { steps },
            hccl_ir::DagError::BadDep { at, .. } => CostError::BadDep { at },
            hccl_ir::DagError::BadPeer { from, to, .. } => CostError::BadPeer { from, to },
        })?;
        let (mut steps, step_ref) = flat_steps(schedule, &self.model, dag.step_count());
        let hccl_ir::DagParts {
            succ_start,
            succ,
            preds: pending,
            connections,
            send_ends,
            recv_ends,
        } = dag.into_parts();
        let conn_keys: Vec<(u32, u32, u32)> = connections.iter().map(|c| c.key).collect();
        let (conn_sends, conn_recvs): (Vec<Vec<u32>>, Vec<Vec<u32>>) =
            connections.into_iter().map(|c| (c.sends, c.recvs)).unzip();
        let Messages {
            conn_base,
            conn_len,
            msg_conn,
            msg_count,
            msg_send,
            msg_recv,
        } = number_messages(&mut steps, &conn_sends, &conn_recvs, &send_ends, &recv_ends);
        let pairs: Vec<(u32, u32)> = conn_keys.iter().map(|&(a, b, _)| (a, b)).collect();
        // As the executor sizes segments (`hccl_executor` `program.rs`): by the largest
        // message (local steps never pass through a slot) and the largest scratch.
        let max_count = msg_count.iter().copied().max().unwrap_or(0);
        let max_scratch = schedule
            .ranks
            .iter()
            .map(|r| r.scratch_chunks)
            .max()
            .unwrap_or(0);
        Ok(Unrouted {
            pairs,
            prepared: Prepared {
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
                conn_route: Vec::new(),
                flow_routes: Default::default(),
                walk_order: Default::default(),
                path_points: Default::default(),
                chunks: schedule.chunks,
                collective: schedule.collective,
                max_count,
                max_scratch,
            },
        })
    }

    /// Simulates a prepared schedule for a collective of `bytes` under `protocol`.
    pub fn run(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        let since = std::time::Instant::now();
        let out = if let Some(cpu) = &self.model.cpu {
            super::cpu::run(
                (&self.network, &self.model),
                cpu,
                prepared,
                bytes,
                protocol,
                false,
            )
            .map(|r| r.0)
        } else {
            run_flows(
                self.parts(),
                prepared,
                (bytes, protocol),
                &mut None,
                (f64::INFINITY, None, false),
            )
            .map(|r| r.0)
        };
        let outcome = if out.is_ok() {
            Outcome::Whole
        } else {
            Outcome::Failed
        };
        self.tally.add(Some(since), outcome);
        out
    }

    /// What this simulator's runs ([`Simulator::run`], [`Simulator::run_within`]) cost so
    /// far, per purpose ([`runs_for`](super::runs_for)), in order of first use.
    pub fn run_counts(&self) -> Vec<RunCounts> {
        self.tally.counts()
    }

    /// [`Simulator::run`], given up as soon as the collective is sure to take longer than
    /// `limit_us`: `Ok(None)` then, and the estimate otherwise. What a search screening
    /// candidates against the best so far needs: a loser's run stops at the limit instead of
    /// running to its end. A CPU host model always runs to the end.
    pub fn run_within(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
        limit_us: f64,
    ) -> Result<Option<Estimate>, CostError> {
        self.run_limited(prepared, (bytes, protocol), limit_us, false)
    }

    /// [`Simulator::run_within`], the estimate with the run's course when `course` holds
    /// ([`Estimate::course`]; none on a CPU host model or under a calibration): what the
    /// search needs to take a size between two runs of one course from them.
    pub fn run_limited(
        &self,
        prepared: &Prepared,
        (bytes, protocol): (u64, Protocol),
        limit_us: f64,
        course: bool,
    ) -> Result<Option<Estimate>, CostError> {
        if self.model.cpu.is_some() {
            return self.run(prepared, bytes, protocol).map(Some);
        }
        let limit = limit_us - self.model.base_us(protocol);
        if limit.is_nan() {
            return self.run(prepared, bytes, protocol).map(Some);
        }
        // The busiest resource's bound and the run's watch (`flow.rs`) read the same loads.
        let loads = limit_us
            .is_finite()
            .then(|| prepared.resource_loads(bytes, self.network.capacity.len()));
        if self.bound_past(prepared, (bytes, protocol), limit_us, loads.as_deref()) {
            self.tally.add(None, Outcome::Bounded);
            return Ok(None);
        }
        let since = std::time::Instant::now();
        let out = match run_flows(
            self.parts(),
            prepared,
            (bytes, protocol),
            &mut None,
            (limit, loads.as_deref(), course),
        ) {
            Ok((estimate, _)) => Ok((estimate.time_us <= limit_us).then_some(estimate)),
            Err(CostError::PastLimit { .. }) => Ok(None),
            Err(e) => Err(e),
        };
        let outcome = match &out {
            Ok(Some(_)) if limit_us == f64::INFINITY => Outcome::Whole,
            Ok(Some(_)) => Outcome::Within,
            Ok(None) => Outcome::Stopped,
            Err(_) => Outcome::Failed,
        };
        self.tally.add(Some(since), outcome);
        out
    }

    /// Whether a lower bound on a run of `prepared` at `bytes` under `protocol` is already
    /// past `limit_us`, so that [`Simulator::run_limited`] would give it up without running:
    ///
    /// - the busiest link at its capacity ([`Simulator::lower_bound_us`]; a schedule that
    ///   would deadlock reads as past too);
    /// - a connection's messages alone ([`Simulator::slots_bound_us`]);
    /// - the critical path over the routes ([`Simulator::routed_bound_us`]), with a margin
    ///   that keeps a run whose time rounding might put a few ulps either side of a limit it
    ///   ties; a schedule that would deadlock (an infinite path) is not past by this one, so
    ///   that its run says so.
    ///
    /// Never past an infinite or NaN limit, nor on a CPU host model (its own runner).
    /// `loads`: the run's resource loads when the caller has them (as for
    /// [`Simulator::cheap_bound_past`]).
    pub fn bound_past(
        &self,
        prepared: &Prepared,
        (bytes, protocol): (u64, Protocol),
        limit_us: f64,
        loads: Option<&[f64]>,
    ) -> bool {
        self.cheap_bound_past(prepared, (bytes, protocol), limit_us, loads)
            || self.path_bound_past(prepared, (bytes, protocol), limit_us)
    }

    /// The first two of [`Simulator::bound_past`]'s bounds (a pass over the messages each);
    /// `loads` are the run's resource loads when the caller has them
    /// ([`Simulator::resource_loads`]: the same at every protocol), else they are counted
    /// here.
    pub fn cheap_bound_past(
        &self,
        prepared: &Prepared,
        (bytes, protocol): (u64, Protocol),
        limit_us: f64,
        loads: Option<&[f64]>,
    ) -> bool {
        if self.model.cpu.is_some() || !limit_us.is_finite() {
            return false;
        }
        let busiest = match loads {
            Some(l) => self.lower_bound_us(l, bytes, protocol),
            None => self.lower_bound_us(&self.resource_loads(prepared, bytes), bytes, protocol),
        };
        busiest.is_some_and(|lb| lb > limit_us)
            || self.slots_bound_us(prepared, bytes, protocol) > limit_us
    }

    /// The last of [`Simulator::bound_past`]'s bounds, the critical path (a walk of every
    /// step).
    pub fn path_bound_past(
        &self,
        prepared: &Prepared,
        (bytes, protocol): (u64, Protocol),
        limit_us: f64,
    ) -> bool {
        if self.model.cpu.is_some() || !limit_us.is_finite() {
            return false;
        }
        super::reach::routed_path_past(
            (&self.model, &self.network.capacity),
            prepared,
            (bytes, protocol),
            limit_us * (1.0 + 1e-9),
        )
    }

    /// A lower bound on [`Simulator::run`]'s time (µs) for `bytes` under `protocol`, from
    /// each connection's slots alone: its `k`-th message cannot start before the message
    /// [`CONNECTION_SLOTS`](hccl_ir::CONNECTION_SLOTS) before it has arrived (its receive
    /// took it), and a message arrives a latency (the protocol's per-message latency on its
    /// link class and its route's) after its last byte leaves, which is no sooner than its
    /// bytes take at its route's narrowest link. So each chain of every `slots`-th message
    /// of a connection takes the sum of those. 0 on a CPU host model (its own runner).
    pub fn slots_bound_us(&self, prepared: &Prepared, bytes: u64, protocol: Protocol) -> f64 {
        if self.model.cpu.is_some() {
            return 0.0;
        }
        const SLOTS: usize = hccl_ir::CONNECTION_SLOTS;
        let eff = self.model.efficiency(protocol) * self.model.bandwidth_factor(bytes);
        let chunk_bytes = bytes as f64 / f64::from(prepared.chunks);
        let mut longest = 0.0f64;
        for (c, route) in prepared.conn_route.iter().enumerate() {
            let latency = self.model.message_us(route.class, protocol) + route.latency_us;
            // Bytes per µs of the narrowest link (infinite: none limits it).
            let narrowest = route
                .resources
                .iter()
                .map(|&r| self.network.capacity[r as usize] * eff * 1e3)
                .filter(|c| c.is_finite() && *c > 0.0)
                .fold(f64::INFINITY, f64::min);
            let base = prepared.conn_base[c] as usize;
            let len = prepared.conn_len[c] as usize;
            let mut chains = [0.0f64; SLOTS];
            for (j, &count) in prepared.msg_count[base..base + len].iter().enumerate() {
                chains[j % SLOTS] += f64::from(count) * chunk_bytes / narrowest + latency;
            }
            longest = chains.iter().fold(longest, |a, &b| a.max(b));
        }
        self.model.base_us(protocol) + longest
    }

    /// The payload bytes each resource carries when `prepared` runs a collective of `bytes`:
    /// what a full run's [`Estimate::resource_bytes`] adds up to, without running it.
    pub fn resource_loads(&self, prepared: &Prepared, bytes: u64) -> Vec<f64> {
        prepared.resource_loads(bytes, self.network.capacity.len())
    }

    /// [`Simulator::run`], recording when every step ran.
    pub fn timeline(
        &self,
        prepared: &Prepared,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Timeline, CostError> {
        let (estimate, spans, segments, resources) = match &self.model.cpu {
            Some(cpu) => {
                let (e, spans, segments) = super::cpu::run(
                    (&self.network, &self.model),
                    cpu,
                    prepared,
                    bytes,
                    protocol,
                    true,
                )?;
                (e, spans, segments, Vec::new())
            }
            None => {
                let mut log = Some(Vec::new());
                let (e, spans) = run_flows(
                    self.parts(),
                    prepared,
                    (bytes, protocol),
                    &mut log,
                    (f64::INFINITY, None, false),
                )?;
                let uses = resource_uses(prepared, log.unwrap_or_default());
                (e, spans, 1, uses)
            }
        };
        let steps = spans
            .unwrap_or_default()
            .into_iter()
            .zip(&prepared.step_ref)
            .map(|((start_us, end_us), &at)| StepSpan {
                at,
                start_us,
                end_us,
            })
            .collect();
        Ok(Timeline {
            estimate,
            steps,
            segments,
            resources,
        })
    }

    /// A lower bound on the time of a collective of `bytes` under `protocol` whose messages
    /// put `resource_bytes` payload bytes on each resource (an [`Estimate`]'s, which no
    /// protocol changes): the busiest resource at its capacity under the protocol's
    /// efficiency, plus the protocol's base latency. `None` on a CPU host model, whose times
    /// do not come from link capacities.
    pub fn lower_bound_us(
        &self,
        resource_bytes: &[f64],
        bytes: u64,
        protocol: Protocol,
    ) -> Option<f64> {
        if self.model.cpu.is_some() {
            return None;
        }
        let eff = self.model.efficiency(protocol) * self.model.bandwidth_factor(bytes);
        let busiest = resource_bytes
            .iter()
            .zip(&self.network.capacity)
            .filter(|(_, c)| c.is_finite() && **c > 0.0)
            .map(|(b, c)| b / (c * eff * 1e3))
            .fold(0.0, f64::max);
        (busiest.is_finite() && eff > 0.0).then(|| self.model.base_us(protocol) + busiest)
    }

    /// Prepares and simulates in one go.
    pub fn simulate(
        &self,
        schedule: &Schedule,
        bytes: u64,
        protocol: Protocol,
    ) -> Result<Estimate, CostError> {
        let prepared = self.prepare(schedule)?;
        self.run(&prepared, bytes, protocol)
    }
}

/// Every step of `schedule` (`total` of them) in the flat numbering of `hccl_ir::StepDag`
/// (ranks, then streams, then steps): its kind under model `m` and where it is.
fn flat_steps(schedule: &Schedule, m: &CostModel, total: usize) -> (Vec<FlatStep>, Vec<StepRef>) {
    let mut steps = Vec::with_capacity(total);
    let mut step_ref = Vec::with_capacity(total);
    for (r, prog) in schedule.ranks.iter().enumerate() {
        let r = r as u32;
        for (si, stream) in prog.streams.iter().enumerate() {
            for (ti, step) in stream.steps.iter().enumerate() {
                steps.push(FlatStep {
                    rank: r,
                    count: step.count,
                    kind: step_kind(&step.op, m),
                });
                step_ref.push(StepRef {
                    rank: r,
                    stream: si as u32,
                    step: ti as u32,
                });
            }
        }
    }
    (steps, step_ref)
}
