//! Threads-backend AllReduce (f32, sum) on 2 and 4 ranks at 8 B, 64 KiB, 1 MiB and 32 MiB.
//!
//! Rank 0 runs in the benchmark thread; the other ranks are persistent threads that run the
//! same number of iterations whenever criterion asks for a measurement.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hccl_executor::{Communicator, Config, ReduceOp, ThreadGroup, fallback};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Group {
    rank0: Communicator,
    helpers: Vec<(mpsc::Sender<u64>, mpsc::Receiver<()>)>,
    handles: Vec<std::thread::JoinHandle<()>>,
    input: Vec<f32>,
    output: Vec<f32>,
}

impl Group {
    fn new(n: u32, elems: usize) -> Group {
        let mut comms = ThreadGroup::with_config(fallback::plan(n), n, Config::default())
            .expect("thread group");
        let rank0 = comms.remove(0);
        let mut helpers = Vec::new();
        let mut handles = Vec::new();
        for mut comm in comms {
            let (go_tx, go_rx) = mpsc::channel::<u64>();
            let (done_tx, done_rx) = mpsc::channel::<()>();
            handles.push(std::thread::spawn(move || {
                let input = vec![1.0f32; elems];
                let mut output = vec![0.0f32; elems];
                while let Ok(iters) = go_rx.recv() {
                    for _ in 0..iters {
                        comm.all_reduce(&input, &mut output, ReduceOp::Sum)
                            .expect("allreduce");
                    }
                    let _ = done_tx.send(());
                }
            }));
            helpers.push((go_tx, done_rx));
        }
        Group {
            rank0,
            helpers,
            handles,
            input: vec![1.0; elems],
            output: vec![0.0; elems],
        }
    }

    fn run(&mut self, iters: u64) -> Duration {
        for (go, _) in &self.helpers {
            go.send(iters).expect("helper alive");
        }
        let start = Instant::now();
        for _ in 0..iters {
            self.rank0
                .all_reduce(&self.input, &mut self.output, ReduceOp::Sum)
                .expect("allreduce");
        }
        let t = start.elapsed();
        for (_, done) in &self.helpers {
            done.recv().expect("helper finished");
        }
        t
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.helpers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn allreduce(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads_allreduce_f32_sum");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(20);
    for n in [2u32, 4] {
        for bytes in [8usize, 64 << 10, 1 << 20, 32 << 20] {
            let elems = bytes / 4;
            let mut group = Group::new(n, elems);
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{n}ranks"), bytes),
                &bytes,
                |b, _| b.iter_custom(|iters| group.run(iters)),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, allreduce);
criterion_main!(benches);
