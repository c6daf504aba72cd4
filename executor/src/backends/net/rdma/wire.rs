//! The records the negotiation exchanges (the offer, the ready record) and the messages on
//! a queue pair (the TCP frame format, packed into receive buffers, placed into ring slots
//! on arrival): everything here works without a device.

use super::super::Wires;
use super::super::proto::{self, HEADER, Header, Inbound, Tag};
use crate::arena::Arena;
use crate::transport::Seg;
use hccl_ir::CONNECTION_SLOTS;
use std::io::Read;
use std::sync::atomic::Ordering;

/// Magic of an offer record.
pub(super) const OFFER_MAGIC: &[u8; 8] = b"HCCLRDMA";
/// Version of the offer and ready records.
pub(super) const OFFER_VERSION: u32 = 1;
/// Bytes of an offer record before its reason text.
pub(super) const OFFER_LEN: usize = 64;
/// Longest reason text an offer carries.
pub(super) const MAX_REASON: usize = 1024;
/// Magic of a ready record.
pub(super) const READY_MAGIC: &[u8; 8] = b"HCCLRDOK";
/// Bytes of a ready record.
pub(super) const READY_LEN: usize = 16;
/// Offer flag: the sender will use RDMA.
pub(super) const FLAG_WANTS: u32 = 1;
/// Offer flag: the endpoint has a GID (global routing).
pub(super) const FLAG_GID: u32 = 2;
/// Bytes of one segment-table entry.
pub(super) const ENTRY: usize = 8;
/// Table entries a receive buffer has room for besides a full slot.
pub(super) const TABLE_ROOM: usize = 64 * ENTRY;
/// Most payload bytes in one message (larger messages are split).
pub(super) const MAX_PAYLOAD: usize = 1 << 20;
/// Smallest receive buffer a peer may announce.
pub(super) const MIN_CAP: usize = HEADER + 64;
/// Largest receive buffer a peer may announce (what [`message_cap`] gives at most).
pub(super) const MAX_CAP: usize = (HEADER + MAX_PAYLOAD).div_ceil(64) * 64;

pub(super) fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

pub(super) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// What one rank tells a peer about its side of their pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Offer {
    pub(super) from: u32,
    pub(super) to: u32,
    /// The sender will use RDMA with this peer.
    pub(super) wants: bool,
    pub(super) qpn: u32,
    pub(super) lid: u16,
    pub(super) gid: Option<[u8; 16]>,
    pub(super) slot_bytes: u64,
    /// Largest message the sender receives.
    pub(super) cap: u32,
    /// Why the sender will not use RDMA (empty when it will).
    pub(super) reason: String,
}

impl Offer {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut reason = self.reason.as_str();
        if reason.len() > MAX_REASON {
            let mut end = MAX_REASON;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason = &reason[..end];
        }
        let mut b = vec![0u8; OFFER_LEN];
        b[0..8].copy_from_slice(OFFER_MAGIC);
        b[8..12].copy_from_slice(&OFFER_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.from.to_le_bytes());
        b[16..20].copy_from_slice(&self.to.to_le_bytes());
        let flags =
            (u32::from(self.wants) * FLAG_WANTS) | (u32::from(self.gid.is_some()) * FLAG_GID);
        b[20..24].copy_from_slice(&flags.to_le_bytes());
        b[24..28].copy_from_slice(&self.qpn.to_le_bytes());
        b[28..30].copy_from_slice(&self.lid.to_le_bytes());
        b[30..32].copy_from_slice(&(reason.len() as u16).to_le_bytes());
        b[32..48].copy_from_slice(&self.gid.unwrap_or_default());
        b[48..56].copy_from_slice(&self.slot_bytes.to_le_bytes());
        b[56..60].copy_from_slice(&self.cap.to_le_bytes());
        let check = fnv1a(&b[..60]);
        b[60..64].copy_from_slice(&check.to_le_bytes());
        b.extend_from_slice(reason.as_bytes());
        b
    }

    /// Decodes the fixed part; returns the offer (reason empty) and the reason's length.
    pub(super) fn decode_fixed(b: &[u8; OFFER_LEN]) -> Result<(Offer, usize), String> {
        if &b[0..8] != OFFER_MAGIC {
            return Err(
                "not a transport offer (was the peer built without the rdma feature?)".into(),
            );
        }
        let version = u32_at(b, 8);
        if version != OFFER_VERSION {
            return Err(format!(
                "transport offer version {version}, expected {OFFER_VERSION}"
            ));
        }
        if u32_at(b, 60) != fnv1a(&b[..60]) {
            return Err("transport offer with a wrong check word".into());
        }
        let flags = u32_at(b, 20);
        if flags & !(FLAG_WANTS | FLAG_GID) != 0 {
            return Err(format!("transport offer with unknown flags {flags:#x}"));
        }
        let wants = flags & FLAG_WANTS != 0;
        let has_gid = flags & FLAG_GID != 0;
        let qpn = u32_at(b, 24);
        let lid = u16::from_le_bytes([b[28], b[29]]);
        let reason_len = u16::from_le_bytes([b[30], b[31]]) as usize;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut slot = [0u8; 8];
        slot.copy_from_slice(&b[48..56]);
        let cap = u32_at(b, 56);
        if reason_len > MAX_REASON {
            return Err(format!("transport offer with a {reason_len}-byte reason"));
        }
        if wants {
            if qpn == 0 || qpn >= 1 << 24 {
                return Err(format!("transport offer with queue pair number {qpn}"));
            }
            if !(MIN_CAP..=MAX_CAP).contains(&(cap as usize)) {
                return Err(format!("transport offer with {cap}-byte receive buffers"));
            }
        } else if has_gid || qpn != 0 {
            return Err("transport offer without RDMA but with an endpoint".into());
        }
        Ok((
            Offer {
                from: u32_at(b, 12),
                to: u32_at(b, 16),
                wants,
                qpn,
                lid,
                gid: has_gid.then_some(gid),
                slot_bytes: u64::from_le_bytes(slot),
                cap,
                reason: String::new(),
            },
            reason_len,
        ))
    }

    /// Reads one offer (fixed part, then its reason).
    pub(super) fn read(r: &mut impl Read) -> Result<Offer, String> {
        let mut fixed = [0u8; OFFER_LEN];
        r.read_exact(&mut fixed).map_err(io_text)?;
        let (mut offer, len) = Offer::decode_fixed(&fixed)?;
        let mut reason = vec![0u8; len];
        r.read_exact(&mut reason).map_err(io_text)?;
        offer.reason = String::from_utf8_lossy(&reason).into_owned();
        Ok(offer)
    }
}

pub(super) fn encode_ready(ok: bool) -> [u8; READY_LEN] {
    let mut b = [0u8; READY_LEN];
    b[0..8].copy_from_slice(READY_MAGIC);
    b[8..12].copy_from_slice(&u32::from(ok).to_le_bytes());
    let check = fnv1a(&b[..12]);
    b[12..16].copy_from_slice(&check.to_le_bytes());
    b
}

pub(super) fn decode_ready(b: &[u8; READY_LEN]) -> Result<bool, String> {
    if &b[0..8] != READY_MAGIC {
        return Err("not a queue-pair ready record".into());
    }
    if u32_at(b, 12) != fnv1a(&b[..12]) {
        return Err("queue-pair ready record with a wrong check word".into());
    }
    match u32_at(b, 8) {
        0 => Ok(false),
        1 => Ok(true),
        s => Err(format!("queue-pair ready record with status {s}")),
    }
}

pub(super) fn io_text(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timed out".into(),
        std::io::ErrorKind::UnexpectedEof => "the connection closed".into(),
        _ => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------

/// Largest message a rank receives for slots of `slot_bytes`: a header, a full slot and a
/// table of 64 segments, at most [`MAX_PAYLOAD`] besides the header, rounded to 64 bytes.
pub(super) fn message_cap(slot_bytes: usize) -> usize {
    (HEADER + (slot_bytes + TABLE_ROOM).min(MAX_PAYLOAD)).div_ceil(64) * 64
}

/// Work-request id of receive buffer `b` of peer `p`.
pub(super) fn wr_id(p: usize, b: usize) -> u64 {
    ((p as u64) << 32) | b as u64
}

/// Peer and buffer of a work-request id.
pub(super) fn split_wr_id(id: u64) -> (usize, usize) {
    ((id >> 32) as usize, (id & 0xffff_ffff) as usize)
}

/// Splits a message's segments into parts whose table and payload fit `room` bytes each
/// (`room` > [`ENTRY`]), preserving order. Empty segments vanish; an empty message is one
/// empty part.
pub(super) fn pack(segs: &[Seg], room: usize) -> Vec<Vec<Seg>> {
    debug_assert!(room > ENTRY);
    let mut out: Vec<Vec<Seg>> = vec![Vec::new()];
    let mut used = 0usize;
    for s in segs {
        let mut done = 0usize;
        while done < s.len {
            if room - used <= ENTRY {
                out.push(Vec::new());
                used = 0;
            }
            let take = (room - used - ENTRY).min(s.len - done);
            if let Some(part) = out.last_mut() {
                part.push(Seg {
                    off: s.off + done,
                    ptr: s.ptr.wrapping_add(done),
                    len: take,
                });
            }
            used += ENTRY + take;
            done += take;
        }
    }
    out
}

/// Bytes of the message carrying `part`, with its sender's call when `call`.
pub(super) fn part_len(part: &[Seg], call: bool) -> usize {
    HEADER + part.iter().map(|s| ENTRY + s.len).sum::<usize>() + if call { CALL_TRAILER } else { 0 }
}

/// Bytes of the trailer carrying the sender's call (as on TCP, `proto::FLAG_CALL`).
pub(super) const CALL_TRAILER: usize = 16;

/// Writes the message for `part` of message `seq` (of `parts` parts) of connection `conn`
/// into `dst`, followed by the sender's `call` (number, fingerprint) when calls are
/// compared; returns its length.
///
/// # Safety
/// Every segment's `ptr` must be valid for reads of `len` bytes; `dst` must hold
/// [`part_len`] bytes.
pub(super) unsafe fn encode_part(
    dst: &mut [u8],
    conn: u32,
    seq: u64,
    parts: u32,
    part: &[Seg],
    call: Option<(u64, u64)>,
) -> usize {
    let mut h = Header::new(Tag::Data);
    if call.is_some() {
        h.flags = proto::FLAG_CALL;
    }
    h.conn = conn;
    h.seq = seq;
    h.a = parts;
    h.b = part.len() as u32;
    h.c = part.iter().map(|s| s.len).sum::<usize>() as u32;
    dst[..HEADER].copy_from_slice(&h.encode());
    let mut at = HEADER;
    for s in part {
        dst[at..at + 4].copy_from_slice(&(s.off as u32).to_le_bytes());
        dst[at + 4..at + 8].copy_from_slice(&(s.len as u32).to_le_bytes());
        at += ENTRY;
    }
    for s in part {
        // SAFETY: the caller guarantees `ptr` is readable for `len` bytes, and `dst` is a
        // distinct (registered) buffer.
        let src = unsafe { std::slice::from_raw_parts(s.ptr, s.len) };
        dst[at..at + s.len].copy_from_slice(src);
        at += s.len;
    }
    if call.is_some() {
        dst[at..at + CALL_TRAILER].copy_from_slice(&proto::call_trailer(call));
        at += CALL_TRAILER;
    }
    at
}

/// A received message, validated against the slot size.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Msg<'a> {
    Data {
        conn: u32,
        seq: u64,
        parts: u32,
        table: Vec<(u32, u32)>,
        payload: &'a [u8],
        /// The sender's call (number, fingerprint), when it compares calls.
        call: Option<(u64, u64)>,
    },
    Credit {
        conn: u32,
        consumed: u64,
    },
}

pub(super) fn decode_msg(bytes: &[u8], slot_bytes: usize) -> Result<Msg<'_>, String> {
    let head: &[u8; HEADER] = bytes
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| format!("a {}-byte message", bytes.len()))?;
    let h = Header::decode(head)?;
    match h.tag {
        Tag::Credit if bytes.len() == HEADER => Ok(Msg::Credit {
            conn: h.conn,
            consumed: h.seq,
        }),
        Tag::Credit => Err(format!("a credit of {} bytes", bytes.len())),
        Tag::Data => {
            if h.b > proto::MAX_SEGS {
                return Err(format!("{} segments", h.b));
            }
            if h.flags & !proto::FLAG_CALL != 0 {
                return Err(format!(
                    "flags {:#x}: RDMA messages carry no checksum trailer",
                    h.flags
                ));
            }
            let trailer = proto::trailer_len(h.flags);
            let want =
                HEADER as u64 + u64::from(h.b) * ENTRY as u64 + u64::from(h.c) + trailer as u64;
            if bytes.len() as u64 != want {
                return Err(format!(
                    "{} bytes, but its header announces {want} ({} segments, {} payload bytes, \
                     {trailer} trailer bytes)",
                    bytes.len(),
                    h.b,
                    h.c
                ));
            }
            let end = HEADER + h.b as usize * ENTRY;
            let table: Vec<(u32, u32)> = bytes[HEADER..end]
                .chunks_exact(ENTRY)
                .map(|e| (u32_at(e, 0), u32_at(e, 4)))
                .collect();
            proto::check_segments(&table, slot_bytes, h.c)?;
            let split = bytes.len() - trailer;
            let (_, call) = proto::read_trailer(h.flags, &bytes[split..]);
            Ok(Msg::Data {
                conn: h.conn,
                seq: h.seq,
                parts: h.a,
                table,
                payload: &bytes[end..split],
                call,
            })
        }
        t => Err(format!("a {t:?} frame, which travels on TCP")),
    }
}

/// Applies a message from peer `p` to this host's region: data lands in its slot and is
/// published like the TCP receiving thread does; a credit raises `consumed`.
pub(super) fn place(
    arena: &Arena,
    wires: &Wires,
    inbound: &[Option<Inbound>],
    slot_bytes: usize,
    p: usize,
    bytes: &[u8],
) -> Result<(), String> {
    match decode_msg(bytes, slot_bytes)? {
        Msg::Credit { conn, consumed } => {
            let Some(conn) = wires.outgoing(p, conn) else {
                return Err(format!(
                    "credit on channel {conn}, where this rank has no connection to it"
                ));
            };
            arena.consumed(conn).fetch_max(consumed, Ordering::AcqRel);
        }
        Msg::Data {
            conn,
            seq,
            parts,
            table,
            payload,
            call,
        } => {
            let Some(conn) = wires.incoming(p, conn) else {
                return Err(format!(
                    "data on channel {conn}, where it has no connection to this rank"
                ));
            };
            let c = conn as usize;
            let inb = inbound
                .get(c)
                .and_then(Option::as_ref)
                .ok_or_else(|| format!("no inbound state for connection {c}"))?;
            let consumed = arena.consumed(conn).load(Ordering::Acquire);
            inb.begin(seq, parts, u32::MAX, (consumed, CONNECTION_SLOTS))?;
            let slot = arena.slot(conn, seq);
            let mut at = 0usize;
            for (off, len) in table {
                let len = len as usize;
                // SAFETY: the credit window reserves this slot for message `seq` (the engine
                // finished with its previous message), the segment lies inside the slot and
                // the payload holds its bytes (both checked by `decode_msg`).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        payload[at..at + len].as_ptr(),
                        slot.add(off as usize),
                        len,
                    );
                }
                at += len;
            }
            // The receiving step compares the sender's call with its own (see
            // `Arena::peer_call`); without one, a word left by an earlier message must not
            // pass for this one's.
            let (num, word) = arena.peer_call(conn, seq);
            match call {
                Some((number, print)) => {
                    num.store(number, Ordering::Relaxed);
                    word.store(print, Ordering::Relaxed);
                }
                None => num.store(0, Ordering::Relaxed),
            }
            if let Some(published) = inb.end(seq) {
                arena.sent(conn).store(published, Ordering::Release);
            }
        }
    }
    Ok(())
}
