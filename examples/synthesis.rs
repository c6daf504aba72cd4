//! Synthesizing a Broadcast for a machine of your own: the LP tree packing finds the trees and
//! their rates, its dual proves how good they are, and the lowered schedule is verified,
//! simulated and compared with what the hand-written families reach.
//!
//! The machine: six GPUs on a ring of fast links (100 GB/s) with two slower chords (25 GB/s)
//! across it. At 1 GiB the best hand-written Broadcast (a ring) takes 1.5× the lower bound;
//! the packing reaches the max-flow rate with four trees, two of them over the chords, and
//! its schedule comes within a few percent of the bound. AllReduce there needs unequal
//! blocks: the two GPUs without a chord have less ingress, and trees carrying data both ways
//! with blocks as large as their rates reach the gossip bound that equal blocks miss by 8%.
//!
//! Run with `cargo run --release --example synthesis`.

use hccl::compiler::cost::{CostModel, Network, Simulator, bounds};
use hccl::compiler::search::{self, Options};
use hccl::compiler::synth::{self, Direction, SynthLevel};
use hccl::ir::verify::verify;
use hccl::ir::{Collective, CollectiveKind};

const MACHINE: &str = r#"(
  name: "chorded-ring-6",
  description: "6 GPUs on a 100 GB/s ring with two 25 GB/s chords",
  hosts: [(id: "host0", devices: [
    (id: "gpu0", kind: Gpu), (id: "gpu1", kind: Gpu), (id: "gpu2", kind: Gpu),
    (id: "gpu3", kind: Gpu), (id: "gpu4", kind: Gpu), (id: "gpu5", kind: Gpu),
  ])],
  links: [
    (a: "gpu0", b: "gpu1", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu1", b: "gpu2", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu2", b: "gpu3", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu3", b: "gpu4", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu4", b: "gpu5", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu5", b: "gpu0", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu0", b: "gpu3", kind: NvLink, bw: 25.0, latency: 1.0),
    (a: "gpu1", b: "gpu4", kind: NvLink, bw: 25.0, latency: 1.0),
  ],
)"#;

const GIB: u64 = 1 << 30;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = hccl::topologies::parse_spec(MACHINE, "chorded-ring-6.ron")?;
    let topo = hccl::topologies::build(spec, "chorded-ring-6.ron")?;
    let net = Network::new(&topo);

    // 1. The packing LP: spanning trees from rank 0, weighed to maximise the rate, with its
    //    dual's proof of the best rate any tree packing over these routes can reach.
    let pool = synth::grow_pool(&net, &[0], Direction::FromRoot)?;
    let packing = synth::prune(&pool, 4)?;
    let flow = (1..topo.nranks())
        .map(|v| bounds::max_flow(&net, 0, v))
        .fold(f64::INFINITY, f64::min);
    println!(
        "Broadcast from rank 0: {:.1} GB/s in {} trees; LP optimum {:.1} GB/s ({}, {} rounds); max-flow {:.1} GB/s",
        packing.rate,
        packing.trees.len(),
        pool.bound,
        if pool.optimal() {
            "proven"
        } else {
            "not proven"
        },
        pool.rounds,
        flow
    );
    for t in &packing.trees {
        let edges: Vec<String> = t
            .parents
            .iter()
            .enumerate()
            .filter_map(|(v, p)| p.map(|u| format!("{u}>{v}")))
            .collect();
        println!("  {:>6.1} GB/s  {}", t.rate, edges.join(" "));
    }

    // 2. Lowered to a pipelined chunk schedule (one channel per tree, 64 pieces per tree),
    //    verified and simulated like any family's.
    let collective = Collective::Broadcast { root: 0 };
    let candidate = synth::lower("packed_trees", &packing, collective, 64, 4, false)
        .into_iter()
        .next()
        .ok_or("the packing did not lower")?;
    verify(&candidate.schedule).map_err(|e| format!("does not verify: {:?}", e[0]))?;
    let sim = Simulator::new(net, CostModel::for_topology(&topo));
    let prepared = sim.prepare(&candidate.schedule)?;
    let time = sim.run(&prepared, GIB, hccl::ir::Protocol::Simple)?.time_us;
    let bound = bounds::bound(&sim.network, &sim.model, collective, GIB).total_us;
    println!(
        "lowered: {} steps, verified; 1 GiB in {time:.0} us, {:.3}x the lower bound",
        candidate.schedule.step_count(),
        time / bound
    );

    // 3. AllReduce: trees that reduce up and send back down, each owning a block as large as
    //    its rate, against equal blocks (ReduceScatter then AllGather at the AllGather
    //    packing's rate per root).
    let net = &sim.network;
    let both = synth::allreduce::allreduce_pool(net).ok_or("no AllReduce trees")?;
    let per_root = synth::packing_bound(net, Collective::AllGather).ok_or("no AllGather LP")?;
    println!(
        "AllReduce trees: {:.1} GB/s (LP optimum {:.1}); equal blocks at best {:.1} GB/s",
        both.rate(),
        both.bound,
        f64::from(topo.nranks()) * per_root / 2.0
    );

    // 4. The whole search at 1 GiB with and without synthesis.
    for level in [SynthLevel::Off, SynthLevel::Auto] {
        let options = Options {
            collectives: vec![CollectiveKind::Broadcast, CollectiveKind::AllReduce],
            sizes: vec![GIB],
            model: CostModel::for_topology(&topo),
            synth: level,
            ..Options::default()
        };
        let compiled = search::compile(&topo, &options)?;
        for row in &compiled.rows {
            println!(
                "--synth {:<4} {:<10}: {:<16} {:>8.0} us, {:.3}x the bound",
                level.name(),
                row.collective.name(),
                row.algorithm,
                row.predicted_us,
                row.bound_ratio()
            );
        }
    }
    Ok(())
}
