//! The route-free lower bound the screen drops candidates with (`Unrouted::bound_us`,
//! `cost::reach`), and the routed ones a run given a limit is skipped with
//! (`Simulator::routed_bound_us`, `Simulator::slots_bound_us`), never exceed the simulated
//! time: every candidate of every built-in family on shipped and generated machines (one
//! host, several hosts, PCIe-only, tori), for several collectives, sizes and protocols. A
//! bound above the simulation would let the search drop a candidate, or a run, that could
//! win.

use hccl_compiler::cost::{CostModel, Network, Simulator};
use hccl_compiler::search::collective_of;
use hccl_compiler::search::families_for;
use hccl_compiler::synth::SynthLevel;
use hccl_ir::{CollectiveKind, Protocol};
use hccl_topologies::{Topology, generate};

const KINDS: [CollectiveKind; 4] = [
    CollectiveKind::AllReduce,
    CollectiveKind::AllGather,
    CollectiveKind::Broadcast,
    CollectiveKind::AllToAll,
];
const SIZES: [u64; 3] = [1 << 10, 1 << 20, 1 << 30];

fn machines() -> Vec<(&'static str, Topology)> {
    let shipped = |name| hccl_topologies::shipped_by_name(name).expect("shipped machine");
    let build = |spec, name| hccl_topologies::build(spec, name).expect("generated machine builds");
    let h100 = hccl_topologies::parse_spec(
        hccl_topologies::shipped_text("dgx-h100").expect("shipped"),
        "dgx-h100",
    )
    .expect("parses");
    vec![
        ("dgx1-v100", shipped("dgx1-v100")),
        ("ascend910-8", shipped("ascend910-8")),
        ("h100-cluster-2node", shipped("h100-cluster-2node")),
        ("azure-ndv2-2node", shipped("azure-ndv2-2node")),
        ("ring-8", build(generate::ring(8, 25.0, 0.7), "ring-8")),
        (
            "torus-4x4",
            build(generate::torus(&[4, 4], 25.0, 0.7), "torus-4x4"),
        ),
        (
            "cluster-4x-dgx-h100",
            build(generate::cluster(4, &h100), "cluster-4"),
        ),
    ]
}

#[test]
fn the_lower_bounds_never_exceed_the_simulation() {
    let mut checked = 0usize;
    let mut tight = 0usize;
    let mut routed_tight = 0usize;
    let mut slots_above = 0usize;
    for (machine, topo) in machines() {
        let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
        for kind in KINDS {
            let collective = collective_of(kind);
            for family in families_for(SynthLevel::Off) {
                if !family.supports(kind) {
                    continue;
                }
                let space = family.param_space(&topo, collective);
                // The shallowest and the deepest parameter sets.
                let picks = [space.first(), space.last()];
                for params in picks.into_iter().flatten() {
                    for c in family.generate(&topo, collective, *params) {
                        let Some(schedule) = c.expanded() else {
                            continue;
                        };
                        let Ok(unrouted) = sim.unrouted(&schedule) else {
                            continue;
                        };
                        let Ok(prepared) = sim.prepare(&schedule) else {
                            continue;
                        };
                        for bytes in SIZES {
                            for protocol in Protocol::ALL {
                                let what = format!(
                                    "{} {kind} {params:?} on {machine}, {bytes} B {protocol:?}",
                                    c.algorithm
                                );
                                let bound = unrouted.bound_us(&sim, bytes, protocol);
                                let simulated = sim
                                    .run(&prepared, bytes, protocol)
                                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                                    .time_us;
                                assert!(
                                    bound <= simulated * (1.0 + 1e-9),
                                    "{what}: bound {bound} µs above the simulation {simulated} µs"
                                );
                                // Past the protocol's base latency alone: the bound sees
                                // something of the schedule.
                                assert!(bound > 0.0, "{what}: no bound");
                                let routed = sim.routed_bound_us(&prepared, bytes, protocol);
                                assert!(
                                    routed <= simulated * (1.0 + 1e-9),
                                    "{what}: routed bound {routed} µs above the simulation \
                                     {simulated} µs"
                                );
                                let slots = sim.slots_bound_us(&prepared, bytes, protocol);
                                assert!(
                                    slots <= simulated * (1.0 + 1e-9),
                                    "{what}: slots bound {slots} µs above the simulation \
                                     {simulated} µs"
                                );
                                if slots > routed {
                                    slots_above += 1;
                                }
                                checked += 1;
                                if bound >= 0.5 * simulated {
                                    tight += 1;
                                }
                                if routed >= 0.9 * simulated {
                                    routed_tight += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} cases");
    // Useful, not only sound: within 2× of the simulation in most cases.
    assert!(
        tight * 2 > checked,
        "the bound is within 2x of the simulation in only {tight} of {checked} cases"
    );
    println!(
        "{checked} cases, {tight} within 2x, the routed bound {routed_tight} within 10%, the \
         slots bound above it in {slots_above}"
    );
    // The slots bound sees what the routed one does not (deep pipelines at small sizes).
    assert!(
        slots_above > 0,
        "the slots bound is never above the routed one"
    );
    // The routed bound is exact for a schedule without contention: it must be close often.
    assert!(
        routed_tight * 4 > checked,
        "the routed bound is within 10% of the simulation in only {routed_tight} of {checked} cases"
    );
}

/// A run given a limit (`Simulator::run_within`) gives the full run's estimate when the
/// collective fits the limit, and gives up (`None`) when it does not.
#[test]
fn a_run_within_a_limit_stops_only_past_it() {
    let (machine, topo) = machines().swap_remove(6);
    let sim = Simulator::new(Network::new(&topo), CostModel::for_topology(&topo));
    let collective = collective_of(CollectiveKind::AllReduce);
    let mut checked = 0;
    for family in families_for(SynthLevel::Off) {
        if !family.supports(CollectiveKind::AllReduce) {
            continue;
        }
        for params in family.param_space(&topo, collective).into_iter().take(2) {
            for c in family.generate(&topo, collective, params) {
                let Some(schedule) = c.expanded() else {
                    continue;
                };
                let prepared = sim.prepare(&schedule).expect("prepares");
                for (bytes, protocol) in [(1 << 10, Protocol::LL), (1 << 28, Protocol::Simple)] {
                    let what = format!("{} {params:?} on {machine}, {bytes} B", c.algorithm);
                    let full = sim.run(&prepared, bytes, protocol).expect("runs");
                    let within = sim
                        .run_within(&prepared, bytes, protocol, full.time_us * 1.001)
                        .expect("runs")
                        .unwrap_or_else(|| panic!("{what}: gave up within its own time"));
                    assert_eq!(within, full, "{what}");
                    assert!(
                        sim.run_within(&prepared, bytes, protocol, full.time_us * 0.999)
                            .expect("runs")
                            .is_none(),
                        "{what}: kept a run past its limit"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} cases");
}

/// The switched route search (devices never queued, per-thread scratch, stops once every
/// destination is final) gives exactly the routes of the plain search: every source to
/// every destination, one destination at a time and all at once, on every machine.
/// A host whose switches reach a device first by the worse of two paths: gpu0 reaches
/// `near` sooner, but `near`'s link on to gpu1 is slow; the route through `far` is better.
const TWO_PATHS: &str = r#"(
  name: "two-paths",
  hosts: [(id: "h", devices: [
    (id: "gpu0", kind: Gpu), (id: "gpu1", kind: Gpu), (id: "gpu2", kind: Gpu), (id: "gpu3", kind: Gpu),
  ])],
  switches: [
    (id: "near", kind: NvSwitch, host: Some("h")),
    (id: "far", kind: NvSwitch, host: Some("h")),
  ],
  links: [
    (a: "gpu0", b: "near", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "near", b: "gpu1", kind: NvLink, bw: 100.0, latency: 5.0),
    (a: "near", b: "gpu2", kind: NvLink, bw: 100.0, latency: 1.0),
    (a: "gpu0", b: "far", kind: NvLink, bw: 100.0, latency: 2.0),
    (a: "far", b: "gpu1", kind: NvLink, bw: 100.0, latency: 0.1),
    (a: "far", b: "gpu3", kind: NvLink, bw: 100.0, latency: 1.0),
  ],
)"#;

#[test]
fn the_switched_search_finds_the_plain_searchs_routes() {
    let mut compared = 0usize;
    let mut all_machines = machines();
    all_machines.push((
        "two-paths",
        hccl_topologies::from_ron(TWO_PATHS, "two-paths").expect("two-paths builds"),
    ));
    for (machine, topo) in all_machines {
        let net = Network::new(&topo);
        let n = net.nranks();
        for src in 0..n {
            let all: Vec<u32> = (0..n).filter(|&d| d != src).collect();
            let plain = net.reference_routes(src, &all, false);
            assert_eq!(
                net.shortest_routes(src, &all, false),
                plain,
                "{machine}: from {src}"
            );
            for (k, &d) in all.iter().enumerate() {
                let one = net.shortest_routes(src, &[d], false);
                assert_eq!(one[0], plain[k], "{machine}: {src} to {d} alone");
                compared += 1;
            }
        }
    }
    assert!(compared > 1000, "only {compared} routes compared");
}

/// Routes carried from one host's ranks to the others by the shift of every rank to the
/// next host are the routes every rank's own search finds: every pair of ranks, on every
/// machine; the shift is found on the clusters of identical boxes (and only used there).
#[test]
fn routes_carried_between_hosts_are_the_searched_ones() {
    let h100 = hccl_topologies::parse_spec(
        hccl_topologies::shipped_text("dgx-h100").expect("shipped"),
        "dgx-h100",
    )
    .expect("parses");
    let mut all_machines = machines();
    all_machines.push((
        "cluster-3x-dgx-h100",
        hccl_topologies::build(generate::cluster(3, &h100), "cluster-3").expect("builds"),
    ));
    // docs/benchmarks.md: "tested pair by pair on eight machines".
    assert_eq!(
        all_machines.len(),
        8,
        "docs/benchmarks.md says eight machines"
    );
    let mut shifted = Vec::new();
    for (machine, topo) in all_machines {
        let net = Network::new(&topo);
        let n = net.nranks();
        let pairs: Vec<(u32, u32)> = (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect();
        let carried = net.routes_uncached(&pairs).expect("every pair routes");
        for (&(a, b), route) in pairs.iter().zip(&carried) {
            let plain = net.reference_routes(a, &[b], false).remove(0);
            let plain = plain.or_else(|| net.reference_routes(a, &[b], true).remove(0));
            assert_eq!(Some(route), plain.as_ref(), "{machine}: {a} to {b}");
        }
        if net.shifts_routes() {
            shifted.push(machine);
        }
    }
    assert_eq!(
        shifted,
        [
            "h100-cluster-2node",
            "azure-ndv2-2node",
            "cluster-4x-dgx-h100",
            "cluster-3x-dgx-h100"
        ]
    );
}
