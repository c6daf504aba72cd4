//! The structural layer: header fields, bounds, peers, dependencies, connection ownership and
//! send/receive matching. Builds the [`Layout`] the simulation runs on.

use super::{ErrorKind, Sink, VerifyError};
use crate::dag::{ConnKey, DagError, StepDag, StepNumbering};
use crate::schedule::{Buf, Loc, Schedule, Step, StepRef};
use rustc_hash::FxHashMap;

/// Most buffer slots (chunks of input, output and the used part of scratch over all ranks)
/// the verifier will model; larger schedules are refused with [`ErrorKind::Limit`] rather
/// than exhausting memory. A slot costs 8 bytes (its symbolic value), plus 8 bytes of
/// access history on ranks with several streams (the race check), plus 4 bytes for the
/// last writer of output slots on ranks with one stream: at most 2 GiB at this limit.
pub const MAX_SLOTS: u64 = 1 << 27;

/// Most 64-bit words the distinct contributor sets (bitsets of `nranks` bits) still referred
/// to by buffer slots or messages may take (512 MiB); a run that needs more stops with
/// [`ErrorKind::Limit`]. Sets are shared between all values holding them, so real schedules
/// stay far below (a few thousand distinct sets).
pub const MAX_SET_WORDS: u64 = 1 << 26;

/// Most chunk-steps (sum of step counts and dependencies) the verifier will simulate.
pub const MAX_WORK: u64 = 1 << 31;

/// Most vector-clock entries the race check may keep: per rank, its streams times (its
/// streams plus its dependencies).
pub const MAX_CLOCKS: u64 = 1 << 27;

/// One connection with the streams at its ends (global stream indices).
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// `(from, to, channel)`; in a quotient run, the template's sending end.
    pub key: ConnKey,
    /// The rank the receiving stream names as its peer: `key.0`, except in a quotient run,
    /// where the template receives the translate of its own send from another peer.
    pub recv_from: u32,
    pub sender: usize,
    pub receiver: usize,
}

/// Flattened indices of a structurally valid schedule.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// How the schedule's streams and steps are numbered (in a quotient run, those of the
    /// schedule holding only the template).
    pub streams: StepNumbering,
    pub conns: Vec<ConnInfo>,
    pub conn_index: FxHashMap<ConnKey, u32>,
}

/// Reports a schedule whose steps a [`StepDag`] cannot number.
pub(crate) fn too_large(e: DagError, sink: &mut Sink) {
    sink.push(VerifyError {
        at: None,
        channel: None,
        kind: ErrorKind::Limit,
        message: e.to_string(),
    });
}

fn at(rank: u32, stream: u32, step: usize, channel: u32) -> (Option<StepRef>, Option<u32>) {
    (
        Some(StepRef {
            rank,
            stream,
            step: step as u32,
        }),
        Some(channel),
    )
}

pub(crate) fn step_error(
    sink: &mut Sink,
    (rank, stream, step, channel): (u32, u32, usize, u32),
    kind: ErrorKind,
    message: String,
) {
    let (at, channel) = at(rank, stream, step, channel);
    sink.push(VerifyError {
        at,
        channel,
        kind,
        message,
    });
}

/// Checks the header; on success the per-step checks can trust the extents.
pub(crate) fn check_header(s: &Schedule, sink: &mut Sink) {
    let mut header = |message: String| {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Header,
            message,
        })
    };
    if s.nranks == 0 {
        header("nranks is 0".to_string());
    }
    if s.ranks.len() as u64 != u64::from(s.nranks) {
        header(format!(
            "nranks is {} but the schedule has {} rank programs",
            s.nranks,
            s.ranks.len()
        ));
    }
    if s.chunks == 0 {
        header("chunks is 0".to_string());
    }
    if let Some(root) = s.collective.root()
        && root >= s.nranks
    {
        header(format!(
            "root {root} is not a rank (nranks is {})",
            s.nranks
        ));
    }
    match s.collective.buffer_chunks(s.nranks, s.chunks) {
        None => header(format!(
            "{} over {} ranks needs chunks to be a multiple of nranks, got {}",
            s.collective.kind(),
            s.nranks,
            s.chunks
        )),
        Some((input, output)) => {
            if (input, output) != (s.input_chunks, s.output_chunks) {
                header(format!(
                    "{} with {} chunks over {} ranks has input_chunks {input} and output_chunks {output}, but the schedule says {} and {}",
                    s.collective.kind(),
                    s.chunks,
                    s.nranks,
                    s.input_chunks,
                    s.output_chunks
                ));
            }
        }
    }
}

/// The part of the scratch buffer any step addresses (at most its declared extent).
pub(crate) fn scratch_used(prog: &crate::schedule::RankProgram) -> u32 {
    let used = prog
        .streams
        .iter()
        .flat_map(|st| &st.steps)
        .flat_map(|st| {
            [st.op.src(), st.op.dst()]
                .into_iter()
                .flatten()
                .filter(|l| l.buf == Buf::Scratch)
                .map(|l| u64::from(l.off) + u64::from(st.count))
        })
        .max()
        .unwrap_or(0);
    used.min(u64::from(prog.scratch_chunks)) as u32
}

/// Refuses schedules too large to model.
/// `only`: count only that rank (a quotient run models one rank's buffers and program).
pub(crate) fn check_limits(s: &Schedule, only: Option<u32>, sink: &mut Sink) {
    let modelled = |r: &usize| only.is_none_or(|o| o as usize == *r);
    let slots: u64 = s
        .ranks
        .iter()
        .enumerate()
        .filter(|(r, _)| modelled(r))
        .map(|(_, r)| r)
        .map(|r| {
            u64::from(s.input_chunks) + u64::from(s.output_chunks) + u64::from(scratch_used(r))
        })
        .sum();
    let work: u64 = s
        .ranks
        .iter()
        .flat_map(|r| &r.streams)
        .flat_map(|st| &st.steps)
        .map(|st| u64::from(st.count).max(1) + st.deps.len() as u64)
        .sum();
    let clocks: u64 = s
        .ranks
        .iter()
        .map(|r| {
            let streams = r.streams.len() as u64;
            let deps: u64 = r
                .streams
                .iter()
                .flat_map(|st| &st.steps)
                .map(|st| st.deps.len() as u64)
                .sum();
            if streams > 1 {
                streams * (streams + deps)
            } else {
                0
            }
        })
        .sum();
    if clocks > MAX_CLOCKS {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Limit,
            message: format!(
                "the race check would keep {clocks} clock entries (streams per rank times streams and dependencies), more than the verifier allows ({MAX_CLOCKS})"
            ),
        });
    }
    if slots > MAX_SLOTS {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Limit,
            message: format!(
                "the buffers hold {slots} chunks over all ranks, more than the verifier models ({MAX_SLOTS})"
            ),
        });
    }
    if work > MAX_WORK {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Limit,
            message: format!(
                "the steps address {work} chunks in total, more than the verifier simulates ({MAX_WORK})"
            ),
        });
    }
}

fn check_loc(s: &Schedule, rank: u32, what: &str, loc: Loc, count: u32) -> Result<(), String> {
    let len = s.buffer_len(rank, loc.buf);
    let end = u64::from(loc.off) + u64::from(count);
    if end > u64::from(len) {
        let name = match loc.buf {
            Buf::Input => "input",
            Buf::Output => "output",
            Buf::Scratch => "scratch",
        };
        return Err(format!(
            "{what} {loc} with count {count} ends at chunk {end}, past the {name} buffer of {len} chunks"
        ));
    }
    Ok(())
}

fn check_step(s: &Schedule, rank: u32, stream: u32, idx: usize, step: &Step, sink: &mut Sink) {
    let prog = &s.ranks[rank as usize];
    let channel = prog.streams[stream as usize].channel;
    let place = (rank, stream, idx, channel);
    let op = step.op;
    if step.count == 0 && op != crate::schedule::Op::Nop {
        step_error(
            sink,
            place,
            ErrorKind::Bounds,
            format!("{} with count 0", op.mnemonic()),
        );
    }
    for (what, loc) in [("source", op.src()), ("destination", op.dst())] {
        if let Some(loc) = loc
            && let Err(message) = check_loc(s, rank, what, loc, step.count)
        {
            step_error(sink, place, ErrorKind::Bounds, message);
        }
    }
    for (what, peer) in [
        ("receives from", op.recv_peer()),
        ("sends to", op.send_peer()),
    ] {
        if let Some(peer) = peer {
            if peer >= s.nranks {
                step_error(
                    sink,
                    place,
                    ErrorKind::Peer,
                    format!(
                        "{what} rank {peer}, which does not exist (nranks is {})",
                        s.nranks
                    ),
                );
            } else if peer == rank {
                step_error(
                    sink,
                    place,
                    ErrorKind::Peer,
                    format!("{what} its own rank {peer}"),
                );
            }
        }
    }
    for dep in &step.deps {
        let target = prog.streams.get(dep.stream as usize);
        let message = match target {
            None => Some(format!(
                "depends on stream {} step {}, but rank {rank} has {} streams",
                dep.stream,
                dep.step,
                prog.streams.len()
            )),
            Some(_) if dep.stream == stream => Some(format!(
                "depends on step {} of its own stream (program order already orders a stream)",
                dep.step
            )),
            Some(t) if dep.step as usize >= t.steps.len() => Some(format!(
                "depends on stream {} step {}, but that stream has {} steps",
                dep.stream,
                dep.step,
                t.steps.len()
            )),
            Some(_) => None,
        };
        if let Some(message) = message {
            step_error(sink, place, ErrorKind::Dependency, message);
        }
    }
}

/// The per-step checks of one rank's program and its connection ownership (one stream per
/// connection direction); the header must have passed.
pub(crate) fn check_rank_program(s: &Schedule, rank: u32, sink: &mut Sink) {
    let prog = &s.ranks[rank as usize];
    let mut owner: FxHashMap<(u32, u32, u32), u32> = FxHashMap::default();
    for (si, st) in prog.streams.iter().enumerate() {
        for (idx, step) in st.steps.iter().enumerate() {
            check_step(s, rank, si as u32, idx, step, sink);
            let ends = [
                (step.op.send_peer().map(|to| (rank, to)), "sends to"),
                (
                    step.op.recv_peer().map(|from| (from, rank)),
                    "receives from",
                ),
            ];
            for (key, verb) in ends {
                let Some((from, to)) = key else { continue };
                let peer = if from == rank { to } else { from };
                if peer >= s.nranks || peer == rank {
                    continue;
                }
                let first = *owner.entry((from, to, st.channel)).or_insert(si as u32);
                if first != si as u32 {
                    step_error(
                        sink,
                        (rank, si as u32, idx, st.channel),
                        ErrorKind::Connection,
                        format!(
                            "{verb} rank {peer} on channel {}, but stream {first} of this rank already does (one stream per connection direction)",
                            st.channel
                        ),
                    );
                }
            }
        }
    }
}

/// Per-connection list of (global stream, step index, count) in program order.
pub(crate) type Ends = Vec<(usize, usize, u32)>;

/// Runs every structural check after the header passed; returns the layout when clean.
pub(crate) fn check_structure(s: &Schedule, sink: &mut Sink) -> Option<Layout> {
    let before = sink.total();
    // Per-step checks.
    for (rank, prog) in s.ranks.iter().enumerate() {
        for (si, st) in prog.streams.iter().enumerate() {
            for (idx, step) in st.steps.iter().enumerate() {
                check_step(s, rank as u32, si as u32, idx, step, sink);
            }
        }
    }
    // Without its bad references, which the per-step checks report.
    let dag = StepDag::lenient(s).map_err(|e| too_large(e, sink)).ok()?;

    // Connection ownership and the ends of each connection.
    let nconns = dag.connections().len();
    let mut sends: Vec<Ends> = vec![Vec::new(); nconns];
    let mut recvs: Vec<Ends> = vec![Vec::new(); nconns];
    let mut sender_of: Vec<Option<usize>> = vec![None; nconns];
    let mut receiver_of: Vec<Option<usize>> = vec![None; nconns];
    for (rank, prog) in s.ranks.iter().enumerate() {
        let rank = rank as u32;
        for (si, st) in prog.streams.iter().enumerate() {
            let gs = dag.numbering().stream_base(rank) + si;
            for (idx, step) in st.steps.iter().enumerate() {
                let place = (rank, si as u32, idx, st.channel);
                let id = dag.numbering().step_base(gs) + idx;
                for (end, is_send) in [(dag.send_at(id), true), (dag.recv_at(id), false)] {
                    let Some((ci, _)) = end else { continue };
                    let ci = ci as usize;
                    let (from, to, _) = dag.connections()[ci].key;
                    let peer = if is_send { to } else { from };
                    let (owner, list) = if is_send {
                        (&mut sender_of[ci], &mut sends[ci])
                    } else {
                        (&mut receiver_of[ci], &mut recvs[ci])
                    };
                    match *owner {
                        Some(o) if o != gs => {
                            let other = dag.numbering().stream_owner(o).1;
                            let verb = if is_send { "sends to" } else { "receives from" };
                            step_error(
                                sink,
                                place,
                                ErrorKind::Connection,
                                format!(
                                    "{verb} rank {peer} on channel {}, but stream {other} of this rank already does (one stream per connection direction)",
                                    st.channel
                                ),
                            );
                            continue;
                        }
                        _ => *owner = Some(gs),
                    }
                    list.push((gs, idx, step.count));
                }
            }
        }
    }

    let conns = dag
        .connections()
        .iter()
        .map(|c| ConnInfo {
            key: c.key,
            recv_from: c.key.0,
            sender: usize::MAX,
            receiver: usize::MAX,
        })
        .collect();
    let conn_index = dag
        .connections()
        .iter()
        .enumerate()
        .map(|(i, c)| (c.key, i as u32))
        .collect();
    let mut layout = Layout {
        streams: dag.numbering().clone(),
        conns,
        conn_index,
    };
    match_ends(&mut layout, &sends, &recvs, &sender_of, &receiver_of, sink);
    (sink.total() == before).then_some(layout)
}

/// Matching: on every connection the k-th send pairs with the k-th receive, with equal
/// counts; records each connection's sending and receiving stream.
pub(crate) fn match_ends(
    layout: &mut Layout,
    sends: &[Ends],
    recvs: &[Ends],
    sender_of: &[Option<usize>],
    receiver_of: &[Option<usize>],
    sink: &mut Sink,
) {
    for (ci, conn) in layout.conns.iter_mut().enumerate() {
        let (_, to, channel) = conn.key;
        let from = conn.recv_from;
        let (ss, rs) = (&sends[ci], &recvs[ci]);
        let place = |&(gs, idx, _): &(usize, usize, u32)| {
            let (r, st) = layout.streams.stream_owner(gs);
            (r, st, idx, channel)
        };
        let name = |&(gs, idx, _): &(usize, usize, u32)| {
            let (r, st) = layout.streams.stream_owner(gs);
            format!("rank {r} stream {st} step {idx}")
        };
        if let Some(k) = ss.iter().zip(rs).position(|(a, b)| a.2 != b.2) {
            step_error(
                sink,
                place(&rs[k]),
                ErrorKind::Matching,
                format!(
                    "receive #{k} from rank {from} on channel {channel} takes {} chunks, but the matching send ({}) sends {}",
                    rs[k].2,
                    name(&ss[k]),
                    ss[k].2
                ),
            );
        }
        if ss.len() > rs.len() {
            let k = rs.len();
            step_error(
                sink,
                place(&ss[k]),
                ErrorKind::Matching,
                format!(
                    "send #{k} to rank {to} on channel {channel} is never received: rank {to} receives {} messages from rank {from} on channel {channel}, rank {from} sends {}",
                    rs.len(),
                    ss.len()
                ),
            );
        } else if rs.len() > ss.len() {
            let k = ss.len();
            step_error(
                sink,
                place(&rs[k]),
                ErrorKind::Matching,
                format!(
                    "receive #{k} from rank {from} on channel {channel} is never sent: rank {from} sends {} messages to rank {to} on channel {channel}, rank {to} receives {}",
                    ss.len(),
                    rs.len()
                ),
            );
        }
        conn.sender = sender_of[ci].unwrap_or(usize::MAX);
        conn.receiver = receiver_of[ci].unwrap_or(usize::MAX);
    }
}
