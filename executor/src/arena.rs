//! The shared region every backend exchanges data and signals through.
//!
//! Layout (all offsets multiples of 64 bytes, so every counter owns a cache line):
//!
//! ```text
//! header  : magic | abort word | per rank: { pid, gone, waiting on, calls } (one line each)
//! control : per connection: { sent, per slot: sender's call (line) | consumed (line) |
//!           slot descriptors (line) } (a descriptor: state, pointer, bytes, checksum)
//! data    : per connection: CONNECTION_SLOTS slots of `slot_bytes`
//! ll      : per connection: LL_SLOTS slots of
//!           { flag (8 bytes) | sender's call (8) | LL_BYTES of data | checksum }
//! ```
//!
//! Every message carries its sender's call fingerprint (`crate::calls`) where its receiver
//! looks anyway: a regular message's in the line of `sent` (the word of its slot), an LL
//! message's right after its flag. The receiver compares it with its own call before it reads
//! the data, so ranks whose calls differ fail on the first message instead of returning wrong
//! results.
//!
//! A connection is a single-producer single-consumer ring of [`CONNECTION_SLOTS`] message
//! slots. `sent` counts messages the sender published (written only by the sender) and
//! `consumed` those the receiver finished reading (written only by the receiver); message `k`
//! lives in slot `k % CONNECTION_SLOTS`. The sender may fill a slot when
//! `sent - consumed < CONNECTION_SLOTS` (Acquire on `consumed`), writes the data and
//! publishes with a Release store of `sent`; the receiver sees `sent > consumed` (Acquire),
//! reads and releases the slot with a Release store of `consumed`.
//!
//! In the threads backend a large single-chunk message may travel by pointer instead: the
//! slot descriptor says `POINTER` and holds the address and length of the sender's data, and
//! the receiver reads it in place (one copy instead of two). The sender then owes the
//! receiver that memory unchanged until `consumed` passes the message; before it writes
//! there itself, or when its call ends, it either sees the message consumed or
//! *materializes* it: it wins `POINTER → MATERIALIZING` by compare-and-swap, copies the data
//! into the slot and stores `INLINE`. A receiver wins `POINTER → READING` instead and the
//! sender then waits for its (bounded) read. Either way the IR's buffered-send semantics
//! hold exactly: a send never waits for its receiver.
//!
//! Entries of protocol LL (small messages) use the *LL slots* instead, NCCL's LL idea on
//! CPUs: the message's flag, its sender's call and its first 48 bytes share one cache line. The sender writes
//! the data after the flag word and then stores the flag (`seq + 1`, Release); the
//! receiver polls that flag (Acquire) and finds the data in the line the poll brought in.
//! A small message so costs its receiver one cache-line transfer instead of three (`sent`,
//! the descriptor, the data). The flag of message `k` lives at the start of LL slot
//! `k % LL_SLOTS`, a word only ever holding flags, and each slot's flags only grow, so a
//! stale flag never passes for a new one. `sent` is not advanced for LL messages (the next
//! regular message stores the full count), `consumed` is, as for any message; the LL ring
//! is [`LL_SLOTS`] deep, so a sender rereads `consumed` (a line the receiver owns) only
//! once every few messages. The threads backend keeps
//! the region on the heap, the process backend in a file in `/dev/shm` mapped by every rank.

use hccl_ir::CONNECTION_SLOTS;
use std::sync::atomic::AtomicU64;

const LINE: usize = 64;
/// Control bytes per connection: `sent`, `consumed`, slot descriptors (one line each).
const CTRL: usize = 3 * LINE;

/// Slot descriptor state: the data is in the slot.
pub(crate) const INLINE: u64 = 0;
/// The descriptor points at the sender's memory (threads backend, single copy).
pub(crate) const POINTER: u64 = 1;
/// The receiver is reading through the pointer.
pub(crate) const READING: u64 = 2;
/// The sender is copying the pointed-to data into the slot.
pub(crate) const MATERIALIZING: u64 = 3;
/// Depth of a connection's LL ring (the IR assumes [`CONNECTION_SLOTS`]; deeper only buffers
/// more).
pub const LL_SLOTS: usize = 8;
/// Data capacity of one LL slot: calls of LL entries run in segments that fit it.
pub const LL_BYTES: usize = 8192;
/// Offset of an LL slot's data: after its flag and its sender's call.
const LL_HEAD: usize = 16;
/// Bytes between LL slots: the flag and call words, the data, the checksum, rounded up to
/// whole lines.
const LL_STRIDE: usize = (LL_HEAD + LL_BYTES + 8).div_ceil(LINE) * LINE;

/// Bytes of one slot descriptor: state, pointer, bytes, checksum.
const DESC: usize = 32;
const _: () = assert!(
    CONNECTION_SLOTS * DESC <= LINE,
    "descriptors share one line"
);
const _: () = assert!(
    8 + CONNECTION_SLOTS * 8 <= LINE,
    "the senders' calls share the line of `sent`"
);

/// A checksum word's value for message `seq` whose bytes have CRC32C `crc`: the message's
/// number rides along, so a word left from an earlier message of the slot never passes.
#[inline]
pub(crate) fn seal(seq: u64, crc: u32) -> u64 {
    (seq << 32) ^ u64::from(crc) ^ (1 << 63)
}

/// The CRC32C a checksum word holds for message `seq` ([`seal`] undone); `None` when the
/// word holds no seal (its sender computed none).
#[inline]
pub(crate) fn sealed_crc(seq: u64, word: u64) -> Option<u32> {
    (word & (1 << 63) != 0).then_some((word ^ (1 << 63) ^ (seq << 32)) as u32)
}

/// The mark a network receiver leaves in the checksum word of message `seq` when a part of
/// it failed its check (see [`Arena::crc`]).
#[inline]
pub(crate) fn corrupt_mark(seq: u64) -> u64 {
    CORRUPT | (seq & !CORRUPT)
}

/// Bit of a [`corrupt_mark`].
pub(crate) const CORRUPT: u64 = 1 << 62;

/// Calls of each rank whose fingerprints stay readable (the call fingerprints of `calls.rs`):
/// the slots of [`Arena::call_slot`].
pub(crate) const HISTORY: u64 = 2;

/// Magic value at offset 0 (checked by ranks that map a region made by another).
pub(crate) const MAGIC: u64 = 0x4843_434c_4152_4e32; // "HCCLARN2"

/// Microseconds of the host's monotonic clock, truncated to 32 bits: the same clock in every
/// process of the host, so ranks can compare each other's [`wait_word`] stamps (ages are
/// taken with wrapping subtraction; a stamp older than 35 minutes reads as young again).
#[inline]
pub(crate) fn now_us() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000)
        .wrapping_add(ts.tv_nsec as u64 / 1000) as u32
}

/// A [`Arena::last_wait`] value: a wait that ended at `end` ([`now_us`]) after `len_us`
/// microseconds (kept in 4 µs units, at most 262 ms), charged to `culprit` (ranks from 65,535
/// on are not recorded).
#[inline]
pub(crate) fn wait_record(end: u32, len_us: u32, culprit: u32) -> u64 {
    let len = u64::from((len_us / 4).min(u32::from(u16::MAX)));
    let who = if culprit < u32::from(u16::MAX) {
        u64::from(culprit) + 1
    } else {
        0
    };
    (u64::from(end) << 32) | (len << 16) | who
}

/// A [`wait_record`] undone: `(end, len_us, culprit)`, `None` when it holds no wait.
#[inline]
pub(crate) fn read_wait_record(word: u64) -> Option<(u32, u32, u32)> {
    let who = (word & 0xffff) as u32;
    (who != 0).then(|| {
        (
            (word >> 32) as u32,
            ((word >> 16) & 0xffff) as u32 * 4,
            who - 1,
        )
    })
}

/// A [`Arena::waiting_on`] value: waiting for `peer` (bits 0–15, plus one; a peer from
/// 65,535 on is not published), said at `poll` ([`now_us`], its low 24 bits: bits 16–39),
/// after waiting `on_us` while running (in 64 µs units, bits 40–63): refreshed at every poll.
#[inline]
pub(crate) fn wait_word(peer: u32, poll: u32, on_us: u64) -> u64 {
    if peer >= u32::from(u16::MAX) {
        return 0;
    }
    (u64::from(peer) + 1)
        | (u64::from(poll & 0xff_ffff) << 16)
        | ((on_us / 64).min(0xff_ffff) << 40)
}

/// A [`wait_word`] undone, relative to `now` ([`now_us`]): the peer, how many microseconds
/// before `now` it last said so (a 24-bit stamp: 16.7 s wrap around), and how long it had
/// waited while running; `None` for "not waiting".
#[inline]
pub(crate) fn read_wait_word(word: u64, now: u32) -> Option<(u32, u32, u64)> {
    let low = (word & 0xffff) as u32;
    let poll = ((word >> 16) & 0xff_ffff) as u32;
    let age = now.wrapping_sub(poll) & 0xff_ffff;
    // A stamp a little after `now` (said after this rank read its clock) is fresh.
    let age = if age > 0x80_0000 { 0 } else { age };
    (low != 0).then(|| (low - 1, age, (word >> 40) * 64))
}

/// Offsets of everything in the region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub slot_bytes: usize,
    control: usize,
    data: usize,
    ll: usize,
    pub total: usize,
}

impl Layout {
    /// Computes the layout; `slot_bytes` is rounded up to a multiple of 64.
    pub(crate) fn new(nranks: usize, nconns: usize, slot_bytes: usize) -> Layout {
        let slot_bytes = slot_bytes.div_ceil(LINE).max(1) * LINE;
        let control = 2 * LINE + nranks * LINE;
        let data = control + nconns * CTRL;
        let ll = data + nconns * CONNECTION_SLOTS * slot_bytes;
        let total = ll + nconns * LL_SLOTS * LL_STRIDE;
        Layout {
            slot_bytes,
            control,
            data,
            ll,
            total,
        }
    }
}

/// A mapped region plus whatever keeps it alive.
pub(crate) struct Arena {
    base: *mut u8,
    pub layout: Layout,
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the region is only accessed through atomics and through the connection protocol
// above, which gives each byte a single writer at a time with Release/Acquire hand-over.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

/// Zeroed, 4096-aligned heap memory (the threads backend's region).
struct HeapRegion {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}
// SAFETY: plain memory, see Arena.
unsafe impl Send for HeapRegion {}
// SAFETY: plain memory, see Arena.
unsafe impl Sync for HeapRegion {}
impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `Arena::heap` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Touches every page of `[ptr, ptr + len)` so that no access during a collective takes a
/// page fault. A lazily mapped region (zero pages on first touch) made cross-core traffic up
/// to 5× slower on the development VM for the whole life of a job, in about half of the
/// process-backend launches (`hccl-perf`, 2 ranks, 32 KiB to 2 MiB), and never once the
/// pages were populated up front.
fn prefault(ptr: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    let mut off = 0;
    while off < len {
        // SAFETY: in bounds of the allocation; a volatile write of the zero already there.
        unsafe { ptr.add(off).write_volatile(0) };
        off += PAGE;
    }
}

impl Arena {
    /// A zeroed heap region for ranks that share an address space.
    pub(crate) fn heap(layout: Layout) -> Option<Arena> {
        let alloc_layout =
            std::alloc::Layout::from_size_align(layout.total.max(LINE), 4096).ok()?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(alloc_layout) };
        if ptr.is_null() {
            return None;
        }
        prefault(ptr, alloc_layout.size());
        let arena = Arena {
            base: ptr,
            layout,
            _owner: Box::new(HeapRegion {
                ptr,
                layout: alloc_layout,
            }),
        };
        arena
            .word(0)
            .store(MAGIC, std::sync::atomic::Ordering::Relaxed);
        Some(arena)
    }

    /// Wraps memory mapped elsewhere (the process backend).
    ///
    /// # Safety
    /// `base` must be valid for `layout.total` bytes, 64-aligned, zero-initialised or laid
    /// out by another rank, and stay mapped while `owner` lives.
    pub(crate) unsafe fn from_raw(
        base: *mut u8,
        layout: Layout,
        owner: Box<dyn Send + Sync>,
    ) -> Arena {
        Arena {
            base,
            layout,
            _owner: owner,
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.layout.total && off.is_multiple_of(8));
        // SAFETY: in bounds, aligned, and the region outlives &self.
        unsafe { &*(self.base.add(off).cast::<AtomicU64>()) }
    }

    /// Start and length of the whole region (for registering it with an RDMA device).
    #[allow(dead_code)]
    pub(crate) fn region(&self) -> (*mut u8, usize) {
        (self.base, self.layout.total)
    }

    /// Magic word.
    pub(crate) fn magic(&self) -> &AtomicU64 {
        self.word(0)
    }

    /// The abort word: 0, or `1 + (reporter << 32 | culprit)`.
    pub(crate) fn abort(&self) -> &AtomicU64 {
        self.word(LINE)
    }

    /// Process id of `rank` (process backend).
    pub(crate) fn pid(&self, rank: usize) -> &AtomicU64 {
        self.word(2 * LINE + rank * LINE)
    }

    /// Set when `rank` left (its communicator was dropped).
    pub(crate) fn gone(&self, rank: usize) -> &AtomicU64 {
        self.word(2 * LINE + rank * LINE + 8)
    }

    /// How many ranks the header has a line for.
    pub(crate) fn ranks(&self) -> usize {
        (self.layout.control - 2 * LINE) / LINE
    }

    /// The peer `rank` is waiting for in a call, when it last polled and how long it has
    /// waited while running ([`wait_word`]; 0: not waiting); refreshed at every poll while it
    /// backs off, so that a rank that times out can follow the chain of waits to the rank
    /// holding everyone up, and a rank whose wait for `rank` ends can tell whether `rank` was
    /// itself waiting meanwhile, and running ([`crate::waits`]).
    pub(crate) fn waiting_on(&self, rank: usize) -> &AtomicU64 {
        self.word(2 * LINE + rank * LINE + 16)
    }

    /// `rank`'s last finished timed wait ([`wait_record`]): when it ended, how long it
    /// lasted and the rank it was charged to; word 7 of the rank's line. `None` where the
    /// header has no line for `rank`.
    pub(crate) fn last_wait(&self, rank: usize) -> Option<&AtomicU64> {
        (rank < self.ranks()).then(|| self.word(2 * LINE + rank * LINE + 56))
    }

    /// The slot of `rank`'s call `seq` (its number and its fingerprint, see
    /// `calls.rs`): words 3 to 6 of the rank's line hold [`HISTORY`]
    /// such slots. `None` where the header has no line for `rank`.
    pub(crate) fn call_slot(&self, rank: usize, seq: u64) -> Option<(&AtomicU64, &AtomicU64)> {
        if rank >= self.ranks() {
            return None;
        }
        let at = 2 * LINE + rank * LINE + 24 + (seq % HISTORY) as usize * 16;
        Some((self.word(at), self.word(at + 8)))
    }

    /// Messages published on connection `c`.
    #[inline]
    pub(crate) fn sent(&self, c: u32) -> &AtomicU64 {
        self.word(self.layout.control + c as usize * CTRL)
    }

    /// The call fingerprint (`crate::calls::CallPrint::pack`) of the sender of regular
    /// message `seq` of connection `c` within this host, 0 when its sender compares no calls:
    /// written before the message is published, in the line of `sent`, which its receiver
    /// reads anyway.
    #[inline]
    pub(crate) fn sent_call(&self, c: u32, seq: u64) -> &AtomicU64 {
        self.word(
            self.layout.control
                + c as usize * CTRL
                + 8
                + (seq % CONNECTION_SLOTS as u64) as usize * 8,
        )
    }

    /// Messages consumed on connection `c`.
    #[inline]
    pub(crate) fn consumed(&self, c: u32) -> &AtomicU64 {
        self.word(self.layout.control + c as usize * CTRL + LINE)
    }

    /// Descriptor of slot `seq % CONNECTION_SLOTS` of connection `c`: state, pointer, bytes.
    #[inline]
    pub(crate) fn desc(&self, c: u32, seq: u64) -> (&AtomicU64, &AtomicU64, &AtomicU64) {
        let base = self.desc_offset(c, seq);
        (self.word(base), self.word(base + 8), self.word(base + 16))
    }

    /// The checksum word of slot `seq % CONNECTION_SLOTS` of connection `c` (the fourth word
    /// of its descriptor, `HCCL_CHECKSUM=1`): on a connection within this host the sender's
    /// CRC32C of the message ([`seal`]); on one from another host the network receiver's
    /// [`CORRUPT`] mark when a part failed its check.
    #[inline]
    pub(crate) fn crc(&self, c: u32, seq: u64) -> &AtomicU64 {
        self.word(self.desc_offset(c, seq) + 24)
    }

    #[inline]
    fn desc_offset(&self, c: u32, seq: u64) -> usize {
        self.layout.control
            + c as usize * CTRL
            + 2 * LINE
            + (seq % CONNECTION_SLOTS as u64) as usize * DESC
    }

    /// The sender's call number and fingerprint for message `seq` of connection `c`, on a
    /// connection from another host (its descriptor's pointer and length words, which only
    /// single copy within a host uses): written by the network receiver before it publishes
    /// the message, compared by the receiving step with its own call (`crate::calls`).
    #[inline]
    pub(crate) fn peer_call(&self, c: u32, seq: u64) -> (&AtomicU64, &AtomicU64) {
        let (_, num, print) = self.desc(c, seq);
        (num, print)
    }

    /// The checksum word of LL slot `seq % LL_SLOTS` of connection `c`, right after its data.
    #[inline]
    pub(crate) fn ll_crc(&self, c: u32, seq: u64) -> &AtomicU64 {
        self.word(self.ll_offset(c, seq) + LL_HEAD + LL_BYTES)
    }

    /// The sender's call fingerprint of LL message `seq` of connection `c` (as
    /// [`Arena::sent_call`]), in the line of its flag.
    #[inline]
    pub(crate) fn ll_call(&self, c: u32, seq: u64) -> &AtomicU64 {
        self.word(self.ll_offset(c, seq) + 8)
    }

    /// Start of slot `seq % CONNECTION_SLOTS` of connection `c`.
    #[inline]
    pub(crate) fn slot(&self, c: u32, seq: u64) -> *mut u8 {
        let idx = c as usize * CONNECTION_SLOTS + (seq % CONNECTION_SLOTS as u64) as usize;
        // SAFETY: in bounds of the region by the layout.
        unsafe {
            self.base
                .add(self.layout.data + idx * self.layout.slot_bytes)
        }
    }

    /// The flag word of LL slot `seq % LL_SLOTS` of connection `c`: `k + 1` once message `k`
    /// is written there.
    #[inline]
    pub(crate) fn ll_flag(&self, c: u32, seq: u64) -> &AtomicU64 {
        self.word(self.ll_offset(c, seq))
    }

    /// Start of the data of LL slot `seq % LL_SLOTS` of connection `c` (16-byte aligned,
    /// [`LL_BYTES`] long, right after the flag and call words in the same line).
    #[inline]
    pub(crate) fn ll_data(&self, c: u32, seq: u64) -> *mut u8 {
        // SAFETY: in bounds of the region by the layout.
        unsafe { self.base.add(self.ll_offset(c, seq) + LL_HEAD) }
    }

    #[inline]
    fn ll_offset(&self, c: u32, seq: u64) -> usize {
        let idx = c as usize * LL_SLOTS + (seq % LL_SLOTS as u64) as usize;
        self.layout.ll + idx * LL_STRIDE
    }
}
