//! Export of a plan entry as MSCCL XML that the MSCCL runtime loads and that
//! [`super::import_xml`] reads back to an equivalent schedule.
//!
//! Format rules honoured (see the module docs of [`super`]): one `<tb>` per send/receive peer
//! pair; at most one dependency per step, extra ones expanded into preceding `nop`s; `hasdep`
//! set exactly on the steps something waits on; every attribute of a tag on one line, space
//! indentation, no XML declaration; the remote-side fields of sends and receives filled from
//! the matching step on the peer.
//!
//! A stream of the IR may talk to several peers in turn; MSCCL's thread blocks cannot. Such a
//! stream is split into one tb per group of steps that share a connection, and consecutive
//! steps that land in different tbs are ordered by an explicit dependency, so the split keeps
//! the stream's program order.

use crate::plan::PlanEntry;
use crate::schedule::{Buf, Collective, Dep, Loc, Op, Rank, Schedule};
use std::collections::HashMap;
use std::fmt::Write;
use thiserror::Error;

/// Why a plan entry has no MSCCL form.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExportError {
    #[error(
        "{collective} with root {root}: MSCCL XML has no root attribute, only root 0 can be exported"
    )]
    Root { collective: String, root: Rank },
    #[error(
        "rank {rank} stream {stream}: steps sharing a connection talk to more than one {side} peer ({peers}), which no MSCCL thread block can express"
    )]
    PeerConflict {
        rank: Rank,
        stream: u32,
        side: &'static str,
        peers: String,
    },
    #[error("rank {rank} stream {stream} step {step}: dependency on a step that does not exist")]
    BadDep { rank: Rank, stream: u32, step: u32 },
}

/// The XML text and notes on runtime limits it exceeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub xml: String,
    /// Limits of the MSCCL runtime the file exceeds (it is still a faithful description).
    pub warnings: Vec<String>,
}

/// One MSCCL thread block being assembled.
struct Tb {
    send: Option<Rank>,
    recv: Option<Rank>,
    chan: u32,
    /// (original step index or None for an inserted nop, dependency)
    steps: Vec<(Option<u32>, Option<Target>)>,
}

/// A dependency target: placed already, or an original (stream, step) placed later.
#[derive(Clone, Copy)]
enum Target {
    Placed(Dep),
    Pending(u32, u32),
}

impl Target {
    fn placed(self) -> Option<Dep> {
        match self {
            Target::Placed(dep) => Some(dep),
            Target::Pending(..) => None,
        }
    }
}

/// Exports `entry` as MSCCL XML.
pub fn export_xml(entry: &PlanEntry) -> Result<Exported, ExportError> {
    let schedule = &entry.schedule;
    if let Some(root) = schedule.collective.root().filter(|&r| r != 0) {
        return Err(ExportError::Root {
            collective: schedule.collective.kind().to_string(),
            root,
        });
    }
    let mut warnings = Vec::new();
    let remote = remote_sides(schedule);
    let mut out = String::new();
    let coll = match schedule.collective {
        Collective::AllReduce => "allreduce",
        Collective::AllGather => "allgather",
        Collective::ReduceScatter => "reducescatter",
        Collective::Broadcast { .. } => "broadcast",
        Collective::Reduce { .. } => "reduce",
        Collective::AllToAll => "alltoall",
    };
    let mut gpus = String::new();
    let mut max_chan = 0;
    for (rank, program) in schedule.ranks.iter().enumerate() {
        let rank = rank as Rank;
        let (tbs, position) = split_streams(schedule, rank)?;
        let mut waited: HashMap<(usize, usize), ()> = HashMap::new();
        for tb in &tbs {
            for (_, dep) in &tb.steps {
                if let Some(dep) = dep.and_then(Target::placed) {
                    waited.insert((dep.stream as usize, dep.step as usize), ());
                }
            }
        }
        let _ = writeln!(
            gpus,
            "  <gpu id=\"{rank}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">",
            schedule.input_chunks, schedule.output_chunks, program.scratch_chunks
        );
        for (tb_id, tb) in tbs.iter().enumerate() {
            max_chan = max_chan.max(tb.chan + 1);
            if tb.steps.len() > 64 {
                warnings.push(format!(
                    "rank {rank} tb {tb_id}: {} steps exceed msccl-executor-nccl's default limit of 64",
                    tb.steps.len()
                ));
            }
            let _ = writeln!(
                gpus,
                "    <tb id=\"{tb_id}\" send=\"{}\" recv=\"{}\" chan=\"{}\">",
                peer(tb.send),
                peer(tb.recv),
                tb.chan
            );
            for (pos, (orig, dep)) in tb.steps.iter().enumerate() {
                let hasdep = u8::from(waited.contains_key(&(tb_id, pos)));
                let (depid, deps) = dep
                    .and_then(Target::placed)
                    .map_or((-1, -1), |d| (i64::from(d.stream), i64::from(d.step)));
                let (kind, src, dst, cnt) = match orig {
                    None => ("nop", None, None, 0),
                    Some(idx) => {
                        let (stream, step_idx) = position[*idx as usize];
                        let step = &program.streams[stream].steps[step_idx];
                        let (src, dst) =
                            fill_remote(step.op, &remote, rank, stream as u32, step_idx as u32);
                        if step.count >= 72 {
                            warnings.push(format!(
                                "rank {rank} stream {stream} step {step_idx}: cnt {} exceeds the runtime's limit of 71",
                                step.count
                            ));
                        }
                        (step.op.mnemonic(), src, dst, step.count)
                    }
                };
                let (sb, so) = loc_attrs(src, Buf::Input);
                let (db, doff) = loc_attrs(dst, Buf::Output);
                let _ = writeln!(
                    gpus,
                    "      <step s=\"{pos}\" type=\"{kind}\" srcbuf=\"{sb}\" srcoff=\"{so}\" dstbuf=\"{db}\" dstoff=\"{doff}\" cnt=\"{cnt}\" depid=\"{depid}\" deps=\"{deps}\" hasdep=\"{hasdep}\"/>"
                );
            }
            gpus.push_str("    </tb>\n");
        }
        gpus.push_str("  </gpu>\n");
    }
    if max_chan > 32 {
        warnings.push(format!(
            "{max_chan} channels exceed the runtime's limit of 32"
        ));
    }
    let name: String = entry
        .algorithm
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.+=()".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let max_bytes = entry.max_bytes.map_or(0, |m| m.saturating_sub(1).max(1));
    let _ = writeln!(
        out,
        "<algo name=\"{name}\" proto=\"{}\" nchannels=\"{max_chan}\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{coll}\" inplace=\"{}\" outofplace=\"{}\" minBytes=\"{}\" maxBytes=\"{max_bytes}\">",
        entry.protocol.name(),
        schedule.chunks,
        schedule.nranks,
        u8::from(schedule.in_place),
        u8::from(!schedule.in_place),
        entry.min_bytes
    );
    out.push_str(&gpus);
    out.push_str("</algo>\n");
    Ok(Exported { xml: out, warnings })
}

fn peer(p: Option<Rank>) -> i64 {
    p.map_or(-1, i64::from)
}

fn loc_attrs(loc: Option<Loc>, absent: Buf) -> (char, i64) {
    match loc {
        Some(loc) => (loc.buf.letter(), i64::from(loc.off)),
        None => (absent.letter(), -1),
    }
}

/// For each send-type step, the receiver's destination; for each receive-type step, the
/// sender's source of the data. Keyed by (rank, stream, step).
struct Remote {
    send_dst: HashMap<(Rank, u32, u32), Loc>,
    recv_src: HashMap<(Rank, u32, u32), Loc>,
}

fn remote_sides(schedule: &Schedule) -> Remote {
    // Connection (from, to, channel) → the ordered send-type and receive-type steps.
    type Conn = (Rank, Rank, u32);
    let mut sends: HashMap<Conn, Vec<(Rank, u32, u32, Op)>> = HashMap::new();
    let mut recvs: HashMap<Conn, Vec<(Rank, u32, u32, Op)>> = HashMap::new();
    for (rank, program) in schedule.ranks.iter().enumerate() {
        let rank = rank as Rank;
        for (s, stream) in program.streams.iter().enumerate() {
            for (i, step) in stream.steps.iter().enumerate() {
                let at = (rank, s as u32, i as u32, step.op);
                if let Some(to) = step.op.send_peer() {
                    sends
                        .entry((rank, to, stream.channel))
                        .or_default()
                        .push(at);
                }
                if let Some(from) = step.op.recv_peer() {
                    recvs
                        .entry((from, rank, stream.channel))
                        .or_default()
                        .push(at);
                }
            }
        }
    }
    let mut remote = Remote {
        send_dst: HashMap::new(),
        recv_src: HashMap::new(),
    };
    for (conn, senders) in &sends {
        let Some(receivers) = recvs.get(conn) else {
            continue;
        };
        for (s, r) in senders.iter().zip(receivers) {
            // What the sender pushes lives at its dst when it stored it first, else at src.
            let sent = s.3.dst().or(s.3.src());
            if let Some(dst) = r.3.dst().or(r.3.src()) {
                remote.send_dst.insert((s.0, s.1, s.2), dst);
            }
            if let Some(sent) = sent {
                remote.recv_src.insert((r.0, r.1, r.2), sent);
            }
        }
    }
    remote
}

/// The (src, dst) attributes of a step: its own locations, with the unused side filled from
/// the remote step where MSCCL expects that.
fn fill_remote(
    op: Op,
    remote: &Remote,
    rank: Rank,
    stream: u32,
    step: u32,
) -> (Option<Loc>, Option<Loc>) {
    let key = (rank, stream, step);
    let mut src = op.src();
    let mut dst = op.dst();
    match op {
        Op::Send { .. } => dst = remote.send_dst.get(&key).copied().or(src),
        Op::RecvReduceSend { .. } => dst = src,
        Op::Recv { .. } | Op::RecvCopySend { .. } => {
            src = remote.recv_src.get(&key).copied().or(dst)
        }
        _ => {}
    }
    (src, dst)
}

/// The thread block of every step of stream `s` of `rank`: steps that share a send peer or
/// a receive peer share a tb (new tbs are appended to `tbs`); a tb sends to one peer and
/// receives from one at most.
fn assign_tbs(
    stream: &crate::Stream,
    s: usize,
    rank: Rank,
    tbs: &mut Vec<Tb>,
) -> Result<Vec<usize>, ExportError> {
    // Union steps that share a send peer or a receive peer.
    let n = stream.steps.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut by_send: HashMap<Rank, usize> = HashMap::new();
    let mut by_recv: HashMap<Rank, usize> = HashMap::new();
    let distinct = |f: fn(&Op) -> Option<Rank>| {
        let mut peers: Vec<Rank> = stream.steps.iter().filter_map(|st| f(&st.op)).collect();
        peers.sort_unstable();
        peers.dedup();
        peers.len()
    };
    // The common case: one send peer and one receive peer at most, so one tb.
    let single = distinct(Op::send_peer) <= 1 && distinct(Op::recv_peer) <= 1;
    for (i, step) in stream.steps.iter().enumerate() {
        if single {
            parent[i] = 0;
            continue;
        }
        for (peer, map) in [
            (step.op.send_peer(), &mut by_send),
            (step.op.recv_peer(), &mut by_recv),
        ] {
            if let Some(peer) = peer {
                let first = *map.entry(peer).or_insert(i);
                let (a, b) = (find(&mut parent, first), find(&mut parent, i));
                parent[a] = b;
            }
        }
    }
    // Local-only steps join the group of the step before them (or the first group).
    let mut group_tb: HashMap<usize, usize> = HashMap::new();
    let mut assignment = Vec::with_capacity(n);
    let mut last_tb: Option<usize> = None;
    for (i, step) in stream.steps.iter().enumerate() {
        let talks = step.op.send_peer().is_some() || step.op.recv_peer().is_some();
        let tb = if single && last_tb.is_some() {
            last_tb.unwrap_or_default()
        } else if talks {
            let root = find(&mut parent, i);
            *group_tb.entry(root).or_insert_with(|| {
                tbs.push(Tb {
                    send: None,
                    recv: None,
                    chan: stream.channel,
                    steps: Vec::new(),
                });
                tbs.len() - 1
            })
        } else if let Some(tb) = last_tb {
            tb
        } else {
            tbs.push(Tb {
                send: None,
                recv: None,
                chan: stream.channel,
                steps: Vec::new(),
            });
            tbs.len() - 1
        };
        for (side, peer, slot) in [
            ("send", step.op.send_peer(), 0),
            ("receive", step.op.recv_peer(), 1),
        ] {
            let Some(peer) = peer else { continue };
            let have = if slot == 0 {
                &mut tbs[tb].send
            } else {
                &mut tbs[tb].recv
            };
            match *have {
                None => *have = Some(peer),
                Some(p) if p == peer => {}
                Some(p) => {
                    return Err(ExportError::PeerConflict {
                        rank,
                        stream: s as u32,
                        side,
                        peers: format!("{p} and {peer}"),
                    });
                }
            }
        }
        assignment.push(tb);
        last_tb = Some(tb);
    }
    Ok(assignment)
}

/// Splits rank `rank`'s streams into MSCCL thread blocks. Returns the tbs and, for each
/// original step in flat order, its (stream, step) so the writer can find it.
#[allow(clippy::type_complexity)]
fn split_streams(
    schedule: &Schedule,
    rank: Rank,
) -> Result<(Vec<Tb>, Vec<(usize, usize)>), ExportError> {
    let program = &schedule.ranks[rank as usize];
    let mut tbs: Vec<Tb> = Vec::new();
    let mut position: Vec<(usize, usize)> = Vec::new();
    // (stream, step) → (tb, position within tb)
    let mut placed: HashMap<(u32, u32), (u32, u32)> = HashMap::new();
    // First pass: decide the tb of every step.
    let mut tb_of: Vec<Vec<usize>> = Vec::new();
    for (s, stream) in program.streams.iter().enumerate() {
        tb_of.push(assign_tbs(stream, s, rank, &mut tbs)?);
    }
    // Second pass: emit steps with their dependencies (explicit ones plus program order
    // across tbs), expanding extra dependencies into nops.
    for (s, stream) in program.streams.iter().enumerate() {
        for (i, step) in stream.steps.iter().enumerate() {
            let tb = tb_of[s][i];
            let mut deps: Vec<(u32, u32)> = step.deps.iter().map(|d| (d.stream, d.step)).collect();
            if i > 0 && tb_of[s][i - 1] != tb {
                deps.push((s as u32, i as u32 - 1));
            }
            // Forward references (a dependency on a step of a later stream) are resolved
            // after all steps are placed.
            let mapped: Vec<Target> = deps
                .into_iter()
                .map(|(ds, di)| match placed.get(&(ds, di)) {
                    Some(&(t, p)) => Target::Placed(Dep { stream: t, step: p }),
                    None => Target::Pending(ds, di),
                })
                .collect();
            let flat = position.len() as u32;
            position.push((s, i));
            let tb_steps = &mut tbs[tb].steps;
            let (last, extra) = match mapped.split_last() {
                Some((last, extra)) => (Some(*last), extra.to_vec()),
                None => (None, Vec::new()),
            };
            for dep in extra {
                tb_steps.push((None, Some(dep)));
            }
            tb_steps.push((Some(flat), last));
            placed.insert((s as u32, i as u32), (tb as u32, tb_steps.len() as u32 - 1));
        }
    }
    // Resolve forward references now that every step has a place.
    for tb in &mut tbs {
        for (_, dep) in &mut tb.steps {
            if let Some(Target::Pending(stream, step)) = *dep {
                let &(t, p) = placed.get(&(stream, step)).ok_or(ExportError::BadDep {
                    rank,
                    stream,
                    step,
                })?;
                *dep = Some(Target::Placed(Dep { stream: t, step: p }));
            }
        }
    }
    Ok((tbs, position))
}
