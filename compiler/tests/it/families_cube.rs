//! The `hybrid_cube` family: embeddings (direct links only on the DGX-1 hybrid cube-mesh,
//! doubled links for the first halving step), verified schedules for 2..=16 ranks including
//! non-powers of two, both buffer arrangements, channels and pipelining.

use hccl_compiler::families::FamilyParams;
use hccl_compiler::families::cube::{CubeEmbedding, embed};
use hccl_compiler::search::generate_with;
use hccl_ir::verify::verify;
use hccl_ir::{Collective, Schedule};
use hccl_topologies::{Topology, build, generate, shipped_by_name};

const COLLECTIVES: [Collective; 3] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
];

fn params(channels: u32, pipeline: u32) -> FamilyParams {
    FamilyParams { channels, pipeline }
}

fn cube(topo: &Topology, coll: Collective, p: FamilyParams, in_place: bool) -> Vec<Schedule> {
    generate_with("hybrid_cube", topo, coll, p, in_place)
        .expect("registered")
        .into_iter()
        .map(|c| {
            assert_eq!(c.algorithm, "hybrid_cube");
            c.schedule
        })
        .collect()
}

/// Generates and verifies every collective × arrangement × params; returns the count.
fn verify_all(name: &str, topo: &Topology, grid: &[FamilyParams]) -> usize {
    let mut checked = 0;
    for coll in COLLECTIVES {
        for &p in grid {
            for in_place in [false, true] {
                let got = cube(topo, coll, p, in_place);
                assert_eq!(got.len(), 1, "{name} {coll} {p:?} in_place={in_place}");
                for s in got {
                    assert_eq!(
                        (s.nranks, s.in_place, s.collective),
                        (topo.nranks(), in_place, coll)
                    );
                    if let Err(errs) = verify(&s) {
                        panic!(
                            "{name} {coll} {p:?} in_place={in_place}: {}",
                            errs.iter()
                                .take(3)
                                .map(|e| e.to_string())
                                .collect::<Vec<_>>()
                                .join(" | ")
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    checked
}

/// Every pair of ranks that exchange messages in `s`.
fn peers(s: &Schedule) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for (r, prog) in s.ranks.iter().enumerate() {
        for st in prog.streams.iter().flat_map(|x| &x.steps) {
            if let Some(p) = st.op.send_peer() {
                out.push((r as u32, p));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn host(n: u32) -> Topology {
    build(generate::host(n, 10.0), "t").unwrap()
}

fn torus(dims: &[u32]) -> Topology {
    build(generate::torus(dims, 25.0, 0.3), "t").unwrap()
}

#[test]
fn host_topologies_2_to_16_verify() {
    let mut checked = 0;
    for n in 2..=16 {
        let grid: &[FamilyParams] = if n <= 8 {
            &[params(1, 1), params(2, 2), params(3, 1)]
        } else {
            &[params(1, 1), params(2, 2)]
        };
        checked += verify_all(&format!("host{n}"), &host(n), grid);
    }
    assert_eq!(checked, 7 * 3 * 3 * 2 + 8 * 2 * 3 * 2);
}

#[test]
fn dgx1_embedding_uses_direct_links_and_doubled_first_dimension() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let emb: CubeEmbedding = embed(&topo).expect("the hybrid cube-mesh embeds a 3-cube");
    assert_eq!(emb.dims(), 3);
    assert!(emb.extra.iter().all(Option::is_none));
    let mut core = emb.core.clone();
    core.sort_unstable();
    assert_eq!(core, (0..8).collect::<Vec<_>>());
    // Every exchange partner at every dimension is a direct NVLink neighbour.
    for x in 0..8usize {
        for b in 0..3 {
            let y = x ^ (1 << b);
            assert!(
                topo.direct_edge(emb.core[x], emb.core[y]).is_some(),
                "labels {x} and {y}: ranks {} and {}",
                emb.core[x],
                emb.core[y]
            );
        }
    }
    // The first halving step (half the buffer) runs over doubled links only (2 × 25 GB/s).
    assert_eq!(emb.dim_bw, vec![50.0, 25.0, 25.0]);
    let first = emb.order[0];
    for x in 0..8usize {
        let y = x ^ (1 << first);
        let e = topo.direct_edge(emb.core[x], emb.core[y]).unwrap();
        assert_eq!(topo.graph[e].count, 2);
    }
    // The generated schedules only talk over direct links and verify.
    for coll in COLLECTIVES {
        for s in cube(&topo, coll, params(2, 2), false) {
            for (a, b) in peers(&s) {
                assert!(topo.direct_edge(a, b).is_some(), "{coll}: {a} -> {b}");
            }
        }
    }
    verify_all(
        "dgx1",
        &topo,
        &[params(1, 1), params(2, 1), params(3, 2), params(1, 4)],
    );
}

#[test]
fn channels_use_different_dimensions_first() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let emb = embed(&topo).unwrap();
    let s = &cube(&topo, Collective::ReduceScatter, params(3, 1), false)[0];
    // Rank core[0]'s first send on each channel goes across a different dimension.
    let r0 = emb.core[0];
    let mut first_peer = [None; 3];
    for st in s.ranks[r0 as usize].streams.iter() {
        for step in &st.steps {
            if let Some(p) = step.op.send_peer() {
                first_peer[st.channel as usize].get_or_insert(p);
            }
        }
    }
    let want: Vec<Option<u32>> = (0..3).map(|c| Some(emb.core[1 << emb.order[c]])).collect();
    let mut got = first_peer.to_vec();
    let mut want_sorted = want.clone();
    got.sort_unstable();
    want_sorted.sort_unstable();
    assert_eq!(got, want_sorted);
}

#[test]
fn tori_and_rings() {
    // Power-of-two tori are hypercubes or contain them.
    for dims in [&[2u32, 2][..], &[2, 4], &[2, 2, 2], &[4, 4], &[2, 2, 2, 2]] {
        let topo = torus(dims);
        let emb = embed(&topo).unwrap_or_else(|| panic!("torus {dims:?}"));
        for x in 0..emb.core.len() {
            for b in 0..emb.dims() {
                let y = x ^ (1 << b);
                assert!(topo.direct_edge(emb.core[x], emb.core[y]).is_some());
            }
        }
        verify_all(
            &format!("torus{dims:?}"),
            &topo,
            &[params(1, 1), params(2, 2)],
        );
    }
    // 64-rank tori that are 6-cubes: found without backtracking.
    for dims in [&[4u32, 4, 4][..], &[4, 4, 2, 2]] {
        let emb = embed(&torus(dims)).unwrap_or_else(|| panic!("torus {dims:?}"));
        assert_eq!((emb.core.len(), emb.dim_bw.clone()), (64, vec![25.0; 6]));
    }
    // Non-powers of two that embed: the extras fold into a neighbour.
    for dims in [&[3u32, 2][..], &[3, 4], &[2, 2, 3]] {
        let topo = torus(dims);
        let emb = embed(&topo).unwrap_or_else(|| panic!("torus {dims:?}"));
        for (x, e) in emb.extra.iter().enumerate() {
            if let Some(e) = e {
                assert!(topo.direct_edge(emb.core[x], *e).is_some());
            }
        }
        verify_all(
            &format!("torus{dims:?}"),
            &topo,
            &[params(1, 1), params(2, 2)],
        );
    }
    // No embedding: a 5-ring has no 4-cycle, an 8-ring or 8x2 torus no 3-/4-cube, a 3x3
    // or 5x2 torus no 3-cube with the extra ranks next to distinct cube ranks.
    for topo in [
        build(generate::ring(5, 25.0, 0.3), "t").unwrap(),
        build(generate::ring(8, 25.0, 0.3), "t").unwrap(),
        torus(&[8, 2]),
        torus(&[3, 3]),
        torus(&[5, 2]),
    ] {
        assert!(embed(&topo).is_none(), "{}", topo.name);
        for coll in COLLECTIVES {
            assert!(cube(&topo, coll, params(1, 1), false).is_empty());
        }
    }
    // Rings of 2, 3 and 4 do embed.
    for n in [2u32, 3, 4] {
        let topo = build(generate::ring(n, 25.0, 0.3), "t").unwrap();
        verify_all(&format!("ring{n}"), &topo, &[params(1, 1), params(2, 2)]);
    }
}

#[test]
fn unsupported_collectives_and_single_rank() {
    let topo = host(4);
    for coll in [
        Collective::AllToAll,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 1 },
    ] {
        assert!(cube(&topo, coll, params(1, 1), false).is_empty());
    }
    let one = host(1);
    for coll in COLLECTIVES {
        for in_place in [false, true] {
            for s in cube(&one, coll, params(1, 1), in_place) {
                verify(&s).unwrap();
            }
        }
    }
}

#[test]
fn switched_cluster_labels_hosts_contiguously() {
    // Two DGX-1s over InfiniBand: the first three dimensions stay inside a box.
    let topo = shipped_by_name("azure-ndv2-2node").unwrap();
    let emb = embed(&topo).unwrap();
    assert_eq!(emb.dims(), 4);
    let last = *emb.order.last().unwrap();
    for x in 0..16usize {
        for &b in &emb.order[..3] {
            let y = x ^ (1 << b);
            assert_eq!(
                topo.host_of[emb.core[x] as usize],
                topo.host_of[emb.core[y] as usize]
            );
        }
        let y = x ^ (1 << last);
        assert_ne!(
            topo.host_of[emb.core[x] as usize],
            topo.host_of[emb.core[y] as usize]
        );
    }
    verify_all("ndv2x2", &topo, &[params(1, 1), params(2, 1)]);
}

#[test]
fn generation_is_deterministic() {
    let topo = shipped_by_name("dgx1-v100").unwrap();
    let a = cube(&topo, Collective::AllReduce, params(2, 2), true);
    let b = cube(&topo, Collective::AllReduce, params(2, 2), true);
    assert_eq!(a, b);
}
