//! Compile time of AllReduce plans (default sizes 1 KiB..4 GiB) on clusters of DGX H100 boxes,
//! and the simulator alone on one candidate.

use criterion::{Criterion, criterion_group, criterion_main};
use hccl_compiler::search::{self, Options};
use hccl_ir::CollectiveKind;
use hccl_topologies::Topology;
use std::hint::black_box;

fn cluster(nodes: u32) -> Topology {
    let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
    let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
    if nodes == 1 {
        return hccl_topologies::build(spec, "dgx-h100").expect("builds");
    }
    hccl_topologies::build(hccl_topologies::generate::cluster(nodes, &spec), "cluster")
        .expect("cluster builds")
}

fn bench_compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile_allreduce");
    group.sample_size(10);
    // 8 and 64 ranks: every family. (1024 and 4096 ranks are out of reach of the current
    // families' schedule sizes; see the report.)
    for nodes in [1u32, 8] {
        let topo = cluster(nodes);
        let opts = Options {
            collectives: vec![CollectiveKind::AllReduce],
            ..Options::default()
        };
        group.bench_function(format!("{}_ranks", topo.nranks()), |b| {
            b.iter(|| black_box(search::compile(&topo, &opts).expect("compiles")))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_compile);
criterion_main!(benches);
