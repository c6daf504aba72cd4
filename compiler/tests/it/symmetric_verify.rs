//! The symmetric verifier (`hccl_ir::verify::verify_symmetric`, one template and its
//! translation group) against the exact verifier on the expansion (the oracle): equal
//! verdicts and reports on every symmetric schedule the families emit, and equal verdicts
//! on templates mutated in every way a step can be (dependencies, offsets, counts, peers,
//! channels, order, missing steps).

use crate::cost_common;

use cost_common::par_each;
use hccl_compiler::search::{all_families, generate_with};
use hccl_ir::verify::{ErrorKind, verify_report, verify_symmetric, verify_symmetric_by_orbits};
use hccl_ir::{Action, BlockLayout, Buf, Collective, Loc, Op, SymmetricSchedule};
use hccl_topologies::{Topology, generate};
use std::collections::BTreeSet;
use std::sync::Mutex;

fn topologies() -> Vec<(String, Topology)> {
    let build = |spec, name: &str| hccl_topologies::build(spec, name).unwrap();
    let mut out = vec![
        (
            "ring8".to_string(),
            build(generate::ring(8, 25.0, 0.3), "t"),
        ),
        (
            "torus4x4".to_string(),
            build(generate::torus(&[4, 4], 25.0, 0.3), "t"),
        ),
        (
            "torus2x3".to_string(),
            build(generate::torus(&[2, 3], 25.0, 0.3), "t"),
        ),
    ];
    for (nodes, per) in [(4u32, 2u32), (8, 2), (3, 2), (2, 4), (4, 4)] {
        let host = generate::host_with_nic(per, 100.0, 25.0, 2.0);
        out.push((
            format!("cluster{nodes}x{per}"),
            build(generate::cluster(nodes, &host), "t"),
        ));
    }
    for name in ["dgx1-v100", "dgx-h100", "h100-cluster-2node"] {
        out.push((
            name.to_string(),
            hccl_topologies::shipped_by_name(name).unwrap(),
        ));
    }
    out
}

const COLLECTIVES: [Collective; 4] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
];

/// Every compressible schedule the families emit on the test machines (both placements,
/// the shallowest and deepest parameter sets), with a name.
fn symmetric_schedules() -> Vec<(String, SymmetricSchedule)> {
    let topos = topologies();
    let families = all_families();
    let mut cases = Vec::new();
    for t in 0..topos.len() {
        for f in 0..families.len() {
            for c in COLLECTIVES {
                cases.push((t, f, c));
            }
        }
    }
    let out = Mutex::new(Vec::new());
    par_each(&cases, |&(t, f, coll)| {
        let (tname, topo) = &topos[t];
        let fam = &families[f];
        if !fam.supports(coll.kind()) || fam.name().starts_with("packed") {
            return;
        }
        let space = fam.param_space(topo, coll);
        let picks: BTreeSet<usize> = [0, space.len().saturating_sub(1)].into_iter().collect();
        for i in picks {
            let Some(&params) = space.get(i) else {
                continue;
            };
            for in_place in [false, true] {
                let Some(cands) = generate_with(fam.name(), topo, coll, params, in_place) else {
                    continue;
                };
                for cand in cands {
                    let Some(sym) = &cand.symmetry else { continue };
                    if let Some(s) = cand.schedule.compress(sym) {
                        let name = format!(
                            "{} {tname} {coll} {}x{} in_place={in_place}",
                            fam.name(),
                            params.channels,
                            params.pipeline
                        );
                        out.lock().unwrap().push((name, s));
                    }
                }
            }
        }
    });
    let mut out = out.into_inner().unwrap();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The oracle's verdict: `Ok(report)` or the kinds of its errors.
fn expanded(s: &SymmetricSchedule) -> Result<hccl_ir::verify::Report, Vec<&'static str>> {
    let kinds = |e: Vec<hccl_ir::verify::VerifyError>| {
        let set: BTreeSet<&'static str> = e.iter().map(|e| e.kind.name()).collect();
        set.into_iter().collect()
    };
    match s.expand() {
        Ok(full) => verify_report(&full).map_err(kinds),
        Err(_) => Err(vec![ErrorKind::Header.name()]),
    }
}

#[test]
fn family_schedules_verify_alike() {
    let cases = symmetric_schedules();
    // docs/benchmarks.md states these counts ("all 578 symmetric schedules the families emit on 11
    // machines"): a family that emits more or fewer changes them, and the doc with them.
    assert_eq!(
        topologies().len(),
        11,
        "docs/benchmarks.md says 11 machines"
    );
    assert_eq!(
        cases.len(),
        578,
        "docs/benchmarks.md says 578 symmetric schedules: update it with this test"
    );
    let families: BTreeSet<&str> = cases
        .iter()
        .map(|(n, _)| n.split(' ').next().unwrap())
        .collect();
    for f in [
        "ring",
        "double_ring",
        "mesh",
        "hierarchical",
        "hierarchical_hd",
        "hierarchical_rd",
        "hybrid_cube",
    ] {
        assert!(
            families.contains(f),
            "no symmetric {f} schedule among {families:?}"
        );
    }
    eprintln!("{} symmetric schedules: {families:?}", cases.len());
    let failures = Mutex::new(Vec::new());
    par_each(&cases, |(name, s)| {
        let oracle = expanded(s);
        let quick = verify_symmetric(s);
        let orbits = verify_symmetric_by_orbits(s);
        match (&oracle, &quick, &orbits) {
            (Ok(a), Ok(b), Ok(c)) if a == b && a == c => {}
            _ => failures.lock().unwrap().push(format!(
                "{name}: expanded {oracle:?}, symmetric {:?}",
                quick.as_ref().map_err(|e| e
                    .iter()
                    .take(2)
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>())
            )),
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} disagree:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

fn nudge(loc: Loc, by: u32) -> Loc {
    Loc {
        off: loc.off ^ by,
        ..loc
    }
}

/// The template with one mutation `kind` at a random step.
fn mutate(s: &SymmetricSchedule, rng: &mut Lcg, kind: usize) -> Option<SymmetricSchedule> {
    let mut m = s.clone();
    let streams = m.template.streams.len();
    let si = rng.next(streams);
    let len = m.template.streams.get(si)?.steps.len();
    if len == 0 {
        return None;
    }
    let ti = rng.next(len);
    let n = m.nranks;
    let step = &mut m.template.streams[si].steps[ti];
    match kind {
        0 => step.deps.clear(),
        1 => {
            let by = 1 << rng.next(3);
            step.op = match step.op {
                Op::Send { to, src } => Op::Send {
                    to,
                    src: nudge(src, by),
                },
                Op::Copy { src, dst } => Op::Copy {
                    src: nudge(src, by),
                    dst,
                },
                Op::Reduce { src, dst } => Op::Reduce {
                    src: nudge(src, by),
                    dst,
                },
                Op::RecvReduceCopy { from, src, dst } => Op::RecvReduceCopy {
                    from,
                    src: nudge(src, by),
                    dst,
                },
                Op::RecvReduceSend { from, to, src } => Op::RecvReduceSend {
                    from,
                    to,
                    src: nudge(src, by),
                },
                _ => return None,
            }
        }
        2 => {
            let by = 1 << rng.next(3);
            step.op = match step.op {
                Op::Recv { from, dst } => Op::Recv {
                    from,
                    dst: nudge(dst, by),
                },
                Op::Copy { src, dst } => Op::Copy {
                    src,
                    dst: nudge(dst, by),
                },
                Op::RecvReduceCopy { from, src, dst } => Op::RecvReduceCopy {
                    from,
                    src,
                    dst: nudge(dst, by),
                },
                Op::RecvCopySend { from, to, dst } => Op::RecvCopySend {
                    from,
                    to,
                    dst: nudge(dst, by),
                },
                _ => return None,
            }
        }
        3 => step.count = step.count.saturating_sub(1).max(1) + u32::from(step.count == 1),
        4 => {
            let other = rng.next(n as usize) as u32;
            step.op = step.op.map_peers(|_| other);
        }
        5 => {
            if ti + 1 >= len {
                return None;
            }
            m.template.streams[si].steps.swap(ti, ti + 1);
        }
        6 => {
            m.template.streams[si].steps.remove(ti);
        }
        7 => {
            // A scratch run for a buffer run: the translation no longer moves it.
            step.op = match step.op {
                Op::Recv { from, dst }
                    if dst.buf != Buf::Scratch && m.template.scratch_chunks >= step.count =>
                {
                    Op::Recv {
                        from,
                        dst: Loc::new(Buf::Scratch, 0),
                    }
                }
                _ => return None,
            }
        }
        8 => {
            let ch = m.template.streams[si].channel;
            m.template.streams[si].channel = ch ^ 1;
        }
        // The symmetry itself: chunks that do not move, another block layout, another
        // action, two ranks of the grid exchanged.
        9 => m.symmetry.chunks = None,
        10 => {
            let map = m.symmetry.chunks.as_mut()?;
            map.layout = match map.layout {
                BlockLayout::BlockMajor => BlockLayout::PieceMajor,
                BlockLayout::PieceMajor => BlockLayout::BlockMajor,
            };
        }
        11 => {
            let i = rng.next(m.symmetry.dims.len());
            if !m.symmetry.dims[i].is_power_of_two() || m.symmetry.dims[i] < 4 {
                return None;
            }
            m.symmetry.actions[i] = match m.symmetry.actions[i] {
                Action::Cyclic => Action::Xor,
                Action::Xor => Action::Cyclic,
            };
        }
        _ => {
            let (a, b) = (1 + rng.next(n as usize - 1), 1 + rng.next(n as usize - 1));
            if a == b {
                return None;
            }
            m.symmetry.ranks.swap(a, b);
        }
    }
    Some(m)
}

#[test]
fn mutated_templates_verify_alike() {
    let cases = symmetric_schedules();
    let mutants: Vec<(String, SymmetricSchedule)> = cases
        .iter()
        .enumerate()
        .flat_map(|(i, (name, s))| {
            let mut rng = Lcg(0x9E37_79B9 ^ i as u64);
            (0..13)
                .flat_map(|kind| (0..2).map(move |j| (kind, j)))
                .filter_map(|(kind, j)| {
                    mutate(s, &mut rng, kind).map(|m| (format!("{name} mutation {kind}.{j}"), m))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // docs/benchmarks.md: "equal verdicts on 11,958 mutated templates and symmetries (9,336 of them
    // wrong)"; the mutations are seeded, so the counts are fixed.
    assert_eq!(
        mutants.len(),
        11_958,
        "docs/benchmarks.md says 11,958 mutants: update it with this test"
    );
    let failures = Mutex::new(Vec::new());
    let rejected = std::sync::atomic::AtomicUsize::new(0);
    par_each(&mutants, |(name, m)| {
        let oracle = expanded(m);
        let quick = verify_symmetric(m);
        let orbits = verify_symmetric_by_orbits(m);
        if oracle.is_err() {
            rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let agree = match (&oracle, &quick, &orbits) {
            (Ok(a), Ok(b), Ok(c)) => a == b && a == c,
            (Err(_), Err(_), Err(_)) => true,
            _ => false,
        };
        if !agree {
            failures.lock().unwrap().push(format!(
                "{name}: expanded {:?}, symmetric {:?}",
                oracle.as_ref().map(|_| ()),
                quick.as_ref().map(|_| ()).map_err(|e| e
                    .iter()
                    .take(2)
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>())
            ));
        }
    });
    let rejected = rejected.into_inner();
    eprintln!("{} mutants, {rejected} wrong", mutants.len());
    let failures = failures.into_inner().unwrap();
    assert_eq!(
        rejected, 9_336,
        "docs/benchmarks.md says 9,336 of the mutants are wrong: update it with this test"
    );
    assert!(
        failures.is_empty(),
        "{} of {} mutants disagree:\n{}",
        failures.len(),
        mutants.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
