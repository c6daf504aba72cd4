//! The `netns` test helper itself: a 2-host cluster carries a TCP echo between its
//! namespaces, `link_down` stops the traffic (an established connection stalls, a new one
//! fails) and `link_up` restores it, and dropping the cluster kills what ran inside and
//! leaves no namespace behind. Sockets inside a namespace need a process there, so the
//! echo ends are this test executable re-executed (`HCCL_NETNS_ROLE` set) through
//! `Cluster::command`. Skips (passing) where namespaces cannot be made.
//!
//! A test binary of its own, not a module of `tests/it/`: it re-executes itself, makes and
//! removes network namespaces, and kills what ran inside them.

mod netns;

use netns::Cluster;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

const ROLE: &str = "HCCL_NETNS_ROLE";
const ADDR: &str = "HCCL_NETNS_ADDR";
const PORT: u16 = 7000;
/// Generous bound on any one step (the machines running tests are slow and shared).
const STEP: Duration = Duration::from_secs(20);

/// In a child process: the role. Run directly: nothing.
#[test]
fn netns_child() {
    if let Ok(role) = std::env::var(ROLE) {
        let addr: SocketAddr = std::env::var(ADDR)
            .expect("address")
            .parse()
            .expect("socket address");
        match role.as_str() {
            "server" => server(addr),
            "client" => client(addr),
            other => {
                println!("ERROR: unknown role {other}");
                std::process::exit(2);
            }
        }
    }
}

/// Echoes lines on every connection; ends itself after a minute at the latest.
fn server(addr: SocketAddr) -> ! {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(0);
    });
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            println!("ERROR: bind {addr}: {e}");
            std::process::exit(2);
        }
    };
    println!("LISTENING");
    let _ = std::io::stdout().flush();
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut out = match stream.try_clone() {
                Ok(s) => s,
                Err(_) => return,
            };
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if writeln!(out, "{line}").is_err() {
                    return;
                }
            }
        });
    }
    std::process::exit(0)
}

/// Connects (3 s), then sends each stdin line and prints `ECHO <line>` or `FAIL: <error>`
/// (3 s to answer). Ends at stdin's end.
fn client(addr: SocketAddr) -> ! {
    let limit = Duration::from_secs(3);
    let stream = match TcpStream::connect_timeout(&addr, limit) {
        Ok(s) => s,
        Err(e) => {
            println!("CONNECT FAIL: {e}");
            std::process::exit(0);
        }
    };
    println!("CONNECTED");
    let _ = std::io::stdout().flush();
    stream.set_read_timeout(Some(limit)).expect("read timeout");
    stream
        .set_write_timeout(Some(limit))
        .expect("write timeout");
    let mut out = stream.try_clone().expect("clone");
    let mut replies = BufReader::new(stream);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let res = writeln!(out, "{line}").and_then(|_| {
            let mut reply = String::new();
            match replies.read_line(&mut reply)? {
                0 => Err(std::io::Error::other("connection closed")),
                _ => Ok(reply),
            }
        });
        match res {
            Ok(reply) => println!("ECHO {}", reply.trim_end()),
            Err(e) => println!("FAIL: {e}"),
        }
        let _ = std::io::stdout().flush();
    }
    std::process::exit(0)
}

/// A child in `host` of the cluster, its stdout lines delivered through a channel.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    fn start(cluster: &Cluster, host: usize, role: &str, addr: &str) -> Peer {
        let exe = std::env::current_exe().expect("test executable");
        let mut child = cluster
            .command(host, exe)
            .args(["netns_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(ADDR, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a child in the namespace");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Peer {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next line that contains one of `marks` (the harness may print its own lines, or
    /// put "test netns_child ... " before ours).
    fn expect(&self, marks: &[&str]) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(STEP)
                .unwrap_or_else(|e| panic!("no line with {marks:?} from the child: {e}"));
            if marks.iter().any(|m| line.contains(m)) {
                return line;
            }
        }
    }

    fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{text}").expect("write to the child");
        stdin.flush().expect("flush");
    }

    /// Closes stdin (a client ends) and waits, killing the child past `STEP`.
    fn finish(mut self) -> Option<i32> {
        drop(self.stdin.take());
        wait_bounded(&mut self.child, STEP)
    }
}

fn wait_bounded(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.code(),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn cluster_or_skip(hosts: usize, rate: Option<f64>) -> Option<Cluster> {
    match Cluster::up(hosts, rate) {
        Ok(c) => Some(c),
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}

#[test]
fn echo_across_namespaces_stops_when_the_link_goes_down() {
    let Some(cluster) = cluster_or_skip(2, None) else {
        return;
    };
    assert_eq!(cluster.hosts(), 2);
    assert_eq!(cluster.addr(0), "198.18.0.1");
    assert_eq!(cluster.addr(1), "198.18.0.2");
    let names = cluster.namespaces();
    let listed = netns::list_namespaces();
    for name in &names {
        assert!(listed.contains(name), "{name} not in `ip netns list`");
    }
    let target = format!("{}:{PORT}", cluster.addr(0));

    let mut server = Peer::start(&cluster, 0, "server", &format!("0.0.0.0:{PORT}"));
    server.expect(&["LISTENING", "ERROR"]);
    let mut client = Peer::start(&cluster, 1, "client", &target);
    let first = client.expect(&["CONNECTED", "CONNECT FAIL"]);
    assert!(first.contains("CONNECTED"), "{first}");
    client.send("hello");
    let reply = client.expect(&["ECHO", "FAIL"]);
    assert!(reply.contains("ECHO hello"), "{reply}");

    // The host's loopback is its own: host 1 does not reach the server at 127.0.0.1.
    let local = Peer::start(&cluster, 1, "client", &format!("127.0.0.1:{PORT}"));
    let line = local.expect(&["CONNECTED", "CONNECT FAIL"]);
    assert!(line.contains("CONNECT FAIL"), "{line}");
    local.finish();

    cluster.link_down(1);
    client.send("lost");
    let reply = client.expect(&["ECHO", "FAIL"]);
    assert!(
        reply.contains("FAIL"),
        "traffic passed a downed link: {reply}"
    );
    let fresh = Peer::start(&cluster, 1, "client", &target);
    let line = fresh.expect(&["CONNECTED", "CONNECT FAIL"]);
    assert!(
        line.contains("CONNECT FAIL"),
        "connected over a downed link: {line}"
    );
    fresh.finish();
    client.finish();

    cluster.link_up(1);
    // `link_up` waits for the kernel to report the link ready; a loaded machine may still
    // drop the first address resolution, so a refused attempt is retried for a while.
    let deadline = std::time::Instant::now() + STEP;
    let mut again = loop {
        let peer = Peer::start(&cluster, 1, "client", &target);
        let line = peer.expect(&["CONNECTED", "CONNECT FAIL"]);
        if line.contains("CONNECTED") {
            break peer;
        }
        peer.finish();
        assert!(
            std::time::Instant::now() < deadline,
            "no connection within {STEP:?} of link_up: {line}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    again.send("back");
    let reply = again.expect(&["ECHO", "FAIL"]);
    assert!(reply.contains("ECHO back"), "{reply}");
    again.finish();

    // The server is still running inside host 0: dropping the cluster must end it too.
    drop(cluster);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait for the server") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(5) {
            let _ = server.child.kill();
            let _ = server.child.wait();
            panic!("the server in a dropped cluster still runs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        None,
        "the server should end by a signal: {status}"
    );
    let listed = netns::list_namespaces();
    for name in &names {
        assert!(!listed.contains(name), "{name} left behind after drop");
    }
    drop(server.stdin.take());
}

#[test]
fn clusters_made_in_parallel_have_distinct_names_and_are_removed() {
    let made: Vec<Option<Cluster>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| cluster_or_skip(2, Some(1.0))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    if made.iter().any(Option::is_none) {
        return;
    }
    let clusters: Vec<Cluster> = made.into_iter().flatten().collect();
    let names: Vec<String> = clusters.iter().flat_map(Cluster::namespaces).collect();
    let distinct: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    let listed = netns::list_namespaces();
    for name in &names {
        assert!(listed.contains(name), "{name} not in `ip netns list`");
        // Interface names live inside the namespaces; the namespace names themselves may be
        // longer than 15 bytes but stay short anyway.
        assert!(name.len() <= 31, "{name}");
    }
    drop(clusters);
    let listed = netns::list_namespaces();
    for name in &names {
        assert!(!listed.contains(name), "{name} left behind after drop");
    }
}
