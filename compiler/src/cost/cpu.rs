//! The simulator for CPU ranks of one host: each rank is the executor's one thread, which
//! does the memory work of its steps itself, one step at a time.
//!
//! The flow model ([`super::sim`]) suits GPUs, where copy engines and thread blocks move
//! many messages at once and a link's bandwidth is what limits them. On a CPU host the
//! replay engine (`hccl_executor::engine`) interleaves a rank's streams on one thread, and
//! every byte a step touches costs that thread memory bandwidth; a message costs its
//! receiver nothing until the receiver gets to it. So here:
//!
//! - a rank runs one step at a time; among its runnable steps it takes the one that became
//!   runnable first (the engine's sweep over streams);
//! - with more ranks than cores (`cores`, when the calibration knows them), at most `cores`
//!   ranks work at once: a rank with work and no free core waits for one (a waiting rank
//!   yields its core, and a rank that finishes a step keeps its core for its next one);
//! - a step costs `step_us` plus its memory traffic over the rank's bandwidth (the topology's
//!   memory bandwidth of the device, times the calibration's factor for the collective's
//!   size), in passes over its bytes: a send `send_passes` (read the buffer, write the slot);
//!   a receive `recv_passes` for reading the message out of the slot, which another core
//!   wrote, plus `local_weight` per local pass (writing the destination, reading a
//!   reduction's local operand) plus half a send when it forwards (writing the next slot); a
//!   local copy `copy_passes` and a local reduce `reduce_passes`, weighted by `local_weight`;
//! - a receive is runnable once its message has arrived: `message_us` after the sender's
//!   step ended (the flag's trip between cores); a send (or a forwarding receive) once its
//!   connection has a free slot: `message_us` after the receive that freed it ended;
//! - a call whose chunks do not fit the executor's slots (`slot_bytes`) runs as the
//!   executor runs it: in segments, each a whole replay of the schedule over a slice of
//!   the buffers, one after the other;
//! - the collective's time is `base_us` plus the end of the last step of the last segment.
//!
//! Messages between hosts are not modelled here: CPU clusters keep the flow model.

use super::CostError;
use super::model::CostModel;
use super::model::{CpuModel, EXECUTOR_LL_SLOTS};
use super::network::Network;
use super::prepared::{Estimate, Kind, NONE, Prepared, Spans};
use super::steps::Event;
use hccl_ir::{CONNECTION_SLOTS, CollectiveKind, Protocol, StepRef};
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// All dependencies of the step are done.
    Ready(u32),
    /// A message is visible to its receiver.
    Arrive(u32),
    /// A slot of a connection is visible as free to its sender.
    Credit(u32),
    /// A step ended.
    Done(u32),
}

struct State<'a> {
    model: &'a CostModel,
    cpu: &'a CpuModel,
    p: &'a Prepared,
    protocol: Protocol,
    /// Messages a connection buffers: [`CONNECTION_SLOTS`], or the LL ring's depth.
    depth: usize,
    chunk_bytes: f64,
    /// Bytes per µs of each rank.
    bw: Vec<f64>,
    heap: BinaryHeap<Event<Ev>>,
    seq: u64,
    pending: Vec<u32>,
    done: Vec<bool>,
    completed: usize,
    /// Steps of each rank whose dependencies are done, with the time they became so.
    candidates: Vec<Vec<(f64, u32)>>,
    busy: Vec<bool>,
    arrived: Vec<bool>,
    /// Slots each connection's sender has seen freed.
    credits: Vec<u32>,
    /// Cores the ranks share, ranks working now, ranks with work waiting for a core.
    cores: usize,
    running: usize,
    waiting: std::collections::VecDeque<u32>,
    queued: Vec<bool>,
    end: f64,
    messages: usize,
    payload: f64,
    resource_bytes: Vec<f64>,
    /// Per step: (start on its core, end), when traced.
    spans: Spans,
}

/// Simulates `p` for a collective of `bytes` with the CPU model `cpu`; when `trace`, also
/// when each step of one segment ran, and the number of segments.
pub(super) fn run(
    (network, model): (&Network, &CostModel),
    cpu: &CpuModel,
    p: &Prepared,
    bytes: u64,
    protocol: Protocol,
    trace: bool,
) -> Result<(Estimate, Spans, u64), CostError> {
    // The working set is the whole call's, whatever the segments.
    let scale = model.bandwidth_factor(bytes);
    let nranks = network.mem_bw.len();
    let segs = segments(cpu, p, bytes, nranks as u64, protocol);
    let seg_bytes = bytes as f64 / segs as f64;
    let mut st = State {
        model,
        cpu,
        p,
        protocol,
        depth: if protocol == Protocol::LL {
            EXECUTOR_LL_SLOTS
        } else {
            CONNECTION_SLOTS
        },
        chunk_bytes: seg_bytes / f64::from(p.chunks),
        bw: network
            .mem_bw
            .iter()
            .map(|&b| {
                if b.is_finite() && b > 0.0 {
                    b * scale * 1e3
                } else {
                    f64::INFINITY
                }
            })
            .collect(),
        heap: BinaryHeap::new(),
        seq: 0,
        pending: p.pending.clone(),
        done: vec![false; p.steps.len()],
        completed: 0,
        candidates: vec![Vec::new(); nranks],
        busy: vec![false; nranks],
        arrived: vec![false; p.msg_conn.len()],
        credits: vec![0; p.conn_base.len()],
        cores: cpu.cores.map_or(usize::MAX, |c| (c as usize).max(1)),
        running: 0,
        waiting: std::collections::VecDeque::new(),
        queued: vec![false; nranks],
        end: 0.0,
        messages: 0,
        payload: 0.0,
        resource_bytes: vec![0.0; network.capacity.len()],
        spans: trace.then(|| vec![(f64::NAN, f64::NAN); p.steps.len()]),
    };
    for s in 0..p.steps.len() as u32 {
        if st.pending[s as usize] == 0 {
            st.push(0.0, Ev::Ready(s));
        }
    }
    while let Some(e) = st.heap.pop() {
        let now = e.time;
        match e.kind {
            Ev::Ready(s) => {
                let step = &p.steps[s as usize];
                if matches!(step.kind, Kind::Nop) {
                    st.finish(s, now);
                } else {
                    st.candidates[step.rank as usize].push((now, s));
                    st.try_run(step.rank, now);
                }
            }
            Ev::Arrive(m) => {
                st.arrived[m as usize] = true;
                let r = p.msg_recv[m as usize];
                if r != NONE {
                    st.try_run(p.steps[r as usize].rank, now);
                }
            }
            Ev::Credit(c) => {
                st.credits[c as usize] += 1;
                let m = p.conn_base[c as usize];
                let sender = p.steps[p.msg_send[m as usize] as usize].rank;
                st.try_run(sender, now);
            }
            Ev::Done(s) => {
                let rank = p.steps[s as usize].rank;
                st.busy[rank as usize] = false;
                st.running -= 1;
                st.finish(s, now);
                st.try_run(rank, now);
                while st.running < st.cores {
                    let Some(r) = st.waiting.pop_front() else {
                        break;
                    };
                    st.queued[r as usize] = false;
                    st.try_run(r, now);
                }
            }
        }
    }
    if st.completed < p.steps.len() {
        let at = (0..p.steps.len()).find(|&i| !st.done[i]).map_or(
            StepRef {
                rank: 0,
                stream: 0,
                step: 0,
            },
            |i| p.step_ref[i],
        );
        return Err(CostError::Deadlock { at });
    }
    let base = model.base_us(protocol);
    let k = segs as f64;
    Ok((
        Estimate {
            time_us: base + st.end * k,
            base_us: base,
            messages: st.messages * segs as usize,
            payload_bytes: st.payload * k,
            resource_bytes: st.resource_bytes.iter().map(|b| b * k).collect(),
            course: None,
        },
        st.spans,
        segs,
    ))
}

/// Scratch the executor allows a rank (`hccl_executor` `program::SCRATCH_BUDGET`): a
/// schedule with more scratch chunks than this holds at a chunk per slot runs in smaller
/// segments.
const EXECUTOR_SCRATCH_BUDGET: u64 = 32 << 20;

/// How many segments the executor cuts a call of `bytes` into (`hccl_executor::comm`): a
/// segment gives each chunk at most `slot_bytes / count` bytes, `count` the largest message
/// (so every message fits a slot) or more where the rank's scratch would exceed its budget.
fn segments(cpu: &CpuModel, p: &Prepared, bytes: u64, nranks: u64, protocol: Protocol) -> u64 {
    let blocked = matches!(
        p.collective.kind(),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll
    );
    let (stride, chunks_per_block) = if blocked {
        (bytes / nranks.max(1), u64::from(p.chunks) / nranks.max(1))
    } else {
        (bytes, u64::from(p.chunks))
    };
    let max_count = u64::from(p.max_count.max(1));
    // LL entries use the LL slots when a step's chunks fit one (at one byte each at least).
    let ll_bytes = cpu.ll_bytes.min(cpu.slot_bytes);
    let slot = if protocol == Protocol::LL && ll_bytes >= max_count {
        ll_bytes
    } else {
        cpu.slot_bytes
    };
    let scratch = u64::from(p.max_scratch)
        .saturating_mul(slot)
        .div_ceil(EXECUTOR_SCRATCH_BUDGET);
    let per_chunk = slot / max_count.max(scratch).max(1);
    let segmax = (per_chunk * chunks_per_block.max(1)).max(1);
    stride.div_ceil(segmax).max(1)
}

impl State<'_> {
    fn push(&mut self, time: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Event {
            time,
            seq: self.seq,
            kind: ev,
        });
    }

    /// The message a step sends (a send, or a forwarding receive), if any.
    fn out_msg(&self, s: u32) -> u32 {
        match self.p.steps[s as usize].kind {
            Kind::Send { msg } => msg,
            Kind::Recv { out, .. } => out,
            _ => NONE,
        }
    }

    fn latency(&self, m: u32) -> f64 {
        let route = &self.p.conn_route[self.p.msg_conn[m as usize] as usize];
        self.model.message_us(route.class, self.protocol)
    }

    fn runnable(&self, s: u32) -> bool {
        let step = &self.p.steps[s as usize];
        if let Kind::Recv { msg, .. } = step.kind
            && (msg == NONE || !self.arrived[msg as usize])
        {
            return false;
        }
        let out = self.out_msg(s);
        if out != NONE {
            let c = self.p.msg_conn[out as usize] as usize;
            let k = out - self.p.conn_base[c];
            if k as usize >= self.credits[c] as usize + self.depth {
                return false;
            }
        }
        true
    }

    /// Starts the earliest runnable candidate of `rank` if the rank is idle.
    fn try_run(&mut self, rank: u32, now: f64) {
        let r = rank as usize;
        if self.busy[r] {
            return;
        }
        let mut best: Option<usize> = None;
        for (i, &(since, s)) in self.candidates[r].iter().enumerate() {
            if self.runnable(s)
                && best.is_none_or(|b| {
                    let (bs, bid) = self.candidates[r][b];
                    since < bs || (since == bs && s < bid)
                })
            {
                best = Some(i);
            }
        }
        let Some(i) = best else {
            return;
        };
        if self.running >= self.cores {
            if !self.queued[r] {
                self.queued[r] = true;
                self.waiting.push_back(rank);
            }
            return;
        }
        let (_, s) = self.candidates[r].swap_remove(i);
        let step = &self.p.steps[s as usize];
        let bytes = f64::from(step.count) * self.chunk_bytes;
        let passes = match step.kind {
            Kind::Nop => 0.0,
            Kind::Local { passes } => passes * self.cpu.local_weight,
            Kind::Send { .. } => self.cpu.send_passes,
            Kind::Recv { cpu_local, out, .. } => {
                let forward = if out == NONE {
                    0.0
                } else {
                    self.cpu.send_passes / 2.0
                };
                self.cpu.recv_passes + cpu_local * self.cpu.local_weight + forward
            }
        };
        let work = if passes > 0.0 && bytes > 0.0 {
            passes * bytes / self.bw[r]
        } else {
            0.0
        };
        self.busy[r] = true;
        self.running += 1;
        if let Some(spans) = &mut self.spans {
            spans[s as usize].0 = now;
        }
        self.push(now + self.cpu.step_us + work, Ev::Done(s));
    }

    fn finish(&mut self, s: u32, now: f64) {
        let si = s as usize;
        if self.done[si] {
            return;
        }
        self.done[si] = true;
        self.completed += 1;
        self.end = self.end.max(now);
        if let Some(spans) = &mut self.spans {
            // A step no core ran (one that only waited) starts and ends together.
            if spans[si].0.is_nan() {
                spans[si].0 = now;
            }
            spans[si].1 = now;
        }
        let p = self.p;
        let out = self.out_msg(s);
        if out != NONE {
            let bytes = f64::from(p.msg_count[out as usize]) * self.chunk_bytes;
            self.messages += 1;
            self.payload += bytes;
            let route = &p.conn_route[p.msg_conn[out as usize] as usize];
            for &res in &route.resources {
                self.resource_bytes[res as usize] += bytes;
            }
            let t = now + self.latency(out);
            self.push(t, Ev::Arrive(out));
        }
        if let Kind::Recv { msg, .. } = p.steps[si].kind
            && msg != NONE
        {
            let t = now + self.latency(msg);
            self.push(t, Ev::Credit(p.msg_conn[msg as usize]));
        }
        for i in p.succ_start[si] as usize..p.succ_start[si + 1] as usize {
            let t = p.succ[i];
            self.pending[t as usize] -= 1;
            if self.pending[t as usize] == 0 {
                self.push(now, Ev::Ready(t));
            }
        }
    }
}
