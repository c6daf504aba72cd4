//! Synthesized schedules run: plans of the synthesizers (`packed_trees`, `packed_allreduce`,
//! `flow_alltoall`, `milp`) and of the deep rail pipelines (`rail_chains`, `rail_trees`) for
//! small shipped and generated machines, at the parameter sets
//! the search tries (many channels, pieces of unequal width, deep pipelines, forwarding
//! through scratch), replayed on the threads backend and the process backend and checked
//! element by element against a sequential reference: several data types and operators, in
//! and out of place, element counts smaller than the chunk count and not divisible by it.

use crate::common;
use crate::plan_builders::{candidates, params_of, plan_of, ring4, shipped};

use common::{Case, check, config, count_for};
use hccl_compiler::families::{Candidate, FamilyParams};
use hccl_compiler::synth::SynthLevel;
use hccl_executor::{
    Bootstrap, Communicator, Config, DataType, ProcessGroup, ReduceOp, ThreadGroup,
};
use hccl_ir::{Collective, PlanFile, Protocol};
use hccl_topologies::Topology;
use std::time::Instant;

fn shape(c: &Candidate) -> String {
    let s = &c.schedule;
    let streams = s.ranks.iter().map(|r| r.streams.len()).max().unwrap_or(0);
    let steps: usize = s
        .ranks
        .iter()
        .flat_map(|r| r.streams.iter().map(|st| st.steps.len()))
        .sum();
    let scratch = s.ranks.iter().map(|r| r.scratch_chunks).max().unwrap_or(0);
    let all = || {
        s.ranks
            .iter()
            .flat_map(|r| r.streams.iter().flat_map(|st| &st.steps))
    };
    let msg = all()
        .filter(|st| st.op.recv_peer().is_some() || st.op.send_peer().is_some())
        .map(|st| st.count)
        .max()
        .unwrap_or(0);
    let local = all()
        .filter(|st| st.op.recv_peer().is_none() && st.op.send_peer().is_none())
        .map(|st| st.count)
        .max()
        .unwrap_or(0);
    format!(
        "{} {:?} in_place={} chunks={} streams/rank={} steps={} scratch={} max message {} max local {}",
        c.algorithm, c.params, s.in_place, s.chunks, streams, steps, scratch, msg, local
    )
}

/// Data types × operators: every operator for reductions, a few element sizes otherwise.
fn combos(collective: Collective) -> Vec<(DataType, ReduceOp)> {
    if collective.kind().reduces() {
        vec![
            (DataType::F32, ReduceOp::Sum),
            (DataType::BF16, ReduceOp::Max),
            (DataType::I32, ReduceOp::Prod),
            (DataType::U8, ReduceOp::Min),
            (DataType::F64, ReduceOp::Avg),
        ]
    } else {
        vec![
            (DataType::F32, ReduceOp::Sum),
            (DataType::U8, ReduceOp::Sum),
            (DataType::F16, ReduceOp::Sum),
            (DataType::I64, ReduceOp::Sum),
        ]
    }
}

/// Calls for `collective` on `n` ranks whose schedule has `chunks` chunks: element counts
/// (per block for rank-blocked collectives) of 1, fewer than the chunks, not a multiple of
/// them and more than them; every data type × operator, in and out of place.
fn cases(collective: Collective, n: u32, chunks: u32, seed: u64) -> Vec<Case> {
    let per = match collective.kind() {
        hccl_ir::CollectiveKind::AllGather
        | hccl_ir::CollectiveKind::ReduceScatter
        | hccl_ir::CollectiveKind::AllToAll => (chunks / n).max(1) as usize,
        _ => chunks as usize,
    };
    // And one count of many elements per chunk (segments) where the chunks are few.
    let many = if 2 * per + 5 < 5003 { 5003 } else { 2 };
    let bases = [
        1,
        3,
        per.saturating_sub(1).max(2),
        per + 1,
        2 * per + 5,
        many,
    ];
    let mut out = Vec::new();
    let mut seed = seed;
    for (i, (dtype, op)) in combos(collective).into_iter().enumerate() {
        for in_place in [false, true] {
            for (j, &base) in bases.iter().enumerate() {
                // Every count once per placement, spread over the data types.
                if (i + j) % 2 == 1 && j != 0 {
                    continue;
                }
                seed += 1;
                out.push(Case {
                    collective,
                    dtype,
                    op,
                    in_place,
                    count: count_for(collective, n, base),
                    seed,
                });
            }
        }
    }
    out
}

/// Runs `cases` on a thread group of `plan`; returns the mismatches.
fn run_threads(plan: &PlanFile, n: u32, cases: &[Case], cfg: Config) -> Vec<String> {
    let t = Instant::now();
    let comms = match ThreadGroup::with_config(plan.clone(), n, cfg) {
        Ok(c) => c,
        Err(e) => return vec![format!("thread group: {e}")],
    };
    eprintln!(
        "    thread group set up in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    run_on(comms.into_iter().map(Ok).collect(), cases)
}

/// Runs `cases` on the process backend (rendezvous over TCP, one `/dev/shm` arena), its
/// ranks threads of this process; returns the mismatches.
fn run_process(plan: &PlanFile, n: u32, cases: &[Case]) -> Vec<String> {
    let boot = Bootstrap {
        addr: format!("127.0.0.1:{}", common::free_port()),
        token: "synthesized".into(),
        host: None,
    };
    let comms: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (boot, plan) = (boot.clone(), plan.clone());
                s.spawn(move || ProcessGroup::init_with(plan, r, n, &boot, config()))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    run_on(comms, cases)
}

fn run_on(comms: Vec<hccl_executor::Result<Communicator>>, cases: &[Case]) -> Vec<String> {
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for comm in comms {
            let errors = &errors;
            s.spawn(move || {
                let mut comm = match comm {
                    Ok(c) => c,
                    Err(e) => {
                        errors.lock().unwrap().push(format!("init: {e}"));
                        return;
                    }
                };
                for case in cases {
                    if let Err(e) = check(&mut comm, case) {
                        errors.lock().unwrap().push(e);
                        comm.abort();
                        return;
                    }
                }
            });
        }
    });
    errors.into_inner().unwrap()
}

/// Runs `threads` on the threads backend and `process` on the process backend, panicking
/// with the mismatches.
fn run_checked(label: &str, plan: &PlanFile, n: u32, threads: &[Case], process: &[Case]) {
    run_checked_with(label, plan, n, threads, process, config());
}

/// [`run_checked`] with `cfg` on the threads backend.
fn run_checked_with(
    label: &str,
    plan: &PlanFile,
    n: u32,
    threads: &[Case],
    process: &[Case],
    cfg: Config,
) {
    let t = Instant::now();
    let errors = run_threads(plan, n, threads, cfg);
    assert!(
        errors.is_empty(),
        "{label} (threads): {} failures: {:#?}",
        errors.len(),
        &errors[..errors.len().min(4)]
    );
    let threads_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    if !process.is_empty() {
        let errors = run_process(plan, n, process);
        assert!(
            errors.is_empty(),
            "{label} (process): {} failures: {:#?}",
            errors.len(),
            &errors[..errors.len().min(4)]
        );
    }
    eprintln!(
        "{label}: threads {} calls {threads_s:.2} s, process {} calls {:.2} s",
        threads.len(),
        process.len(),
        t.elapsed().as_secs_f64()
    );
}

/// How much of a parameter set to run: at most `calls` of its calls on the threads backend,
/// `process` of them (0: none) on the process backend.
#[derive(Clone, Copy)]
struct Budget {
    calls: usize,
    process: usize,
}

/// At most `max` of `cases`, spread over them (every data type, placement and count class
/// still appears when `max` allows).
fn thin(cases: &[Case], max: usize) -> Vec<Case> {
    if cases.len() <= max {
        return cases.to_vec();
    }
    let step = cases.len() as f64 / max as f64;
    (0..max)
        // From the end: a single call is the largest count of the last data type, in place.
        .map(|i| cases[cases.len() - 1 - (i as f64 * step) as usize])
        .collect()
}

/// The parameter sets of `family` for `collective` on `topo` that `budget` gives a budget
/// (by index and count of sets): each set's schedules (the first out of place and the first
/// in place) in one plan, run on the threads and the process backend. Returns the plans
/// and their chunk counts.
fn check_family(
    family: &str,
    topo: &Topology,
    collective: Collective,
    budget: &dyn Fn(usize, usize, FamilyParams) -> Option<Budget>,
) -> Vec<(String, PlanFile, u32)> {
    let n = topo.nranks();
    let params = params_of(family, topo, collective);
    assert!(
        !params.is_empty(),
        "{family} offers nothing for {collective} on {}",
        topo.name
    );
    let mut plans = Vec::new();
    for (i, &p) in params.iter().enumerate() {
        let Some(b) = budget(i, params.len(), p) else {
            continue;
        };
        let t = Instant::now();
        let cands = candidates(family, topo, collective, p);
        let gen_s = t.elapsed().as_secs_f64();
        assert!(
            !cands.is_empty(),
            "{family} {collective} {p:?} on {}: no schedule",
            topo.name
        );
        for c in &cands {
            eprintln!("  {} {collective}: {} ({gen_s:.2} s)", topo.name, shape(c));
        }
        let first_out = cands.iter().find(|c| !c.schedule.in_place);
        let first_in = cands.iter().find(|c| c.schedule.in_place);
        let chosen: Vec<&Candidate> = first_out.into_iter().chain(first_in).collect();
        let chunks = chosen.iter().map(|c| c.schedule.chunks).max().unwrap_or(1);
        // Alternate the protocols over the parameter sets: LL rings and regular ones.
        let proto = if i % 2 == 0 {
            Protocol::Simple
        } else {
            Protocol::LL
        };
        let plan = plan_of(topo, &chosen, proto);
        let label = format!("{} {family} {collective} {p:?} {proto:?}", topo.name);
        let all = cases(collective, n, chunks, 1000 * i as u64);
        let on_threads = thin(&all, b.calls);
        let on_process = thin(&all, b.process);
        run_checked(&label, &plan, n, &on_threads, &on_process);
        plans.push((label, plan, chunks));
    }
    plans
}

fn first(i: usize, _: usize) -> bool {
    i == 0
}

fn last(i: usize, len: usize) -> bool {
    i + 1 == len
}

#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn packed_trees_dgx1_broadcast_reduce() {
    let topo = shipped("dgx1-v100");
    // 8 trees of 2 pieces (2048 chunks); 16 channels × 256 pieces (262144 chunks).
    check_family(
        "packed_trees",
        &topo,
        Collective::Broadcast { root: 3 },
        &|i, len, _| {
            if first(i, len) {
                Some(Budget {
                    calls: 24,
                    process: 8,
                })
            } else if last(i, len) {
                Some(Budget {
                    calls: 3,
                    process: 1,
                })
            } else {
                None
            }
        },
    );
    // 8 trees × 8 and × 128 pieces (65536 chunks). (Its 16-channel sets prune the packing
    // to 16 trees, 10 s of LP here; dgx-h100 below runs 16 channels with scratch.)
    check_family(
        "packed_trees",
        &topo,
        Collective::Reduce { root: 5 },
        &|_, _, p| match (p.channels, p.pipeline) {
            (8, 8) => Some(Budget {
                calls: 30,
                process: 8,
            }),
            (8, 128) => Some(Budget {
                calls: 6,
                process: 3,
            }),
            _ => None,
        },
    );
}

#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn packed_trees_dgx1_allgather_reducescatter() {
    let topo = shipped("dgx1-v100");
    for coll in [Collective::AllGather, Collective::ReduceScatter] {
        // 4 trees per root (32 channels) × 8 and × 128 pieces (524288 chunks).
        check_family("packed_trees", &topo, coll, &|i, len, _| {
            if first(i, len) {
                Some(Budget {
                    calls: 24,
                    process: 8,
                })
            } else if last(i, len) {
                Some(Budget {
                    calls: 2,
                    process: 1,
                })
            } else {
                None
            }
        });
    }
}

#[test]
fn packed_trees_ring4() {
    // Both directions of the ring; every parameter set of every collective.
    let topo = ring4();
    for coll in [
        Collective::Broadcast { root: 2 },
        Collective::Reduce { root: 1 },
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        check_family("packed_trees", &topo, coll, &|i, len, _| {
            Some(if first(i, len) {
                Budget {
                    calls: 30,
                    process: 10,
                }
            } else {
                Budget {
                    calls: 6,
                    process: if last(i, len) { 3 } else { 0 },
                }
            })
        });
    }
}

/// The link-disjoint trees (`synth::disjoint`) of a 3×3 torus: one root's for Broadcast and
/// Reduce, every rank's (carried over the torus's automorphisms) for AllGather and
/// ReduceScatter; they reach the LP's optimum there, so they are what `packed_trees` lowers.
#[test]
fn packed_trees_torus_disjoint() {
    let topo = hccl_topologies::build(
        hccl_topologies::generate::torus(&[3, 3], 50.0, 1.0),
        "torus3x3",
    )
    .expect("a 3x3 torus builds");
    for coll in [
        Collective::Broadcast { root: 4 },
        Collective::Reduce { root: 7 },
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        let params = params_of("packed_trees", &topo, coll);
        for c in candidates("packed_trees", &topo, coll, params[0]) {
            let method = c.synthesis.as_ref().map(|s| s.method.as_str());
            assert_eq!(
                method,
                Some("disjoint-arborescences"),
                "{coll}: {}",
                shape(&c)
            );
        }
        check_family("packed_trees", &topo, coll, &|i, len, _| {
            (first(i, len) || last(i, len)).then_some(Budget {
                calls: 8,
                process: if first(i, len) { 3 } else { 0 },
            })
        });
    }
}

#[test]
#[ignore = "slow: `.ci/run` runs it; run it with `cargo test -- --ignored`"]
fn packed_trees_dgx_h100() {
    // All NVSwitch planes: the shallowest and the most channels × deepest pipelines.
    let topo = shipped("dgx-h100");
    for coll in [
        Collective::Broadcast { root: 7 },
        Collective::Reduce { root: 0 },
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        check_family("packed_trees", &topo, coll, &|i, len, _| {
            if first(i, len) {
                Some(Budget {
                    calls: 12,
                    process: 4,
                })
            } else if last(i, len) {
                Some(Budget {
                    calls: 3,
                    process: 2,
                })
            } else {
                None
            }
        });
    }
}

/// A 4-ring of 25 GB/s links with one 25 GB/s chord (0–2): ranks 0 and 2 take 75 GB/s in,
/// ranks 1 and 3 only 50, so AllReduce runs on trees carrying blocks as large as their rates
/// both ways (`synth::allreduce`) rather than equal blocks.
const CHORDED_RING4: &str = r#"(
  name: "chorded-ring-4",
  hosts: [(id: "h", devices: [
    (id: "g0", kind: Gpu), (id: "g1", kind: Gpu), (id: "g2", kind: Gpu), (id: "g3", kind: Gpu),
  ])],
  links: [
    (a: "g0", b: "g1", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "g1", b: "g2", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "g2", b: "g3", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "g3", b: "g0", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "g0", b: "g2", kind: NvLink, bw: 25.0, latency: 1.0),
  ],
)"#;

#[test]
fn packed_allreduce_chorded_ring() {
    let spec = hccl_topologies::parse_spec(CHORDED_RING4, "chorded-ring-4").expect("parses");
    let topo = hccl_topologies::build(spec, "chorded-ring-4").expect("builds");
    // The trees alone and their copies, the shallowest and the deepest pipeline.
    check_family(
        "packed_allreduce",
        &topo,
        Collective::AllReduce,
        &|i, len, _| {
            if first(i, len) {
                Some(Budget {
                    calls: 30,
                    process: 8,
                })
            } else if last(i, len) {
                Some(Budget {
                    calls: 4,
                    process: 1,
                })
            } else {
                None
            }
        },
    );
}

/// `hosts` hosts of `per_host` ranks with one NIC each (`hcclc topo gen cluster` of
/// `hcclc topo gen host --nic-bw 25` boxes): a cluster small enough to run every rank in
/// one test.
fn small_cluster(hosts: u32, per_host: u32) -> Topology {
    use hccl_topologies::generate;
    let spec = generate::cluster(hosts, &generate::host_with_nic(per_host, 10.0, 25.0, 1.3));
    hccl_topologies::build(spec, &format!("cluster-{hosts}x{per_host}")).expect("builds")
}

#[test]
fn rail_pipelines_on_small_clusters() {
    // Relays on three and four hosts (one relay's pieces per channel, and not), the chains
    // beside them; the root neither first on its host nor on the first host, so that the
    // helper, the scatter and the return by the root's rail all take their general paths.
    for (hosts, per_host, family) in [
        (3, 2, "rail_trees"),
        (4, 3, "rail_trees"),
        (3, 2, "rail_chains"),
    ] {
        let topo = small_cluster(hosts, per_host);
        let root = per_host + 1;
        for collective in [Collective::Broadcast { root }, Collective::Reduce { root }] {
            check_family(family, &topo, collective, &|i, len, _| {
                if first(i, len) {
                    Some(Budget {
                        calls: 16,
                        process: 4,
                    })
                } else if last(i, len) {
                    Some(Budget {
                        calls: 3,
                        process: 1,
                    })
                } else {
                    None
                }
            });
        }
    }
}

#[test]
fn flow_alltoall_forwards_through_scratch() {
    // DGX-1's pairs without a direct NVLink forward through other ranks' scratch; the ring's
    // non-neighbours too; DGX-H100 goes direct.
    for topo in [shipped("dgx1-v100"), ring4(), shipped("dgx-h100")] {
        let plans = check_family(
            "flow_alltoall",
            &topo,
            Collective::AllToAll,
            &|i, len, _| {
                Some(if first(i, len) {
                    Budget {
                        calls: 16,
                        process: 6,
                    }
                } else if last(i, len) {
                    Budget {
                        calls: 2,
                        process: 1,
                    }
                } else {
                    Budget {
                        calls: 3,
                        process: 0,
                    }
                })
            },
        );
        if topo.name != "dgx-h100" {
            let forwards = plans.iter().any(|(_, plan, _)| {
                plan.entries
                    .iter()
                    .any(|e| e.schedule.ranks.iter().any(|r| r.scratch_chunks > 0))
            });
            assert!(forwards, "{}: no plan forwards through scratch", topo.name);
        }
    }
}

#[test]
fn milp_frontier_dgx1() {
    // Every frontier point of AllGather, ReduceScatter and AllReduce (the ReduceScatter
    // then the AllGather point); out-of-place schedules (in-place calls adapted).
    let topo = shipped("dgx1-v100");
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
    ] {
        let params = params_of("milp", &topo, coll);
        assert_eq!(params.len(), 1, "{coll}: {params:?}");
        let t = Instant::now();
        let cands = candidates("milp", &topo, coll, params[0]);
        let gen_s = t.elapsed().as_secs_f64();
        assert!(
            cands.len() >= 2,
            "{coll}: frontier of {} points",
            cands.len()
        );
        for (k, c) in cands.iter().enumerate() {
            eprintln!("  {} {coll}: {} ({gen_s:.2} s)", topo.name, shape(c));
            for proto in [Protocol::Simple, Protocol::LL] {
                let plan = plan_of(&topo, &[c], proto);
                let label = format!("{} milp {coll} point {k} {proto:?}", topo.name);
                let all = cases(coll, topo.nranks(), c.schedule.chunks, 500 + k as u64);
                // LL over slots of 512 bytes: many segments of a few elements per chunk.
                let (process, cfg) = if proto == Protocol::Simple {
                    (8, config())
                } else {
                    (0, config().with_slot_bytes(512))
                };
                let label = format!("{label} slot {}", cfg.slot_bytes);
                run_checked_with(
                    &label,
                    &plan,
                    topo.nranks(),
                    &all,
                    &thin(&all, process),
                    cfg,
                );
            }
        }
    }
}

/// Plans the search compiles with only the synthesizers competing (`--synth full --algo
/// packed_trees,flow_alltoall,milp`), through a plan file, every entry run at sizes of its
/// range on threads and a few on the process backend.
#[test]
fn compiled_synthesized_plans_run() {
    use hccl_compiler::search::{Options, compile, geometric_sizes};
    use hccl_ir::CollectiveKind as K;
    let dir = std::env::temp_dir().join(format!("hccl-synth-compiled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (topo, kinds) in [
        (
            ring4(),
            // (AllToAll's flow pieces start at 16 KiB per path, above these sizes.)
            vec![K::Broadcast, K::Reduce, K::AllGather, K::ReduceScatter],
        ),
        (shipped("dgx1-v100"), vec![K::AllReduce]),
    ] {
        let t = Instant::now();
        let opts = Options {
            collectives: kinds.clone(),
            // From 256 KiB: below a synthesized candidate's `min_bytes` (pieces × channels ×
            // 4 KiB) the search costs none, and with only synthesizers allowed a size without
            // a costed candidate fails the compile ("no verified schedule").
            sizes: geometric_sizes(256 << 10, 1 << 20, 4),
            algorithms: Some(vec![
                "packed_trees".into(),
                "flow_alltoall".into(),
                "milp".into(),
            ]),
            synth: SynthLevel::Full,
            ..Options::default()
        };
        let compiled = compile(&topo, &opts).unwrap_or_else(|e| panic!("{}: {e}", topo.name));
        let path = dir.join(format!("{}.plan.ron", topo.name));
        compiled.plan.save(&path).expect("plan written");
        let plan = PlanFile::load(&path).expect("plan read back");
        eprintln!(
            "{}: compiled {} entries in {:.2} s",
            topo.name,
            plan.entries.len(),
            t.elapsed().as_secs_f64()
        );
        let n = topo.nranks();
        let mut all = Vec::new();
        for (i, e) in plan.entries.iter().enumerate() {
            let coll = e.schedule.collective;
            assert!(kinds.contains(&coll.kind()), "{}: {coll}", topo.name);
            assert!(
                ["packed_trees", "flow_alltoall", "milp"]
                    .iter()
                    .any(|a| e.algorithm.starts_with(a)),
                "{}: entry {i} is {}",
                topo.name,
                e.algorithm
            );
            // Sizes inside the entry's range: its least size and one not a power of two.
            let lo = (e.min_bytes / 4).max(1) as usize;
            let hi = e
                .max_bytes
                .map_or(lo * 3, |m| (m / 4) as usize - 1)
                .min(lo * 3);
            // The least size of every entry; one inside the range of the first of each.
            let sizes = if i == 0 || plan.entries[i - 1].schedule.collective != coll {
                vec![lo, (lo + hi) / 2 + 3]
            } else {
                vec![lo]
            };
            for (j, elems) in sizes.into_iter().enumerate() {
                let blocked = matches!(coll.kind(), K::AllGather | K::ReduceScatter | K::AllToAll);
                let count = if blocked {
                    (elems / n as usize).max(1) * n as usize
                } else {
                    elems
                };
                all.push(Case {
                    collective: coll,
                    dtype: if j == 0 { DataType::F32 } else { DataType::I32 },
                    op: if j == 0 { ReduceOp::Sum } else { ReduceOp::Max },
                    in_place: (i + j) % 2 == 1,
                    count,
                    seed: (i * 2 + j) as u64,
                });
            }
        }
        let label = format!("{} compiled", topo.name);
        run_checked(&label, &plan, n, &all, &thin(&all, 4));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
