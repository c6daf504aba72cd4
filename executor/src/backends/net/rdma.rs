//! RDMA transport (feature `rdma`): reliable-connected queue pairs through the `ibverbs`
//! crate, negotiated over the authenticated TCP connections.
//!
//! # Choosing the transport
//!
//! `Links::establish` runs inside `connect` once every peer's TCP sockets are
//! authenticated and before their receiving threads start, so socket 0 of each peer carries
//! the negotiation synchronously (with a read timeout, restored afterwards):
//!
//! 1. *Offer* (every rank built with `rdma`, whatever `HCCL_NET` says): a fixed 64-byte
//!    record — magic `HCCLRDMA`, version, sender and receiver rank, whether this rank will use
//!    RDMA, its queue pair's number, LID and GID, the slot size, the largest message it
//!    receives, a length-prefixed reason when it will not, and an FNV-1a check word. A rank
//!    offers RDMA when `HCCL_NET` is `ib` or unset and it could open the device
//!    `HCCL_IB_HCA` names (a name prefix, `=name` for an exact name, optionally `:1`; the
//!    `ibverbs` crate drives port 1 only), create its queue pairs and register its buffers.
//! 2. A pair of ranks uses RDMA when both offered it. Each side then moves its queue pair to
//!    ready-to-send with the other's endpoint, posts its receive buffers and sends a 16-byte
//!    *ready* record (magic `HCCLRDOK`, ok or failed, check word); the pair uses RDMA only if
//!    both said ok. Both sides see both records, so they always agree, and no data moves on a
//!    queue pair before both ends are ready.
//!
//! With `HCCL_NET=ib`, a pair that cannot use RDMA is an error naming the peer and why. With
//! `HCCL_NET` unset the pair falls back to TCP, logged in one INFO line; a job where some pairs
//! use RDMA and some TCP works (the TCP pairs use the socket framing of the parent module).
//! `HCCL_NET=socket` offers no RDMA, so the whole job uses TCP. A binary built without the
//! feature never negotiates, so every rank of a job must be built the same way.
//!
//! # Data path
//!
//! The `ibverbs` crate (0.9) offers two-sided operations only: `post_send` of a registered
//! buffer (`IBV_WR_SEND`, signaled) and `post_receive` into one; it neither registers foreign
//! memory such as the shared region nor posts RDMA writes with immediate data. So a message
//! is *sent*, in the TCP frame format of `proto`: a 32-byte `Header` (`Data`: parts,
//! segment count, payload bytes), the segment table (slot offset, length) and the payload.
//! The sender copies the engine's segments into a free buffer of a registered staging region
//! (`SEND_DEPTH` buffers per peer, each freed by its send completion, which the sender reaps
//! itself) and posts it; the receiver's poller thread (one per rank, polling one completion
//! queue shared by all its queue pairs) validates the message, copies each segment from its
//! registered receive buffer into the ring slot `(conn, seq)` of this host's region, and
//! publishes it exactly as a TCP receiving thread does: `Inbound::begin` / `Inbound::end`
//! and a Release store of the ring's `sent` word. Then it posts the buffer again. A credit is
//! a header-only `Credit` message; the poller stores it with `fetch_max` into the ring's
//! `consumed` word. The work-request id of a receive names the peer and the buffer.
//!
//! Shared with TCP: the frame header and the segment-table check, the reassembly state
//! (`Inbound`: in-order publication, refusal of parts outside the credit window or
//! inconsistent with earlier parts), and the credit window itself (message `k` is sent only
//! when slot `k % CONNECTION_SLOTS` is free at the receiver, so every message has a free,
//! reserved slot to land in and the poller never waits for the engine). Message splitting
//! differs only in its unit: TCP splits a message over sockets, RDMA splits it when it
//! would not fit the receiver's buffer (`pack`, at most 1 MiB of payload per message), and
//! both reassemble through `Inbound`.
//!
//! Queue pairs: RC, path MTU of the port, timeout 14 (67 ms), retry count 7, RNR retry 7
//! (infinite: a receive buffer is always posted again promptly, so "receiver not ready" is
//! transient), 8 send and up to 64 receive work requests. The receive depth per peer is
//! `CONNECTION_SLOTS` × (connections with that peer) plus slack, so credits and data normally
//! never wait for a buffer. GID routing uses a RoCE v2 GID holding an IPv4 address when the
//! port has one, else the port's first GID. Liveness, aborts and goodbyes stay on TCP (the
//! keeper thread and the socket receivers keep running); a work completion with an error
//! status marks the peer failed through `Inner::fail`. The poller spins, then yields, then
//! (idle for 2 ms) sleeps 20 µs between polls, or 200 µs once idle for 100 ms. On teardown
//! the sends still in flight get up to 1 s to complete before the queue pairs are destroyed.
//!
//! Compared with RDMA writes with immediate data into the registered shared region, this
//! costs one copy on the receiving side (receive buffer to slot) and twice the slot memory;
//! both go once the bindings can register foreign memory and post writes.
//!
//! # Without a device
//!
//! The wire formats, message packing, slot placement and credits are tested on any machine
//! (`tests` below), and so is the negotiation's fallback to TCP (two "hosts" on loopback);
//! the test that needs a device (a queue pair connected to itself) says it skipped.

use super::proto::{self, HEADER, Header, Inbound, Tag};
use super::{ALIVE, DEAD, Inner, Wires};
use crate::arena::Arena;
use crate::config::{NetConfig, NetKind};
use crate::transport::{Dir, Seg};
use hccl_ir::CONNECTION_SLOTS;
use ibverbs::{CompletionQueue, Context, Gid, GidEntry, MemoryRegion, ProtectionDomain, QueuePair};
use ibverbs::{PreparedQueuePair, QueuePairEndpoint, ibv_wc};
use std::io::{Read, Write};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Magic of an offer record.
const OFFER_MAGIC: &[u8; 8] = b"HCCLRDMA";
/// Version of the offer and ready records.
const OFFER_VERSION: u32 = 1;
/// Bytes of an offer record before its reason text.
const OFFER_LEN: usize = 64;
/// Longest reason text an offer carries.
const MAX_REASON: usize = 1024;
/// Magic of a ready record.
const READY_MAGIC: &[u8; 8] = b"HCCLRDOK";
/// Bytes of a ready record.
const READY_LEN: usize = 16;
/// Offer flag: the sender will use RDMA.
const FLAG_WANTS: u32 = 1;
/// Offer flag: the endpoint has a GID (global routing).
const FLAG_GID: u32 = 2;

/// Bytes of one segment-table entry.
const ENTRY: usize = 8;
/// Table entries a receive buffer has room for besides a full slot.
const TABLE_ROOM: usize = 64 * ENTRY;
/// Most payload bytes in one message (larger messages are split).
const MAX_PAYLOAD: usize = 1 << 20;
/// Smallest receive buffer a peer may announce.
const MIN_CAP: usize = HEADER + 64;
/// Largest receive buffer a peer may announce (what [`message_cap`] gives at most).
const MAX_CAP: usize = (HEADER + MAX_PAYLOAD).div_ceil(64) * 64;
/// Staging buffers (outstanding sends) per peer.
const SEND_DEPTH: usize = 8;
/// Bounds of the receive buffers posted per peer.
const RECV_DEPTH: (usize, usize) = (4, 64);
/// The port the `ibverbs` crate uses.
const PORT: u32 = 1;
/// `ibv_gid_type` values (not re-exported by the crate).
const GID_TYPE_IB: u32 = 0;
const GID_TYPE_ROCE_V2: u32 = 2;
/// How long teardown waits for sends still in flight.
const DRAIN: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------
// Device choice
// ---------------------------------------------------------------------------------------

/// What `HCCL_IB_HCA` asks for: a device name prefix (or exact name) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HcaSpec {
    name: Option<String>,
    exact: bool,
}

/// Parses `HCCL_IB_HCA` (`mlx5`, `mlx5_0:1`, `=mlx5_0`); only port 1 is drivable.
fn parse_hca(hca: Option<&str>) -> Result<HcaSpec, String> {
    let Some(raw) = hca.map(str::trim).filter(|h| !h.is_empty()) else {
        return Ok(HcaSpec {
            name: None,
            exact: false,
        });
    };
    let (exact, rest) = match raw.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, raw),
    };
    let (name, port) = match rest.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (rest, None),
    };
    if name.is_empty() || name.contains(',') || name.starts_with('^') {
        return Err(format!(
            "HCCL_IB_HCA={raw}: expected one device name or prefix, optionally =exact and :port"
        ));
    }
    if let Some(p) = port {
        match p.trim().parse::<u32>() {
            Ok(PORT) => {}
            Ok(n) => {
                return Err(format!(
                    "HCCL_IB_HCA={raw}: port {n}, but the ibverbs crate drives port {PORT} only"
                ));
            }
            Err(_) => return Err(format!("HCCL_IB_HCA={raw}: {p:?} is not a port number")),
        }
    }
    Ok(HcaSpec {
        name: Some(name.to_string()),
        exact,
    })
}

impl HcaSpec {
    fn matches(&self, dev: &str) -> bool {
        match &self.name {
            None => true,
            Some(n) if self.exact => dev == n,
            Some(n) => dev.starts_with(n.as_str()),
        }
    }
}

/// Finds the RDMA device `HCCL_IB_HCA` names (a name prefix, optionally `:port`), or the
/// first device; `Err` says why there is none.
pub fn probe(hca: Option<&str>) -> Result<String, String> {
    let spec = parse_hca(hca)?;
    let list = ibverbs::devices().map_err(|e| format!("no RDMA devices: {e}"))?;
    for dev in list.iter() {
        let name = dev
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if spec.matches(&name) {
            return Ok(name);
        }
    }
    Err(match hca {
        Some(h) => format!("no RDMA device matches HCCL_IB_HCA={h}"),
        None => "no RDMA devices".into(),
    })
}

/// Opens the device [`probe`] would choose.
fn open_device(hca: Option<&str>) -> Result<(String, Context), String> {
    let spec = parse_hca(hca)?;
    let list = ibverbs::devices().map_err(|e| format!("no RDMA devices: {e}"))?;
    let mut tried = Vec::new();
    for dev in list.iter() {
        let name = dev
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !spec.matches(&name) {
            continue;
        }
        match dev.open() {
            Ok(ctx) => return Ok((name, ctx)),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(match (hca, tried.is_empty()) {
        (_, false) => format!("no usable RDMA device ({})", tried.join("; ")),
        (Some(h), true) => format!("no RDMA device matches HCCL_IB_HCA={h}"),
        (None, true) => "no RDMA devices".into(),
    })
}

/// The 16 bytes of a GID, in network order.
fn gid_bytes(g: &Gid) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&g.subnet_prefix().to_be_bytes());
    out[8..].copy_from_slice(&g.interface_id().to_be_bytes());
    out
}

/// A GID from its 16 bytes.
fn gid_from(bytes: [u8; 16]) -> Gid {
    let mut g = Gid::default();
    // Writing a `Copy` field of the `ibv_gid` union is safe.
    g.as_mut().raw = bytes;
    g
}

/// The GID table index to route with: on port 1, a RoCE v2 GID holding an IPv4 address, else
/// any RoCE v2 GID, else an InfiniBand GID, else the first; `None` for an empty table. Only
/// entries whose index equals their position qualify (the crate indexes the table by it).
fn choose_gid(table: &[GidEntry]) -> Option<u32> {
    let usable: Vec<&GidEntry> = table
        .iter()
        .enumerate()
        .filter(|(i, e)| e.gid_index as usize == *i && e.port_num == PORT)
        .map(|(_, e)| e)
        .collect();
    let ipv4 = |e: &&GidEntry| e.gid.subnet_prefix() == 0 && e.gid.interface_id() >> 32 == 0xffff;
    let v2 = |e: &&GidEntry| e.gid_type == GID_TYPE_ROCE_V2;
    usable
        .iter()
        .find(|e| v2(e) && ipv4(e))
        .or_else(|| usable.iter().find(|e| v2(e)))
        .or_else(|| usable.iter().find(|e| e.gid_type == GID_TYPE_IB))
        .or_else(|| usable.first())
        .map(|e| e.gid_index)
}

// ---------------------------------------------------------------------------------------
// Negotiation records
// ---------------------------------------------------------------------------------------

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// What one rank tells a peer about its side of their pair.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Offer {
    from: u32,
    to: u32,
    /// The sender will use RDMA with this peer.
    wants: bool,
    qpn: u32,
    lid: u16,
    gid: Option<[u8; 16]>,
    slot_bytes: u64,
    /// Largest message the sender receives.
    cap: u32,
    /// Why the sender will not use RDMA (empty when it will).
    reason: String,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
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
    fn decode_fixed(b: &[u8; OFFER_LEN]) -> Result<(Offer, usize), String> {
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
    fn read(r: &mut impl Read) -> Result<Offer, String> {
        let mut fixed = [0u8; OFFER_LEN];
        r.read_exact(&mut fixed).map_err(io_text)?;
        let (mut offer, len) = Offer::decode_fixed(&fixed)?;
        let mut reason = vec![0u8; len];
        r.read_exact(&mut reason).map_err(io_text)?;
        offer.reason = String::from_utf8_lossy(&reason).into_owned();
        Ok(offer)
    }
}

fn encode_ready(ok: bool) -> [u8; READY_LEN] {
    let mut b = [0u8; READY_LEN];
    b[0..8].copy_from_slice(READY_MAGIC);
    b[8..12].copy_from_slice(&u32::from(ok).to_le_bytes());
    let check = fnv1a(&b[..12]);
    b[12..16].copy_from_slice(&check.to_le_bytes());
    b
}

fn decode_ready(b: &[u8; READY_LEN]) -> Result<bool, String> {
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

fn io_text(e: std::io::Error) -> String {
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
fn message_cap(slot_bytes: usize) -> usize {
    (HEADER + (slot_bytes + TABLE_ROOM).min(MAX_PAYLOAD)).div_ceil(64) * 64
}

/// Work-request id of receive buffer `b` of peer `p`.
fn wr_id(p: usize, b: usize) -> u64 {
    ((p as u64) << 32) | b as u64
}

/// Peer and buffer of a work-request id.
fn split_wr_id(id: u64) -> (usize, usize) {
    ((id >> 32) as usize, (id & 0xffff_ffff) as usize)
}

/// Splits a message's segments into parts whose table and payload fit `room` bytes each
/// (`room` > [`ENTRY`]), preserving order. Empty segments vanish; an empty message is one
/// empty part.
fn pack(segs: &[Seg], room: usize) -> Vec<Vec<Seg>> {
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
fn part_len(part: &[Seg], call: bool) -> usize {
    HEADER + part.iter().map(|s| ENTRY + s.len).sum::<usize>() + if call { CALL_TRAILER } else { 0 }
}

/// Bytes of the trailer carrying the sender's call (as on TCP, `proto::FLAG_CALL`).
const CALL_TRAILER: usize = 16;

/// Writes the message for `part` of message `seq` (of `parts` parts) of connection `conn`
/// into `dst`, followed by the sender's `call` (number, fingerprint) when calls are
/// compared; returns its length.
///
/// # Safety
/// Every segment's `ptr` must be valid for reads of `len` bytes; `dst` must hold
/// [`part_len`] bytes.
unsafe fn encode_part(
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
enum Msg<'a> {
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

fn decode_msg(bytes: &[u8], slot_bytes: usize) -> Result<Msg<'_>, String> {
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
fn place(
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
            inb.begin(seq, parts, u32::MAX, consumed)?;
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

// ---------------------------------------------------------------------------------------
// Verbs resources
// ---------------------------------------------------------------------------------------

/// A heap value whose address never changes, so resources created from it may borrow it for
/// `'static`; whoever holds such borrowers drops them first (field order below).
struct Owned<T>(NonNull<T>);

// SAFETY: an owning pointer, like `Box<T>`.
unsafe impl<T: Send + Sync> Send for Owned<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Owned<T> {}

impl<T> Owned<T> {
    fn new(v: T) -> Owned<T> {
        Owned(NonNull::from(Box::leak(Box::new(v))))
    }

    /// A borrow for `'static`.
    ///
    /// # Safety
    /// Everything holding the borrow must be dropped before this `Owned`.
    unsafe fn get(&self) -> &'static T {
        // SAFETY: valid until `drop`, which the caller orders after every borrower.
        unsafe { &*self.0.as_ptr() }
    }
}

impl<T> std::ops::Deref for Owned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: valid while `self` lives.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::leak` in `new`, dropped once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sender state of one queue pair.
struct Tx {
    staging: MemoryRegion<u8>,
    stride: usize,
    free: Vec<usize>,
    busy: usize,
    failed: Option<String>,
}

/// The queue pair to one peer (fields in drop order: the queue pair before its queues).
struct Link {
    qp: Mutex<QueuePair<'static>>,
    tx: Mutex<Tx>,
    rx: Mutex<MemoryRegion<u8>>,
    send_cq: Owned<CompletionQueue<'static>>,
    rx_stride: usize,
    /// Largest message the peer receives.
    peer_cap: usize,
    /// A receive failed; nothing more is accepted from this peer.
    broken: AtomicBool,
}

/// A queue pair before the handshake, with its buffers (drop order as in [`Link`]).
struct Prepared {
    pqp: PreparedQueuePair<'static>,
    rx: MemoryRegion<u8>,
    send_cq: Owned<CompletionQueue<'static>>,
    rx_depth: usize,
}

/// One rank's device resources (drop order: queue pairs, then queues, domain, context).
struct Verbs {
    links: Vec<Option<Link>>,
    recv_cq: Owned<CompletionQueue<'static>>,
    _pd: Owned<ProtectionDomain<'static>>,
    _ctx: Owned<Context>,
}

/// Device resources while negotiating.
struct Local {
    device: String,
    prepared: Vec<Option<Prepared>>,
    recv_cq: Owned<CompletionQueue<'static>>,
    pd: Owned<ProtectionDomain<'static>>,
    ctx: Owned<Context>,
}

fn status_text(status: u32) -> &'static str {
    match status {
        1 => "local length error",
        2 => "local QP operation error",
        4 => "local protection error",
        5 => "work request flushed",
        8 => "local access error",
        9 => "remote invalid request",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "transport retry counter exceeded",
        13 => "RNR retry counter exceeded",
        19 => "fatal error",
        20 => "response timeout",
        _ => "error",
    }
}

impl Local {
    /// Opens the device and prepares a queue pair and receive buffers per peer.
    fn open(inner: &Inner, cfg: &NetConfig, cap: usize) -> Result<Local, String> {
        let (device, context) = open_device(cfg.ib_hca.as_deref())?;
        let gid_index = choose_gid(context.gid_table());
        let ctx = Owned::new(context);
        // SAFETY (all `get` calls below): `Local`, and the `Verbs` it becomes, drop the
        // queue pairs and buffers before the queues, the domain and the context.
        let c = unsafe { ctx.get() };
        let pd = Owned::new(
            c.alloc_pd()
                .map_err(|e| format!("{device}: allocating a protection domain: {e}"))?,
        );
        let depths: Vec<usize> = (0..inner.peers.len())
            .map(|p| {
                let conns = inner
                    .dirs
                    .iter()
                    .filter(|d| matches!(d, Dir::In(q) | Dir::Out(q) if *q as usize == p))
                    .count();
                (CONNECTION_SLOTS * conns + 4).clamp(RECV_DEPTH.0, RECV_DEPTH.1)
            })
            .collect();
        let total: usize = depths.iter().sum();
        let recv_cq =
            Owned::new(c.create_cq(total as i32, 0).map_err(|e| {
                format!("{device}: creating a {total}-entry completion queue: {e}")
            })?);
        let mut prepared = Vec::with_capacity(depths.len());
        for depth in depths {
            let send_cq = Owned::new(
                c.create_cq(SEND_DEPTH as i32, 0)
                    .map_err(|e| format!("{device}: creating a completion queue: {e}"))?,
            );
            let pdr = unsafe { pd.get() };
            let mut builder = pdr.create_qp(
                unsafe { send_cq.get() },
                unsafe { recv_cq.get() },
                ibverbs::ibv_qp_type::IBV_QPT_RC,
            );
            builder
                .set_max_send_wr(SEND_DEPTH as u32)
                .set_max_recv_wr(depth as u32)
                .set_timeout(14)
                .set_retry_count(7)
                .set_rnr_retry(7)
                .set_min_rnr_timer(12);
            if let Some(g) = gid_index {
                builder.set_gid_index(g);
            }
            let pqp = builder
                .build()
                .map_err(|e| format!("{device}: creating a queue pair: {e}"))?;
            let rx = pdr
                .allocate::<u8>(depth * cap)
                .map_err(|e| format!("{device}: registering {} receive bytes: {e}", depth * cap))?;
            prepared.push(Some(Prepared {
                pqp,
                rx,
                send_cq,
                rx_depth: depth,
            }));
        }
        Ok(Local {
            device,
            prepared,
            recv_cq,
            pd,
            ctx,
        })
    }
}

impl Link {
    /// Handshakes, registers the staging buffers and posts every receive buffer.
    fn connect(
        pd: &ProtectionDomain<'static>,
        prep: Prepared,
        p: usize,
        peer: &Offer,
        cap: usize,
    ) -> Result<Link, String> {
        let remote = QueuePairEndpoint {
            num: peer.qpn,
            lid: peer.lid,
            gid: peer.gid.map(gid_from),
        };
        let Prepared {
            pqp,
            mut rx,
            send_cq,
            rx_depth,
        } = prep;
        let mut qp = pqp
            .handshake(remote)
            .map_err(|e| format!("connecting the queue pair: {e}"))?;
        let peer_cap = peer.cap as usize;
        let staging = pd
            .allocate::<u8>(SEND_DEPTH * peer_cap)
            .map_err(|e| format!("registering {} staging bytes: {e}", SEND_DEPTH * peer_cap))?;
        for b in 0..rx_depth {
            // SAFETY: buffer `b` is not touched until its completion arrives (poller).
            unsafe { qp.post_receive(&mut rx, b * cap..(b + 1) * cap, wr_id(p, b)) }
                .map_err(|e| format!("posting receive buffers: {e}"))?;
        }
        Ok(Link {
            qp: Mutex::new(qp),
            tx: Mutex::new(Tx {
                staging,
                stride: peer_cap,
                free: (0..SEND_DEPTH).rev().collect(),
                busy: 0,
                failed: None,
            }),
            rx: Mutex::new(rx),
            send_cq,
            rx_stride: cap,
            peer_cap,
            broken: AtomicBool::new(false),
        })
    }

    /// Frees the staging buffers whose sends completed; `Err` once a send failed.
    fn reap(&self, tx: &mut Tx) -> Result<(), String> {
        let mut wcs = [ibv_wc::default(); SEND_DEPTH];
        loop {
            let done = self
                .send_cq
                .poll(&mut wcs)
                .map_err(|e| format!("polling the send completion queue: {e}"))?;
            for wc in done.iter() {
                let i = wc.wr_id() as usize;
                if i < SEND_DEPTH && tx.busy > 0 {
                    tx.free.push(i);
                    tx.busy -= 1;
                }
                if let Some((status, vendor)) = wc.error()
                    && tx.failed.is_none()
                {
                    tx.failed = Some(format!(
                        "send completed with status {status} ({}, vendor error {vendor:#x})",
                        status_text(status)
                    ));
                }
            }
            if done.len() < wcs.len() {
                break;
            }
        }
        match &tx.failed {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// Sends one message of `len` bytes that `fill` writes into a staging buffer.
    fn post(
        &self,
        inner: &Inner,
        p: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> std::io::Result<()> {
        let mut tx = lock(&self.tx);
        let other = |why: String| std::io::Error::other(why);
        if len > tx.stride {
            return Err(other(format!(
                "a {len}-byte message exceeds the peer's {}-byte buffers",
                tx.stride
            )));
        }
        let limit = (inner.silence * 4).max(Duration::from_secs(10));
        let start = Instant::now();
        let mut polls = 0u32;
        let i = loop {
            self.reap(&mut tx).map_err(other)?;
            if let Some(i) = tx.free.pop() {
                break i;
            }
            if inner.peers[p].state.load(Ordering::Acquire) == DEAD {
                return Err(other("the peer failed".into()));
            }
            if start.elapsed() > limit {
                return Err(other(format!("no send completed for {limit:?}")));
            }
            polls += 1;
            if polls < 256 {
                std::hint::spin_loop();
            } else if start.elapsed() < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        };
        let at = i * tx.stride;
        let n = fill(&mut tx.staging[at..at + len]);
        debug_assert_eq!(n, len);
        let tx = &mut *tx;
        let mut qp = lock(&self.qp);
        // SAFETY: staging buffer `i` is not written again before `reap` sees its completion.
        match unsafe { qp.post_send(&mut tx.staging, at..at + len, i as u64) } {
            Ok(()) => {
                tx.busy += 1;
                Ok(())
            }
            Err(e) => {
                tx.free.push(i);
                Err(e)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Links
// ---------------------------------------------------------------------------------------

/// Queue pairs to the peers of a rank (`None` per peer: that pair uses TCP), and the poller
/// thread that receives from all of them.
pub(crate) struct Links {
    verbs: Arc<Verbs>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

/// Clears the negotiation's read timeouts on socket 0 of every peer.
struct RestoreTimeouts<'a>(&'a Inner);

impl Drop for RestoreTimeouts<'_> {
    fn drop(&mut self) {
        for peer in &self.0.peers {
            let _ = peer.socks[0].read.set_read_timeout(None);
        }
    }
}

impl Links {
    /// Chooses the transport with every peer (see the module docs): `Ok(None)` means TCP
    /// with all of them.
    pub(super) fn establish(inner: &Arc<Inner>, cfg: &NetConfig) -> Result<Option<Links>, String> {
        let me = inner.me;
        let cap = message_cap(inner.slot_bytes);
        let mut local = match cfg.kind {
            NetKind::Socket => Err("HCCL_NET=socket".to_string()),
            NetKind::Auto | NetKind::Ib => Local::open(inner, cfg, cap),
        };
        let who = |p: usize| who(inner, p);
        // Round 1: offers.
        send_offers(inner, &local, cap)?;
        if cfg.kind == NetKind::Ib
            && let Err(why) = &local
        {
            return Err(format!("HCCL_NET=ib: {why}"));
        }
        let wait = (inner.silence * 3).max(Duration::from_secs(5));
        let restore = RestoreTimeouts(inner);
        for peer in &inner.peers {
            let _ = peer.socks[0].read.set_read_timeout(Some(wait));
        }
        let offers = read_offers(inner)?;
        // Pairs where both offered RDMA connect their queue pairs; round 2 says who is ready.
        let (mut links, mut why_tcp) = connect_pairs(inner, &mut local, &offers, cap);
        exchange_ready(inner, &offers, local.is_ok(), &mut links, &mut why_tcp)?;
        drop(restore);
        let tcp: Vec<usize> = (0..links.len()).filter(|&p| links[p].is_none()).collect();
        if cfg.kind == NetKind::Ib
            && let Some(&p) = tcp.first()
        {
            let why = why_tcp[p].clone().unwrap_or_default();
            return Err(format!("HCCL_NET=ib: no RDMA with {}: {why}", who(p)));
        }
        let Ok(local) = local else {
            if cfg.kind == NetKind::Auto
                && let Some(Some(why)) = why_tcp.first()
            {
                tracing::info!(rank = me, "no RDMA ({why}); using TCP");
            }
            return Ok(None);
        };
        if tcp.len() == links.len() {
            let why = why_tcp.iter().flatten().next().cloned().unwrap_or_default();
            tracing::info!(rank = me, device = %local.device, "no RDMA with any peer ({why}); using TCP");
            return Ok(None);
        }
        let rdma_ranks: Vec<u32> = (0..links.len())
            .filter(|&p| links[p].is_some())
            .map(|p| inner.peers[p].rank)
            .collect();
        if tcp.is_empty() {
            tracing::info!(rank = me, device = %local.device, peers = ?rdma_ranks, "RDMA transport ready");
        } else {
            let tcp_ranks: Vec<u32> = tcp.iter().map(|&p| inner.peers[p].rank).collect();
            let why = why_tcp[tcp[0]].clone().unwrap_or_default();
            tracing::info!(
                rank = me,
                device = %local.device,
                rdma = ?rdma_ranks,
                tcp = ?tcp_ranks,
                "RDMA with some peers; TCP with the others ({why})"
            );
        }
        let Local {
            device: _,
            prepared,
            recv_cq,
            pd,
            ctx,
        } = local;
        drop(prepared);
        let verbs = Arc::new(Verbs {
            links,
            recv_cq,
            _pd: pd,
            _ctx: ctx,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (verbs, inner, stop) = (Arc::clone(&verbs), Arc::clone(inner), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("hccl-ib{me}"))
                .spawn(move || {
                    crate::affinity::unbind_current_thread();
                    poll_loop(&verbs, &inner, &stop);
                })
                .map_err(|e| format!("starting the RDMA poller thread: {e}"))?
        };
        Ok(Some(Links {
            verbs,
            stop,
            poller: Some(poller),
        }))
    }

    fn link(&self, p: usize) -> Option<&Link> {
        self.verbs.links.get(p).and_then(Option::as_ref)
    }

    /// Sends message `seq` of connection `c` to peer `p`: one message per part that fits the
    /// peer's receive buffers (TCP framing for a peer without a queue pair).
    pub(super) fn send(
        &self,
        inner: &Inner,
        p: usize,
        c: u32,
        seq: u64,
        segs: &[Seg],
        call: Option<(u64, u64)>,
    ) -> std::io::Result<()> {
        let Some(link) = self.link(p) else {
            return tcp_send(inner, p, c, seq, segs, call);
        };
        let trailer = if call.is_some() { CALL_TRAILER } else { 0 };
        let parts = pack(segs, link.peer_cap - HEADER - trailer);
        let n = parts.len() as u32;
        tracing::trace!(
            rank = inner.me,
            peer = inner.peers[p].rank,
            conn = c,
            seq,
            parts = n,
            "rdma send"
        );
        for part in &parts {
            // SAFETY: the engine keeps the memory `segs` points to alive and unchanged until
            // this call returns; the staging buffer holds `part_len` bytes (checked in `post`).
            link.post(inner, p, part_len(part, call.is_some()), |dst| unsafe {
                encode_part(dst, inner.wires.of(c), seq, n, part, call)
            })?;
        }
        Ok(())
    }

    /// Tells peer `p` that `consumed` messages of connection `c` are consumed.
    pub(super) fn credit(&self, inner: &Inner, p: usize, c: u32, consumed: u64) {
        let mut h = Header::new(Tag::Credit);
        h.conn = inner.wires.of(c);
        h.seq = consumed;
        let Some(link) = self.link(p) else {
            let _ = super::write_frame_on(inner, p, c as usize % inner.nsocks, &h);
            return;
        };
        let res = link.post(inner, p, HEADER, |dst| {
            dst.copy_from_slice(&h.encode());
            HEADER
        });
        if let Err(e) = res {
            let peer = &inner.peers[p];
            inner.fail(
                p,
                format!(
                    "RDMA credit to rank {} on host {} failed: {e}",
                    peer.rank, peer.host
                ),
            );
        }
    }
}

/// Names peer `p` in errors.
fn who(inner: &Inner, p: usize) -> String {
    let peer = &inner.peers[p];
    format!("rank {} on host {}", peer.rank, peer.host)
}

/// Round 1 of [`Links::establish`], sending: this rank's offer to every peer (its queue
/// pair's endpoint, or why it has no RDMA).
fn send_offers(inner: &Inner, local: &Result<Local, String>, cap: usize) -> Result<(), String> {
    let me = inner.me;
    let who = |p: usize| who(inner, p);
    for (p, peer) in inner.peers.iter().enumerate() {
        let mut offer = Offer {
            from: me,
            to: peer.rank,
            wants: false,
            qpn: 0,
            lid: 0,
            gid: None,
            slot_bytes: inner.slot_bytes as u64,
            cap: cap as u32,
            reason: String::new(),
        };
        match local {
            Ok(l) => {
                if let Some(Some(prep)) = l.prepared.get(p) {
                    let ep = prep.pqp.endpoint();
                    offer.wants = true;
                    offer.qpn = ep.num;
                    offer.lid = ep.lid;
                    offer.gid = ep.gid.as_ref().map(gid_bytes);
                }
            }
            Err(why) => offer.reason = why.clone(),
        }
        lock(&peer.socks[0].write)
            .write_all(&offer.encode())
            .map_err(|e| format!("sending the transport offer to {}: {e}", who(p)))?;
    }
    Ok(())
}

/// Round 1 of [`Links::establish`], receiving: every peer's offer, checked against this
/// rank's view of the pair.
fn read_offers(inner: &Inner) -> Result<Vec<Offer>, String> {
    let me = inner.me;
    let who = |p: usize| who(inner, p);
    let mut offers = Vec::with_capacity(inner.peers.len());
    for (p, peer) in inner.peers.iter().enumerate() {
        let mut r = &peer.socks[0].read;
        let offer = Offer::read(&mut r)
            .map_err(|e| format!("reading the transport offer of {}: {e}", who(p)))?;
        if offer.from != peer.rank || offer.to != me {
            return Err(format!(
                "{} sent a transport offer from rank {} to rank {}",
                who(p),
                offer.from,
                offer.to
            ));
        }
        if offer.slot_bytes != inner.slot_bytes as u64 {
            return Err(format!(
                "{} uses {}-byte slots, this rank {}",
                who(p),
                offer.slot_bytes,
                inner.slot_bytes
            ));
        }
        offers.push(offer);
    }
    Ok(offers)
}

/// The queue pairs of the pairs where both ends offered RDMA, connected; per peer its link,
/// or why it stays on TCP.
#[allow(clippy::type_complexity)]
fn connect_pairs(
    inner: &Inner,
    local: &mut Result<Local, String>,
    offers: &[Offer],
    cap: usize,
) -> (Vec<Option<Link>>, Vec<Option<String>>) {
    let who = |p: usize| who(inner, p);
    let mut links: Vec<Option<Link>> = (0..inner.peers.len()).map(|_| None).collect();
    let mut why_tcp: Vec<Option<String>> = vec![None; inner.peers.len()];
    for (p, theirs) in offers.iter().enumerate() {
        let prep = match local {
            Ok(l) => l.prepared.get_mut(p).and_then(Option::take),
            Err(_) => None,
        };
        why_tcp[p] = match (&*local, prep) {
            (Err(why), _) => Some(why.clone()),
            (Ok(_), None) => Some("no queue pair".into()),
            (Ok(_), Some(_)) if !theirs.wants => {
                Some(format!("{} has no RDMA: {}", who(p), theirs.reason))
            }
            (Ok(l), Some(prep)) => {
                // SAFETY: the link is dropped before `l.pd` (it moves into `Verbs.links`,
                // or is dropped here on failure).
                let pd = unsafe { l.pd.get() };
                match Link::connect(pd, prep, p, theirs, cap) {
                    Ok(link) => {
                        links[p] = Some(link);
                        None
                    }
                    Err(e) => Some(format!("{}: {e}", l.device)),
                }
            }
        };
    }
    (links, why_tcp)
}

/// Round 2 of [`Links::establish`]: with every peer where both offered RDMA (`local_ok`:
/// this rank did), whether each end connected its queue pair; a pair either end could not
/// connect stays on TCP.
fn exchange_ready(
    inner: &Inner,
    offers: &[Offer],
    local_ok: bool,
    links: &mut [Option<Link>],
    why_tcp: &mut [Option<String>],
) -> Result<(), String> {
    let who = |p: usize| who(inner, p);
    let both_wanted: Vec<bool> = offers.iter().map(|o| o.wants && local_ok).collect();
    for (p, peer) in inner.peers.iter().enumerate() {
        if both_wanted[p] {
            lock(&peer.socks[0].write)
                .write_all(&encode_ready(links[p].is_some()))
                .map_err(|e| format!("sending the queue-pair status to {}: {e}", who(p)))?;
        }
    }
    for (p, peer) in inner.peers.iter().enumerate() {
        if !both_wanted[p] {
            continue;
        }
        let mut b = [0u8; READY_LEN];
        let mut r = &peer.socks[0].read;
        r.read_exact(&mut b).map_err(|e| {
            format!(
                "reading the queue-pair status of {}: {}",
                who(p),
                io_text(e)
            )
        })?;
        let ok = decode_ready(&b).map_err(|e| format!("{} sent {e}", who(p)))?;
        if !ok && why_tcp[p].is_none() {
            links[p] = None;
            why_tcp[p] = Some(format!("{} could not connect its queue pair", who(p)));
        }
    }
    Ok(())
}

impl Drop for Links {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
        // Let the last messages leave before the queue pairs go.
        let until = Instant::now() + DRAIN;
        for link in self.verbs.links.iter().flatten() {
            let mut tx = lock(&link.tx);
            while tx.busy > 0 && Instant::now() < until {
                if link.reap(&mut tx).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// Sends a message to a peer without a queue pair, as `Net::send` does (one thread).
fn tcp_send(
    inner: &Inner,
    p: usize,
    c: u32,
    seq: u64,
    segs: &[Seg],
    call: Option<(u64, u64)>,
) -> std::io::Result<()> {
    let call_bytes = proto::call_trailer(call);
    let parts = proto::split(segs, inner.nsocks);
    let n = parts.len() as u32;
    for (j, part) in parts.iter().enumerate() {
        let mut h = Header::new(Tag::Data);
        h.conn = inner.wires.of(c);
        h.seq = seq;
        h.a = n;
        h.b = part.len() as u32;
        h.c = part.iter().map(|s| s.len).sum::<usize>() as u32;
        if inner.checksum {
            h.flags = proto::FLAG_CRC;
        }
        if call.is_some() {
            h.flags |= proto::FLAG_CALL;
        }
        let sock = (c as usize + j) % inner.nsocks;
        super::write_part_on(inner, p, sock, &h.encode(), part, &call_bytes)?;
    }
    Ok(())
}

/// Receives from every queue pair until `stop`.
fn poll_loop(verbs: &Verbs, inner: &Inner, stop: &AtomicBool) {
    let mut wcs = vec![ibv_wc::default(); 32];
    let mut empty = 0u32;
    let mut idle_since = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let done = match verbs.recv_cq.poll(&mut wcs) {
            Ok(d) => d,
            Err(e) => {
                for (p, _) in verbs.links.iter().enumerate().filter(|(_, l)| l.is_some()) {
                    inner.fail(p, format!("polling the RDMA completion queue failed: {e}"));
                }
                return;
            }
        };
        if done.is_empty() {
            empty = empty.saturating_add(1);
            if empty == 1 {
                idle_since = Instant::now();
            }
            let idle = idle_since.elapsed();
            if empty < 256 {
                std::hint::spin_loop();
            } else if idle < Duration::from_millis(2) {
                std::thread::yield_now();
            } else if idle < Duration::from_millis(100) {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                // Long idle (between calls): a first message waits at most this long.
                std::thread::sleep(Duration::from_micros(200));
            }
            continue;
        }
        empty = 0;
        for wc in done.iter() {
            receive(verbs, inner, wc);
        }
    }
}

/// Handles one receive completion, then posts its buffer again.
fn receive(verbs: &Verbs, inner: &Inner, wc: &ibv_wc) {
    let (p, b) = split_wr_id(wc.wr_id());
    let Some(link) = verbs.links.get(p).and_then(Option::as_ref) else {
        return;
    };
    let peer = &inner.peers[p];
    let fail = |why: String| {
        if !link.broken.swap(true, Ordering::AcqRel) && peer.state.load(Ordering::Acquire) == ALIVE
        {
            inner.fail(p, why);
        }
    };
    if let Some((status, vendor)) = wc.error() {
        fail(format!(
            "RDMA receive from rank {} on host {} failed: status {status} ({}, vendor error {vendor:#x})",
            peer.rank,
            peer.host,
            status_text(status)
        ));
        return;
    }
    if link.broken.load(Ordering::Acquire) {
        return;
    }
    let mut rx = lock(&link.rx);
    let at = b * link.rx_stride;
    let len = wc.len();
    if at + link.rx_stride > rx.len() || len > link.rx_stride {
        drop(rx);
        fail(format!(
            "RDMA receive completion for unknown buffer {b} ({len} bytes)"
        ));
        return;
    }
    if let Err(why) = place(
        &inner.arena,
        &inner.wires,
        &inner.inbound,
        inner.slot_bytes,
        p,
        &rx[at..at + len],
    ) {
        drop(rx);
        fail(format!(
            "rank {} on host {} sent a malformed RDMA message: {why}",
            peer.rank, peer.host
        ));
        return;
    }
    tracing::trace!(rank = inner.me, peer = peer.rank, bytes = len, "rdma recv");
    let mut qp = lock(&link.qp);
    // SAFETY: buffer `b` is not read again before its next completion.
    if let Err(e) = unsafe { qp.post_receive(&mut rx, at..at + link.rx_stride, wc.wr_id()) } {
        drop((qp, rx));
        fail(format!(
            "posting an RDMA receive buffer for rank {} failed: {e}",
            peer.rank
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::Layout;

    fn offer() -> Offer {
        Offer {
            from: 3,
            to: 12,
            wants: true,
            qpn: 0x1234,
            lid: 7,
            gid: Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
            slot_bytes: 256 * 1024,
            cap: message_cap(256 * 1024) as u32,
            reason: String::new(),
        }
    }

    #[test]
    fn offers_round_trip_and_malformed_ones_are_refused() {
        for o in [
            offer(),
            Offer {
                gid: None,
                ..offer()
            },
            Offer {
                wants: false,
                qpn: 0,
                lid: 0,
                gid: None,
                reason: "no RDMA devices: Function not implemented (os error 38)".into(),
                ..offer()
            },
        ] {
            let bytes = o.encode();
            assert_eq!(Offer::read(&mut bytes.as_slice()), Ok(o.clone()));
            // Truncated anywhere: refused.
            for cut in [0, 7, 63, bytes.len() - 1] {
                if cut < bytes.len() {
                    assert!(Offer::read(&mut &bytes[..cut]).is_err(), "cut at {cut}");
                }
            }
        }
        // A long reason is cut at a character boundary.
        let long = Offer {
            wants: false,
            qpn: 0,
            gid: None,
            reason: "é".repeat(MAX_REASON),
            ..offer()
        };
        let back = Offer::read(&mut long.encode().as_slice()).unwrap();
        assert_eq!(back.reason.len(), MAX_REASON);
        let good = offer().encode();
        let fixed = |b: &[u8]| -> [u8; OFFER_LEN] { b[..OFFER_LEN].try_into().unwrap() };
        let reseal = |mut b: Vec<u8>| {
            let check = fnv1a(&b[..60]);
            b[60..64].copy_from_slice(&check.to_le_bytes());
            b
        };
        // Wrong magic (a TCP frame header, as from a peer built without `rdma`).
        let mut bad = good.clone();
        bad[..8].copy_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        assert!(
            Offer::decode_fixed(&fixed(&bad))
                .unwrap_err()
                .contains("rdma feature")
        );
        // A flipped bit: check word.
        let mut bad = good.clone();
        bad[25] ^= 1;
        assert!(
            Offer::decode_fixed(&fixed(&bad))
                .unwrap_err()
                .contains("check")
        );
        // Version, flags, queue pair number, buffer size, reason length, endpoint without RDMA.
        for (at, val, what) in [
            (8usize, 2u32, "version"),
            (20, 8, "flags"),
            (24, 0, "queue pair"),
            (24, 1 << 24, "queue pair"),
            (56, 16, "receive buffers"),
            (56, MAX_CAP as u32 + 64, "receive buffers"),
            (20, FLAG_GID, "endpoint"),
        ] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&val.to_le_bytes());
            let e = Offer::decode_fixed(&fixed(&reseal(bad))).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut bad = good.clone();
        bad[30..32].copy_from_slice(&(MAX_REASON as u16 + 1).to_le_bytes());
        assert!(
            Offer::decode_fixed(&fixed(&reseal(bad)))
                .unwrap_err()
                .contains("reason")
        );
    }

    #[test]
    fn ready_records_round_trip_and_garbage_is_refused() {
        assert_eq!(decode_ready(&encode_ready(true)), Ok(true));
        assert_eq!(decode_ready(&encode_ready(false)), Ok(false));
        let mut bad = encode_ready(true);
        bad[8] = 2;
        assert!(decode_ready(&bad).is_err());
        let mut bad = encode_ready(true);
        bad[0] = b'X';
        assert!(decode_ready(&bad).is_err());
        assert!(decode_ready(&[0u8; READY_LEN]).is_err());
    }

    #[test]
    fn work_request_ids_round_trip() {
        for (p, b) in [
            (0usize, 0usize),
            (1, 63),
            (65_535, 7),
            (u32::MAX as usize, u32::MAX as usize),
        ] {
            assert_eq!(split_wr_id(wr_id(p, b)), (p, b));
        }
    }

    #[test]
    fn hca_specs_parse() {
        let s = parse_hca(Some("mlx5_0:1")).unwrap();
        assert!(s.matches("mlx5_0") && s.matches("mlx5_01") && !s.matches("mlx4_0"));
        let s = parse_hca(Some("=mlx5_0")).unwrap();
        assert!(s.matches("mlx5_0") && !s.matches("mlx5_01"));
        assert!(parse_hca(None).unwrap().matches("anything"));
        assert!(parse_hca(Some("  ")).unwrap().matches("anything"));
        assert!(
            parse_hca(Some("mlx5_0:2"))
                .unwrap_err()
                .contains("port 1 only")
        );
        assert!(parse_hca(Some("mlx5_0:x")).is_err());
        assert!(parse_hca(Some("mlx5_0,mlx5_1")).is_err());
        assert!(parse_hca(Some("^mlx5_0")).is_err());
    }

    #[test]
    fn gids_round_trip_and_routing_prefers_roce_v2_ipv4() {
        let raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7];
        let g = gid_from(raw);
        assert_eq!(gid_bytes(&g), raw);
        let entry = |i: u32, ty: u32, gid: [u8; 16]| GidEntry {
            gid: gid_from(gid),
            gid_index: i,
            port_num: PORT,
            gid_type: ty,
            ndev_ifindex: 0,
        };
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let table = vec![
            entry(0, 1, link_local),
            entry(1, GID_TYPE_ROCE_V2, link_local),
            entry(2, 1, raw),
            entry(3, GID_TYPE_ROCE_V2, raw),
        ];
        assert_eq!(choose_gid(&table), Some(3));
        assert_eq!(choose_gid(&table[..3]), Some(1));
        assert_eq!(choose_gid(&[entry(0, GID_TYPE_IB, link_local)]), Some(0));
        assert_eq!(choose_gid(&[]), None);
        // An entry whose index is not its position is not used.
        assert_eq!(
            choose_gid(&[entry(0, 1, link_local), entry(5, GID_TYPE_ROCE_V2, raw)]),
            Some(0)
        );
    }

    /// Segments of `src` that land at `offs` in the slot.
    fn segs(src: &[u8], pieces: &[(usize, usize, usize)]) -> Vec<Seg> {
        pieces
            .iter()
            .map(|&(from, len, off)| Seg {
                off,
                ptr: src[from..].as_ptr(),
                len,
            })
            .collect()
    }

    /// The call every test message of `seq` carries.
    fn call_of(seq: u64) -> Option<(u64, u64)> {
        Some((seq + 1, 0x00c0_ffee_0000 + seq))
    }

    fn encode_all(parts: &[Vec<Seg>], conn: u32, seq: u64) -> Vec<Vec<u8>> {
        parts
            .iter()
            .map(|part| {
                let call = call_of(seq);
                let mut buf = vec![0u8; part_len(part, call.is_some())];
                // SAFETY: the segments point into a live test buffer.
                let n = unsafe { encode_part(&mut buf, conn, seq, parts.len() as u32, part, call) };
                assert_eq!(n, buf.len());
                buf
            })
            .collect()
    }

    #[test]
    fn packing_keeps_every_byte_once_within_the_room() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let pieces = [
            (0, 100, 0),
            (100, 0, 200),
            (200, 1000, 300),
            (1500, 37, 2000),
        ];
        let s = segs(&src, &pieces);
        for room in [9usize, 16, 64, 300, 1 << 20] {
            let parts = pack(&s, room);
            assert!(
                parts.iter().all(|p| part_len(p, false) - HEADER <= room),
                "room {room}"
            );
            let flat: Vec<(usize, usize)> = parts
                .iter()
                .flatten()
                .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
                .collect();
            let want: Vec<(usize, usize)> = s
                .iter()
                .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
                .collect();
            assert_eq!(flat, want, "room {room}");
        }
        assert_eq!(pack(&[], 64).len(), 1);
        assert_eq!(pack(&s, 1 << 20).len(), 1);
    }

    #[test]
    fn messages_land_in_their_slots_and_publish_in_order() {
        let slot_bytes = 4096;
        let arena = Arena::heap(Layout::new(2, 2, slot_bytes)).unwrap();
        // Connection 0 comes from peer 0, connection 1 goes to it, both on channel 7.
        let wires = Wires::new(&[Dir::In(0), Dir::Out(0)], vec![7, 7], 1);
        let inbound = [Some(Inbound::default()), None];
        let src: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8 + 1).collect();
        let pieces = [(0, 500, 0), (600, 1200, 1024), (2000, 3, 4093)];
        let s = segs(&src, &pieces);
        for seq in 0..2u64 {
            let parts = pack(&s, 700);
            assert!(parts.len() > 2);
            let msgs = encode_all(&parts, 7, seq);
            // Deliver the parts of message `seq`; only the last publishes it.
            for (j, m) in msgs.iter().enumerate() {
                place(&arena, &wires, &inbound, slot_bytes, 0, m).unwrap();
                let sent = arena.sent(0).load(Ordering::Acquire);
                assert_eq!(sent, if j + 1 == msgs.len() { seq + 1 } else { seq });
            }
            // The sender's call reaches the receiving step.
            let (num, print) = arena.peer_call(0, seq);
            assert_eq!(
                Some((num.load(Ordering::Relaxed), print.load(Ordering::Relaxed))),
                call_of(seq)
            );
            let slot = arena.slot(0, seq);
            for &(from, len, off) in &pieces {
                // SAFETY: inside the slot.
                let got = unsafe { std::slice::from_raw_parts(slot.add(off), len) };
                assert_eq!(got, &src[from..from + len]);
            }
        }
        // Message 2 needs slot 0 freed; a credit-window violation is refused.
        let m = encode_all(&pack(&s, 1 << 20), 7, 2);
        assert!(
            place(&arena, &wires, &inbound, slot_bytes, 0, &m[0])
                .unwrap_err()
                .contains("window")
        );
        arena.consumed(0).store(1, Ordering::Release);
        place(&arena, &wires, &inbound, slot_bytes, 0, &m[0]).unwrap();
        assert_eq!(arena.sent(0).load(Ordering::Acquire), 3);
        // Credits raise `consumed` of the outgoing connection, never lower it.
        let credit = |conn: u32, n: u64| {
            let mut h = Header::new(Tag::Credit);
            h.conn = conn;
            h.seq = n;
            h.encode().to_vec()
        };
        place(&arena, &wires, &inbound, slot_bytes, 0, &credit(7, 5)).unwrap();
        place(&arena, &wires, &inbound, slot_bytes, 0, &credit(7, 3)).unwrap();
        assert_eq!(arena.consumed(1).load(Ordering::Acquire), 5);
        // Wrong directions and peers.
        assert!(place(&arena, &wires, &inbound, slot_bytes, 0, &credit(2, 9)).is_err());
        assert!(place(&arena, &wires, &inbound, slot_bytes, 1, &credit(7, 9)).is_err());
        let m = encode_all(&pack(&s, 1 << 20), 1, 0);
        assert!(
            place(&arena, &wires, &inbound, slot_bytes, 0, &m[0])
                .unwrap_err()
                .contains("channel 1, where it has no connection")
        );
    }

    #[test]
    fn malformed_messages_are_refused() {
        let src = [7u8; 64];
        let s = segs(&src, &[(0, 64, 0)]);
        let m = encode_all(&pack(&s, 1 << 20), 0, 0).remove(0);
        assert!(
            matches!(decode_msg(&m, 4096), Ok(Msg::Data { payload, .. }) if payload == &src[..])
        );
        // Truncated, extended, short header.
        assert!(decode_msg(&m[..m.len() - 1], 4096).is_err());
        let mut long = m.clone();
        long.push(0);
        assert!(decode_msg(&long, 4096).is_err());
        assert!(decode_msg(&m[..10], 4096).is_err());
        // Segment outside a smaller slot.
        assert!(decode_msg(&m, 32).unwrap_err().contains("outside"));
        // Frames that belong on TCP, and a credit with a body.
        let hb = Header::new(Tag::Heartbeat).encode();
        assert!(decode_msg(&hb, 4096).unwrap_err().contains("TCP"));
        let mut c = Header::new(Tag::Credit).encode().to_vec();
        c.push(1);
        assert!(decode_msg(&c, 4096).is_err());
        // Garbage header.
        assert!(decode_msg(&[0xAB; 64], 4096).is_err());
        // The sender's call rides in the trailer; a checksum trailer never travels here.
        assert!(matches!(decode_msg(&m, 4096), Ok(Msg::Data { call, .. }) if call == call_of(0)));
        let mut crc = m.clone();
        crc[1] |= proto::FLAG_CRC;
        assert!(decode_msg(&crc, 4096).unwrap_err().contains("checksum"));
        let mut bare = vec![0u8; part_len(&s, false)];
        // SAFETY: the segments point into `src`, which is live.
        let n = unsafe { encode_part(&mut bare, 0, 0, 1, &s, None) };
        assert_eq!(n, bare.len());
        assert!(matches!(
            decode_msg(&bare, 4096),
            Ok(Msg::Data { call: None, .. })
        ));
    }

    #[test]
    fn message_cap_fits_a_slot_and_a_table() {
        assert!(message_cap(64) >= HEADER + 64 + TABLE_ROOM);
        assert_eq!(message_cap(256 * 1024) % 64, 0);
        assert_eq!(message_cap(1 << 30), MAX_CAP);
        assert!(message_cap(64) >= MIN_CAP);
    }

    /// Two ranks on two "hosts" of this process (loopback TCP), with these transport
    /// choices; the results of `ProcessGroup::init_with`.
    fn two_hosts(tag: &str, kinds: [NetKind; 2]) -> Vec<crate::Result<crate::Communicator>> {
        crate::config::init_tracing();
        let port = crate::backends::process::local_rendezvous_port().expect("a free port");
        std::thread::scope(|s| {
            let handles: Vec<_> = kinds
                .iter()
                .enumerate()
                .map(|(r, &kind)| {
                    let boot = crate::Bootstrap {
                        addr: format!("127.0.0.1:{port}"),
                        token: "rdma-test".into(),
                        host: Some(format!("{tag}-h{r}")),
                    };
                    let cfg = crate::Config::default()
                        .with_timeout(Duration::from_secs(20))
                        .with_net(NetConfig {
                            kind,
                            ..NetConfig::default()
                        });
                    s.spawn(move || {
                        crate::ProcessGroup::init_with(
                            crate::fallback::plan(2),
                            r as u32,
                            2,
                            &boot,
                            cfg,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        })
    }

    fn all_reduce(comms: Vec<crate::Result<crate::Communicator>>) {
        let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut c = c.expect("joined");
                        let mut buf = vec![1.5f32; 70_001];
                        c.all_reduce_in_place(&mut buf, crate::ReduceOp::Sum)
                            .expect("all-reduce");
                        buf
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for out in outs {
            assert!(out.iter().all(|&x| x == 3.0));
        }
    }

    #[test]
    fn without_a_device_the_job_negotiates_tcp() {
        // Unset on both sides, or socket on one: every pair agrees on TCP (with a device,
        // the first pair would use RDMA and the second TCP).
        all_reduce(two_hosts("rdma-auto", [NetKind::Auto, NetKind::Auto]));
        all_reduce(two_hosts("rdma-mixed", [NetKind::Socket, NetKind::Auto]));
    }

    #[test]
    fn without_a_device_hccl_net_ib_is_a_clear_error() {
        if let Ok(dev) = probe(None) {
            println!("skipped: RDMA device {dev} present");
            return;
        }
        for r in two_hosts("rdma-ib", [NetKind::Ib, NetKind::Ib]) {
            let Err(e) = r else {
                panic!("HCCL_NET=ib without a device joined");
            };
            let text = e.to_string();
            assert!(
                text.contains("HCCL_NET=ib") && text.contains("RDMA"),
                "{text}"
            );
        }
    }

    #[test]
    fn device_path_or_skip() {
        match probe(None) {
            Err(why) => println!("skipped: no RDMA device ({why})"),
            Ok(name) => {
                // A device is present: open it, build a queue pair and connect it to itself,
                // then send one message through the staging/receive buffers.
                let (dev, ctx) =
                    open_device(Some(&format!("={name}"))).expect("opening the device");
                let gid = choose_gid(ctx.gid_table());
                let cq = ctx.create_cq(16, 0).expect("completion queue");
                let pd = ctx.alloc_pd().expect("protection domain");
                let mut b = pd.create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC);
                b.set_max_send_wr(4).set_max_recv_wr(4).set_rnr_retry(7);
                if let Some(g) = gid {
                    b.set_gid_index(g);
                }
                let pqp = b.build().expect("queue pair");
                let ep = pqp.endpoint();
                // The endpoint survives the offer encoding.
                let o = Offer {
                    qpn: ep.num,
                    lid: ep.lid,
                    gid: ep.gid.as_ref().map(gid_bytes),
                    ..offer()
                };
                let back = Offer::read(&mut o.encode().as_slice()).unwrap();
                let remote = QueuePairEndpoint {
                    num: back.qpn,
                    lid: back.lid,
                    gid: back.gid.map(gid_from),
                };
                assert_eq!(remote, ep);
                let mut qp = pqp.handshake(remote).expect("handshake");
                let cap = message_cap(4096);
                let mut rx = pd.allocate::<u8>(cap).unwrap();
                let mut tx = pd.allocate::<u8>(cap).unwrap();
                let src = [9u8; 100];
                let s = segs(&src, &[(0, 100, 64)]);
                let part = &pack(&s, cap - HEADER)[0];
                // SAFETY: `src` is live; `tx` holds `cap` bytes.
                let n = unsafe { encode_part(&mut tx, 0, 0, 1, part, None) };
                // SAFETY: the buffers stay untouched until both completions arrived.
                unsafe { qp.post_receive(&mut rx, .., wr_id(0, 0)) }.unwrap();
                unsafe { qp.post_send(&mut tx, ..n, 0) }.unwrap();
                let mut wcs = [ibv_wc::default(); 4];
                let (mut got, until) = (0, Instant::now() + Duration::from_secs(5));
                while got < 2 && Instant::now() < until {
                    for wc in cq.poll(&mut wcs).unwrap().iter() {
                        assert!(wc.error().is_none(), "{:?}", wc.error());
                        got += 1;
                    }
                }
                assert_eq!(got, 2, "{dev}: loopback completions");
                let arena = Arena::heap(Layout::new(2, 1, 4096)).unwrap();
                let inbound = [Some(Inbound::default())];
                let wires = Wires::new(&[Dir::In(0)], vec![0], 1);
                place(&arena, &wires, &inbound, 4096, 0, &rx[..n]).unwrap();
                assert_eq!(arena.sent(0).load(Ordering::Acquire), 1);
                println!("RDMA device {dev}: loopback message delivered");
            }
        }
    }
}
