//! Lowering of one call (a plan entry, a buffer size, a placement) for all ranks of a group to
//! one ordered list of device commands.
//!
//! This part is pure Rust and runs without a GPU: the tests replay the commands on host
//! memory in random interleavings that respect only what the device would respect (queue
//! order and event waits), which checks the ordering as well as the data movement.
//!
//! # From steps to commands
//!
//! Every IR stream of every rank becomes one *queue* (a CUDA stream). Every step becomes a
//! node of a dependency graph whose edges are: stream order; the step's [`hccl_ir::Dep`]s; and,
//! for each message (the k-th send of rank `a` to `b` on a channel pairs with the k-th receive
//! of `b` from `a` on it), sender step → receiver step. The receiver reads the message
//! *directly* where the sender keeps it (its source chunk, or the destination chunk of a
//! forwarding step), so the recv, reduce and copy of a chunk are one fused operation that
//! reads each input once. Because a message is then not a snapshot, any later step of the
//! sender that overwrites that memory must wait for the receiver: such write-after-read edges
//! are added; if they would close a cycle, the messages concerned are *staged* (copied at the
//! send into memory of their own) instead. `rrs` (receive-reduce-send) writes its result to
//! memory of its own per message. Messages between ranks on different devices without peer
//! access are staged onto the receiver's device (`cuMemcpyPeer`, which goes through host
//! memory when the devices cannot reach each other).
//!
//! Commands are issued in a topological order of that graph; an edge between two queues
//! becomes an event record after the producer and a wait before the consumer, and a wait is
//! always issued after its record (CUDA waits on the last *issued* record).
//!
//! # Chunks
//!
//! The whole call runs as one segment: chunk `k` of the `N`-element collective buffer covers
//! `[k·N/C, (k+1)·N/C)`; for the rank-blocked collectives (AllGather, ReduceScatter,
//! AllToAll) block `b` of `N/n` elements holds chunks `b·C/n..` cut the same way — exactly the
//! element ranges of the CPU engine with one segment. Scratch chunk `i` starts at
//! `i·maxc` elements (the largest chunk); an operation on a chunk moves the length of its
//! shortest user-buffer side.
//!
//! # AllToAllv
//!
//! An AllToAllv ([`lower_v`]) lowers an AllToAll entry whose every rank program moves chunks
//! only from input block `b` to rank `b`'s output block of the sender, and copies its own
//! block, with no scratch (`alltoallv::blockwise`: pairwise and mesh schedules) with a
//! [`BlockLayout`]: chunk `j` of block `b` (`cpb` chunks per block) of rank `r` covers
//! `[d + j·c/cpb, d + (j+1)·c/cpb)` with `d`, `c` that block's displacement and count on that
//! side (what `r` sends `b` in its input, what it receives from `b` in its output). The
//! layout is checked first so that both ends of every message agree on its size.

mod cmds;
mod emit;

pub use cmds::{BlockLayout, CallShape, Cmd, Lowered, Mem, OneDevice, Placement, Queue, Span};

use super::CudaError;
use crate::dtype::ReduceOp;
use crate::program::{Entry, Instr, Kind};
use emit::Emitter;
use hccl_ir::{Buf, Collective, CollectiveKind, Loc};
use std::collections::{BTreeMap, VecDeque};

/// Element geometry of a call.
#[derive(Debug, Clone, Copy)]
struct Geo<'a> {
    esize: usize,
    cpb: u64,
    stride: u64,
    maxc: usize,
    /// Per-rank blocks of an AllToAllv.
    var: Option<&'a BlockLayout>,
}

impl Geo<'_> {
    /// Elements `[start, end)` of chunk `k` of rank `rank`'s buffer `buf` (input or output).
    fn range(&self, rank: u32, buf: Buf, k: u32) -> (usize, usize) {
        let k = u64::from(k);
        let (b, j) = (k / self.cpb, k % self.cpb);
        let (base, len) = match self.var {
            None => (b * self.stride, self.stride),
            Some(v) => {
                let (r, b) = (rank as usize, b as usize);
                let (counts, displs) = if buf == Buf::Input {
                    (&v.send_counts, &v.send_displs)
                } else {
                    (&v.recv_counts, &v.recv_displs)
                };
                (displs[r][b] as u64, counts[r][b] as u64)
            }
        };
        let cut = |j: u64| (u128::from(j) * u128::from(len) / u128::from(self.cpb)) as u64;
        ((base + cut(j)) as usize, (base + cut(j + 1)) as usize)
    }
}

/// The memory one rank's Input and Output locations start at.
#[derive(Debug, Clone, Copy)]
struct Bases {
    input: (Mem, usize),
    output: (Mem, usize),
}

type NodeId = usize;

struct Node {
    rank: u32,
    queue: u32,
    stream: u32,
    step: u32,
}

/// Per-chunk operands of a step, resolved to spans (full lengths).
fn span_of(geo: &Geo, bases: &Bases, rank: u32, loc: Loc, i: u32) -> Span {
    let k = loc.off + i;
    match loc.buf {
        Buf::Scratch => Span {
            mem: Mem::Scratch(rank),
            off: k as usize * geo.maxc * geo.esize,
            len: geo.maxc * geo.esize,
        },
        Buf::Input | Buf::Output => {
            let (mem, base) = if loc.buf == Buf::Input {
                bases.input
            } else {
                bases.output
            };
            let (s, e) = geo.range(rank, loc.buf, k);
            Span {
                mem,
                off: base + s * geo.esize,
                len: (e - s) * geo.esize,
            }
        }
    }
}

/// Lowers `entries[r]` (entry compiled for rank `r`, all of the same plan entry) for a call of
/// `shape`.
pub(crate) fn lower(
    entries: &[Entry],
    shape: &CallShape,
    place: &dyn Placement,
) -> Result<Lowered, CudaError> {
    lower_with(entries, shape, None, place)
}

/// Lowers an AllToAllv of `esize`-byte elements laid out by `layout` on the AllToAll entry
/// `entries` (compiled per rank), which must move blocks straight to their ranks
/// (`alltoallv::blockwise` on every rank); the layout is checked first.
pub(crate) fn lower_v(
    entries: &[Entry],
    layout: &BlockLayout,
    esize: usize,
    place: &dyn Placement,
) -> Result<Lowered, CudaError> {
    let n = entries.len();
    layout.check(n)?;
    if let Some(r) = (0..n).find(|&r| !crate::alltoallv::blockwise(&entries[r], r as u32, n as u32))
    {
        return Err(CudaError::Invalid(format!(
            "alltoallv: rank {r}'s program of entry {} relays blocks, so it cannot be replayed \
             with per-block sizes",
            entries[r].index
        )));
    }
    // Uniform geometry of blocks of the largest size: scratch chunks (none here) and
    // the divisibility check; every input and output chunk is cut by the layout.
    let largest = layout.largest().max(1);
    let shape = CallShape {
        collective: Collective::AllToAll,
        op: ReduceOp::Sum,
        esize,
        total: largest * n,
        in_place: false,
    };
    let mut low = lower_with(entries, &shape, Some(layout), place)?;
    low.send_bytes = (0..n).map(|r| layout.send_len(r)).max().unwrap_or(0) * esize;
    low.recv_bytes = (0..n).map(|r| layout.recv_len(r)).max().unwrap_or(0) * esize;
    Ok(low)
}

/// Lowers `entries` for a call of `shape` (`var`: the blocks of an AllToAllv), with devices
/// placed as `place` says.
///
/// Phases: the steps as nodes on queues ([`Graph::new`]); where each rank's buffers live
/// ([`place_buffers`]); messages paired ([`pair_messages`]); the order of issue and what
/// each node waits for ([`order_nodes`]); the commands ([`emit`], [`emit_tail`]).
fn lower_with(
    entries: &[Entry],
    shape: &CallShape,
    var: Option<&BlockLayout>,
    place: &dyn Placement,
) -> Result<Lowered, CudaError> {
    let n = entries.len() as u32;
    let first = entries
        .first()
        .ok_or_else(|| CudaError::Invalid("a group needs at least one rank".into()))?;
    let es = shape.esize;
    if shape.blocked() && !shape.total.is_multiple_of(n as usize) {
        return Err(CudaError::Invalid(format!(
            "{}: {} elements do not divide into {n} ranks",
            shape.collective, shape.total
        )));
    }
    let blk = if shape.blocked() {
        shape.total / n as usize
    } else {
        shape.total
    };
    let cpb = u64::from(if shape.blocked() {
        first.chunks / n
    } else {
        first.chunks
    })
    .max(1);
    let geo = Geo {
        esize: es,
        cpb,
        stride: blk as u64,
        maxc: (blk as u64).div_ceil(cpb) as usize,
        var,
    };

    let g = Graph::new(entries);
    let placed = place_buffers(entries, shape, blk);
    let (incoming, outgoing) = pair_messages(&g)?;
    let links = (incoming.as_slice(), outgoing.as_slice());
    let ord = order_nodes(&g, &geo, &placed.bases, links, place)?;
    let Emitted {
        mut em,
        staging,
        scratch_bytes,
    } = emit(&g, &geo, &placed, links, &ord)?;
    emit_tail(&mut em, &g, shape, &placed, blk);
    Ok(Lowered {
        queues: g.queues,
        events: em.events,
        cmds: em.cmds,
        staging,
        send_bytes: placed.send_bytes,
        recv_bytes: shape.total * es,
        scratch_bytes,
        temp_bytes: placed.temp_bytes,
        staged_for_order: ord.staged_for_order,
    })
}

/// The steps of a lowering as nodes: one per step of every rank, on one queue per stream
/// of each rank (a rank without streams still gets one, its first).
struct Graph<'a> {
    entries: &'a [Entry],
    queues: Vec<Queue>,
    /// Per rank: its first queue.
    first_queue: Vec<u32>,
    nodes: Vec<Node>,
    /// The node of (rank, stream, step).
    node_of: Vec<Vec<Vec<NodeId>>>,
}

impl<'a> Graph<'a> {
    fn new(entries: &'a [Entry]) -> Graph<'a> {
        let n = entries.len();
        let mut queues = Vec::new();
        let mut first_queue = Vec::with_capacity(n);
        let mut nodes: Vec<Node> = Vec::new();
        // node index of (rank, stream, step)
        let mut node_of: Vec<Vec<Vec<NodeId>>> = Vec::with_capacity(n);
        for (r, e) in entries.iter().enumerate() {
            first_queue.push(queues.len() as u32);
            let mut per_stream = Vec::new();
            for (s, steps) in e.program.streams.iter().enumerate() {
                let q = queues.len() as u32;
                queues.push(Queue {
                    rank: r as u32,
                    stream: s as u32,
                });
                let mut ids = Vec::with_capacity(steps.len());
                for t in 0..steps.len() {
                    ids.push(nodes.len());
                    nodes.push(Node {
                        rank: r as u32,
                        queue: q,
                        stream: s as u32,
                        step: t as u32,
                    });
                }
                per_stream.push(ids);
            }
            if e.program.streams.is_empty() {
                queues.push(Queue {
                    rank: r as u32,
                    stream: 0,
                });
            }
            node_of.push(per_stream);
        }
        Graph {
            entries,
            queues,
            first_queue,
            nodes,
            node_of,
        }
    }

    /// The step node `id` stands for.
    fn instr(&self, id: NodeId) -> &'a Instr {
        let nd = &self.nodes[id];
        &self.entries[nd.rank as usize].program.streams[nd.stream as usize][nd.step as usize]
    }
}

/// Where each rank's Input and Output live for a call of `shape` on a schedule whose
/// placement is `scheduled_in_place` (an in-place call on an out-of-place schedule and vice
/// versa), with the copies before (prologue) and after (epilogue) the schedule that this
/// takes, and the temporary and send buffers it needs.
struct Placed {
    bases: Vec<Bases>,
    /// Per rank: (destination, source) copies before the schedule.
    prologue: Vec<Vec<(Span, Span)>>,
    /// Per rank: (destination, source) copies after it.
    epilogue: Vec<Vec<(Span, Span)>>,
    temp_bytes: usize,
    send_bytes: usize,
}

/// [`Placed`] for `entries` (`n` ranks, blocks of `blk` elements of `es` bytes).
fn place_buffers(entries: &[Entry], shape: &CallShape, blk: usize) -> Placed {
    let n = entries.len() as u32;
    let es = shape.esize;
    let kind = shape.collective.kind();
    let (in_elems, _) = shape.extents(n);
    let total_bytes = shape.total * es;
    let scheduled_in_place = entries.first().is_some_and(|e| e.in_place);
    let writes_input = entries.iter().any(|e| e.program.writes_input);
    let mut temp_bytes = 0usize;
    let mut send_bytes = 0usize;
    let mut prologue: Vec<Vec<(Span, Span)>> = vec![Vec::new(); n as usize];
    let mut epilogue: Vec<Vec<(Span, Span)>> = vec![Vec::new(); n as usize];
    let mut bases = Vec::with_capacity(n as usize);
    for r in 0..n {
        let r_off = r as usize * blk * es;
        let recv = Mem::Recv(r);
        let send = Mem::Send(r);
        let temp = Mem::Temp(r);
        let sp = |mem, off, len| Span { mem, off, len };
        let b = match (shape.in_place, scheduled_in_place) {
            (false, false) => {
                send_bytes = in_elems * es;
                if writes_input {
                    temp_bytes = temp_bytes.max(in_elems * es);
                    prologue[r as usize]
                        .push((sp(temp, 0, in_elems * es), sp(send, 0, in_elems * es)));
                    Bases {
                        input: (temp, 0),
                        output: (recv, 0),
                    }
                } else {
                    Bases {
                        input: (send, 0),
                        output: (recv, 0),
                    }
                }
            }
            (true, true) => match kind {
                CollectiveKind::AllGather => Bases {
                    input: (recv, r_off),
                    output: (recv, 0),
                },
                CollectiveKind::ReduceScatter => Bases {
                    input: (recv, 0),
                    output: (recv, r_off),
                },
                _ => Bases {
                    input: (recv, 0),
                    output: (recv, 0),
                },
            },
            (false, true) => {
                send_bytes = in_elems * es;
                match kind {
                    CollectiveKind::AllGather => {
                        prologue[r as usize]
                            .push((sp(recv, r_off, blk * es), sp(send, 0, blk * es)));
                        Bases {
                            input: (recv, r_off),
                            output: (recv, 0),
                        }
                    }
                    CollectiveKind::ReduceScatter => {
                        temp_bytes = temp_bytes.max(total_bytes);
                        prologue[r as usize]
                            .push((sp(temp, 0, total_bytes), sp(send, 0, total_bytes)));
                        epilogue[r as usize]
                            .push((sp(recv, 0, blk * es), sp(temp, r_off, blk * es)));
                        Bases {
                            input: (temp, 0),
                            output: (temp, r_off),
                        }
                    }
                    _ => {
                        prologue[r as usize]
                            .push((sp(recv, 0, total_bytes), sp(send, 0, total_bytes)));
                        Bases {
                            input: (recv, 0),
                            output: (recv, 0),
                        }
                    }
                }
            }
            (true, false) => match kind {
                CollectiveKind::AllGather => {
                    temp_bytes = temp_bytes.max(blk * es);
                    prologue[r as usize].push((sp(temp, 0, blk * es), sp(recv, r_off, blk * es)));
                    Bases {
                        input: (temp, 0),
                        output: (recv, 0),
                    }
                }
                CollectiveKind::ReduceScatter => {
                    temp_bytes = temp_bytes.max(total_bytes);
                    prologue[r as usize].push((sp(temp, 0, total_bytes), sp(recv, 0, total_bytes)));
                    Bases {
                        input: (temp, 0),
                        output: (recv, r_off),
                    }
                }
                _ => {
                    temp_bytes = temp_bytes.max(total_bytes);
                    prologue[r as usize].push((sp(temp, 0, total_bytes), sp(recv, 0, total_bytes)));
                    Bases {
                        input: (temp, 0),
                        output: (recv, 0),
                    }
                }
            },
        };
        bases.push(b);
    }

    Placed {
        bases,
        prologue,
        epilogue,
        temp_bytes,
        send_bytes,
    }
}

/// Pairs every receiving node with the sending node whose message it receives (the k-th
/// receive of a connection meets its k-th send): per node, the sender of its incoming
/// message and the receiver of its outgoing one.
#[allow(clippy::type_complexity)]
fn pair_messages(g: &Graph) -> Result<(Vec<Option<NodeId>>, Vec<Option<NodeId>>), CudaError> {
    let (nodes, instr) = (&g.nodes, |id| g.instr(id));
    // Connection index (one per (from, to, channel)) -> FIFO of sender nodes, then matched by
    // receivers in stream order.
    let mut sends: BTreeMap<u32, VecDeque<NodeId>> = BTreeMap::new();
    for id in 0..nodes.len() {
        let ins = instr(id);
        if matches!(
            ins.kind,
            Kind::Send | Kind::RecvCopySend | Kind::RecvReduceCopySend | Kind::RecvReduceSend
        ) {
            sends.entry(ins.sconn).or_default().push_back(id);
        }
    }
    // incoming message of each receiving node: the sender node.
    let mut incoming: Vec<Option<NodeId>> = vec![None; nodes.len()];
    // receiver of each sending node.
    let mut outgoing: Vec<Option<NodeId>> = vec![None; nodes.len()];
    // Visit receivers in stream order so the k-th receive meets the k-th send.
    for (id, nd) in nodes.iter().enumerate() {
        let ins = instr(id);
        if matches!(
            ins.kind,
            Kind::Recv
                | Kind::RecvReduceCopy
                | Kind::RecvReduceSend
                | Kind::RecvReduceCopySend
                | Kind::RecvCopySend
        ) {
            let s = sends
                .get_mut(&ins.rconn)
                .and_then(|q| q.pop_front())
                .ok_or_else(|| {
                    bad_step(
                        nd,
                        "receives a message that no step of the peer sends".into(),
                    )
                })?;
            if instr(s).count != ins.count {
                return Err(bad_step(
                    nd,
                    format!(
                        "receives {} chunks but the matching send carries {}",
                        ins.count,
                        instr(s).count
                    ),
                ));
            }
            incoming[id] = Some(s);
            outgoing[s] = Some(id);
        }
    }
    if let Some(&s) = sends.values().find_map(|q| q.front()) {
        return Err(bad_step(
            &nodes[s],
            format!(
                "sends a message to rank {} that it never receives",
                instr(s).send_peer
            ),
        ));
    }

    Ok((incoming, outgoing))
}

/// The order nodes are issued in and what each waits for, and which messages the sender
/// stages (copies to a staging area of the receiver's).
struct Ordered {
    order: Vec<NodeId>,
    /// Per node: the nodes it waits for (stream order, dependencies, messages, and
    /// write-after-read for direct messages).
    all_preds: Vec<Vec<NodeId>>,
    staged: Vec<bool>,
    /// Messages staged only because reading them directly would order steps in a cycle.
    staged_for_order: usize,
}

/// [`Ordered`] for the nodes of `g`: base edges (stream order, dependencies, messages);
/// messages across devices without peer access staged; write-after-read edges for messages
/// read directly from the sender's memory (or, when those close a cycle, those messages
/// staged too).
fn order_nodes(
    g: &Graph,
    geo: &Geo,
    bases: &[Bases],
    (incoming, outgoing): (&[Option<NodeId>], &[Option<NodeId>]),
    place: &dyn Placement,
) -> Result<Ordered, CudaError> {
    let n = g.entries.len() as u32;
    let (entries, nodes, node_of, instr) = (g.entries, &g.nodes, &g.node_of, |id| g.instr(id));
    let mut preds: Vec<Vec<NodeId>> = vec![Vec::new(); nodes.len()];
    for (id, nd) in nodes.iter().enumerate() {
        if nd.step > 0 {
            preds[id].push(id - 1);
        }
        let ins = instr(id);
        let prog = &entries[nd.rank as usize].program;
        for &(ds, dt) in &prog.deps[ins.deps.0 as usize..ins.deps.1 as usize] {
            preds[id].push(node_of[nd.rank as usize][ds as usize][dt as usize]);
        }
        if let Some(s) = incoming[id] {
            preds[id].push(s);
        }
    }

    // Spans written by a node (for write-after-read analysis).
    let writes = |id: NodeId| -> Vec<Span> {
        let ins = instr(id);
        let nd = &nodes[id];
        let b = &bases[nd.rank as usize];
        match ins.kind {
            Kind::Recv
            | Kind::RecvReduceCopy
            | Kind::RecvReduceCopySend
            | Kind::RecvCopySend
            | Kind::Copy
            | Kind::Reduce => (0..ins.count)
                .map(|i| span_of(geo, b, nd.rank, ins.dst, i))
                .collect(),
            _ => Vec::new(),
        }
    };
    // Spans a message is read from when read directly (None: the sender makes its own copy).
    let direct_src = |id: NodeId| -> Option<Vec<Span>> {
        let ins = instr(id);
        let nd = &nodes[id];
        let b = &bases[nd.rank as usize];
        let loc = match ins.kind {
            Kind::Send => ins.src,
            Kind::RecvCopySend | Kind::RecvReduceCopySend => ins.dst,
            _ => return None,
        };
        Some(
            (0..ins.count)
                .map(|i| span_of(geo, b, nd.rank, loc, i))
                .collect(),
        )
    };

    // Which messages are staged by the sender: cross-device without peer access.
    let mut staged: Vec<bool> = vec![false; nodes.len()];
    for (s, recv) in outgoing.iter().enumerate() {
        if let Some(v) = *recv
            && !place.direct(nodes[v].rank, nodes[s].rank)
        {
            staged[s] = true;
        }
    }

    // Write-after-read edges for direct messages.
    let by_rank: Vec<Vec<NodeId>> = (0..n)
        .map(|r| (0..nodes.len()).filter(|&i| nodes[i].rank == r).collect())
        .collect();
    let mut war: Vec<(NodeId, NodeId, NodeId)> = Vec::new(); // (sender, reader, writer)
    {
        let succs = successors(&preds);
        for (s, recv) in outgoing.iter().enumerate() {
            let Some(v) = *recv else { continue };
            if staged[s] {
                continue;
            }
            let Some(src) = direct_src(s) else { continue };
            let reach = reachable(&succs, s);
            for &w in &by_rank[nodes[s].rank as usize] {
                if w == s || !reach[w] {
                    continue;
                }
                if writes(w)
                    .iter()
                    .any(|ws| src.iter().any(|x| x.overlaps(ws)))
                {
                    war.push((s, v, w));
                }
            }
        }
    }
    let mut staged_for_order = 0;
    let order = {
        let mut with_war = preds.clone();
        for &(_, v, w) in &war {
            with_war[w].push(v);
        }
        match topo(&with_war) {
            Some(o) => o,
            None => {
                for &(s, _, _) in &war {
                    if !staged[s] {
                        staged[s] = true;
                        staged_for_order += 1;
                    }
                }
                topo(&preds).ok_or_else(|| {
                    CudaError::Invalid(
                        "the plan entry's steps wait on each other in a cycle".into(),
                    )
                })?
            }
        }
    };
    let mut all_preds = preds;
    for &(s, v, w) in &war {
        if !staged[s] {
            all_preds[w].push(v);
        }
    }

    Ok(Ordered {
        order,
        all_preds,
        staged,
        staged_for_order,
    })
}

/// What emission produces besides the commands: the staging areas (owner rank, bytes) and
/// each rank's scratch bytes.
struct Emitted {
    em: Emitter,
    staging: Vec<(u32, usize)>,
    scratch_bytes: Vec<usize>,
}

/// Emits the commands: the prologue copies on each rank's first queue (its other queues
/// waiting for them), then every node in `ord.order`, after waits for its predecessors on
/// other queues, with the copies and reductions of its step and the staging of its
/// outgoing message.
fn emit(
    g: &Graph,
    geo: &Geo,
    placed: &Placed,
    (incoming, outgoing): (&[Option<NodeId>], &[Option<NodeId>]),
    ord: &Ordered,
) -> Result<Emitted, CudaError> {
    let n = g.entries.len() as u32;
    let es = geo.esize;
    let (entries, nodes, queues, first_queue, instr) =
        (g.entries, &g.nodes, &g.queues, &g.first_queue, |id| {
            g.instr(id)
        });
    let (bases, prologue) = (&placed.bases, &placed.prologue);
    let Ordered {
        order,
        all_preds,
        staged,
        ..
    } = ord;
    let mut em = Emitter {
        cmds: Vec::new(),
        events: 0,
        queue_len: vec![0; queues.len()],
        waited: vec![BTreeMap::new(); queues.len()],
    };
    // Start: prologue copies on each rank's first queue, then its other queues wait.
    for r in 0..n as usize {
        let q0 = first_queue[r];
        for &(dst, src) in &prologue[r] {
            em.copy(q0, dst, src);
        }
        let nq = entries[r].program.streams.len().max(1) as u32;
        if !prologue[r].is_empty() && nq > 1 {
            let e = em.record(q0);
            for q in q0 + 1..q0 + nq {
                em.wait(q, e, q0, u32::MAX);
            }
        }
    }
    let mut node_event: Vec<Option<(u32, u32)>> = vec![None; nodes.len()]; // (event, pos)
    let needs_event = {
        let mut v = vec![false; nodes.len()];
        for (id, ps) in all_preds.iter().enumerate() {
            for &p in ps {
                if nodes[p].queue != nodes[id].queue {
                    v[p] = true;
                }
            }
        }
        v
    };
    let mut msg: Vec<Option<Vec<Span>>> = vec![None; nodes.len()];
    let mut staging: Vec<(u32, usize)> = Vec::new();
    let mut scratch_bytes = vec![0usize; n as usize];
    for (r, e) in entries.iter().enumerate() {
        scratch_bytes[r] = e.program.scratch_chunks as usize * geo.maxc * es;
    }
    for &id in order {
        let nd = &nodes[id];
        let q = nd.queue;
        for &p in &all_preds[id] {
            if nodes[p].queue != q {
                let (ev, pos) = node_event[p].ok_or_else(|| {
                    CudaError::Internal("a producer was issued after its consumer".into())
                })?;
                em.wait(q, ev, nodes[p].queue, pos);
            }
        }
        let ins = instr(id);
        let b = &bases[nd.rank as usize];
        let span = |loc: Loc, i: u32| span_of(geo, b, nd.rank, loc, i);
        let message = incoming[id].map(|s| msg[s].clone().unwrap_or_default());
        let produced = emit_step(&mut em, q, ins, &span, message, &mut staging, geo, nd.rank);
        // The message this node sends, if any.
        if let Some(v) = outgoing[id] {
            let mut spans = match ins.kind {
                Kind::Send => (0..ins.count).map(|i| span(ins.src, i)).collect(),
                _ => produced.unwrap_or_default(),
            };
            if staged[id] {
                let owner = nodes[v].rank;
                let area = Mem::Staging(staging.len() as u32);
                let total: usize = spans.iter().map(|s| s.len).sum();
                staging.push((owner, total.max(1)));
                let mut off = 0;
                let mut copies = Vec::with_capacity(spans.len());
                for s in &spans {
                    let d = Span {
                        mem: area,
                        off,
                        len: s.len,
                    };
                    em.copy(q, d, *s);
                    copies.push(d);
                    off += s.len;
                }
                spans = copies;
            }
            msg[id] = Some(spans);
        }
        if needs_event[id] {
            let ev = em.record(q);
            node_event[id] = Some((ev, em.queue_len[q as usize]));
        }
    }

    Ok(Emitted {
        em,
        staging,
        scratch_bytes,
    })
}

/// Emits the copies and reductions of step `ins` on queue `q` (`span`: its operands'
/// spans, `message`: the spans of its incoming message); what it produces for a message it
/// sends on (its destination, or a staging area of rank `rank`'s for a reduction that is
/// only sent).
#[allow(clippy::too_many_arguments)]
fn emit_step(
    em: &mut Emitter,
    q: u32,
    ins: &Instr,
    span: &impl Fn(Loc, u32) -> Span,
    message: Option<Vec<Span>>,
    staging: &mut Vec<(u32, usize)>,
    geo: &Geo,
    rank: u32,
) -> Option<Vec<Span>> {
    let es = geo.esize;
    match ins.kind {
        Kind::Nop | Kind::Send => None,
        Kind::Copy => {
            for i in 0..ins.count {
                let (s, d) = (span(ins.src, i), span(ins.dst, i));
                let len = s.len.min(d.len);
                em.copy(q, d.with_len(len), s.with_len(len));
            }
            None
        }
        Kind::Reduce => {
            for i in 0..ins.count {
                let (s, d) = (span(ins.src, i), span(ins.dst, i));
                let len = s.len.min(d.len);
                em.reduce(q, d.with_len(len), d.with_len(len), s.with_len(len));
            }
            None
        }
        Kind::Recv | Kind::RecvCopySend => {
            let m = message.unwrap_or_default();
            let mut out = Vec::new();
            for i in 0..ins.count {
                let d = span(ins.dst, i);
                let len = m.get(i as usize).map_or(0, |x| x.len).min(d.len);
                if let Some(x) = m.get(i as usize) {
                    em.copy(q, d.with_len(len), x.with_len(len));
                }
                out.push(d.with_len(len));
            }
            Some(out)
        }
        Kind::RecvReduceCopy | Kind::RecvReduceCopySend => {
            let m = message.unwrap_or_default();
            let mut out = Vec::new();
            for i in 0..ins.count {
                let (s, d) = (span(ins.src, i), span(ins.dst, i));
                let len = m.get(i as usize).map_or(0, |x| x.len).min(d.len).min(s.len);
                if let Some(x) = m.get(i as usize) {
                    em.reduce(q, d.with_len(len), x.with_len(len), s.with_len(len));
                }
                out.push(d.with_len(len));
            }
            Some(out)
        }
        Kind::RecvReduceSend => {
            let m = message.unwrap_or_default();
            let chunk = geo.maxc * es;
            let area = Mem::Staging(staging.len() as u32);
            staging.push((rank, (ins.count as usize * chunk).max(1)));
            let mut out = Vec::new();
            for i in 0..ins.count {
                let s = span(ins.src, i);
                let len = m.get(i as usize).map_or(0, |x| x.len).min(s.len);
                let d = Span {
                    mem: area,
                    off: i as usize * chunk,
                    len,
                };
                if let Some(x) = m.get(i as usize) {
                    em.reduce(q, d, x.with_len(len), s.with_len(len));
                }
                out.push(d);
            }
            Some(out)
        }
    }
}

/// Emits the end of the call: the epilogue copies and the `avg` division, on each rank's
/// first queue once every queue is done (other ranks may still read this rank's output
/// directly).
fn emit_tail(em: &mut Emitter, g: &Graph, shape: &CallShape, placed: &Placed, blk: usize) {
    let n = g.entries.len() as u32;
    let es = shape.esize;
    let kind = shape.collective.kind();
    let total_bytes = shape.total * es;
    let (queues, first_queue) = (&g.queues, &g.first_queue);
    let (bases, epilogue) = (&placed.bases, &placed.epilogue);
    let divide = shape.op == ReduceOp::Avg && kind.reduces();
    let has_tail = divide || epilogue.iter().any(|e| !e.is_empty());
    if has_tail {
        // Every queue records; every rank's first queue waits on all of them, because other
        // ranks may still read this rank's output directly.
        let ends: Vec<(u32, u32)> = (0..queues.len() as u32)
            .map(|q| (q, em.record(q)))
            .collect();
        for r in 0..n as usize {
            let tail_needed = divide || !epilogue[r].is_empty();
            if !tail_needed {
                continue;
            }
            let q0 = first_queue[r];
            for &(q, ev) in &ends {
                if q != q0 {
                    em.wait(q0, ev, q, u32::MAX);
                }
            }
            for &(dst, src) in &epilogue[r] {
                em.copy(q0, dst, src);
            }
            if divide {
                let (mem, off) = if !epilogue[r].is_empty() {
                    (Mem::Recv(r as u32), 0)
                } else {
                    bases[r].output
                };
                let len = match shape.collective {
                    Collective::AllReduce => total_bytes,
                    Collective::ReduceScatter => blk * es,
                    Collective::Reduce { root } if root == r as u32 => total_bytes,
                    _ => 0,
                };
                if len > 0 {
                    em.cmds.push(Cmd::Divide {
                        queue: q0,
                        span: Span { mem, off, len },
                    });
                }
            }
        }
    }
}

fn bad_step(nd: &Node, message: String) -> CudaError {
    CudaError::Invalid(format!(
        "rank {} stream {} step {}: {message}",
        nd.rank, nd.stream, nd.step
    ))
}

fn successors(preds: &[Vec<NodeId>]) -> Vec<Vec<NodeId>> {
    let mut succs = vec![Vec::new(); preds.len()];
    for (v, ps) in preds.iter().enumerate() {
        for &p in ps {
            succs[p].push(v);
        }
    }
    succs
}

fn reachable(succs: &[Vec<NodeId>], from: NodeId) -> Vec<bool> {
    let mut seen = vec![false; succs.len()];
    let mut stack = vec![from];
    seen[from] = true;
    while let Some(u) = stack.pop() {
        for &v in &succs[u] {
            if !seen[v] {
                seen[v] = true;
                stack.push(v);
            }
        }
    }
    seen
}

/// Kahn's algorithm, smallest ready node first (deterministic); `None` on a cycle.
fn topo(preds: &[Vec<NodeId>]) -> Option<Vec<NodeId>> {
    let succs = successors(preds);
    let mut indeg: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: std::collections::BTreeSet<NodeId> =
        (0..preds.len()).filter(|&v| indeg[v] == 0).collect();
    let mut order = Vec::with_capacity(preds.len());
    while let Some(u) = ready.pop_first() {
        order.push(u);
        for &v in &succs[u] {
            indeg[v] -= 1;
            if indeg[v] == 0 {
                ready.insert(v);
            }
        }
    }
    (order.len() == preds.len()).then_some(order)
}

#[cfg(test)]
mod tests;
