//! A rank's network as the engine and the communicator see it: [`Net`], its
//! [`Transport`] implementation (sending, credits, polling, liveness) and its teardown.

use super::proto::{self, Header, Tag};
#[cfg(feature = "rdma")]
use super::rdma;
use super::{ALIVE, DEAD, Inner, PartJob, write_frame, write_part_on};
use crate::transport::{Dir, Landed, Seg, Transport};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// One rank's network connections (see the module docs).
pub(crate) struct Net {
    pub(super) inner: Arc<Inner>,
    pub(super) helpers: Vec<mpsc::Sender<PartJob>>,
    pub(super) helper_done: Mutex<mpsc::Receiver<std::io::Result<()>>>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
    pub(super) keeper: Option<std::thread::JoinHandle<()>>,
    /// Queue pairs to the peers, when the RDMA transport carries the data.
    #[cfg(feature = "rdma")]
    pub(super) ib: Option<rdma::Links>,
    /// Waits seen by [`Net::on_wait`].
    pub(super) waits: std::sync::atomic::AtomicU32,
}

impl Transport for Net {
    /// How each connection of the plan relates to the network.
    fn dirs(&self) -> &[Dir] {
        &self.inner.dirs
    }

    /// Sends message `seq` of connection `c` (whose direction is `Out`), made of `segs`.
    /// Returns when the bytes are with the kernel; a failure marks the peer failed and
    /// raises the abort word (the engine reports it at its next wait).
    fn send(&self, c: u32, seq: u64, segs: &[Seg], call: Option<(u64, u64)>) {
        let Dir::Out(p) = self.inner.dirs[c as usize] else {
            return;
        };
        // Before any byte is written: the peer's credit for it may come back at once.
        self.inner.sent_out[c as usize].fetch_max(seq + 1, Ordering::Release);
        let p = p as usize;
        let peer = &self.inner.peers[p];
        if peer.state.load(Ordering::Acquire) != ALIVE {
            tracing::trace!(
                rank = self.inner.me,
                peer = peer.rank,
                conn = c,
                seq,
                "net send skipped: peer not alive"
            );
            return;
        }
        #[cfg(feature = "rdma")]
        if let Some(ib) = &self.ib {
            if let Err(e) = ib.send(&self.inner, p, c, seq, segs, call) {
                self.inner.fail(
                    p,
                    format!(
                        "RDMA send to rank {} on host {} failed: {e}",
                        peer.rank, peer.host
                    ),
                );
            }
            return;
        }
        let parts = proto::split(segs, self.inner.nsocks);
        let n = parts.len();
        tracing::trace!(
            rank = self.inner.me,
            peer = peer.rank,
            conn = c,
            seq,
            parts = n,
            "net send"
        );
        let mut result: std::io::Result<()> = Ok(());
        let mut handed = 0usize;
        let mut flags = if self.inner.checksum {
            proto::FLAG_CRC
        } else {
            0
        };
        if call.is_some() {
            flags |= proto::FLAG_CALL;
        }
        let call_bytes = proto::call_trailer(call);
        for (j, part) in parts.into_iter().enumerate() {
            let mut h = Header::new(Tag::Data);
            h.flags = flags;
            h.conn = self.inner.wires.of(c);
            h.seq = seq;
            h.a = n as u32;
            h.b = part.len() as u32;
            h.c = part.iter().map(|s| s.len).sum::<usize>() as u32;
            let sock = (c as usize + j) % self.inner.nsocks;
            let hdr = h.encode();
            if j > 0 && j <= self.helpers.len() {
                if self.helpers[j - 1]
                    .send((p, sock, part, hdr, call_bytes))
                    .is_ok()
                {
                    handed += 1;
                } else {
                    result = Err(std::io::Error::other("a network send thread stopped"));
                }
                continue;
            }
            if let Err(e) = write_part_on(&self.inner, p, sock, &hdr, &part, &call_bytes)
                && result.is_ok()
            {
                result = Err(e);
            }
        }
        if handed > 0 {
            let done = self.helper_done.lock().unwrap_or_else(|e| e.into_inner());
            for _ in 0..handed {
                match done.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => result = Err(e),
                    Err(_) => result = Err(std::io::Error::other("a network send thread stopped")),
                }
            }
        }
        if let Err(e) = result {
            let why = format!(
                "sending to rank {} on host {} ({}) failed: {e}",
                peer.rank, peer.host, peer.addr
            );
            self.inner
                .send_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert((peer.rank, why.clone()));
            self.inner.fail(p, why);
        }
    }

    /// Over TCP the receiver's inbox is `inbox::window` messages deep; over RDMA the
    /// remote writes land in the shared region's [`hccl_ir::CONNECTION_SLOTS`] slots.
    fn window(&self) -> u64 {
        #[cfg(feature = "rdma")]
        if self.ib.is_some() {
            return hccl_ir::CONNECTION_SLOTS as u64;
        }
        self.inner.window as u64
    }

    /// Messages from the peer land in the connection's inbox over TCP.
    fn landed(&self, c: u32, seq: u64) -> Option<Landed<'_>> {
        #[cfg(feature = "rdma")]
        if self.ib.is_some() {
            return None;
        }
        let b = self.inner.inboxes.get(c as usize)?.as_ref()?;
        Some(Landed {
            data: b.slot(seq),
            crc: b.crc(seq),
            call: b.peer_call(seq),
        })
    }

    /// Offers the receiving step's destinations to the message's reassembly (TCP only: over
    /// RDMA the remote writes land in the shared region).
    fn post(&self, c: u32, seq: u64, ranges: Vec<Seg>) -> bool {
        #[cfg(feature = "rdma")]
        if self.ib.is_some() {
            return false;
        }
        let Some(Some(inb)) = self.inner.inbound.get(c as usize) else {
            return false;
        };
        let taken = inb.post(seq, ranges);
        if taken {
            self.inner.live_posts.fetch_add(1, Ordering::AcqRel);
        }
        taken
    }

    fn take_post(&self, c: u32, seq: u64) -> bool {
        let Some(Some(inb)) = self.inner.inbound.get(c as usize) else {
            return false;
        };
        if self.inner.live_posts.load(Ordering::Acquire) == 0 {
            return false;
        }
        let Some(landed) = inb.take_post(seq) else {
            return false;
        };
        self.inner.live_posts.fetch_sub(1, Ordering::AcqRel);
        landed
    }

    /// Records that `consumed` messages of connection `c` (direction `In`) are consumed;
    /// the credit reaches the sender with the next data written to it, or when this rank
    /// waits ([`Net::flush_credits`]). Failures are left to the receiving side, which tells
    /// a peer that left (goodbye, then end of stream) from one that died.
    fn credit(&self, c: u32, consumed: u64) {
        let Dir::In(p) = self.inner.dirs[c as usize] else {
            return;
        };
        let peer = &self.inner.peers[p as usize];
        if peer.state.load(Ordering::Acquire) != ALIVE {
            return;
        }
        #[cfg(feature = "rdma")]
        if let Some(ib) = &self.ib {
            ib.credit(&self.inner, p as usize, c, consumed);
            return;
        }
        self.inner.credit_due[c as usize].fetch_max(consumed, Ordering::AcqRel);
        self.inner.credits_due.store(true, Ordering::Release);
    }

    /// This rank cannot make progress: write the credits that are due (a peer may be
    /// waiting for one to send what this rank waits for), and every few waits read from
    /// every peer, not only the one waited for: a peer blocked writing to this rank may be
    /// what the awaited peer waits for, and the receiving threads sleep during calls.
    fn on_wait(&self) {
        self.inner.flush_credits(true);
        if self.waits.fetch_add(1, Ordering::Relaxed).is_multiple_of(4) {
            self.inner.pump_all();
        }
    }

    /// Reads whatever the peer of connection `c` has sent (data, credits) without blocking,
    /// unless its receiving thread is at it already: a waiting engine picks up messages as
    /// soon as they arrive instead of waiting for that thread to be scheduled
    /// ([`Inner::poll_conn`]).
    fn poll(&self, c: u32) {
        self.inner.poll_conn(c);
    }

    /// A call failed: tell the other hosts now (the process may exit right away, before
    /// the keeper's next look), so that they name the rank that failed first rather than
    /// this one.
    fn forward_abort(&self) {
        self.inner.forward_abort();
    }

    /// The first failed send since the last call of this, if any.
    fn take_send_failure(&self) -> Option<(u32, String)> {
        self.inner
            .send_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// A collective call starts: its engine reads the sockets from now on.
    fn begin_call(&self) {
        self.inner.active.store(true, Ordering::Release);
    }

    /// The call ended: the receiving threads may read again (they look every
    /// `HEARTBEAT_EVERY`; nothing between calls is urgent, and waking them after every call
    /// would cost two context switches per call).
    fn end_call(&self) {
        self.inner.active.store(false, Ordering::Release);
        if self.inner.live_posts.load(Ordering::Acquire) > 0 {
            self.inner.revoke_posts();
        }
    }

    /// `None` while `rank` (on another host) is alive, else why it is not. A failed peer's
    /// sockets are read first ([`Inner::drain`], waiting for a thread that is reading them):
    /// the wait that asks finds, when it looks again, a message that arrived before the
    /// failure was noticed.
    fn peer_failure(&self, rank: u32) -> Option<String> {
        let (p, peer) = self
            .inner
            .peers
            .iter()
            .enumerate()
            .find(|(_, p)| p.rank == rank)?;
        if peer.state.load(Ordering::Acquire) == ALIVE {
            return None;
        }
        self.inner.drain(p);
        Some(
            peer.reason
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// The host identity of `rank`.
    fn host_of(&self, rank: u32) -> &str {
        self.inner
            .hosts
            .get(rank as usize)
            .map_or("?", |h| h.as_str())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let inner = &self.inner;
        // From here on, a peer closing its side is expected, not a failure.
        inner.leaving.store(true, Ordering::Release);
        {
            let (m, cv) = &inner.idle;
            let _g = m.lock().unwrap_or_else(|e| e.into_inner());
            cv.notify_all();
        }
        // Say goodbye on every socket, then stop writing; keep reading until the peers
        // close their side (so nothing they sent is refused with a reset), for a while.
        let bye = Header::new(Tag::Goodbye);
        for peer in &inner.peers {
            for sock in &peer.socks {
                if peer.state.load(Ordering::Acquire) != DEAD {
                    let _ = write_frame(sock, &bye);
                }
                let _ = sock.read.shutdown(Shutdown::Write);
            }
        }
        if let Some(k) = self.keeper.take() {
            k.thread().unpark();
            let _ = k.join();
        }
        let receivers = inner.peers.len() * inner.nsocks;
        let until = Instant::now() + Duration::from_secs(1);
        while inner.receivers_done.load(Ordering::Acquire) < receivers && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        for peer in &inner.peers {
            for sock in &peer.socks {
                let _ = sock.read.shutdown(Shutdown::Both);
            }
        }
        self.helpers.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
