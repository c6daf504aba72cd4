//! The MILP synthesizer in SCCL's model (`hccl_compiler::synth::milp`): the DGX-1 link
//! matrix and bound, the AllGather frontier against SCCL's published points, hand-derived
//! ring frontiers, the duals, and every point lowered to a schedule that verifies.

use hccl_compiler::synth::milp::{
    self, Frontier, Instance, LinkMatrix, ParetoOptions, Ratio, Stop, bandwidth_bound,
};
use hccl_ir::Collective;
use hccl_topologies::{build, generate};

fn dgx1() -> LinkMatrix {
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    LinkMatrix::from_topology(&topo).unwrap()
}

fn ring(n: u32) -> LinkMatrix {
    let topo = build(generate::ring(n, 25.0, 0.5), "test").unwrap();
    LinkMatrix::from_topology(&topo).unwrap()
}

fn points(f: &Frontier) -> Vec<(u32, u32, u32)> {
    f.points
        .iter()
        .map(|p| {
            let i = p.instance();
            (i.steps, i.rounds, i.chunks)
        })
        .collect()
}

/// Every point follows the model and lowers to a schedule that verifies.
fn check_points(f: &Frontier, links: &LinkMatrix) {
    for p in &f.points {
        let alg = &p.algorithm;
        alg.check(links).unwrap();
        assert_eq!(alg.rounds_per_step.iter().sum::<u32>(), alg.instance.rounds);
        let cand = milp::lower("milp", alg).expect("lowers");
        if let Err(errors) = hccl_ir::verify::verify(&cand.schedule) {
            panic!("{:?}: {}", alg.instance, errors[0]);
        }
    }
}

fn opts(max_steps: u32, max_chunks: u32) -> ParetoOptions {
    ParetoOptions {
        max_steps,
        max_chunks,
        time_limit: 20.0,
    }
}

#[test]
fn dgx1_links_are_sccls_matrix_and_the_bound_is_seven_sixths() {
    let links = dgx1();
    // msccl-tools' DGX-1: NVLink counts per pair (two on the hybrid cube-mesh's 8-cycle).
    let want = vec![
        vec![0, 2, 1, 1, 2, 0, 0, 0],
        vec![2, 0, 1, 2, 0, 1, 0, 0],
        vec![1, 1, 0, 2, 0, 0, 2, 0],
        vec![1, 2, 2, 0, 0, 0, 0, 1],
        vec![2, 0, 0, 0, 0, 2, 1, 1],
        vec![0, 1, 0, 0, 2, 0, 1, 2],
        vec![0, 0, 2, 0, 1, 1, 0, 2],
        vec![0, 0, 0, 1, 1, 2, 2, 0],
    ];
    assert_eq!(links.rows(), want);
    assert_eq!(links.unit_gbps, 25);
    assert_eq!(
        bandwidth_bound(&links, Collective::AllGather).unwrap(),
        Ratio::new(7, 6)
    );
    // Gather-like duals see the transposed (here equal) matrix.
    assert_eq!(
        bandwidth_bound(&links, Collective::ReduceScatter).unwrap(),
        Ratio::new(7, 6)
    );
    // Broadcast from 0: a rank's inbound 6 links, the root's outbound 6: 1/6.
    assert_eq!(
        bandwidth_bound(&links, Collective::Broadcast { root: 0 }).unwrap(),
        Ratio::new(1, 6)
    );
    // Two orbits under the automorphisms (the 8-cycle's rotation by four and two mirrors).
    let sym = milp::automorphisms(&links);
    let mut reps: Vec<usize> = sym.iter().map(|(r, _)| *r).collect();
    reps.dedup();
    reps.sort_unstable();
    reps.dedup();
    assert_eq!(reps, vec![0, 1]);
    for (o, (rho, p)) in sym.iter().enumerate() {
        assert_eq!(p[*rho], o);
        for u in 0..8 {
            for v in 0..8 {
                assert_eq!(links.get(u, v), links.get(p[u], p[v]));
            }
        }
    }
}

#[test]
fn dgx1_allgather_two_steps_needs_three_halves() {
    let links = dgx1();
    let f = milp::pareto(&links, Collective::AllGather, opts(2, 8)).unwrap();
    assert_eq!(f.least_steps, 2);
    assert_eq!(points(&f), vec![(2, 3, 2)]);
    assert!(f.points[0].proven);
    // Every better ratio at two steps was proven infeasible, none ran out of time.
    let below: Vec<_> = f
        .tried
        .iter()
        .filter(|t| t.stop != Stop::Feasible)
        .collect();
    assert!(below.len() >= 10, "{}", below.len());
    assert!(below.iter().all(|t| t.stop == Stop::Infeasible));
    check_points(&f, &links);
}

#[test]
fn rings_match_hand_derived_frontiers() {
    // Ring of 4: the opposite rank is two hops away; each rank takes 3C chunks over two
    // inbound links (R/C >= 3/2), met at two steps by halves going either way.
    let links = ring(4);
    let f = milp::pareto(&links, Collective::AllGather, opts(4, 4)).unwrap();
    assert_eq!((f.bound, f.least_steps), (Ratio::new(3, 2), 2));
    assert_eq!(points(&f), vec![(2, 3, 2)]);
    assert!(f.at_bound);
    check_points(&f, &links);
    // Ring of 5: bound 4/2 = 2, met in two steps with one chunk (own chunk out in step 1,
    // the neighbour's forwarded in step 2).
    let links = ring(5);
    let f = milp::pareto(&links, Collective::AllGather, opts(4, 4)).unwrap();
    assert_eq!(points(&f), vec![(2, 2, 1)]);
    check_points(&f, &links);
    // Ring of 6: three hops to the opposite rank; bound 5/2 met at three steps with two
    // chunks (rounds 2, 2, 1: one chunk three hops one way, two the other).
    let links = ring(6);
    let f = milp::pareto(&links, Collective::AllGather, opts(4, 4)).unwrap();
    assert_eq!((f.bound, f.least_steps), (Ratio::new(5, 2), 3));
    assert_eq!(points(&f), vec![(3, 5, 2)]);
    check_points(&f, &links);
}

#[test]
fn broadcast_and_the_duals() {
    // Broadcast on a ring of 4 from rank 0 in two steps: the neighbours can only hear from
    // the root (the opposite rank holds nothing before step 2), so R >= C; met with 2, 2.
    let links = ring(4);
    let f = milp::pareto(&links, Collective::Broadcast { root: 0 }, opts(2, 4)).unwrap();
    assert_eq!(points(&f), vec![(2, 2, 2)]);
    check_points(&f, &links);
    // Reduce: the same, reversed.
    let f = milp::pareto(&links, Collective::Reduce { root: 0 }, opts(2, 4)).unwrap();
    assert_eq!(points(&f), vec![(2, 2, 2)]);
    check_points(&f, &links);
    // ReduceScatter on DGX-1 is the reversed AllGather: the same two-step point.
    let links = dgx1();
    let solved = milp::solve_instance(
        &links,
        Collective::ReduceScatter,
        Instance {
            steps: 2,
            rounds: 3,
            chunks: 2,
        },
        20.0,
    )
    .unwrap();
    assert_eq!(solved.stop, Stop::Feasible);
    let alg = solved.algorithm.unwrap();
    alg.check(&links).unwrap();
    let cand = milp::lower("milp", &alg).unwrap();
    hccl_ir::verify::verify(&cand.schedule).unwrap();
    // Below the bound nothing is solved: pruned.
    let solved = milp::solve_instance(
        &links,
        Collective::AllGather,
        Instance {
            steps: 3,
            rounds: 8,
            chunks: 7,
        },
        20.0,
    )
    .unwrap();
    assert_eq!(solved.stop, Stop::Pruned);
    assert!(solved.solves.is_empty());
}

/// ReduceScatter is AllGather over the transposed links, reversed: over links that are their
/// own transpose the two are one problem, solved once per process and read by both.
#[test]
fn duals_over_symmetric_links_share_their_solves() {
    let links = ring(4);
    assert_eq!(links, links.transposed());
    let inst = Instance {
        steps: 2,
        rounds: 3,
        chunks: 2,
    };
    let ag = milp::solve_instance(&links, Collective::AllGather, inst, 20.0).unwrap();
    let rs = milp::solve_instance(&links, Collective::ReduceScatter, inst, 20.0).unwrap();
    assert!(!ag.solves.is_empty(), "the instance is solved, not pruned");
    assert_eq!(ag.stop, Stop::Feasible);
    assert_eq!(rs.stop, ag.stop);
    assert_eq!(rs.solves, ag.solves);
    // The solver's own clock, read once: a second solve would have timed itself anew.
    assert_eq!(rs.seconds.to_bits(), ag.seconds.to_bits());
    let alg = rs.algorithm.unwrap();
    assert_eq!(alg.collective, Collective::ReduceScatter);
    alg.check(&links).unwrap();
    hccl_ir::verify::verify(&milp::lower("milp", &alg).unwrap().schedule).unwrap();
}

#[test]
fn bad_instances_are_typed_errors() {
    let links = ring(4);
    for o in [
        ParetoOptions {
            max_steps: 0,
            ..opts(1, 1)
        },
        ParetoOptions {
            max_steps: 99,
            ..opts(1, 1)
        },
        ParetoOptions {
            time_limit: -1.0,
            ..opts(2, 2)
        },
        ParetoOptions {
            time_limit: f64::NAN,
            ..opts(2, 2)
        },
    ] {
        assert!(milp::pareto(&links, Collective::AllGather, o).is_err());
    }
    assert!(milp::pareto(&links, Collective::AllReduce, opts(2, 2)).is_err());
    assert!(milp::pareto(&links, Collective::Broadcast { root: 9 }, opts(2, 2)).is_err());
    // A machine whose ranks meet only at a switch has no direct links.
    let topo = build(generate::fat_tree(4, 4, 25.0, 1.0), "test").unwrap();
    assert!(LinkMatrix::from_topology(&topo).is_err());
}

#[test]
fn dgx1_allgather_frontier_is_sccls_two_points() {
    // SCCL (PPoPP'21, msccl-tools SYNTHESIS.md): >= 2 steps, >= 7/6 rounds per chunk;
    // pareto-optimal finds (2, 3, 2) latency-optimal and (3, 7, 6) bandwidth-optimal.
    let links = dgx1();
    let f = milp::pareto(&links, Collective::AllGather, opts(4, 8)).unwrap();
    assert_eq!(points(&f), vec![(2, 3, 2), (3, 7, 6)]);
    assert!(f.at_bound);
    assert!(f.points.iter().all(|p| p.proven));
    // The search stops at the bound: nothing tried at four steps.
    assert!(f.tried.iter().all(|t| t.instance.steps <= 3));
    check_points(&f, &links);
    // Broadcast's dual, Reduce, and AllGather's, ReduceScatter, verify too.
    let f = milp::pareto(&links, Collective::ReduceScatter, opts(3, 6)).unwrap();
    assert_eq!(points(&f), vec![(2, 3, 2), (3, 7, 6)]);
    check_points(&f, &links);
}

#[test]
fn candidates_for_a_search_verify() {
    let topo = build(generate::ring(4, 25.0, 0.5), "test").unwrap();
    let cands = milp::candidates(&topo, Collective::AllGather, opts(3, 4)).unwrap();
    assert_eq!(cands.len(), 1);
    assert_eq!(cands[0].algorithm, "milp_s2_r3_c2");
    assert_eq!(cands[0].schedule.chunks, 4 * 2);
    hccl_ir::verify::verify(&cands[0].schedule).unwrap();
}

/// The frontier is in the default search (`--synth auto`): on DGX-1 its AllReduce (the dual
/// ReduceScatter then the AllGather point) beats every built-in family from 256 KiB to 2 MiB,
/// where they sit at 1.75-1.93x the bound, and every entry it wins records its point.
#[test]
fn default_synthesis_wins_dgx1_allreduce_at_middle_sizes() {
    use hccl_compiler::search::{self, Options};
    use hccl_compiler::synth::SynthLevel;
    let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
    let compile = |synth| {
        search::compile(
            &topo,
            &Options {
                collectives: vec![hccl_ir::CollectiveKind::AllReduce],
                sizes: vec![256 << 10, 512 << 10, 1 << 20, 2 << 20],
                model: hccl_compiler::cost::CostModel::for_topology(&topo),
                synth,
                ..Options::default()
            },
        )
        .expect("compiles")
    };
    let (off, auto) = (compile(SynthLevel::Off), compile(SynthLevel::Auto));
    for (a, f) in off.rows.iter().zip(&auto.rows) {
        assert_eq!(f.algorithm, "milp", "{} B", f.bytes);
        assert!(
            f.predicted_us < 0.9 * a.predicted_us,
            "{} B: milp {} us against {} {} us",
            f.bytes,
            f.predicted_us,
            a.algorithm,
            a.predicted_us
        );
        let record = f
            .synthesis
            .as_ref()
            .expect("the entry records its synthesis");
        assert_eq!(record.method, "milp-steps-rounds");
        assert!(record.proven && record.value >= 7.0 / 6.0 - 1e-9);
    }
    for e in &auto.plan.entries {
        hccl_ir::verify::verify(&e.schedule).expect("verifies");
        assert!(e.synthesis.is_some());
    }
}
