//! Built-in fallback plans: hand-written schedules the executor uses when no plan file is
//! given (and that its tests replay). They are deliberately simple and topology-agnostic:
//!
//! - AllReduce: *all-pairs* below [`SMALL_BYTES`] (every rank sends its buffer to every
//!   other and reduces in rank order: one message latency), a ring above it
//!   (reduce-scatter then all-gather around `0 → 1 → … → n-1 → 0`);
//! - AllGather and ReduceScatter: rings;
//! - Broadcast and Reduce: chains from/to the root;
//! - AllToAll: pairwise exchange (every rank sends one message to every other, then receives).
//!
//! Every generator takes the number of ranks, the channels (each channel is one stream per
//! rank over its own connections and owns a disjoint set of chunks) and `parts`, the chunks
//! per rank and channel, which the stream processes one after another (pipelining).

use hccl_ir::{
    Collective, Loc, Op, PlanEntry, PlanFile, PlanMeta, Protocol, RankProgram, Schedule, Step,
    Stream,
};

/// AllReduce messages below this many bytes use the all-pairs schedule.
pub const SMALL_BYTES: u64 = 16 * 1024;

fn stream(channel: u32, steps: Vec<Step>) -> Stream {
    Stream { channel, steps }
}

fn finish(mut sched: Schedule, programs: Vec<Vec<Stream>>, scratch: u32) -> Schedule {
    for (r, streams) in programs.into_iter().enumerate() {
        sched.ranks[r] = RankProgram {
            scratch_chunks: scratch,
            streams: streams
                .into_iter()
                .filter(|s| !s.steps.is_empty())
                .collect(),
        };
    }
    sched
}

fn empty(coll: Collective, n: u32, chunks: u32, in_place: bool) -> Schedule {
    // Callers pass chunk counts that fit the collective.
    Schedule::empty(coll, n, chunks, in_place).unwrap_or(Schedule {
        collective: coll,
        nranks: n,
        chunks,
        input_chunks: chunks,
        output_chunks: chunks,
        in_place,
        ranks: Vec::new(),
    })
}

/// Ring AllReduce: `C = n · channels · parts`.
pub fn ring_allreduce(n: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::AllReduce, n, n * m, in_place);
    let chunk = |x: u32, q: u32| q * n + x;
    let programs = (0..n)
        .map(|r| {
            (0..channels)
                .map(|c| {
                    let mut steps = Vec::new();
                    for p in 0..parts {
                        let q = c * parts + p;
                        if n == 1 {
                            if !in_place {
                                steps.push(Step::new(
                                    Op::Copy {
                                        src: Loc::input(chunk(0, q)),
                                        dst: Loc::output(chunk(0, q)),
                                    },
                                    1,
                                ));
                            }
                            continue;
                        }
                        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                        let x = |t: u32| (r + n * 2 - t % n) % n;
                        steps.push(Step::new(
                            Op::Send {
                                to: next,
                                src: Loc::input(chunk(r, q)),
                            },
                            1,
                        ));
                        for t in 1..n {
                            let k = chunk(x(t), q);
                            steps.push(Step::new(
                                Op::RecvReduceCopySend {
                                    from: prev,
                                    to: next,
                                    src: Loc::input(k),
                                    dst: Loc::output(k),
                                },
                                1,
                            ));
                        }
                        for t in n..2 * n - 1 {
                            let k = Loc::output(chunk(x(t), q));
                            let op = if t < 2 * n - 2 {
                                Op::RecvCopySend {
                                    from: prev,
                                    to: next,
                                    dst: k,
                                }
                            } else {
                                Op::Recv { from: prev, dst: k }
                            };
                            steps.push(Step::new(op, 1));
                        }
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// All-pairs AllReduce (one chunk; accumulates in scratch in rank order): `C = 1`.
pub fn allpairs_allreduce(n: u32, in_place: bool) -> Schedule {
    let sched = empty(Collective::AllReduce, n, 1, in_place);
    let programs = (0..n)
        .map(|r| {
            let mut steps = Vec::new();
            for p in (0..n).filter(|&p| p != r) {
                steps.push(Step::new(
                    Op::Send {
                        to: p,
                        src: Loc::input(0),
                    },
                    1,
                ));
            }
            let acc = Loc::scratch(0);
            for p in 0..n {
                let op = match (p == r, p == 0) {
                    (true, true) => Op::Copy {
                        src: Loc::input(0),
                        dst: acc,
                    },
                    (true, false) => Op::Reduce {
                        src: Loc::input(0),
                        dst: acc,
                    },
                    (false, true) => Op::Recv { from: p, dst: acc },
                    (false, false) => Op::RecvReduceCopy {
                        from: p,
                        src: acc,
                        dst: acc,
                    },
                };
                steps.push(Step::new(op, 1));
            }
            steps.push(Step::new(
                Op::Copy {
                    src: acc,
                    dst: Loc::output(0),
                },
                1,
            ));
            vec![stream(0, steps)]
        })
        .collect();
    finish(sched, programs, 1)
}

/// Ring AllGather: `C = n · channels · parts`; rank `b`'s block is chunks `b·m..(b+1)·m`.
pub fn ring_allgather(n: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::AllGather, n, n * m, in_place);
    let programs = (0..n)
        .map(|r| {
            (0..channels)
                .map(|c| {
                    let mut steps = Vec::new();
                    for p in 0..parts {
                        let q = c * parts + p;
                        if !in_place {
                            steps.push(Step::new(
                                Op::Copy {
                                    src: Loc::input(q),
                                    dst: Loc::output(r * m + q),
                                },
                                1,
                            ));
                        }
                        if n == 1 {
                            continue;
                        }
                        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                        steps.push(Step::new(
                            Op::Send {
                                to: next,
                                src: Loc::input(q),
                            },
                            1,
                        ));
                        for t in 1..n {
                            let dst = Loc::output(((r + n - t) % n) * m + q);
                            let op = if t < n - 1 {
                                Op::RecvCopySend {
                                    from: prev,
                                    to: next,
                                    dst,
                                }
                            } else {
                                Op::Recv { from: prev, dst }
                            };
                            steps.push(Step::new(op, 1));
                        }
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// Ring ReduceScatter: `C = n · channels · parts`; rank `r` ends with block `r`.
pub fn ring_reducescatter(n: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::ReduceScatter, n, n * m, in_place);
    let programs = (0..n)
        .map(|r| {
            (0..channels)
                .map(|c| {
                    let mut steps = Vec::new();
                    for p in 0..parts {
                        let q = c * parts + p;
                        if n == 1 {
                            if !in_place {
                                steps.push(Step::new(
                                    Op::Copy {
                                        src: Loc::input(q),
                                        dst: Loc::output(q),
                                    },
                                    1,
                                ));
                            }
                            continue;
                        }
                        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                        let block = |t: u32| ((r + 2 * n - 1 - t) % n) * m + q;
                        steps.push(Step::new(
                            Op::Send {
                                to: next,
                                src: Loc::input(block(0)),
                            },
                            1,
                        ));
                        for t in 1..n - 1 {
                            steps.push(Step::new(
                                Op::RecvReduceSend {
                                    from: prev,
                                    to: next,
                                    src: Loc::input(block(t)),
                                },
                                1,
                            ));
                        }
                        steps.push(Step::new(
                            Op::RecvReduceCopy {
                                from: prev,
                                src: Loc::input(r * m + q),
                                dst: Loc::output(q),
                            },
                            1,
                        ));
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// Chain Broadcast from `root` along `root, root+1, …`: `C = channels · parts`.
pub fn chain_broadcast(n: u32, root: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::Broadcast { root }, n, m, in_place);
    let programs = (0..n)
        .map(|r| {
            let pos = (r + n - root) % n;
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            (0..channels)
                .map(|c| {
                    let mut steps = Vec::new();
                    for p in 0..parts {
                        let k = c * parts + p;
                        if pos == 0 {
                            if n > 1 {
                                steps.push(Step::new(
                                    Op::Send {
                                        to: next,
                                        src: Loc::input(k),
                                    },
                                    1,
                                ));
                            }
                            if !in_place {
                                steps.push(Step::new(
                                    Op::Copy {
                                        src: Loc::input(k),
                                        dst: Loc::output(k),
                                    },
                                    1,
                                ));
                            }
                        } else if pos + 1 < n {
                            steps.push(Step::new(
                                Op::RecvCopySend {
                                    from: prev,
                                    to: next,
                                    dst: Loc::output(k),
                                },
                                1,
                            ));
                        } else {
                            steps.push(Step::new(
                                Op::Recv {
                                    from: prev,
                                    dst: Loc::output(k),
                                },
                                1,
                            ));
                        }
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// Chain Reduce into `root` along `root+1, root+2, …, root`: `C = channels · parts`.
pub fn chain_reduce(n: u32, root: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::Reduce { root }, n, m, in_place);
    let programs = (0..n)
        .map(|r| {
            let pos = (r + 2 * n - root - 1) % n;
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            (0..channels)
                .map(|c| {
                    let mut steps = Vec::new();
                    for p in 0..parts {
                        let k = c * parts + p;
                        let op = if n == 1 {
                            if in_place {
                                continue;
                            }
                            Op::Copy {
                                src: Loc::input(k),
                                dst: Loc::output(k),
                            }
                        } else if pos == 0 {
                            Op::Send {
                                to: next,
                                src: Loc::input(k),
                            }
                        } else if pos + 1 < n {
                            Op::RecvReduceSend {
                                from: prev,
                                to: next,
                                src: Loc::input(k),
                            }
                        } else {
                            Op::RecvReduceCopy {
                                from: prev,
                                src: Loc::input(k),
                                dst: Loc::output(k),
                            }
                        };
                        steps.push(Step::new(op, 1));
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// Pairwise AllToAll: `C = n · channels · parts`; every rank first sends block `b` (its
/// channel's `parts` chunks in one message) to rank `b`, then receives, so it also works in
/// place.
pub fn pairwise_alltoall(n: u32, channels: u32, parts: u32, in_place: bool) -> Schedule {
    let m = channels * parts;
    let sched = empty(Collective::AllToAll, n, n * m, in_place);
    let programs = (0..n)
        .map(|r| {
            (0..channels)
                .map(|c| {
                    let base = |b: u32| b * m + c * parts;
                    let mut steps = Vec::new();
                    for d in 1..n {
                        steps.push(Step::new(
                            Op::Send {
                                to: (r + d) % n,
                                src: Loc::input(base((r + d) % n)),
                            },
                            parts,
                        ));
                    }
                    if !in_place {
                        steps.push(Step::new(
                            Op::Copy {
                                src: Loc::input(base(r)),
                                dst: Loc::output(base(r)),
                            },
                            parts,
                        ));
                    }
                    for d in 1..n {
                        let from = (r + n - d) % n;
                        steps.push(Step::new(
                            Op::Recv {
                                from,
                                dst: Loc::output(base(from)),
                            },
                            parts,
                        ));
                    }
                    stream(c, steps)
                })
                .collect()
        })
        .collect();
    finish(sched, programs, 0)
}

/// One schedule per collective kind with the given shape (Broadcast and Reduce for `root`).
pub fn schedule(
    collective: Collective,
    n: u32,
    channels: u32,
    parts: u32,
    in_place: bool,
) -> Schedule {
    match collective {
        Collective::AllReduce => ring_allreduce(n, channels, parts, in_place),
        Collective::AllGather => ring_allgather(n, channels, parts, in_place),
        Collective::ReduceScatter => ring_reducescatter(n, channels, parts, in_place),
        Collective::Broadcast { root } => chain_broadcast(n, root, channels, parts, in_place),
        Collective::Reduce { root } => chain_reduce(n, root, channels, parts, in_place),
        Collective::AllToAll => pairwise_alltoall(n, channels, parts, in_place),
    }
}

fn entry(min: u64, max: Option<u64>, algorithm: &str, schedule: Schedule) -> PlanEntry {
    PlanEntry {
        min_bytes: min,
        max_bytes: max,
        algorithm: algorithm.to_string(),
        protocol: Protocol::Simple,
        cost: None,
        symmetry: None,
        synthesis: None,
        schedule,
        template: None,
    }
}

/// A plan with shape (`channels`, `parts`) for every collective, both placements and every
/// root.
pub fn plan_with(n: u32, channels: u32, parts: u32) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: format!("builtin-{n}"),
        topology_hash: String::new(),
        compiler: format!("hccl-executor {} fallback", env!("CARGO_PKG_VERSION")),
    });
    for in_place in [false, true] {
        plan.entries.push(entry(
            0,
            Some(SMALL_BYTES),
            "allpairs",
            allpairs_allreduce(n, in_place),
        ));
        plan.entries.push(entry(
            SMALL_BYTES,
            None,
            "ring",
            ring_allreduce(n, channels, parts, in_place),
        ));
        let mut colls = vec![
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
        ];
        for root in 0..n {
            colls.push(Collective::Broadcast { root });
            colls.push(Collective::Reduce { root });
        }
        for coll in colls {
            let algo = match coll {
                Collective::Broadcast { .. } | Collective::Reduce { .. } => "chain",
                Collective::AllToAll => "pairwise",
                _ => "ring",
            };
            plan.entries.push(entry(
                0,
                None,
                algo,
                schedule(coll, n, channels, parts, in_place),
            ));
        }
    }
    plan
}

/// A plan with one entry: the out-of-place pairwise AllToAll of shape (`channels`, `parts`),
/// for every size. What the CUDA backend replays an AllToAllv on when the job's plan has no
/// AllToAll that moves blocks straight to their ranks.
pub fn alltoall_plan(n: u32, channels: u32, parts: u32) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: format!("builtin-{n}"),
        topology_hash: String::new(),
        compiler: format!("hccl-executor {} fallback", env!("CARGO_PKG_VERSION")),
    });
    plan.entries.push(entry(
        0,
        None,
        "pairwise",
        pairwise_alltoall(n, channels, parts, false),
    ));
    plan
}

/// The default fallback plan for `n` ranks (two channels, one chunk per rank and channel).
pub fn plan(n: u32) -> PlanFile {
    plan_with(n, 2, 1)
}
