//! Opening a rank's connections to the ranks on other hosts: the data listener, the
//! authenticated sockets (dialled to higher ranks, accepted from lower ones, each opened by
//! a hello carrying token, nonce, ranks and socket index), how each connection of the plan
//! maps onto them, and the threads that serve them; and the wire helpers (strings, words,
//! secrets) the rendezvous shares with the hellos.

use super::handle::Net;
use super::pump::receive_loop;
#[cfg(feature = "rdma")]
use super::rdma;
use super::stream::RxState;
use super::{ALIVE, Inner, PartJob, Peer, Sock, keeper_loop, silence_for, write_part_on};
use crate::arena::Arena;
use crate::config::NetConfig;
#[cfg(not(feature = "rdma"))]
use crate::config::NetKind;
use crate::error::{ExecError, Result};
use crate::program::ConnTable;
use crate::transport::Dir;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, AtomicU64};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub(super) const DATA_MAGIC: &[u8; 8] = b"HCCLDATA";
pub(super) const DATA_PROTOCOL: u32 = 2;
const SOCKET_BUFFER: usize = 4 << 20;
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// A listening socket for data connections, on the interface `cfg` selects.
pub(crate) fn listen(
    cfg: &NetConfig,
    master: SocketAddr,
) -> std::result::Result<TcpListener, String> {
    let ifs = super::iface::interfaces().map_err(|e| format!("listing interfaces: {e}"))?;
    let chosen = super::iface::choose(cfg.ifname.as_ref(), master, &ifs)?;
    let listener = TcpListener::bind(SocketAddr::new(chosen.ip, 0))
        .map_err(|e| format!("listening on {} ({}): {e}", chosen.ip, chosen.name))?;
    tracing::debug!(iface = %chosen.name, addr = %chosen.ip, "data listener");
    Ok(listener)
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

pub(super) fn dial(setup: &Setup<'_>, peer: u32, sock: usize) -> Result<TcpStream> {
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
pub(super) fn accept_all(
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
