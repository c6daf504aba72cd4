//! Max-min fair sharing of bandwidth among a run's flows ([`FlowRates`], the [`Rates`] of a
//! full run), recomputed at each event over the flows that interact, and the run itself
//! ([`run_flows`]).

use super::buffers::{self, Buffers};
use super::error::CostError;
use super::model::CostModel;
use super::network::Network;
use super::prepared::{Estimate, FlowRoutes, NONE, Prepared, ResourceUse, Spans};
use super::steps::{Rates, Steps, from_order_key, total_order_key};
use hccl_ir::Protocol;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Largest set of interacting flows whose rates are recomputed exactly at every change.
pub const EXACT_COMPONENT: usize = 256;

/// A candidate of progressive filling: resource `res` with fair share `rem / cnt` (as a
/// [`total_order_key`]) computed when its flow count was `stamp`. Filling order: smallest
/// share first, then lowest resource id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Share {
    key: u64,
    res: u32,
    stamp: u32,
}

/// The candidates of one progressive filling. Shares only rise during filling (up to
/// rounding), so each resource keeps one *representative* entry whose share is at most its
/// current one: the component's initial shares, sorted once, and a heap of shares recomputed
/// later (when a stale representative reaches the front, or when rounding lowered a share).
/// The smallest entry, once current, is exactly the resource whose share is the smallest.
#[derive(Debug, Default)]
struct Shares {
    sorted: Vec<Share>,
    cursor: usize,
    later: BinaryHeap<Reverse<Share>>,
    /// Per resource, its state in the filling (one entry: a frozen flow's resources are
    /// each updated in one place).
    res: Vec<FillRes>,
    /// Per flow (by seat): the first of its single-flow resources (scratch of one filling).
    solo: Vec<Option<Share>>,
    solo_flows: Vec<u32>,
}

/// One resource in a progressive filling.
#[derive(Debug, Default, Clone, Copy)]
struct FillRes {
    /// Capacity not yet given to frozen flows.
    rem: f64,
    /// The key of its representative entry.
    rep_key: u64,
    /// Its flows not yet frozen.
    cnt: u32,
    /// The stamp of its representative entry.
    rep_stamp: u32,
}

/// Whether `r`'s fair share `rem / cnt` (rounded) is sure to be above its representative's
/// without dividing: freezing a flow at the smallest share raises the others' shares, and
/// only rounding can lower one, so the division is wanted only where the two are within a
/// few ulps. If `rem ≥ rep × cnt × (1 + 4ε)` in floating point (each rounding off by at most
/// u = ε/2), then the exact quotient is at least `rep × (1 + 5u)` and its rounding above
/// `rep` (equal to it only where both are infinite). Shares are byte rates far from the
/// subnormals; below 1e-200 it divides.
#[inline]
fn surely_not_below(r: &FillRes) -> bool {
    let rep = from_order_key(r.rep_key);
    rep >= 1e-200 && r.rem >= rep * f64::from(r.cnt) * (1.0 + 4.0 * f64::EPSILON)
}

thread_local! {
    /// The shares of this thread's last run, for its next ([`Shares::new`]).
    static KEPT_SHARES: std::cell::Cell<Option<Shares>> = const { std::cell::Cell::new(None) };
}

impl Shares {
    /// Shares for a run over `resources` resources, with room for no flow yet (see
    /// [`FlowRates::seat`]): the ones this thread's previous run kept ([`Shares::keep`]),
    /// emptied and resized, or new ones.
    fn new(resources: usize) -> Shares {
        let mut s = KEPT_SHARES.take().unwrap_or_default();
        s.sorted.clear();
        s.cursor = 0;
        s.later.clear();
        s.res.clear();
        s.res.resize(resources, FillRes::default());
        s.solo.clear();
        s.solo_flows.clear();
        s
    }

    /// Keeps these shares' arrays for this thread's next run (see `buffers.rs`).
    fn keep(self) {
        if self.solo.capacity() <= buffers::KEEP_ELEMENTS {
            KEPT_SHARES.set(Some(self));
        }
    }

    /// Makes `share` the representative entry of its resource.
    #[inline]
    fn represent(&mut self, share: Share) {
        let r = &mut self.res[share.res as usize];
        r.rep_stamp = share.stamp;
        r.rep_key = share.key;
    }

    /// Takes the smallest entry.
    #[inline]
    fn pop(&mut self) -> Option<Share> {
        let a = self.sorted.get(self.cursor).copied();
        match (a, self.later.peek()) {
            (Some(a), Some(&Reverse(b))) if b < a => self.later.pop().map(|Reverse(b)| b),
            (Some(a), _) => {
                self.cursor += 1;
                Some(a)
            }
            (None, _) => self.later.pop().map(|Reverse(b)| b),
        }
    }
}

/// A traced run's rate changes: `(time µs, message, new rate in bytes/µs)`, in time order.
pub(super) type RateLog = Option<Vec<(f64, u32, f64)>>;

/// Runs a prepared schedule with max-min fair flows ([`FlowRates`]). With a `log`, the run
/// is traced: step spans are returned and every flow's rate changes are appended to it.
/// With `course`, the estimate holds the run's course ([`Estimate::course`]). A finite
/// `limit` stops the run past it ([`Steps::limit`], [`Rates::past`]); `loads` are then the
/// run's resource loads if the caller has them ([`Prepared::resource_loads`]), else they are
/// counted here.
pub(super) fn run_flows(
    (network, model): (&Network, &CostModel),
    p: &Prepared,
    (bytes, protocol): (u64, Protocol),
    log: &mut RateLog,
    (limit, loads, course): (f64, Option<&[f64]>, bool),
) -> Result<(Estimate, Spans), CostError> {
    let (mut st, mut rates) = buffers::with(|b| {
        let st = Steps::new(network, model, p, (bytes, protocol), log.is_some(), b);
        (
            st,
            FlowRates::new((network, model), p, (bytes, protocol), b),
        )
    });
    st.limit = limit;
    if limit.is_finite() {
        match loads {
            Some(loads) => rates.watch_busiest(loads),
            None => rates.watch_busiest(&p.resource_loads(bytes, network.capacity.len())),
        }
    }
    st.tracking = course && model.affine_in_size();
    rates.log = log.take();
    let result = st.execute(&mut rates);
    *log = rates.log.take();
    let resource_bytes = std::mem::take(&mut rates.resource_bytes);
    let (now, messages, payload, course) = (st.now, st.messages, st.payload, st.course);
    let st_tracking = st.tracking;
    buffers::with(|b| {
        st.recycle(b);
        rates.recycle(b);
    });
    let spans = result?;
    let base = model.base_us(protocol);
    Ok((
        Estimate {
            time_us: base + now,
            base_us: base,
            messages,
            payload_bytes: payload,
            resource_bytes,
            course: st_tracking.then_some(course),
        },
        spans,
    ))
}

/// Per resource, the sum of its flows' rates over time, from a traced run's rate changes.
pub(super) fn resource_uses(p: &Prepared, log: Vec<(f64, u32, f64)>) -> Vec<ResourceUse> {
    let mut rate = vec![0.0f64; p.msg_conn.len()];
    let mut uses: FxHashMap<u32, Vec<(f64, f64)>> = FxHashMap::default();
    let mut total: FxHashMap<u32, f64> = FxHashMap::default();
    for (t, m, new) in log {
        let Some(old) = rate.get_mut(m as usize) else {
            continue;
        };
        let delta = new - *old;
        *old = new;
        if delta == 0.0 {
            continue;
        }
        for &r in &p.conn_route[p.msg_conn[m as usize] as usize].resources {
            let sum = total.entry(r).or_insert(0.0);
            *sum += delta;
            // Rounding leaves a few ulps where every flow has ended.
            if sum.abs() < 1e-9 * delta.abs().max(1.0) {
                *sum = 0.0;
            }
            let gbps = (*sum / 1e3).max(0.0);
            let points = uses.entry(r).or_default();
            match points.last_mut() {
                Some(last) if last.0 == t => last.1 = gbps,
                _ => points.push((t, gbps)),
            }
        }
    }
    let mut out: Vec<ResourceUse> = uses
        .into_iter()
        .map(|(resource, mut rates)| {
            // Drop points that repeat the previous rate.
            rates.dedup_by(|b, a| a.1 == b.1);
            ResourceUse { resource, rates }
        })
        .collect();
    out.sort_unstable_by_key(|u| u.resource);
    out
}

/// Everything a run reads and writes of one streaming flow, in one cache line, indexed by
/// its *seat*: flows take free seats when they start and leave them when they end, so the
/// few hundred flows streaming at once sit in a few hundred lines wherever their messages
/// are in the schedule. (Indexed by message, a 100k-step schedule's flows were 4 MB apart,
/// and its component searches and fillings waited on the last-level cache.)
#[derive(Clone, Copy, Default)]
#[repr(align(64))]
pub(super) struct Flow {
    rate: f64,
    /// Bytes left to send as of `last` (µs).
    remaining: f64,
    last: f64,
    /// The rate the filling gives it (scratch).
    new_rate: f64,
    /// Epoch in which the component search met it.
    seen: u32,
    /// Epoch in which the filling froze it.
    frozen: u32,
    /// Its route's representatives in [`FlowRoutes::all`]: start and count (set when it
    /// starts).
    at: u32,
    len: u32,
    /// The push order of its live end event (0: none).
    end_seq: u32,
    /// The message it carries.
    msg: u32,
    /// Whether it is streaming.
    active: bool,
}

impl Flow {
    /// Its route's representatives, out of [`FlowRoutes::all`].
    #[inline]
    fn route(self, all: &[u32]) -> &[u32] {
        &all[self.at as usize..(self.at + self.len) as usize]
    }
}

/// Max-min fair rates of every flow of a whole schedule (see [`FlowRates::recompute`]).
struct FlowRates<'a> {
    p: &'a Prepared,
    /// Each message's resources as bandwidth is shared over them.
    routes: &'a FlowRoutes,
    /// Rate changes, when the run is traced.
    log: RateLog,
    /// Streaming flows by seat ([`Flow`]; the others are free, in `free`).
    flow: Vec<Flow>,
    /// Per message, the seat of its flow while it streams, else [`NONE`].
    seat_of: Vec<u32>,
    /// Seats free for the next flows: the last freed is taken first (its line is the likeliest
    /// to be in cache).
    free: Vec<u32>,
    /// Per resource, the seats of the flows on it.
    res_flows: Vec<Vec<u32>>,
    /// Where each flow sits in the flow list of each resource on its route: `slot[f × w +
    /// j]` for the `j`-th resource of the route of the flow in seat `f`, `w` the most
    /// resources on a route ([`FlowRoutes::widest`]); a finished flow leaves every list in
    /// O(1), not by searching lists of thousands of flows.
    slot: Vec<u32>,
    cap: Vec<f64>,
    resource_bytes: Vec<f64>,
    dirty: Vec<u32>,
    /// Resources a finished flow left without flows since the last recomputation: nothing
    /// to share there, so they are not searched; an exact recomputation zeroes their
    /// allocation, as filling them would (a large component's keeps what is left).
    emptied: Vec<u32>,
    /// Flows (seats) started since the last recomputation.
    fresh: Vec<u32>,
    /// Capacity currently allocated on each resource (bytes/µs): what a large component's
    /// new flows take theirs from. Kept only where one can form: where more than
    /// [`EXACT_COMPONENT`] flows can be active at once ([`FlowRoutes::most_active`]).
    used: Vec<f64>,
    /// Whether `used` and `fresh` are kept.
    approximating: bool,
    active_count: usize,
    /// Flows finished since the last recomputation.
    released: usize,
    /// Approximate allocations since the last full recomputation.
    pending_changes: usize,
    // scratch for rate recomputation
    res_stamp: Vec<u32>,
    epoch: u32,
    shares: Shares,
    /// Scratch: the resources and flows of the component being recomputed.
    comp_res: Vec<u32>,
    comp_flows: Vec<u32>,
    /// The busiest resources of a run given a limit, which stops once one of them could
    /// not carry what is left to start on it before the limit ([`Rates::past`]).
    watch: Vec<Watched>,
    /// Times the clock moved on (the watch looks every [`WATCH_EVERY`]-th).
    advances: u32,
}

/// A resource a run given a limit watches: whatever has not started on it by time `t`
/// crosses it after `t`, at no more than its capacity (rates never exceed a resource's
/// capacity, whether allocated exactly or approximately), so the run cannot end before
/// `t + (load − started) / capacity`.
#[derive(Clone, Copy)]
struct Watched {
    res: u32,
    /// The bytes the whole run carries over it.
    load: f64,
    /// µs per byte at its capacity.
    per_byte: f64,
    /// µs its whole load takes at its capacity.
    span: f64,
}

/// How often a run given a limit looks at its watched resources: every this many times its
/// clock moves on.
const WATCH_EVERY: u32 = 4;
/// How far past its limit a watched resource's bound must be to stop the run (relative):
/// far above the rounding of a run's times, so that a run the bound stops would never have
/// come in within its limit.
const WATCH_MARGIN: f64 = 1e-7;

impl<'a> FlowRates<'a> {
    fn new(
        (network, model): (&Network, &CostModel),
        p: &'a Prepared,
        (bytes, protocol): (u64, Protocol),
        b: &mut Buffers,
    ) -> FlowRates<'a> {
        let nmsg = p.msg_conn.len();
        let nres = network.capacity.len();
        // The calibration's bandwidth factor at this size scales links and local work alike.
        let scale = model.bandwidth_factor(bytes);
        let eff = model.efficiency(protocol) * scale;
        let routes: &FlowRoutes = p
            .flow_routes
            .get_or_init(|| std::sync::Arc::new(FlowRoutes::new(p, &network.capacity)));
        // GB/s × 1e3 = bytes per µs.
        let mut cap = b.empty();
        cap.extend(network.capacity.iter().map(|c| c * eff * 1e3));
        FlowRates {
            p,
            routes,
            flow: b.empty(),
            seat_of: b.filled(nmsg, NONE),
            free: b.empty(),
            res_flows: b.lists(nres),
            slot: b.empty(),
            cap,
            resource_bytes: vec![0.0; nres],
            dirty: b.empty(),
            emptied: b.empty(),
            fresh: b.empty(),
            used: b.filled(nres, 0.0),
            approximating: routes.most_active > EXACT_COMPONENT,
            active_count: 0,
            released: 0,
            pending_changes: 0,
            res_stamp: b.filled(nres, 0),
            epoch: 0,
            shares: Shares::new(nres),
            comp_res: b.empty(),
            comp_flows: b.empty(),
            watch: Vec::new(),
            advances: 0,
            log: None,
        }
    }

    /// Hands this run's arrays to `b` for a later run (all but the resource bytes, which
    /// the estimate keeps).
    fn recycle(self, b: &mut Buffers) {
        b.keep_lists(self.res_flows);
        for v in [self.cap, self.used] {
            b.keep(v);
        }
        for v in [
            self.slot,
            self.seat_of,
            self.free,
            self.dirty,
            self.emptied,
            self.fresh,
            self.res_stamp,
            self.comp_res,
            self.comp_flows,
        ] {
            b.keep(v);
        }
        b.keep(self.flow);
        self.shares.keep();
    }
}

impl Rates for FlowRates<'_> {
    fn start(&mut self, st: &mut Steps<'_>, m: u32, bytes: f64) {
        let mi = m as usize;
        let p = self.p;
        let c = p.msg_conn[mi];
        for &r in &p.conn_route[c as usize].resources {
            self.resource_bytes[r as usize] += bytes;
        }
        let f = self.seat(m);
        let route = self.routes.of(c);
        let base = f as usize * self.routes.widest;
        for (j, &r) in route.iter().enumerate() {
            let list = &mut self.res_flows[r as usize];
            self.slot[base + j] = list.len() as u32;
            list.push(f);
            // (One at a time: routes are a few resources, which a copy call would cost more.)
            self.dirty.push(r);
        }
        self.active_count += 1;
        if self.approximating {
            self.fresh.push(f);
        }
        let (at, len) = self.routes.span(c);
        // As a flow that never streamed: nothing of the seat's last flow carries over.
        self.flow[f as usize] = Flow {
            remaining: bytes,
            last: st.now,
            at,
            len,
            msg: m,
            active: true,
            ..Flow::default()
        };
    }

    fn finish(&mut self, st: &mut Steps<'_>, m: u32) {
        let mi = m as usize;
        if let Some(log) = &mut self.log {
            log.push((st.now, m, 0.0));
        }
        let f = std::mem::replace(&mut self.seat_of[mi], NONE);
        self.flow[f as usize].active = false;
        self.free.push(f);
        self.active_count -= 1;
        self.released += 1;
        let all: &[u32] = self.routes.all();
        let route = self.flow[f as usize].route(all);
        let w = self.routes.widest;
        let base = f as usize * w;
        for (j, &r) in route.iter().enumerate() {
            if self.approximating {
                self.used[r as usize] =
                    (self.used[r as usize] - self.flow[f as usize].rate).max(0.0);
            }
            let list = &mut self.res_flows[r as usize];
            let pos = self.slot[base + j] as usize;
            let last = list.len() - 1;
            list.swap_remove(pos);
            if last == 0 {
                self.emptied.push(r);
            } else {
                self.dirty.push(r);
            }
            if pos < last {
                // The flow that was last now sits at `pos`: its entry for `r` (a route
                // lists each resource once) points there.
                let moved = list[pos] as usize;
                let mroute = self.flow[moved].route(all);
                if let Some(k) = mroute.iter().position(|&x| x == r) {
                    self.slot[moved * w + k] = pos as u32;
                }
            }
        }
    }

    fn past(&mut self, now: f64, limit: f64) -> bool {
        self.advances = self.advances.wrapping_add(1);
        if !self.advances.is_multiple_of(WATCH_EVERY) {
            return false;
        }
        let slack = limit * (1.0 + WATCH_MARGIN) - now;
        for w in &self.watch {
            if w.span <= slack {
                // Nor can any after it: their whole load takes no longer.
                return false;
            }
            if (w.load - self.resource_bytes[w.res as usize]) * w.per_byte > slack {
                return true;
            }
        }
        false
    }

    fn current(&self, m: u32, seq: u32) -> bool {
        let f = self.seat_of[m as usize];
        f != NONE && self.flow[f as usize].end_seq == seq
    }

    fn dirty(&self) -> bool {
        !self.dirty.is_empty() || !self.emptied.is_empty()
    }

    fn recompute(&mut self, st: &mut Steps<'_>) {
        self.recompute_dirty(st);
    }

    fn revive(&mut self, st: &mut Steps<'_>) -> bool {
        if self.active_count > 0 && self.pending_changes + self.released > 0 {
            // Flows left without capacity by approximate allocation: re-balance.
            self.full_recompute(st);
            true
        } else {
            false
        }
    }
}

impl<'a> FlowRates<'a> {
    /// Watches every resource a run given a limit loads ([`Watched`]; `loads`: bytes per
    /// resource), the longest its load takes at its capacity first: [`Rates::past`] goes
    /// down the list until the resources left could carry their whole load in time.
    fn watch_busiest(&mut self, loads: &[f64]) {
        let mut busiest: Vec<Watched> = loads
            .iter()
            .zip(&self.cap)
            .enumerate()
            .filter(|&(_, (&load, &cap))| load > 0.0 && cap > 0.0 && cap.is_finite())
            .map(|(r, (&load, &cap))| Watched {
                res: r as u32,
                load,
                per_byte: 1.0 / cap,
                span: load / cap,
            })
            .collect();
        busiest.sort_by(|a, b| b.span.total_cmp(&a.span).then(a.res.cmp(&b.res)));
        self.watch = busiest;
    }

    /// Max-min fair rates for the flows connected to the dirty resources. Components of at
    /// most [`EXACT_COMPONENT`] flows are recomputed exactly at every change. In larger ones
    /// (all-to-all traffic through shared switches) a new flow takes the capacity its route
    /// has left and a finished flow's capacity is released, and the whole network is
    /// re-balanced after every `max(EXACT_COMPONENT / 4, active / 4)` such changes: rates stay
    /// feasible (no resource is ever over capacity), so lower bounds remain valid, and the
    /// cost per event stays bounded.
    fn recompute_dirty(&mut self, st: &mut Steps<'_>) {
        let epoch = self.next_epoch();
        let all: &'a [u32] = self.routes.all();
        let mut stack = std::mem::take(&mut self.dirty);
        let mut fresh = std::mem::take(&mut self.fresh);
        let mut comp_res = std::mem::take(&mut self.comp_res);
        let mut comp_flows = std::mem::take(&mut self.comp_flows);
        comp_res.clear();
        comp_flows.clear();
        let mut big = false;
        'bfs: while let Some(r) = stack.pop() {
            if self.res_stamp[r as usize] == epoch {
                continue;
            }
            self.res_stamp[r as usize] = epoch;
            comp_res.push(r);
            if self.res_flows[r as usize].len() > EXACT_COMPONENT {
                // More flows on this one resource than an exact component may hold: the
                // search below would only find that out after stamping them.
                big = true;
                break 'bfs;
            }
            for &f in &self.res_flows[r as usize] {
                let flow = &mut self.flow[f as usize];
                if flow.seen != epoch {
                    flow.seen = epoch;
                    comp_flows.push(f);
                    if comp_flows.len() > EXACT_COMPONENT {
                        big = true;
                        break 'bfs;
                    }
                    for &r2 in flow.route(all) {
                        if self.res_stamp[r2 as usize] != epoch {
                            stack.push(r2);
                        }
                    }
                }
            }
        }
        stack.clear();
        self.dirty = stack;
        if !big {
            // What filling the emptied resources (and a component left without flows)
            // would do.
            if self.approximating {
                for &r in &self.emptied {
                    self.used[r as usize] = 0.0;
                }
                if comp_flows.is_empty() {
                    for &r in &comp_res {
                        self.used[r as usize] = 0.0;
                    }
                }
            }
            if !comp_flows.is_empty() {
                self.fill(st, &comp_res, &comp_flows);
            }
        }
        self.emptied.clear();
        self.comp_res = comp_res;
        self.comp_flows = comp_flows;
        if !big {
            fresh.clear();
            self.fresh = fresh;
            return;
        }
        // Large component: give new flows what their route has left.
        let mut changes = self.released;
        self.released = 0;
        for &f in &fresh {
            if !self.flow[f as usize].active || self.flow[f as usize].rate > 0.0 {
                continue;
            }
            changes += 1;
            let route: &'a [u32] = self.flow[f as usize].route(all);
            let rate = route
                .iter()
                .map(|&r| (self.cap[r as usize] - self.used[r as usize]).max(0.0))
                .fold(f64::INFINITY, f64::min);
            if rate > 0.0 && rate.is_finite() {
                for &r in route {
                    self.used[r as usize] += rate;
                }
                self.set_rate(st, f, rate);
            }
        }
        fresh.clear();
        self.fresh = fresh;
        self.pending_changes += changes;
        let threshold = (EXACT_COMPONENT / 4).max(self.active_count / 4);
        if self.pending_changes >= threshold {
            self.full_recompute(st);
        }
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.res_stamp.iter_mut().for_each(|x| *x = 0);
            self.flow.iter_mut().for_each(|f| {
                f.seen = 0;
                f.frozen = 0;
            });
            self.epoch = 1;
        }
        self.epoch
    }

    /// Exact max-min rates over every active flow.
    fn full_recompute(&mut self, st: &mut Steps<'_>) {
        self.pending_changes = 0;
        self.released = 0;
        self.fresh.clear();
        self.dirty.clear();
        self.emptied.clear();
        let epoch = self.next_epoch();
        let mut comp_res = std::mem::take(&mut self.comp_res);
        let mut comp_flows = std::mem::take(&mut self.comp_flows);
        comp_res.clear();
        comp_flows.clear();
        for r in 0..self.res_flows.len() {
            if self.res_flows[r].is_empty() {
                continue;
            }
            comp_res.push(r as u32);
            for &f in &self.res_flows[r] {
                if self.flow[f as usize].seen != epoch {
                    self.flow[f as usize].seen = epoch;
                    comp_flows.push(f);
                }
            }
        }
        self.fill(st, &comp_res, &comp_flows);
        self.comp_res = comp_res;
        self.comp_flows = comp_flows;
    }

    /// Seats the flow of message `m` (see [`Flow`]): a free seat, or a new one.
    fn seat(&mut self, m: u32) -> u32 {
        let f = match self.free.pop() {
            Some(f) => f,
            None => {
                self.flow.push(Flow::default());
                self.shares.solo.push(None);
                self.slot.extend(std::iter::repeat_n(0, self.routes.widest));
                self.flow.len() as u32 - 1
            }
        };
        self.seat_of[m as usize] = f;
        f
    }

    /// Sets a flow's rate (`f`: its seat), settling its progress and scheduling its end.
    fn set_rate(&mut self, st: &mut Steps<'_>, f: u32, new: f64) {
        let flow = &mut self.flow[f as usize];
        let elapsed = st.now - flow.last;
        flow.remaining = (flow.remaining - flow.rate * elapsed).max(0.0);
        flow.last = st.now;
        flow.rate = new;
        let finish = (new > 0.0).then(|| st.now + flow.remaining / new);
        let live = flow.end_seq;
        let m = flow.msg;
        if let Some(log) = &mut self.log {
            log.push((st.now, m, new));
        }
        self.flow[f as usize].end_seq = st.replace_flow_end(m, live, finish);
    }

    /// Progressive filling over a closed set of resources and the flows on them.
    fn fill(&mut self, st: &mut Steps<'_>, comp_res: &[u32], comp_flows: &[u32]) {
        let epoch = self.epoch;
        let all: &'a [u32] = self.routes.all();
        if let [f] = *comp_flows
            && let route = self.flow[f as usize].route(all)
            && let Some(&narrowest) = route
                .iter()
                .min_by_key(|&&r| (total_order_key(self.cap[r as usize]), r))
        {
            // A flow alone on its resources (most changes on rings and trees): the filling
            // below would freeze it at its narrowest resource's capacity, the first share.
            let share = self.cap[narrowest as usize].max(0.0);
            if self.approximating {
                for &r in comp_res {
                    self.used[r as usize] = 0.0;
                }
                for &r in route {
                    self.used[r as usize] = share;
                }
            }
            let rate = self.flow[f as usize].rate;
            if share != rate || rate == 0.0 {
                self.set_rate(st, f, share);
            }
            return;
        }
        // Progressive filling: repeatedly freeze the flows of the resource with the smallest
        // fair share `rem / cnt` (ties: lowest id) at that share.
        {
            let FlowRates {
                shares,
                cap,
                res_flows,
                flow,
                ..
            } = self;
            shares.sorted.clear();
            shares.cursor = 0;
            shares.later.clear();
            // Unfrozen flow-resource pairs: once none is left, every remaining entry is moot.
            let mut live: u64 = 0;
            for &r in comp_res {
                let ri = r as usize;
                let flows = &res_flows[ri];
                let cnt = flows.len() as u32;
                let rem = cap[ri];
                live += u64::from(cnt);
                let e = Share {
                    key: total_order_key(rem / f64::from(cnt)),
                    res: r,
                    stamp: cnt,
                };
                shares.res[ri] = FillRes {
                    rem,
                    rep_key: e.key,
                    cnt,
                    rep_stamp: cnt,
                };
                match cnt {
                    0 => {}
                    1 => {
                        // Of the resources a flow has to itself, only the first in filling
                        // order can freeze it: the others keep their share until it does.
                        let f = flows[0] as usize;
                        match shares.solo[f] {
                            Some(b) if b <= e => {}
                            Some(_) => shares.solo[f] = Some(e),
                            None => {
                                shares.solo[f] = Some(e);
                                shares.solo_flows.push(f as u32);
                            }
                        }
                    }
                    _ => shares.sorted.push(e),
                }
            }
            for i in 0..shares.solo_flows.len() {
                let f = shares.solo_flows[i] as usize;
                if let Some(e) = shares.solo[f].take() {
                    shares.sorted.push(e);
                }
            }
            shares.solo_flows.clear();
            shares.sorted.sort_unstable_by_key(|e| {
                (u128::from(e.key) << 64) | (u128::from(e.res) << 32) | u128::from(e.stamp)
            });
            while live > 0
                && let Some(e) = shares.pop()
            {
                let res = e.res;
                let ri = res as usize;
                let FillRes {
                    rem,
                    cnt,
                    rep_stamp,
                    ..
                } = shares.res[ri];
                if cnt == 0 || e.stamp != rep_stamp {
                    continue; // all its flows are frozen, or superseded
                }
                let share = rem / f64::from(cnt);
                if cnt != e.stamp {
                    // Raised since it was stored: put back at its current share.
                    let e = Share {
                        key: total_order_key(share),
                        res,
                        stamp: cnt,
                    };
                    shares.represent(e);
                    shares.later.push(Reverse(e));
                    continue;
                }
                let share = share.max(0.0);
                for &f in &res_flows[ri] {
                    let fl = &mut flow[f as usize];
                    if fl.frozen == epoch {
                        continue;
                    }
                    fl.frozen = epoch;
                    fl.new_rate = share;
                    for &r2 in fl.route(all) {
                        let r2s = &mut shares.res[r2 as usize];
                        r2s.rem = (r2s.rem - share).max(0.0);
                        r2s.cnt -= 1;
                        live -= 1;
                        if r2s.cnt > 0 && r2 != res && !surely_not_below(r2s) {
                            let key = total_order_key(r2s.rem / f64::from(r2s.cnt));
                            // A lowered share (rounding) is queued now; raised ones wait
                            // until their representative reaches the front.
                            if key < r2s.rep_key {
                                r2s.rep_key = key;
                                r2s.rep_stamp = r2s.cnt;
                                shares.later.push(Reverse(Share {
                                    key,
                                    res: r2,
                                    stamp: r2s.cnt,
                                }));
                            }
                        }
                    }
                }
            }
        }
        self.take_new_rates(st, comp_res, comp_flows);
    }

    /// After a filling: the flows of the component take their new rates (those that
    /// changed, in component order), and its resources' allocated capacity is summed again.
    fn take_new_rates(&mut self, st: &mut Steps<'_>, comp_res: &[u32], comp_flows: &[u32]) {
        let all: &'a [u32] = self.routes.all();
        if self.approximating {
            for &r in comp_res {
                self.used[r as usize] = 0.0;
            }
        }
        for &f in comp_flows {
            let flow = self.flow[f as usize];
            let (rate, new) = (flow.rate, flow.new_rate);
            if self.approximating {
                for &r in flow.route(all) {
                    self.used[r as usize] += new;
                }
            }
            if new != rate || rate == 0.0 {
                self.set_rate(st, f, new);
            }
        }
    }
}

#[cfg(test)]
mod tests;
