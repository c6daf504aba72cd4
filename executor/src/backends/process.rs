//! The process backend: ranks as OS processes on one host.
//!
//! # Bootstrap
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank connects (retrying until the
//! timeout) and sends a hello: a magic, the job token (`HCCL_JOB_TOKEN`), its rank, the world
//! size and its plan's content hash. Rank 0 closes any connection whose magic or token is
//! wrong, or whose rank is out of range or taken, and keeps accepting. Once all ranks are in,
//! it compares world sizes and plan hashes; on a mismatch every rank receives (and returns)
//! an error naming the disagreeing ranks. Otherwise rank 0 creates the shared region as a
//! file in `/dev/shm`, sends its name, waits until every rank has mapped it, unlinks it (so a
//! crashed job leaves nothing behind) and releases everyone.
//!
//! # Data and liveness
//!
//! The region holds the same connection rings as the threads backend, so the replay engine
//! is unchanged. Each rank writes its pid into the region; a rank that waits checks from time
//! to time that the peer it waits for is still alive (`/proc/PID/stat`, zombies count as
//! dead) and raises the abort word if it is not, so every rank names the dead one.
//!
//! Rank and world size come from `RANK`/`WORLD_SIZE` (torchrun),
//! `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (mpirun), `PMI_RANK`/`PMI_SIZE` or
//! `SLURM_PROCID`/`SLURM_NTASKS`.

mod region;
pub(crate) mod rendezvous;

pub use rendezvous::Bootstrap;

use crate::arena::{Arena, Layout};
use crate::backends::net;
use crate::comm::{Backend, Communicator, RankState, Shared, next_origin};
use crate::config::{Config, PlanOrigin, PlanSource, split_world};
use crate::error::{ExecError, Result};
use crate::plan_checks::{check_part, check_plan};
use crate::program::ConnTable;
use crate::transport::Transport;
use hccl_ir::{PlanFile, PlanPart};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use region::{create_region, map_region, pid_alive, shm_identity};
use rendezvous::{Hello, Job, barrier, follow, io_err, lead, rand_word};

/// A free TCP port on the loopback address for the rendezvous of a job whose ranks this
/// machine starts itself (`hccl-perf`, tests), picked below the kernel's ephemeral range.
///
/// A port found by binding to port 0 and closing the socket is ephemeral: before rank 0
/// listens on it, any socket that connects or binds to port 0 on this machine can be handed
/// it ("Address already in use"). Ports below `ip_local_port_range` are only ever taken by
/// an explicit bind, so a port that was free when picked stays free in practice. The pick
/// starts at a random point of 20000..(start of the range) and checks each candidate by
/// binding to it.
pub fn local_rendezvous_port() -> std::io::Result<u16> {
    let low = 20_000u32;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|w| w.parse::<u32>().ok())
        })
        .filter(|&start| start > low + 1000 && start <= 65_536)
        .unwrap_or(32_768);
    let span = high - low;
    let first = (rand_word() % u64::from(span)) as u32;
    let mut last_err = None;
    for k in 0..span.min(4096) {
        // A stride coprime to any span that is not a multiple of 7919 (a prime).
        let port = (low + (first + k * 7919) % span) as u16;
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => return Ok(port),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no port below the ephemeral range")))
}

/// Rank and world size from the launcher's environment.
pub fn rank_world_from_env() -> Result<(u32, u32)> {
    const PAIRS: [(&str, &str); 4] = [
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ];
    for (r, w) in PAIRS {
        if let (Ok(rv), Ok(wv)) = (std::env::var(r), std::env::var(w)) {
            let parse = |name: &str, v: &str| {
                v.trim().parse::<u32>().map_err(|_| {
                    ExecError::Invalid(format!("{name}={v}: expected a non-negative integer"))
                })
            };
            let (rank, world) = (parse(r, &rv)?, parse(w, &wv)?);
            if world == 0 || rank >= world {
                return Err(ExecError::Invalid(format!(
                    "{r}={rank} is not a rank of {w}={world}"
                )));
            }
            return Ok((rank, world));
        }
    }
    Err(ExecError::Invalid(
        "no rank/world size in the environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS)".into(),
    ))
}

/// Builds communicators whose ranks are processes.
#[derive(Debug, Clone, Copy)]
pub struct ProcessGroup;

impl ProcessGroup {
    /// Everything from the environment: rank, world size, rendezvous, configuration.
    ///
    /// A sealed plan file (every entry sealed by this build's verifier, see
    /// [`hccl_ir::Seal`]) is not read whole: this rank loads its own programs and checks them
    /// against the seals, and once the job knows which ranks share this host, their
    /// programs (the host's shared region holds the rings of all their connections). With
    /// `HCCL_VERIFY=full`, or a plan some seal does not cover, every rank reads the whole
    /// plan and verifies what is not sealed.
    pub fn init(source: PlanSource) -> Result<Communicator> {
        let config = Config::from_env()?;
        let (rank, world) = rank_world_from_env()?;
        // A plan this rank cannot use still takes part in the rendezvous, so that every rank
        // learns why the job cannot start.
        let source = source.resolve();
        let plan_origin = source.origin();
        let (held, origin) = match Held::load(source.clone(), rank, world, &config) {
            Ok((held, origin)) => (Ok(held), origin),
            Err(e) => (Err(e), source),
        };
        let boot = Bootstrap::from_env();
        let join = Join::first(&boot, origin, plan_origin);
        ProcessGroup::start(held, rank, world, &boot, config, join)
    }

    /// Explicit rank, world size, rendezvous and configuration.
    pub fn init_with(
        plan: PlanFile,
        rank: u32,
        world: u32,
        boot: &Bootstrap,
        config: Config,
    ) -> Result<Communicator> {
        let mut plan = plan;
        let rest = split_world(&mut plan, world);
        let join = Join::first(boot, PlanSource::Plan(rest), PlanOrigin::Memory);
        ProcessGroup::start(Ok(Held::full(plan)), rank, world, boot, config, join)
    }

    /// Joins the job with `held` (or, when this rank could not load its plan, tells the
    /// others why at the rendezvous).
    ///
    /// Phases: this rank's hello (with its data listener, [`introduce`]); the rendezvous
    /// through rank 0 ([`lead`], [`follow`]); the host's shared region ([`share_region`]);
    /// the connections to other hosts ([`connect_hosts`]); the clocks aligned; the group.
    fn start(
        held: Result<Held>,
        rank: u32,
        world: u32,
        boot: &Bootstrap,
        config: Config,
        join: Join,
    ) -> Result<Communicator> {
        if world == 0 || rank >= world {
            return Err(ExecError::Invalid(format!(
                "rank {rank} is not a rank of a {world}-rank job"
            )));
        }
        let hash = held.as_ref().map_or_else(|_| String::new(), Held::identity);
        let mut config = config;
        let deadline = Instant::now() + config.timeout;
        let boot_err = |message: String| ExecError::Bootstrap { rank, message };
        let addr: SocketAddr = boot
            .addr
            .to_socket_addrs()
            .map_err(|e| boot_err(format!("bad rendezvous address {}: {e}", boot.addr)))?
            .next()
            .ok_or_else(|| boot_err(format!("{} resolves to no address", boot.addr)))?;
        // Check the plan and the network settings locally first, but finish the rendezvous
        // either way so that every rank learns why the job cannot start.
        let local = match &held {
            Ok(held) => held.check(rank, world, &config),
            Err(e) => Err(ExecError::Invalid(e.to_string())),
        };
        let local_err = local.as_ref().err().map(|e| e.to_string());
        let (me, listener) = introduce(
            rank, world, boot, addr, &config, &held, &join, &hash, local_err,
        );
        let mut job = if rank == 0 {
            lead(addr, boot, &me, &config, deadline)?
        } else {
            follow(addr, boot, &me, deadline)?
        };
        config.slot_bytes = job.slot_bytes;
        let (arena, held, keep, conns, region) = share_region(
            rank, world, addr, &me.host, &mut job, &config, held, local, &hash, deadline,
        )?;
        let mut state =
            RankState::new(held.plan(), &keep, &conns, rank, &config, Some(&job.limits))?;
        let hosts = job
            .hosts
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let network = if hosts > 1 {
            connect_hosts(
                rank, world, boot, &mut job, &conns, &config, &arena, listener, deadline,
            )?
        } else {
            None
        };
        if let Some(n) = &network {
            state.attach_net(Arc::clone(n));
        }
        // Clocks: rank 0 tells every rank whether to align its clock with rank 0's (only
        // when rank 0 traces and the rank is on another host; see `crate::trace`).
        let clock =
            crate::trace::sync_clocks(rank, &mut job.socks, &job.hosts, config.trace.is_some())
                .map_err(io_err(rank, "aligning clocks with rank 0"))?;
        if let Some(t) = state.engine.trace.as_deref_mut() {
            t.set_clock(
                if hosts > 1 {
                    "process (TCP between hosts)"
                } else {
                    "process"
                },
                clock,
            );
        }
        tracing::info!(rank, world, hosts, plan = %hash, region = %region, "process group ready");
        let rejoin = Rejoin {
            boot: Bootstrap {
                addr: addr.to_string(),
                token: boot.token.clone(),
                host: Some(job.hosts[rank as usize].clone()),
            },
            base_port: join.base_port,
            generation: join.generation,
            hosts: job.hosts.clone(),
            addrs: job.addrs.clone(),
            nonce: job.nonce.clone(),
        };
        let shared = Arc::new(Shared {
            arena,
            net: network,
            world,
            config,
            plan_hash: hash,
            check_pids: true,
            // Ranks of emulated hosts on one machine compete for its cores too.
            spin_polls: crate::comm::spin_polls_for(local_ranks(&job.machines, rank)),
            origin: join.origin,
            plan_origin: join.plan_origin,
            backend: Box::new(rejoin),
        });
        Ok(Communicator::new(rank, shared, state))
    }
}

/// This rank's hello at the rendezvous, and its data listener on the interface
/// `HCCL_SOCKET_IFNAME` selects (with why it could not be opened, if so: only ranks with
/// peers on other hosts need it, so the failure is reported only then).
#[allow(clippy::too_many_arguments)]
fn introduce(
    rank: u32,
    world: u32,
    boot: &Bootstrap,
    addr: SocketAddr,
    config: &Config,
    held: &Result<Held>,
    join: &Join,
    hash: &str,
    local_err: Option<String>,
) -> (Hello, Listener) {
    let host = boot.host.clone().unwrap_or_else(net::host_id);
    // A data listener on the chosen interface; only ranks with peers on other hosts
    // need it, so failing to open one is reported only then.
    let (listener, listen_err) = match net::setup::listen(&config.net, addr) {
        Ok(l) => (Some(l), None),
        Err(e) => (None, Some(e)),
    };
    let data_addr = listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map_or_else(String::new, |a| a.to_string());
    let me = Hello {
        rank,
        world,
        hash: hash.to_string(),
        error: local_err.unwrap_or_default(),
        host,
        data_addr,
        machine: net::machine_id(),
        shm: shm_identity(&config.shm_dir),
        limits: held
            .as_ref()
            .map_or_else(|_| Vec::new(), |h| h.limits(rank)),
        checksum: config.checksum,
        group: join.group.clone(),
        was: join.was.unwrap_or(rank),
    };
    (
        me,
        Listener {
            listener,
            err: listen_err,
        },
    )
}

/// The data listener [`introduce`] opened, or why it could not.
struct Listener {
    listener: Option<TcpListener>,
    err: Option<String>,
}

/// The region this rank shares with the ranks of its host: made by the host's lowest rank
/// and mapped by all, through two barriers, once this host's ranks' programs are read
/// (`held` for the host) and the connections with an end on this host (the region's rings)
/// are known. Returns the region, this host's plan, the entries kept, the connections and
/// the region's name.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn share_region(
    rank: u32,
    world: u32,
    addr: SocketAddr,
    my_identity: &str,
    job: &mut Job,
    config: &Config,
    held: Result<Held>,
    local: Result<Vec<usize>>,
    hash: &str,
    deadline: Instant,
) -> Result<(Arc<Arena>, Held, Vec<usize>, ConnTable, String)> {
    // Ranks on one host share one region, made by the host's lowest rank.
    let host_index = |r: usize| {
        job.hosts
            .iter()
            .position(|h| *h == job.hosts[r])
            .unwrap_or(r)
    };
    let my_host = host_index(rank as usize);
    let on_host: Vec<bool> = (0..world as usize)
        .map(|r| job.hosts[r] == job.hosts[rank as usize])
        .collect();
    let leader = on_host.iter().position(|&h| h) == Some(rank as usize);
    if job.hosts[rank as usize] != my_identity {
        tracing::info!(
            rank,
            host = %my_identity,
            shm_dir = %config.shm_dir.display(),
            "ranks of this host identity do not all see this shared-memory directory \
             (containers with a /dev/shm of their own?): only those that do share a \
             region with this rank, the others are reached over the network"
        );
    }
    let region = format!(
        "{}/hccl-{}-{}-h{my_host}",
        config.shm_dir.display(),
        addr.port(),
        job.nonce
    );
    // This host's ranks' programs (a part held for this rank alone is read again for
    // them), and the connections with an end on this host: the region's rings.
    let local = local.and_then(|keep| {
        let held = held?.for_host(&on_host, hash)?;
        let conns = ConnTable::build_for(
            keep.iter().map(|&i| &held.plan().entries[i].schedule),
            |r| on_host.get(r as usize).copied().unwrap_or(false),
        );
        Ok((held, keep, conns))
    });
    let layout = local
        .as_ref()
        .ok()
        .map(|(_, _, conns)| Layout::new(world as usize, conns.len(), config.slot_bytes));
    let created = match (leader, layout) {
        (true, Some(layout)) => {
            create_region(&region, layout.total).map_err(|e| format!("creating {region}: {e}"))
        }
        _ => Ok(()),
    };
    let phase = barrier(rank, &mut job.socks, created.clone().err(), deadline);
    if let Err(e) = phase {
        if leader && created.is_ok() {
            let _ = std::fs::remove_file(&region);
        }
        return Err(e);
    }
    let (held, keep, conns) = local?;
    let layout = Layout::new(world as usize, conns.len(), config.slot_bytes);
    let mapped = map_region(rank, &region, layout);
    let phase = barrier(
        rank,
        &mut job.socks,
        mapped.as_ref().err().map(|e| e.to_string()),
        deadline,
    );
    // Everyone has mapped (or failed): nothing needs the name any more.
    if leader {
        let _ = std::fs::remove_file(&region);
    }
    phase?;
    let arena = Arc::new(mapped?);
    arena
        .pid(rank as usize)
        .store(u64::from(std::process::id()), Ordering::Release);
    Ok((arena, held, keep, conns, region))
}

/// The connections to the ranks on other hosts ([`net::setup::connect`]), through a barrier so
/// that every rank fails together.
#[allow(clippy::too_many_arguments)]
fn connect_hosts(
    rank: u32,
    world: u32,
    boot: &Bootstrap,
    job: &mut Job,
    conns: &ConnTable,
    config: &Config,
    arena: &Arc<Arena>,
    Listener {
        listener,
        err: listen_err,
    }: Listener,
    deadline: Instant,
) -> Result<Option<Arc<dyn Transport>>> {
    let boot_err = |message: String| ExecError::Bootstrap { rank, message };
    let listener_missing = listener.is_none();
    let made = net::setup::connect(net::setup::Setup {
        me: rank,
        world,
        hosts: &job.hosts,
        addrs: &job.addrs,
        conns,
        token: &boot.token,
        nonce: &job.nonce,
        cfg: &config.net,
        slot_bytes: config.slot_bytes,
        checksum: config.checksum,
        timeout: config.timeout,
        arena: Arc::clone(arena),
        listener,
        deadline,
    })
    .map_err(|e| match (&listen_err, listener_missing) {
        (Some(why), true) => boot_err(format!("no data listener: {why}")),
        _ => e,
    });
    let phase = barrier(
        rank,
        &mut job.socks,
        made.as_ref().err().map(|e| e.to_string()),
        deadline,
    );
    let made = made?;
    phase?;
    Ok(made.map(|n| Arc::new(n) as Arc<dyn Transport>))
}

/// What a rendezvous forms besides its ranks: the group's identity in the hellos, where its
/// plan came from, and the numbering of shrinks.
struct Join {
    /// Empty for the job's first rendezvous; a shrink's description otherwise.
    group: String,
    /// This rank's rank in the group a shrink started from.
    was: Option<u32>,
    /// Where a shrink of the group draws its plan from.
    origin: PlanSource,
    plan_origin: PlanOrigin,
    /// The port of the job's first rendezvous.
    base_port: u16,
    /// How many shrinks made this group (0: the job's first group).
    generation: u16,
}

impl Join {
    fn first(boot: &Bootstrap, origin: PlanSource, plan_origin: PlanOrigin) -> Join {
        let base_port = boot
            .addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(0);
        Join {
            group: String::new(),
            was: None,
            origin,
            plan_origin,
            base_port,
            generation: 0,
        }
    }
}

/// How the survivors of a process group meet to shrink it ([`Communicator::shrink`]).
///
/// The new leader is the lowest surviving rank `L` (rank 0 may be the one that died). It
/// listens at its own address, which every rank knows from this group's rendezvous: the
/// rendezvous address's host when `L` is on rank 0's host, else the address of `L`'s data
/// listener (on the interface `HCCL_SOCKET_IFNAME` selects); the port is the job's first
/// rendezvous port (`MASTER_PORT`) plus the number of the shrink (1 for the first shrink
/// of the job, 2 for a shrink of that group, …). There the survivors rendezvous exactly as
/// at init ([`ProcessGroup::init_with`]): token, plan identity, host table, a new shared
/// region per host (its name carries the new port and job nonce, so the old region and its
/// abort word are not touched) and new data connections between hosts.
pub(crate) struct Rejoin {
    /// The rendezvous this group met at (its address, the job token, this rank's host).
    boot: Bootstrap,
    base_port: u16,
    generation: u16,
    hosts: Vec<String>,
    addrs: Vec<String>,
    nonce: String,
}

impl Rejoin {
    /// Where rank `leader` of this group leads a shrink's rendezvous.
    fn leader_addr(&self, me: u32, leader: u32, port: u16) -> Result<SocketAddr> {
        let boot_err = |message: String| ExecError::Bootstrap { rank: me, message };
        let l = leader as usize;
        let ip = if leader == 0 || self.hosts[l] == self.hosts[0] {
            self.boot
                .addr
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .map(|a| a.ip())
                .ok_or_else(|| boot_err(format!("bad rendezvous address {}", self.boot.addr)))?
        } else {
            self.addrs[l]
                .parse::<SocketAddr>()
                .map(|a| a.ip())
                .map_err(|_| {
                    boot_err(format!(
                        "shrink: rank {leader}, the lowest survivor, has no known address (its data listener could not be opened)"
                    ))
                })?
        };
        Ok(SocketAddr::new(ip, port))
    }
}

impl Backend for Rejoin {
    /// The host identity rank `rank` gave at the rendezvous.
    fn host_of(&self, rank: u32) -> String {
        self.hosts
            .get(rank as usize)
            .cloned()
            .unwrap_or_else(|| "?".into())
    }

    /// Whether the pid rank `p` published in the region names no live process.
    fn process_gone(&self, arena: &Arena, p: u32) -> bool {
        let pid = arena.pid(p as usize).load(Ordering::Acquire);
        pid != 0 && !pid_alive(pid)
    }

    /// Rank `me` of this group joins the group of `alive` (the survivors of `failed`), whose
    /// plan comes from `chosen` (`from`: the source it was chosen from).
    fn shrink(
        &self,
        me: u32,
        failed: &[u32],
        alive: &[u32],
        chosen: PlanSource,
        from: PlanSource,
        config: Config,
    ) -> Result<Communicator> {
        let boot_err = |message: String| ExecError::Bootstrap { rank: me, message };
        let n = alive.len() as u32;
        let rank = alive.iter().position(|&r| r == me).unwrap_or(0) as u32;
        let generation = self.generation + 1;
        let port = self.base_port.checked_add(generation).ok_or_else(|| {
            boot_err(format!(
                "shrink: no port for shrink {generation} after the rendezvous port {}",
                self.base_port
            ))
        })?;
        let addr = self.leader_addr(me, alive[0], port)?;
        let boot = Bootstrap {
            addr: addr.to_string(),
            token: self.boot.token.clone(),
            host: Some(self.hosts[me as usize].clone()),
        };
        let plan_origin = chosen.origin();
        let (held, origin) = match Held::load(chosen, rank, n, &config) {
            Ok((held, rest)) => (Ok(held), next_origin(rest, from)),
            Err(e) => (Err(e), from),
        };
        let join = Join {
            group: format!(
                "shrink {generation} of job {} without ranks {failed:?}",
                self.nonce
            ),
            origin,
            plan_origin,
            was: Some(me),
            base_port: self.base_port,
            generation,
        };
        tracing::debug!(rank = me, new_rank = rank, %addr, "shrink: rendezvous");
        // Errors name this rank as the caller knows it (its rank in this group).
        ProcessGroup::start(held, rank, n, &boot, config, join).map_err(|e| match e {
            ExecError::Io { what, source, .. } if what.starts_with("listening on") => {
                boot_err(format!(
                    "shrink: {what} (port MASTER_PORT+{generation}): {source}; is another survivor leading with other failed ranks?"
                ))
            }
            ExecError::Bootstrap { message, .. } => boot_err(format!("shrink: {message}")),
            ExecError::Io { what, source, .. } => ExecError::Io {
                rank: me,
                what: format!("shrink: {what}"),
                source,
            },
            other => other,
        })
    }
}

/// The plan as this rank holds it.
enum Held {
    /// The whole plan, and its [`PlanFile::schedule_hashes`] (the seals and the plan's
    /// identity both need them). From a plan file, symmetric entries are held as templates
    /// with only this rank's (then its host's) programs built.
    Full { plan: PlanFile, hashes: Vec<String> },
    /// Some ranks' programs of a sealed plan file (this rank's, then its host's).
    Part { path: PathBuf, part: PlanPart },
}

impl Held {
    fn full(plan: PlanFile) -> Held {
        let hashes = plan.schedule_hashes();
        Held::Full { plan, hashes }
    }

    /// Resolves `source` (`HCCL_PLAN` overrides it): a part for `rank` when the source is a
    /// plan file whose every entry is sealed and the whole plan need not be verified
    /// (`HCCL_VERIFY` other than `full`), the whole plan otherwise.
    /// Also returns the source a shrink of the group draws from
    /// ([`PlanSource::load_split`]).
    fn load(
        source: PlanSource,
        rank: u32,
        world: u32,
        config: &Config,
    ) -> Result<(Held, PlanSource)> {
        // A plan file (not a directory of them, not an MSCCL algorithm).
        let file = match &source {
            PlanSource::Path(path)
                if path.is_file()
                    && !path
                        .extension()
                        .is_some_and(|x| x.eq_ignore_ascii_case("xml")) =>
            {
                Some(path)
            }
            _ => None,
        };
        if let Some(path) = file
            && config.verify == crate::config::VerifyMode::Unsealed
        {
            match PlanFile::load_for_ranks(path, &[rank]) {
                // (A file holding plans for several world sizes is read whole and split.)
                Ok(part)
                    if part.identity().is_some()
                        && part.plan.entries.iter().all(|e| e.schedule.nranks == world) =>
                {
                    let origin = source.clone();
                    return Ok((
                        Held::Part {
                            path: path.clone(),
                            part,
                        },
                        origin,
                    ));
                }
                // Edited after it was sealed: this rank refuses to start.
                Err(
                    e @ (hccl_ir::PlanError::Edited { .. } | hccl_ir::PlanError::EditedRank { .. }),
                ) => {
                    return Err(e.into());
                }
                // Not sealed throughout, or not readable as a part (a rank the plan does not
                // have): the whole plan, whose checks say what is wrong.
                _ => {}
            }
        }
        // The whole plan of a file keeps its symmetric entries as templates: they are verified
        // there, and only the programs this process runs are built (this rank's now, its
        // host's in `for_host`).
        if let Some(path) = file {
            let mut plan = PlanFile::load_compact(path)?;
            split_world(&mut plan, world);
            plan.expand_ranks(&[rank]).map_err(|e| {
                ExecError::Invalid(format!("{}: symmetric entry: {e}", path.display()))
            })?;
            let origin = source.clone();
            return Ok((Held::full(plan), origin));
        }
        let (plan, origin) = source.load_split(world)?;
        Ok((Held::full(plan), origin))
    }

    fn plan(&self) -> &PlanFile {
        match self {
            Held::Full { plan, .. } => plan,
            Held::Part { part, .. } => &part.plan,
        }
    }

    /// What every rank of the job must hold alike ([`PlanFile::identity`]).
    fn identity(&self) -> String {
        match self {
            Held::Full { plan, hashes } => plan.identity_with(hashes),
            Held::Part { part, .. } => part.identity().unwrap_or_default(),
        }
    }

    /// The checks before the rendezvous: the whole plan's (verification of what is not
    /// sealed), or those of this rank's sealed programs; the entries this rank keeps.
    fn check(&self, rank: u32, world: u32, config: &Config) -> Result<Vec<usize>> {
        match self {
            Held::Full { plan, hashes } => check_plan(plan, world, config, Some(hashes)),
            Held::Part { part, .. } => check_part(&part.plan, rank, world, config),
        }
    }

    /// This rank's share of every entry's limits ([`crate::program::rank_limits`]).
    fn limits(&self, rank: u32) -> Vec<(u32, u32)> {
        self.plan()
            .entries
            .iter()
            .map(|e| crate::program::rank_limits(&e.schedule, rank))
            .collect()
    }

    /// The plan with the programs of every rank on this host (`on_host`): a part is read
    /// again for them (unless it holds them already), and must still be the plan this rank
    /// checked (`identity`).
    fn for_host(self, on_host: &[bool], identity: &str) -> Result<Held> {
        match self {
            Held::Full { mut plan, hashes } => {
                let ranks: Vec<u32> = (0..on_host.len() as u32)
                    .filter(|&r| on_host[r as usize])
                    .collect();
                plan.expand_ranks(&ranks)
                    .map_err(|e| ExecError::Invalid(format!("plan: symmetric entry: {e}")))?;
                Ok(Held::Full { plan, hashes })
            }
            Held::Part { path, part } => {
                let ranks: Vec<u32> = (0..on_host.len() as u32)
                    .filter(|&r| on_host[r as usize])
                    .collect();
                if ranks == part.ranks {
                    return Ok(Held::Part { path, part });
                }
                let part = PlanFile::load_for_ranks(&path, &ranks)?;
                if part.identity().as_deref() != Some(identity) {
                    return Err(ExecError::Invalid(format!(
                        "{} changed while the job started: the programs of this host's ranks are not those of the plan this rank checked",
                        path.display()
                    )));
                }
                Ok(Held::Part { path, part })
            }
        }
    }
}

/// Ranks that share `rank`'s machine (they compete for its cores).
fn local_ranks(machines: &[String], rank: u32) -> u32 {
    let mine = &machines[rank as usize];
    machines.iter().filter(|h| *h == mine).count() as u32
}

#[cfg(test)]
mod tests {
    use super::rendezvous::*;
    use super::*;

    #[test]
    fn the_fuzzing_seeds_read_as_what_they_are() {
        let seeds = rendezvous_seeds();
        assert_eq!(seeds.len(), 5);
        for seed in &seeds[..2] {
            let hello = read_hello(&mut &seed[1..], FUZZ_TOKEN).unwrap();
            assert_eq!(hello.map(|h| (h.rank, h.world)), Some((1, 4)));
            // Another job's token is not let in.
            assert!(read_hello(&mut &seed[1..], "other").unwrap().is_none());
        }
        let job = read_job(&mut &seeds[2][1..], 1, 4, 2).unwrap();
        assert_eq!(job.hosts.len(), 4);
        assert_eq!(job.limits, vec![(4, 0), (16, 8)]);
        assert!(matches!(
            read_job(&mut &seeds[2][1..], 1, 4, 3),
            Err(ExecError::Bootstrap { .. })
        ));
        let refused = read_job(&mut &seeds[3][1..], 1, 4, 2).err().unwrap();
        assert!(refused.to_string().contains("holds plan"), "{refused}");
        assert_eq!(
            net::setup::parse_data_hello(&mut &seeds[4][1..], (1, 4), FUZZ_TOKEN, "fuzz-nonce"),
            Ok((0, 0, 2))
        );
        for seed in &seeds {
            fuzz_rendezvous(seed);
            for cut in 0..seed.len() {
                fuzz_rendezvous(&seed[..cut]);
            }
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_whose_ranks_cannot_share_memory_are_split() {
        // One host identity, one machine, two shm directories; another host that agrees.
        let mut hosts = strings(&["a", "a", "b", "a", "b"]);
        let machines = strings(&["m", "m", "m", "m", "m"]);
        let shms = strings(&["1:1", "1:1", "1:1", "2:1", "1:1"]);
        let lines = split_hosts(&mut hosts, &machines, &shms);
        assert_eq!(
            hosts,
            strings(&["a+shm:1:1", "a+shm:1:1", "b", "a+shm:2:1", "b"])
        );
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("ranks [0, 1] and [3] claim host a but do not share"),
            "{lines:?}"
        );
        // One host identity on two machines (an explicit HCCL_HOST_ID given twice).
        let mut hosts = strings(&["a", "a"]);
        let lines = split_hosts(
            &mut hosts,
            &strings(&["m1", "m2"]),
            &strings(&["1:1", "1:1"]),
        );
        assert_eq!(
            hosts,
            strings(&["a+machine:m1+shm:1:1", "a+machine:m2+shm:1:1"])
        );
        assert!(lines[0].contains("different machines"), "{lines:?}");
        // Nothing to split: nothing changes, nothing is said.
        let mut hosts = strings(&["a", "b", "a"]);
        assert!(
            split_hosts(
                &mut hosts,
                &strings(&["m", "n", "m"]),
                &strings(&["1:1", "1:1", "1:1"])
            )
            .is_empty()
        );
        assert_eq!(hosts, strings(&["a", "b", "a"]));
    }

    #[test]
    fn a_directory_is_known_by_its_device_and_inode_not_its_path() {
        let tmp = std::env::temp_dir();
        let dot = tmp.join(".");
        assert_eq!(shm_identity(&tmp), shm_identity(&dot));
        assert_ne!(shm_identity(&tmp), shm_identity(std::path::Path::new("/")));
        assert!(shm_identity(std::path::Path::new("/nonexistent/hccl")).starts_with("unreadable"));
    }
}
