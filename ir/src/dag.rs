//! The step DAG of a schedule: every step of every stream of every rank numbered, the
//! ordering between steps resolved, and the sends and receives of every connection paired.
//!
//! Whatever runs or checks a whole schedule needs this flattening: the verifier, the
//! compiler's simulator. [`StepDag`] derives it once, by the rules of [`crate::schedule`]:
//!
//! - **Step ids.** Steps are numbered `0..`[`StepDag::step_count`] in the order rank, stream,
//!   step: rank 0's stream 0 first, then its stream 1, …, then rank 1's streams. Streams are
//!   numbered the same way (*global streams*); [`StepNumbering`] holds the numbering alone
//!   (an entry per stream), for whoever needs only that.
//! - **Order.** A step comes after the previous step of its stream (the implicit in-stream
//!   order) and after every step its [`crate::Dep`]s name. [`StepDag::successors`] lists
//!   the steps that wait on a step, [`StepDag::predecessor_count`] how many a step waits on
//!   (an edge named twice counts twice).
//! - **Connections.** A step with a send half uses the connection `(rank, to, channel)`, one
//!   with a receive half `(from, rank, channel)`, `channel` being its stream's. Connections
//!   are numbered in the order steps first use them (a step's send half before its receive
//!   half); on each the k-th send pairs with the k-th receive ([`Connection`]).
//!
//! A dependency that names no step, and a peer outside `0..nranks` or equal to the rank
//! itself, are *bad references* ([`DagError`]): [`StepDag::new`] refuses the schedule at the
//! first (in step order; a step's dependencies before its send peer before its receive
//! peer); [`StepDag::lenient`] leaves them out of the DAG and lists them
//! ([`StepDag::bad_references`]), for the verifier, which reports every error it finds.
//! Whether a dependency names a step of its own stream, one stream per connection direction,
//! equal counts and matching lengths on a connection are checked by the verifier, not here.

use crate::schedule::{Dep, Rank, RankProgram, Schedule, StepRef};
use rustc_hash::FxHashMap;
use thiserror::Error;

/// A connection `(from, to, channel)`.
pub type ConnKey = (Rank, Rank, u32);

/// "No such step or connection" in the `u32` indices of a [`StepDag`].
pub const NONE: u32 = u32::MAX;

/// A reference of a step that names nothing, or a schedule too large to number.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DagError {
    /// More steps than `u32` ids can number (ids up to [`NONE`] excluded).
    #[error("the schedule has {steps} steps, more than a step DAG numbers")]
    TooLarge { steps: usize },
    /// A dependency on a stream or step the rank does not have.
    #[error("{at}: depends on stream {} step {}, which does not exist", dep.stream, dep.step)]
    BadDep { at: StepRef, dep: Dep },
    /// A send or receive whose peer is out of range or the rank itself: `from` sends to `to`.
    #[error("{at}: rank {from} sending to rank {to} is not a connection")]
    BadPeer { at: StepRef, from: Rank, to: Rank },
}

/// One connection: its key and the steps at its two ends, in program order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `(from, to, channel)`.
    pub key: ConnKey,
    /// Ids of the steps of rank `from` that send on it.
    pub sends: Vec<u32>,
    /// Ids of the steps of rank `to` that receive from it.
    pub recvs: Vec<u32>,
}

/// How a schedule's streams and steps are numbered (global streams, step ids): the part of
/// a [`StepDag`] that is one small entry per stream, for whoever keeps only that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepNumbering {
    /// Global index of each rank's first stream; `nranks + 1` entries.
    stream_base: Vec<u32>,
    /// Id of each global stream's first step; one more entry than streams.
    step_base: Vec<u32>,
    /// (rank, stream of the rank) of each global stream.
    stream_owner: Vec<(Rank, u32)>,
}

impl StepNumbering {
    /// The numbering of `schedule`'s streams and steps; `Err` when its steps do not fit
    /// `u32` ids below [`NONE`].
    pub fn of(schedule: &Schedule) -> Result<StepNumbering, DagError> {
        let mut out = StepNumbering::default();
        let mut total = 0usize;
        for (r, prog) in schedule.ranks.iter().enumerate() {
            out.stream_base.push(out.stream_owner.len() as u32);
            for (si, st) in prog.streams.iter().enumerate() {
                out.step_base.push(total as u32);
                out.stream_owner.push((r as Rank, si as u32));
                total += st.steps.len();
            }
        }
        if total >= NONE as usize {
            return Err(DagError::TooLarge { steps: total });
        }
        out.stream_base.push(out.stream_owner.len() as u32);
        out.step_base.push(total as u32);
        Ok(out)
    }

    /// Number of steps.
    pub fn step_count(&self) -> usize {
        self.step_base.last().map_or(0, |&b| b as usize)
    }

    /// Number of streams over all ranks.
    pub fn stream_count(&self) -> usize {
        self.stream_owner.len()
    }

    /// The global index of rank `rank`'s first stream (`rank == nranks`: the stream count).
    pub fn stream_base(&self, rank: Rank) -> usize {
        self.stream_base[rank as usize] as usize
    }

    /// The id of global stream `stream`'s first step (`stream == stream_count()`: the step
    /// count).
    pub fn step_base(&self, stream: usize) -> usize {
        self.step_base[stream] as usize
    }

    /// The rank and the stream of the rank of global stream `stream`.
    pub fn stream_owner(&self, stream: usize) -> (Rank, u32) {
        self.stream_owner[stream]
    }

    /// The id of a step.
    pub fn id(&self, at: StepRef) -> usize {
        self.step_base(self.stream_base(at.rank) + at.stream as usize) + at.step as usize
    }

    /// The global stream of step `id` (a binary search).
    pub fn stream_of(&self, id: usize) -> usize {
        self.step_base.partition_point(|&b| b as usize <= id) - 1
    }

    /// Where step `id` is.
    pub fn step_ref(&self, id: usize) -> StepRef {
        let s = self.stream_of(id);
        let (rank, stream) = self.stream_owner[s];
        StepRef {
            rank,
            stream,
            step: (id - self.step_base(s)) as u32,
        }
    }

    /// The id of the step `dep` names on rank `rank` (whose program is `prog`), `None` when
    /// it names no step.
    fn dep_target(&self, prog: &RankProgram, rank: Rank, dep: &Dep) -> Option<u32> {
        let stream = prog.streams.get(dep.stream as usize)?;
        ((dep.step as usize) < stream.steps.len()).then(|| {
            let g = self.stream_base(rank) + dep.stream as usize;
            self.step_base[g] + dep.step
        })
    }
}

/// The flattened step DAG of a schedule; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct StepDag {
    numbering: StepNumbering,
    /// Successors of each step in CSR form: `succ[succ_start[i]..succ_start[i + 1]]`.
    succ_start: Vec<u32>,
    succ: Vec<u32>,
    /// Predecessors of each step (edges into it).
    preds: Vec<u32>,
    conns: Vec<Connection>,
    conn_index: FxHashMap<ConnKey, u32>,
    /// Per step: (connection, position on it) of its send half and of its receive half, or
    /// `(NONE, NONE)`.
    send_at: Vec<(u32, u32)>,
    recv_at: Vec<(u32, u32)>,
    bad: Vec<DagError>,
}

impl StepDag {
    /// The DAG of `schedule`, or the first bad reference in step order.
    pub fn new(schedule: &Schedule) -> Result<StepDag, DagError> {
        let mut dag = StepDag::lenient(schedule)?;
        if dag.bad.is_empty() {
            Ok(dag)
        } else {
            Err(dag.bad.swap_remove(0))
        }
    }

    /// The DAG of `schedule` without its bad references, which
    /// [`StepDag::bad_references`] lists; `Err` only for [`DagError::TooLarge`].
    pub fn lenient(schedule: &Schedule) -> Result<StepDag, DagError> {
        let mut dag = StepDag {
            numbering: StepNumbering::of(schedule)?,
            ..StepDag::default()
        };
        let total = dag.numbering.step_count();
        dag.preds = vec![0; total];
        dag.send_at.reserve(total);
        dag.recv_at.reserve(total);
        // Out-degrees first (in `succ_start[i + 1]`), then the lists in step order.
        dag.succ_start = vec![0; total + 1];
        dag.number_steps(schedule);
        for i in 0..total {
            dag.succ_start[i + 1] += dag.succ_start[i];
        }
        dag.fill_successors(schedule);
        Ok(dag)
    }

    /// The first pass: every step's predecessor count, its successor count (in
    /// `succ_start[id + 1]`), its connections and the bad references.
    fn number_steps(&mut self, schedule: &Schedule) {
        let n = schedule.nranks;
        let mut id = 0u32;
        for (r, prog) in schedule.ranks.iter().enumerate() {
            let r = r as Rank;
            for (si, stream) in prog.streams.iter().enumerate() {
                for (ti, step) in stream.steps.iter().enumerate() {
                    let at = StepRef {
                        rank: r,
                        stream: si as u32,
                        step: ti as u32,
                    };
                    if ti > 0 {
                        self.succ_start[id as usize] += 1;
                        self.preds[id as usize] += 1;
                    }
                    for dep in &step.deps {
                        match self.numbering.dep_target(prog, r, dep) {
                            Some(target) => {
                                self.succ_start[target as usize + 1] += 1;
                                self.preds[id as usize] += 1;
                            }
                            None => self.bad.push(DagError::BadDep { at, dep: *dep }),
                        }
                    }
                    let mut end = |from: Rank, to: Rank, is_send: bool| {
                        let peer = if is_send { to } else { from };
                        if peer >= n || peer == r {
                            self.bad.push(DagError::BadPeer { at, from, to });
                            return (NONE, NONE);
                        }
                        let key = (from, to, stream.channel);
                        let conns = &mut self.conns;
                        let c = *self.conn_index.entry(key).or_insert_with(|| {
                            conns.push(Connection {
                                key,
                                sends: Vec::new(),
                                recvs: Vec::new(),
                            });
                            (conns.len() - 1) as u32
                        });
                        let conn = &mut self.conns[c as usize];
                        let list = if is_send {
                            &mut conn.sends
                        } else {
                            &mut conn.recvs
                        };
                        list.push(id);
                        (c, list.len() as u32 - 1)
                    };
                    let send = step
                        .op
                        .send_peer()
                        .map_or((NONE, NONE), |to| end(r, to, true));
                    let recv = step
                        .op
                        .recv_peer()
                        .map_or((NONE, NONE), |from| end(from, r, false));
                    self.send_at.push(send);
                    self.recv_at.push(recv);
                    id += 1;
                }
            }
        }
    }

    /// The second pass: the successor lists, each in step order of the successors (a step's
    /// stream predecessor before its dependencies).
    fn fill_successors(&mut self, schedule: &Schedule) {
        let mut fill = self.succ_start.clone();
        self.succ = vec![0; *self.succ_start.last().unwrap_or(&0) as usize];
        let mut push = |succ: &mut [u32], before: u32, id: u32| {
            succ[fill[before as usize] as usize] = id;
            fill[before as usize] += 1;
        };
        let mut id = 0u32;
        for (r, prog) in schedule.ranks.iter().enumerate() {
            for stream in &prog.streams {
                for (ti, step) in stream.steps.iter().enumerate() {
                    if ti > 0 {
                        push(&mut self.succ, id - 1, id);
                    }
                    for dep in &step.deps {
                        if let Some(target) = self.numbering.dep_target(prog, r as Rank, dep) {
                            push(&mut self.succ, target, id);
                        }
                    }
                    id += 1;
                }
            }
        }
    }

    /// The bad references [`StepDag::lenient`] left out, in step order.
    pub fn bad_references(&self) -> &[DagError] {
        &self.bad
    }

    /// How the streams and steps are numbered.
    pub fn numbering(&self) -> &StepNumbering {
        &self.numbering
    }

    /// Number of steps.
    pub fn step_count(&self) -> usize {
        self.preds.len()
    }

    /// The steps that wait on step `id`: the next step of its stream and the steps that
    /// depend on it, in step order.
    pub fn successors(&self, id: usize) -> &[u32] {
        &self.succ[self.succ_start[id] as usize..self.succ_start[id + 1] as usize]
    }

    /// How many steps step `id` waits on (edges into it).
    pub fn predecessor_count(&self, id: usize) -> u32 {
        self.preds[id]
    }

    /// Every connection, numbered.
    pub fn connections(&self) -> &[Connection] {
        &self.conns
    }

    /// The number of connection `key`.
    pub fn connection(&self, key: ConnKey) -> Option<u32> {
        self.conn_index.get(&key).copied()
    }

    /// (connection, position on it) of step `id`'s send half, `None` when it sends nothing
    /// (or to a bad peer).
    pub fn send_at(&self, id: usize) -> Option<(u32, u32)> {
        Some(self.send_at[id]).filter(|&(c, _)| c != NONE)
    }

    /// (connection, position on it) of step `id`'s receive half, `None` when it receives
    /// nothing (or from a bad peer).
    pub fn recv_at(&self, id: usize) -> Option<(u32, u32)> {
        Some(self.recv_at[id]).filter(|&(c, _)| c != NONE)
    }

    /// The DAG's arrays, for a consumer that keeps them (the compiler's simulator).
    pub fn into_parts(self) -> DagParts {
        DagParts {
            succ_start: self.succ_start,
            succ: self.succ,
            preds: self.preds,
            connections: self.conns,
            send_ends: self.send_at,
            recv_ends: self.recv_at,
        }
    }
}

/// A [`StepDag`] taken apart ([`StepDag::into_parts`]).
#[derive(Debug, Clone)]
pub struct DagParts {
    /// The successor lists in CSR form: step `i`'s are `succ[succ_start[i]..succ_start[i +
    /// 1]]` ([`StepDag::successors`]).
    pub succ_start: Vec<u32>,
    pub succ: Vec<u32>,
    /// Every step's predecessor count ([`StepDag::predecessor_count`]).
    pub preds: Vec<u32>,
    /// Every connection ([`StepDag::connections`]).
    pub connections: Vec<Connection>,
    /// Per step, (connection, position on it) of its send half and of its receive half,
    /// `(NONE, NONE)` where it has none ([`StepDag::send_at`], [`StepDag::recv_at`]).
    pub send_ends: Vec<(u32, u32)>,
    pub recv_ends: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Collective, Loc, Op, Step, Stream};

    fn two_ranks() -> Schedule {
        let mut s = Schedule::empty(Collective::AllReduce, 2, 2, false).unwrap();
        let send = |to| {
            Step::new(
                Op::Send {
                    to,
                    src: Loc::input(0),
                },
                1,
            )
        };
        let recv = |from| {
            Step::new(
                Op::RecvReduceCopy {
                    from,
                    src: Loc::input(0),
                    dst: Loc::output(0),
                },
                1,
            )
        };
        for r in 0..2u32 {
            s.ranks[r as usize].streams = vec![
                Stream {
                    channel: 0,
                    steps: vec![send(1 - r), send(1 - r)],
                },
                Stream {
                    channel: 0,
                    steps: vec![
                        recv(1 - r).with_deps([Dep { stream: 0, step: 1 }]),
                        recv(1 - r),
                    ],
                },
            ];
        }
        s
    }

    #[test]
    fn numbers_orders_and_pairs_the_steps() {
        let s = two_ranks();
        let dag = StepDag::new(&s).unwrap();
        assert_eq!(dag.step_count(), 8);
        assert_eq!(dag.numbering().stream_count(), 4);
        assert_eq!(dag.numbering().stream_base(1), 2);
        let at = StepRef {
            rank: 1,
            stream: 1,
            step: 0,
        };
        assert_eq!(dag.numbering().id(at), 6);
        assert_eq!(dag.numbering().step_ref(6), at);
        assert_eq!(dag.numbering().stream_of(6), 3);
        // Step 1 (rank 0 stream 0 step 1) precedes rank 0's first receive (step 2).
        assert_eq!(dag.successors(0), &[1]);
        assert_eq!(dag.successors(1), &[2]);
        assert_eq!(dag.successors(2), &[3]);
        assert_eq!(dag.predecessor_count(2), 1);
        assert_eq!(dag.predecessor_count(0), 0);
        let keys: Vec<ConnKey> = dag.connections().iter().map(|c| c.key).collect();
        assert_eq!(keys, [(0, 1, 0), (1, 0, 0)]);
        assert_eq!(dag.connections()[0].sends, [0, 1]);
        assert_eq!(dag.connections()[0].recvs, [6, 7]);
        assert_eq!(dag.send_at(1), Some((0, 1)));
        assert_eq!(dag.recv_at(7), Some((0, 1)));
        assert_eq!(dag.recv_at(1), None);
        assert_eq!(dag.connection((1, 0, 0)), Some(1));
    }

    #[test]
    fn bad_references_are_left_out_and_listed() {
        let mut s = two_ranks();
        s.ranks[0].streams[1].steps[1]
            .deps
            .push(Dep { stream: 5, step: 0 });
        s.ranks[1].streams[0].steps[0].op = Op::Send {
            to: 1,
            src: Loc::input(0),
        };
        let dag = StepDag::lenient(&s).unwrap();
        let bad_dep = DagError::BadDep {
            at: StepRef {
                rank: 0,
                stream: 1,
                step: 1,
            },
            dep: Dep { stream: 5, step: 0 },
        };
        let bad_peer = DagError::BadPeer {
            at: StepRef {
                rank: 1,
                stream: 0,
                step: 0,
            },
            from: 1,
            to: 1,
        };
        assert_eq!(dag.bad_references(), [bad_dep.clone(), bad_peer]);
        assert_eq!(dag.predecessor_count(3), 1);
        assert_eq!(dag.send_at(4), None);
        assert_eq!(dag.connections()[1].sends, [5]);
        assert_eq!(StepDag::new(&s).unwrap_err(), bad_dep);
    }
}
