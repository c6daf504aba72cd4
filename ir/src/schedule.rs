//! The schedule: one collective for `nranks` ranks as per-rank programs of steps.
//!
//! # Execution model
//!
//! A [`Schedule`] holds one [`RankProgram`] per rank. A rank program is a set of
//! [`Stream`]s (MSCCL calls them thread blocks). Streams of one rank run concurrently; the
//! steps of one stream run in order. A step may additionally wait on steps of other streams
//! of the same rank ([`Dep`]).
//!
//! Ranks talk over *connections*. The connection `(from, to, channel)` is a FIFO: the k-th
//! send-type step that rank `from` addresses to `to` on `channel` pairs with the k-th
//! receive-type step of rank `to` from `from` on `channel`. Both steps carry the same
//! `count`. On one rank at most one stream may send to a given `(peer, channel)` and at most
//! one stream may receive from it, so the order on every connection is the program order of
//! one stream. A connection buffers [`CONNECTION_SLOTS`] messages: a send blocks while that
//! many of its messages are unreceived. A step that both receives and sends (`rcs`, `rrs`,
//! `rrcs`) starts only when its message has arrived *and* its outgoing connection has a free
//! slot, then runs as one unit (as MSCCL's primitives do). Executors must provide at least
//! that many slots; the verifier proves freedom from deadlock under exactly these rules, which
//! implies it under more slots and under executors that split a fused step into a receive
//! followed by a send (they can only make progress where this model does).
//!
//! # Chunks and bytes
//!
//! The whole collective buffer (the nccl-tests "size": the AllReduce buffer, the AllGather
//! output, the ReduceScatter input, what one rank sends in AllToAll) of `N` elements is cut
//! into [`Schedule::chunks`] chunks; chunk `k` covers elements `[k·N/C, (k+1)·N/C)` rounded
//! down, so sizes that do not divide give chunks that differ by at most one element.
//! The input and output buffers of a rank hold [`Schedule::input_chunks`] and
//! [`Schedule::output_chunks`] of those chunks (see [`Collective::buffer_chunks`]); the scratch
//! buffer holds [`RankProgram::scratch_chunks`] chunks of the largest chunk size.
//!
//! # In-place schedules
//!
//! When [`Schedule::in_place`] is set the caller's buffers overlap as in NCCL:
//! AllReduce, Broadcast, Reduce and AllToAll: input and output are the same memory;
//! AllGather: the input is the rank's slice `r·C/n..` of the output;
//! ReduceScatter: the output is the rank's slice `r·C/n..` of the input.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Messages a connection buffers before a send blocks.
pub const CONNECTION_SLOTS: usize = 2;

/// A rank index, `0..nranks`.
pub type Rank = u32;

/// The collective a schedule implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast { root: Rank },
    Reduce { root: Rank },
    AllToAll,
}

/// The kind of a collective, without the root (the key of plan files' lookup tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 6] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
        CollectiveKind::AllToAll,
    ];

    /// The lower-case name used on command lines and in JSON (`allreduce`, …).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "allreduce",
            CollectiveKind::AllGather => "allgather",
            CollectiveKind::ReduceScatter => "reducescatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllToAll => "alltoall",
        }
    }

    /// Parses a command-line name; accepts `reduce_scatter` as MSCCL's legacy spelling.
    pub fn from_name(name: &str) -> Option<CollectiveKind> {
        let lower = name.to_ascii_lowercase();
        let res = match lower.as_str() {
            "allreduce" => CollectiveKind::AllReduce,
            "allgather" => CollectiveKind::AllGather,
            "reducescatter" | "reduce_scatter" => CollectiveKind::ReduceScatter,
            "broadcast" => CollectiveKind::Broadcast,
            "reduce" => CollectiveKind::Reduce,
            "alltoall" => CollectiveKind::AllToAll,
            _ => return None,
        };
        Some(res)
    }

    /// nccl-tests bus-bandwidth factor: busbw = algbw × factor.
    pub fn busbw_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::AllGather
            | CollectiveKind::ReduceScatter
            | CollectiveKind::AllToAll => (n - 1.0) / n,
            CollectiveKind::Broadcast | CollectiveKind::Reduce => 1.0,
        }
    }

    /// Whether the collective combines data with a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter | CollectiveKind::Reduce
        )
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Collective {
    pub fn kind(self) -> CollectiveKind {
        match self {
            Collective::AllReduce => CollectiveKind::AllReduce,
            Collective::AllGather => CollectiveKind::AllGather,
            Collective::ReduceScatter => CollectiveKind::ReduceScatter,
            Collective::Broadcast { .. } => CollectiveKind::Broadcast,
            Collective::Reduce { .. } => CollectiveKind::Reduce,
            Collective::AllToAll => CollectiveKind::AllToAll,
        }
    }

    /// The root of a rooted collective.
    pub fn root(self) -> Option<Rank> {
        match self {
            Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// Input and output buffer extents, in chunks, for a schedule that cuts the collective
    /// buffer into `chunks` chunks over `nranks` ranks: `None` when `chunks` is not a multiple
    /// of `nranks` where the collective needs it (AllGather, ReduceScatter, AllToAll).
    pub fn buffer_chunks(self, nranks: u32, chunks: u32) -> Option<(u32, u32)> {
        let per_rank = || (nranks > 0 && chunks.is_multiple_of(nranks)).then(|| chunks / nranks);
        match self {
            Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => {
                Some((chunks, chunks))
            }
            Collective::AllGather => Some((per_rank()?, chunks)),
            Collective::ReduceScatter => Some((chunks, per_rank()?)),
            Collective::AllToAll => {
                per_rank()?;
                Some((chunks, chunks))
            }
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.root() {
            Some(root) => write!(f, "{}(root={root})", self.kind()),
            None => f.write_str(self.kind().name()),
        }
    }
}

/// The three buffers a step can address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Buf {
    /// The caller's send buffer.
    Input,
    /// The caller's receive buffer.
    Output,
    /// Scratch memory the runtime allocates for the schedule.
    Scratch,
}

impl Buf {
    pub fn letter(self) -> char {
        match self {
            Buf::Input => 'i',
            Buf::Output => 'o',
            Buf::Scratch => 's',
        }
    }
}

/// The first chunk of a run of `count` chunks in one buffer (the count lives on the step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Loc {
    pub buf: Buf,
    pub off: u32,
}

impl Loc {
    pub const fn new(buf: Buf, off: u32) -> Loc {
        Loc { buf, off }
    }
    pub const fn input(off: u32) -> Loc {
        Loc::new(Buf::Input, off)
    }
    pub const fn output(off: u32) -> Loc {
        Loc::new(Buf::Output, off)
    }
    pub const fn scratch(off: u32) -> Loc {
        Loc::new(Buf::Scratch, off)
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.buf.letter(), self.off)
    }
}

/// What a step does. `⊕` is the caller's reduction operator; "received" is the next message
/// on the connection from the `from` peer, and "send X" pushes X on the connection to `to`.
/// Every location addresses `Step::count` consecutive chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// send `src`.
    Send { to: Rank, src: Loc },
    /// `dst ← received`.
    Recv { from: Rank, dst: Loc },
    /// `dst ← received ⊕ src` (MSCCL `rrc`; usually `src == dst`).
    RecvReduceCopy { from: Rank, src: Loc, dst: Loc },
    /// send `received ⊕ src`; nothing is stored locally (MSCCL `rrs`).
    RecvReduceSend { from: Rank, to: Rank, src: Loc },
    /// `dst ← received ⊕ src`, then send `dst` (MSCCL `rrcs`).
    RecvReduceCopySend {
        from: Rank,
        to: Rank,
        src: Loc,
        dst: Loc,
    },
    /// `dst ← received`, and forward it (MSCCL `rcs`).
    RecvCopySend { from: Rank, to: Rank, dst: Loc },
    /// `dst ← src` (local).
    Copy { src: Loc, dst: Loc },
    /// `dst ← dst ⊕ src` (local).
    Reduce { src: Loc, dst: Loc },
    /// Does nothing; exists to carry dependencies.
    Nop,
}

impl Op {
    /// The peer this op receives from.
    pub fn recv_peer(&self) -> Option<Rank> {
        match *self {
            Op::Recv { from, .. }
            | Op::RecvReduceCopy { from, .. }
            | Op::RecvReduceSend { from, .. }
            | Op::RecvReduceCopySend { from, .. }
            | Op::RecvCopySend { from, .. } => Some(from),
            Op::Send { .. } | Op::Copy { .. } | Op::Reduce { .. } | Op::Nop => None,
        }
    }

    /// The peer this op sends to.
    pub fn send_peer(&self) -> Option<Rank> {
        match *self {
            Op::Send { to, .. }
            | Op::RecvReduceSend { to, .. }
            | Op::RecvReduceCopySend { to, .. }
            | Op::RecvCopySend { to, .. } => Some(to),
            Op::Recv { .. }
            | Op::RecvReduceCopy { .. }
            | Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Nop => None,
        }
    }

    /// The local location the op reads (besides a received message).
    pub fn src(&self) -> Option<Loc> {
        match *self {
            Op::Send { src, .. }
            | Op::RecvReduceCopy { src, .. }
            | Op::RecvReduceSend { src, .. }
            | Op::RecvReduceCopySend { src, .. }
            | Op::Copy { src, .. }
            | Op::Reduce { src, .. } => Some(src),
            Op::Recv { .. } | Op::RecvCopySend { .. } | Op::Nop => None,
        }
    }

    /// The local location the op writes.
    pub fn dst(&self) -> Option<Loc> {
        match *self {
            Op::Recv { dst, .. }
            | Op::RecvReduceCopy { dst, .. }
            | Op::RecvReduceCopySend { dst, .. }
            | Op::RecvCopySend { dst, .. }
            | Op::Copy { dst, .. }
            | Op::Reduce { dst, .. } => Some(dst),
            Op::Send { .. } | Op::RecvReduceSend { .. } | Op::Nop => None,
        }
    }

    /// Whether the op applies the reduction operator.
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Op::RecvReduceCopy { .. }
                | Op::RecvReduceSend { .. }
                | Op::RecvReduceCopySend { .. }
                | Op::Reduce { .. }
        )
    }

    /// The op's name in words (`send`, `recv-reduce-copy`, …), for traces and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::RecvReduceCopy { .. } => "recv-reduce-copy",
            Op::RecvReduceSend { .. } => "recv-reduce-send",
            Op::RecvReduceCopySend { .. } => "recv-reduce-copy-send",
            Op::RecvCopySend { .. } => "recv-copy-send",
            Op::Copy { .. } => "copy",
            Op::Reduce { .. } => "reduce",
            Op::Nop => "nop",
        }
    }

    /// The MSCCL mnemonic of the op (`s`, `r`, `rrc`, …).
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Send { .. } => "s",
            Op::Recv { .. } => "r",
            Op::RecvReduceCopy { .. } => "rrc",
            Op::RecvReduceSend { .. } => "rrs",
            Op::RecvReduceCopySend { .. } => "rrcs",
            Op::RecvCopySend { .. } => "rcs",
            Op::Copy { .. } => "cpy",
            Op::Reduce { .. } => "re",
            Op::Nop => "nop",
        }
    }
}

/// A dependency on step `step` of stream `stream` of the same rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dep {
    pub stream: u32,
    pub step: u32,
}

/// One instruction of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Step {
    pub op: Op,
    /// Number of consecutive chunks the op addresses (0 only for `Nop`).
    pub count: u32,
    /// Steps of other streams of this rank that must complete first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<Dep>,
}

impl Step {
    pub fn new(op: Op, count: u32) -> Step {
        Step {
            op,
            count,
            deps: Vec::new(),
        }
    }

    pub fn with_deps(mut self, deps: impl IntoIterator<Item = Dep>) -> Step {
        self.deps.extend(deps);
        self
    }
}

/// An ordered list of steps that runs on one channel (an MSCCL thread block).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stream {
    /// The channel whose connections this stream's sends and receives use.
    pub channel: u32,
    pub steps: Vec<Step>,
}

/// Everything one rank runs.
///
/// It reads in the written form of [`crate::runs`] (steps and streams with or without
/// `repeat`, expanded as they are read; plan files write explicit programs so from format 6)
/// and serialises plainly, every step written out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RankProgram {
    /// Scratch buffer size, in chunks.
    #[serde(default)]
    pub scratch_chunks: u32,
    pub streams: Vec<Stream>,
}

impl<'de> Deserialize<'de> for RankProgram {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RankProgram, D::Error> {
        crate::runs::WProgram::deserialize(d)?
            .expand_as("the rank program's steps")
            .map_err(|e| serde::de::Error::custom(format!("rank program: {e}")))
    }
}

/// The fields of a schedule besides its programs: what [`Schedule`] and
/// [`crate::SymmetricSchedule`] share, in their order.
///
/// Both types keep these fields flat (plan files write them so, and a flattened struct would
/// change the RON), and convert with [`Schedule::header`] / [`Schedule::from_header`] and
/// their [`crate::SymmetricSchedule`] counterparts. Its RON form is that of the schedule's
/// first six fields, which seals hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleHeader {
    /// The collective the schedule implements.
    pub collective: Collective,
    /// Number of ranks.
    pub nranks: u32,
    /// `C`: how many chunks the whole collective buffer is cut into.
    pub chunks: u32,
    /// Input buffer extent in chunks (see [`Collective::buffer_chunks`]).
    pub input_chunks: u32,
    /// Output buffer extent in chunks.
    pub output_chunks: u32,
    /// Whether the schedule is written for overlapping input and output (see module docs).
    pub in_place: bool,
}

impl ScheduleHeader {
    /// Number of fields [`ScheduleHeader::serialize_fields`] writes.
    pub const FIELDS: usize = 6;

    /// Writes the header's fields into a struct being serialised (a wire form that keeps
    /// them flat, as plan files do, followed by fields of its own).
    pub fn serialize_fields<S: SerializeStruct>(&self, st: &mut S) -> Result<(), S::Error> {
        st.serialize_field("collective", &self.collective)?;
        st.serialize_field("nranks", &self.nranks)?;
        st.serialize_field("chunks", &self.chunks)?;
        st.serialize_field("input_chunks", &self.input_chunks)?;
        st.serialize_field("output_chunks", &self.output_chunks)?;
        st.serialize_field("in_place", &self.in_place)
    }
}

/// One collective for `nranks` ranks as a chunk-level program per rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schedule {
    pub collective: Collective,
    pub nranks: u32,
    /// `C`: how many chunks the whole collective buffer is cut into.
    pub chunks: u32,
    /// Input buffer extent in chunks (see [`Collective::buffer_chunks`]).
    pub input_chunks: u32,
    /// Output buffer extent in chunks.
    pub output_chunks: u32,
    /// Whether the schedule is written for overlapping input and output (see module docs).
    pub in_place: bool,
    /// One program per rank, indexed by rank.
    pub ranks: Vec<RankProgram>,
}

impl Schedule {
    /// An empty schedule (no streams) with buffer extents derived from the collective.
    /// Returns `None` when `chunks` does not fit the collective (see
    /// [`Collective::buffer_chunks`]).
    pub fn empty(
        collective: Collective,
        nranks: u32,
        chunks: u32,
        in_place: bool,
    ) -> Option<Schedule> {
        let (input_chunks, output_chunks) = collective.buffer_chunks(nranks, chunks)?;
        let ranks = (0..nranks)
            .map(|_| RankProgram {
                scratch_chunks: 0,
                streams: Vec::new(),
            })
            .collect();
        Some(Schedule {
            collective,
            nranks,
            chunks,
            input_chunks,
            output_chunks,
            in_place,
            ranks,
        })
    }

    /// The schedule's fields besides its programs.
    pub fn header(&self) -> ScheduleHeader {
        ScheduleHeader {
            collective: self.collective,
            nranks: self.nranks,
            chunks: self.chunks,
            input_chunks: self.input_chunks,
            output_chunks: self.output_chunks,
            in_place: self.in_place,
        }
    }

    /// The schedule with header `header` and the programs `ranks` (one per rank, unchecked).
    pub fn from_header(header: ScheduleHeader, ranks: Vec<RankProgram>) -> Schedule {
        let ScheduleHeader {
            collective,
            nranks,
            chunks,
            input_chunks,
            output_chunks,
            in_place,
        } = header;
        Schedule {
            collective,
            nranks,
            chunks,
            input_chunks,
            output_chunks,
            in_place,
            ranks,
        }
    }

    /// Total number of steps over all ranks and streams.
    pub fn step_count(&self) -> usize {
        self.ranks
            .iter()
            .flat_map(|r| &r.streams)
            .map(|s| s.steps.len())
            .sum()
    }

    /// Highest channel index used plus one.
    pub fn channel_count(&self) -> u32 {
        self.ranks
            .iter()
            .flat_map(|r| &r.streams)
            .map(|s| s.channel + 1)
            .max()
            .unwrap_or(0)
    }

    /// Extent of `buf` on `rank`, in chunks.
    pub fn buffer_len(&self, rank: Rank, buf: Buf) -> u32 {
        match buf {
            Buf::Input => self.input_chunks,
            Buf::Output => self.output_chunks,
            Buf::Scratch => self
                .ranks
                .get(rank as usize)
                .map_or(0, |r| r.scratch_chunks),
        }
    }
}

impl Op {
    /// The same op with every peer rank mapped through `map`.
    pub fn map_peers(self, map: impl Fn(Rank) -> Rank) -> Op {
        self.map_ends(&map, &map)
    }

    /// The same op with the peer it receives from mapped through `from` and the one it
    /// sends to through `to`.
    pub fn map_ends(self, from: impl Fn(Rank) -> Rank, to: impl Fn(Rank) -> Rank) -> Op {
        match self {
            Op::Send { to: t, src } => Op::Send { to: to(t), src },
            Op::Recv { from: f, dst } => Op::Recv { from: from(f), dst },
            Op::RecvReduceCopy { from: f, src, dst } => Op::RecvReduceCopy {
                from: from(f),
                src,
                dst,
            },
            Op::RecvReduceSend {
                from: f,
                to: t,
                src,
            } => Op::RecvReduceSend {
                from: from(f),
                to: to(t),
                src,
            },
            Op::RecvReduceCopySend {
                from: f,
                to: t,
                src,
                dst,
            } => Op::RecvReduceCopySend {
                from: from(f),
                to: to(t),
                src,
                dst,
            },
            Op::RecvCopySend {
                from: f,
                to: t,
                dst,
            } => Op::RecvCopySend {
                from: from(f),
                to: to(t),
                dst,
            },
            Op::Copy { .. } | Op::Reduce { .. } | Op::Nop => self,
        }
    }

    /// The same op with its source location mapped through `src` and its destination
    /// through `dst`.
    pub fn map_locs(self, src: impl Fn(Loc) -> Loc, dst: impl Fn(Loc) -> Loc) -> Op {
        match self {
            Op::Send { to, src: s } => Op::Send { to, src: src(s) },
            Op::Recv { from, dst: d } => Op::Recv { from, dst: dst(d) },
            Op::RecvReduceCopy {
                from,
                src: s,
                dst: d,
            } => Op::RecvReduceCopy {
                from,
                src: src(s),
                dst: dst(d),
            },
            Op::RecvReduceSend { from, to, src: s } => Op::RecvReduceSend {
                from,
                to,
                src: src(s),
            },
            Op::RecvReduceCopySend {
                from,
                to,
                src: s,
                dst: d,
            } => Op::RecvReduceCopySend {
                from,
                to,
                src: src(s),
                dst: dst(d),
            },
            Op::RecvCopySend { from, to, dst: d } => Op::RecvCopySend {
                from,
                to,
                dst: dst(d),
            },
            Op::Copy { src: s, dst: d } => Op::Copy {
                src: src(s),
                dst: dst(d),
            },
            Op::Reduce { src: s, dst: d } => Op::Reduce {
                src: src(s),
                dst: dst(d),
            },
            Op::Nop => Op::Nop,
        }
    }
}

impl Schedule {
    /// The same Broadcast or Reduce for another root: ranks `root` and the current root swap
    /// programs (with every peer renamed), which is correct whenever the original is, since
    /// only the root's role depends on its number. `None` for collectives without a root.
    /// On a symmetric topology it is also as fast; elsewhere, compile for that root instead.
    pub fn with_root(&self, root: Rank) -> Option<Schedule> {
        let old = self.collective.root()?;
        if root >= self.nranks {
            return None;
        }
        let swap = |r: Rank| {
            if r == old {
                root
            } else if r == root {
                old
            } else {
                r
            }
        };
        let mut ranks = self.ranks.clone();
        ranks.swap(old as usize, root as usize);
        for program in &mut ranks {
            for stream in &mut program.streams {
                for step in &mut stream.steps {
                    step.op = step.op.map_peers(swap);
                }
            }
        }
        let collective = match self.collective {
            Collective::Broadcast { .. } => Collective::Broadcast { root },
            Collective::Reduce { .. } => Collective::Reduce { root },
            _ => return None,
        };
        Some(Schedule {
            collective,
            ranks,
            ..self.clone()
        })
    }
}

/// Where something is in a schedule: the unit every verifier and runtime error names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRef {
    pub rank: Rank,
    pub stream: u32,
    pub step: u32,
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} stream {} step {}",
            self.rank, self.stream, self.step
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_chunks_follow_msccl_conventions() {
        assert_eq!(Collective::AllReduce.buffer_chunks(8, 8), Some((8, 8)));
        assert_eq!(Collective::AllGather.buffer_chunks(8, 16), Some((2, 16)));
        assert_eq!(Collective::ReduceScatter.buffer_chunks(4, 8), Some((8, 2)));
        assert_eq!(Collective::AllToAll.buffer_chunks(4, 6), None);
        assert_eq!(Collective::AllGather.buffer_chunks(0, 6), None);
    }

    #[test]
    fn collective_names_round_trip() {
        for kind in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(
            CollectiveKind::from_name("reduce_scatter"),
            Some(CollectiveKind::ReduceScatter)
        );
        assert_eq!(CollectiveKind::from_name("gather"), None);
    }
}
