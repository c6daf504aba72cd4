//! The topology description format (what people write in RON) and the validated machine
//! graph the compiler reasons over.
//!
//! Units everywhere: bandwidth in GB/s (1e9 bytes/s) **per direction** of a full-duplex link,
//! latency in µs. A link with `count: 2` is two parallel links (e.g. a double NVLink) and
//! carries twice the bandwidth.

use petgraph::graph::{DiGraph, EdgeIndex, NodeIndex};
use serde::{Deserialize, Serialize};

/// Kind of a compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceKind {
    Gpu,
    Npu,
    /// A CPU rank (a process or thread sharing host memory with others).
    Cpu,
}

/// Kind of a switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SwitchKind {
    NvSwitch,
    Pcie,
    Leaf,
    Spine,
    /// Host memory seen as a switch: CPU ranks of one host talk through it.
    Memory,
}

/// Kind of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkKind {
    NvLink,
    Hccs,
    Xgmi,
    Pcie,
    InfiniBand,
    Roce,
    Ethernet,
    /// Shared memory inside one host.
    Memory,
}

impl LinkKind {
    /// Whether the link leaves the host (network links).
    pub fn is_network(self) -> bool {
        matches!(
            self,
            LinkKind::InfiniBand | LinkKind::Roce | LinkKind::Ethernet
        )
    }

    /// The kind as readers write it: `NVLink`, `PCIe`, `InfiniBand`, ...
    pub fn label(self) -> &'static str {
        match self {
            LinkKind::NvLink => "NVLink",
            LinkKind::Hccs => "HCCS",
            LinkKind::Xgmi => "xGMI",
            LinkKind::Pcie => "PCIe",
            LinkKind::InfiniBand => "InfiniBand",
            LinkKind::Roce => "RoCE",
            LinkKind::Ethernet => "Ethernet",
            LinkKind::Memory => "memory",
        }
    }
}

/// A compute device: one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub id: String,
    pub kind: DeviceKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Rank of this device; when no device of the file gives one, ranks follow file order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Local memory bandwidth for copies and reductions (GB/s). Defaults per model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bw: Option<f64>,
}

/// A network interface of a host.
///
/// `kind` and `latency` describe the NIC's port, i.e. the link a generator that networks
/// boxes ([`crate::generate::cluster`]) draws from the NIC to its switch; links written in the
/// file do not read them. Absent, the port is InfiniBand with
/// [`crate::generate::IB_HOP_LATENCY_US`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    pub id: String,
    /// Port bandwidth per direction (GB/s).
    pub bw: f64,
    /// Network the port speaks (a network link kind: InfiniBand, Roce or Ethernet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<LinkKind>,
    /// Latency (µs) of the hop from this NIC to its switch; NIC -> switch -> NIC costs twice
    /// this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<f64>,
}

impl NicSpec {
    /// A NIC with an InfiniBand port of the default latency.
    pub fn new(id: impl Into<String>, bw: f64) -> NicSpec {
        NicSpec {
            id: id.into(),
            bw,
            kind: None,
            latency: None,
        }
    }
}

/// A host (server / node) with its devices and NICs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub id: String,
    pub devices: Vec<DeviceSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicSpec>,
}

/// A switch; `host` is set for switches inside a host (NVSwitch, PCIe switch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    pub id: String,
    pub kind: SwitchKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Per-port bandwidth cap per direction (GB/s); `None` = limited by the links only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_bw: Option<f64>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// A full-duplex link between two endpoints (device, NIC or switch ids).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub a: String,
    pub b: String,
    pub kind: LinkKind,
    /// Bandwidth per direction of one link (GB/s).
    pub bw: f64,
    /// One-hop latency (µs).
    pub latency: f64,
    /// Number of parallel links.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u32,
}

/// A topology file as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub hosts: Vec<HostSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<SwitchSpec>,
    pub links: Vec<LinkSpec>,
    /// How the cost model's constants were corrected to measurements of this machine
    /// (`hccl-perf --calibrate`, `hcclc calibrate`); absent: the model's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
}

/// Corrections of the cost model fitted to measured collectives on one machine.
///
/// The model's own constants (NCCL's table for GPUs and networks, the CPU executor's for CPU
/// hosts) keep their structure and are scaled: every base latency by `base_scale`, every
/// per-message latency of link class `c` (0: NVLink-class and memory, 1: PCIe, 2: network) by
/// `message_scale[c]`; on CPU ranks of one host also the executor's cost per step
/// (`step_scale`), the memory traffic of a send (`send_scale`), of reading a received
/// message (`recv_scale`) and of passes over the rank's own memory (`local_scale`). Bandwidth depends on how much data a collective touches (a working set
/// that fits in caches moves faster than one in DRAM), so `bandwidth` is a curve: knots
/// `(bytes, factor)` ascending in the collective's size (nccl-tests bytes), each factor
/// multiplying every link's and device's bandwidth at that size, log-linear between knots and
/// flat beyond the ends. Empty: factor 1 everywhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Where the numbers come from: the command, the machine and the date.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Multiplies the model's once-per-collective latency.
    pub base_scale: f64,
    /// Multiplies the model's per-message latency, per link class (memory/NVLink, PCIe,
    /// network).
    pub message_scale: [f64; 3],
    /// CPU ranks of one host: multiplies the executor's fixed cost per step.
    #[serde(default = "one_f64", skip_serializing_if = "is_one_f64")]
    pub step_scale: f64,
    /// CPU ranks of one host: multiplies the memory traffic of a send (2 passes: the copy
    /// into the slot; the threads backend passes large messages by pointer instead).
    #[serde(default = "one_f64", skip_serializing_if = "is_one_f64")]
    pub send_scale: f64,
    /// CPU ranks of one host: multiplies the memory traffic of reading a received message
    /// out of its slot (1 pass; the lines come from the sender's core).
    #[serde(default = "one_f64", skip_serializing_if = "is_one_f64")]
    pub recv_scale: f64,
    /// CPU ranks of one host: multiplies the weight of passes over a rank's own memory
    /// (local copies and reductions, a receive's local operand and destination).
    #[serde(default = "one_f64", skip_serializing_if = "is_one_f64")]
    pub local_scale: f64,
    /// CPU ranks of one host: the cores they shared when measured (more ranks than cores
    /// take turns); absent: a core each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Bandwidth factor by collective size: `(bytes, factor)`, bytes strictly ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bandwidth: Vec<(u64, f64)>,
}

fn one_f64() -> f64 {
    1.0
}

fn is_one_f64(v: &f64) -> bool {
    *v == 1.0
}

impl Calibration {
    /// No correction at all.
    pub fn identity(source: impl Into<String>) -> Calibration {
        Calibration {
            source: source.into(),
            base_scale: 1.0,
            message_scale: [1.0; 3],
            step_scale: 1.0,
            send_scale: 1.0,
            recv_scale: 1.0,
            local_scale: 1.0,
            cores: None,
            bandwidth: Vec::new(),
        }
    }

    /// The bandwidth factor at a collective of `bytes`: log-linear between knots, the end
    /// knots' factors beyond them, 1 without knots.
    pub fn bandwidth_factor(&self, bytes: u64) -> f64 {
        let knots = &self.bandwidth;
        let Some(&(first, f0)) = knots.first() else {
            return 1.0;
        };
        if bytes <= first {
            return f0;
        }
        for w in knots.windows(2) {
            let ((b0, f0), (b1, f1)) = (w[0], w[1]);
            if bytes <= b1 {
                let x0 = (b0.max(1) as f64).ln();
                let x1 = (b1.max(1) as f64).ln();
                let t = if x1 > x0 {
                    ((bytes as f64).ln() - x0) / (x1 - x0)
                } else {
                    1.0
                };
                return (f0.ln() + t * (f1.ln() - f0.ln())).exp();
            }
        }
        knots.last().map_or(1.0, |k| k.1)
    }
}

/// A vertex of the machine graph.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Device {
        id: String,
        rank: u32,
        host: usize,
        kind: DeviceKind,
        /// Local memory bandwidth (GB/s).
        mem_bw: f64,
    },
    Nic {
        id: String,
        host: usize,
        bw: f64,
    },
    Switch {
        id: String,
        kind: SwitchKind,
        host: Option<usize>,
        port_bw: Option<f64>,
    },
}

impl Node {
    pub fn id(&self) -> &str {
        match self {
            Node::Device { id, .. } | Node::Nic { id, .. } | Node::Switch { id, .. } => id,
        }
    }
}

/// One direction of a link (the graph holds two edges per full-duplex link).
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub kind: LinkKind,
    /// Total bandwidth in this direction (GB/s): per-link bandwidth × count.
    pub bw: f64,
    pub latency: f64,
    pub count: u32,
}

/// A validated topology: the graph plus rank and host indexes.
#[derive(Debug, Clone)]
pub struct Topology {
    pub name: String,
    pub description: String,
    /// Hex blake3 of the canonical form of the spec.
    pub hash: String,
    /// Directed graph, two edges per full-duplex link.
    pub graph: DiGraph<Node, Edge>,
    /// `ranks[r]` is the device node of rank `r`.
    pub ranks: Vec<NodeIndex>,
    /// `host_of[r]` is the host index of rank `r`.
    pub host_of: Vec<usize>,
    /// Host ids, indexed by host index.
    pub hosts: Vec<String>,
    /// The spec it was built from (kept for `topo show` and re-serialisation).
    pub spec: TopologySpec,
}

impl Topology {
    pub fn nranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    pub fn nhosts(&self) -> usize {
        self.hosts.len()
    }

    /// Ranks grouped by host: entry `h` lists the ranks of host `h` in rank order (one pass;
    /// [`Topology::ranks_of_host`] for every host would cost hosts × ranks).
    pub fn ranks_by_host(&self) -> Vec<Vec<u32>> {
        let mut by_host = vec![Vec::new(); self.nhosts()];
        for (r, &h) in self.host_of.iter().enumerate() {
            if let Some(list) = by_host.get_mut(h) {
                list.push(r as u32);
            }
        }
        by_host
    }

    /// Ranks of host `host`, in rank order.
    pub fn ranks_of_host(&self, host: usize) -> Vec<u32> {
        (0..self.nranks())
            .filter(|&r| self.host_of[r as usize] == host)
            .collect()
    }

    /// The direct edge from rank `a`'s device to rank `b`'s device, if they are wired
    /// together without a switch.
    pub fn direct_edge(&self, a: u32, b: u32) -> Option<EdgeIndex> {
        self.graph
            .find_edge(self.ranks[a as usize], self.ranks[b as usize])
    }

    /// Local memory bandwidth of rank `r`'s device (GB/s).
    pub fn mem_bw(&self, r: u32) -> f64 {
        match &self.graph[self.ranks[r as usize]] {
            Node::Device { mem_bw, .. } => *mem_bw,
            _ => unreachable!("ranks index device nodes"),
        }
    }
}
