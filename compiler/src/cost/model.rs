//! The cost model's constants: protocol efficiencies and latencies, taken from NCCL's tuning
//! tables (`src/graph/tuning.cc`, `ncclTunerConstantsDefaults`, NCCL 2.30) so that our
//! predictions and NCCL's own choice speak the same units.
//!
//! | protocol | link efficiency | base (per launch) | per message: NVLink | PCIe | network |
//! |----------|-----------------|-------------------|---------------------|------|---------|
//! | LL       | 0.5 (8 B flag per 8 B data)   | 6.6 µs | 0.6 µs | 1.0 µs | 2.7 µs |
//! | LL128    | 120/128 (15 of 16 words data) | 14.0 µs | 1.9 µs | 2.5 µs | 4.0 µs |
//! | Simple   | 1.0                           | 8.4 µs | 3.4 µs | 5.7 µs | 14.0 µs |
//!
//! The base latency is NCCL's ring base latency (paid once per collective: launch and
//! setup); the per-message latency is NCCL's per-step "hardware latency" of the ring
//! algorithm for the slowest class of link on a transfer's route. The route's physical
//! latency (sum of the hop latencies of the topology) is added on top of it.

use hccl_ir::Protocol;
use hccl_topologies::{Calibration, DeviceKind, LinkKind, Node, Topology};

/// Class of link for latency purposes, as NCCL distinguishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    /// NVLink and its peers (HCCS, xGMI) and shared memory inside a host.
    NvLink,
    /// PCIe.
    Pci,
    /// Anything that leaves the host (InfiniBand, RoCE, Ethernet).
    Net,
}

impl LinkClass {
    /// All classes, in increasing order of latency.
    pub const ALL: [LinkClass; 3] = [LinkClass::NvLink, LinkClass::Pci, LinkClass::Net];

    /// The class of a topology link kind.
    pub fn of(kind: LinkKind) -> LinkClass {
        match kind {
            LinkKind::NvLink | LinkKind::Hccs | LinkKind::Xgmi | LinkKind::Memory => {
                LinkClass::NvLink
            }
            LinkKind::Pcie => LinkClass::Pci,
            LinkKind::InfiniBand | LinkKind::Roce | LinkKind::Ethernet => LinkClass::Net,
        }
    }

    /// Position of the class in [`LinkClass::ALL`] (and in a calibration's `message_scale`).
    pub fn index(self) -> usize {
        match self {
            LinkClass::NvLink => 0,
            LinkClass::Pci => 1,
            LinkClass::Net => 2,
        }
    }
}

fn proto_index(p: Protocol) -> usize {
    match p {
        Protocol::LL => 0,
        Protocol::LL128 => 1,
        Protocol::Simple => 2,
    }
}

/// What the CPU model adds: the executor's per-step cost and the memory traffic of a send.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuModel {
    /// Fixed cost of one step on a rank's thread (µs): the engine's bookkeeping, the flag
    /// stores and the poll that finds the step ready.
    pub step_us: f64,
    /// Memory passes of a send over its bytes (2: read the buffer, write the slot).
    pub send_passes: f64,
    /// Memory passes of reading a received message out of its slot (1; the slot's lines
    /// come from another core's cache, which the calibration may find dearer).
    pub recv_passes: f64,
    /// Weight of a pass over the rank's own memory (a local copy or reduce, a receive's
    /// local operand and destination) against the passes above (1; the calibration finds
    /// what this machine's caches make of it).
    pub local_weight: f64,
    /// Cores the ranks share, when known (a calibration records them); `None`: a core each.
    pub cores: Option<u32>,
    /// The executor's slot size (`HCCL_SLOT_BYTES`, default 256 KiB): a call whose chunks do
    /// not fit is replayed in segments, one after the other.
    pub slot_bytes: u64,
    /// The executor's LL slot size (`hccl_executor::arena::LL_BYTES`): calls of LL entries
    /// run in segments whose messages fit it.
    pub ll_bytes: u64,
}

/// The executor's default slot size (`hccl_executor::config::DEFAULT_SLOT_BYTES`; the facade's
/// tests check that both agree).
pub const EXECUTOR_SLOT_BYTES: u64 = 256 * 1024;
/// The executor's LL slot size (`hccl_executor::arena::LL_BYTES`; checked as above).
pub const EXECUTOR_LL_BYTES: u64 = 8192;
/// Depth of the executor's LL rings (`hccl_executor::arena::LL_SLOTS`): an LL send waits
/// for a free slot only this many messages ahead.
pub const EXECUTOR_LL_SLOTS: usize = 8;

impl Default for CpuModel {
    fn default() -> CpuModel {
        CpuModel {
            step_us: 0.05,
            send_passes: 2.0,
            recv_passes: 1.0,
            local_weight: 1.0,
            cores: None,
            slot_bytes: EXECUTOR_SLOT_BYTES,
            ll_bytes: EXECUTOR_LL_BYTES,
        }
    }
}

/// The CPU models' per-message and per-collective latency (µs), before calibration.
const CPU_MESSAGE_US: f64 = 0.15;
/// The CPU cluster model's [`CostModel::net_gap_us`], before calibration: what one TCP send
/// of a small frame costs the sending rank's engine (a `writev` that runs the kernel's
/// network stack to the peer's socket). Measured with `HCCL_TRACE` on the 2-core
/// development VM, over loopback and veth: 3.3–4.5 µs per send of 8 B to 4 KiB.
const CPU_NET_GAP_US: f64 = 4.0;
/// An LL message's latency against a Simple one's on a CPU host: its receiver waits for one
/// cache line (flag and data together) instead of three (`sent`, descriptor, data).
pub const CPU_LL_MESSAGE: f64 = 0.7;

/// Every constant the simulator uses. [`CostModel::default`] is the NCCL-derived table of
/// the module documentation; tests and experiments may build their own.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Fraction of a link's bandwidth that carries payload, per protocol (LL, LL128, Simple).
    pub efficiency: [f64; 3],
    /// Latency paid once per collective, per protocol (µs).
    pub base_us: [f64; 3],
    /// Per-message synchronisation latency, `[class][protocol]` (µs).
    pub message_us: [[f64; 3]; 3],
    /// Per rank, the least time between the starts of two messages it sends off its host
    /// (µs): the CPU executor's engine, one thread per rank, writes each to its socket itself,
    /// and a kernel TCP send takes microseconds, so messages that leave one rank at once go
    /// one after another. 0 (none) for GPUs, whose proxies and NICs overlap them.
    pub net_gap_us: f64,
    /// Memory traffic of a local copy, in multiples of the chunk bytes (read + write).
    pub copy_passes: f64,
    /// Memory traffic of a local reduction `dst ← dst ⊕ src` (two reads, one write).
    pub reduce_passes: f64,
    /// Memory traffic of a reduction fused into a receive: the local operand is read and
    /// the result written; the received data streams in with the transfer.
    pub fused_reduce_passes: f64,
    /// CPU ranks of one host: every rank is one thread that does all of its steps' memory
    /// work itself, one step at a time ([`super::cpu`]); `None`: the flow model.
    pub cpu: Option<CpuModel>,
    /// The machine's calibration, when the latencies above were scaled by one: its
    /// bandwidth curve scales every bandwidth by the collective's size
    /// ([`CostModel::bandwidth_factor`]).
    pub calibration: Option<Calibration>,
    /// The protocols the target's executor implements (LL, LL128, Simple): only these
    /// compete in a search. Any protocol can still be simulated (an entry of a plan made
    /// elsewhere), as the executor would run it.
    pub offered: [bool; 3],
}

impl Default for CostModel {
    fn default() -> CostModel {
        CostModel {
            efficiency: [0.5, 120.0 / 128.0, 1.0],
            base_us: [6.6, 14.0, 8.4],
            message_us: [[0.6, 1.9, 3.4], [1.0, 2.5, 5.7], [2.7, 4.0, 14.0]],
            net_gap_us: 0.0,
            copy_passes: 2.0,
            reduce_passes: 3.0,
            fused_reduce_passes: 2.0,
            cpu: None,
            calibration: None,
            offered: [true; 3],
        }
    }
}

impl CostModel {
    /// The model for CPU ranks sharing a host's memory (the executor's threads and process
    /// backends). NCCL's GPU latencies do not apply there: a message is a flag store and a
    /// poll on a shared cache line, and the protocols move the same bytes. Latencies are this
    /// workspace's own measurements on a 2-core x86-64 host (`hccl-perf`, 2 ranks, 8 B:
    /// about 0.3 µs per AllReduce of one message each way), split evenly between the
    /// per-collective and per-message terms; bandwidth comes from the topology (the `host`
    /// generator's memory-copy probe).
    ///
    /// On one host the ranks are modelled as the executor runs them ([`CpuModel`], see
    /// [`super::cpu`]): each rank one thread doing its steps' memory work in turn.
    ///
    /// The CPU executor implements LL (small messages whose flag shares the data's cache
    /// line, in small slots: `hccl_executor::arena`) and Simple; it runs an LL128 entry as
    /// Simple, so LL128 is not offered.
    pub fn cpu_host() -> CostModel {
        let mut message_us = [[CPU_MESSAGE_US; 3]; 3];
        for row in &mut message_us {
            row[proto_index(Protocol::LL)] = CPU_MESSAGE_US * CPU_LL_MESSAGE;
        }
        CostModel {
            cpu: Some(CpuModel::default()),
            message_us,
            offered: [true, false, true],
            ..CostModel::cpu_cluster()
        }
    }

    /// The model for clusters of CPU hosts (`host` boxes with a NIC, networked by the
    /// `cluster` generator): the flow model with [`CostModel::cpu_host`]'s latencies. A
    /// message that leaves the host pays the same per-message term, and its network cost is
    /// the topology's: the route's hop latencies (the NIC's port latency, by default TCP over
    /// Ethernet, about 25 µs NIC to NIC) and the NIC's bandwidth, which it shares max-min
    /// fairly with the host's other ranks. A rank's messages to other hosts start at least
    /// [`CostModel::net_gap_us`] apart: its engine writes each to a socket itself.
    ///
    /// Only Simple is offered: the flow model does not see what LL changes on a host (a
    /// cache line less per message, smaller slots), and between hosts LL buys nothing.
    pub fn cpu_cluster() -> CostModel {
        CostModel {
            efficiency: [1.0, 1.0, 1.0],
            base_us: [CPU_MESSAGE_US; 3],
            message_us: [[CPU_MESSAGE_US; 3]; 3],
            net_gap_us: CPU_NET_GAP_US,
            offered: [false, false, true],
            ..CostModel::default()
        }
    }

    /// Whether the target's executor implements `protocol` (see [`CostModel::offered`]).
    pub fn offers(&self, protocol: Protocol) -> bool {
        self.offered[proto_index(protocol)]
    }

    /// The model that fits `topo`: [`CostModel::cpu_host`] when every rank is a CPU (one
    /// host, or CPU hosts joined by a network), else the NCCL-derived default; corrected by
    /// the topology's calibration when it has one ([`CostModel::calibrated`]).
    pub fn for_topology(topo: &Topology) -> CostModel {
        let model = CostModel::uncalibrated_for(topo);
        match &topo.spec.calibration {
            Some(cal) => model.calibrated(cal),
            None => model,
        }
    }

    /// This model with `cal`'s scales applied to its latencies and its bandwidth curve kept
    /// (replacing any earlier calibration's).
    pub fn calibrated(&self, cal: &Calibration) -> CostModel {
        let base = match &self.calibration {
            Some(old) => self.uncalibrate(old),
            None => self.clone(),
        };
        let mut m = base;
        for b in &mut m.base_us {
            *b *= cal.base_scale;
        }
        for (class, row) in m.message_us.iter_mut().enumerate() {
            for v in row {
                *v *= cal.message_scale[class];
            }
        }
        m.net_gap_us *= cal.message_scale[LinkClass::Net.index()];
        if let Some(cpu) = &mut m.cpu {
            cpu.step_us *= cal.step_scale;
            cpu.send_passes *= cal.send_scale;
            cpu.recv_passes *= cal.recv_scale;
            cpu.local_weight *= cal.local_scale;
            cpu.cores = cal.cores;
        }
        m.calibration = Some(cal.clone());
        m
    }

    fn uncalibrate(&self, old: &Calibration) -> CostModel {
        let mut m = self.clone();
        for b in &mut m.base_us {
            *b /= old.base_scale;
        }
        for (class, row) in m.message_us.iter_mut().enumerate() {
            for v in row {
                *v /= old.message_scale[class];
            }
        }
        m.net_gap_us /= old.message_scale[LinkClass::Net.index()];
        if let Some(cpu) = &mut m.cpu {
            cpu.step_us /= old.step_scale;
            cpu.send_passes /= old.send_scale;
            cpu.recv_passes /= old.recv_scale;
            cpu.local_weight /= old.local_scale;
            cpu.cores = None;
        }
        m.calibration = None;
        m
    }

    /// Whether a flow run's times are affine in the collective's size while its course
    /// stays the same ([`Estimate::course`](super::Estimate::course)): not on a CPU host
    /// model, nor under a calibration, whose bandwidths change with the size.
    pub fn affine_in_size(&self) -> bool {
        self.cpu.is_none() && self.calibration.is_none()
    }

    /// Multiplier of every bandwidth for a collective of `bytes` (1 without calibration).
    pub fn bandwidth_factor(&self, bytes: u64) -> f64 {
        self.calibration
            .as_ref()
            .map_or(1.0, |c| c.bandwidth_factor(bytes))
    }

    /// [`CostModel::for_topology`] without the topology's calibration.
    pub fn uncalibrated_for(topo: &Topology) -> CostModel {
        let all_cpu = topo.ranks.iter().all(|&node| {
            matches!(
                topo.graph[node],
                Node::Device {
                    kind: DeviceKind::Cpu,
                    ..
                }
            )
        });
        if all_cpu && !topo.ranks.is_empty() {
            if topo.nhosts() == 1 {
                CostModel::cpu_host()
            } else {
                CostModel::cpu_cluster()
            }
        } else {
            CostModel::default()
        }
    }

    /// Payload fraction of link bandwidth under `protocol`.
    pub fn efficiency(&self, protocol: Protocol) -> f64 {
        self.efficiency[proto_index(protocol)]
    }

    /// Once-per-collective latency under `protocol` (µs).
    pub fn base_us(&self, protocol: Protocol) -> f64 {
        self.base_us[proto_index(protocol)]
    }

    /// Per-message latency of a transfer whose slowest link is of `class` (µs).
    pub fn message_us(&self, class: LinkClass, protocol: Protocol) -> f64 {
        self.message_us[class.index()][proto_index(protocol)]
    }

    /// The smallest efficiency over protocols' complement: the best payload fraction.
    pub fn best_efficiency(&self) -> f64 {
        self.efficiency.iter().copied().fold(0.0, f64::max)
    }

    /// Smallest base latency over protocols (µs).
    pub fn min_base_us(&self) -> f64 {
        self.base_us.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Smallest per-message latency over protocols and link classes (µs).
    pub fn min_message_us(&self) -> f64 {
        self.message_us
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_hosts_get_the_cpu_model_and_gpus_the_nccl_table() {
        let host = hccl_topologies::build(hccl_topologies::generate::host(4, 10.0), "h").unwrap();
        assert_eq!(CostModel::for_topology(&host), CostModel::cpu_host());
        let dgx = hccl_topologies::shipped_by_name("dgx-h100").unwrap();
        assert_eq!(CostModel::for_topology(&dgx), CostModel::default());
        let cpu_box = hccl_topologies::generate::host_with_nic(2, 10.0, 1.25, 25.0);
        let cluster = hccl_topologies::generate::cluster(3, &cpu_box);
        let cluster = hccl_topologies::build(cluster, "c").unwrap();
        assert_eq!(CostModel::for_topology(&cluster), CostModel::cpu_cluster());
    }

    #[test]
    fn default_table_matches_nccl_ring_numbers() {
        let m = CostModel::default();
        assert_eq!(m.message_us(LinkClass::NvLink, Protocol::Simple), 3.4);
        assert_eq!(m.message_us(LinkClass::Net, Protocol::LL), 2.7);
        assert_eq!(m.base_us(Protocol::LL128), 14.0);
        assert_eq!(m.efficiency(Protocol::LL128), 0.9375);
        assert_eq!(m.min_message_us(), 0.6);
        assert_eq!(m.min_base_us(), 6.6);
        assert_eq!(m.best_efficiency(), 1.0);
    }

    #[test]
    fn link_classes() {
        assert_eq!(LinkClass::of(LinkKind::Hccs), LinkClass::NvLink);
        assert_eq!(LinkClass::of(LinkKind::Pcie), LinkClass::Pci);
        assert_eq!(LinkClass::of(LinkKind::Roce), LinkClass::Net);
        assert!(LinkClass::Net > LinkClass::Pci);
    }
}
