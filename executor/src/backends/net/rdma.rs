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

mod device;
mod wire;

pub use device::probe;
use device::*;
use wire::*;

use super::proto::{self, HEADER, Header, Tag};
use super::{ALIVE, DEAD, Inner};
use crate::config::{NetConfig, NetKind};
use crate::transport::{Dir, Seg};
use hccl_ir::CONNECTION_SLOTS;
use ibverbs::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair};
use ibverbs::{PreparedQueuePair, QueuePairEndpoint, ibv_wc};
use std::io::{Read, Write};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Staging buffers (outstanding sends) per peer.
const SEND_DEPTH: usize = 8;
/// Bounds of the receive buffers posted per peer.
const RECV_DEPTH: (usize, usize) = (4, 64);
/// How long teardown waits for sends still in flight.
const DRAIN: Duration = Duration::from_secs(1);

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
mod tests;
