//! What a lowering takes (the call's shape, how the devices are placed, an AllToAllv's
//! blocks) and what it gives (commands on memory spans, queue by queue).

use crate::backends::cuda::CudaError;
use crate::dtype::ReduceOp;
use hccl_ir::{Collective, CollectiveKind};

/// A device allocation of the group, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mem {
    /// Rank's send buffer (the caller's input of an out-of-place call).
    Send(u32),
    /// Rank's receive buffer (the caller's output; input too when in place).
    Recv(u32),
    /// Rank's scratch buffer.
    Scratch(u32),
    /// Rank's temporary copy of its input (placement adaptation).
    Temp(u32),
    /// Message staging area `i` of [`Lowered::staging`].
    Staging(u32),
}

/// A byte range of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub mem: Mem,
    /// Offset in bytes.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Span {
    pub(super) fn overlaps(&self, o: &Span) -> bool {
        self.mem == o.mem
            && self.len > 0
            && o.len > 0
            && self.off < o.off + o.len
            && o.off < self.off + self.len
    }

    /// Whether the two spans share a byte of the same allocation.
    pub fn overlaps_pub(&self, o: &Span) -> bool {
        self.overlaps(o)
    }

    pub(super) fn with_len(self, len: usize) -> Span {
        Span { len, ..self }
    }

    pub(super) fn at(self, off: usize) -> Span {
        Span {
            off: self.off + off,
            ..self
        }
    }
}

/// One device command. Queues are indices into [`Lowered::queues`], events into
/// `0..Lowered::events`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cmd {
    /// `queue` waits for the last issued record of `event`.
    Wait { queue: u32, event: u32 },
    /// `event` records the work issued to `queue` so far.
    Record { queue: u32, event: u32 },
    /// `dst ← src` (`dst.len == src.len`; the spans do not overlap).
    Copy { queue: u32, dst: Span, src: Span },
    /// `dst[i] ← a[i] ⊕ b[i]` elementwise (equal lengths; `dst` is either equal to one input
    /// or overlaps neither).
    Reduce {
        queue: u32,
        dst: Span,
        a: Span,
        b: Span,
    },
    /// `x[i] ← x[i] / nranks` (the finishing pass of [`ReduceOp::Avg`]).
    Divide { queue: u32, span: Span },
}

impl Cmd {
    /// The queue the command is issued to.
    pub fn queue(&self) -> u32 {
        match *self {
            Cmd::Wait { queue, .. }
            | Cmd::Record { queue, .. }
            | Cmd::Copy { queue, .. }
            | Cmd::Reduce { queue, .. }
            | Cmd::Divide { queue, .. } => queue,
        }
    }
}

/// Where a rank's plan streams run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    pub rank: u32,
    /// The IR stream (an extra queue for ranks without streams has index 0).
    pub stream: u32,
}

/// The sizes of one call, as the lowering needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape {
    pub collective: Collective,
    pub op: ReduceOp,
    /// Element size in bytes.
    pub esize: usize,
    /// `N`: elements of the whole collective buffer (nccl-tests "size" / element size).
    pub total: usize,
    pub in_place: bool,
}

impl CallShape {
    /// Whether the collective is cut into one block per rank.
    pub fn blocked(&self) -> bool {
        matches!(
            self.collective.kind(),
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll
        )
    }

    /// Elements of the caller's input and output buffers for `nranks` ranks.
    pub fn extents(&self, nranks: u32) -> (usize, usize) {
        let blk = self.total / nranks.max(1) as usize;
        match self.collective.kind() {
            CollectiveKind::AllGather => (blk, self.total),
            CollectiveKind::ReduceScatter => (self.total, blk),
            _ => (self.total, self.total),
        }
    }
}

/// A call lowered to device commands for every rank.
#[derive(Debug, Clone)]
pub struct Lowered {
    pub queues: Vec<Queue>,
    pub events: u32,
    /// Commands in issue order.
    pub cmds: Vec<Cmd>,
    /// Message staging areas: the rank whose device holds each, and its size in bytes.
    pub staging: Vec<(u32, usize)>,
    /// Bytes needed per rank: send, receive, scratch, temp buffers.
    pub send_bytes: usize,
    pub recv_bytes: usize,
    pub scratch_bytes: Vec<usize>,
    pub temp_bytes: usize,
    /// Messages that had to be staged because direct reads would have closed a cycle.
    pub staged_for_order: usize,
}

impl Lowered {
    /// Number of copy and reduce commands (what a replay launches).
    pub fn work_commands(&self) -> usize {
        self.cmds
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Cmd::Copy { .. } | Cmd::Reduce { .. } | Cmd::Divide { .. }
                )
            })
            .count()
    }
}

/// What the lowering needs to know about where ranks live.
pub trait Placement {
    /// Whether rank `reader`'s device can access rank `owner`'s memory directly (always true
    /// for ranks on the same device).
    fn direct(&self, reader: u32, owner: u32) -> bool;
}

/// Every rank on one device.
#[derive(Debug, Clone, Copy)]
pub struct OneDevice;

impl Placement for OneDevice {
    fn direct(&self, _reader: u32, _owner: u32) -> bool {
        true
    }
}

/// The blocks of an AllToAllv for every rank of a group, in elements: `send_counts[r][p]`
/// elements of rank `r`'s input from `send_displs[r][p]` go to rank `p`, and
/// `recv_counts[r][p]` elements from rank `p` land at `recv_displs[r][p]` of `r`'s output
/// (`MPI_Alltoallv`'s arguments, for all ranks at once).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockLayout {
    pub send_counts: Vec<Vec<usize>>,
    pub send_displs: Vec<Vec<usize>>,
    pub recv_counts: Vec<Vec<usize>>,
    pub recv_displs: Vec<Vec<usize>>,
}

impl BlockLayout {
    /// The layout where `counts[r][p]` elements go from rank `r` to rank `p`, every rank's
    /// blocks packed in rank order on both sides.
    pub fn packed(counts: Vec<Vec<usize>>) -> BlockLayout {
        let n = counts.len();
        let displs = |c: &[usize]| {
            c.iter()
                .scan(0usize, |at, &x| {
                    let d = *at;
                    *at = at.saturating_add(x);
                    Some(d)
                })
                .collect::<Vec<_>>()
        };
        let recv_counts: Vec<Vec<usize>> = (0..n)
            .map(|r| {
                (0..n)
                    .map(|p| counts[p].get(r).copied().unwrap_or(0))
                    .collect()
            })
            .collect();
        BlockLayout {
            send_displs: counts.iter().map(|c| displs(c)).collect(),
            recv_displs: recv_counts.iter().map(|c| displs(c)).collect(),
            send_counts: counts,
            recv_counts,
        }
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.send_counts.len()
    }

    /// The largest block of the call.
    pub fn largest(&self) -> usize {
        self.send_counts
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Elements rank `r`'s input must hold: the end of its last non-empty block.
    pub fn send_len(&self, r: usize) -> usize {
        extent(&self.send_counts[r], &self.send_displs[r])
    }

    /// Elements rank `r`'s output must hold.
    pub fn recv_len(&self, r: usize) -> usize {
        extent(&self.recv_counts[r], &self.recv_displs[r])
    }

    /// Checks the layout for `n` ranks: `n` counts and displacements per rank and side,
    /// blocks that do not overflow, output blocks that do not overlap, and every pair's
    /// two ends agreeing (what `r` sends `p` is what `p` receives from `r`).
    pub fn check(&self, n: usize) -> Result<(), CudaError> {
        let bad = |m: String| CudaError::Invalid(format!("alltoallv: {m}"));
        for (name, v) in [
            ("send counts", &self.send_counts),
            ("send displacements", &self.send_displs),
            ("receive counts", &self.recv_counts),
            ("receive displacements", &self.recv_displs),
        ] {
            if v.len() != n {
                return Err(bad(format!("{} ranks of {name} for {n} ranks", v.len())));
            }
            if let Some((r, row)) = v.iter().enumerate().find(|(_, row)| row.len() != n) {
                return Err(bad(format!(
                    "rank {r} has {} {name} for {n} ranks",
                    row.len()
                )));
            }
        }
        for r in 0..n {
            for (what, counts, displs) in [
                ("send", &self.send_counts[r], &self.send_displs[r]),
                ("receive", &self.recv_counts[r], &self.recv_displs[r]),
            ] {
                if let Some(p) = (0..n).find(|&p| counts[p].checked_add(displs[p]).is_none()) {
                    return Err(bad(format!(
                        "rank {r}'s {what} block for rank {p} overflows (displacement {}, count {})",
                        displs[p], counts[p]
                    )));
                }
            }
            let mut blocks: Vec<(usize, usize, usize)> = (0..n)
                .filter(|&p| self.recv_counts[r][p] > 0)
                .map(|p| {
                    let d = self.recv_displs[r][p];
                    (d, d + self.recv_counts[r][p], p)
                })
                .collect();
            blocks.sort_unstable();
            if let Some(w) = blocks.windows(2).find(|w| w[1].0 < w[0].1) {
                return Err(bad(format!(
                    "rank {r}'s receive blocks from ranks {} and {} overlap",
                    w[0].2, w[1].2
                )));
            }
            for p in 0..n {
                let (sent, taken) = (self.send_counts[r][p], self.recv_counts[p][r]);
                if sent != taken {
                    return Err(bad(format!(
                        "rank {r} sends {sent} elements to rank {p}, which receives {taken}"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn extent(counts: &[usize], displs: &[usize]) -> usize {
    counts
        .iter()
        .zip(displs)
        .filter(|(c, _)| **c > 0)
        .map(|(c, d)| c + d)
        .max()
        .unwrap_or(0)
}
