//! Short perf sweep of the CUDA backend (run by `scripts/gpu-check.sh`): AllReduce f32 sum,
//! 8 ranks on one GPU, at 8 B, 1 MiB, 64 MiB and 1 GiB (busbw as nccl-tests), the device's
//! device-to-device copy bandwidth in the same run, and the per-call time at 8 B with and
//! without CUDA Graphs; then AllToAll against AllToAllv of the same (equal) blocks and of
//! skewed blocks at 1 MiB and 64 MiB per rank. Without a device it prints why and exits 0.
//!
//! Usage: `cargo run --release --features cuda --example cuda_perf [-- RANKS]`

use hccl_executor::cuda::{
    BlockLayout, Call, CudaGroup, DeviceMap, VCall, memcpy_bandwidth, probe,
};
use hccl_executor::{DataType, ReduceOp, fallback};
use hccl_ir::{Collective, CollectiveKind};

fn main() {
    if let Err(e) = run() {
        eprintln!("cuda_perf: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let info = match probe() {
        Ok(i) => i,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(8);
    println!(
        "device: {} (sm_{}{}), {} device(s); {n} ranks on device 0",
        info.name, info.compute_capability.0, info.compute_capability.1, info.count
    );
    let (secs, gbps) = memcpy_bandwidth(0, 1 << 30, 20)?;
    println!(
        "d2d memcpy 1 GiB: {:.1} us, {:.1} GB/s copied ({:.1} GB/s read+write)",
        secs * 1e6,
        gbps,
        2.0 * gbps
    );
    let plan = fallback::plan_with(n, 2, 1);
    let mut g = CudaGroup::new(&plan, n, DeviceMap::single(0, n))?;
    println!(
        "kernel compile+load: {:.1} ms",
        g.warm_kernels()?.as_secs_f64() * 1e3
    );
    let factor = CollectiveKind::AllReduce.busbw_factor(n);
    println!(
        "{:>12} {:>12} {:>6} {:>12} {:>10} {:>10}",
        "bytes", "count", "graph", "time_us", "algbw", "busbw"
    );
    for bytes in [8usize, 1 << 20, 64 << 20, 1 << 30] {
        let call = Call {
            collective: Collective::AllReduce,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            count: bytes / 4,
            in_place: false,
        };
        g.fill_inputs(&call, 0x3c)?;
        let iters = if bytes >= 64 << 20 { 5 } else { 50 };
        for graph in [false, true] {
            let us = g.time_call(&call, graph, iters)?;
            let algbw = bytes as f64 / (us * 1e-6) / 1e9;
            println!(
                "{bytes:>12} {:>12} {:>6} {us:>12.2} {algbw:>10.2} {:>10.2}",
                call.count,
                graph,
                algbw * factor
            );
        }
        let low = g.lowered(&call)?;
        println!(
            "    lowered: {} queues, {} commands ({} copies/kernels), {} staging areas",
            low.queues.len(),
            low.cmds.len(),
            low.work_commands(),
            low.staging.len()
        );
    }
    // AllToAll vs AllToAllv: equal blocks (the same bytes as the AllToAll) and skewed ones
    // (block r→p of (1 + (r + p) % 4) / 2.5 of the average, same total).
    println!(
        "{:>12} {:>10} {:>6} {:>12}",
        "bytes/rank", "kind", "graph", "time_us"
    );
    let nn = n as usize;
    for bytes in [1usize << 20, 64 << 20] {
        let blk = bytes / 4 / nn;
        let call = Call {
            collective: Collective::AllToAll,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            count: blk * nn,
            in_place: false,
        };
        g.fill_inputs(&call, 0x3c)?;
        let equal = VCall {
            dtype: DataType::F32,
            layout: BlockLayout::packed(vec![vec![blk; nn]; nn]),
        };
        let skewed = VCall {
            dtype: DataType::F32,
            layout: BlockLayout::packed(
                (0..nn)
                    .map(|r| (0..nn).map(|p| blk * 2 * (1 + (r + p) % 4) / 5).collect())
                    .collect(),
            ),
        };
        let iters = if bytes >= 64 << 20 { 5 } else { 50 };
        for graph in [false, true] {
            let us = g.time_call(&call, graph, iters)?;
            println!("{bytes:>12} {:>10} {graph:>6} {us:>12.2}", "alltoall");
            for (name, v) in [("equal-v", &equal), ("skewed-v", &skewed)] {
                let us = g.time_call_v(v, graph, iters)?;
                println!("{bytes:>12} {name:>10} {graph:>6} {us:>12.2}");
            }
        }
    }
    Ok(())
}
