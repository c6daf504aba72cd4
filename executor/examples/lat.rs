//! Quick latency probe: `cargo run --release -p hccl-executor --example lat -- RANKS ELEMS ITERS`.
use hccl_executor::{Config, ReduceOp, ThreadGroup, fallback};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or(0))
        .collect();
    let n = *args.first().unwrap_or(&2) as u32;
    let elems = *args.get(1).unwrap_or(&2);
    let iters = *args.get(2).unwrap_or(&10000);
    let comms =
        ThreadGroup::with_config(fallback::plan(n), n, Config::from_env().unwrap()).unwrap();
    let t = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let input = vec![1.0f32; elems];
                    let mut out = vec![0.0f32; elems];
                    for _ in 0..iters / 10 {
                        c.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
                    }
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
                    }
                    t0.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    let us = t.as_secs_f64() * 1e6 / iters as f64;
    let bytes = (elems * 4) as f64;
    let busbw = bytes * 2.0 * (n as f64 - 1.0) / n as f64 / (us * 1e3);
    println!(
        "n={n} bytes={} time={us:.2}us busbw={busbw:.2}GB/s",
        elems * 4
    );
}
