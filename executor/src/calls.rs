//! Call fingerprints: ranks whose calls differ (another collective, root, element type,
//! operator, count, or a schedule of the other placement) get an error naming both calls
//! instead of a hang or a wrong result.
//!
//! Every call a rank starts is numbered (its `seq`, from 1) and its fingerprint, packed in
//! one word ([`CallPrint::pack`]), travels with every message the rank sends: within a host
//! in the word of the message's slot beside `sent`, or after an LL message's flag (where
//! its receiver looks anyway, [`crate::arena`]); across hosts in every TCP or RDMA part's
//! trailer with the call's number. The receiving step compares it with its own call before
//! it reads the message, and on a difference fails with [`ExecError::CallMismatch`] and
//! raises the communicator's abort; every other rank then fails with the mismatch between
//! its own call and the reporter's or the culprit's (`crate::engine::abort_error`). So
//! ranks that exchange data never return wrong results as a success, whatever differs.
//!
//! The fingerprint is also published on the rank's line of the shared region
//! ([`crate::arena::Arena::call_slot`]) for its last [`crate::arena::HISTORY`] calls. A rank that waits
//! for a peer compares its call with that peer's call of the same number at each liveness
//! check (every 5 ms of waiting), so a mismatch that leaves ranks waiting without a message
//! (a rank that sends nothing, an empty call) fails within milliseconds rather than at the
//! timeout (`HCCL_CHECK_CALLS=waits`, the default, which includes the per-message check).
//! With `HCCL_CHECK_CALLS=1` a rank also compares with every peer that shows the same call
//! when its call ends, so even a rank that received nothing (a Broadcast's root) fails
//! before it returns. `HCCL_CHECK_CALLS=0` turns both off (messages then carry 0, which no
//! receiver compares).
//!
//! The CUDA backend runs every rank of a group in one process from one call (`CudaGroup`),
//! so its ranks cannot disagree on the call and it carries no fingerprint.
//!
//! The placement compared is the placement of the schedule a rank runs, not of its
//! buffers: ranks may pass their buffers in place or not as they like while they run the
//! same plan entry (the executor adapts each rank's buffers), but a rank that picks the
//! other placement's entry runs another schedule.
//!
//! A slot is a seqlock of two words: the writer clears the slot's call number, publishes
//! the fingerprint, then the number (Release); a reader takes the fingerprint only when it
//! read the same number before and after it.

use crate::arena::Arena;
use crate::dtype::{DataType, ReduceOp};
use crate::error::ExecError;
use hccl_ir::{Collective, CollectiveKind};
use std::sync::atomic::{Ordering, fence};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];
/// The kind code of an AllToAllv (the six collective kinds use 1 to 6).
const VARY_KIND: u64 = 7;
/// Largest root a fingerprint tells apart (larger ones compare equal to it).
const ROOT_MAX: u64 = (1 << 17) - 1;
/// Largest element count a fingerprint tells apart.
const COUNT_MAX: u64 = (1 << 36) - 1;

/// What a rank's call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallPrint {
    pub collective: Collective,
    /// An AllToAllv (`collective` is then AllToAll): blocks of their own sizes. Its count
    /// exchange has `count` 0 (and element type `u64`, whatever the call's: ranks that pass
    /// different types learn it from the exchange), its data phase the elements all ranks
    /// send together.
    pub vary: bool,
    pub dtype: DataType,
    /// [`ReduceOp::Sum`] for collectives that do not reduce.
    pub op: ReduceOp,
    /// Elements of the whole collective buffer.
    pub count: u64,
    /// Whether the plan entry the rank runs is the in-place schedule.
    pub in_place: bool,
}

impl CallPrint {
    /// One word, never 0: kind (3 bits, from 1; [`VARY_KIND`] for an AllToAllv), element
    /// type (4), operator (3), placement (1), root (17), count (36).
    pub(crate) fn pack(&self) -> u64 {
        let kind = self.collective.kind();
        let k = if self.vary {
            VARY_KIND
        } else {
            CollectiveKind::ALL
                .iter()
                .position(|&x| x == kind)
                .unwrap_or(0) as u64
                + 1
        };
        let d = DataType::ALL
            .iter()
            .position(|&x| x == self.dtype)
            .unwrap_or(0) as u64;
        let o = OPS.iter().position(|&x| x == self.op).unwrap_or(0) as u64;
        let root = u64::from(self.collective.root().unwrap_or(0)).min(ROOT_MAX);
        k | d << 3
            | o << 7
            | u64::from(self.in_place) << 10
            | root << 11
            | self.count.min(COUNT_MAX) << 28
    }

    /// The call [`CallPrint::pack`] packed (`None` for a word it cannot have written).
    pub(crate) fn unpack(w: u64) -> Option<CallPrint> {
        let vary = w & 7 == VARY_KIND;
        let kind = if vary {
            CollectiveKind::AllToAll
        } else {
            *CollectiveKind::ALL.get(((w & 7) as usize).checked_sub(1)?)?
        };
        let dtype = *DataType::ALL.get((w >> 3 & 15) as usize)?;
        let op = *OPS.get((w >> 7 & 7) as usize)?;
        let root = (w >> 11 & ROOT_MAX) as u32;
        let collective = match kind {
            CollectiveKind::Broadcast => Collective::Broadcast { root },
            CollectiveKind::Reduce => Collective::Reduce { root },
            CollectiveKind::AllReduce => Collective::AllReduce,
            CollectiveKind::AllGather => Collective::AllGather,
            CollectiveKind::ReduceScatter => Collective::ReduceScatter,
            CollectiveKind::AllToAll => Collective::AllToAll,
        };
        Some(CallPrint {
            collective,
            vary,
            dtype,
            op,
            count: w >> 28,
            in_place: w >> 10 & 1 == 1,
        })
    }
}

impl std::fmt::Display for CallPrint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.vary {
            if self.count == 0 {
                return f.write_str("alltoallv (its count exchange)");
            }
            write!(f, "alltoallv of {} {} in all", self.count, self.dtype)?;
            if self.count >= COUNT_MAX {
                f.write_str(" or more")?;
            }
            return Ok(());
        }
        write!(f, "{} of {} {}", self.collective, self.count, self.dtype)?;
        if self.count >= COUNT_MAX {
            f.write_str(" or more")?;
        }
        if self.collective.kind().reduces() {
            write!(f, " ({})", self.op)?;
        }
        f.write_str(if self.in_place {
            ", in-place schedule"
        } else {
            ", out-of-place schedule"
        })
    }
}

/// Publishes `rank`'s call `seq` with fingerprint `print`.
pub(crate) fn publish(arena: &Arena, rank: u32, seq: u64, print: u64) {
    let Some((num, word)) = arena.call_slot(rank as usize, seq) else {
        return;
    };
    num.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    word.store(print, Ordering::Relaxed);
    num.store(seq, Ordering::Release);
}

/// `peer`'s fingerprint of its call `seq`, if it has started that call and not yet
/// [`crate::arena::HISTORY`] more.
pub(crate) fn read(arena: &Arena, peer: u32, seq: u64) -> Option<u64> {
    let (num, word) = arena.call_slot(peer as usize, seq)?;
    if num.load(Ordering::Acquire) != seq {
        return None;
    }
    let print = word.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    (num.load(Ordering::Relaxed) == seq).then_some(print)
}

/// The error for `rank`'s call `seq` (`print`) if `peer` published a different call `seq`.
pub(crate) fn compare(
    arena: &Arena,
    rank: u32,
    peer: u32,
    seq: u64,
    print: u64,
) -> Option<ExecError> {
    let theirs = read(arena, peer, seq)?;
    (theirs != print).then(|| mismatch(rank, peer, seq, print, theirs))
}

/// The error for `rank`, whose call is `mine` (number, fingerprint), when a message of
/// `peer`'s call `theirs` reached it (a network message carries its sender's call).
pub(crate) fn mismatch_with(
    rank: u32,
    peer: u32,
    mine: (u64, u64),
    theirs: (u64, u64),
) -> ExecError {
    let mut e = mismatch(rank, peer, mine.0, mine.1, theirs.1);
    if let ExecError::CallMismatch { peer_call, .. } = &mut e
        && theirs.0 != mine.0
    {
        *peer_call = format!("{peer_call} (its call #{})", theirs.0);
    }
    e
}

fn mismatch(rank: u32, peer: u32, seq: u64, mine: u64, theirs: u64) -> ExecError {
    let show = |w: u64| CallPrint::unpack(w).map_or_else(|| format!("{w:#x}"), |c| c.to_string());
    ExecError::CallMismatch {
        rank,
        peer,
        seq,
        call: show(mine),
        peer_call: show(theirs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_tell_calls_apart() {
        let calls = [
            CallPrint {
                collective: Collective::AllReduce,
                vary: false,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                count: 100,
                in_place: false,
            },
            CallPrint {
                collective: Collective::Broadcast { root: 3 },
                vary: false,
                dtype: DataType::BF16,
                op: ReduceOp::Sum,
                count: 7,
                in_place: true,
            },
            CallPrint {
                collective: Collective::Reduce { root: 70_000 },
                vary: false,
                dtype: DataType::U64,
                op: ReduceOp::Avg,
                count: COUNT_MAX,
                in_place: false,
            },
        ];
        for c in calls {
            let w = c.pack();
            assert_ne!(w, 0);
            assert_eq!(CallPrint::unpack(w), Some(c));
        }
        let base = calls[0];
        let variants = [
            CallPrint { count: 101, ..base },
            CallPrint {
                dtype: DataType::I32,
                ..base
            },
            CallPrint {
                op: ReduceOp::Max,
                ..base
            },
            CallPrint {
                in_place: true,
                ..base
            },
            CallPrint {
                collective: Collective::AllGather,
                ..base
            },
        ];
        let a2a = CallPrint {
            collective: Collective::AllToAll,
            ..base
        };
        let a2av = CallPrint { vary: true, ..a2a };
        assert_ne!(a2a.pack(), a2av.pack());
        assert_eq!(CallPrint::unpack(a2av.pack()), Some(a2av));
        assert_eq!(a2av.to_string(), "alltoallv of 100 float in all");
        assert_eq!(
            CallPrint { count: 0, ..a2av }.to_string(),
            "alltoallv (its count exchange)"
        );
        for v in variants {
            assert_ne!(v.pack(), base.pack(), "{v}");
        }
        assert_eq!(
            calls[1].to_string(),
            "broadcast(root=3) of 7 bfloat16, in-place schedule"
        );
        assert_eq!(CallPrint::unpack(0), None);
    }
}
