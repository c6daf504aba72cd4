//! Generators for parametric topology families. Each returns a [`TopologySpec`]; degenerate
//! parameters (0 ranks, a box without NICs) give specs that [`crate::build`] rejects with a
//! named error rather than panicking here.

use crate::model::{
    DeviceKind, DeviceSpec, HostSpec, LinkKind, LinkSpec, NicSpec, SwitchKind, SwitchSpec,
    TopologySpec,
};

/// InfiniBand per-hop latency (µs) used for NIC -> switch links: half of TACCL's 2.6 µs IB
/// alpha, so NIC -> leaf -> NIC costs 2.6 µs (microsoft/taccl topo-ndv2 profile; ANCHORS.md §5).
pub const IB_HOP_LATENCY_US: f64 = 1.3;

/// Switch-to-switch latency (µs) for leaf <-> spine links: the port-to-port latency of an NVIDIA
/// Quantum InfiniBand switch, about 130 ns (NVIDIA Quantum HDR/NDR switch datasheets).
pub const SWITCH_HOP_LATENCY_US: f64 = 0.13;

/// Latency (µs) of a CPU rank's access to shared host memory: a cache-line transfer between
/// cores, on the order of 100 ns on current x86 servers.
pub const MEMORY_LATENCY_US: f64 = 0.1;

/// Default memory bandwidth (GB/s) of a CPU rank (see [`crate::default_mem_bw`]).
pub const CPU_MEM_BW: f64 = 10.0;

/// Default one-way latency (µs) of a small message between CPU ranks of two hosts over TCP on
/// Ethernet, NIC -> switch -> NIC, kernel network stacks included: half of a TCP ping-pong
/// round trip between servers on 10/25 GbE, typically 10-30 µs without kernel-bypass tuning
/// (netperf `TCP_RR`); 25 µs is the upper middle of that range. Used by [`host_with_nic`].
pub const TCP_NIC_LATENCY_US: f64 = 25.0;

fn gpu(id: String) -> DeviceSpec {
    DeviceSpec {
        id,
        kind: DeviceKind::Gpu,
        vendor: String::new(),
        model: String::new(),
        rank: None,
        mem_bw: None,
    }
}

pub(crate) fn link(
    a: &str,
    b: &str,
    kind: LinkKind,
    bw: f64,
    latency: f64,
    count: u32,
) -> LinkSpec {
    LinkSpec {
        a: a.to_string(),
        b: b.to_string(),
        kind,
        bw,
        latency,
        count,
    }
}

/// A ring of `n` GPUs in one host, `gpu0 - gpu1 - ... - gpu{n-1} - gpu0`, each link `bw` GB/s per
/// direction and `latency` µs (NVLink kind). `n` links for `n >= 3`; a ring of 2 is a single
/// full-duplex link (both ring directions share it), a ring of 1 has no links.
pub fn ring(n: u32, bw: f64, latency: f64) -> TopologySpec {
    let devices = (0..n).map(|i| gpu(format!("gpu{i}"))).collect();
    let links = match n {
        0 | 1 => Vec::new(),
        2 => vec![link("gpu0", "gpu1", LinkKind::NvLink, bw, latency, 1)],
        _ => (0..n)
            .map(|i| {
                let a = format!("gpu{i}");
                let b = format!("gpu{}", (i + 1) % n);
                link(&a, &b, LinkKind::NvLink, bw, latency, 1)
            })
            .collect(),
    };
    TopologySpec {
        name: format!("ring{n}"),
        description: format!("ring of {n} GPUs, {bw} GB/s per direction per link"),
        hosts: vec![HostSpec {
            id: "host0".into(),
            devices,
            nics: Vec::new(),
        }],
        switches: Vec::new(),
        links,
        calibration: None,
    }
}

/// A torus with the given dimension sizes (2-D or 3-D, any number works), one GPU per point,
/// `gpu{x}-{y}[-{z}]`, with wraparound links along every dimension. A dimension of size 2 gets
/// one link per pair (not two), a dimension of size 1 none, so a GPU's degree is the sum over
/// dimensions of 2 (size >= 3), 1 (size 2) or 0 (size 1).
pub fn torus(dims: &[u32], bw: f64, latency: f64) -> TopologySpec {
    let total: u64 = dims.iter().map(|&d| u64::from(d)).product();
    let total = if dims.is_empty() { 0 } else { total };
    let coords = |mut idx: u64| -> Vec<u32> {
        dims.iter()
            .map(|&d| {
                let c = (idx % u64::from(d)) as u32;
                idx /= u64::from(d);
                c
            })
            .collect()
    };
    let name_of = |c: &[u32]| {
        let parts: Vec<String> = c.iter().map(|x| x.to_string()).collect();
        format!("gpu{}", parts.join("-"))
    };
    let mut devices = Vec::new();
    let mut links = Vec::new();
    for idx in 0..total {
        let c = coords(idx);
        let me = name_of(&c);
        devices.push(gpu(me.clone()));
        for (k, &d) in dims.iter().enumerate() {
            // Each point links to its +1 neighbour; for size 2 only the point at 0 does.
            if d < 2 || (d == 2 && c[k] == 1) {
                continue;
            }
            let mut n = c.clone();
            n[k] = (c[k] + 1) % d;
            links.push(link(&me, &name_of(&n), LinkKind::NvLink, bw, latency, 1));
        }
    }
    let shape: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    let shape = shape.join("x");
    TopologySpec {
        name: format!("torus{shape}"),
        description: format!("{shape} torus of GPUs, {bw} GB/s per direction per link"),
        hosts: vec![HostSpec {
            id: "host0".into(),
            devices,
            nics: Vec::new(),
        }],
        switches: Vec::new(),
        links,
        calibration: None,
    }
}

/// A two-level non-blocking fat tree (folded Clos): `ranks` hosts with one GPU and one NIC
/// each, `per_leaf` hosts under each leaf switch, and `per_leaf` spines, every leaf linked
/// once to every spine, so each leaf has as much bandwidth up as down. NIC links are `bw`
/// GB/s InfiniBand; the GPU -> NIC path is modelled as a PCIe link of the same `bw` (the NIC
/// is the bottleneck). `latency` is the NIC -> leaf hop; leaf -> spine hops use
/// [`SWITCH_HOP_LATENCY_US`].
pub fn fat_tree(ranks: u32, per_leaf: u32, bw: f64, latency: f64) -> TopologySpec {
    let per_leaf = per_leaf.max(1);
    let leaves = ranks.div_ceil(per_leaf);
    let spines = if leaves > 1 { per_leaf } else { 0 };
    let mut hosts = Vec::new();
    let mut switches = Vec::new();
    let mut links = Vec::new();
    for l in 0..leaves {
        switches.push(SwitchSpec {
            id: format!("leaf{l}"),
            kind: SwitchKind::Leaf,
            host: None,
            port_bw: None,
        });
    }
    for s in 0..spines {
        switches.push(SwitchSpec {
            id: format!("spine{s}"),
            kind: SwitchKind::Spine,
            host: None,
            port_bw: None,
        });
    }
    for r in 0..ranks {
        let (g, n) = (format!("gpu{r}"), format!("nic{r}"));
        hosts.push(HostSpec {
            id: format!("node{r}"),
            devices: vec![gpu(g.clone())],
            nics: vec![NicSpec::new(n.clone(), bw)],
        });
        links.push(link(&g, &n, LinkKind::Pcie, bw, latency, 1));
        let leaf = format!("leaf{}", r / per_leaf);
        links.push(link(&n, &leaf, LinkKind::InfiniBand, bw, latency, 1));
    }
    for l in 0..leaves {
        for s in 0..spines {
            links.push(link(
                &format!("leaf{l}"),
                &format!("spine{s}"),
                LinkKind::InfiniBand,
                bw,
                SWITCH_HOP_LATENCY_US,
                1,
            ));
        }
    }
    TopologySpec {
        name: format!("fat-tree{ranks}"),
        description: format!(
            "two-level fat tree: {ranks} single-GPU hosts, {per_leaf} per leaf, {spines} spines, {bw} GB/s"
        ),
        hosts,
        switches,
        links,
        calibration: None,
    }
}

/// `nodes` copies of `box_spec` joined by a rail-optimised network: the `j`-th NIC of every box
/// (NICs numbered in file order over the box's hosts) connects to leaf switch `rail{j}`, and
/// every leaf connects to every spine (`spine{s}`, one spine per rail) with enough parallel
/// links (`ceil(nodes / spines)`) to be non-blocking. Ids of the copy `k` are prefixed `n{k}.`;
/// ranks given in the box become `k × box ranks + r`.
/// NIC -> leaf links carry the NIC's bandwidth and its port's kind and latency
/// ([`NicSpec::kind`], [`NicSpec::latency`]; InfiniBand and [`IB_HOP_LATENCY_US`] when the box
/// does not say); leaf -> spine links the largest NIC bandwidth, the NICs' common kind
/// (InfiniBand if they differ) and [`SWITCH_HOP_LATENCY_US`]. Switches of the box without a
/// host are copied per node too. With one node, or one NIC per box (one rail switch joins
/// every box, e.g. CPU hosts from [`host_with_nic`]), there is no spine.
pub fn cluster(nodes: u32, box_spec: &TopologySpec) -> TopologySpec {
    let prefix = |k: u32, id: &str| format!("n{k}.{id}");
    let nics: Vec<&NicSpec> = box_spec.hosts.iter().flat_map(|h| &h.nics).collect();
    let rails = nics.len();
    let box_ranks = box_spec
        .hosts
        .iter()
        .map(|h| h.devices.len() as u32)
        .sum::<u32>();
    let mut hosts = Vec::new();
    let mut switches = Vec::new();
    let mut links = Vec::new();
    for k in 0..nodes {
        for h in &box_spec.hosts {
            hosts.push(HostSpec {
                id: prefix(k, &h.id),
                devices: h
                    .devices
                    .iter()
                    .map(|d| DeviceSpec {
                        id: prefix(k, &d.id),
                        rank: d.rank.map(|r| r + k * box_ranks),
                        ..d.clone()
                    })
                    .collect(),
                nics: h
                    .nics
                    .iter()
                    .map(|n| NicSpec {
                        id: prefix(k, &n.id),
                        ..n.clone()
                    })
                    .collect(),
            });
        }
        for s in &box_spec.switches {
            switches.push(SwitchSpec {
                id: prefix(k, &s.id),
                host: s.host.as_ref().map(|h| prefix(k, h)),
                ..s.clone()
            });
        }
        for l in &box_spec.links {
            links.push(LinkSpec {
                a: prefix(k, &l.a),
                b: prefix(k, &l.b),
                ..l.clone()
            });
        }
    }
    let spines = if nodes > 1 && rails > 1 { rails } else { 0 };
    for j in 0..rails {
        switches.push(SwitchSpec {
            id: format!("rail{j}"),
            kind: SwitchKind::Leaf,
            host: None,
            port_bw: None,
        });
    }
    for s in 0..spines {
        switches.push(SwitchSpec {
            id: format!("spine{s}"),
            kind: SwitchKind::Spine,
            host: None,
            port_bw: None,
        });
    }
    for k in 0..nodes {
        for (j, n) in nics.iter().enumerate() {
            links.push(link(
                &prefix(k, &n.id),
                &format!("rail{j}"),
                n.kind.unwrap_or(LinkKind::InfiniBand),
                n.bw,
                n.latency.unwrap_or(IB_HOP_LATENCY_US),
                1,
            ));
        }
    }
    let up_bw = nics.iter().map(|n| n.bw).fold(0.0, f64::max);
    // The fabric speaks the NICs' network when they agree on one, else InfiniBand.
    let up_kind = match nics.first().map(|n| n.kind) {
        Some(kind) if nics.iter().all(|n| n.kind == kind) => kind,
        _ => None,
    }
    .unwrap_or(LinkKind::InfiniBand);
    let up_count = if spines > 0 {
        nodes.div_ceil(spines as u32)
    } else {
        0
    };
    for j in 0..rails {
        for s in 0..spines {
            links.push(link(
                &format!("rail{j}"),
                &format!("spine{s}"),
                up_kind,
                up_bw,
                SWITCH_HOP_LATENCY_US,
                up_count,
            ));
        }
    }
    TopologySpec {
        name: format!("{}-cluster-{nodes}node", box_spec.name),
        description: if rails == 1 {
            format!(
                "{nodes} × {}, their NICs joined by one switch",
                box_spec.name
            )
        } else {
            format!(
                "{nodes} × {}, rail-optimised: {rails} rail leaf switches, {spines} spines",
                box_spec.name
            )
        },
        hosts,
        switches,
        links,
        calibration: box_spec.calibration.clone(),
    }
}

/// `ranks` CPU ranks of one host sharing its memory: CPU devices `cpu{i}` attached to a
/// `Memory` switch `mem` by Memory links of `mem_bw` GB/s per direction (each rank's copy
/// bandwidth) and [`MEMORY_LATENCY_US`]. This is the machine the CPU executor's plans are
/// compiled for.
pub fn host(ranks: u32, mem_bw: f64) -> TopologySpec {
    let devices = (0..ranks)
        .map(|i| DeviceSpec {
            id: format!("cpu{i}"),
            kind: DeviceKind::Cpu,
            vendor: String::new(),
            model: String::new(),
            rank: None,
            mem_bw: Some(mem_bw),
        })
        .collect();
    let links = (0..ranks)
        .map(|i| {
            link(
                &format!("cpu{i}"),
                "mem",
                LinkKind::Memory,
                mem_bw,
                MEMORY_LATENCY_US,
                1,
            )
        })
        .collect();
    TopologySpec {
        name: format!("host{ranks}"),
        description: format!("{ranks} CPU ranks sharing one host's memory, {mem_bw} GB/s each"),
        hosts: vec![HostSpec {
            id: "host0".into(),
            devices,
            nics: Vec::new(),
        }],
        switches: vec![SwitchSpec {
            id: "mem".into(),
            kind: SwitchKind::Memory,
            host: Some("host0".into()),
            port_bw: None,
        }],
        links,
        calibration: None,
    }
}

/// [`host`] with a network port: the host's `ranks` CPU ranks share one NIC `nic0` of
/// `nic_bw` GB/s per direction, attached to the memory switch (`mem`) by a PCIe link of the
/// same bandwidth and [`MEMORY_LATENCY_US`], so its traffic also uses the sending and
/// receiving ranks' memory links. The NIC's port is Ethernet with half of `nic_latency` per
/// NIC -> switch hop: `nic_latency` (µs) is the one-way latency between two such hosts' NICs,
/// see [`TCP_NIC_LATENCY_US`]. [`cluster`] joins copies of it by one Ethernet switch.
pub fn host_with_nic(ranks: u32, mem_bw: f64, nic_bw: f64, nic_latency: f64) -> TopologySpec {
    let mut spec = host(ranks, mem_bw);
    spec.name = format!("host{ranks}-nic");
    spec.description = format!(
        "{ranks} CPU ranks sharing one host's memory, {mem_bw} GB/s each, and one {nic_bw} GB/s \
         Ethernet NIC ({nic_latency} µs NIC to NIC)"
    );
    spec.hosts[0].nics.push(NicSpec {
        id: "nic0".into(),
        bw: nic_bw,
        kind: Some(LinkKind::Ethernet),
        latency: Some(nic_latency / 2.0),
    });
    spec.links.push(link(
        "mem",
        "nic0",
        LinkKind::Pcie,
        nic_bw,
        MEMORY_LATENCY_US,
        1,
    ));
    spec
}
