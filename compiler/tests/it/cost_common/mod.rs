//! Helpers shared by the cost tests: small hand-built topologies and schedules.

#![allow(dead_code)]

use hccl_ir::{Collective, Loc, Op, Schedule, Step, Stream};
use hccl_topologies::{
    DeviceKind, DeviceSpec, HostSpec, LinkKind, LinkSpec, SwitchKind, SwitchSpec, Topology,
    TopologySpec,
};

/// A link `(a, b, bw GB/s, latency µs)`.
pub type L<'a> = (&'a str, &'a str, f64, f64);

/// One host with `n` GPUs `g0..`, the given switches and NVLink links.
pub fn topo(n: u32, switches: &[&str], links: &[L]) -> Topology {
    let spec = TopologySpec {
        name: "test".into(),
        description: String::new(),
        hosts: vec![HostSpec {
            id: "h".into(),
            devices: (0..n)
                .map(|i| DeviceSpec {
                    id: format!("g{i}"),
                    kind: DeviceKind::Gpu,
                    vendor: String::new(),
                    model: String::new(),
                    rank: None,
                    mem_bw: Some(100.0),
                })
                .collect(),
            nics: Vec::new(),
        }],
        switches: switches
            .iter()
            .map(|s| SwitchSpec {
                id: (*s).into(),
                kind: SwitchKind::NvSwitch,
                host: Some("h".into()),
                port_bw: None,
            })
            .collect(),
        links: links
            .iter()
            .map(|&(a, b, bw, latency)| LinkSpec {
                a: a.into(),
                b: b.into(),
                kind: LinkKind::NvLink,
                bw,
                latency,
                count: 1,
            })
            .collect(),
        calibration: None,
    };
    hccl_topologies::build(spec, "test").expect("test topology builds")
}

/// A uniform bidirectional ring of `n` GPUs.
pub fn ring_topo(n: u32, bw: f64, latency: f64) -> Topology {
    let names: Vec<String> = (0..n).map(|i| format!("g{i}")).collect();
    let links: Vec<L> = (0..n as usize)
        .map(|i| {
            (
                names[i].as_str(),
                names[(i + 1) % n as usize].as_str(),
                bw,
                latency,
            )
        })
        .collect();
    topo(n, &[], &links)
}

/// A schedule skeleton (AllReduce, `chunks` chunks) for `n` ranks.
pub fn skeleton(n: u32, chunks: u32) -> Schedule {
    Schedule::empty(Collective::AllReduce, n, chunks, false).expect("allreduce fits any chunks")
}

/// Adds a stream on `channel` to `rank`.
pub fn stream(s: &mut Schedule, rank: u32, channel: u32, steps: Vec<Step>) {
    s.ranks[rank as usize]
        .streams
        .push(Stream { channel, steps });
}

pub fn send(to: u32, off: u32, count: u32) -> Step {
    Step::new(
        Op::Send {
            to,
            src: Loc::input(off),
        },
        count,
    )
}

pub fn recv(from: u32, off: u32, count: u32) -> Step {
    Step::new(
        Op::Recv {
            from,
            dst: Loc::output(off),
        },
        count,
    )
}

/// A ring AllReduce (reduce-scatter + all-gather) on `n` ranks, `chunks = n × pipeline`,
/// one stream per rank; the classic NCCL schedule, written by hand for the tests.
pub fn ring_allreduce(n: u32, pipeline: u32) -> Schedule {
    let chunks = n * pipeline;
    let mut s = skeleton(n, chunks);
    for r in 0..n {
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let mut steps = Vec::new();
        for p in 0..pipeline {
            // Reduce-scatter: send own block, then n-2 recv-reduce-send, then rrc.
            let blk = |k: u32| (k % n) * pipeline + p;
            steps.push(Step::new(
                Op::Send {
                    to: next,
                    src: Loc::input(blk(r + n)),
                },
                1,
            ));
            for k in 1..n - 1 {
                let b = blk(r + n - k);
                steps.push(Step::new(
                    Op::RecvReduceSend {
                        from: prev,
                        to: next,
                        src: Loc::input(b),
                    },
                    1,
                ));
            }
            let b = blk(r + 1);
            steps.push(Step::new(
                Op::RecvReduceCopySend {
                    from: prev,
                    to: next,
                    src: Loc::input(b),
                    dst: Loc::output(b),
                },
                1,
            ));
            for k in 0..n - 2 {
                let b = blk(r + n - k);
                steps.push(Step::new(
                    Op::RecvCopySend {
                        from: prev,
                        to: next,
                        dst: Loc::output(b),
                    },
                    1,
                ));
            }
            let b = blk(r + 2);
            steps.push(Step::new(
                Op::Recv {
                    from: prev,
                    dst: Loc::output(b),
                },
                1,
            ));
        }
        stream(&mut s, r, 0, steps);
    }
    s
}

/// Runs `f` on every item, spread over the machine's cores (for tests made of many
/// independent cases: the harness runs test binaries one after another, so one long serial
/// test otherwise leaves all cores but one idle). A panic in any case fails the caller
/// once every worker has stopped, after the default hook printed it.
pub fn par_each<T: Sync>(items: &[T], f: impl Fn(&T) + Sync) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    f(item);
                }
            });
        }
    });
}
