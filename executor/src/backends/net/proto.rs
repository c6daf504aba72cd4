//! The transport-independent half of the network protocol: frame headers, how a message is
//! split into parts, and how the receiving side reassembles parts into connection slots and
//! publishes them in order. TCP uses all of it; the RDMA transport reuses the splitting, the
//! credit window and the reassembly (only how bytes reach the remote slot differs).
//!
//! # Credits
//!
//! A network connection `(from, to, channel)` has a ring on both hosts: the sender's host
//! ring only counts (its `consumed` word is the last credit received), the receiver's ring
//! holds the data (over TCP a ring of `window` slots in the receiving rank's memory, see
//! `inbox`; over RDMA the connection's [`CONNECTION_SLOTS`] slots of the shared region).
//! Message `k` may be sent once `k < consumed + window`, that is when the receiver has
//! freed slot `k % window`; the receiver returns a credit (its new `consumed`) each time it
//! frees a slot. So an incoming part always has a free,
//! reserved slot to land in, the receiving thread never waits for the engine, and several
//! connections can share one socket without head-of-line blocking.

use crate::transport::Seg;
use hccl_ir::CONNECTION_SLOTS;
use std::sync::Mutex;

/// Bytes of a frame header.
pub(crate) const HEADER: usize = 32;
/// Most segments one data part may carry.
pub(crate) const MAX_SEGS: u32 = 1 << 16;
/// Parts smaller than this are not split further.
pub(crate) const MIN_PART: usize = 64 * 1024;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// One part of a message: `a` parts in all, `b` segments, `c` payload bytes; followed by
    /// `b` × (slot offset, length) as little-endian `u32` pairs and the payload.
    Data = 1,
    /// The receiver consumed `seq` messages of `conn`.
    Credit = 2,
    /// Nothing to say; proves the peer and the path are alive.
    Heartbeat = 3,
    /// Rank `a` aborted the communicator because of rank `b`.
    Abort = 4,
    /// The peer leaves the communicator normally.
    Goodbye = 5,
}

/// Flag of a [`Tag::Data`] header: the payload is followed by its CRC32C (little-endian
/// `u32`), which the receiver checks (`HCCL_CHECKSUM=1`).
pub(crate) const FLAG_CRC: u8 = 1;
/// Flag of a [`Tag::Data`] header: then follow the sender's call number and fingerprint
/// (two little-endian `u64`, see `crate::calls`), which the receiving step compares with its
/// own call (`HCCL_CHECK_CALLS` not `0`).
pub(crate) const FLAG_CALL: u8 = 2;

/// Bytes after a data part's payload for `flags`.
pub(crate) fn trailer_len(flags: u8) -> usize {
    (if flags & FLAG_CRC != 0 { 4 } else { 0 }) + (if flags & FLAG_CALL != 0 { 16 } else { 0 })
}

/// The longest trailer ([`trailer_len`] with every flag).
pub(crate) const MAX_TRAILER: usize = 20;

/// A data part's trailer (`bytes`: [`trailer_len`] of `flags` long): the payload's CRC32C
/// and the sender's call (number, fingerprint), each when its flag is set.
pub(crate) fn read_trailer(flags: u8, bytes: &[u8]) -> (Option<u32>, Option<(u64, u64)>) {
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let crc = (flags & FLAG_CRC != 0)
        .then(|| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
    let at = if crc.is_some() { 4 } else { 0 };
    let call = (flags & FLAG_CALL != 0).then(|| (word(at), word(at + 8)));
    (crc, call)
}

/// The bytes of the sender's call in a data part's trailer ([`FLAG_CALL`]): number, then
/// fingerprint, little-endian; zeros without a call.
pub(crate) fn call_trailer(call: Option<(u64, u64)>) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    if let Some((num, print)) = call {
        bytes[..8].copy_from_slice(&num.to_le_bytes());
        bytes[8..].copy_from_slice(&print.to_le_bytes());
    }
    bytes
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub tag: Tag,
    /// [`FLAG_CRC`], [`FLAG_CALL`] (data parts only).
    pub flags: u8,
    pub conn: u32,
    pub seq: u64,
    pub a: u32,
    pub b: u32,
    pub c: u32,
}

impl Header {
    pub(crate) fn new(tag: Tag) -> Header {
        Header {
            tag,
            flags: 0,
            conn: 0,
            seq: 0,
            a: 0,
            b: 0,
            c: 0,
        }
    }

    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut out = [0u8; HEADER];
        out[0..4].copy_from_slice(&(self.tag as u32 | u32::from(self.flags) << 8).to_le_bytes());
        out[4..8].copy_from_slice(&self.conn.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.a.to_le_bytes());
        out[20..24].copy_from_slice(&self.b.to_le_bytes());
        out[24..28].copy_from_slice(&self.c.to_le_bytes());
        out[28..32].copy_from_slice(&FRAME_CHECK.to_le_bytes());
        out
    }

    /// Decodes a header; `Err` says what is malformed.
    pub(crate) fn decode(b: &[u8; HEADER]) -> Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(28) != FRAME_CHECK {
            return Err("frame header without the frame check word".into());
        }
        let word = u32_at(0);
        let flags = (word >> 8) as u8;
        if word >> 16 != 0 || flags & !(FLAG_CRC | FLAG_CALL) != 0 {
            return Err(format!("frame tag word {word:#x} with unknown flags"));
        }
        let tag = match word & 0xff {
            1 => Tag::Data,
            2 => Tag::Credit,
            3 => Tag::Heartbeat,
            4 => Tag::Abort,
            5 => Tag::Goodbye,
            t => return Err(format!("unknown frame tag {t}")),
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[8..16]);
        if flags != 0 && tag != Tag::Data {
            return Err(format!("a {tag:?} frame with flags {flags:#x}"));
        }
        Ok(Header {
            tag,
            flags,
            conn: u32_at(4),
            seq: u64::from_le_bytes(seq),
            a: u32_at(16),
            b: u32_at(20),
            c: u32_at(24),
        })
    }
}

/// Last word of every header: catches a stream that lost its framing.
const FRAME_CHECK: u32 = 0x4846_524d; // "MRFH"

/// Splits the segments of a message into at most `max_parts` parts of nearly equal bytes
/// (none under [`MIN_PART`] unless the message is), preserving order. Empty segments vanish;
/// an empty message is one empty part.
pub(crate) fn split(segs: &[Seg], max_parts: usize) -> Vec<Vec<Seg>> {
    let total: usize = segs.iter().map(|s| s.len).sum();
    let parts = max_parts.clamp(1, (total / MIN_PART).max(1));
    let mut out: Vec<Vec<Seg>> = (0..parts).map(|_| Vec::new()).collect();
    let bound = |j: usize| (total as u128 * j as u128 / parts as u128) as usize;
    let mut pos = 0usize;
    let mut part = 0usize;
    for s in segs {
        let mut done = 0usize;
        while done < s.len {
            while pos >= bound(part + 1) && part + 1 < parts {
                part += 1;
            }
            let room = bound(part + 1) - pos;
            let take = room.min(s.len - done);
            out[part].push(Seg {
                off: s.off + done,
                ptr: s.ptr.wrapping_add(done),
                len: take,
            });
            done += take;
            pos += take;
        }
    }
    out
}

/// Validates a data part's segment table against the slot size; returns the payload bytes.
pub(crate) fn check_segments(
    table: &[(u32, u32)],
    slot_bytes: usize,
    payload: u32,
) -> Result<(), String> {
    let mut sum = 0u64;
    for &(off, len) in table {
        let end = u64::from(off) + u64::from(len);
        if end > slot_bytes as u64 {
            return Err(format!(
                "segment [{off}, {end}) outside the {slot_bytes}-byte slot"
            ));
        }
        sum += u64::from(len);
    }
    if sum != u64::from(payload) {
        return Err(format!(
            "segments hold {sum} bytes but the header announces {payload}"
        ));
    }
    Ok(())
}

/// Reassembly state of one incoming network connection.
#[derive(Debug)]
pub(crate) struct Inbound {
    state: Mutex<InState>,
}

impl Default for Inbound {
    /// For a window of [`CONNECTION_SLOTS`] messages.
    fn default() -> Inbound {
        Inbound::new(CONNECTION_SLOTS)
    }
}

#[derive(Debug, Default)]
struct InState {
    /// Messages completely received and published.
    published: u64,
    /// Per message of the window (`seq % len`): the message being assembled there (seq,
    /// parts expected, parts begun, parts done).
    slots: Vec<(u64, u32, u32, u32)>,
    /// Where the receiving step wants a message that has not begun to arrive (see
    /// [`Inbound::post`]).
    post: Option<Post>,
}

/// A receiving step's destinations for message `seq`: the bytes at `off..off + len` of the
/// message land at `ptr` instead of the slot (see [`Inbound::post`]).
#[derive(Debug)]
struct Post {
    seq: u64,
    ranges: Vec<Seg>,
    /// A part of the message has begun to land by it.
    claimed: bool,
}

impl Inbound {
    /// For windows of up to `depth` messages.
    pub(crate) fn new(depth: usize) -> Inbound {
        Inbound {
            state: Mutex::new(InState {
                published: 0,
                slots: vec![(0, 0, 0, 0); depth.max(1)],
                post: None,
            }),
        }
    }

    /// The step that will receive message `seq` copies it without reducing: its bytes at
    /// `off..off + len` of the message may land at `ptr` of each range (sorted by `off`,
    /// inside the slot) instead of the slot. Taken only while no part of the message has
    /// begun, so a message lands either all by the post or all in its slot. Whether it was
    /// taken.
    pub(crate) fn post(&self, seq: u64, ranges: Vec<Seg>) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let depth = st.slots.len() as u64;
        let (s, parts, _, _) = st.slots[(seq % depth) as usize];
        if seq < st.published || (s == seq && parts > 0) || st.post.is_some() {
            return false;
        }
        st.post = Some(Post {
            seq,
            ranges,
            claimed: false,
        });
        true
    }

    /// The post of message `seq` is withdrawn (its step runs now, the message published):
    /// whether the message landed by it; `None` when there was no such post.
    pub(crate) fn take_post(&self, seq: u64) -> Option<bool> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.post.take() {
            Some(p) if p.seq == seq => Some(p.claimed),
            other => {
                st.post = other;
                None
            }
        }
    }

    /// Withdraws any post (the call ends); whether there was one.
    pub(crate) fn revoke(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.post.take().is_some()
    }

    /// A part of message `seq` (of `parts` parts) is about to be written into its slot;
    /// `consumed` is how many messages the local receiver has freed, `window` how many past
    /// it may be in flight (at most the depth this was made for). Refuses parts outside the
    /// credit window or inconsistent with earlier parts of the same message. Returns the
    /// message's posted destinations ([`Inbound::post`]; empty: none).
    pub(crate) fn begin(
        &self,
        seq: u64,
        parts: u32,
        max_parts: u32,
        (consumed, window): (u64, usize),
    ) -> Result<Vec<Seg>, String> {
        if parts == 0 || parts > max_parts {
            return Err(format!(
                "message split into {parts} parts (at most {max_parts})"
            ));
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let depth = st.slots.len() as u64;
        let end = consumed.saturating_add((window as u64).min(depth));
        if seq < st.published || seq >= end {
            return Err(format!(
                "message {seq} outside the credit window [{}, {end})",
                st.published.max(consumed),
            ));
        }
        let slot = &mut st.slots[(seq % depth) as usize];
        if slot.1 == 0 {
            *slot = (seq, parts, 1, 0);
        } else if slot.0 == seq && slot.1 == parts && slot.2 < parts {
            slot.2 += 1;
        } else {
            return Err(format!(
                "part of message {seq} ({parts} parts) conflicts with message {} ({} parts) in its slot",
                slot.0, slot.1
            ));
        }
        Ok(match &mut st.post {
            Some(p) if p.seq == seq => {
                p.claimed = true;
                p.ranges.clone()
            }
            _ => Vec::new(),
        })
    }

    /// A part of message `seq` has been written; returns the new count of published
    /// messages when this completed one or more messages in order (the caller stores it in
    /// the ring's `sent` word with Release ordering), else `None`.
    pub(crate) fn end(&self, seq: u64) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let depth = st.slots.len() as u64;
        let i = (seq % depth) as usize;
        if st.slots[i].0 == seq && st.slots[i].1 > 0 {
            st.slots[i].3 += 1;
        }
        let before = st.published;
        loop {
            let i = (st.published % depth) as usize;
            let (s, want, _, done) = st.slots[i];
            if want > 0 && s == st.published && done == want {
                st.slots[i] = (0, 0, 0, 0);
                st.published += 1;
            } else {
                break;
            }
        }
        (st.published != before).then_some(st.published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(off: usize, len: usize) -> Seg {
        Seg {
            off,
            ptr: std::ptr::null::<u8>().wrapping_add(1000 + off),
            len,
        }
    }

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = Header {
            tag: Tag::Data,
            flags: FLAG_CRC | FLAG_CALL,
            conn: 7,
            seq: 1 << 40,
            a: 2,
            b: 3,
            c: 99,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("tag"));
        let mut bad = h.encode();
        bad[1] |= 0x80;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let mut bad = h.encode();
        bad[30] ^= 1;
        assert!(Header::decode(&bad).is_err());
        assert!(Header::decode(&[0xAB; HEADER]).is_err());
    }

    #[test]
    fn trailers_hold_what_their_flags_say() {
        let crc = 0xdead_beefu32.to_le_bytes();
        let call: Vec<u8> = 7u64
            .to_le_bytes()
            .into_iter()
            .chain(0x1234u64.to_le_bytes())
            .collect();
        let both: Vec<u8> = crc.iter().chain(&call).copied().collect();
        assert_eq!(trailer_len(FLAG_CRC | FLAG_CALL), MAX_TRAILER);
        assert_eq!(
            read_trailer(FLAG_CRC | FLAG_CALL, &both),
            (Some(0xdead_beef), Some((7, 0x1234)))
        );
        assert_eq!(read_trailer(FLAG_CRC, &crc), (Some(0xdead_beef), None));
        assert_eq!(read_trailer(FLAG_CALL, &call), (None, Some((7, 0x1234))));
        assert_eq!(read_trailer(0, &[]), (None, None));
    }

    #[test]
    fn split_keeps_every_byte_once_in_order() {
        for (lens, parts) in [
            (vec![1usize << 20], 4usize),
            (vec![3, 5, 1 << 18, 0, 7], 3),
            (vec![MIN_PART * 3 + 1, MIN_PART - 1], 8),
            (vec![10, 20], 4),
            (vec![], 2),
        ] {
            let mut segs = Vec::new();
            let mut off = 0;
            for l in &lens {
                segs.push(seg(off, *l));
                off += l + 64;
            }
            let out = split(&segs, parts);
            let total: usize = lens.iter().sum();
            assert!(!out.is_empty() && out.len() <= parts.max(1));
            assert!(
                out.len() == 1
                    || out
                        .iter()
                        .all(|p| p.iter().map(|s| s.len).sum::<usize>() >= MIN_PART)
            );
            // Flattened, the parts cover the same (offset, pointer) bytes in order.
            let flat: Vec<(usize, usize)> = out
                .iter()
                .flatten()
                .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
                .collect();
            let want: Vec<(usize, usize)> = segs
                .iter()
                .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
                .collect();
            assert_eq!(flat.len(), total);
            assert_eq!(flat, want);
        }
    }

    #[test]
    fn segment_tables_are_bounded_by_the_slot() {
        assert!(check_segments(&[(0, 64), (128, 64)], 256, 128).is_ok());
        assert!(check_segments(&[(200, 64)], 256, 64).is_err());
        assert!(check_segments(&[(u32::MAX, 2)], 256, 2).is_err());
        assert!(check_segments(&[(0, 64)], 256, 65).is_err());
    }

    #[test]
    fn reassembly_publishes_in_order_within_the_credit_window() {
        let inb = Inbound::default();
        // Two messages in flight, the second completes first.
        inb.begin(0, 2, 4, (0, 2)).unwrap();
        inb.begin(1, 1, 4, (0, 2)).unwrap();
        assert_eq!(inb.end(1), None);
        inb.begin(0, 2, 4, (0, 2)).unwrap();
        assert_eq!(inb.end(0), None);
        assert_eq!(inb.end(0), Some(2));
        // Message 2 needs slot 0 freed: consumed must have reached 1.
        assert!(inb.begin(2, 1, 4, (0, 2)).is_err());
        inb.begin(2, 1, 4, (1, 2)).unwrap();
        // A third part of a two-part message, a replayed message and a bad part count fail.
        assert!(inb.begin(1, 1, 4, (1, 2)).is_err());
        assert!(
            inb.begin(2, 1, 4, (1, 2)).is_err(),
            "a second begin of a one-part message"
        );
        assert!(inb.begin(3, 0, 4, (2, 2)).is_err());
        assert!(inb.begin(3, 5, 4, (2, 2)).is_err());
        inb.begin(3, 1, 4, (2, 2)).unwrap();
        assert!(inb.begin(3, 2, 4, (2, 2)).is_err());
        assert_eq!(inb.end(3), None);
        assert_eq!(inb.end(2), Some(4));
    }

    #[test]
    fn a_deeper_window_takes_more_messages_but_never_past_its_depth() {
        let inb = Inbound::new(4);
        for seq in 0..4 {
            inb.begin(seq, 1, 1, (0, 4)).unwrap();
        }
        assert!(inb.begin(4, 1, 1, (0, 4)).is_err(), "past the window");
        assert_eq!(inb.end(3), None);
        assert_eq!(inb.end(1), None);
        assert_eq!(inb.end(0), Some(2));
        assert_eq!(inb.end(2), Some(4));
        assert!(
            inb.begin(4, 1, 1, (1, 9)).is_ok(),
            "a window wider than the depth is cut"
        );
        assert!(inb.begin(5, 1, 1, (1, 9)).is_err());
        assert_eq!(inb.end(4), Some(5));
        // The same depth under a window of two refuses the third message in flight.
        let narrow = Inbound::new(4);
        narrow.begin(1, 1, 1, (0, 2)).unwrap();
        assert!(narrow.begin(2, 1, 1, (0, 2)).is_err());
    }

    #[test]
    fn a_post_is_taken_only_before_its_message_begins_and_withdrawn_once() {
        let inb = Inbound::new(4);
        let ranges = vec![seg(0, 8), seg(64, 8)];
        assert!(inb.post(0, ranges.clone()));
        assert!(!inb.post(1, ranges.clone()), "one post at a time");
        // Message 1 arrives first: no post applies to it.
        assert!(inb.begin(1, 1, 1, (0, 4)).unwrap().is_empty());
        assert_eq!(inb.end(1), None);
        // Both parts of message 0 land by the post.
        assert_eq!(inb.begin(0, 2, 2, (0, 4)).unwrap().len(), 2);
        assert_eq!(inb.begin(0, 2, 2, (0, 4)).unwrap().len(), 2);
        assert_eq!(inb.take_post(1), None, "another message's post stays");
        let _ = inb.end(0);
        assert_eq!(inb.end(0), Some(2));
        assert_eq!(inb.take_post(0), Some(true));
        assert_eq!(inb.take_post(0), None, "withdrawn once");
        // A message already arriving, or already published, takes no post.
        inb.begin(2, 2, 2, (2, 4)).unwrap();
        assert!(!inb.post(2, ranges.clone()));
        assert!(!inb.post(1, ranges.clone()));
        // A post never claimed is withdrawn unclaimed; a revoked one is gone.
        assert!(inb.post(3, ranges.clone()));
        assert_eq!(inb.take_post(3), Some(false));
        assert!(inb.post(3, ranges));
        assert!(inb.revoke());
        assert!(!inb.revoke());
        assert!(inb.begin(3, 1, 1, (2, 4)).unwrap().is_empty());
    }
}
