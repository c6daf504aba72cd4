//! The hierarchical families (direct, halving-doubling and recursive-doubling rail exchange) on generated DGX
//! H100 clusters: every schedule verifies (AllReduce, AllGather, ReduceScatter; in place
//! and not), its step count is within a factor of two of the family's estimate, and the
//! halving-doubling rail keeps AllReduce pipelines small enough that deep ones are offered
//! on 1024 ranks.

use hccl_compiler::families::{Family, FamilyParams, Hierarchical, HierarchicalHd, HierarchicalRd};
use hccl_ir::Collective;
use hccl_ir::verify::verify;
use hccl_topologies::Topology;

fn cluster(nodes: u32) -> Topology {
    let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
    let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
    hccl_topologies::build(hccl_topologies::generate::cluster(nodes, &spec), "cluster")
        .expect("cluster builds")
}

const COLLECTIVES: [Collective; 3] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
];

/// Parameter sets exercised: unpipelined, two connections, a pipeline of three pieces.
const PARAMS: [FamilyParams; 3] = [
    FamilyParams {
        channels: 1,
        pipeline: 1,
    },
    FamilyParams {
        channels: 2,
        pipeline: 1,
    },
    FamilyParams {
        channels: 1,
        pipeline: 3,
    },
];

fn check(name: &str, topo: &Topology, coll: Collective, p: FamilyParams, in_place: bool) {
    let what = format!(
        "{name} {coll} {p:?} in_place={in_place} on {} ranks",
        topo.nranks()
    );
    let cands = hccl_compiler::search::generate_with(name, topo, coll, p, in_place)
        .expect("a known family");
    assert_eq!(cands.len(), 1, "{what}");
    let s = &cands[0].schedule;
    if let Err(e) = verify(s) {
        panic!("{what}: {:?}", &e[..e.len().min(3)]);
    }
    let fam: Box<dyn Family> = match name {
        "hierarchical" => Box::new(Hierarchical),
        "hierarchical_rd" => Box::new(HierarchicalRd),
        _ => Box::new(HierarchicalHd),
    };
    let est = fam.estimated_steps(topo, coll, p).expect("an estimate");
    let real = s.step_count() as u64;
    assert!(
        est <= 2 * real && real <= 2 * est,
        "{what}: estimate {est}, real {real}"
    );
}

#[test]
fn schedules_verify_on_generated_clusters() {
    for nodes in [2, 3, 4, 8] {
        let topo = cluster(nodes);
        for name in ["hierarchical", "hierarchical_hd", "hierarchical_rd"] {
            for coll in COLLECTIVES {
                // Recursive doubling: AllReduce on a power-of-two host count only.
                if name == "hierarchical_rd"
                    && (coll != Collective::AllReduce || !nodes.is_power_of_two())
                {
                    continue;
                }
                for p in PARAMS {
                    for in_place in [false, true] {
                        check(name, &topo, coll, p, in_place);
                    }
                }
            }
        }
    }
}

/// Pipelines are offered only on power-of-two host counts (elsewhere the schedule falls
/// back to the direct rail exchange).
#[test]
fn halving_doubling_pipelines_only_on_power_of_two_hosts() {
    let one = FamilyParams {
        channels: 1,
        pipeline: 1,
    };
    for (nodes, pow2) in [(2, true), (3, false), (4, true), (6, false), (8, true)] {
        let topo = cluster(nodes);
        for coll in COLLECTIVES {
            let space = HierarchicalHd.param_space(&topo, coll);
            assert!(space.contains(&one), "{nodes} nodes {coll}");
            assert_eq!(space.len() > 1, pow2, "{nodes} nodes {coll}: {space:?}");
        }
    }
}

#[test]
fn halving_doubling_offers_deeper_all_reduce_pipelines_on_1024_ranks() {
    let topo = cluster(128);
    let deepest = |f: &dyn Family| {
        f.param_space(&topo, Collective::AllReduce)
            .iter()
            .map(|p| p.channels * p.pipeline)
            .max()
            .unwrap_or(0)
    };
    let (direct, hd) = (deepest(&Hierarchical), deepest(&HierarchicalHd));
    assert_eq!(direct, 1);
    // From TEMPLATE_RANKS on the search builds and costs templates: the step cap applies
    // to one rank's program, and the verifier models one rank, so the deepest pipeline
    // (64 pieces) is offered.
    assert!(topo.nranks() >= hccl_compiler::families::TEMPLATE_RANKS);
    assert_eq!(hd, 64, "halving-doubling offers only {hd} pieces");
    for p in HierarchicalHd.param_space(&topo, Collective::AllReduce) {
        let est = HierarchicalHd
            .template_steps(&topo, Collective::AllReduce, p)
            .expect("an estimate");
        assert!(
            est <= hccl_compiler::search::MAX_CANDIDATE_STEPS,
            "{p:?}: {est}"
        );
        let made = HierarchicalHd
            .template(&topo, Collective::AllReduce, p)
            .expect("templates");
        for c in made {
            let t = c.template.as_ref().expect("a template candidate");
            assert!(c.schedule.ranks.iter().all(|r| r.streams.is_empty()));
            assert_eq!(c.work_steps(), t.template_step_count() as u64);
            // The estimate is within a small factor of the template.
            assert!(
                c.work_steps() <= 2 * est && est <= 2 * c.work_steps(),
                "{p:?}"
            );
            if p.pipeline <= 2 {
                // The template is the program the whole schedule gives its first rank.
                let whole = HierarchicalHd.generate(&topo, Collective::AllReduce, p);
                let sym = whole[0].symmetry.as_ref().expect("a symmetry");
                let compact = whole[0].schedule.compress(sym).expect("compresses");
                assert_eq!(&compact, t.as_ref());
            }
        }
    }
}

/// Every hierarchical schedule is the grid translate of one template program: it compresses
/// under the symmetry its family declares.
#[test]
fn schedules_compress_under_their_symmetry() {
    let mut topos: Vec<(String, Topology)> = ["h100-cluster-2node", "h100-cluster-4node"]
        .iter()
        .map(|&n| {
            let t = hccl_topologies::shipped_by_name(n).expect("shipped cluster");
            (n.to_string(), t)
        })
        .collect();
    for nodes in [3, 4, 8, 16] {
        topos.push((format!("{nodes} generated nodes"), cluster(nodes)));
    }
    for (tname, topo) in &topos {
        for name in ["hierarchical", "hierarchical_hd"] {
            for coll in COLLECTIVES {
                for p in [PARAMS[0], PARAMS[1]] {
                    let sym = if name == "hierarchical" {
                        Hierarchical.symmetry(topo, coll, p)
                    } else {
                        HierarchicalHd.symmetry(topo, coll, p)
                    }
                    .expect("a symmetry");
                    for in_place in [false, true] {
                        let what = format!("{name} {coll} {p:?} in_place={in_place} on {tname}");
                        let cands =
                            hccl_compiler::search::generate_with(name, topo, coll, p, in_place)
                                .expect("a known family");
                        let c = cands.first().expect(&what);
                        assert_eq!(c.symmetry.as_ref(), Some(&sym), "{what}");
                        let compact = c.schedule.compress(&sym);
                        assert!(compact.is_some(), "{what}: does not compress");
                    }
                }
            }
        }
    }
}

/// The check above can fail: a halving-doubling schedule is not invariant under cyclic host
/// translations, nor an AllReduce under rank-block chunk moves.
#[test]
fn wrong_symmetries_do_not_compress() {
    let topo = cluster(4);
    let p = PARAMS[0];
    let coll = Collective::AllReduce;
    let s = HierarchicalHd
        .generate(&topo, coll, p)
        .pop()
        .expect("a schedule")
        .schedule;
    let good = HierarchicalHd.symmetry(&topo, coll, p).expect("a symmetry");
    assert!(s.compress(&good).is_some());
    let mut cyclic = good.clone();
    cyclic.actions[0] = hccl_ir::Action::Cyclic;
    assert!(s.compress(&cyclic).is_none());
    let mut blocks = good;
    blocks.chunks = Some(hccl_ir::ChunkMap {
        layout: hccl_ir::BlockLayout::BlockMajor,
        label: hccl_ir::BlockLabel::Rank,
    });
    assert!(s.compress(&blocks).is_none());
}

/// From `TEMPLATE_RANKS` ranks a compile keeps the winner as its template (never building
/// every rank's program): the plan is written in symmetric form, reads back as exactly the
/// template's expansion, verifies, carries seals that match what was read, and one rank's
/// load gives that rank's translate of the template.
#[test]
fn template_winners_round_trip_through_plan_files() {
    use hccl_compiler::search::{self, Options};
    use hccl_ir::{CollectiveKind, PlanFile};
    let topo = cluster(32);
    assert!(topo.nranks() >= hccl_compiler::families::TEMPLATE_RANKS);
    let options = Options {
        collectives: vec![CollectiveKind::AllReduce],
        sizes: vec![1 << 30],
        algorithms: Some(vec!["hierarchical_hd".to_string()]),
        ..Options::default()
    };
    let compiled = search::compile(&topo, &options).expect("compiles");
    let entry = &compiled.plan.entries[0];
    let template = entry
        .template
        .as_ref()
        .expect("the winner is held as its template");
    assert!(entry.schedule.ranks.iter().all(|r| r.streams.is_empty()));
    assert!(entry.is_compact());
    let text = compiled.plan.to_ron();
    let read = PlanFile::from_ron(&text, "test").expect("reads back");
    let whole = template.expand().expect("expands");
    assert_eq!(read.entries[0].schedule, whole);
    assert_eq!(read.entries[0].template, None);
    assert!(
        read.sealed().iter().all(|&s| s),
        "the seals match what was read"
    );
    hccl_ir::verify::verify_plan(&read).expect("verifies");
    let mut held = entry.clone();
    held.expand_template().expect("expands");
    assert_eq!(held.schedule, whole);
    let dir = std::env::temp_dir().join(format!("hccl-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.ron");
    compiled.plan.save(&path).expect("saved");
    let rank = 100;
    let part = PlanFile::load_for_ranks(&path, &[rank]).expect("one rank loads");
    assert_eq!(
        part.plan.entries[0].schedule.ranks[rank as usize],
        whole.ranks[rank as usize]
    );
    assert!(part.identity().is_some(), "sealed");
    // The compact load (`hcclc verify`): the template itself, never expanded, with the
    // expansion's step and channel counts, sealed, and the same verifier report.
    let compact = PlanFile::load_compact(&path).expect("loads compact");
    let held = &compact.entries[0];
    assert_eq!(held.template.as_deref(), Some(template.as_ref()));
    assert!(held.schedule.ranks.iter().all(|r| r.streams.is_empty()));
    assert_eq!(held.schedule.nranks, whole.nranks);
    assert_eq!(held.step_count(), whole.step_count());
    assert_eq!(held.channel_count(), whole.channel_count());
    assert!(compact.sealed().iter().all(|&s| s), "sealed");
    assert_eq!(
        hccl_ir::verify::verify_entry(held).expect("verifies"),
        hccl_ir::verify::verify_entry(&read.entries[0]).expect("verifies")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recursive doubling against halving-doubling on four DGX H100 boxes (32 ranks): the
/// search, offered both, picks recursive doubling where the rail's rounds dominate (half as
/// many network messages: 1 KiB to 1 MiB) and halving-doubling where its bytes do (each of
/// its rounds carries part of the share: 1 GiB); every winner verifies as compiled.
#[test]
fn recursive_doubling_wins_where_rail_rounds_dominate() {
    use hccl_compiler::search::{self, Options};
    use hccl_ir::CollectiveKind;
    let topo = cluster(4);
    let small = [1u64 << 10, 64 << 10, 1 << 20];
    let large = 1u64 << 30;
    let mut sizes = small.to_vec();
    sizes.push(large);
    let options = Options {
        collectives: vec![CollectiveKind::AllReduce],
        sizes,
        algorithms: Some(vec![
            "hierarchical_hd".to_string(),
            "hierarchical_rd".to_string(),
        ]),
        ..Options::default()
    };
    let compiled = search::compile(&topo, &options).expect("compiles");
    for row in &compiled.rows {
        let want = if row.bytes == large {
            "hierarchical_hd"
        } else {
            "hierarchical_rd"
        };
        assert_eq!(row.algorithm, want, "{} bytes", row.bytes);
    }
    assert_eq!(compiled.rows.len(), 4);
    hccl_ir::verify::verify_plan(&compiled.plan).expect("the plan verifies");
}

fn rd_params(channels: u32, pipeline: u32) -> FamilyParams {
    FamilyParams { channels, pipeline }
}

/// Messages rank `r` sends to ranks of other hosts.
fn rail_sends(topo: &Topology, s: &hccl_ir::Schedule, r: hccl_ir::Rank) -> usize {
    s.ranks[r as usize]
        .streams
        .iter()
        .flat_map(|st| st.steps.iter())
        .filter_map(|step| step.op.send_peer())
        .filter(|&p| topo.host_of[p as usize] != topo.host_of[r as usize])
        .count()
}

/// Recursive doubling AllReduce verifies (both placements, pipelined, two connections)
/// on 2, 4 and 8 DGX H100 boxes, is invariant under its claimed symmetry, and sends
/// `log2 hosts` rail messages per rank and piece: half of halving-doubling's.
#[test]
fn recursive_doubling_allreduce_verifies() {
    for nodes in [2u32, 4, 8] {
        let topo = cluster(nodes);
        for p in [rd_params(1, 1), rd_params(2, 1), rd_params(1, 3)] {
            for in_place in [false, true] {
                let c = HierarchicalRd.schedules(&topo, Collective::AllReduce, p, in_place);
                assert_eq!(c.len(), 1, "{nodes} nodes {p:?}");
                let s = &c[0].schedule;
                if let Err(e) = verify(s) {
                    panic!("{nodes} nodes {p:?} in_place={in_place}: {:?}", &e[..1]);
                }
                let sym = c[0].symmetry.as_ref().expect("claims a symmetry");
                let compact = s.compress(sym).expect("is symmetric");
                assert!(hccl_ir::verify::verify_symmetric(&compact).is_ok());
                let est = HierarchicalRd
                    .estimated_steps(&topo, Collective::AllReduce, p)
                    .expect("an estimate");
                let real = s.step_count() as u64;
                assert!(est <= 2 * real && real <= 2 * est, "{est} vs {real}");
                let pieces = (p.channels * p.pipeline) as usize;
                let rounds = nodes.trailing_zeros() as usize;
                assert_eq!(rail_sends(&topo, s, 0), rounds * pieces);
                let hd = HierarchicalHd.schedules(&topo, Collective::AllReduce, p, in_place);
                assert_eq!(rail_sends(&topo, &hd[0].schedule, 0), 2 * rounds * pieces);
            }
        }
    }
}

/// Only AllReduce, and only on a power-of-two number of hosts.
#[test]
fn recursive_doubling_applies_to_allreduce_on_powers_of_two() {
    let three = cluster(3);
    assert!(
        HierarchicalRd
            .param_space(&three, Collective::AllReduce)
            .is_empty()
    );
    let p = rd_params(1, 1);
    assert!(
        HierarchicalRd
            .schedules(&three, Collective::AllReduce, p, false)
            .is_empty()
    );
    let four = cluster(4);
    assert!(!HierarchicalRd.supports(hccl_ir::CollectiveKind::AllGather));
    assert!(!HierarchicalRd.supports(hccl_ir::CollectiveKind::ReduceScatter));
    assert!(
        HierarchicalRd
            .schedules(&four, Collective::AllGather, p, false)
            .is_empty()
    );
    assert!(
        HierarchicalRd
            .symmetry(&four, Collective::AllGather, p)
            .is_none()
    );
    assert!(
        !HierarchicalRd
            .param_space(&four, Collective::AllReduce)
            .is_empty()
    );
}

/// From `TEMPLATE_RANKS` ranks the family is built as its template: the same template the
/// whole schedule compresses to, and it verifies on its own.
#[test]
fn recursive_doubling_template_is_the_compressed_schedule() {
    let topo = cluster(32);
    assert!(topo.nranks() >= hccl_compiler::families::TEMPLATE_RANKS);
    let p = rd_params(2, 2);
    let coll = Collective::AllReduce;
    let whole = HierarchicalRd.generate(&topo, coll, p).remove(0);
    let compact = whole
        .schedule
        .compress(whole.symmetry.as_ref().expect("a symmetry"))
        .expect("is symmetric");
    let tmpl = HierarchicalRd.template(&topo, coll, p).expect("templates");
    let t = tmpl[0].template.as_ref().expect("a template");
    assert_eq!(**t, compact);
    assert!(tmpl[0].verify().is_ok());
}
