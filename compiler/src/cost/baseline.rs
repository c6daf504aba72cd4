//! The NCCL baseline: which algorithm and protocol NCCL's tuner would pick
//! (`src/graph/tuning.cc`, ANCHORS §2.2), costed in *our* simulator on that algorithm's
//! schedules, so that "speedup over NCCL" compares like with like.
//!
//! NCCL's choice is `argmin over (algorithm, protocol) of latency + bytes / (1000 · algbw)`:
//! - algorithms: Ring for every collective, Tree (double binary tree) for AllReduce;
//!   AllToAll is NCCL's grouped point-to-point exchange (our `pairwise` family) with LL up to
//!   16 KiB (`NCCL_P2P_LL_THRESHOLD`) and Simple beyond;
//! - latency: `base + (nsteps − nInter)·intra + nInter·inter` for Ring,
//!   `base + 2((ppn − 1)·intra + log2(nNodes)·inter)` for Tree, with NCCL's base and hardware
//!   latencies (intra = NVLink or PCI by the fastest in-host link, inter = NET);
//! - bus bandwidth: the ring's bottleneck on our topology (per-rank injection within a host,
//!   the host's NIC bandwidth across hosts), refined per protocol with NCCL's caps
//!   (`llMaxBw`, `perChMaxRingLL128Bw`, `perChMaxTreeBw`, the 0.92 / 120/128 / 7/9 factors);
//!   algorithm bandwidth = bus × `nRanks/nsteps` (Ring) or × 0.5 (Tree).
//!
//! NCCL's Tree correction-factor table and CollNet/NVLS/PAT are not modelled. The
//! architecture row is taken from the GPU model name (V100 → Volta, A100 → Ampere,
//! H100/H200 → Hopper, B100/B200 → Blackwell); other devices use the Ampere row.
//!
//! The baseline's time is the fastest schedule of the chosen family (over its channel and
//! pipeline parameters) at the chosen protocol in our simulator: NCCL's algorithm at its
//! best tuning, which the search's candidates always include.

use super::model::LinkClass;
use super::network::{Network, VertexKind};
use hccl_ir::{CollectiveKind, Protocol};

/// NCCL's tuning constants we use (GB/s and µs), from ANCHORS §2.2.
mod nccl {
    /// Base latency `[Tree, Ring][LL, LL128, Simple]`.
    pub const BASE_LAT: [[f64; 3]; 2] = [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4]];
    /// Hardware latency `[NVLink, PCI, NET][Tree, Ring][LL, LL128, Simple]`.
    pub const HW_LAT: [[[f64; 3]; 2]; 3] = [
        [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4]],
        [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7]],
        [[5.0, 8.5, 14.0], [2.7, 4.0, 14.0]],
    ];
    /// `llMaxBws` for one node, per architecture (Volta, Ampere, Hopper, Blackwell).
    pub const LL_MAX_BW_1NODE: [f64; 4] = [39.0, 87.7, 141.0, 282.0];
    /// `llMaxBws` for 2 and ≥3 nodes (Intel CPU row).
    pub const LL_MAX_BW_MULTI: [f64; 2] = [39.0, 20.4];
    /// `perChMaxRingLL128Bws` per architecture.
    pub const PER_CH_RING_LL128: [f64; 4] = [20.0, 20.0, 36.7, 40.0];
    /// `perChMaxTreeBws` per architecture, columns 1 / 2 / ≥3 nodes.
    pub const PER_CH_TREE: [[f64; 3]; 4] = [
        [26.5, 18.5, 10.0],
        [24.0, 23.6, 17.8],
        [38.7, 41.4, 36.0],
        [70.0, 42.8, 24.0],
    ];
    /// `perChMaxTreeLL128Bws` per architecture, columns 1 / 2 / ≥3 nodes.
    pub const PER_CH_TREE_LL128: [[f64; 3]; 4] = [
        [20.0, 20.0, 20.0],
        [20.0, 20.0, 20.0],
        [36.7, 36.7, 29.0],
        [55.6, 31.67, 20.0],
    ];
    /// Fraction of bus bandwidth Ring LL128 and Tree Simple reach.
    pub const LL128_RING_FACTOR: f64 = 0.92;
    /// Tree LL divides bus bandwidth by this.
    pub const TREE_LL_DIV: f64 = 3.8;
    /// Tree with the tree pattern.
    pub const TREE_PATTERN_FACTOR: f64 = 0.85;
    /// Point-to-point LL threshold (`NCCL_P2P_LL_THRESHOLD`, bytes per peer).
    pub const P2P_LL_THRESHOLD: u64 = 16384;
}

/// NCCL algorithm as far as the baseline is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclAlgo {
    Ring,
    Tree,
    /// Grouped send/receive to all peers (AllToAll).
    P2p,
}

impl NcclAlgo {
    /// The family that implements it in our registry.
    pub fn family(self) -> &'static str {
        match self {
            NcclAlgo::Ring => "ring",
            NcclAlgo::Tree => "tree",
            NcclAlgo::P2p => "pairwise",
        }
    }
}

/// What NCCL would run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NcclChoice {
    pub algo: NcclAlgo,
    pub protocol: Protocol,
    /// NCCL's own predicted time (µs), for reference.
    pub nccl_model_us: f64,
}

/// The baseline for one collective and size: NCCL's pick costed in our simulator.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    /// Family name of NCCL's algorithm (`ring`, `tree`, `pairwise`).
    pub algorithm: String,
    pub protocol: Protocol,
    /// Our simulator's time for it (µs).
    pub time_us: f64,
}

/// GPU architecture row of NCCL's tables.
fn arch_of(network_models: &[String]) -> usize {
    let model = network_models.first().map(|s| s.to_ascii_uppercase());
    match model {
        Some(m) if m.contains("V100") => 0,
        Some(m) if m.contains("H100") || m.contains("H200") || m.contains("H800") => 2,
        Some(m) if m.contains("B100") || m.contains("B200") || m.contains("B300") => 3,
        _ => 1,
    }
}

/// Inputs of NCCL's formula derived from a topology.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclTopo {
    pub nranks: u32,
    pub nnodes: u32,
    pub arch: usize,
    /// Bus bandwidth of the ring (GB/s).
    pub bus_bw: f64,
    /// Class of the in-host links.
    pub intra: LinkClass,
}

impl NcclTopo {
    /// Derives NCCL's view of `network`; `models` are the device model names.
    pub fn new(network: &Network, models: &[String]) -> NcclTopo {
        let n = network.nranks();
        let nnodes = network.nhosts.max(1) as u32;
        // Per-rank injection: capacity of the links leaving each device.
        let mut inj = vec![0.0f64; network.vertices.len()];
        let mut intra = LinkClass::Net;
        for l in &network.links {
            if let VertexKind::Device { .. } = network.vertices[l.from as usize] {
                inj[l.from as usize] += l.cap;
                if l.class != LinkClass::Net {
                    intra = intra.min(l.class);
                }
            }
        }
        let mut bus = network
            .rank_vertex
            .iter()
            .map(|&v| inj[v as usize])
            .fold(f64::INFINITY, f64::min);
        if nnodes > 1 {
            let mut per_host = vec![0.0f64; network.nhosts];
            for (v, kind) in network.vertices.iter().enumerate() {
                if let (VertexKind::Nic { .. }, Some(h)) = (kind, network.vertex_host[v])
                    && let Some(r) = network.nic_tx[v]
                {
                    per_host[h] += network.capacity[r as usize];
                }
            }
            let inter = per_host.iter().copied().fold(f64::INFINITY, f64::min);
            if inter > 0.0 {
                bus = bus.min(inter);
            }
        }
        if !bus.is_finite() || bus <= 0.0 {
            bus = 1.0;
        }
        NcclTopo {
            nranks: n,
            nnodes,
            arch: arch_of(models),
            bus_bw: bus,
            intra,
        }
    }

    fn node_col(&self) -> usize {
        match self.nnodes {
            0 | 1 => 0,
            2 => 1,
            _ => 2,
        }
    }

    /// NCCL's predicted time (µs) of `algo` × `protocol`, or `None` where NCCL does not
    /// offer the combination.
    pub fn predict(
        &self,
        kind: CollectiveKind,
        algo: NcclAlgo,
        protocol: Protocol,
        bytes: u64,
        channels: u32,
    ) -> Option<f64> {
        let p = match protocol {
            Protocol::LL => 0,
            Protocol::LL128 => 1,
            Protocol::Simple => 2,
        };
        let n = f64::from(self.nranks.max(1));
        let nnodes = f64::from(self.nnodes);
        let intra_class = match self.intra {
            LinkClass::NvLink => 0,
            LinkClass::Pci | LinkClass::Net => 1,
        };
        let nch = f64::from(channels.max(1));
        let x = self.bus_bw;
        let arch = self.arch;
        let (lat, algbw) = match algo {
            NcclAlgo::Ring => {
                let nsteps = match kind {
                    CollectiveKind::AllReduce => 2.0 * (n - 1.0),
                    CollectiveKind::AllGather | CollectiveKind::ReduceScatter => n - 1.0,
                    _ => n,
                };
                let ninter = if self.nnodes > 1 {
                    if kind == CollectiveKind::AllReduce {
                        2.0 * (nnodes - 1.0)
                    } else {
                        nnodes - 1.0
                    }
                } else {
                    0.0
                };
                let intra = nccl::HW_LAT[intra_class][1][p];
                let inter = nccl::HW_LAT[2][1][p];
                let lat = nccl::BASE_LAT[1][p] + (nsteps - ninter) * intra + ninter * inter;
                let bus = match protocol {
                    Protocol::LL => {
                        let cap = if self.nnodes <= 1 {
                            nccl::LL_MAX_BW_1NODE[arch]
                        } else {
                            nccl::LL_MAX_BW_MULTI[usize::from(self.nnodes > 2)]
                        };
                        (0.5 * x).min(cap)
                    }
                    Protocol::LL128 => {
                        (nccl::LL128_RING_FACTOR * x).min(nch * nccl::PER_CH_RING_LL128[arch])
                    }
                    Protocol::Simple => x,
                };
                (lat, bus * n / nsteps.max(1.0))
            }
            NcclAlgo::Tree => {
                if kind != CollectiveKind::AllReduce {
                    return None;
                }
                let ppn = n / nnodes.max(1.0);
                let intra = nccl::HW_LAT[intra_class][0][p];
                let inter = nccl::HW_LAT[2][0][p];
                let lat =
                    nccl::BASE_LAT[0][p] + 2.0 * ((ppn - 1.0) * intra + nnodes.log2() * inter);
                let col = self.node_col();
                let bus = match protocol {
                    Protocol::LL => (x / nccl::TREE_LL_DIV).min(if self.nnodes <= 1 {
                        nccl::LL_MAX_BW_1NODE[arch]
                    } else {
                        nccl::LL_MAX_BW_MULTI[usize::from(self.nnodes > 2)]
                    }),
                    Protocol::LL128 => {
                        let f = if self.nnodes <= 1 {
                            7.0 / 9.0
                        } else {
                            120.0 / 128.0
                        };
                        (x * f).min(nch * nccl::PER_CH_TREE_LL128[arch][col])
                    }
                    Protocol::Simple => {
                        (nccl::LL128_RING_FACTOR * x).min(nch * nccl::PER_CH_TREE[arch][col])
                            * nccl::TREE_PATTERN_FACTOR
                    }
                };
                (lat, bus * 0.5)
            }
            NcclAlgo::P2p => {
                if kind != CollectiveKind::AllToAll {
                    return None;
                }
                let per_peer = bytes / u64::from(self.nranks.max(1));
                let want = if per_peer <= nccl::P2P_LL_THRESHOLD {
                    Protocol::LL
                } else {
                    Protocol::Simple
                };
                if protocol != want {
                    return None;
                }
                let class = if self.nnodes > 1 { 2 } else { intra_class };
                let lat = nccl::BASE_LAT[1][p] + nccl::HW_LAT[class][1][p];
                let bus = if protocol == Protocol::LL { 0.5 * x } else { x };
                (lat, bus * n / (n - 1.0).max(1.0))
            }
        };
        if algbw > 0.0 {
            Some(lat + bytes as f64 / (1000.0 * algbw))
        } else {
            None
        }
    }

    /// NCCL's choice among the algorithms available (`available(family name)`).
    pub fn choose(
        &self,
        kind: CollectiveKind,
        bytes: u64,
        channels: u32,
        available: impl Fn(&str) -> bool,
    ) -> Option<NcclChoice> {
        let algos: &[NcclAlgo] = match kind {
            CollectiveKind::AllReduce => &[NcclAlgo::Ring, NcclAlgo::Tree],
            CollectiveKind::AllToAll => &[NcclAlgo::P2p],
            _ => &[NcclAlgo::Ring],
        };
        let mut best: Option<NcclChoice> = None;
        for &algo in algos {
            if !available(algo.family()) {
                continue;
            }
            for protocol in Protocol::ALL {
                if let Some(t) = self.predict(kind, algo, protocol, bytes, channels)
                    && best.is_none_or(|b| t < b.nccl_model_us)
                {
                    best = Some(NcclChoice {
                        algo,
                        protocol,
                        nccl_model_us: t,
                    });
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(nnodes: u32, bus: f64) -> NcclTopo {
        NcclTopo {
            nranks: 8 * nnodes,
            nnodes,
            arch: 2,
            bus_bw: bus,
            intra: LinkClass::NvLink,
        }
    }

    #[test]
    fn small_messages_pick_ll_and_large_pick_simple() {
        let t = topo(1, 450.0);
        let all = |_: &str| true;
        let small = t.choose(CollectiveKind::AllReduce, 1024, 16, all).unwrap();
        assert_eq!(small.protocol, Protocol::LL);
        let large = t
            .choose(CollectiveKind::AllReduce, 1 << 30, 16, all)
            .unwrap();
        assert_eq!(large.protocol, Protocol::Simple);
        assert_eq!(large.algo, NcclAlgo::Ring);
    }

    #[test]
    fn ring_latency_follows_nccl_formula() {
        let t = topo(1, 100.0);
        // 8 ranks, AllReduce, LL: base 6.6 + 14 steps × 0.6 NVLink.
        let pred = t
            .predict(
                CollectiveKind::AllReduce,
                NcclAlgo::Ring,
                Protocol::LL,
                0,
                1,
            )
            .unwrap();
        assert!((pred - (6.6 + 14.0 * 0.6)).abs() < 1e-9, "{pred}");
    }

    #[test]
    fn tree_only_for_allreduce() {
        let t = topo(4, 100.0);
        assert!(
            t.predict(
                CollectiveKind::AllGather,
                NcclAlgo::Tree,
                Protocol::Simple,
                1,
                1
            )
            .is_none()
        );
        let c = t
            .choose(CollectiveKind::Broadcast, 1 << 20, 8, |_| true)
            .unwrap();
        assert_eq!(c.algo, NcclAlgo::Ring);
    }

    #[test]
    fn alltoall_uses_p2p_threshold() {
        let t = topo(1, 100.0);
        let c = t
            .choose(CollectiveKind::AllToAll, 8 * 1024, 1, |_| true)
            .unwrap();
        assert_eq!((c.algo, c.protocol), (NcclAlgo::P2p, Protocol::LL));
        let c = t
            .choose(CollectiveKind::AllToAll, 8 << 20, 1, |_| true)
            .unwrap();
        assert_eq!(c.protocol, Protocol::Simple);
    }
}
