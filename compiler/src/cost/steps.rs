//! The step and message machine every simulation run shares ([`Steps`]): readiness,
//! connection slots, latencies and the event queue, under the [`Rates`] a run gives its
//! flows (max-min fair flows in `flow.rs`, peer classes in `symmetric.rs`).

use super::buffers::Buffers;
use super::error::CostError;
use super::model::{CostModel, LinkClass};
use super::network::Network;
use super::prepared::{Kind, NONE, Prepared, Spans};
use hccl_ir::{CONNECTION_SLOTS, Protocol, StepRef};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
pub(super) enum EventKind {
    /// A local step (or a receive's fused work) finished.
    StepDone(u32),
    /// A flow may have finished: valid if this event is still the flow's last (its push
    /// order, which [`Steps::replace_flow_end`] returned, is the one the flow keeps).
    FlowDone(u32, u32),
    /// A message arrived at the receiver.
    Arrive(u32),
    /// A network message whose sender's engine was busy may start now
    /// ([`CostModel::net_gap_us`]).
    Start(u32),
}

/// A timed event; ordered so that a `BinaryHeap` pops the earliest first, ties in push order
/// (`seq`). The CPU model's ([`super::cpu`]); [`Steps`] packs its own into 16 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Event<K> {
    pub(super) time: f64,
    pub(super) seq: u64,
    pub(super) kind: K,
}

impl<K> PartialEq for Event<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K> Eq for Event<K> {}
impl<K> PartialOrd for Event<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Event<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

/// Superseded flow ends the queue may hold before they are dropped, if they are most of it.
const STALE_PURGE: usize = 64;

/// `x`'s position in the IEEE total order ([`f64::total_cmp`]) as an unsigned integer.
#[inline]
pub(super) fn total_order_key(x: f64) -> u64 {
    let mut b = x.to_bits() as i64;
    b ^= (((b >> 63) as u64) >> 1) as i64;
    (b as u64) ^ (1 << 63)
}

/// `total_order_key`'s inverse.
#[inline]
pub(super) fn from_order_key(k: u64) -> f64 {
    let b = (k ^ (1 << 63)) as i64;
    f64::from_bits((b ^ ((((b >> 63) as u64) >> 1) as i64)) as u64)
}

/// An event of [`Steps`]' queue in 16 bytes (half an [`Event`]'s: the queue's sifting moves
/// and compares less): one integer whose high half is its time's [`total_order_key`] and
/// low half a tag (its push order, which breaks ties in time as [`Event`]'s `seq`, then its
/// kind in 2 bits and index in 30), stored complemented so that a `BinaryHeap` (a max-heap)
/// pops the earliest first and each comparison is one integer comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timed {
    inverted: u128,
}

/// Indices (steps, messages) an event can name: below 2^30.
const INDEX_BITS: u32 = 30;
/// What [`Steps::note`] folds in for a choice between two times (above any event's tag).
const CHOICE: u64 = 1 << 40;
/// Events of a run's course within this fraction of their time of each other are taken
/// as simultaneous ([`Steps::note`]); rounding separates a symmetric schedule's
/// simultaneous events by a few ulps.
const COURSE_TIE: f64 = 1e-9;

/// Which of two times is the later, for [`Steps::note`]: 1 for `a`, 2 for `b`, 0 when they
/// are within [`COURSE_TIE`] of each other (either way then gives the same run, to rounding).
#[inline]
fn way(a: f64, b: f64) -> u64 {
    let tie = COURSE_TIE * a.abs().max(b.abs());
    u64::from(a - b > tie) | u64::from(b - a > tie) << 1
}

/// Mixes the bits of `x` (the finaliser of SplitMix64), so sums and folds of mixed values
/// keep them apart.
#[inline]
fn spread(x: u64) -> u64 {
    let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The kinds of [`Timed`] events (their [`EventKind`]).
const STEP_DONE: u64 = 0;
const FLOW_DONE: u64 = 1;
const ARRIVE: u64 = 2;
const START: u64 = 3;

impl Timed {
    #[inline]
    fn new(time: f64, seq: u32, kind: u64, index: u32) -> Timed {
        let tag = (u64::from(seq) << 32) | (kind << INDEX_BITS) | u64::from(index);
        Timed {
            inverted: !((u128::from(total_order_key(time)) << 64) | u128::from(tag)),
        }
    }

    /// Its kind and index, without the push order (what [`Steps::note`] folds in).
    #[inline]
    fn tag(self) -> u64 {
        !self.inverted as u64 & ((1 << 32) - 1)
    }

    #[inline]
    fn time(self) -> f64 {
        from_order_key((!self.inverted >> 64) as u64)
    }

    #[inline]
    fn kind(self) -> EventKind {
        let tag = !self.inverted as u64;
        let index = (tag & ((1 << INDEX_BITS) - 1)) as u32;
        match (tag >> INDEX_BITS) & 3 {
            STEP_DONE => EventKind::StepDone(index),
            FLOW_DONE => EventKind::FlowDone(index, (tag >> 32) as u32),
            ARRIVE => EventKind::Arrive(index),
            _ => EventKind::Start(index),
        }
    }
}

/// How many in-order lanes [`Queue`] keeps for arrivals.
const LANES: usize = 2;

/// A run's pending events, taken earliest first (time, then push order): a heap, and
/// beside it a few *lanes*, lists already in that order. An arrival is its flow's end plus
/// its connection's latency, and flow ends are taken in time order, so arrivals over routes
/// of one latency are queued in order; so are the ends of local steps of one size (a
/// pipeline's). Such an event joins the lane whose last event is not after it, and costs no
/// sifting in the heap; one that fits no lane, and every flow end (rate changes move them),
/// goes to the heap. The events come out in exactly the order one heap would give.
struct Queue {
    heap: BinaryHeap<Timed>,
    lanes: [Lane; LANES],
}

/// Events in the order they are taken: `events[head..]` are still queued.
#[derive(Default)]
struct Lane {
    events: Vec<Timed>,
    head: usize,
}

impl Lane {
    #[inline]
    fn front(&self) -> Option<&Timed> {
        self.events.get(self.head)
    }

    #[inline]
    fn back(&self) -> Option<&Timed> {
        self.events[self.head..].last()
    }

    #[inline]
    fn push_back(&mut self, e: Timed) {
        self.events.push(e);
    }

    #[inline]
    fn pop_front(&mut self) {
        self.head += 1;
        if self.head == self.events.len() {
            self.events.clear();
            self.head = 0;
        }
    }
}

impl Queue {
    fn new(b: &mut Buffers) -> Queue {
        Queue {
            heap: BinaryHeap::from(b.empty::<Timed>()),
            lanes: std::array::from_fn(|_| Lane {
                events: b.empty(),
                head: 0,
            }),
        }
    }

    fn recycle(self, b: &mut Buffers) {
        b.keep(self.heap.into_vec());
        for lane in self.lanes {
            b.keep(lane.events);
        }
    }

    #[inline]
    fn push(&mut self, e: Timed) {
        self.heap.push(e);
    }

    /// Queues an event that may join a lane (an arrival, a local step's end).
    #[inline]
    fn push_in_order(&mut self, e: Timed) {
        // (`Timed` is complemented: the later event is the smaller.)
        match self
            .lanes
            .iter_mut()
            .find(|lane| lane.back().is_none_or(|&last| e < last))
        {
            Some(lane) => lane.push_back(e),
            None => self.heap.push(e),
        }
    }

    /// The next event, and where it is (`LANES`: the heap).
    #[inline]
    fn peek(&self) -> Option<(Timed, usize)> {
        let mut best = self.heap.peek().map(|&e| (e, LANES));
        for (i, lane) in self.lanes.iter().enumerate() {
            if let Some(&e) = lane.front()
                && best.is_none_or(|(b, _)| e > b)
            {
                best = Some((e, i));
            }
        }
        best
    }

    /// Takes the event [`Queue::peek`] found at `at`.
    #[inline]
    fn take(&mut self, at: usize) {
        if at == LANES {
            self.heap.pop();
        } else {
            self.lanes[at].pop_front();
        }
    }

    /// Events in the heap (where superseded flow ends wait).
    fn heap_len(&self) -> usize {
        self.heap.len()
    }

    /// Drops the heap's events that `keep` refuses (superseded flow ends; the lanes hold
    /// none).
    fn purge(&mut self, keep: impl FnMut(&Timed) -> bool) {
        self.heap.retain(keep);
    }
}

/// The step and message state of one run, shared by the flow simulator and the template
/// run ([`super::symmetric`]): which steps are ready and done, which messages started and
/// arrived, connection slots, the event queue. How flows share bandwidth is the [`Rates`]
/// the run is given.
pub(super) struct Steps<'a> {
    pub(super) network: &'a Network,
    pub(super) model: &'a CostModel,
    pub(super) p: &'a Prepared,
    chunk_bytes: f64,
    /// Bandwidth factor of the calibration at this size (local memory work).
    mem_scale: f64,
    pub(super) now: f64,
    /// The run stops (see [`Steps::execute`]) once the clock passes this (µs, without the
    /// protocol's base latency), or once its [`Rates`] are sure it will ([`Rates::past`]);
    /// infinite for a full run.
    pub(super) limit: f64,
    /// Events pushed so far: the next one's push order. At `u32::MAX` the run stops
    /// ([`CostError::TooLarge`]: billions of events, far past any budget).
    seq: u32,
    events: Queue,
    /// Flow ends in `events` that a rate change superseded (see [`Steps::replace_flow_end`]).
    stale: usize,
    /// Per step, its state (one entry, so that a step's readiness touches one cache line).
    step: Vec<StepState>,
    completed: usize,
    worklist: Vec<u32>,
    /// Per message, its state.
    msg: Vec<MsgState>,
    /// Per connection: the messages started and consumed, and what a message's arrival
    /// takes after its last byte left (the protocol's per-message latency on the route's
    /// class and the route's own).
    next_start: Vec<u32>,
    consumed: Vec<u32>,
    conn_latency: Vec<f64>,
    /// Per rank, when its engine may start its next network message
    /// ([`CostModel::net_gap_us`]); empty when the model has no such gap.
    net_free: Vec<f64>,
    /// Messages started, and their payload bytes.
    pub(super) messages: usize,
    pub(super) payload: f64,
    /// Per step: (start, end), when traced.
    spans: Spans,
    /// The run's course so far ([`Estimate::course`](super::Estimate::course)): each event
    /// taken and each choice between two times, folded in ([`Steps::note`]).
    pub(super) course: u64,
    /// The group of [`Steps::note`] being added up, and the time it started at.
    group: u64,
    group_at: f64,
    /// Whether the course is wanted ([`Steps::note`] does nothing otherwise).
    pub(super) tracking: bool,
}

/// What a run knows of one step, and what it reads of the step's definition while it runs
/// (its kind and where its dependents are), in one cache line: a large schedule's steps are
/// taken in an order that jumps between ranks, and one line per step is what a step's
/// readiness, its work and its end then touch instead of one per array.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct StepState {
    /// When it became ready.
    ready_at: f64,
    /// When a relaying step's fused local work ends.
    local_until: f64,
    kind: Kind,
    /// Its dependents: `p.succ[succ.0..succ.1]`.
    succ: (u32, u32),
    /// Predecessors not yet done.
    pending: u32,
    /// A receive ready for its message that has not taken it yet.
    recv_ready: bool,
    done: bool,
}

/// What a run knows of one message.
#[derive(Clone, Copy, Default)]
struct MsgState {
    /// When its data started streaming.
    data_start: f64,
    /// Its send is ready.
    ready: bool,
    arrived: bool,
}

const _: () = assert!(
    std::mem::size_of::<StepState>() == 64,
    "a step's state is one line"
);

/// How a run shares bandwidth among its flows (one flow per message in transit).
pub(super) trait Rates {
    /// A flow of `bytes` (positive) starts on message `m`, whose route crosses resources.
    fn start(&mut self, st: &mut Steps<'_>, m: u32, bytes: f64);
    /// Flow `m` ended (its current `FlowDone` fired): it releases what it held.
    fn finish(&mut self, st: &mut Steps<'_>, m: u32);
    /// Whether a run given `limit` (µs, without the base latency) is sure to end past it,
    /// at `now`, from what is left to carry.
    fn past(&mut self, _now: f64, _limit: f64) -> bool {
        false
    }
    /// Whether a `FlowDone(m, seq)` event (`seq`: its push order) is still current.
    fn current(&self, m: u32, seq: u32) -> bool;
    /// Whether rates must be recomputed before time moves on.
    fn dirty(&self) -> bool;
    /// Recomputes the rates of the flows a change touched.
    fn recompute(&mut self, st: &mut Steps<'_>);
    /// With no event left: re-balances flows an approximate allocation left without
    /// capacity; whether it did (the run then goes on).
    fn revive(&mut self, st: &mut Steps<'_>) -> bool;
}

impl<'a> Steps<'a> {
    pub(super) fn new(
        network: &'a Network,
        model: &'a CostModel,
        p: &'a Prepared,
        (bytes, protocol): (u64, Protocol),
        trace: bool,
        b: &mut Buffers,
    ) -> Steps<'a> {
        let nsteps = p.steps.len();
        let nmsg = p.msg_conn.len();
        let nconn = p.conn_base.len();
        Steps {
            network,
            model,
            p,
            chunk_bytes: bytes as f64 / f64::from(p.chunks),
            mem_scale: model.bandwidth_factor(bytes),
            now: 0.0,
            limit: f64::INFINITY,
            seq: 0,
            events: Queue::new(b),
            stale: 0,
            step: {
                let mut v = b.empty();
                v.extend(
                    p.steps
                        .iter()
                        .zip(&p.pending)
                        .zip(p.succ_start.windows(2))
                        .map(|((step, &pending), succ)| StepState {
                            ready_at: 0.0,
                            local_until: 0.0,
                            kind: step.kind,
                            succ: (succ[0], succ[1]),
                            pending,
                            recv_ready: false,
                            done: false,
                        }),
                );
                v
            },
            completed: 0,
            worklist: b.empty(),
            msg: b.filled(nmsg, MsgState::default()),
            next_start: b.filled(nconn, 0),
            consumed: b.filled(nconn, 0),
            conn_latency: {
                let mut v = b.empty();
                v.extend(
                    p.conn_route
                        .iter()
                        .map(|r| model.message_us(r.class, protocol) + r.latency_us),
                );
                v
            },
            net_free: if model.net_gap_us > 0.0 {
                b.filled(network.mem_bw.len(), 0.0)
            } else {
                Vec::new()
            },
            messages: 0,
            payload: 0.0,
            spans: trace.then(|| vec![(0.0, 0.0); nsteps]),
            course: 0,
            group: 0,
            group_at: 0.0,
            tracking: false,
        }
    }

    /// Hands this run's arrays to `b` for a later run.
    pub(super) fn recycle(self, b: &mut Buffers) {
        self.events.recycle(b);
        for v in [self.worklist, self.next_start, self.consumed] {
            b.keep(v);
        }
        for v in [self.conn_latency, self.net_free] {
            b.keep(v);
        }
        b.keep(self.step);
        b.keep(self.msg);
    }

    /// Queues step `s`'s end at `time`.
    fn step_done_at(&mut self, time: f64, s: u32) {
        self.queue_in_order(time, STEP_DONE, s);
    }

    /// Queues message `m`'s arrival at `time`.
    fn arrival_at(&mut self, time: f64, m: u32) {
        self.queue_in_order(time, ARRIVE, m);
    }

    /// Replaces flow `m`'s end: the one pushed as `live` (0: none) is superseded, and the new
    /// one is queued at `finish` (none: the flow is stalled). Returns the new end's push
    /// order (0: none), which the [`Rates`] keep for [`Rates::current`].
    ///
    /// Superseded ends stay queued until they are most of the queue; then they are dropped in
    /// one pass ([`Steps::execute`]), where each would otherwise cost a pop of a queue twice
    /// the size. The events left come out in the same order (time, then push order: a total
    /// order).
    pub(super) fn replace_flow_end(&mut self, m: u32, live: u32, finish: Option<f64>) -> u32 {
        if live != 0 {
            self.stale += 1;
        }
        finish.map_or(0, |t| self.queue(t, FLOW_DONE, m))
    }

    /// Adds `what` (an event's kind and index, or a choice's outcome) to the run's course at
    /// `time`. Events whose times are within [`COURSE_TIE`] of each other form one group,
    /// added up in any order: a symmetric schedule's simultaneous events come out in an
    /// order that rounding decides, and their order does not change the run. Each group
    /// then folds into the course in time order.
    #[inline]
    fn note(&mut self, time: f64, what: u64) {
        if !self.tracking {
            return;
        }
        if time - self.group_at > COURSE_TIE * time.abs() {
            self.end_group();
            self.group_at = time;
        }
        self.group = self.group.wrapping_add(spread(what));
    }

    /// Folds the current group of [`Steps::note`] into the course.
    fn end_group(&mut self) {
        if !self.tracking {
            return;
        }
        self.course = spread(self.course ^ self.group);
        self.group = 0;
    }

    #[inline]
    fn queue(&mut self, time: f64, code: u64, index: u32) -> u32 {
        self.seq = self.seq.saturating_add(1);
        self.events.push(Timed::new(time, self.seq, code, index));
        self.seq
    }

    /// [`Steps::queue`], for an event that may join an in-order lane ([`Queue`]).
    #[inline]
    fn queue_in_order(&mut self, time: f64, code: u64, index: u32) {
        self.seq = self.seq.saturating_add(1);
        self.events
            .push_in_order(Timed::new(time, self.seq, code, index));
    }

    fn mem_us(&self, step: u32, passes: f64) -> f64 {
        if passes <= 0.0 {
            return 0.0;
        }
        let s = &self.p.steps[step as usize];
        let bw = self.network.mem_bw[s.rank as usize] * self.mem_scale;
        if bw.is_nan() || bw <= 0.0 {
            return 0.0;
        }
        passes * f64::from(s.count) * self.chunk_bytes / (bw * 1e3)
    }

    /// Runs every step under `rates`; the run ends at `self.now`. Returns the traced spans,
    /// or the first step never run when the schedule deadlocks.
    ///
    /// With a [`Steps::limit`], the run stops at the first event past it (events are taken
    /// in time order and the clock never goes back, so the full run would end later still)
    /// and returns [`CostError::PastLimit`]; also earlier, at a time its rates say the run
    /// cannot end by the limit ([`Rates::past`], asked whenever the clock moves on).
    pub(super) fn execute<R: Rates>(&mut self, rates: &mut R) -> Result<Spans, CostError> {
        let steps = self.p.steps.len();
        if steps >= 1 << INDEX_BITS || self.p.msg_conn.len() >= 1 << INDEX_BITS {
            return Err(CostError::TooLarge { steps });
        }
        for id in 0..self.p.steps.len() as u32 {
            if self.step[id as usize].pending == 0 {
                self.worklist.push(id);
            }
        }
        self.drain_ready(rates);
        loop {
            if self.stale >= STALE_PURGE && 2 * self.stale > self.events.heap_len() {
                self.events.purge(|e| match e.kind() {
                    EventKind::FlowDone(m, v) => rates.current(m, v),
                    _ => true,
                });
                self.stale = 0;
            }
            let next = self.events.peek();
            if rates.dirty() && next.is_none_or(|(e, _)| e.time() > self.now) {
                rates.recompute(self);
                continue;
            }
            if self.seq == u32::MAX {
                return Err(CostError::TooLarge { steps });
            }
            let Some((ev, at)) = next else {
                if rates.revive(self) {
                    continue;
                }
                break;
            };
            self.events.take(at);
            let kind = ev.kind();
            if let EventKind::FlowDone(m, v) = kind
                && !rates.current(m, v)
            {
                self.stale = self.stale.saturating_sub(1);
                continue; // superseded by a rate change
            }
            self.note(ev.time(), ev.tag());
            let advanced = ev.time() > self.now;
            self.now = self.now.max(ev.time());
            if self.now > self.limit
                || (advanced && self.limit.is_finite() && rates.past(self.now, self.limit))
            {
                return Err(CostError::PastLimit {
                    limit_us: self.limit,
                    at_us: self.now,
                });
            }
            match kind {
                EventKind::StepDone(s) => self.complete(s),
                EventKind::FlowDone(m, _) => {
                    rates.finish(self, m);
                    self.flow_finished(m);
                }
                EventKind::Arrive(m) => {
                    self.msg[m as usize].arrived = true;
                    let r = self.p.msg_recv[m as usize];
                    if r != NONE && self.step[r as usize].recv_ready {
                        self.consume(rates, r);
                    }
                }
                EventKind::Start(m) => self.start_flow_now(rates, m),
            }
            self.drain_ready(rates);
        }
        self.end_group();
        if self.completed < self.p.steps.len() {
            let stuck = (0..self.p.steps.len())
                .find(|&i| !self.step[i].done)
                .map(|i| self.p.step_ref[i]);
            return Err(CostError::Deadlock {
                at: stuck.unwrap_or(StepRef {
                    rank: 0,
                    stream: 0,
                    step: 0,
                }),
            });
        }
        Ok(self.spans.take())
    }

    /// Processes steps whose predecessors are all done.
    fn drain_ready<R: Rates>(&mut self, rates: &mut R) {
        while let Some(s) = self.worklist.pop() {
            self.ready(rates, s);
        }
    }

    fn ready<R: Rates>(&mut self, rates: &mut R, s: u32) {
        self.step[s as usize].ready_at = self.now;
        if let Some(spans) = &mut self.spans {
            spans[s as usize].0 = self.now;
        }
        match self.step[s as usize].kind {
            Kind::Nop => self.complete(s),
            Kind::Local { passes } => {
                let t = self.mem_us(s, passes);
                if t > 0.0 {
                    self.step_done_at(self.now + t, s);
                } else {
                    self.complete(s);
                }
            }
            Kind::Send { msg } => self.send_ready(rates, msg),
            Kind::Recv { msg, .. } => {
                self.step[s as usize].recv_ready = true;
                if msg != NONE && self.msg[msg as usize].arrived {
                    self.consume(rates, s);
                }
            }
        }
    }

    fn complete(&mut self, s: u32) {
        if self.step[s as usize].done {
            return;
        }
        self.step[s as usize].done = true;
        self.completed += 1;
        if let Some(spans) = &mut self.spans {
            spans[s as usize].1 = self.now;
        }
        let (a, b) = self.step[s as usize].succ;
        for i in a as usize..b as usize {
            let t = self.p.succ[i];
            let pending = &mut self.step[t as usize].pending;
            *pending -= 1;
            if *pending == 0 {
                self.worklist.push(t);
            }
        }
    }

    fn send_ready<R: Rates>(&mut self, rates: &mut R, msg: u32) {
        if msg == NONE {
            return;
        }
        self.msg[msg as usize].ready = true;
        self.try_start(rates, self.p.msg_conn[msg as usize]);
    }

    fn try_start<R: Rates>(&mut self, rates: &mut R, c: u32) {
        let ci = c as usize;
        while self.next_start[ci] < self.p.conn_len[ci]
            && (self.next_start[ci] as usize) < self.consumed[ci] as usize + CONNECTION_SLOTS
        {
            let msg = self.p.conn_base[ci] + self.next_start[ci];
            if !self.msg[msg as usize].ready {
                break;
            }
            self.next_start[ci] += 1;
            self.start_flow(rates, msg);
        }
    }

    /// Message `m` may start: now, or, when it leaves the host and its sender's engine is
    /// still busy with its previous network message, once the engine is free
    /// ([`CostModel::net_gap_us`]).
    fn start_flow<R: Rates>(&mut self, rates: &mut R, m: u32) {
        if !self.net_free.is_empty() {
            let mi = m as usize;
            if self.p.conn_route[self.p.msg_conn[mi] as usize].class == LinkClass::Net {
                let rank = self.p.steps[self.p.msg_send[mi] as usize].rank as usize;
                let at = self.net_free[rank].max(self.now);
                self.net_free[rank] = at + self.model.net_gap_us;
                if at > self.now {
                    self.queue(at, START, m);
                    return;
                }
            }
        }
        self.start_flow_now(rates, m);
    }

    fn start_flow_now<R: Rates>(&mut self, rates: &mut R, m: u32) {
        let mi = m as usize;
        self.msg[mi].data_start = self.now;
        let bytes = f64::from(self.p.msg_count[mi]) * self.chunk_bytes;
        self.messages += 1;
        self.payload += bytes;
        let route = &self.p.conn_route[self.p.msg_conn[mi] as usize];
        if bytes <= 0.0 || route.resources.is_empty() {
            self.flow_finished(m);
            return;
        }
        rates.start(self, m, bytes);
    }

    /// The last byte left: the sender's step is done; the message arrives after the latency.
    fn flow_finished(&mut self, m: u32) {
        let mi = m as usize;
        let s = self.p.msg_send[mi];
        let end = self.step[s as usize].local_until;
        let latency = self.conn_latency[self.p.msg_conn[mi] as usize];
        if end > self.now {
            self.step_done_at(end, s);
            self.arrival_at(end + latency, m);
        } else {
            self.complete(s);
            self.arrival_at(self.now + latency, m);
        }
    }

    /// Receive step `s` takes its (arrived) message.
    fn consume<R: Rates>(&mut self, rates: &mut R, s: u32) {
        let Kind::Recv {
            msg, passes, out, ..
        } = self.step[s as usize].kind
        else {
            return;
        };
        self.step[s as usize].recv_ready = false;
        let c = self.p.msg_conn[msg as usize];
        self.consumed[c as usize] += 1;
        self.try_start(rates, c);
        let work = self.mem_us(s, passes);
        let (data, ready) = (
            self.msg[msg as usize].data_start,
            self.step[s as usize].ready_at,
        );
        let start = data.max(ready);
        let finish = self.now.max(start + work);
        // Which time each choice took: a course that takes both ways is not affine.
        if self.tracking {
            let took = way(data, ready) | way(start + work, self.now) << 2;
            self.note(self.now, CHOICE | u64::from(s) << 4 | took);
        }
        if out != NONE {
            // Relays stream the result on as it is produced: the outgoing message starts
            // now; the step (and the message's arrival) cannot end before the local work.
            self.step[s as usize].local_until = finish;
            self.send_ready(rates, out);
        } else if finish > self.now {
            self.step_done_at(finish, s);
        } else {
            self.complete(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        ARRIVE, EventKind, FLOW_DONE, Queue, STEP_DONE, Timed, from_order_key, total_order_key,
    };
    use crate::cost::buffers::Buffers;
    use proptest::prelude::*;

    const TIMES: [f64; 9] = [
        f64::NEG_INFINITY,
        -1.5,
        -0.0,
        0.0,
        f64::MIN_POSITIVE / 4.0,
        1e-9,
        1.0,
        1.0 + f64::EPSILON,
        f64::INFINITY,
    ];

    /// The queue's order is time (as `f64::total_cmp`), then push order, and an event gives
    /// back exactly the time and kind it was made with.
    #[test]
    fn timed_events_order_by_time_then_push_order_and_round_trip() {
        for &t in &TIMES {
            assert_eq!(from_order_key(total_order_key(t)).to_bits(), t.to_bits());
            let e = Timed::new(t, 7, FLOW_DONE, 123);
            assert_eq!(e.time().to_bits(), t.to_bits());
            assert!(matches!(e.kind(), EventKind::FlowDone(123, 7)));
        }
        for &a in &TIMES {
            for &b in &TIMES {
                for (sa, sb) in [(1, 2), (2, 1), (3, 3)] {
                    let (ea, eb) = (
                        Timed::new(a, sa, STEP_DONE, 5),
                        Timed::new(b, sb, STEP_DONE, 5),
                    );
                    // The max-heap pops the greater: the earlier time, then the earlier push.
                    let want = b.total_cmp(&a).then(sb.cmp(&sa));
                    assert_eq!(ea.cmp(&eb), want, "{a} (push {sa}) against {b} (push {sb})");
                }
            }
        }
    }

    proptest! {
        /// The queue gives its events in exactly the order one heap would, whichever of them
        /// went to a lane: arrivals pushed in and out of time order, other events, and takes
        /// in between.
        #[test]
        fn the_queue_takes_events_in_heap_order(
            ops in prop::collection::vec((0u8..4, 0u32..40), 1..300),
        ) {
            let mut b = Buffers::default();
            let mut q = Queue::new(&mut b);
            let mut reference = std::collections::BinaryHeap::new();
            let mut seq = 0u32;
            for (op, t) in ops {
                let time = f64::from(t) * 0.5;
                seq += 1;
                match op {
                    0 => {
                        let e = Timed::new(time, seq, ARRIVE, seq);
                        q.push_in_order(e);
                        reference.push(e);
                    }
                    1 => {
                        let e = Timed::new(time, seq, STEP_DONE, seq);
                        q.push(e);
                        reference.push(e);
                    }
                    _ => {
                        let next = q.peek();
                        prop_assert_eq!(next.map(|(e, _)| e), reference.pop());
                        if let Some((_, at)) = next {
                            q.take(at);
                        }
                    }
                }
            }
            while let Some(want) = reference.pop() {
                let (e, at) = q.peek().expect("the queue holds as many events");
                prop_assert_eq!(e, want);
                q.take(at);
            }
            prop_assert!(q.peek().is_none());
        }
    }
}
