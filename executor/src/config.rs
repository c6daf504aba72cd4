//! Configuration: timeouts, slot size, entry filters, network settings, and where plans come
//! from — with the environment overrides `HCCL_PLAN`, `HCCL_ALGO`, `HCCL_PROTO`,
//! `HCCL_DEBUG`, `HCCL_TIMEOUT`, `HCCL_SLOT_BYTES`, `HCCL_VERIFY`, `HCCL_CHECK_CALLS`,
//! `HCCL_CHECKSUM`, `HCCL_STREAM_WRITES`, `HCCL_TRACE`, `HCCL_TRACE_CALLS`, `HCCL_SHM_DIR` and the network's (see [`NetConfig::from_env`]).

use crate::env_vars::env;
use crate::error::{ExecError, Result};
use hccl_ir::{PlanFile, Protocol};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default `HCCL_TIMEOUT`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default bytes per connection slot (a message; larger calls run in segments).
pub const DEFAULT_SLOT_BYTES: usize = 256 * 1024;

/// Default `HCCL_SHM_DIR`.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";

/// Which plan entries a communicator verifies when it starts (`HCCL_VERIFY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// Those no seal of this build's verifier covers (`HCCL_VERIFY=auto`, the default):
    /// entries `hcclc compile` verified and sealed are not verified again.
    #[default]
    Unsealed,
    /// Every entry, sealed or not (`HCCL_VERIFY=full`).
    Full,
}

/// Runtime settings of a communicator.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a rank waits without progress before it reports the peer it waits for.
    pub timeout: Duration,
    /// Capacity of one connection slot in bytes.
    pub slot_bytes: usize,
    /// Use only entries of this algorithm family where the plan has one for the collective.
    pub algo: Option<String>,
    /// Use only entries of this protocol where the plan has one for the collective.
    pub proto: Option<Protocol>,
    /// Connections between hosts (process backend): sockets, threads, interface, transport.
    pub net: NetConfig,
    /// Which entries are verified at start.
    pub verify: VerifyMode,
    /// How ranks compare their calls' fingerprints (`HCCL_CHECK_CALLS`).
    pub check_calls: CallCheck,
    /// Every message carries a CRC32C of its bytes, which its receiver checks
    /// (`HCCL_CHECKSUM=1`): a mismatch is [`ExecError::Corrupt`] naming sender, receiver,
    /// channel and step. Every rank must use the same setting (the process backend checks at
    /// start). Messages then travel through slots only (no single copy in the threads
    /// backend); RDMA transfers are not covered.
    pub checksum: bool,
    /// How large messages are written into the slots another core reads
    /// (`HCCL_STREAM_WRITES`).
    pub stream_writes: StreamWrites,
    /// Record every rank's steps and write `DIR/rank-<r>.json` (`HCCL_TRACE=DIR`,
    /// `HCCL_TRACE_CALLS`; see [`crate::trace`]); `None`: no tracing (the default).
    pub trace: Option<crate::trace::TraceConfig>,
    /// Where the process backend makes its hosts' shared regions (`HCCL_SHM_DIR`, default
    /// `/dev/shm`). Ranks of one host identity whose directories are not the same directory
    /// (containers with a `/dev/shm` of their own) share no region: they talk over the
    /// network, as ranks of different hosts do.
    pub shm_dir: PathBuf,
}

/// How a rank writes messages of 64 KiB and more into the slots another core reads
/// (`HCCL_STREAM_WRITES`; see `copy.rs`, `PeerWrites`). Results are the same either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamWrites {
    /// Through the cache, unless those writes have collapsed below 4 GB/s and non-temporal
    /// ones measure more than twice as fast (`HCCL_STREAM_WRITES=auto`). The default.
    #[default]
    Auto,
    /// Always with non-temporal stores, past the cache (`HCCL_STREAM_WRITES=1`).
    Always,
    /// Always through the cache (`HCCL_STREAM_WRITES=0`).
    Never,
}

/// How ranks compare their calls (`HCCL_CHECK_CALLS`): every call a rank starts publishes
/// its fingerprint (collective, root, element type, operator, count, the placement of the
/// schedule it runs) on the
/// rank's line of the shared region, and ranks whose calls differ get
/// [`ExecError::CallMismatch`] naming both calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallCheck {
    /// No fingerprints (`HCCL_CHECK_CALLS=0`).
    Off,
    /// Every message carries its sender's call and its receiver compares it before reading
    /// (a mismatch fails at the first message, on every rank), and a rank that waits for a
    /// peer compares the calls at each liveness check, every 5 ms of waiting (a mismatch
    /// that leaves ranks waiting without a message fails in milliseconds instead of at the
    /// timeout). The default. Costs one store per message and per call, and one load and
    /// compare per received message, in cache lines the message touches anyway.
    #[default]
    Waits,
    /// Also at the end of every call, against every rank that shares the region and shows
    /// that call (`HCCL_CHECK_CALLS=1`): every mismatch among those ranks fails before the
    /// call returns. Costs reading the peers' lines once per call.
    EveryCall,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: DEFAULT_TIMEOUT,
            slot_bytes: DEFAULT_SLOT_BYTES,
            algo: None,
            proto: None,
            net: NetConfig::default(),
            verify: VerifyMode::default(),
            check_calls: CallCheck::default(),
            checksum: false,
            stream_writes: StreamWrites::Auto,
            trace: None,
            shm_dir: PathBuf::from(DEFAULT_SHM_DIR),
        }
    }
}

impl Config {
    /// Defaults overridden by `HCCL_TIMEOUT` (seconds, fractional allowed), `HCCL_ALGO`,
    /// `HCCL_PROTO`, `HCCL_SLOT_BYTES`, `HCCL_VERIFY`, `HCCL_CHECK_CALLS`, `HCCL_CHECKSUM`,
    /// `HCCL_STREAM_WRITES`, `HCCL_TRACE`, `HCCL_TRACE_CALLS`, `HCCL_SHM_DIR` and the network's; also installs the `HCCL_DEBUG`
    /// log subscriber. A value a variable does not accept is [`ExecError::Env`] naming the
    /// variable, the value and the values accepted (an `HCCL_ALGO` no entry of the plan has
    /// is refused when the plan is checked); an `HCCL_*` variable that is not one the
    /// workspace reads is a warning on stderr naming the closest known name
    /// ([`crate::env_vars`]), whatever `HCCL_DEBUG` says.
    pub fn from_env() -> Result<Config> {
        crate::env_vars::warn_unknown_vars();
        let mut cfg = Config::from_vars(env)?;
        init_tracing();
        cfg.net = NetConfig::from_env()?;
        Ok(cfg)
    }

    /// [`Config::from_env`]'s settings but the network's, from the values `env` gives (set
    /// and not blank), without the warnings and the log subscriber.
    pub(crate) fn from_vars(env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        if let Some(v) = env("HCCL_DEBUG") {
            debug_level(&v)?;
        }
        let bad = |name: &'static str, value: &str, expected: &str| ExecError::Env {
            name,
            value: value.to_string(),
            expected: expected.to_string(),
        };
        let mut cfg = Config::default();
        if let Some(v) = env("HCCL_TIMEOUT") {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| bad("HCCL_TIMEOUT", &v, "positive seconds"))?;
            cfg.timeout = Duration::from_secs_f64(secs.min(1e9));
        }
        if let Some(v) = env("HCCL_SLOT_BYTES") {
            cfg.slot_bytes = v
                .trim()
                .parse()
                .ok()
                .filter(|b| *b >= 64)
                .ok_or_else(|| bad("HCCL_SLOT_BYTES", &v, "bytes >= 64"))?;
        }
        if let Some(v) = env("HCCL_ALGO") {
            cfg.algo = Some(v.trim().to_string());
        }
        if let Some(v) = env("HCCL_PROTO") {
            cfg.proto = Some(
                Protocol::from_name(v.trim())
                    .ok_or_else(|| bad("HCCL_PROTO", &v, "LL, LL128 or Simple"))?,
            );
        }
        if let Some(v) = env("HCCL_VERIFY") {
            cfg.verify = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => VerifyMode::Unsealed,
                "full" => VerifyMode::Full,
                _ => {
                    return Err(bad(
                        "HCCL_VERIFY",
                        &v,
                        "auto (verify the entries no seal covers) or full",
                    ));
                }
            };
        }
        if let Some(v) = env("HCCL_CHECK_CALLS") {
            cfg.check_calls = match v.trim() {
                "0" => CallCheck::Off,
                "waits" => CallCheck::Waits,
                "1" => CallCheck::EveryCall,
                _ => {
                    return Err(bad(
                        "HCCL_CHECK_CALLS",
                        &v,
                        "1 (compare the ranks' calls at the end of every call), waits (while \
                         waiting for a peer, the default) or 0",
                    ));
                }
            };
        }
        if let Some(v) = env("HCCL_CHECKSUM") {
            cfg.checksum = match v.trim() {
                "0" => false,
                "1" => true,
                _ => {
                    return Err(bad(
                        "HCCL_CHECKSUM",
                        &v,
                        "1 (a CRC32C on every message, checked by its receiver) or 0 (the \
                         default)",
                    ));
                }
            };
        }
        if let Some(v) = env("HCCL_STREAM_WRITES") {
            cfg.stream_writes = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => StreamWrites::Auto,
                "1" => StreamWrites::Always,
                "0" => StreamWrites::Never,
                _ => {
                    return Err(bad(
                        "HCCL_STREAM_WRITES",
                        &v,
                        "auto (stream large messages past the cache while cached writes \
                         have collapsed, the default), 1 (always) or 0 (never)",
                    ));
                }
            };
        }
        // Read by the plan reader (`hccl_ir::plan::expansion_limit`), checked here so that a
        // bad value fails every communicator's start, not only the loads that expand a plan.
        if let Some(v) = env("HCCL_PLAN_MAX_STEPS") {
            hccl_ir::plan::parse_max_steps(&v)
                .map_err(|_| bad("HCCL_PLAN_MAX_STEPS", &v, "a positive number of steps"))?;
        }
        if let Some(v) = env("HCCL_SHM_DIR") {
            let dir = PathBuf::from(v.trim());
            if !dir.is_dir() {
                return Err(bad(
                    "HCCL_SHM_DIR",
                    &v,
                    "an existing directory (on a memory file system, e.g. /dev/shm)",
                ));
            }
            cfg.shm_dir = dir;
        }
        if let Some(dir) = env("HCCL_TRACE") {
            cfg.trace = Some(crate::trace::TraceConfig {
                dir: PathBuf::from(dir),
                calls: crate::trace::calls_from(env("HCCL_TRACE_CALLS"))?,
            });
        }
        Ok(cfg)
    }

    /// Sets whether and where every rank writes its trace (`HCCL_TRACE`).
    pub fn with_trace(mut self, trace: Option<crate::trace::TraceConfig>) -> Config {
        self.trace = trace;
        self
    }

    /// Sets the network settings.
    pub fn with_net(mut self, net: NetConfig) -> Config {
        self.net = net;
        self
    }

    /// Sets how ranks compare their calls (`HCCL_CHECK_CALLS`).
    pub fn with_check_calls(mut self, check: CallCheck) -> Config {
        self.check_calls = check;
        self
    }

    /// Sets how large messages are written into slots (`HCCL_STREAM_WRITES`).
    pub fn with_stream_writes(mut self, how: StreamWrites) -> Config {
        self.stream_writes = how;
        self
    }

    /// Sets whether messages carry checksums (`HCCL_CHECKSUM`).
    pub fn with_checksum(mut self, on: bool) -> Config {
        self.checksum = on;
        self
    }

    /// Sets the timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Config {
        self.timeout = timeout;
        self
    }

    /// Sets which entries are verified at start.
    pub fn with_verify(mut self, verify: VerifyMode) -> Config {
        self.verify = verify;
        self
    }

    /// Sets where the process backend makes its shared regions (`HCCL_SHM_DIR`).
    pub fn with_shm_dir(mut self, dir: impl Into<PathBuf>) -> Config {
        self.shm_dir = dir.into();
        self
    }

    /// Sets the slot size.
    pub fn with_slot_bytes(mut self, bytes: usize) -> Config {
        self.slot_bytes = bytes;
        self
    }
}

/// The levels `HCCL_DEBUG` accepts (any case).
pub const DEBUG_LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// `HCCL_DEBUG`'s value as a `tracing` level, or [`ExecError::Env`].
fn debug_level(value: &str) -> Result<String> {
    let level = value.trim().to_ascii_lowercase();
    if DEBUG_LEVELS.contains(&level.as_str()) {
        Ok(level)
    } else {
        Err(ExecError::Env {
            name: "HCCL_DEBUG",
            value: value.to_string(),
            expected: format!("one of {} (any case)", DEBUG_LEVELS.join(", ")),
        })
    }
}

/// Installs a `tracing` subscriber at the level `HCCL_DEBUG` names (`WARN`, `INFO`,
/// `TRACE`, …), once; does nothing when unset, not a level ([`Config::from_env`] refuses
/// it) or when the program installed its own.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(level) = env("HCCL_DEBUG").and_then(|v| debug_level(&v).ok()) {
            let filter = tracing_subscriber::EnvFilter::new(format!("hccl_executor={level}"));
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}

/// Where a communicator's plan comes from.
#[derive(Debug, Clone)]
pub enum PlanSource {
    /// The built-in fallback plans ([`crate::fallback`]).
    Builtin,
    /// A plan file, or a directory whose `*.ron` files are merged (in name order).
    Path(PathBuf),
    /// A plan already in memory.
    Plan(PlanFile),
}

impl PlanSource {
    /// Resolves the source to a plan for `world` ranks; `HCCL_PLAN` overrides it. A plan
    /// (file, directory or in memory) may hold entries for several world sizes: those for
    /// `world` ranks are kept, the others skipped.
    pub fn load(self, world: u32) -> Result<PlanFile> {
        self.resolve().load_split(world).map(|(plan, _)| plan)
    }

    /// The source `HCCL_PLAN` names, else this one.
    pub(crate) fn resolve(self) -> PlanSource {
        match env("HCCL_PLAN") {
            Some(path) => PlanSource::Path(PathBuf::from(path)),
            None => self,
        }
    }

    /// The plan for `world` ranks from exactly this source (no `HCCL_PLAN`), and the source
    /// a later [`crate::Communicator::shrink`] draws from: the same path, the built-in plans,
    /// or the entries of an in-memory plan for other world sizes.
    pub(crate) fn load_split(self, world: u32) -> Result<(PlanFile, PlanSource)> {
        match self {
            PlanSource::Builtin => Ok((crate::fallback::plan(world), PlanSource::Builtin)),
            PlanSource::Plan(mut plan) => {
                let rest = split_world(&mut plan, world);
                Ok((plan, PlanSource::Plan(rest)))
            }
            PlanSource::Path(path) => {
                let mut plan = load_path(&path)?;
                split_world(&mut plan, world);
                Ok((plan, PlanSource::Path(path)))
            }
        }
    }

    /// Where a plan from this source comes from.
    pub(crate) fn origin(&self) -> PlanOrigin {
        match self {
            PlanSource::Builtin => PlanOrigin::Builtin,
            PlanSource::Path(p) => PlanOrigin::Path(p.clone()),
            PlanSource::Plan(_) => PlanOrigin::Memory,
        }
    }

    /// The source a communicator of `world` ranks shrunk from a communicator built from this
    /// one uses, and why: this source when it has entries for `world` ranks (a plan
    /// directory holding plans for several world sizes, a plan file or an in-memory plan
    /// with such entries), else the built-in plan. A path that can no longer be read falls
    /// back to the built-in plan with a warning.
    pub(crate) fn for_world(self, world: u32) -> (PlanSource, String) {
        let builtin = |why: String| (PlanSource::Builtin, format!("the built-in plan ({why})"));
        match self {
            PlanSource::Builtin => builtin("the communicator's plan was built in".into()),
            PlanSource::Plan(plan) => {
                if plan.entries.iter().any(|e| e.schedule.nranks == world) {
                    let why = format!("the entries for {world} ranks of the plan it was given");
                    (PlanSource::Plan(plan), why)
                } else {
                    builtin(format!(
                        "the plan it was given has no entries for {world} ranks"
                    ))
                }
            }
            PlanSource::Path(path) => match load_path(&path) {
                Ok(plan) if plan.entries.iter().any(|e| e.schedule.nranks == world) => {
                    let why = format!("the entries for {world} ranks of {}", path.display());
                    (PlanSource::Path(path), why)
                }
                Ok(_) => builtin(format!(
                    "{} has no entries for {world} ranks",
                    path.display()
                )),
                Err(e) => {
                    tracing::warn!("shrink: cannot read {}: {e}", path.display());
                    builtin(format!("{} cannot be read: {e}", path.display()))
                }
            },
        }
    }
}

/// Where the plan a communicator runs came from ([`crate::Communicator::plan_origin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanOrigin {
    /// The built-in plans ([`crate::fallback`]).
    Builtin,
    /// This plan file or directory (its entries for the communicator's world size).
    Path(PathBuf),
    /// A plan the program passed in memory.
    Memory,
}

/// Keeps only `plan`'s entries for `world` ranks, when it has any (otherwise leaves it
/// alone, so that the world-size check names the mismatch), and returns the others (with
/// the plan's metadata and seals): a plan directory or file may hold plans for several
/// world sizes, e.g. for the communicators [`crate::Communicator::shrink`] builds.
pub(crate) fn split_world(plan: &mut PlanFile, world: u32) -> PlanFile {
    let mut rest = PlanFile::new(plan.meta.clone());
    rest.format_version = plan.format_version;
    rest.verified = plan.verified.clone();
    if plan.entries.iter().any(|e| e.schedule.nranks == world)
        && plan.entries.iter().any(|e| e.schedule.nranks != world)
    {
        let (mine, other): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.entries)
            .into_iter()
            .partition(|e| e.schedule.nranks == world);
        tracing::debug!(
            "plan: {} entries for {world} ranks kept, {} for other world sizes skipped",
            mine.len(),
            other.len()
        );
        plan.entries = mine;
        rest.entries = other;
    }
    rest
}

/// Loads a plan file (RON, or MSCCL XML by its `.xml` extension) or merges a directory of
/// plan files.
pub fn load_path(path: &Path) -> Result<PlanFile> {
    if !path.is_dir() {
        if path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("xml"))
        {
            // An MSCCL algorithm: imported (and verified later, like every plan).
            let imported =
                hccl_ir::msccl::load_xml(path).map_err(|e| ExecError::Invalid(e.to_string()))?;
            return Ok(imported.into_plan(&path.display().to_string()));
        }
        return Ok(PlanFile::load(path)?);
    }
    let dir_err = |message: String| ExecError::PlanDir {
        path: path.display().to_string(),
        message,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| dir_err(format!("cannot list directory: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ron") && p.is_file())
        .collect();
    files.sort();
    let mut merged: Option<PlanFile> = None;
    for file in files {
        let plan = PlanFile::load(&file)?;
        match &mut merged {
            None => merged = Some(plan),
            Some(m) => {
                m.entries.extend(plan.entries);
                m.verified.extend(plan.verified);
            }
        }
    }
    merged.ok_or_else(|| dir_err("no *.ron plan files in directory".to_string()))
}

/// Most sockets per pair of ranks (`HCCL_NSOCKS`).
const MAX_NSOCKS: usize = 64;

/// Which network transport carries data between hosts (`HCCL_NET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetKind {
    /// RDMA when compiled in and a device is present, else TCP.
    Auto,
    /// TCP sockets.
    Socket,
    /// RDMA (InfiniBand / RoCE) through `ibverbs`; an error when unavailable.
    Ib,
}

/// Network settings, from the environment.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Sockets per pair of ranks on different hosts (`HCCL_NSOCKS`, 1..=64).
    pub nsocks: usize,
    /// Threads that write one message's parts concurrently (`HCCL_NTHREADS`, 1..=nsocks).
    pub nthreads: usize,
    /// Interfaces allowed for data sockets (`HCCL_SOCKET_IFNAME`).
    pub ifname: Option<IfSpec>,
    /// Transport choice (`HCCL_NET=ib|socket`).
    pub kind: NetKind,
    /// RDMA device (`HCCL_IB_HCA`, a device name prefix, optionally `:port`).
    pub ib_hca: Option<String>,
}

impl Default for NetConfig {
    fn default() -> NetConfig {
        NetConfig {
            nsocks: 1,
            nthreads: 1,
            ifname: None,
            kind: NetKind::Auto,
            ib_hca: None,
        }
    }
}

impl NetConfig {
    /// Defaults overridden by `HCCL_NSOCKS`, `HCCL_NTHREADS`, `HCCL_SOCKET_IFNAME`,
    /// `HCCL_NET` and `HCCL_IB_HCA`.
    pub fn from_env() -> Result<NetConfig> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        let mut cfg = NetConfig::default();
        let count = |name: &'static str, v: String, max: usize| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| ExecError::Env {
                    name,
                    value: v.clone(),
                    expected: format!("1 to {max}"),
                })
        };
        if let Some(v) = var("HCCL_NSOCKS") {
            cfg.nsocks = count("HCCL_NSOCKS", v, MAX_NSOCKS)?;
        }
        if let Some(v) = var("HCCL_NTHREADS") {
            cfg.nthreads = count("HCCL_NTHREADS", v, MAX_NSOCKS)?;
        }
        cfg.nthreads = cfg.nthreads.min(cfg.nsocks);
        if let Some(v) = var("HCCL_SOCKET_IFNAME") {
            cfg.ifname = Some(IfSpec::parse(&v).map_err(ExecError::Invalid)?);
        }
        if let Some(v) = var("HCCL_NET") {
            cfg.kind = match v.trim().to_ascii_lowercase().as_str() {
                "ib" | "rdma" => NetKind::Ib,
                "socket" | "tcp" => NetKind::Socket,
                _ => {
                    return Err(ExecError::Env {
                        name: "HCCL_NET",
                        value: v,
                        expected: "ib (or rdma) or socket (or tcp)".into(),
                    });
                }
            };
        }
        cfg.ib_hca = var("HCCL_IB_HCA");
        Ok(cfg)
    }
}

/// A parsed `HCCL_SOCKET_IFNAME` (NCCL's syntax): a comma-separated list of interface name
/// prefixes (`eth,ib`); a leading `^` excludes the listed interfaces instead (`^docker,lo`);
/// a leading `=` (after the `^` if any) makes the names exact rather than prefixes
/// (`=eth0`, `^=docker0`). Which address it selects: `net::iface::choose`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    /// Parses the variable's value.
    pub fn parse(text: &str) -> Result<IfSpec, String> {
        let mut rest = text.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(format!("HCCL_SOCKET_IFNAME={text}: names no interface"));
        }
        Ok(IfSpec {
            exclude,
            exact,
            names,
        })
    }

    /// Whether interface `name` may be used.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Config::from_vars`] over these variables only.
    fn config_of(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    /// The variable, value and accepted values of an [`ExecError::Env`], else a panic.
    fn env_error(vars: &[(&str, &str)]) -> (&'static str, String, String) {
        match config_of(vars) {
            Err(ExecError::Env {
                name,
                value,
                expected,
            }) => (name, value, expected),
            other => panic!("{vars:?}: expected an Env error, got {other:?}"),
        }
    }

    #[test]
    fn misspelt_values_of_enumerated_variables_are_errors() {
        let (name, value, expected) = env_error(&[("HCCL_PROTO", "Simpel")]);
        assert_eq!((name, value.as_str()), ("HCCL_PROTO", "Simpel"));
        assert!(
            expected.contains("LL128") && expected.contains("Simple"),
            "{expected}"
        );
        let err = config_of(&[("HCCL_PROTO", "Simpel")])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "HCCL_PROTO=Simpel: expected LL, LL128 or Simple");
        for (var, bad) in [
            ("HCCL_DEBUG", "INOF"),
            ("HCCL_VERIFY", "ful"),
            ("HCCL_CHECK_CALLS", "wait"),
            ("HCCL_CHECKSUM", "yes"),
            ("HCCL_STREAM_WRITES", "always"),
            ("HCCL_TIMEOUT", "5s"),
            ("HCCL_SLOT_BYTES", "32"),
            ("HCCL_PLAN_MAX_STEPS", "0"),
            ("HCCL_SHM_DIR", "/nonexistent/hccl-shm"),
        ] {
            let (name, value, expected) = env_error(&[(var, bad)]);
            assert_eq!((name, value.as_str()), (var, bad));
            assert!(!expected.is_empty());
        }
        let (_, _, expected) = env_error(&[("HCCL_DEBUG", "INOF")]);
        assert!(
            expected.contains("info") && expected.contains("trace"),
            "{expected}"
        );
        let (name, ..) = env_error(&[("HCCL_TRACE", "/tmp/t"), ("HCCL_TRACE_CALLS", "0")]);
        assert_eq!(name, "HCCL_TRACE_CALLS");
    }

    #[test]
    fn accepted_values_are_read() {
        let cfg = config_of(&[
            ("HCCL_PROTO", "ll"),
            ("HCCL_ALGO", " Ring "),
            ("HCCL_DEBUG", "Warn"),
            ("HCCL_VERIFY", "FULL"),
            ("HCCL_CHECK_CALLS", "1"),
            ("HCCL_CHECKSUM", "1"),
            ("HCCL_STREAM_WRITES", "1"),
            ("HCCL_TIMEOUT", "2.5"),
            ("HCCL_SHM_DIR", "/tmp"),
        ])
        .unwrap();
        assert_eq!(cfg.stream_writes, StreamWrites::Always);
        for (v, how) in [("AUTO", StreamWrites::Auto), ("0", StreamWrites::Never)] {
            let cfg = config_of(&[("HCCL_STREAM_WRITES", v)]).unwrap();
            assert_eq!(cfg.stream_writes, how, "{v}");
        }
        assert_eq!(cfg.shm_dir, Path::new("/tmp"));
        assert_eq!(cfg.proto, Some(Protocol::LL));
        assert_eq!(cfg.algo.as_deref(), Some("Ring"));
        assert_eq!(cfg.verify, VerifyMode::Full);
        assert_eq!(cfg.check_calls, CallCheck::EveryCall);
        assert!(cfg.checksum);
        assert_eq!(cfg.timeout, Duration::from_millis(2500));
        let none = config_of(&[]).unwrap();
        assert_eq!(none.timeout, DEFAULT_TIMEOUT);
        assert!(none.algo.is_none() && none.proto.is_none() && none.trace.is_none());
        assert_eq!(none.shm_dir, Path::new(DEFAULT_SHM_DIR));
        assert_eq!(none.stream_writes, StreamWrites::Auto);
    }

    #[test]
    fn an_algorithm_no_entry_of_the_plan_has_is_an_error_at_start() {
        let config = Config {
            algo: Some("rnig".into()),
            ..Config::default()
        };
        let err =
            match crate::threads::ThreadGroup::with_config(crate::fallback::plan(2), 2, config) {
                Ok(_) => panic!("a misspelt HCCL_ALGO started communicators"),
                Err(e) => e,
            };
        let ExecError::Env {
            name,
            value,
            expected,
        } = &err
        else {
            panic!("expected an Env error, got {err:?}");
        };
        assert_eq!((*name, value.as_str()), ("HCCL_ALGO", "rnig"));
        assert!(expected.contains("ring"), "{err}");
        assert!(
            err.to_string().starts_with("HCCL_ALGO=rnig: expected"),
            "{err}"
        );
        // A family of the plan in any case still starts, filtered.
        let config = Config {
            algo: Some("RING".into()),
            ..Config::default()
        };
        crate::threads::ThreadGroup::with_config(crate::fallback::plan(2), 2, config).unwrap();
    }
}
