//! Compile time of AllReduce plans on clusters of DGX H100 boxes: 8 ranks (one box), 64, 1024
//! and 4096 ranks. 8 and 64 ranks use the default sizes (1 KiB..4 GiB, factor 2); 1024 and
//! 4096 ranks use three sizes (1 KiB, 1 MiB, 1 GiB) to keep a benchmark run short: there the
//! per-candidate simulation budget already limits a candidate to a few simulated sizes, and
//! generation, screening and verification do not depend on the number of sizes. Rank-symmetric
//! families whose schedules grow as ranks² are not generated beyond the search's step cap
//! (`search::MAX_CANDIDATE_STEPS`).

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
    for nodes in [1u32, 8, 128, 512] {
        let topo = cluster(nodes);
        let sizes = if nodes <= 8 {
            Options::default().sizes
        } else {
            search::geometric_sizes(1 << 10, 4 << 30, 1024)
        };
        let opts = Options {
            collectives: vec![CollectiveKind::AllReduce],
            sizes,
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
