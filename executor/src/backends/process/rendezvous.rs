//! The rendezvous through rank 0: every rank's hello (plan identity, host, data address,
//! the limits its plan needs), rank 0's answer (the job's nonce, hosts, addresses and
//! limits, or what stops the job), and the barriers every phase of the start ends with, so
//! that every rank fails together, naming the rank that could not go on.

use crate::backends::net::{
    self,
    setup::{read_str, read_u32, same_secret, write_str},
};
use crate::config::Config;
use crate::error::{ExecError, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub(super) const HELLO_MAGIC: &[u8; 8] = b"HCCLBOOT";
/// Version of the bootstrap messages and of the shared region's layout (5: every message
/// carries its sender's call in the region, `arena`).
pub(super) const PROTOCOL: u32 = 5;

/// A rank that speaks another bootstrap protocol: another build of hccl.
#[derive(Debug)]
pub(super) struct OtherVersion(u32);

impl std::fmt::Display for OtherVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it speaks bootstrap protocol {}, this rank {PROTOCOL}: every rank of a job must run \
             the same hccl build",
            self.0
        )
    }
}

impl std::error::Error for OtherVersion {}
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to rendezvous.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// Rank 0's listening address (`MASTER_ADDR:MASTER_PORT`).
    pub addr: String,
    /// Shared secret every rank must present.
    pub token: String,
    /// This rank's host identity; `None`: `HCCL_HOST_ID`, else host name and boot id
    /// ([`net::host_id`]). Ranks of one host share memory, others talk over the network.
    pub host: Option<String>,
}

impl Bootstrap {
    /// From `MASTER_ADDR` (default `127.0.0.1`), `MASTER_PORT` (default 29500) and
    /// `HCCL_JOB_TOKEN` (default empty).
    pub fn from_env() -> Bootstrap {
        let host = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
        let port = std::env::var("MASTER_PORT").unwrap_or_else(|_| "29500".into());
        Bootstrap {
            addr: format!("{host}:{port}"),
            token: std::env::var("HCCL_JOB_TOKEN").unwrap_or_default(),
            host: None,
        }
    }
}

/// Makes ranks that claim one host identity but cannot share memory different hosts:
/// those on different machines (host name and boot id; only an explicit `HCCL_HOST_ID`
/// can make them claim one host) or with different shared-memory directories
/// ([`shm_identity`]). Each rank of such a host gets the identity `HOST+shm:DEV:INO` (or
/// `HOST+machine:…`); host identities whose ranks all agree stay as they are. Returns one
/// line per host identity split this way.
pub(super) fn split_hosts(
    hosts: &mut [String],
    machines: &[String],
    shms: &[String],
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for first in 0..hosts.len() {
        let host = hosts[first].clone();
        if seen.contains(&host) {
            continue;
        }
        seen.push(host.clone());
        let ranks: Vec<usize> = (first..hosts.len()).filter(|&r| hosts[r] == host).collect();
        let key = |r: usize| (machines[r].as_str(), shms[r].as_str());
        let mut groups: Vec<((&str, &str), Vec<usize>)> = Vec::new();
        for &r in &ranks {
            match groups.iter_mut().find(|(k, _)| *k == key(r)) {
                Some((_, g)) => g.push(r),
                None => groups.push((key(r), vec![r])),
            }
        }
        if groups.len() < 2 {
            continue;
        }
        let machines_differ = groups.iter().any(|((m, _), _)| *m != groups[0].0.0);
        let why = if machines_differ {
            "are on different machines (host name and boot id)"
        } else {
            "do not share a shared-memory directory (HCCL_SHM_DIR, default /dev/shm: \
             containers with a /dev/shm of their own?)"
        };
        let listed: Vec<String> = groups.iter().map(|(_, g)| format!("{g:?}")).collect();
        lines.push(format!(
            "ranks {} claim host {host} but {why}",
            listed.join(" and ")
        ));
        for ((machine, shm), group) in groups {
            let suffix = if machines_differ {
                format!("+machine:{machine}+shm:{shm}")
            } else {
                format!("+shm:{shm}")
            };
            for r in group {
                hosts[r] = format!("{host}{suffix}");
            }
        }
    }
    lines
}

/// Every rank reports `problem` (or success) to rank 0, which answers all with the first
/// problem of any rank; so every rank fails together, naming the rank that could not go on.
pub(super) fn barrier(
    rank: u32,
    socks: &mut [TcpStream],
    problem: Option<String>,
    deadline: Instant,
) -> Result<()> {
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(STEP_TIMEOUT);
    if rank == 0 {
        let mut first = problem.map(|p| format!("rank 0: {p}"));
        for (i, s) in socks.iter_mut().enumerate() {
            let _ = s.set_read_timeout(Some(wait));
            let mut ok = [0u8; 1];
            let report = s
                .read_exact(&mut ok)
                .and_then(|()| read_str(s))
                .map_err(|e| format!("rank {}: lost during the rendezvous: {e}", i + 1));
            match report {
                Ok(text) if ok[0] != 1 && first.is_none() => {
                    first = Some(format!("rank {}: {text}", i + 1));
                }
                Err(e) if first.is_none() => first = Some(e),
                _ => {}
            }
        }
        let mut msg = vec![u8::from(first.is_none())];
        write_str(&mut msg, first.as_deref().unwrap_or(""));
        for s in socks.iter_mut() {
            let _ = s.write_all(&msg);
        }
        match first {
            None => Ok(()),
            Some(p) => Err(boot_err(p)),
        }
    } else {
        let sock = &mut socks[0];
        let mut msg = vec![u8::from(problem.is_none())];
        write_str(&mut msg, problem.as_deref().unwrap_or(""));
        sock.write_all(&msg)
            .map_err(io_err(rank, "reporting to rank 0"))?;
        let _ = sock.set_read_timeout(Some(wait));
        let mut ok = [0u8; 1];
        sock.read_exact(&mut ok)
            .map_err(io_err(rank, "waiting for rank 0"))?;
        let text = read_str(sock).map_err(io_err(rank, "reading rank 0's verdict"))?;
        if ok[0] == 1 {
            Ok(())
        } else {
            Err(boot_err(text))
        }
    }
}

pub(super) fn io_err(
    rank: u32,
    what: impl Into<String>,
) -> impl FnOnce(std::io::Error) -> ExecError {
    let what = what.into();
    move |source| ExecError::Io { rank, what, source }
}

pub(super) fn write_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) rank: u32,
    pub(super) world: u32,
    pub(super) hash: String,
    pub(super) error: String,
    /// Host identity ([`net::host_id`]).
    pub(super) host: String,
    /// Data listener address, empty when none could be opened.
    pub(super) data_addr: String,
    /// The machine ([`net::machine_id`]): emulated hosts may share one.
    pub(super) machine: String,
    /// The shared-memory directory this rank would make or map its host's region in
    /// ([`shm_identity`]): ranks of one host identity share a region only if this matches.
    pub(super) shm: String,
    /// Per plan entry: this rank's largest message count and scratch extent
    /// ([`crate::program::rank_limits`]); rank 0 answers with the largest of every rank's.
    pub(super) limits: Vec<(u32, u32)>,
    /// `HCCL_CHECKSUM`: every rank must use the same setting.
    pub(super) checksum: bool,
    /// Which group this rank means to form: empty for the job's first rendezvous, else the
    /// shrink (job, number, failed ranks); the leader refuses a rank that means another.
    pub(super) group: String,
    /// This rank's rank in the group a shrink starts from (at a first rendezvous, its rank).
    pub(super) was: u32,
}

/// Most plan entries a hello may carry limits for.
pub(super) const MAX_ENTRIES: u32 = 1 << 20;

pub(super) fn write_limits(buf: &mut Vec<u8>, limits: &[(u32, u32)]) {
    write_u32(buf, limits.len() as u32);
    for &(count, scratch) in limits {
        write_u32(buf, count);
        write_u32(buf, scratch);
    }
}

pub(super) fn read_limits(s: &mut (impl Read + ?Sized)) -> std::io::Result<Vec<(u32, u32)>> {
    let n = read_u32(s)?;
    if n > MAX_ENTRIES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("limits for {n} plan entries"),
        ));
    }
    (0..n).map(|_| Ok((read_u32(s)?, read_u32(s)?))).collect()
}

impl Hello {
    fn encode(&self, token: &str) -> Vec<u8> {
        let mut hello = HELLO_MAGIC.to_vec();
        write_u32(&mut hello, PROTOCOL);
        write_str(&mut hello, token);
        write_u32(&mut hello, self.rank);
        write_u32(&mut hello, self.world);
        write_str(&mut hello, &self.hash);
        write_str(&mut hello, &self.error);
        write_str(&mut hello, &self.host);
        write_str(&mut hello, &self.data_addr);
        write_str(&mut hello, &self.machine);
        write_str(&mut hello, &self.shm);
        write_limits(&mut hello, &self.limits);
        write_u32(&mut hello, u32::from(self.checksum));
        write_str(&mut hello, &self.group);
        write_u32(&mut hello, self.was);
        hello
    }
}

/// What rank 0 tells every rank once all have joined.
pub(super) struct Job {
    pub(super) nonce: String,
    pub(super) slot_bytes: usize,
    pub(super) hosts: Vec<String>,
    pub(super) addrs: Vec<String>,
    /// Machine identity per rank.
    pub(super) machines: Vec<String>,
    /// Per plan entry: the largest message count and scratch extent over every rank.
    pub(super) limits: Vec<(u32, u32)>,
    /// Rank 0: one socket per other rank, in rank order; others: the socket to rank 0.
    pub(super) socks: Vec<TcpStream>,
}

pub(super) fn read_hello(
    s: &mut (impl Read + ?Sized),
    token: &str,
) -> std::io::Result<Option<Hello>> {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic)?;
    if &magic != HELLO_MAGIC {
        return Ok(None);
    }
    // Every protocol so far sends the job token right after its version: only a rank of
    // this job can make a version difference fatal.
    let version = read_u32(s)?;
    let theirs = read_str(s)?;
    if !same_secret(&theirs, token) {
        return Ok(None);
    }
    if version != PROTOCOL {
        return Err(std::io::Error::other(OtherVersion(version)));
    }
    Ok(Some(Hello {
        rank: read_u32(s)?,
        world: read_u32(s)?,
        hash: read_str(s)?,
        error: read_str(s)?,
        host: read_str(s)?,
        data_addr: read_str(s)?,
        machine: read_str(s)?,
        shm: read_str(s)?,
        limits: read_limits(s)?,
        checksum: read_u32(s)? != 0,
        group: read_str(s)?,
        was: read_u32(s)?,
    }))
}

/// Rank 0's side of the rendezvous: every other rank's hello gathered ([`gather`]) and
/// compared with its own ([`disagreement`]); the hosts told apart ([`split_hosts`]); the
/// job's description (or what stops it) sent to every rank.
pub(super) fn lead(
    addr: SocketAddr,
    boot: &Bootstrap,
    me: &Hello,
    config: &Config,
    deadline: Instant,
) -> Result<Job> {
    let (rank, world) = (me.rank, me.world);
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let peers = gather(addr, boot, me, deadline)?;
    let problem = disagreement(me, &peers);
    let mut limits = me.limits.clone();
    for (_, h) in peers.iter().flatten() {
        for (l, theirs) in limits.iter_mut().zip(&h.limits) {
            *l = (l.0.max(theirs.0), l.1.max(theirs.1));
        }
    }
    let mut hosts = vec![me.host.clone()];
    let mut addrs = vec![me.data_addr.clone()];
    let mut machines = vec![me.machine.clone()];
    let mut shms = vec![me.shm.clone()];
    let mut socks = Vec::with_capacity(world as usize);
    for (s, h) in peers.into_iter().flatten() {
        hosts.push(h.host);
        addrs.push(h.data_addr);
        machines.push(h.machine);
        shms.push(h.shm);
        socks.push(s);
    }
    for split in split_hosts(&mut hosts, &machines, &shms) {
        tracing::info!("{split}; they talk over the network");
    }
    if let Some(problem) = problem {
        for s in &mut socks {
            let mut msg = vec![1u8];
            write_str(&mut msg, &problem);
            let _ = s.write_all(&msg);
        }
        return Err(boot_err(problem));
    }
    let nonce = format!("{:016x}", rand_word());
    let ok = encode_job(
        &nonce,
        config.slot_bytes,
        &hosts,
        &addrs,
        &machines,
        &limits,
    );
    for s in &mut socks {
        s.write_all(&ok)
            .map_err(io_err(rank, "sending the job description"))?;
    }
    Ok(Job {
        nonce,
        slot_bytes: config.slot_bytes,
        hosts,
        addrs,
        machines,
        limits,
        socks,
    })
}

/// Rank 0 accepts the hellos of ranks `1..world` at `addr`, until the deadline; a hello of
/// another group or another protocol version is refused (and so is every rank that joined).
/// Per rank: its socket and hello (`None` for rank 0).
#[allow(clippy::type_complexity)]
pub(super) fn gather(
    addr: SocketAddr,
    boot: &Bootstrap,
    me: &Hello,
    deadline: Instant,
) -> Result<Vec<Option<(TcpStream, Hello)>>> {
    let (rank, world) = (me.rank, me.world);
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let listener = TcpListener::bind(addr).map_err(io_err(rank, format!("listening on {addr}")))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err(rank, "configuring the listener"))?;
    let mut peers: Vec<Option<(TcpStream, Hello)>> = (0..world).map(|_| None).collect();
    let mut joined = 1;
    while joined < world {
        match listener.accept() {
            Ok((mut sock, from)) => {
                let _ = sock.set_nonblocking(false);
                let _ = sock.set_read_timeout(Some(STEP_TIMEOUT));
                let _ = sock.set_nodelay(true);
                match read_hello(&mut sock, &boot.token) {
                    Ok(Some(h)) if h.group != me.group => {
                        let problem = format!(
                            "rank {} joins {} but rank {} joins {}: every survivor must pass the same failed ranks",
                            h.was,
                            describe_group(&h.group),
                            me.was,
                            describe_group(&me.group)
                        );
                        let mut socks: Vec<TcpStream> =
                            peers.into_iter().flatten().map(|(s, _)| s).collect();
                        socks.push(sock);
                        refuse(listener, socks, &problem, &boot.token, deadline);
                        return Err(boot_err(problem));
                    }
                    Ok(Some(h))
                        if h.rank > 0 && h.rank < world && peers[h.rank as usize].is_none() =>
                    {
                        let r = h.rank as usize;
                        peers[r] = Some((sock, h));
                        joined += 1;
                    }
                    Ok(Some(h)) => {
                        tracing::warn!(%from, rank = h.rank, "refused a connection: rank out of range or taken");
                    }
                    Ok(None) => tracing::warn!(%from, "refused a connection without the job token"),
                    Err(e) if e.get_ref().is_some_and(|x| x.is::<OtherVersion>()) => {
                        let problem = format!("a rank connecting from {from}: {e}");
                        let socks: Vec<TcpStream> =
                            peers.into_iter().flatten().map(|(s, _)| s).collect();
                        refuse(listener, socks, &problem, &boot.token, deadline);
                        return Err(boot_err(problem));
                    }
                    Err(e) => tracing::warn!(%from, "refused a connection: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<u32> = (1..world)
                        .filter(|&r| peers[r as usize].is_none())
                        .collect();
                    return Err(boot_err(format!(
                        "timed out waiting for ranks {missing:?} to join at {addr}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_err(rank, "accepting a connection")(e)),
        }
    }
    Ok(peers)
}

/// Why the ranks of `peers` cannot form a job with rank 0 (`me`): world sizes, plan hashes,
/// local plan checks, checksum settings, plan entries; `None` when they agree.
pub(super) fn disagreement(me: &Hello, peers: &[Option<(TcpStream, Hello)>]) -> Option<String> {
    let (world, hash) = (me.world, &me.hash);
    let mut problem: Option<String> =
        (!me.error.is_empty()).then(|| format!("rank 0: {}", me.error));
    for (r, p) in peers.iter().enumerate().skip(1) {
        let Some((_, h)) = p else { continue };
        if problem.is_some() {
            break;
        }
        if h.world != world {
            problem = Some(format!(
                "rank {r} was started for {} ranks but rank 0 for {world}",
                h.world
            ));
        } else if !h.error.is_empty() {
            problem = Some(format!("rank {r}: {}", h.error));
        } else if h.hash != *hash {
            problem = Some(format!(
                "rank {r} holds plan {} but rank 0 holds plan {hash}: all ranks must use the same plan file",
                h.hash
            ));
        } else if h.checksum != me.checksum {
            let says = |on: bool| if on { "1" } else { "0" };
            problem = Some(format!(
                "rank {r} runs with HCCL_CHECKSUM={} but rank 0 with HCCL_CHECKSUM={}: every rank must use the same setting",
                says(h.checksum),
                says(me.checksum)
            ));
        } else if h.limits.len() != me.limits.len() {
            problem = Some(format!(
                "rank {r} holds {} plan entries but rank 0 holds {}",
                h.limits.len(),
                me.limits.len()
            ));
        }
    }
    problem
}

/// What a hello's `group` means, for errors.
pub(super) fn describe_group(group: &str) -> String {
    if group.is_empty() {
        "the job's first rendezvous".into()
    } else {
        group.to_string()
    }
}

/// Answers every rank connected so far, and for the rest of the rendezvous every rank that
/// still comes, with `problem`: the rendezvous failed and nobody should wait for it.
pub(super) fn refuse(
    listener: TcpListener,
    mut socks: Vec<TcpStream>,
    problem: &str,
    token: &str,
    deadline: Instant,
) {
    let mut msg = vec![1u8];
    write_str(&mut msg, problem);
    for s in &mut socks {
        let _ = s.write_all(&msg);
    }
    let token = token.to_string();
    let _ = std::thread::Builder::new()
        .name("hccl-refuse".into())
        .spawn(move || {
            while Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut sock, _)) => {
                        let _ = sock.set_nonblocking(false);
                        let _ = sock.set_read_timeout(Some(STEP_TIMEOUT));
                        if let Ok(Some(_)) = read_hello(&mut sock, &token) {
                            let _ = sock.write_all(&msg);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
}

pub(super) fn rand_word() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish()
}

pub(super) fn follow(
    addr: SocketAddr,
    boot: &Bootstrap,
    me: &Hello,
    deadline: Instant,
) -> Result<Job> {
    let rank = me.rank;
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let mut sock = loop {
        match TcpStream::connect_timeout(&addr, STEP_TIMEOUT) {
            Ok(s) => break s,
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(boot_err(format!("cannot reach rank 0 at {addr}: {e}")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    let _ = sock.set_nodelay(true);
    sock.write_all(&me.encode(&boot.token))
        .map_err(io_err(rank, "sending the hello"))?;
    // Wait for the verdict as long as the job may take to assemble.
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(STEP_TIMEOUT);
    let _ = sock.set_read_timeout(Some(remaining));
    let mut job = read_job(&mut sock, rank, me.world, me.limits.len())?;
    job.socks = vec![sock];
    Ok(job)
}

/// Rank 0's answer to every rank once all have joined: a zero status byte, then the job
/// ([`read_job`]).
pub(super) fn encode_job(
    nonce: &str,
    slot_bytes: usize,
    hosts: &[String],
    addrs: &[String],
    machines: &[String],
    limits: &[(u32, u32)],
) -> Vec<u8> {
    let mut ok = vec![0u8];
    write_str(&mut ok, nonce);
    ok.extend_from_slice(&(slot_bytes as u64).to_le_bytes());
    for ((h, a), m) in hosts.iter().zip(addrs).zip(machines) {
        write_str(&mut ok, h);
        write_str(&mut ok, a);
        write_str(&mut ok, m);
    }
    write_limits(&mut ok, limits);
    ok
}

/// Reads rank 0's answer ([`encode_job`]) to `rank` of `world`, which holds `entries` plan
/// entries: the job (its sockets left to the caller), or rank 0's refusal (a non-zero status
/// and why) as an error.
pub(super) fn read_job(
    sock: &mut (impl Read + ?Sized),
    rank: u32,
    world: u32,
    entries: usize,
) -> Result<Job> {
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let mut status = [0u8; 1];
    sock.read_exact(&mut status).map_err(|e| {
        boot_err(format!(
            "rank 0 refused or dropped the connection (wrong job token?): {e}"
        ))
    })?;
    let text = read_str(sock).map_err(io_err(rank, "reading rank 0's reply"))?;
    if status[0] != 0 {
        return Err(boot_err(text));
    }
    let mut slot = [0u8; 8];
    sock.read_exact(&mut slot)
        .map_err(io_err(rank, "reading rank 0's reply"))?;
    let slot_bytes = usize::try_from(u64::from_le_bytes(slot)).unwrap_or(usize::MAX);
    if !(64..=1 << 30).contains(&slot_bytes) {
        return Err(boot_err(format!(
            "rank 0 sent an invalid slot size {slot_bytes}"
        )));
    }
    let mut hosts = Vec::with_capacity(world as usize);
    let mut addrs = Vec::with_capacity(world as usize);
    let mut machines = Vec::with_capacity(world as usize);
    for _ in 0..world {
        let mut field = || read_str(sock).map_err(io_err(rank, "reading the host table"));
        hosts.push(field()?);
        addrs.push(field()?);
        machines.push(field()?);
    }
    let limits = read_limits(sock).map_err(io_err(rank, "reading the plan's limits"))?;
    if limits.len() != entries {
        return Err(boot_err(format!(
            "rank 0 sent limits for {} plan entries, this rank holds {entries}",
            limits.len(),
        )));
    }
    Ok(Job {
        nonce: text,
        slot_bytes,
        hosts,
        addrs,
        machines,
        limits,
        // The caller adds the socket it read the answer from.
        socks: Vec::new(),
    })
}

/// The job token of [`fuzz_rendezvous`]'s messages.
pub(crate) const FUZZ_TOKEN: &str = "fuzz-token";

/// Parses `input` as a rendezvous message (the fuzzing entry point,
/// `hccl_executor::fuzz::rendezvous`). The low two bits of the first byte choose the
/// message: 0 and 3 a rank's hello to rank 0 (job token [`FUZZ_TOKEN`]), 1 rank 0's answer
/// (for a world of 1 + the next three bits and as many plan entries as the top three bits
/// say), 2 a data connection's hello (to rank 1 of that world, nonce `"fuzz-nonce"`); the
/// rest is the message. Panics when a hello read does not survive writing it again.
pub(crate) fn fuzz_rendezvous(input: &[u8]) {
    let Some((&which, mut rest)) = input.split_first() else {
        return;
    };
    let world = 1 + u32::from(which >> 2 & 7);
    let entries = usize::from(which >> 5);
    match which & 3 {
        1 => {
            if let Ok(job) = read_job(&mut rest, 1, world, entries) {
                assert_eq!(job.hosts.len(), world as usize);
                assert_eq!(job.limits.len(), entries);
                let again = encode_job(
                    &job.nonce,
                    job.slot_bytes,
                    &job.hosts,
                    &job.addrs,
                    &job.machines,
                    &job.limits,
                );
                let back = read_job(&mut again.as_slice(), 1, world, entries)
                    .expect("a job written again reads");
                assert_eq!(back.hosts, job.hosts);
                assert_eq!(back.limits, job.limits);
            }
        }
        2 => {
            if let Ok((from, sock, nsocks)) =
                net::setup::parse_data_hello(&mut rest, (1, world), FUZZ_TOKEN, "fuzz-nonce")
            {
                assert!(from < world);
                let again = net::setup::data_hello(
                    FUZZ_TOKEN,
                    "fuzz-nonce",
                    [from, 1, sock as u32, nsocks as u32],
                );
                let back = net::setup::parse_data_hello(
                    &mut again.as_slice(),
                    (1, world),
                    FUZZ_TOKEN,
                    "fuzz-nonce",
                );
                assert_eq!(back, Ok((from, sock, nsocks)));
            }
        }
        _ => {
            if let Ok(Some(hello)) = read_hello(&mut rest, FUZZ_TOKEN) {
                let again = hello.encode(FUZZ_TOKEN);
                let back = read_hello(&mut again.as_slice(), FUZZ_TOKEN)
                    .expect("a hello written again reads");
                assert_eq!(back.as_ref(), Some(&hello));
            }
        }
    }
}

/// Well-formed messages of every kind [`fuzz_rendezvous`] reads, each behind its selector
/// byte: seeds for the fuzzer.
pub(crate) fn rendezvous_seeds() -> Vec<Vec<u8>> {
    let hello = |group: &str, limits: Vec<(u32, u32)>| Hello {
        rank: 1,
        world: 4,
        hash: "blake3:0123456789abcdef".into(),
        error: String::new(),
        host: "host-a".into(),
        data_addr: "10.0.0.2:41000".into(),
        machine: "machine-a".into(),
        limits,
        checksum: true,
        group: group.into(),
        was: 1,
        shm: "64768:1234".into(),
    };
    let with = |selector: u8, body: Vec<u8>| {
        let mut v = vec![selector];
        v.extend(body);
        v
    };
    let hosts: Vec<String> = (0..4).map(|h| format!("host-{h}")).collect();
    let addrs: Vec<String> = (0..4).map(|h| format!("10.0.0.{h}:4100{h}")).collect();
    let machines: Vec<String> = (0..4).map(|h| format!("machine-{}", h / 2)).collect();
    // World 4 (three bits of 3), 2 entries (top bits 2), answer (1).
    let job_selector = 1 | 3 << 2 | 2 << 5;
    let mut refusal = vec![1u8];
    write_str(&mut refusal, "rank 2 holds plan x but rank 0 holds plan y");
    vec![
        with(0, hello("", vec![(4, 0), (16, 8)]).encode(FUZZ_TOKEN)),
        with(
            0,
            hello("job 7 shrink 1 without [2]", Vec::new()).encode(FUZZ_TOKEN),
        ),
        with(
            job_selector,
            encode_job(
                "00000000deadbeef",
                256 * 1024,
                &hosts,
                &addrs,
                &machines,
                &[(4, 0), (16, 8)],
            ),
        ),
        with(job_selector, refusal),
        with(
            2 | 3 << 2,
            net::setup::data_hello(FUZZ_TOKEN, "fuzz-nonce", [0, 1, 0, 2]),
        ),
    ]
}
