//! Where messages from other hosts land over TCP: per connection this rank receives on, a
//! ring of [`window`] slots in the rank's own memory, deeper than the shared region's
//! [`CONNECTION_SLOTS`], with each slot's checksum mark and sender's call.
//!
//! Why deeper: a sender may have `window` messages in flight before it hears of a freed
//! slot, so a connection keeps the path busy for a whole credit round trip (the receiving
//! engine reads the socket only when it waits, writes the credit with its next data), where
//! two slots of 256 KiB drained the path every few hundred microseconds. A deeper ring only
//! buffers more: a send still needs only a free slot, messages stay in order, and a
//! schedule proven deadlock-free with [`CONNECTION_SLOTS`] stays so.

use hccl_ir::CONNECTION_SLOTS;
use std::sync::atomic::AtomicU64;

/// Bytes a network connection may have in flight: `window` = this / slot size, within
/// [`CONNECTION_SLOTS`]..=[`MAX_WINDOW`]. Derived from the job's slot size, which rank 0
/// hands every rank, so both ends of a connection agree.
const WINDOW_BYTES: usize = 4 << 20;
/// Most slots of one inbox.
const MAX_WINDOW: usize = 32;

/// Messages a TCP connection to another host may have in flight for slots of `slot_bytes`.
pub(crate) fn window(slot_bytes: usize) -> usize {
    (WINDOW_BYTES / slot_bytes.max(1)).clamp(CONNECTION_SLOTS, MAX_WINDOW)
}

/// One incoming network connection's ring (see the module docs).
pub(crate) struct Inbox {
    data: *mut u8,
    layout: std::alloc::Layout,
    slot_bytes: usize,
    depth: usize,
    /// Per slot: the checksum mark ([`crate::arena::corrupt_mark`]) a part that failed its
    /// CRC32C leaves.
    crc: Box<[AtomicU64]>,
    /// Per slot: the sender's call (number, fingerprint), 0 when it sent none.
    call: Box<[(AtomicU64, AtomicU64)]>,
}

// SAFETY: the ring is plain memory; who may write a slot is decided by the credit window
// (the pump while a message is incoming, nobody once it is published until it is consumed),
// and publication goes through the shared region's Release/Acquire `sent` word.
unsafe impl Send for Inbox {}
// SAFETY: as above.
unsafe impl Sync for Inbox {}

impl Inbox {
    /// `depth` slots of `slot_bytes` (rounded up to whole cache lines), zeroed; the pages
    /// are taken only as messages land. Memory that cannot be had ends the process, as for
    /// any allocation (`handle_alloc_error`).
    pub(crate) fn new(depth: usize, slot_bytes: usize) -> Inbox {
        let depth = depth.max(1);
        let slot_bytes = slot_bytes.div_ceil(64).max(1) * 64;
        let Ok(layout) = std::alloc::Layout::from_size_align(depth.saturating_mul(slot_bytes), 64)
        else {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<u8>())
        };
        // SAFETY: the layout's size is not zero.
        let data = unsafe { std::alloc::alloc_zeroed(layout) };
        if data.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Inbox {
            data,
            layout,
            slot_bytes,
            depth,
            crc: (0..depth).map(|_| AtomicU64::new(0)).collect(),
            call: (0..depth)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    fn index(&self, seq: u64) -> usize {
        (seq % self.depth as u64) as usize
    }

    /// Start of the slot of message `seq` (`slot_bytes` long).
    pub(crate) fn slot(&self, seq: u64) -> *mut u8 {
        // SAFETY: the index is below `depth`, so the offset stays inside the allocation.
        unsafe { self.data.add(self.index(seq) * self.slot_bytes) }
    }

    /// The checksum mark word of message `seq`.
    pub(crate) fn crc(&self, seq: u64) -> &AtomicU64 {
        &self.crc[self.index(seq)]
    }

    /// The sender's call words (number, fingerprint) of message `seq`.
    pub(crate) fn peer_call(&self, seq: u64) -> (&AtomicU64, &AtomicU64) {
        let (n, w) = &self.call[self.index(seq)];
        (n, w)
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.data, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_holds_a_few_mib_within_bounds() {
        assert_eq!(window(256 * 1024), 16);
        assert_eq!(window(64), MAX_WINDOW);
        assert_eq!(window(64 << 20), CONNECTION_SLOTS);
    }

    #[test]
    fn slots_are_disjoint_and_wrap_with_the_depth() {
        let inbox = Inbox::new(4, 100);
        let base = inbox.slot(0) as usize;
        assert_eq!(base % 64, 0);
        assert_eq!(inbox.slot(1) as usize - base, 128);
        assert_eq!(inbox.slot(4), inbox.slot(0));
        assert!(std::ptr::eq(inbox.crc(5), inbox.crc(1)));
        assert!(!std::ptr::eq(inbox.peer_call(2).0, inbox.peer_call(3).0));
    }
}
