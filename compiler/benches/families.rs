//! Schedule generation time of every family on rail-optimised DGX H100 clusters.
//!
//! - `families_64/<family>`: 8 × DGX H100 (64 ranks), one generation per family (AllReduce,
//!   or AllToAll for the AllToAll-only families), one channel, no pipelining;
//! - `families_1024/<family>`: the same on 128 × DGX H100 (1024 ranks);
//! - `hierarchical_1024/allreduce_c2p2`: the hierarchical AllReduce over 1024 ranks with two
//!   channels and two pipeline pieces.

use criterion::{Criterion, criterion_group, criterion_main};
use hccl_compiler::families::{Family, FamilyParams};
use hccl_compiler::search::all_families;
use hccl_ir::{Collective, CollectiveKind};
use hccl_topologies::{Topology, build, generate, parse_spec, shipped_text};
use std::hint::black_box;
use std::time::Duration;

fn cluster(nodes: u32) -> Topology {
    let text = shipped_text("dgx-h100").expect("shipped dgx-h100");
    let spec = parse_spec(text, "dgx-h100").expect("dgx-h100 parses");
    build(generate::cluster(nodes, &spec), "bench").expect("cluster builds")
}

fn collective_for(f: &dyn Family) -> Collective {
    if f.supports(CollectiveKind::AllReduce) {
        Collective::AllReduce
    } else {
        Collective::AllToAll
    }
}

const ONE: FamilyParams = FamilyParams {
    channels: 1,
    pipeline: 1,
};

fn bench(c: &mut Criterion) {
    for (group, nodes) in [("families_64", 8u32), ("families_1024", 128)] {
        let topo = cluster(nodes);
        let mut g = c.benchmark_group(group);
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(if nodes > 8 { 20 } else { 5 }));
        for f in all_families() {
            let coll = collective_for(f.as_ref());
            g.bench_function(f.name(), |b| {
                b.iter(|| black_box(f.generate(&topo, coll, ONE)));
            });
        }
        g.finish();
    }
    let topo = cluster(128);
    let mut g = c.benchmark_group("hierarchical_1024");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    let hier = all_families()
        .into_iter()
        .find(|f| f.name() == "hierarchical")
        .expect("registered");
    g.bench_function("allreduce_c2p2", |b| {
        b.iter(|| {
            black_box(hier.generate(
                &topo,
                Collective::AllReduce,
                FamilyParams {
                    channels: 2,
                    pipeline: 2,
                },
            ))
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
