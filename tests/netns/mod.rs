#![allow(dead_code)]
//! A pretend cluster for integration tests: `hosts` network namespaces joined by veth pairs to
//! a bridge in a namespace of its own, the layout of `scripts/netns-cluster.sh`, built with `ip`
//! directly (so tests depend neither on the script nor on the working directory).
//!
//! ```ignore
//! mod netns;
//! let cluster = match netns::Cluster::up(2, None) {
//!     Ok(c) => c,
//!     Err(why) => return println!("skipped: {why}"),
//! };
//! let child = cluster.command(1, "some-program").env("PEER", cluster.addr(0)).spawn();
//! cluster.link_down(1); // host 1's cable is pulled
//! ```
//!
//! Layout: namespace `<prefix>-sw` holds bridge `br0` with ports `h0`, `h1`, ...; namespace
//! `<prefix>-h<i>` holds `eth0` (198.18.0.<i+1>/24) and `lo`. The prefix is `hct<pid>x<n>`:
//! unique per call, so tests running in parallel (threads or processes) never collide, and
//! interface names are fixed and short because each lives in its own namespace. Everything
//! lives inside the namespaces, so `Drop` kills what still runs in them and deletes them.
//! Namespaces of an earlier test process that died before dropping its cluster are swept
//! by the next `up`.
//!
//! Needs root, `ip` (and `tc` for a rate limit); without them `up` returns the reason to skip.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What all clusters of test processes are named after: `hct<pid>x<counter>-...`.
const NAME_PREFIX: &str = "hct";

static COUNTER: AtomicUsize = AtomicUsize::new(0);
/// `ip netns add` sets up the `/run/netns` mount on first use; do not race with ourselves.
static CREATE: Mutex<()> = Mutex::new(());

/// Network namespaces standing in for hosts; removed on drop.
pub struct Cluster {
    prefix: String,
    hosts: Vec<String>,
    switch: String,
    rate_gbit: Option<f64>,
}

impl Cluster {
    /// Brings up `hosts` namespaces, each link limited to `rate_gbit` Gbit/s in both
    /// directions when given. `Err` is the reason to skip (not root, no `ip`, namespaces not
    /// permitted, ...); nothing is left behind then.
    pub fn up(hosts: usize, rate_gbit: Option<f64>) -> Result<Cluster, String> {
        if hosts == 0 || hosts > 253 {
            return Err(format!("hosts must be 1..=253, got {hosts}"));
        }
        if let Some(rate) = rate_gbit
            && !(rate > 0.0 && rate <= 1000.0)
        {
            return Err(format!("rate must be in (0, 1000] Gbit/s, got {rate}"));
        }
        if !is_root() {
            return Err("not root (network namespaces need CAP_SYS_ADMIN)".into());
        }
        run("ip", &["-V"]).map_err(|e| format!("`ip` (iproute2) not usable: {e}"))?;
        if rate_gbit.is_some() {
            run("tc", &["-V"]).map_err(|e| format!("`tc` (iproute2) not usable: {e}"))?;
        }
        let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        sweep_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{NAME_PREFIX}{}x{n}", std::process::id());
        let cluster = Cluster {
            switch: format!("{prefix}-sw"),
            hosts: (0..hosts).map(|i| format!("{prefix}-h{i}")).collect(),
            prefix,
            rate_gbit,
        };
        // A leftover of a dead process that had our pid (swept above unless it is still
        // held by a process): start clean.
        cluster.remove();
        // On failure `cluster` is dropped, which removes what was made.
        cluster.build()?;
        Ok(cluster)
    }

    fn build(&self) -> Result<(), String> {
        let sw = self.switch.as_str();
        run("ip", &["netns", "add", sw])
            .map_err(|e| format!("cannot create network namespaces: {e}"))?;
        ip(&["-n", sw, "link", "set", "lo", "up"])?;
        ip(&["-n", sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            sw,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])?;
        ip(&["-n", sw, "link", "set", "br0", "up"])?;
        for (i, ns) in self.hosts.iter().enumerate() {
            let port = format!("h{i}");
            let ns = ns.as_str();
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            // Both ends are created inside their namespaces: the root namespace is untouched.
            ip(&[
                "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", sw,
            ])?;
            ip(&["-n", sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", sw, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", self.addr(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            if let Some(rate) = self.rate_gbit {
                tbf(ns, "eth0", rate)?;
                tbf(sw, &port, rate)?;
            }
        }
        // Carrier comes up asynchronously; wait for it so the first connect does not race.
        for i in 0..self.hosts.len() {
            self.wait_carrier(i, true, Duration::from_secs(5))?;
        }
        Ok(())
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The IPv4 address of `host` (198.18.0.<host+1>).
    pub fn addr(&self, host: usize) -> String {
        assert!(
            host < self.hosts.len(),
            "host {host} of {}",
            self.hosts.len()
        );
        format!("198.18.0.{}", host + 1)
    }

    /// The namespace of `host`.
    pub fn ns(&self, host: usize) -> &str {
        &self.hosts[host]
    }

    /// The switch's namespace.
    pub fn switch_ns(&self) -> &str {
        &self.switch
    }

    /// Every namespace this cluster made (hosts, then the switch).
    pub fn namespaces(&self) -> Vec<String> {
        let mut all = self.hosts.clone();
        all.push(self.switch.clone());
        all
    }

    /// `ip netns exec <ns of host> program`: add arguments, environment, pipes as usual.
    /// The `ip` process execs `program`, so the child's pid and kill() are the program's.
    pub fn command(&self, host: usize, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns(host)]).arg(program);
        cmd
    }

    /// Pulls `host`'s cable: its switch port goes down, its `eth0` loses carrier, and its
    /// traffic (in both directions) stops until `link_up`. Established connections stay
    /// open on both sides; they stall and time out.
    pub fn link_down(&self, host: usize) {
        self.set_port(host, "down");
        self.wait_carrier(host, false, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("link_down({host}): {e}"));
    }

    /// Plugs `host`'s cable back in, and returns once the kernel has finished bringing the
    /// link back: carrier on `eth0`, both ends operationally up (the link-watch work that
    /// sets this runs late on a loaded machine, and the bridge enables its port only then),
    /// the switch port forwarding, and no neighbour entry left that failed while the link was
    /// down (such an entry answers "No route to host" until it is probed again).
    pub fn link_up(&self, host: usize) {
        self.set_port(host, "up");
        // Operationally up implies carrier.
        self.wait_ready(host, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("link_up({host}): {e}"));
        for ns in &self.hosts {
            let _ = ip(&["-n", ns, "neigh", "flush", "dev", "eth0"]);
        }
    }

    /// Waits until `host`'s `eth0` and its switch port are operationally up and the port
    /// forwards.
    fn wait_ready(&self, host: usize, limit: Duration) -> Result<(), String> {
        let port = format!("h{host}");
        poll(limit, || {
            let nic = run(
                "ip",
                &["-n", self.ns(host), "-o", "link", "show", "dev", "eth0"],
            )?;
            let sw = run(
                "ip",
                &["-n", &self.switch, "-o", "-d", "link", "show", "dev", &port],
            )?;
            let ready = nic.contains(" state UP ")
                && sw.contains(" state UP ")
                && sw.contains("bridge_slave state forwarding");
            Ok((
                ready,
                format!("eth0 `{}`, switch port `{}`", nic.trim(), sw.trim()),
            ))
        })
        .map_err(|last| format!("host {host} not ready after {limit:?}: {last}"))
    }

    fn set_port(&self, host: usize, state: &str) {
        let port = format!("h{host}");
        ip(&["-n", &self.switch, "link", "set", &port, state])
            .unwrap_or_else(|e| panic!("setting {port} {state}: {e}"));
    }

    /// Waits until `host`'s eth0 has (or lacks) carrier.
    fn wait_carrier(&self, host: usize, up: bool, limit: Duration) -> Result<(), String> {
        poll(limit, || {
            let out = run(
                "ip",
                &["-n", self.ns(host), "-o", "link", "show", "dev", "eth0"],
            )?;
            // `<BROADCAST,MULTICAST,UP,LOWER_UP>` with carrier, `NO-CARRIER` without.
            let has = out.contains("LOWER_UP") && !out.contains("NO-CARRIER");
            Ok((has == up, out.trim().to_string()))
        })
        .map_err(|last| {
            format!(
                "eth0 of {} did not get carrier {}: {last}",
                self.ns(host),
                if up { "up" } else { "down" }
            )
        })
    }

    /// Kills what runs inside and deletes the namespaces (their links go with them).
    fn remove(&self) {
        remove_namespaces(&self.namespaces());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Calls `probe` every 10 ms until it answers `(true, _)`; past `limit`, `Err` with what it
/// said last (a failing command's error as it is).
fn poll(
    limit: Duration,
    mut probe: impl FnMut() -> Result<(bool, String), String>,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let (done, state) = probe()?;
        if done {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(state);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills every process inside `names`, then deletes them; ignores names that do not exist.
fn remove_namespaces(names: &[String]) {
    let existing = list_namespaces();
    let names: Vec<&String> = names.iter().filter(|n| existing.contains(*n)).collect();
    for ns in &names {
        // A process left inside would keep the namespace alive after `netns del`.
        if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
            let pids: Vec<&str> = pids.split_whitespace().collect();
            if !pids.is_empty() {
                let _ = Command::new("kill")
                    .arg("-9")
                    .args(&pids)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    for ns in names {
        let _ = run("ip", &["netns", "del", ns]);
    }
}

/// Namespaces named by `ip netns list` (its lines read `name` or `name (id: N)`).
pub fn list_namespaces() -> HashSet<String> {
    run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Removes clusters of test processes that no longer run (`hct<pid>x<n>-...` with no
/// `/proc/<pid>`): a test that was killed cannot run its `Drop`.
fn sweep_stale() {
    let stale: Vec<String> = list_namespaces()
        .into_iter()
        .filter(|name| {
            let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
                return false;
            };
            let Some((pid, tail)) = rest.split_once('x') else {
                return false;
            };
            let ours = tail.split_once('-').is_some_and(|(n, role)| {
                n.bytes().all(|b| b.is_ascii_digit())
                    && (role == "sw"
                        || role.strip_prefix('h').is_some_and(|i| {
                            !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())
                        }))
            });
            ours && pid.parse::<u32>().is_ok_and(|pid| {
                pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            })
        })
        .collect();
    remove_namespaces(&stale);
}

/// tbf on the egress of `dev` in `ns`: `rate` Gbit/s, a bucket of 2 ms at the rate (at
/// least 256 KiB, so 64 KiB GSO segments pass whole and TCP reaches the rate) and a queue
/// of at most 20 ms.
fn tbf(ns: &str, dev: &str, rate: f64) -> Result<(), String> {
    let bytes_per_s = rate * 1e9 / 8.0;
    let burst = ((bytes_per_s / 500.0) as u64).max(256 * 1024);
    run(
        "tc",
        &[
            "-n",
            ns,
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            &format!("{}bit", (rate * 1e9).round() as u64),
            "burst",
            &burst.to_string(),
            "latency",
            "20ms",
        ],
    )
    .map(|_| ())
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args).map(|_| ())
}

/// Runs a command to completion; `Err` carries the command line and its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Effective uid 0, read from `/proc/self/status` (std has no `geteuid`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
