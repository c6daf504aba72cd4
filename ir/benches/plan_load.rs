//! Parse and verify large plans.
//!
//! - `verify/ring_allreduce_1024`: a ring AllReduce over 1024 ranks with one chunk per rank
//!   (2047 steps per rank, 2 096 128 steps, 1024 chunks per buffer), verified in memory.
//! - `parse+verify/ring_allreduce_128`: the same construction over 128 ranks with two
//!   channels (65 280 steps), parsed from RON text and verified.
//! - `parse+verify/chain_broadcast_1024`: a pipelined chain Broadcast over 1024 ranks, two
//!   channels, 8 pieces each (16 400 steps), parsed and verified.
//! - `parse+verify/direct_alltoall_64_in_place`: all-pairs AllToAll over 64 ranks, two
//!   channels with dependencies on a scratch copy (16 192 steps), parsed and verified.
//! - `load_1024/{explicit,symmetric}/{full,rank_517}`: the 1024-rank ring AllReduce of
//!   `verify/ring_allreduce_1024` written as a plan in the explicit form (every rank's
//!   program) and in the symmetric form (one template and a cyclic symmetry), parsed whole
//!   (`PlanFile::from_ron`, which expands the symmetric form) and for one rank
//!   (`PlanFile::from_ron_for_rank`). The two file sizes are printed once.
//! - `load_chain_1024/{full,rank_517}`: a pipelined chain Broadcast over 1024 ranks (two
//!   channels, 32 pieces each), a few MB of explicit plan like a compiled k-ary tree entry,
//!   parsed whole and for one rank (where the other ranks' programs are skipped by a byte
//!   scan before parsing). Its size is printed once.

#[path = "../tests/it/common/mod.rs"]
mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use hccl_ir::verify::verify_report;
use hccl_ir::{
    BlockLabel, BlockLayout, ChunkMap, PlanEntry, PlanFile, PlanMeta, Protocol, Schedule, Symmetry,
};
use std::hint::black_box;
use std::time::Duration;

fn plan_text(schedule: Schedule) -> String {
    plan_text_with(schedule, None)
}

fn plan_text_with(schedule: Schedule, symmetry: Option<Symmetry>) -> String {
    let mut plan = PlanFile::new(PlanMeta {
        topology: "bench".to_string(),
        topology_hash: String::new(),
        compiler: "bench".to_string(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "bench".to_string(),
        protocol: Protocol::Simple,
        cost: None,
        symmetry,
        synthesis: None,
        schedule,
        template: None,
    });
    plan.to_ron()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let ring = common::ring_allreduce(1024, 1, 1, false);
    assert_eq!(ring.step_count(), 1024 * 2047);
    group.bench_function("ring_allreduce_1024", |b| {
        b.iter(|| verify_report(black_box(&ring)).expect("verifies"))
    });
    group.finish();

    let mut group = c.benchmark_group("parse+verify");
    group.sample_size(10);
    for (name, schedule) in [
        (
            "ring_allreduce_128",
            common::ring_allreduce(128, 1, 2, false),
        ),
        (
            "chain_broadcast_1024",
            common::ring_broadcast(1024, 0, 1, 2, 8, false),
        ),
        (
            "direct_alltoall_64_in_place",
            common::direct_alltoall(64, 1, 2, true),
        ),
    ] {
        let steps = schedule.step_count();
        assert_eq!(
            steps,
            match name {
                "ring_allreduce_128" => 65_280,
                "chain_broadcast_1024" => 16_400,
                _ => 16_192,
            }
        );
        let text = plan_text(schedule);
        group.bench_function(name, |b| {
            b.iter(|| {
                let plan = PlanFile::from_ron(black_box(&text), name).expect("parses");
                hccl_ir::verify::verify_plan(&plan).expect("verifies");
            })
        });
    }
    group.finish();
}

fn bench_symmetric(c: &mut Criterion) {
    let n = 1024;
    let ring = common::ring_allreduce(n, 1, 1, false);
    let symmetry = Symmetry::ring(
        (0..n).collect(),
        Some(ChunkMap {
            layout: BlockLayout::BlockMajor,
            label: BlockLabel::Rank,
        }),
    );
    assert!(
        ring.compress(&symmetry).is_some(),
        "the ring is rank-symmetric"
    );
    let texts = [
        ("explicit", plan_text_with(ring.clone(), None)),
        ("symmetric", plan_text_with(ring, Some(symmetry))),
    ];
    for (form, text) in &texts {
        eprintln!(
            "load_1024/{form}: {} bytes ({:.2} MB)",
            text.len(),
            text.len() as f64 / 1e6
        );
    }
    let mut group = c.benchmark_group("load_1024");
    group.sample_size(10);
    for (form, text) in &texts {
        group.bench_function(format!("{form}/full"), |b| {
            b.iter(|| PlanFile::from_ron(black_box(text), "bench").expect("parses"))
        });
        group.bench_function(format!("{form}/rank_517"), |b| {
            b.iter(|| PlanFile::from_ron_for_rank(black_box(text), "bench", 517).expect("parses"))
        });
    }
    group.finish();
}

fn bench_explicit_one_rank(c: &mut Criterion) {
    let text = plan_text(common::ring_broadcast(1024, 0, 1, 2, 32, false));
    eprintln!(
        "load_chain_1024: {} bytes ({:.2} MB)",
        text.len(),
        text.len() as f64 / 1e6
    );
    let mut group = c.benchmark_group("load_chain_1024");
    group.sample_size(10);
    group.bench_function("full", |b| {
        b.iter(|| PlanFile::from_ron(black_box(&text), "bench").expect("parses"))
    });
    group.bench_function("rank_517", |b| {
        b.iter(|| PlanFile::from_ron_for_rank(black_box(&text), "bench", 517).expect("parses"))
    });
    group.finish();
}

criterion_group!(benches, bench, bench_symmetric, bench_explicit_one_rank);
criterion_main!(benches);
