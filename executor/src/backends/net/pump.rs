//! The receiving side: whoever holds a socket's parse state (the engine while it waits in
//! a call, else the socket's receiving thread) reads what the peer sent without blocking
//! ([`pump`]); data parts land in the ring slots the credit window reserved for them and a
//! message is published once all its parts are in; credits, heartbeats, aborts and
//! goodbyes take effect as they come.

use super::proto::{self, Header, Tag};
use super::stream::{Recv, RxState, Stage};
use super::{ALIVE, HEARTBEAT_EVERY, Inner, Peer, wait_fd};
use crate::engine::raise_abort;
use crate::transport::{Dir, Seg};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) fn receive_loop(inner: &Inner, p: usize, s: usize) {
    let res = receive(inner, p, s);
    let quiet = inner.leaving.load(Ordering::Acquire);
    if let Err(why) = res
        && !quiet
    {
        let peer = &inner.peers[p];
        if peer.state.load(Ordering::Acquire) == ALIVE {
            inner.fail(p, why);
        }
        let _ = peer.socks[s].read.shutdown(Shutdown::Both);
    }
    inner.receivers_done.fetch_add(1, Ordering::AcqRel);
}

/// The receiving thread of one socket. While a call is active it sleeps (the engine reads);
/// between calls it waits for bytes with `poll` (no lock held meanwhile) and pumps them.
fn receive(inner: &Inner, p: usize, s: usize) -> std::result::Result<(), String> {
    use std::os::fd::AsRawFd;
    let sock = &inner.peers[p].socks[s];
    let fd = sock.read.as_raw_fd();
    loop {
        {
            let (m, cv) = &inner.idle;
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            while inner.active.load(Ordering::Acquire) && !inner.leaving.load(Ordering::Acquire) {
                g = cv
                    .wait_timeout(g, HEARTBEAT_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        wait_fd(fd, libc::POLLIN, HEARTBEAT_EVERY);
        if inner.active.load(Ordering::Acquire) && !inner.leaving.load(Ordering::Acquire) {
            continue;
        }
        let mut rx = sock.rx.lock().unwrap_or_else(|e| e.into_inner());
        match pump(inner, p, s, &mut rx)? {
            Pumped::Closed => return Ok(()),
            Pumped::Idle | Pumped::Progress => {}
        }
    }
}

/// What a pump achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pumped {
    /// Nothing to read now.
    Idle,
    /// At least one frame was completed.
    Progress,
    /// The peer closed the connection after saying goodbye (or it was closed here).
    Closed,
}

impl Pumped {
    /// What a pump that must wait for more bytes reports: whether it completed a frame.
    fn after(progress: bool) -> Pumped {
        if progress {
            Pumped::Progress
        } else {
            Pumped::Idle
        }
    }
}

/// Reads and handles whatever frames (or parts of frames) socket `s` of peer `p` holds now,
/// without blocking; `Err` describes a failure of the peer.
pub(super) fn pump(
    inner: &Inner,
    p: usize,
    s: usize,
    rx: &mut RxState,
) -> std::result::Result<Pumped, String> {
    pump_from(inner, p, &inner.peers[p].socks[s].read, rx)
}

/// [`pump`] with the bytes of peer `p` coming from `sock`.
pub(super) fn pump_from(
    inner: &Inner,
    p: usize,
    sock: &impl Recv,
    rx: &mut RxState,
) -> std::result::Result<Pumped, String> {
    let peer = &inner.peers[p];
    let who = || format!("rank {} on host {} ({})", peer.rank, peer.host, peer.addr);
    let bad = |what: String| malformed(peer, what);
    let mid = |e: &dyn std::fmt::Display| {
        format!(
            "{} closed its connection in the middle of a message: {e}",
            who()
        )
    };
    let mut progress = false;
    loop {
        match &mut rx.stage {
            Stage::Closed => return Ok(Pumped::Closed),
            Stage::Header => {
                let got = rx.got;
                match rx.ahead.read(sock, &mut rx.hdr[got..]) {
                    Ok(None) => {
                        return Ok(Pumped::after(progress));
                    }
                    Ok(Some(0)) if got == 0 => {
                        rx.stage = Stage::Closed;
                        if rx.said_goodbye {
                            return Ok(Pumped::Closed);
                        }
                        return Err(format!(
                            "{} closed its connection without saying goodbye (process died?)",
                            who()
                        ));
                    }
                    Ok(Some(0)) => return Err(mid(&"end of stream inside a frame header")),
                    Ok(Some(n)) => rx.got += n,
                    Err(e) => {
                        rx.stage = Stage::Closed;
                        if rx.said_goodbye {
                            return Ok(Pumped::Closed);
                        }
                        return Err(format!("connection to {} failed: {e}", who()));
                    }
                }
                if rx.got < proto::HEADER {
                    continue;
                }
                rx.got = 0;
                peer.last_recv.store(inner.now_ms(), Ordering::Release);
                let h = Header::decode(&rx.hdr).map_err(bad)?;
                progress |= on_frame(inner, p, h, rx, sock)?;
            }
            Stage::Table(h, table) => {
                let want = h.b as usize * 8;
                let have = table.len();
                if have < want {
                    table.resize(want, 0);
                    let got = match rx.ahead.read(sock, &mut table[have..]) {
                        Ok(None) => {
                            table.truncate(have);
                            return Ok(Pumped::after(progress));
                        }
                        Ok(Some(0)) => return Err(mid(&"end of stream")),
                        Ok(Some(n)) => n,
                        Err(e) => return Err(mid(&e)),
                    };
                    table.truncate(have + got);
                    if table.len() < want {
                        continue;
                    }
                }
                rx.stage = begin_payload(inner, p, *h, table)?;
            }
            Stage::Payload(h, segs, i, done, crc, direct) => {
                if *i < segs.len() {
                    let (off, len) = segs[*i];
                    let slot = inner.in_slot(h.conn, h.seq);
                    let (at, n) = route(direct, slot, off as usize + *done, len as usize - *done);
                    // SAFETY: the credit window reserves this slot for message `seq` (its
                    // previous message was consumed: `Inbound::begin` checked), and the
                    // segment lies inside the slot (`check_segments`); or the bytes are
                    // inside a destination the receiving step posted (`route`), memory of
                    // its call that nothing else touches until the step runs (a post is
                    // withdrawn under this socket's parse lock when the call ends).
                    let dst = unsafe { std::slice::from_raw_parts_mut(at, n) };
                    if !dst.is_empty() {
                        match rx.ahead.read(sock, dst) {
                            Ok(None) => {
                                return Ok(Pumped::after(progress));
                            }
                            Ok(Some(0)) => return Err(mid(&"end of stream")),
                            Ok(Some(n)) => {
                                if crate::fault::corrupt(crate::fault::Site::Wire, inner.me) {
                                    dst[0] ^= 0x20;
                                }
                                if h.flags & proto::FLAG_CRC != 0 {
                                    *crc = crc32c::crc32c_append(*crc, &dst[..n]);
                                }
                                *done += n;
                            }
                            Err(e) => return Err(mid(&e)),
                        }
                    }
                    if *done == len as usize {
                        *i += 1;
                        *done = 0;
                    }
                    continue;
                }
                if h.flags & proto::FLAG_CALL == 0 {
                    // No call to compare: a word left by an earlier message must not pass
                    // for this one's.
                    let (num, _) = inner.in_call(h.conn, h.seq);
                    num.store(0, Ordering::Relaxed);
                }
                if h.flags != 0 {
                    rx.stage = Stage::Trailer(*h, *crc, [0; proto::MAX_TRAILER], 0);
                    continue;
                }
                let (c, seq) = (h.conn, h.seq);
                part_done(inner, peer.rank, c, seq);
                rx.stage = Stage::Header;
                progress = true;
            }
            Stage::Trailer(h, crc, bytes, got) => {
                let want = proto::trailer_len(h.flags);
                if *got < want {
                    match rx.ahead.read(sock, &mut bytes[*got..want]) {
                        Ok(None) => {
                            return Ok(Pumped::after(progress));
                        }
                        Ok(Some(0)) => return Err(mid(&"end of stream")),
                        Ok(Some(n)) => *got += n,
                        Err(e) => return Err(mid(&e)),
                    }
                    continue;
                }
                let (c, seq) = (h.conn, h.seq);
                end_trailer(inner, p, h, *crc, &bytes[..want]);
                part_done(inner, peer.rank, c, seq);
                rx.stage = Stage::Header;
                progress = true;
            }
        }
    }
}

/// Why the frames of `peer` are refused: `what` was malformed.
#[cold]
fn malformed(peer: &Peer, what: String) -> String {
    format!(
        "rank {} on host {} ({}) sent a malformed frame: {what}",
        peer.rank, peer.host, peer.addr
    )
}

/// Handles frame header `h` from peer `p`, which [`pump_from`] read whole: a data part's
/// segment table comes next, a credit frees slots, an abort raises the abort word, a
/// goodbye marks the peer gone. Whether this made progress.
#[inline]
fn on_frame(
    inner: &Inner,
    p: usize,
    h: Header,
    rx: &mut RxState,
    sock: &impl Recv,
) -> std::result::Result<bool, String> {
    let bad = |what: String| malformed(&inner.peers[p], what);
    let mut progress = false;
    match h.tag {
        Tag::Data => {
            let Some(c) = inner.wires.incoming(p, h.conn) else {
                return Err(bad(format!(
                    "data on channel {}, where it has no connection to this rank",
                    h.conn
                )));
            };
            // From here on the header names the local connection.
            let mut h = h;
            h.conn = c;
            if h.b > proto::MAX_SEGS {
                return Err(bad(format!("{} segments", h.b)));
            }
            rx.stage = Stage::Table(h, Vec::with_capacity(h.b as usize * 8));
        }
        Tag::Credit => {
            let Some(c) = inner.wires.outgoing(p, h.conn) else {
                return Err(bad(format!(
                    "credit on channel {}, where this rank has no connection to it",
                    h.conn
                )));
            };
            // A credit for messages never sent would let this rank's engine
            // count more free slots than exist (its `send_seq - consumed`).
            let sent = inner.sent_out[c as usize].load(Ordering::Acquire);
            if h.seq > sent {
                return Err(bad(format!(
                    "credit for {} messages on channel {}, where this rank sent {sent}",
                    h.seq, h.conn
                )));
            }
            inner.arena.consumed(c).fetch_max(h.seq, Ordering::AcqRel);
            progress = true;
        }
        Tag::Heartbeat => {}
        Tag::Abort => {
            if h.a >= inner.world || h.b >= inner.world {
                return Err(bad(format!("abort naming ranks {} and {}", h.a, h.b)));
            }
            raise_abort(&inner.arena, h.a, h.b);
            progress = true;
        }
        Tag::Goodbye => {
            rx.said_goodbye = true;
            inner.gone(p);
            sock.shutdown_write();
        }
    }
    Ok(progress)
}

/// The segment table of data part `h` from peer `p` is in (`table`): checks it against the
/// slot and the credit window, and starts reading the payload.
#[inline]
fn begin_payload(
    inner: &Inner,
    p: usize,
    h: Header,
    table: &[u8],
) -> std::result::Result<Stage, String> {
    let bad = |what: String| malformed(&inner.peers[p], what);
    let segs: Vec<(u32, u32)> = table
        .chunks_exact(8)
        .map(|b| {
            (
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            )
        })
        .collect();
    proto::check_segments(&segs, inner.slot_bytes, h.c).map_err(bad)?;
    let c = h.conn as usize;
    let inb = inner.inbound[c]
        .as_ref()
        .ok_or_else(|| bad("no inbound state".into()))?;
    let consumed = inner.arena.consumed(c as u32).load(Ordering::Acquire);
    let direct = inb
        .begin(h.seq, h.a, inner.nsocks as u32, (consumed, inner.window))
        .map_err(bad)?;
    Ok(Stage::Payload(h, segs, 0, 0, 0, direct))
}

/// Where the message bytes from `pos` on (`want` of them) land: inside a posted destination
/// of `direct` (sorted by offset) up to its end, else in the slot up to the next one. The
/// address and how many bytes may go there.
#[inline]
fn route(direct: &[Seg], slot: *mut u8, pos: usize, want: usize) -> (*mut u8, usize) {
    let mut until = usize::MAX;
    for d in direct {
        if pos < d.off {
            until = d.off;
            break;
        }
        if pos < d.off + d.len {
            let n = want.min(d.off + d.len - pos);
            return (d.ptr.cast_mut().wrapping_add(pos - d.off), n);
        }
    }
    (slot.wrapping_add(pos), want.min(until - pos))
}

/// The trailer of data part `h` from peer `p` is in (`bytes`): a checksum that differs
/// from the payload's (`crc`) marks the slot corrupt, the sender's call lands where the
/// receiving step compares it.
#[inline]
fn end_trailer(inner: &Inner, p: usize, h: &Header, crc: u32, bytes: &[u8]) {
    let peer = &inner.peers[p];
    let (c, seq) = (h.conn, h.seq);
    let (sent_crc, call) = proto::read_trailer(h.flags, bytes);
    if let Some(sent) = sent_crc
        && sent != crc
    {
        // The step that receives the message reports it (naming the step).
        tracing::warn!(
            rank = inner.me,
            peer = peer.rank,
            conn = c,
            seq,
            "a data part failed its CRC32C: {crc:08x} received, {sent:08x} sent"
        );
        inner
            .in_crc(c, seq)
            .store(crate::arena::corrupt_mark(seq), Ordering::Relaxed);
    }
    if let Some((number, print)) = call {
        // The receiving step compares it with its own call (see `Arena::peer_call`).
        let (num, word) = inner.in_call(c, seq);
        num.store(number, Ordering::Relaxed);
        word.store(print, Ordering::Relaxed);
    }
}

/// A part of message `seq` of connection `c` is in its slot: publishes the message when it
/// was the last (the Release store of `sent` also publishes a checksum mark).
fn part_done(inner: &Inner, from: u32, c: u32, seq: u64) {
    tracing::trace!(rank = inner.me, peer = from, conn = c, seq, "net recv");
    if let Some(inb) = &inner.inbound[c as usize]
        && let Some(published) = inb.end(seq)
    {
        inner.arena.sent(c).store(published, Ordering::Release);
    }
}

impl Inner {
    /// Where message `seq` of incoming connection `c` lands: its inbox slot (the arena's
    /// slot for a connection without one, which only the tests build).
    pub(super) fn in_slot(&self, c: u32, seq: u64) -> *mut u8 {
        match self.inboxes.get(c as usize) {
            Some(Some(b)) => b.slot(seq),
            _ => self.arena.slot(c, seq),
        }
    }

    /// The checksum mark word of message `seq` of incoming connection `c`.
    pub(super) fn in_crc(&self, c: u32, seq: u64) -> &AtomicU64 {
        match self.inboxes.get(c as usize) {
            Some(Some(b)) => b.crc(seq),
            _ => self.arena.crc(c, seq),
        }
    }

    /// The sender's call words of message `seq` of incoming connection `c`.
    pub(super) fn in_call(&self, c: u32, seq: u64) -> (&AtomicU64, &AtomicU64) {
        match self.inboxes.get(c as usize) {
            Some(Some(b)) => b.peer_call(seq),
            _ => self.arena.peer_call(c, seq),
        }
    }

    /// Withdraws every post of a receiving step (the call ends): first from the reassembly
    /// state, so that no part claims one afterwards, then, under each socket's parse lock,
    /// from a part being read (its remaining bytes land in its slot). Afterwards nothing is
    /// written to memory a post named.
    pub(super) fn revoke_posts(&self) {
        for inb in self.inbound.iter().flatten() {
            inb.revoke();
        }
        for peer in &self.peers {
            for sock in &peer.socks {
                let mut rx = sock.rx.lock().unwrap_or_else(|e| e.into_inner());
                if let Stage::Payload(.., direct) = &mut rx.stage {
                    direct.clear();
                }
            }
        }
        self.live_posts.store(0, Ordering::Release);
    }

    /// Reads what every peer has sent, without blocking, on the sockets no other thread is
    /// reading right now. Peers marked failed too (see [`Inner::poll_conn`]).
    pub(super) fn pump_all(&self) {
        for (p, peer) in self.peers.iter().enumerate() {
            for s in 0..peer.socks.len() {
                self.pump_try(p, s);
            }
        }
    }

    /// Reads what the peer of connection `c` has sent, without blocking, on the sockets no
    /// other thread is reading right now.
    ///
    /// A peer marked failed is read too, until its stream ends: a rank that exits right
    /// after its last message of a call (its bytes are with this host's kernel) is often
    /// marked failed first by a write to it (the keeper's heartbeat, a credit: `EPIPE` once
    /// its host answered with a reset), while this rank, behind, has yet to read that
    /// message. Skipping it would fail a call over a message that arrived. Reading ends at
    /// its end of stream or reset ([`Stage::Closed`]); a wait for a message it never sent
    /// then reports the failure as before.
    pub(super) fn poll_conn(&self, c: u32) {
        let p = match self.dirs[c as usize] {
            Dir::In(p) | Dir::Out(p) => p as usize,
            Dir::Local => return,
        };
        for s in 0..self.nsocks {
            self.pump_try(p, s);
        }
    }

    /// Pumps socket `s` of peer `p` unless another thread holds it; a failure marks the
    /// peer failed and wakes the socket's receiving thread so that it ends.
    pub(super) fn pump_try(&self, p: usize, s: usize) {
        let Ok(rx) = self.peers[p].socks[s].rx.try_lock() else {
            return;
        };
        self.pump_held(p, s, rx);
    }

    /// Reads what peer `p`'s sockets hold now, waiting for a thread that is reading one: a
    /// failed peer's last messages before [`Net::peer_failure`](super::Net) reports it.
    pub(super) fn drain(&self, p: usize) {
        for (s, sock) in self.peers[p].socks.iter().enumerate() {
            self.pump_held(p, s, sock.rx.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// [`pump`] with the socket's parse state held.
    fn pump_held(&self, p: usize, s: usize, mut rx: std::sync::MutexGuard<'_, RxState>) {
        if let Err(why) = pump(self, p, s, &mut rx) {
            rx.stage = Stage::Closed;
            drop(rx);
            self.fail(p, why);
            let _ = self.peers[p].socks[s].read.shutdown(Shutdown::Both);
        }
    }
}
