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
//!   context switches on the cores the ranks run on). A message lands in the receiver's
//!   ring slot and is published with the same Release store a local sender would make.
//! - Freeing a slot records a credit; it rides in the same `writev` as the next data for
//!   that peer, and is written on its own only when the rank waits or is idle. See
//!   `proto` for the credit window that keeps every slot reserved before its bytes arrive.
//!
//! Why not a proxy thread that polls the rings (NCCL's design): the rank's engine already
//! runs exactly when it has data to send or waits for data, so doing the socket work there
//! needs no polling thread, no extra copy and no wake-up latency. The IR's semantics hold:
//! messages of a connection stay in order, a send needs only a free slot (credit), and a
//! schedule proven deadlock-free stays so (a network connection buffers up to
//! `2 × CONNECTION_SLOTS` messages, which for determinate programs can only remove waits,
//! never add them).
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

pub mod iface;
pub(crate) mod proto;
#[cfg(feature = "rdma")]
pub mod rdma;

use crate::arena::Arena;
use crate::engine::raise_abort;
use crate::error::{ExecError, Result};
use crate::program::ConnTable;
use crate::transport::{Dir, Seg, Transport};
use proto::{Header, Inbound, Tag};
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

const DATA_MAGIC: &[u8; 8] = b"HCCLDATA";
const DATA_PROTOCOL: u32 = 2;
const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);
const SOCKET_BUFFER: usize = 4 << 20;
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

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

/// A listening socket for data connections, on the interface `cfg` selects.
pub(crate) fn listen(
    cfg: &NetConfig,
    master: SocketAddr,
) -> std::result::Result<TcpListener, String> {
    let ifs = iface::interfaces().map_err(|e| format!("listing interfaces: {e}"))?;
    let chosen = iface::choose(cfg.ifname.as_ref(), master, &ifs)?;
    let listener = TcpListener::bind(SocketAddr::new(chosen.ip, 0))
        .map_err(|e| format!("listening on {} ({}): {e}", chosen.ip, chosen.name))?;
    tracing::debug!(iface = %chosen.name, addr = %chosen.ip, "data listener");
    Ok(listener)
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

/// One rank's network connections (see the module docs).
pub(crate) struct Net {
    inner: Arc<Inner>,
    helpers: Vec<mpsc::Sender<PartJob>>,
    helper_done: Mutex<mpsc::Receiver<std::io::Result<()>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    keeper: Option<std::thread::JoinHandle<()>>,
    /// Queue pairs to the peers, when the RDMA transport carries the data.
    #[cfg(feature = "rdma")]
    ib: Option<rdma::Links>,
    /// Waits seen by [`Net::on_wait`].
    waits: std::sync::atomic::AtomicU32,
}

/// Everything [`connect`] needs.
pub(crate) struct Setup<'a> {
    pub me: u32,
    pub world: u32,
    /// Host identity per rank.
    pub hosts: &'a [String],
    /// Data listener address per rank.
    pub addrs: &'a [String],
    pub conns: &'a ConnTable,
    pub token: &'a str,
    pub nonce: &'a str,
    pub cfg: &'a NetConfig,
    pub slot_bytes: usize,
    /// Data parts carry a CRC32C of their payload (`HCCL_CHECKSUM=1`).
    pub checksum: bool,
    pub timeout: Duration,
    pub arena: Arc<Arena>,
    pub listener: Option<TcpListener>,
    pub deadline: Instant,
}

/// Appends a length-prefixed string (the bootstrap and hello encoding).
pub(crate) fn write_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Reads a little-endian `u32`.
pub(crate) fn read_u32(s: &mut (impl Read + ?Sized)) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Reads a length-prefixed UTF-8 string of at most 4096 bytes.
pub(crate) fn read_str(s: &mut (impl Read + ?Sized)) -> std::io::Result<String> {
    let len = read_u32(s)?;
    if len > 4096 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "field too long",
        ));
    }
    let mut b = vec![0u8; len as usize];
    s.read_exact(&mut b)?;
    String::from_utf8(b)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Compares secrets without an early exit on the first differing byte.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let r = socket2::SockRef::from(s);
    let _ = r.set_send_buffer_size(SOCKET_BUFFER);
    let _ = r.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = r.set_keepalive(true);
}

/// Opens the data connections to every rank on another host that shares a connection
/// with this one. `Ok(None)` when there is none (a one-host job pays nothing).
///
/// Phases: the peers ([`remote_peers`]); the authenticated sockets, dialled to higher ranks
/// and accepted from lower ones ([`open_sockets`]); how each connection of the plan
/// relates to them ([`routes`]); RDMA, when chosen, set up over them; the receiving,
/// sending and keeper threads started ([`start_threads`]).
pub(crate) fn connect(mut setup: Setup<'_>) -> Result<Option<Net>> {
    let me = setup.me;
    let boot_err = |message: String| ExecError::Bootstrap { rank: me, message };
    let (ranks, peer_of) = remote_peers(&setup);
    if ranks.is_empty() {
        return Ok(None);
    }
    #[cfg(not(feature = "rdma"))]
    if setup.cfg.kind == NetKind::Ib {
        return Err(boot_err(
            "HCCL_NET=ib: this build has no RDMA support (build with --features rdma)".into(),
        ));
    }
    #[cfg(not(feature = "rdma"))]
    if setup.cfg.kind == NetKind::Auto {
        tracing::info!(rank = me, "built without RDMA; using TCP");
    }
    let listener = setup.listener.take().ok_or_else(|| {
        boot_err("ranks on other hosts need a data listener but none could be opened".into())
    })?;
    let nsocks = setup.cfg.nsocks;
    let peers = open_sockets(&setup, &listener, &ranks, &peer_of)?;
    let (dirs, channels) = routes(&setup, &peer_of);
    let inner = Arc::new(Inner::new(
        (me, setup.world),
        setup.hosts.to_vec(),
        setup.arena,
        peers,
        dirs,
        channels,
        (setup.slot_bytes, nsocks, setup.checksum),
        silence_for(setup.timeout),
    ));
    // RDMA, when chosen, is set up over the authenticated TCP sockets (queue-pair
    // information travels on socket 0 of each peer) before their receiving threads start.
    #[cfg(feature = "rdma")]
    let ib = rdma::Links::establish(&inner, setup.cfg).map_err(boot_err)?;
    // From here on every socket is non-blocking (see `write_all_nb` and `pump`).
    for peer in &inner.peers {
        for sock in &peer.socks {
            sock.read
                .set_nonblocking(true)
                .map_err(|e| boot_err(format!("configuring a socket: {e}")))?;
        }
    }
    let Threads {
        threads,
        helpers,
        done_rx,
        keeper,
    } = start_threads(&inner, setup.cfg.nthreads)
        .map_err(|e| boot_err(format!("starting a network thread: {e}")))?;
    #[cfg(feature = "rdma")]
    let transport = if ib.is_some() { "RDMA" } else { "TCP" };
    #[cfg(not(feature = "rdma"))]
    let transport = "TCP";
    tracing::info!(
        rank = me,
        peers = inner.peers.len(),
        nsocks,
        nthreads = setup.cfg.nthreads,
        transport,
        "network connections ready"
    );
    Ok(Some(Net {
        inner,
        helpers,
        helper_done: Mutex::new(done_rx),
        threads,
        keeper: Some(keeper),
        #[cfg(feature = "rdma")]
        ib,
        waits: std::sync::atomic::AtomicU32::new(0),
    }))
}

/// The ranks on other hosts that share a connection of the plan with this rank, in
/// increasing order, and per rank of the job its index among them.
fn remote_peers(setup: &Setup<'_>) -> (Vec<u32>, Vec<Option<u16>>) {
    let me = setup.me;
    let mine = &setup.hosts[me as usize];
    let mut peer_of: Vec<Option<u16>> = vec![None; setup.world as usize];
    let mut ranks: Vec<u32> = Vec::new();
    for ((from, to, _), _) in setup.conns.iter() {
        let other = if from == me {
            to
        } else if to == me {
            from
        } else {
            continue;
        };
        if &setup.hosts[other as usize] != mine && peer_of[other as usize].is_none() {
            peer_of[other as usize] = Some(0);
            ranks.push(other);
        }
    }
    ranks.sort_unstable();
    for (i, r) in ranks.iter().enumerate() {
        peer_of[*r as usize] = Some(i as u16);
    }
    (ranks, peer_of)
}

/// The `HCCL_NSOCKS` sockets to each of `ranks` (their indices: `peer_of`): this rank dials
/// the higher ranks while a thread accepts the lower ones on `listener`; each socket tuned,
/// blocking, with its write half duplicated.
fn open_sockets(
    setup: &Setup<'_>,
    listener: &TcpListener,
    ranks: &[u32],
    peer_of: &[Option<u16>],
) -> Result<Vec<Peer>> {
    let me = setup.me;
    let boot_err = |message: String| ExecError::Bootstrap { rank: me, message };
    let nsocks = setup.cfg.nsocks;
    // Sockets per peer, by socket index.
    let mut socks: Vec<Vec<Option<TcpStream>>> = ranks
        .iter()
        .map(|_| (0..nsocks).map(|_| None).collect())
        .collect();
    let lower: Vec<u32> = ranks.iter().copied().filter(|&r| r < me).collect();
    let higher: Vec<u32> = ranks.iter().copied().filter(|&r| r > me).collect();
    let accepted = std::thread::scope(|scope| {
        let acceptor = scope.spawn(|| accept_all(setup, listener, &lower, nsocks));
        let mut out: Result<()> = Ok(());
        'peers: for &p in &higher {
            let row = &mut socks[peer_of[p as usize].unwrap_or(0) as usize];
            for (s, slot) in row.iter_mut().enumerate() {
                match dial(setup, p, s) {
                    Ok(stream) => *slot = Some(stream),
                    Err(e) => {
                        out = Err(e);
                        break 'peers;
                    }
                }
            }
        }
        let acc = acceptor
            .join()
            .unwrap_or_else(|_| Err(boot_err("the data acceptor panicked".into())));
        out.and(acc)
    })?;
    let mut by_peer = socks;
    for (from, s, stream) in accepted {
        if let Some(i) = peer_of[from as usize] {
            by_peer[i as usize][s] = Some(stream);
        }
    }
    let mut peers = Vec::with_capacity(ranks.len());
    for (i, &r) in ranks.iter().enumerate() {
        let mut list = Vec::with_capacity(nsocks);
        for (s, slot) in by_peer[i].iter_mut().enumerate() {
            let stream = slot
                .take()
                .ok_or_else(|| boot_err(format!("no data connection {s} with rank {r}")))?;
            tune(&stream);
            let _ = stream.set_read_timeout(None);
            let write = stream
                .try_clone()
                .map_err(|e| boot_err(format!("duplicating a socket: {e}")))?;
            list.push(Sock {
                read: stream,
                write: Mutex::new(write),
                rx: Mutex::new(RxState::default()),
            });
        }
        peers.push(Peer {
            rank: r,
            host: setup.hosts[r as usize].clone(),
            addr: setup.addrs[r as usize].clone(),
            socks: list,
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(String::new()),
            last_recv: AtomicU64::new(0),
        });
    }
    Ok(peers)
}

/// How each connection of the plan relates to the network (its direction and peer index),
/// and its channel.
fn routes(setup: &Setup<'_>, peer_of: &[Option<u16>]) -> (Vec<Dir>, Vec<u32>) {
    let me = setup.me;
    let mut dirs = vec![Dir::Local; setup.conns.len()];
    let mut channels = vec![0u32; setup.conns.len()];
    for ((from, to, channel), c) in setup.conns.iter() {
        channels[c as usize] = channel;
        if from == me
            && let Some(p) = peer_of[to as usize]
        {
            dirs[c as usize] = Dir::Out(p);
        } else if to == me
            && let Some(p) = peer_of[from as usize]
        {
            dirs[c as usize] = Dir::In(p);
        }
    }
    (dirs, channels)
}

/// The threads of a rank's network besides its engine.
struct Threads {
    /// Receiving threads (one per socket) and the sending helpers.
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Per sending helper: where the engine hands it a part.
    helpers: Vec<mpsc::Sender<PartJob>>,
    /// Where the helpers report each part written.
    done_rx: mpsc::Receiver<std::io::Result<()>>,
    keeper: std::thread::JoinHandle<()>,
}

/// Starts the receiving thread of every socket, `nthreads - 1` sending helpers and the
/// keeper.
fn start_threads(inner: &Arc<Inner>, nthreads: usize) -> std::io::Result<Threads> {
    let nsocks = inner.nsocks;
    let mut threads = Vec::new();
    for p in 0..inner.peers.len() {
        for s in 0..nsocks {
            let inner = Arc::clone(inner);
            let h = std::thread::Builder::new()
                .name(format!("hccl-rx{}-{}", inner.peers[p].rank, s))
                .spawn(move || {
                    crate::affinity::unbind_current_thread();
                    receive_loop(&inner, p, s)
                })?;
            threads.push(h);
        }
    }
    let (done_tx, done_rx) = mpsc::channel();
    let mut helpers = Vec::new();
    for t in 1..nthreads {
        let (tx, rx) = mpsc::channel::<PartJob>();
        let inner2 = Arc::clone(inner);
        let done = done_tx.clone();
        let h = std::thread::Builder::new()
            .name(format!("hccl-tx{t}"))
            .spawn(move || {
                crate::affinity::unbind_current_thread();
                while let Ok((p, s, segs, hdr, call)) = rx.recv() {
                    let _ = done.send(write_part_on(&inner2, p, s, &hdr, &segs, &call));
                }
            })?;
        helpers.push(tx);
        threads.push(h);
    }
    let keeper_inner = Arc::clone(inner);
    let keeper = std::thread::Builder::new()
        .name("hccl-net".into())
        .spawn(move || {
            crate::affinity::unbind_current_thread();
            keeper_loop(&keeper_inner)
        })?;
    Ok(Threads {
        threads,
        helpers,
        done_rx,
        keeper,
    })
}

fn dial(setup: &Setup<'_>, peer: u32, sock: usize) -> Result<TcpStream> {
    let me = setup.me;
    let addr_text = &setup.addrs[peer as usize];
    let boot_err = |message: String| ExecError::Bootstrap { rank: me, message };
    let addr: SocketAddr = addr_text.parse().map_err(|_| {
        boot_err(format!(
            "rank {peer} (host {}) has no usable data address ({addr_text:?})",
            setup.hosts[peer as usize]
        ))
    })?;
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, HELLO_TIMEOUT) {
            Ok(s) => break s,
            Err(e) => {
                if Instant::now() >= setup.deadline {
                    return Err(boot_err(format!(
                        "cannot reach rank {peer} on host {} at {addr}: {e}",
                        setup.hosts[peer as usize]
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let hello = data_hello(
        setup.token,
        setup.nonce,
        [me, peer, sock as u32, setup.cfg.nsocks as u32],
    );
    let io = |e: std::io::Error| {
        boot_err(format!(
            "data connection {sock} to rank {peer} on host {} ({addr}): {e}",
            setup.hosts[peer as usize]
        ))
    };
    stream.write_all(&hello).map_err(io)?;
    let wait = setup
        .deadline
        .saturating_duration_since(Instant::now())
        .max(HELLO_TIMEOUT);
    let _ = stream.set_read_timeout(Some(wait));
    let mut ack = [0u8; 1];
    match stream.read_exact(&mut ack) {
        Ok(()) if ack[0] == 1 => Ok(stream),
        Ok(()) => Err(boot_err(format!(
            "rank {peer} on host {} refused data connection {sock}: its HCCL_NSOCKS differs from this rank's ({})",
            setup.hosts[peer as usize], setup.cfg.nsocks
        ))),
        Err(e) => Err(io(e)),
    }
}

/// Accepts `nsocks` authenticated connections from each rank in `from`; anything else is
/// closed and logged.
fn accept_all(
    setup: &Setup<'_>,
    listener: &TcpListener,
    from: &[u32],
    nsocks: usize,
) -> Result<Vec<(u32, usize, TcpStream)>> {
    let me = setup.me;
    let mut want: std::collections::BTreeSet<(u32, usize)> = from
        .iter()
        .flat_map(|&r| (0..nsocks).map(move |s| (r, s)))
        .collect();
    let _ = listener.set_nonblocking(true);
    let mut got = Vec::new();
    while !want.is_empty() {
        match listener.accept() {
            Ok((mut stream, addr)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
                match read_data_hello(&mut stream, setup) {
                    Ok((r, s, theirs)) if want.contains(&(r, s)) => {
                        if theirs != nsocks {
                            tracing::warn!(rank = me, %addr, peer = r, "refused a data connection: HCCL_NSOCKS={theirs} there but {nsocks} here");
                            let _ = stream.write_all(&[0]);
                            continue;
                        }
                        if stream.write_all(&[1]).is_ok() {
                            want.remove(&(r, s));
                            got.push((r, s, stream));
                        }
                    }
                    Ok((r, s, _)) => {
                        tracing::warn!(rank = me, %addr, "refused a data connection: rank {r} socket {s} is not expected here");
                    }
                    Err(why) => {
                        tracing::warn!(rank = me, %addr, "refused a data connection: {why}");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= setup.deadline {
                    let missing: Vec<u32> = want.iter().map(|(r, _)| *r).collect();
                    return Err(ExecError::Bootstrap {
                        rank: me,
                        message: format!(
                            "timed out waiting for data connections from ranks {missing:?}"
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                return Err(ExecError::Io {
                    rank: me,
                    what: "accepting a data connection".into(),
                    source: e,
                });
            }
        }
    }
    Ok(got)
}

/// The hello that opens data connection `sock` from rank `from` to rank `to`, whose ranks
/// open `nsocks` per pair: `[from, to, sock, nsocks]`.
pub(crate) fn data_hello(token: &str, nonce: &str, [from, to, sock, nsocks]: [u32; 4]) -> Vec<u8> {
    let mut hello = DATA_MAGIC.to_vec();
    hello.extend_from_slice(&DATA_PROTOCOL.to_le_bytes());
    write_str(&mut hello, token);
    write_str(&mut hello, nonce);
    for v in [from, to, sock, nsocks] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    hello
}

fn read_data_hello(
    s: &mut TcpStream,
    setup: &Setup<'_>,
) -> std::result::Result<(u32, usize, usize), String> {
    parse_data_hello(s, (setup.me, setup.world), setup.token, setup.nonce)
}

/// Reads a data connection's hello ([`data_hello`]) addressed to rank `me` of `world` with
/// this job's `token` and `nonce`: the sender's rank, its socket index and its socket count.
pub(crate) fn parse_data_hello(
    s: &mut (impl Read + ?Sized),
    (me, world): (u32, u32),
    token: &str,
    nonce: &str,
) -> std::result::Result<(u32, usize, usize), String> {
    let (expected_token, expected_nonce) = (token, nonce);
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic)
        .map_err(|e| format!("no hello: {e}"))?;
    if &magic != DATA_MAGIC {
        return Err("wrong magic".into());
    }
    let io = |e: std::io::Error| format!("malformed hello: {e}");
    if read_u32(s).map_err(io)? != DATA_PROTOCOL {
        return Err("unknown protocol version".into());
    }
    let token = read_str(s).map_err(io)?;
    let nonce = read_str(s).map_err(io)?;
    if !same_secret(&token, expected_token) {
        return Err("wrong job token".into());
    }
    if nonce != expected_nonce {
        return Err("a connection of another job (nonce differs)".into());
    }
    let from = read_u32(s).map_err(io)?;
    let to = read_u32(s).map_err(io)?;
    let sock = read_u32(s).map_err(io)? as usize;
    let theirs = read_u32(s).map_err(io)? as usize;
    if to != me || from >= world {
        return Err(format!("hello from rank {from} to rank {to}: unknown rank"));
    }
    Ok((from, sock, theirs))
}

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
        let inbound = dirs
            .iter()
            .map(|d| matches!(d, Dir::In(_)).then(Inbound::default))
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

    /// Reads what every live peer has sent, without blocking, on the sockets no other
    /// thread is reading right now.
    fn pump_all(&self) {
        for (p, peer) in self.peers.iter().enumerate() {
            if peer.state.load(Ordering::Acquire) != ALIVE {
                continue;
            }
            for s in 0..peer.socks.len() {
                self.pump_try(p, s);
            }
        }
    }

    /// Pumps socket `s` of peer `p` unless another thread holds it; a failure marks the
    /// peer failed and wakes the socket's receiving thread so that it ends.
    fn pump_try(&self, p: usize, s: usize) {
        let sock = &self.peers[p].socks[s];
        let Ok(mut rx) = sock.rx.try_lock() else {
            return;
        };
        if let Err(why) = pump(self, p, s, &mut rx) {
            rx.stage = Stage::Closed;
            drop(rx);
            self.fail(p, why);
            let _ = sock.read.shutdown(Shutdown::Both);
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

fn receive_loop(inner: &Inner, p: usize, s: usize) {
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
enum Pumped {
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

/// Where a socket's incoming byte stream stands (partial frames survive between pumps).
#[derive(Debug)]
struct RxState {
    stage: Stage,
    hdr: [u8; proto::HEADER],
    got: usize,
    said_goodbye: bool,
    ahead: ReadAhead,
}

impl Default for RxState {
    fn default() -> RxState {
        RxState {
            stage: Stage::Header,
            hdr: [0; proto::HEADER],
            got: 0,
            said_goodbye: false,
            ahead: ReadAhead::default(),
        }
    }
}

/// Bytes read from a socket ahead of the parser, so that a small message (header, segment
/// table and payload) costs one `recv` instead of three. Reads of [`READ_AHEAD`] bytes or
/// more go straight to their destination.
#[derive(Debug, Default)]
struct ReadAhead {
    buf: Vec<u8>,
    pos: usize,
}

const READ_AHEAD: usize = 16 * 1024;

/// Where a pump's bytes come from: a peer's socket, or (fuzzing, tests) bytes in memory.
pub(crate) trait Recv {
    /// Like [`recv_now`]: `Ok(None)` when nothing is there now, `Ok(Some(0))` at the end.
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>>;
    /// The peer said goodbye: this side will write nothing more either.
    fn shutdown_write(&self);
}

impl Recv for TcpStream {
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        recv_now(self, buf)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl ReadAhead {
    /// Like [`recv_now`], served from the bytes read ahead first.
    fn read(&mut self, sock: &impl Recv, dst: &mut [u8]) -> std::io::Result<Option<usize>> {
        if self.pos == self.buf.len() && !dst.is_empty() {
            if dst.len() >= READ_AHEAD {
                return sock.recv(dst);
            }
            self.buf.resize(READ_AHEAD, 0);
            self.pos = 0;
            match sock.recv(&mut self.buf) {
                Ok(Some(n)) => self.buf.truncate(n),
                other => {
                    self.buf.clear();
                    return other;
                }
            }
            if self.buf.is_empty() {
                return Ok(Some(0));
            }
        }
        let n = dst.len().min(self.buf.len() - self.pos);
        dst[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(Some(n))
    }
}

#[derive(Debug)]
enum Stage {
    Header,
    Table(Header, Vec<u8>),
    /// Data part: header, segments, current segment, bytes of it already read, the CRC32C
    /// of the payload so far.
    Payload(Header, Vec<(u32, u32)>, usize, usize, u32),
    /// What follows a data part's payload ([`proto::trailer_len`]): header, the payload's
    /// CRC32C as received, the trailer's bytes so far.
    Trailer(Header, u32, [u8; proto::MAX_TRAILER], usize),
    Closed,
}

/// Non-blocking receive into `buf`: `Ok(None)` when nothing is there now, `Ok(Some(0))` at
/// the end of the stream.
fn recv_now(sock: &TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is valid for writes of its length; the descriptor is open for as
        // long as `sock` lives.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(None),
            std::io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Reads and handles whatever frames (or parts of frames) socket `s` of peer `p` holds now,
/// without blocking; `Err` describes a failure of the peer.
fn pump(
    inner: &Inner,
    p: usize,
    s: usize,
    rx: &mut RxState,
) -> std::result::Result<Pumped, String> {
    pump_from(inner, p, &inner.peers[p].socks[s].read, rx)
}

/// [`pump`] with the bytes of peer `p` coming from `sock`.
fn pump_from(
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
            Stage::Payload(h, segs, i, done, crc) => {
                if *i < segs.len() {
                    let (off, len) = segs[*i];
                    let slot = inner.arena.slot(h.conn, h.seq);
                    // SAFETY: the credit window reserves this slot for message `seq` (its
                    // previous message was consumed: `Inbound::begin` checked), and the
                    // segment lies inside the slot (`check_segments`).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            slot.add(off as usize + *done),
                            len as usize - *done,
                        )
                    };
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
                    let (num, _) = inner.arena.peer_call(h.conn, h.seq);
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
    inb.begin(h.seq, h.a, inner.nsocks as u32, consumed)
        .map_err(bad)?;
    Ok(Stage::Payload(h, segs, 0, 0, 0))
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
            .arena
            .crc(c, seq)
            .store(crate::arena::corrupt_mark(seq), Ordering::Relaxed);
    }
    if let Some((number, print)) = call {
        // The receiving step compares it with its own call (see `Arena::peer_call`).
        let (num, word) = inner.arena.peer_call(c, seq);
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

/// Whether `sock` has bytes to read (or an end of stream) right now.
fn bytes_waiting(sock: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: a one-byte buffer; the descriptor is open while `sock` lives.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

fn keeper_loop(inner: &Inner) {
    let mut last_beat = Instant::now();
    while !inner.leaving.load(Ordering::Acquire) {
        std::thread::park_timeout(HEARTBEAT_EVERY / 4);
        if inner.leaving.load(Ordering::Acquire) {
            break;
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
                if let Ok(mut w) = peer.socks[0].write.try_lock() {
                    let mut slices = [IoSlice::new(&beat)];
                    if let Err(e) = write_all_nb(&mut w, &mut slices, inner.silence, &mut || {}) {
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
    /// soon as they arrive instead of waiting for that thread to be scheduled.
    fn poll(&self, c: u32) {
        let p = match self.inner.dirs[c as usize] {
            Dir::In(p) | Dir::Out(p) => p as usize,
            Dir::Local => return,
        };
        if self.inner.peers[p].state.load(Ordering::Acquire) != ALIVE {
            return;
        }
        for s in 0..self.inner.nsocks {
            self.inner.pump_try(p, s);
        }
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
    }

    /// `None` while `rank` (on another host) is alive, else why it is not.
    fn peer_failure(&self, rank: u32) -> Option<String> {
        let peer = self.inner.peers.iter().find(|p| p.rank == rank)?;
        if peer.state.load(Ordering::Acquire) == ALIVE {
            return None;
        }
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

/// Bytes in memory as a peer's stream ([`fuzz_frames`]): served `chunk` bytes at a time,
/// with nothing there on every `block`-th read (from the second read on; `0`: never).
struct Bytes<'a> {
    data: &'a [u8],
    pos: std::cell::Cell<usize>,
    reads: std::cell::Cell<usize>,
    chunk: usize,
    block: usize,
}

impl Recv for Bytes<'_> {
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        let reads = self.reads.get() + 1;
        self.reads.set(reads);
        let pos = self.pos.get();
        if pos < self.data.len() && self.block > 1 && reads.is_multiple_of(self.block) {
            return Ok(None);
        }
        let n = buf.len().min(self.chunk).min(self.data.len() - pos);
        buf[..n].copy_from_slice(&self.data[pos..pos + n]);
        self.pos.set(pos + n);
        Ok(Some(n))
    }
    fn shutdown_write(&self) {}
}

/// Feeds `input` to the frame parser of a rank 1 of 2 whose peer is rank 0, as bytes that
/// peer sent (the fuzzing entry point, `hccl_executor::fuzz::frames`). The first byte
/// chooses how the stream is read (bytes per read, reads that find nothing) and how many
/// sockets the ranks use; the rest is the stream. Between pumps the local receiver frees
/// every published message, so well-formed streams can go on past the credit window.
///
/// Returns how the stream ended: `Ok` after a goodbye, else the parser's complaint (an
/// empty input is `Ok`). Panics when the parser breaks an invariant: a message published
/// outside the credit window, a credit for more messages than this rank sent (4), a byte
/// written outside the slots of the connections the peer sends on, or a pump that neither
/// reads nor ends.
pub(crate) fn fuzz_frames(input: &[u8]) -> std::result::Result<(), String> {
    use crate::arena::Layout;
    const SLOT: usize = 4096;
    let Some((&config, stream)) = input.split_first() else {
        return Ok(());
    };
    let chunk = [1, 7, 32, 4096, usize::MAX][usize::from(config & 7) % 5];
    let block = usize::from(config >> 3 & 3);
    let nsocks = 1 + usize::from(config >> 5 & 3);
    // Connections 1 and 3 come from rank 0 (channels 5 and 7), 2 goes to it (channel 3), 0
    // and 4 stay on this host: their slots, around the others, must stay untouched.
    let dirs = vec![Dir::Local, Dir::In(0), Dir::Out(0), Dir::In(0), Dir::Local];
    let Some(arena) = Arena::heap(Layout::new(2, dirs.len(), SLOT)) else {
        return Err("no memory for the arena".into());
    };
    let inner = Inner::new(
        (1, 2),
        vec!["h0".into(), "h1".into()],
        Arc::new(arena),
        vec![Peer {
            rank: 0,
            host: "h0".into(),
            addr: "127.0.0.1:1".into(),
            socks: Vec::new(),
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(String::new()),
            last_recv: AtomicU64::new(0),
        }],
        dirs,
        vec![0, 5, 3, 7, 1],
        (SLOT, nsocks, false),
        Duration::from_secs(10),
    );
    // This rank has sent 4 messages on connection 2: credits up to 4 are well-formed.
    const SENT: u64 = 4;
    inner.sent_out[2].store(SENT, Ordering::Release);
    let src = Bytes {
        data: stream,
        pos: std::cell::Cell::new(0),
        reads: std::cell::Cell::new(0),
        chunk,
        block,
    };
    let mut rx = RxState::default();
    let mut idle = 0usize;
    let end = loop {
        let before = src.pos.get();
        let res = pump_from(&inner, 0, &src, &mut rx);
        for c in [1u32, 3] {
            let sent = inner.arena.sent(c).load(Ordering::Acquire);
            let consumed = inner.arena.consumed(c).load(Ordering::Acquire);
            assert!(
                sent <= consumed + hccl_ir::CONNECTION_SLOTS as u64,
                "connection {c}: {sent} messages published, {consumed} consumed"
            );
            // The local receiver frees what was published.
            inner.arena.consumed(c).store(sent, Ordering::Release);
        }
        let credited = inner.arena.consumed(2).load(Ordering::Acquire);
        assert!(
            credited <= SENT,
            "a credit for {credited} messages on a connection that sent {SENT}"
        );
        match res {
            Ok(Pumped::Closed) => break Ok(()),
            Err(why) => break Err(why),
            Ok(Pumped::Idle | Pumped::Progress) => {
                if src.pos.get() == before {
                    idle += 1;
                    assert!(idle <= 4, "the pump neither reads nor ends");
                } else {
                    idle = 0;
                }
            }
        }
    };
    for c in [0u32, 2, 4] {
        for seq in 0..hccl_ir::CONNECTION_SLOTS as u64 {
            // SAFETY: a slot is SLOT bytes of the heap arena, and nothing writes it now.
            let slot = unsafe { std::slice::from_raw_parts(inner.arena.slot(c, seq), SLOT) };
            assert!(
                slot.iter().all(|&b| b == 0),
                "bytes from the network landed in a slot of connection {c}"
            );
        }
    }
    end
}

/// Well-formed streams for [`fuzz_frames`] (behind their first byte): seeds for the fuzzer.
pub(crate) fn frame_seeds() -> Vec<Vec<u8>> {
    fn part(
        channel: u32,
        seq: u64,
        (parts, flags): (u32, u8),
        segs: &[(u32, u32)],
        call: Option<(u64, u64)>,
    ) -> Vec<u8> {
        let payload: Vec<u8> = segs
            .iter()
            .flat_map(|&(off, len)| (0..len).map(move |i| (off + i) as u8 | 1))
            .collect();
        let mut h = Header::new(Tag::Data);
        h.flags = flags;
        h.conn = channel;
        h.seq = seq;
        h.a = parts;
        h.b = segs.len() as u32;
        h.c = payload.len() as u32;
        let mut out = h.encode().to_vec();
        for (o, l) in segs {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
        out.extend_from_slice(&payload);
        if flags & proto::FLAG_CRC != 0 {
            out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        }
        if let Some((number, print)) = call {
            out.extend_from_slice(&number.to_le_bytes());
            out.extend_from_slice(&print.to_le_bytes());
        }
        out
    }
    let frame = |tag: Tag, conn: u32, seq: u64, (a, b): (u32, u32)| {
        let mut h = Header::new(tag);
        h.conn = conn;
        h.seq = seq;
        h.a = a;
        h.b = b;
        h.encode().to_vec()
    };
    let goodbye = frame(Tag::Goodbye, 0, 0, (0, 0));
    // First bytes: one read for everything and one socket; one byte per read, every other
    // read finding nothing, two sockets.
    let (whole, trickle) = (4u8, 2 << 3 | 1 << 5);
    let mut plain = part(5, 0, (1, 0), &[(0, 4), (64, 4)], None);
    plain.extend(part(5, 1, (1, 0), &[], None));
    plain.extend(frame(Tag::Credit, 3, 3, (0, 0)));
    plain.extend(frame(Tag::Heartbeat, 0, 0, (0, 0)));
    plain.extend(&goodbye);
    let mut checked = Vec::new();
    let both = proto::FLAG_CRC | proto::FLAG_CALL;
    // Two messages: the window the peer may fill before it hears of a freed slot.
    for seq in 0..2 {
        checked.extend(part(
            7,
            seq,
            (1, both),
            &[(0, 40), (128, 24)],
            Some((seq + 1, 0xabcd)),
        ));
    }
    checked.extend(part(5, 0, (1, proto::FLAG_CRC), &[(8, 16)], None));
    checked.extend(frame(Tag::Abort, 0, 0, (0, 1)));
    checked.extend(&goodbye);
    let mut split = part(5, 0, (2, 0), &[(0, 100)], None);
    split.extend(part(7, 0, (1, proto::FLAG_CALL), &[(0, 8)], Some((1, 2))));
    split.extend(part(5, 0, (2, 0), &[(100, 50), (4000, 96)], None));
    split.extend(&goodbye);
    let with = |first: u8, body: &[u8]| {
        let mut v = vec![first];
        v.extend_from_slice(body);
        v
    };
    vec![
        with(whole, &plain),
        with(trickle, &plain),
        with(whole, &checked),
        with(trickle, &checked),
        with(trickle, &split),
        with(whole | 1 << 5, &split[..split.len() - 40]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::Layout;

    const SLOT: usize = 4096;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// A rank 1 whose only peer is rank 0, reached through `sock`; connection 0 goes to
    /// rank 0, connection 1 comes from it.
    fn inner_with(sock: TcpStream) -> Arc<Inner> {
        let arena = Arc::new(Arena::heap(Layout::new(2, 2, SLOT)).expect("heap arena"));
        let write = sock.try_clone().unwrap();
        Arc::new(Inner::new(
            (1, 2),
            vec!["h0".into(), "h1".into()],
            arena,
            vec![Peer {
                rank: 0,
                host: "h0".into(),
                addr: "127.0.0.1:1".into(),
                socks: vec![Sock {
                    read: sock,
                    write: Mutex::new(write),
                    rx: Mutex::new(RxState::default()),
                }],
                state: AtomicU8::new(ALIVE),
                reason: Mutex::new(String::new()),
                last_recv: AtomicU64::new(0),
            }],
            vec![Dir::Out(0), Dir::In(0)],
            // Connection 0 on channel 3, connection 1 on channel 5 (what frames name).
            vec![3, 5],
            (SLOT, 1, false),
            Duration::from_secs(10),
        ))
    }

    fn data(conn: u32, seq: u64, segs: &[(u32, u32)]) -> Vec<u8> {
        let mut h = Header::new(Tag::Data);
        h.conn = conn;
        h.seq = seq;
        h.a = 1;
        h.b = segs.len() as u32;
        h.c = segs.iter().map(|s| s.1).sum();
        let mut out = h.encode().to_vec();
        for (o, l) in segs {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }

    fn slot_bytes(inner: &Inner, c: u32, seq: u64) -> Vec<u8> {
        // SAFETY: the slot is SLOT bytes of the heap arena; no thread writes it any more.
        unsafe { std::slice::from_raw_parts(inner.arena.slot(c, seq), SLOT).to_vec() }
    }

    /// Feeds `bytes` (then closes, unless `keep_open`) to a receiving thread and returns
    /// the peer's state and reason once it stopped.
    fn feed(bytes: &[u8]) -> (Arc<Inner>, u8, String) {
        feed_after(bytes, 0)
    }

    /// [`feed`] to a rank that has sent `sent` messages on connection 0.
    fn feed_after(bytes: &[u8], sent: u64) -> (Arc<Inner>, u8, String) {
        let (mut attacker, ours) = pair();
        let inner = inner_with(ours);
        inner.sent_out[0].store(sent, Ordering::Release);
        let t = {
            let inner = Arc::clone(&inner);
            std::thread::spawn(move || receive_loop(&inner, 0, 0))
        };
        attacker.write_all(bytes).unwrap();
        drop(attacker);
        t.join().unwrap();
        let state = inner.peers[0].state.load(Ordering::Acquire);
        let reason = inner.peers[0].reason.lock().unwrap().clone();
        (inner, state, reason)
    }

    #[test]
    fn malformed_frames_close_the_connection_and_never_touch_a_slot() {
        let mut header_then_short = data(5, 0, &[(0, 64)]);
        header_then_short.extend_from_slice(&[7u8; 10]);
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("garbage", vec![0xAB; 40], "malformed frame"),
            (
                "wrong direction",
                data(3, 0, &[(0, 8)]),
                "channel 3, where it has no connection to this rank",
            ),
            ("unknown connection", data(9, 0, &[(0, 8)]), "channel 9"),
            (
                "segment past the slot",
                data(5, 0, &[(SLOT as u32 - 8, 64)]),
                "outside",
            ),
            (
                "outside the credit window",
                data(5, 2, &[(0, 8)]),
                "credit window",
            ),
            (
                "too many segments",
                {
                    let mut h = Header::new(Tag::Data);
                    h.conn = 5;
                    h.a = 1;
                    h.b = proto::MAX_SEGS + 1;
                    h.encode().to_vec()
                },
                "segments",
            ),
            (
                "closed mid-message",
                header_then_short,
                "middle of a message",
            ),
            (
                "closed without goodbye",
                Vec::new(),
                "without saying goodbye",
            ),
        ];
        for (what, bytes, want) in cases {
            let (inner, state, reason) = feed(&bytes);
            assert_eq!(state, DEAD, "{what}: {reason}");
            assert!(reason.contains(want), "{what}: {reason}");
            assert!(reason.contains("rank 0 on host h0"), "{what}: {reason}");
            assert_eq!(
                inner.arena.abort().load(Ordering::Acquire),
                0,
                "{what}: a waiting rank reports it, not the receiver"
            );
            assert_eq!(
                inner.arena.sent(1).load(Ordering::Acquire),
                0,
                "{what}: nothing published"
            );
            if want != "middle of a message" {
                assert!(
                    slot_bytes(&inner, 1, 0).iter().all(|&b| b == 0),
                    "{what}: slot untouched"
                );
            }
        }
    }

    #[test]
    fn a_valid_message_lands_in_its_slot_and_goodbye_is_not_a_failure() {
        let mut bytes = data(5, 0, &[(0, 4), (64, 4)]);
        bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        // An empty message (no segments) is a message too.
        bytes.extend_from_slice(&data(5, 1, &[]));
        let mut credit = Header::new(Tag::Credit);
        credit.conn = 3;
        credit.seq = 3;
        bytes.extend_from_slice(&credit.encode());
        bytes.extend_from_slice(&Header::new(Tag::Heartbeat).encode());
        bytes.extend_from_slice(&Header::new(Tag::Goodbye).encode());
        let (inner, state, reason) = feed_after(&bytes, 3);
        assert_eq!(state, GONE, "{reason}");
        assert_eq!(inner.arena.abort().load(Ordering::Acquire), 0);
        assert_eq!(inner.arena.sent(1).load(Ordering::Acquire), 2);
        assert_eq!(inner.arena.consumed(0).load(Ordering::Acquire), 3);
        let slot = slot_bytes(&inner, 1, 0);
        assert_eq!(&slot[0..4], &[1, 2, 3, 4]);
        assert_eq!(&slot[64..68], &[5, 6, 7, 8]);
    }

    /// Found by review while writing the `frames` fuzz target (which now checks it): a credit
    /// frame for more messages than this rank sent was taken, so a peer could make the
    /// engine count free slots that do not exist (`send_seq - consumed` underflows: a panic
    /// with overflow checks, a sender stalled to the timeout without them). It is a
    /// malformed frame now.
    #[test]
    fn a_credit_for_messages_never_sent_is_a_malformed_frame() {
        for (sent, credit) in [(0, 1), (3, 4), (3, u64::MAX)] {
            let mut h = Header::new(Tag::Credit);
            h.conn = 3;
            h.seq = credit;
            let (inner, state, reason) = feed_after(&h.encode(), sent);
            assert_eq!(state, DEAD, "{sent} sent, credit {credit}: {reason}");
            assert!(
                reason.contains(&format!(
                    "credit for {credit} messages on channel 3, where this rank sent {sent}"
                )),
                "{reason}"
            );
            assert_eq!(inner.arena.consumed(0).load(Ordering::Acquire), 0);
        }
    }

    #[test]
    fn an_abort_frame_raises_the_local_abort_word() {
        let mut h = Header::new(Tag::Abort);
        h.a = 0;
        h.b = 1;
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&Header::new(Tag::Goodbye).encode());
        let (inner, state, _) = feed(&bytes);
        assert_eq!(state, GONE);
        assert_eq!(
            inner.arena.abort().load(Ordering::Acquire),
            crate::engine::abort_word(0, 1)
        );
        // An abort naming a rank outside the job is a malformed frame.
        let mut h = Header::new(Tag::Abort);
        h.a = 7;
        let (_, state, reason) = feed(&h.encode());
        assert_eq!(state, DEAD);
        assert!(reason.contains("abort naming"), "{reason}");
    }

    #[test]
    fn the_fuzzing_seeds_are_streams_that_end_in_goodbye() {
        let seeds = frame_seeds();
        let (last, whole) = seeds.split_last().unwrap();
        for (i, seed) in whole.iter().enumerate() {
            assert_eq!(fuzz_frames(seed), Ok(()), "seed {i}");
        }
        // The last one is cut short inside a message.
        let err = fuzz_frames(last).unwrap_err();
        assert!(err.contains("middle of a message"), "{err}");
        // Any cut of a seed is refused without a panic.
        for cut in 1..seeds[2].len() {
            let _ = fuzz_frames(&seeds[2][..cut]);
        }
    }

    #[test]
    fn strangers_are_refused_and_the_real_peer_gets_in() {
        let arena = Arc::new(Arena::heap(Layout::new(2, 0, SLOT)).expect("heap arena"));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hosts = vec!["h0".to_string(), "h1".to_string()];
        let addrs = vec![String::new(), addr.clone()];
        let conns = ConnTable::default();
        let cfg = NetConfig::default();
        let setup = |me: u32| Setup {
            me,
            world: 2,
            hosts: &hosts,
            addrs: &addrs,
            conns: &conns,
            token: "job-token",
            nonce: "nonce-1",
            cfg: &cfg,
            slot_bytes: SLOT,
            checksum: false,
            timeout: Duration::from_secs(30),
            arena: Arc::clone(&arena),
            listener: None,
            deadline: Instant::now() + Duration::from_secs(30),
        };
        let hello = |token: &str, nonce: &str, from: u32, to: u32| {
            let mut b = DATA_MAGIC.to_vec();
            b.extend_from_slice(&DATA_PROTOCOL.to_le_bytes());
            write_str(&mut b, token);
            write_str(&mut b, nonce);
            for v in [from, to, 0, 1] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b
        };
        let strangers: Vec<Vec<u8>> = vec![
            b"GET / HTTP/1.0\r\n\r\n".to_vec(),
            hello("wrong-token", "nonce-1", 0, 1),
            hello("job-token", "another-job", 0, 1),
            hello("job-token", "nonce-1", 5, 1),
            hello("job-token", "nonce-1", 0, 0),
            b"HCCLDATA\x01\x00\x00\x00\xff\xff\xff\xff".to_vec(),
        ];
        std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_all(&setup(1), &listener, &[0], 1));
            for bytes in &strangers {
                let mut st = TcpStream::connect(&addr).unwrap();
                st.write_all(bytes).unwrap();
                let _ = st.shutdown(Shutdown::Write);
                st.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut reply = Vec::new();
                let _ = st.read_to_end(&mut reply);
                assert!(reply.is_empty(), "a stranger got a reply: {reply:?}");
            }
            let mine = dial(&setup(0), 1, 0).expect("the real rank 0 is let in");
            let got = acceptor.join().unwrap().expect("accepted");
            assert_eq!(got.len(), 1);
            assert_eq!((got[0].0, got[0].1), (0, 0));
            assert_eq!(got[0].2.peer_addr().unwrap(), mine.local_addr().unwrap());
        });
    }
}
