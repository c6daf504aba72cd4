//! Connections between ranks on different hosts.
//!
//! # Design
//!
//! Every host keeps the process backend's shared region (one `/dev/shm` file per host) with
//! a ring for *every* connection of the plan, so the replay engine runs unchanged. A
//! connection whose ends are on different hosts has a ring on both: the sender's ring only
//! counts credits, the receiver's holds the data.
//!
//! - The sending engine writes a message straight from its buffers (or from its slot, for
//!   steps that reduce into the slot) to the peer's non-blocking socket with one `writev`;
//!   while the socket is full it reads what its peers send (`Inner::pump_all`), so two
//!   ranks writing to each other never wait on each other.
//! - Incoming bytes are parsed by whoever holds the socket's parse state (`pump`): during
//!   a call the engine, whenever it waits (no wake-up latency); between calls the socket's
//!   receiving thread, which sleeps through calls (a wake-up per message would cost two
//!   context switches on the cores the ranks run on). A message lands in the connection's
//!   inbox (`inbox`: a ring of `window` slots in the receiving rank's memory, deeper than
//!   the shared region's) and is published with the same Release store a local sender
//!   would make; the engine reads it there ([`crate::transport::Transport::landed`]).
//! - Freeing a slot records a credit; it rides in the same `writev` as the next data for
//!   that peer, and is written on its own only when the rank waits or is idle. See
//!   `proto` for the credit window that keeps every slot reserved before its bytes arrive.
//!
//! Why not a proxy thread that polls the rings (NCCL's design): the rank's engine already
//! runs exactly when it has data to send or waits for data, so doing the socket work there
//! needs no polling thread, no extra copy and no wake-up latency. The IR's semantics hold:
//! messages of a connection stay in order, a send needs only a free slot (credit), and a
//! schedule proven deadlock-free stays so (a network connection buffers up to `window`
//! messages, at least `CONNECTION_SLOTS`, which for determinate programs can only remove
//! waits, never add them).
//!
//! # Sockets and threads
//!
//! Per pair of ranks on different hosts: `HCCL_NSOCKS` TCP connections (default 1), opened
//! by the lower rank, authenticated with the job token and job nonce (anything else is
//! closed and logged at WARN before a byte reaches a slot), `TCP_NODELAY`, 4 MiB socket
//! buffers. A message of at least 2 × 64 KiB is split into up to `HCCL_NSOCKS` parts, one
//! per socket; with `HCCL_NTHREADS` > 1 that many threads write the parts concurrently.
//! Each socket has one receiving thread; one keeper thread per rank sends heartbeats,
//! notices silent peers (a host whose link went down), hands over credits between calls and
//! forwards this host's abort word to the other hosts.

#[doc(hidden)]
pub(crate) mod fuzz;
mod handle;
pub mod iface;
pub(crate) mod inbox;
pub(crate) mod proto;
mod pump;
#[cfg(feature = "rdma")]
pub mod rdma;
pub(crate) mod setup;
mod stream;
#[cfg(test)]
mod tests;

use crate::arena::Arena;
use crate::transport::{Dir, Seg};
use proto::{Header, Inbound, Tag};
use std::io::{IoSlice, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream::{RxState, bytes_waiting};

const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);
pub use crate::config::{NetConfig, NetKind};

/// This host's identity: `HCCL_HOST_ID`, else [`machine_id`].
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("HCCL_HOST_ID")
        && !id.trim().is_empty()
    {
        return id.trim().to_string();
    }
    machine_id()
}

/// The machine's identity, whatever `HCCL_HOST_ID` says: the host name and the kernel's
/// boot id. Ranks of emulated hosts on one machine share its cores, which decides how long
/// a waiting rank may spin.
pub fn machine_id() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let name = read("/proc/sys/kernel/hostname");
    let boot = read("/proc/sys/kernel/random/boot_id");
    format!("{name}/{boot}")
}

/// How long a peer may stay silent (heartbeats stopped, a write blocked) before it counts as
/// failed: half the timeout, within 1–10 s, so that failures are named within the timeout.
fn silence_for(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// How connections are named on the wire. Each host numbers only the connections of its
/// own ranks (see `ConnTable`), so indices differ between hosts; a frame names its
/// connection by the connection's channel instead, which with the socket's pair of ranks and
/// the frame's direction (data from the peer, credits for data to it) is the connection's
/// key `(from, to, channel)`.
#[derive(Debug, Default)]
pub(crate) struct Wires {
    /// Per local connection: its channel (what frames carry).
    wire: Vec<u32>,
    /// Per peer: channel of a connection from it to this rank → local index.
    incoming: Vec<std::collections::HashMap<u32, u32>>,
    /// Per peer: channel of a connection from this rank to it → local index.
    outgoing: Vec<std::collections::HashMap<u32, u32>>,
}

impl Wires {
    /// `channels[c]`: connection `c`'s channel; `dirs[c]`: how it relates to this rank.
    pub(crate) fn new(dirs: &[Dir], channels: Vec<u32>, npeers: usize) -> Wires {
        let mut incoming = vec![std::collections::HashMap::new(); npeers];
        let mut outgoing = vec![std::collections::HashMap::new(); npeers];
        for (c, d) in dirs.iter().enumerate() {
            match *d {
                Dir::In(p) => {
                    incoming[p as usize].insert(channels[c], c as u32);
                }
                Dir::Out(p) => {
                    outgoing[p as usize].insert(channels[c], c as u32);
                }
                Dir::Local => {}
            }
        }
        Wires {
            wire: channels,
            incoming,
            outgoing,
        }
    }

    /// What frames carry for local connection `c`.
    pub(crate) fn of(&self, c: u32) -> u32 {
        self.wire[c as usize]
    }

    /// The local connection that peer `p`'s data frames naming `wire` are for.
    pub(crate) fn incoming(&self, p: usize, wire: u32) -> Option<u32> {
        self.incoming.get(p)?.get(&wire).copied()
    }

    /// The local connection that peer `p`'s credit frames naming `wire` are for.
    pub(crate) fn outgoing(&self, p: usize, wire: u32) -> Option<u32> {
        self.outgoing.get(p)?.get(&wire).copied()
    }
}

const ALIVE: u8 = 0;
const GONE: u8 = 1;
const DEAD: u8 = 2;

struct Sock {
    read: TcpStream,
    write: Mutex<TcpStream>,
    /// The incoming stream's parse state; whoever holds it may read the socket (the
    /// receiving thread, or the engine while it waits for this peer).
    rx: Mutex<RxState>,
}

struct Peer {
    rank: u32,
    host: String,
    addr: String,
    socks: Vec<Sock>,
    state: AtomicU8,
    reason: Mutex<String>,
    /// Milliseconds since `Inner::epoch` of the last frame received.
    last_recv: AtomicU64,
}

struct Inner {
    me: u32,
    world: u32,
    hosts: Vec<String>,
    arena: Arc<Arena>,
    peers: Vec<Peer>,
    dirs: Vec<Dir>,
    wires: Wires,
    inbound: Vec<Option<Inbound>>,
    /// Per connection this rank receives on: where its messages land over TCP.
    inboxes: Vec<Option<inbox::Inbox>>,
    /// Messages a TCP connection may have in flight ([`inbox::window`]).
    window: usize,
    /// Posts of receiving steps not yet withdrawn (`Transport::post`).
    live_posts: AtomicUsize,
    slot_bytes: usize,
    nsocks: usize,
    /// Data parts this rank sends carry a CRC32C ([`proto::FLAG_CRC`]).
    checksum: bool,
    silence: Duration,
    epoch: Instant,
    leaving: AtomicBool,
    abort_sent: AtomicBool,
    receivers_done: AtomicUsize,
    /// A collective call is running: its engine reads the sockets whenever it waits, and
    /// the receiving threads stay asleep (each wake-up would cost a context switch on the
    /// cores the ranks run on). Between calls the receiving threads read.
    active: AtomicBool,
    idle: (Mutex<()>, std::sync::Condvar),
    /// The first send of this call that failed: the peer's rank and why.
    send_failure: Mutex<Option<(u32, String)>>,
    /// Per connection this rank receives on: the consumed count to report, and the last
    /// one reported. Credits ride along with the next data written to the peer; they are
    /// written on their own only when this rank waits (`flush_credits`), so a bidirectional
    /// exchange costs no credit writes at all.
    credit_due: Vec<AtomicU64>,
    credit_sent: Vec<AtomicU64>,
    /// Per connection this rank sends on: messages handed to the network so far (raised
    /// before their bytes are written). A peer's credit can never exceed it.
    sent_out: Vec<AtomicU64>,
    /// Incoming connections per peer.
    in_conns: Vec<Vec<u32>>,
    credits_due: AtomicBool,
}

type PartJob = (usize, usize, Vec<Seg>, [u8; proto::HEADER], [u8; 16]);

/// Waits until `fd` is ready for `events` (or `timeout` passes).
fn wait_fd(fd: std::os::fd::RawFd, events: i16, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let _ = unsafe { libc::poll(&mut p, 1, ms) };
}

/// Writes all of `bufs` to a non-blocking socket. While the socket is full, `pump` runs (the
/// caller reads what peers send meanwhile, so that two ranks writing to each other cannot
/// wait on each other forever); a socket that stays full for `limit` is an error.
fn write_all_nb(
    w: &mut TcpStream,
    mut bufs: &mut [IoSlice<'_>],
    limit: Duration,
    pump: &mut dyn FnMut(),
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut stuck: Option<Instant> = None;
    while !bufs.is_empty() {
        match w.write_vectored(&bufs[..bufs.len().min(512)]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                IoSlice::advance_slices(&mut bufs, n);
                stuck = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *stuck.get_or_insert_with(Instant::now);
                if since.elapsed() >= limit {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the peer took nothing for {:.1} s", limit.as_secs_f64()),
                    ));
                }
                pump();
                wait_fd(w.as_raw_fd(), libc::POLLOUT, Duration::from_micros(200));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn part_slices<'a>(
    hdr: &'a [u8; proto::HEADER],
    table: &'a [u8],
    segs: &[Seg],
) -> Vec<IoSlice<'a>> {
    let mut slices = Vec::with_capacity(segs.len() + 2);
    slices.push(IoSlice::new(hdr));
    slices.push(IoSlice::new(table));
    for s in segs {
        // SAFETY: the engine that built `segs` keeps this memory alive and unchanged until
        // the send returns (see `Net::send`).
        slices.push(IoSlice::new(unsafe {
            std::slice::from_raw_parts(s.ptr, s.len)
        }));
    }
    slices
}

fn seg_table(segs: &[Seg]) -> Vec<u8> {
    let mut table = Vec::with_capacity(segs.len() * 8);
    for s in segs {
        table.extend_from_slice(&(s.off as u32).to_le_bytes());
        table.extend_from_slice(&(s.len as u32).to_le_bytes());
    }
    table
}

/// Writes one data part on socket `s` of peer `p`, reading from every peer meanwhile.
fn write_part_on(
    inner: &Inner,
    p: usize,
    s: usize,
    hdr: &[u8; proto::HEADER],
    segs: &[Seg],
    call: &[u8; 16],
) -> std::io::Result<()> {
    let table = seg_table(segs);
    let mut slices = part_slices(hdr, &table, segs);
    // The trailer the header's flags announce: the payload's CRC32C, the sender's call.
    let flags = hdr[1];
    let crc = (flags & proto::FLAG_CRC != 0).then(|| {
        segs.iter()
            .fold(0u32, |crc, seg| {
                // SAFETY: as in `part_slices`.
                crc32c::crc32c_append(crc, unsafe { std::slice::from_raw_parts(seg.ptr, seg.len) })
            })
            .to_le_bytes()
    });
    if let Some(crc) = &crc {
        slices.push(IoSlice::new(crc));
    }
    if flags & proto::FLAG_CALL != 0 {
        slices.push(IoSlice::new(call));
    }
    let mut w = inner.peers[p].socks[s]
        .write
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // Credits due to this peer ride in the same write.
    let credits = inner.take_due_credits(p);
    if !credits.is_empty() {
        slices.insert(0, IoSlice::new(&credits));
    }
    write_all_nb(&mut w, &mut slices, inner.silence, &mut || inner.pump_all())
}

/// Writes one frame on socket `s` of peer `p`, reading from every peer meanwhile.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
fn write_frame_on(inner: &Inner, p: usize, s: usize, h: &Header) -> std::io::Result<()> {
    let bytes = h.encode();
    let mut slices = [IoSlice::new(&bytes)];
    let mut w = inner.peers[p].socks[s]
        .write
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    write_all_nb(&mut w, &mut slices, inner.silence, &mut || inner.pump_all())
}

/// Writes one frame without reading meanwhile (the keeper, `Drop`): gives up after a second
/// of a full socket.
fn write_frame(sock: &Sock, h: &Header) -> std::io::Result<()> {
    let bytes = h.encode();
    let mut slices = [IoSlice::new(&bytes)];
    let mut w = sock.write.lock().unwrap_or_else(|e| e.into_inner());
    write_all_nb(&mut w, &mut slices, Duration::from_secs(1), &mut || {})
}

impl Inner {
    /// A rank's network state; everything per connection is derived from `dirs` (and
    /// `channels`, each connection's channel).
    #[allow(clippy::too_many_arguments)]
    fn new(
        (me, world): (u32, u32),
        hosts: Vec<String>,
        arena: Arc<Arena>,
        peers: Vec<Peer>,
        dirs: Vec<Dir>,
        channels: Vec<u32>,
        (slot_bytes, nsocks, checksum): (usize, usize, bool),
        silence: Duration,
    ) -> Inner {
        let mut in_conns: Vec<Vec<u32>> = vec![Vec::new(); peers.len()];
        for (c, d) in dirs.iter().enumerate() {
            if let Dir::In(p) = d {
                in_conns[*p as usize].push(c as u32);
            }
        }
        let window = inbox::window(slot_bytes);
        let inbound = dirs
            .iter()
            .map(|d| matches!(d, Dir::In(_)).then(|| Inbound::new(window)))
            .collect();
        let inboxes = dirs
            .iter()
            .map(|d| matches!(d, Dir::In(_)).then(|| inbox::Inbox::new(window, slot_bytes)))
            .collect();
        let counters = || (0..dirs.len()).map(|_| AtomicU64::new(0)).collect();
        let wires = Wires::new(&dirs, channels, peers.len());
        Inner {
            wires,
            me,
            world,
            hosts,
            arena,
            peers,
            inbound,
            inboxes,
            window,
            live_posts: AtomicUsize::new(0),
            slot_bytes,
            nsocks,
            checksum,
            silence,
            epoch: Instant::now(),
            leaving: AtomicBool::new(false),
            abort_sent: AtomicBool::new(false),
            receivers_done: AtomicUsize::new(0),
            active: AtomicBool::new(false),
            idle: (Mutex::new(()), std::sync::Condvar::new()),
            send_failure: Mutex::new(None),
            credit_due: counters(),
            credit_sent: counters(),
            sent_out: counters(),
            in_conns,
            credits_due: AtomicBool::new(false),
            dirs,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Forwards this host's abort word to the other hosts, once.
    fn forward_abort(&self) {
        let word = self.arena.abort().load(Ordering::Acquire);
        if word != 0 && !self.abort_sent.swap(true, Ordering::AcqRel) {
            let v = word - 1;
            let mut h = Header::new(Tag::Abort);
            h.a = (v >> 32) as u32;
            h.b = v as u32;
            for peer in &self.peers {
                if peer.state.load(Ordering::Acquire) == ALIVE {
                    let _ = write_frame(&peer.socks[0], &h);
                }
            }
        }
    }

    /// Credit frames due to peer `p` (each credit is claimed by exactly one writer).
    fn take_due_credits(&self, p: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for &c in &self.in_conns[p] {
            let due = self.credit_due[c as usize].load(Ordering::Acquire);
            if due > 0 && self.credit_sent[c as usize].fetch_max(due, Ordering::AcqRel) < due {
                let mut h = Header::new(Tag::Credit);
                h.conn = self.wires.of(c);
                h.seq = due;
                out.extend_from_slice(&h.encode());
            }
        }
        out
    }

    /// Writes every credit that is due on its own (the caller waits, or is idle). `pump`:
    /// read from peers while a socket is full (the engine); the keeper does not.
    fn flush_credits(&self, pump: bool) {
        if !self.credits_due.load(Ordering::Acquire)
            || !self.credits_due.swap(false, Ordering::AcqRel)
        {
            return;
        }
        for (p, peer) in self.peers.iter().enumerate() {
            if peer.state.load(Ordering::Acquire) != ALIVE {
                continue;
            }
            let frames = self.take_due_credits(p);
            if frames.is_empty() {
                continue;
            }
            let mut slices = [IoSlice::new(&frames)];
            let mut w = peer.socks[0]
                .write
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let _ = if pump {
                write_all_nb(&mut w, &mut slices, self.silence, &mut || self.pump_all())
            } else {
                write_all_nb(&mut w, &mut slices, Duration::from_secs(1), &mut || {})
            };
        }
    }

    /// Marks a peer failed (once). Nothing is aborted here: a rank that waits for the
    /// peer reports it (and raises the abort word), as it would for a dead local process, so
    /// a peer that exits after its last message never fails a call that needs nothing more
    /// from it. Protocol violations are logged at WARN, lost connections at INFO.
    fn fail(&self, p: usize, reason: String) {
        let peer = &self.peers[p];
        if peer
            .state
            .compare_exchange(ALIVE, DEAD, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *peer.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason.clone();
            if self.leaving.load(Ordering::Acquire) {
                return;
            }
            if reason.contains("malformed") {
                tracing::warn!(rank = self.me, peer = peer.rank, host = %peer.host, "{reason}; connection closed");
            } else {
                tracing::info!(rank = self.me, peer = peer.rank, host = %peer.host, "{reason}");
            }
        }
    }

    fn gone(&self, p: usize) {
        let peer = &self.peers[p];
        if peer
            .state
            .compare_exchange(ALIVE, GONE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *peer.reason.lock().unwrap_or_else(|e| e.into_inner()) =
                "it left the communicator".into();
        }
    }
}

/// Writes a heartbeat unless the socket is full: then the peer has bytes of this rank
/// unread, which its keeper counts as a sign of life, and waiting here for room (as long
/// as the peer takes to read) would hold up the heartbeats to every other peer until they
/// took this rank for dead. A frame begun is finished (within `limit`).
fn beat_on(w: &mut TcpStream, beat: &[u8], limit: Duration) -> std::io::Result<()> {
    match w.write(beat) {
        Ok(0) => Err(std::io::ErrorKind::WriteZero.into()),
        Ok(n) if n < beat.len() => {
            let mut slices = [IoSlice::new(&beat[n..])];
            write_all_nb(w, &mut slices, limit, &mut || {})
        }
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A keeper that slept this much longer than it asked to was not running (its process
/// stopped, or starved of CPU): see [`keeper_loop`].
const KEEPER_STALL: Duration = Duration::from_secs(1);

fn keeper_loop(inner: &Inner) {
    let mut last_beat = Instant::now();
    while !inner.leaving.load(Ordering::Acquire) {
        let asleep = Instant::now();
        std::thread::park_timeout(HEARTBEAT_EVERY / 4);
        if inner.leaving.load(Ordering::Acquire) {
            break;
        }
        if asleep.elapsed() >= KEEPER_STALL {
            // This rank did not run meanwhile (its process stopped, the machine swamped):
            // its peers' heartbeats went unread and, most likely, were not sent either (a
            // pause of the whole job). Silence this rank could not hear says nothing
            // about them: their clocks restart now, and heartbeats go out at once.
            let now = inner.now_ms();
            for peer in &inner.peers {
                peer.last_recv.fetch_max(now, Ordering::AcqRel);
            }
            last_beat = asleep;
        }
        inner.forward_abort();
        // Between calls nobody waits: hand over the credits still due.
        if !inner.active.load(Ordering::Acquire) {
            inner.flush_credits(false);
        }
        if last_beat.elapsed() >= HEARTBEAT_EVERY {
            last_beat = Instant::now();
            let now = inner.now_ms();
            let beat = Header::new(Tag::Heartbeat).encode();
            for (p, peer) in inner.peers.iter().enumerate() {
                if peer.state.load(Ordering::Acquire) != ALIVE {
                    continue;
                }
                // A socket busy with a message proves liveness already.
                if let Ok(mut w) = peer.socks[0].write.try_lock()
                    && let Err(e) = beat_on(&mut w, &beat, inner.silence)
                {
                    drop(w);
                    inner.fail(
                        p,
                        format!(
                            "sending to rank {} on host {} failed: {e}",
                            peer.rank, peer.host
                        ),
                    );
                    continue;
                }
                // Bytes waiting unread (an engine busy elsewhere) prove liveness too.
                if peer.socks.iter().any(|s| bytes_waiting(&s.read)) {
                    peer.last_recv.store(now, Ordering::Release);
                }
                let last = peer.last_recv.load(Ordering::Acquire);
                let silent = Duration::from_millis(now.saturating_sub(last));
                if silent >= inner.silence {
                    inner.fail(
                        p,
                        format!(
                            "nothing heard from rank {} on host {} ({}) for {:.1} s: its host or the network is down",
                            peer.rank,
                            peer.host,
                            peer.addr,
                            silent.as_secs_f64()
                        ),
                    );
                }
            }
        }
    }
}
