//! Describes this machine (`hcclc topo detect`): CPUs and NUMA nodes and network interfaces
//! from sysfs, memory bandwidth from the copy probe, and, where `nvidia-smi` exists, the
//! GPUs and their NVLink and PCIe matrix (`nvidia-smi topo -m`, `nvidia-smi nvlink -s`,
//! `nvidia-smi -L`).
//!
//! Every source is text, read by a parser that takes the text, so recorded outputs (a sysfs
//! tree copied to a directory, saved `nvidia-smi` outputs) describe other machines exactly as
//! a live run would. Every fact says where it was found or why it was assumed
//! ([`Detected::facts`]); a sysfs root that cannot be read is an error, not one CPU.
//!
//! GPUs: a pair shown as `NV#` is joined by `#` NVLinks. When every pair shows the same `NV#`
//! and a GPU could not have that many links to every peer (more than its active links, or
//! more than 18 when `nvlink -s` is not given), the GPUs hang off an NVSwitch fabric, which
//! is modelled as one NVSwitch with `#` links to each GPU: the pairwise NVLink bandwidth is
//! the same as the vendors' 4- or 6-switch fabrics. Other pairs talk over PCIe through their
//! NUMA node's host bridge.

use crate::error::TopologyError;
use crate::generate::link;
use crate::model::{
    DeviceKind, DeviceSpec, HostSpec, LinkKind, LinkSpec, NicSpec, SwitchKind, SwitchSpec,
    TopologySpec,
};
use std::path::Path;

/// What a detection found, and what it assumed.
#[derive(Debug, Clone)]
pub struct Detected {
    pub spec: TopologySpec,
    /// Every fact the description rests on, each with where it was found or why it was
    /// assumed.
    pub facts: Vec<Fact>,
}

impl Detected {
    /// One line per fact (`fact [found: where]`, `[given: how]` or `[assumed: why]`).
    pub fn notes(&self) -> Vec<String> {
        self.facts.iter().map(ToString::to_string).collect()
    }
}

/// Where a fact of a detection comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read from a source: a sysfs file, a tool's output, a probe; says which.
    Found(String),
    /// Given by the caller (a command-line option); says which.
    Given(String),
    /// No source says it: a default or an inference; says why.
    Assumed(String),
}

impl Origin {
    /// `found`, `given` or `assumed`.
    pub fn kind(&self) -> &'static str {
        match self {
            Origin::Found(_) => "found",
            Origin::Given(_) => "given",
            Origin::Assumed(_) => "assumed",
        }
    }

    /// Where it was found, how it was given, or why it was assumed.
    pub fn detail(&self) -> &str {
        match self {
            Origin::Found(s) | Origin::Given(s) | Origin::Assumed(s) => s,
        }
    }
}

/// One fact of a detected machine and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    pub fact: String,
    pub origin: Origin,
}

impl Fact {
    fn found(fact: impl Into<String>, at: impl Into<String>) -> Fact {
        Fact {
            fact: fact.into(),
            origin: Origin::Found(at.into()),
        }
    }

    fn assumed(fact: impl Into<String>, why: impl Into<String>) -> Fact {
        Fact {
            fact: fact.into(),
            origin: Origin::Assumed(why.into()),
        }
    }
}

impl std::fmt::Display for Fact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} [{}: {}]",
            self.fact,
            self.origin.kind(),
            self.origin.detail()
        )
    }
}

/// The text sources of a detection.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `nvidia-smi topo -m`.
    pub topo_matrix: Option<String>,
    /// `nvidia-smi nvlink -s`.
    pub nvlink_status: Option<String>,
    /// `nvidia-smi -L`.
    pub gpu_list: Option<String>,
    /// Where the texts come from (`nvidia-smi on this machine`, recorded files), for the
    /// facts' origins; `None`: not said.
    pub origin: Option<String>,
}

impl Sources {
    /// `tool`, and where its output came from when known.
    fn at(&self, tool: &str) -> String {
        match &self.origin {
            Some(o) => format!("{tool}, {o}"),
            None => tool.to_string(),
        }
    }
}

/// The CPUs of a sysfs tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Cpus {
    /// CPUs per NUMA node (one node, all CPUs, when sysfs lists no node).
    pub per_node: Vec<u32>,
    /// CPU sockets, when sysfs lists them.
    pub sockets: Option<u32>,
    /// Where each of these came from.
    pub facts: Vec<Fact>,
}

impl Cpus {
    /// `per_node` CPUs per NUMA node and `sockets`, as given by the caller (`how`).
    pub fn given(per_node: &[u32], sockets: Option<u32>, how: &str) -> Cpus {
        Cpus {
            per_node: per_node.to_vec(),
            sockets,
            facts: vec![Fact {
                fact: format!(
                    "{} CPUs in {}{} NUMA node(s)",
                    per_node.iter().sum::<u32>(),
                    sockets.map_or(String::new(), |s| format!("{s} socket(s), ")),
                    per_node.len()
                ),
                origin: Origin::Given(how.to_string()),
            }],
        }
    }
}

/// Reads the CPUs, NUMA nodes and sockets of the sysfs tree at `sysfs`. A root that is not
/// a readable directory, or a tree that lists no CPU at all, is an error: nothing is
/// invented for a machine that could not be read.
pub fn cpus(sysfs: &Path) -> Result<Cpus, TopologyError> {
    let sys_err = |message: String| bad("sysfs", message);
    std::fs::read_dir(sysfs).map_err(|e| {
        sys_err(format!(
            "{}: cannot read the sysfs tree: {e} (give --sysfs the directory that holds \
             devices/ and class/: /sys on Linux, or a copy of it)",
            sysfs.display()
        ))
    })?;
    let node_dir = sysfs.join("devices/system/node");
    let online = sysfs.join("devices/system/cpu/online");
    let per_node = numa_cpus(sysfs);
    let mut facts = Vec::new();
    let per_node = match per_node {
        Some(counts) => {
            facts.push(Fact::found(
                format!(
                    "{} CPUs in {} NUMA node(s)",
                    counts.iter().sum::<u32>(),
                    counts.len()
                ),
                format!("{}/node*/cpulist", node_dir.display()),
            ));
            counts
        }
        None => {
            let count = std::fs::read_to_string(&online)
                .ok()
                .and_then(|l| cpu_count(l.trim()))
                .filter(|&c| c > 0)
                .ok_or_else(|| {
                    sys_err(format!(
                        "{}: no CPU listed (neither {}/node*/cpulist nor {} is readable): not \
                         a sysfs tree? give --sysfs the directory that holds devices/ and \
                         class/ (/sys on Linux)",
                        sysfs.display(),
                        node_dir.display(),
                        online.display()
                    ))
                })?;
            facts.push(Fact::found(
                format!("{count} CPUs"),
                online.display().to_string(),
            ));
            facts.push(Fact::assumed(
                "1 NUMA node",
                format!("{} lists no node", node_dir.display()),
            ));
            vec![count]
        }
    };
    let sockets = sockets(sysfs);
    let package = sysfs.join("devices/system/cpu/cpu*/topology/physical_package_id");
    facts.push(match sockets {
        Some(s) => Fact::found(format!("{s} socket(s)"), package.display().to_string()),
        None => Fact::assumed(
            "sockets unknown (not used: the NUMA nodes place the devices)",
            format!("no {}", package.display()),
        ),
    });
    Ok(Cpus {
        per_node,
        sockets,
        facts,
    })
}

/// A network interface found in sysfs.
#[derive(Debug, Clone, PartialEq)]
pub struct NetDev {
    pub name: String,
    /// Line rate (GB/s per direction).
    pub gbps: f64,
}

/// CPUs per NUMA node, `None` when sysfs lists no node with CPUs ([`cpus`] then reads the
/// online CPUs).
pub fn numa_cpus(sysfs: &Path) -> Option<Vec<u32>> {
    let dir = sysfs.join("devices/system/node");
    let mut nodes: Vec<(u32, u32)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            Some((id, cpu_count(list.trim())?))
        })
        .collect();
    nodes.sort_unstable();
    let counts: Vec<u32> = nodes
        .into_iter()
        .map(|(_, c)| c)
        .filter(|&c| c > 0)
        .collect();
    (!counts.is_empty()).then_some(counts)
}

/// CPU sockets (distinct `physical_package_id`s of the CPUs), when sysfs lists them.
pub fn sockets(sysfs: &Path) -> Option<u32> {
    let dir = sysfs.join("devices/system/cpu");
    let mut ids: Vec<i64> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("cpu")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("topology/physical_package_id"))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (!ids.is_empty()).then_some(ids.len() as u32)
}

/// CPUs in a list such as `0-19,40-59`.
fn cpu_count(list: &str) -> Option<u32> {
    if list.is_empty() {
        return Some(0);
    }
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                (b >= a).then(|| b - a + 1)
            }
            None => part.trim().parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

/// Physical network interfaces (those with a `device` link) that are up and report a speed.
/// Each is found in `class/net/NAME/speed` of the tree.
pub fn net_devices(sysfs: &Path) -> Vec<NetDev> {
    let dir = sysfs.join("class/net");
    let mut out: Vec<NetDev> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            if !path.join("device").exists() {
                return None;
            }
            let up = std::fs::read_to_string(path.join("operstate"))
                .map(|s| s.trim() == "up")
                .unwrap_or(false);
            let mbps: i64 = std::fs::read_to_string(path.join("speed"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            (up && mbps > 0).then(|| NetDev {
                name: e.file_name().to_string_lossy().into_owned(),
                gbps: mbps as f64 / 8000.0,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// How two GPUs of `nvidia-smi topo -m` are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuLink {
    /// The diagonal.
    Itself,
    /// `NV#`: a bonded set of this many NVLinks.
    NvLink(u32),
    /// `PIX`, `PXB`, `PHB`, `NODE` or `SYS`: PCIe, possibly across host bridges or sockets.
    Pcie,
}

/// The GPU part of `nvidia-smi topo -m`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuMatrix {
    /// `links[i][j]`: how GPU `i` reaches GPU `j`.
    pub links: Vec<Vec<GpuLink>>,
    /// Each GPU's NUMA node, when the table has the column.
    pub numa: Vec<Option<u32>>,
}

fn bad(what: &str, message: String) -> TopologyError {
    TopologyError::Detect {
        tool: what.to_string(),
        message,
    }
}

/// Parses `nvidia-smi topo -m` (GPU rows and columns; NIC rows and the legend are skipped).
pub fn parse_topo_matrix(text: &str) -> Result<GpuMatrix, TopologyError> {
    const WHAT: &str = "nvidia-smi topo -m";
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| bad(WHAT, "empty output".into()))?;
    let columns: Vec<&str> = header.split('\t').map(str::trim).collect();
    let gpus: Vec<usize> = columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.starts_with("GPU") && c[3..].parse::<u32>().is_ok())
        .map(|(i, _)| i)
        .collect();
    if gpus.is_empty() {
        return Err(bad(WHAT, "the header names no GPU column".into()));
    }
    let numa_col = columns.iter().position(|c| *c == "NUMA Affinity");
    let n = gpus.len();
    let mut links = Vec::new();
    let mut numa = Vec::new();
    for (line_no, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split('\t').map(str::trim).collect();
        let Some(name) = cells.first() else { continue };
        if !(name.starts_with("GPU") && name[3..].parse::<u32>().is_ok()) {
            continue;
        }
        if links.len() == n {
            return Err(bad(WHAT, format!("more GPU rows than the {n} GPU columns")));
        }
        let mut row = Vec::with_capacity(n);
        for &col in &gpus {
            let cell = cells.get(col).copied().unwrap_or("");
            let link = match cell {
                "X" => GpuLink::Itself,
                "PIX" | "PXB" | "PHB" | "NODE" | "SYS" | "SOC" => GpuLink::Pcie,
                c if c.starts_with("NV") => GpuLink::NvLink(c[2..].parse().map_err(|_| {
                    bad(WHAT, format!("row {}: `{c}` is not NV<count>", line_no + 2))
                })?),
                c => {
                    return Err(bad(
                        WHAT,
                        format!("row {} ({name}): unknown connection `{c}`", line_no + 2),
                    ));
                }
            };
            row.push(link);
        }
        numa.push(
            numa_col
                .and_then(|c| cells.get(c))
                .and_then(|v| v.parse::<u32>().ok()),
        );
        links.push(row);
    }
    if links.len() != n {
        return Err(bad(
            WHAT,
            format!("{} GPU rows for {n} GPU columns", links.len()),
        ));
    }
    for (i, row) in links.iter().enumerate() {
        if row[i] != GpuLink::Itself {
            return Err(bad(WHAT, format!("GPU{i}'s own cell is not X")));
        }
        if let Some(j) = (0..n).find(|&j| row[j] != links[j][i]) {
            return Err(bad(WHAT, format!("GPU{i}-GPU{j} and GPU{j}-GPU{i} differ")));
        }
    }
    Ok(GpuMatrix { links, numa })
}

/// Per GPU of `nvidia-smi nvlink -s`: (active links, GB/s of its first link).
pub fn parse_nvlink_status(text: &str) -> Result<Vec<(u32, f64)>, TopologyError> {
    const WHAT: &str = "nvidia-smi nvlink -s";
    let mut out: Vec<(u32, f64)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("GPU ") {
            out.push((0, 0.0));
        } else if let Some(rest) = t.strip_prefix("Link ") {
            let Some(gpu) = out.last_mut() else {
                return Err(bad(WHAT, "a link before any GPU".into()));
            };
            let Some((_, speed)) = rest.split_once(':') else {
                continue;
            };
            let speed = speed.trim();
            if let Some(v) = speed.strip_suffix("GB/s") {
                let v: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(WHAT, format!("`{t}`: the speed is not a number")))?;
                gpu.0 += 1;
                if gpu.1 == 0.0 {
                    gpu.1 = v;
                }
            }
        }
    }
    if out.is_empty() {
        return Err(bad(WHAT, "no GPU listed".into()));
    }
    Ok(out)
}

/// GPU names of `nvidia-smi -L` (`GPU 0: NVIDIA H100 80GB HBM3 (UUID: …)`).
pub fn parse_gpu_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("GPU ")?;
            let (_, name) = rest.split_once(':')?;
            Some(name.split(" (UUID").next()?.trim().to_string())
        })
        .collect()
}

/// Links a GPU may have at most (NVLink4, H100).
const MAX_NVLINKS: u32 = 18;
/// NVLink bandwidth per link and direction when `nvlink -s` is not given (GB/s; NVLink2 to 4).
const DEFAULT_NVLINK_GBPS: f64 = 25.0;
/// PCIe bandwidth per direction of a GPU's x16 slot by generation (GB/s): Gen3, Gen4, Gen5.
const PCIE_GBPS: [f64; 3] = [15.75, 31.5, 63.0];
const NVLINK_LATENCY_US: f64 = 0.3;
const PCIE_LATENCY_US: f64 = 1.0;
const NIC_LATENCY_US: f64 = 1.3;
/// Bandwidth between two NUMA nodes' bridges when nothing better is known (GB/s; a UPI/QPI
/// or Infinity Fabric link is 20-40).
const SOCKET_GBPS: f64 = 20.0;

/// PCIe of a GPU by its name: Gen5 for H100/H200/B-series, Gen4 for A100/A10/L4-class,
/// Gen3 otherwise (V100 and older).
fn pcie_gbps(name: &str) -> f64 {
    let n = name.to_ascii_uppercase();
    if ["H100", "H200", "H800", "GH200", "B100", "B200"]
        .iter()
        .any(|m| n.contains(m))
    {
        PCIE_GBPS[2]
    } else if ["A100", "A800", "A10", "A30", "A40", "L4", "L40"]
        .iter()
        .any(|m| n.contains(m))
    {
        PCIE_GBPS[1]
    } else {
        PCIE_GBPS[0]
    }
}

/// Memory bandwidth per CPU rank (GB/s) and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct MemBw {
    pub gbps: f64,
    pub origin: Origin,
}

/// The topology of a machine with the CPUs `cpus` (facts included), network interfaces
/// `nets` (read from the sysfs tree `net_from`), `mem_bw` of memory bandwidth per CPU rank,
/// and the GPUs `sources` describe (CPU ranks, one per core, when there are none).
pub fn describe(
    host: &str,
    cpus: &Cpus,
    (nets, net_from): (&[NetDev], &Path),
    mem_bw: &MemBw,
    sources: &Sources,
) -> Result<Detected, TopologyError> {
    let numa = cpus.per_node.as_slice();
    let mut facts = cpus.facts.clone();
    let mut spec = match &sources.topo_matrix {
        Some(text) => gpu_host(host, numa, parse_topo_matrix(text)?, sources, &mut facts)?,
        None => {
            let cores = numa.iter().sum::<u32>().max(1);
            facts.push(Fact::found(
                format!("no GPU: {cores} CPU ranks sharing memory, one per CPU"),
                sources
                    .origin
                    .clone()
                    .unwrap_or_else(|| "no nvidia-smi topo -m given".into()),
            ));
            facts.push(Fact {
                fact: format!("memory bandwidth {:.1} GB/s per rank", mem_bw.gbps),
                origin: mem_bw.origin.clone(),
            });
            let mut spec = crate::generate::host(cores, mem_bw.gbps);
            spec.name = host.to_string();
            spec
        }
    };
    // NICs hang off the first NUMA node's bridge (GPU hosts) or the memory (CPU hosts).
    let attach = spec
        .switches
        .first()
        .map(|s| s.id.clone())
        .unwrap_or_else(|| "mem".to_string());
    let class_net = net_from.join("class/net");
    for (i, nic) in nets.iter().enumerate() {
        let id = format!("nic{i}");
        facts.push(Fact::found(
            format!(
                "{id}: {} at {} Gbit/s ({:.2} GB/s)",
                nic.name,
                nic.gbps * 8.0,
                nic.gbps
            ),
            format!("{}/{}/speed", class_net.display(), nic.name),
        ));
        spec.hosts[0].nics.push(NicSpec {
            id: id.clone(),
            bw: nic.gbps,
            kind: Some(LinkKind::Ethernet),
            latency: Some(NIC_LATENCY_US),
        });
        spec.links.push(link(
            &attach,
            &id,
            LinkKind::Pcie,
            nic.gbps,
            PCIE_LATENCY_US,
            1,
        ));
    }
    if nets.is_empty() {
        facts.push(if class_net.is_dir() {
            Fact::found(
                "no physical network interface up with a speed",
                class_net.display().to_string(),
            )
        } else {
            Fact::assumed(
                "no network interface",
                format!("no {}", class_net.display()),
            )
        });
    } else {
        facts.push(Fact::assumed(
            format!("the NICs on {attach}'s PCIe, {NIC_LATENCY_US} µs NIC latency, Ethernet"),
            "sysfs gives no NIC placement or latency",
        ));
    }
    spec.description = format!(
        "detected: {}",
        facts
            .iter()
            .map(|f| format!("{} ({})", f.fact, f.origin.kind()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(Detected { spec, facts })
}

fn gpu_host(
    host: &str,
    numa: &[u32],
    m: GpuMatrix,
    sources: &Sources,
    facts: &mut Vec<Fact>,
) -> Result<TopologySpec, TopologyError> {
    let n = m.links.len();
    let names = sources
        .gpu_list
        .as_deref()
        .map(parse_gpu_list)
        .unwrap_or_default();
    let status = sources
        .nvlink_status
        .as_deref()
        .map(parse_nvlink_status)
        .transpose()?;
    if let Some(s) = &status
        && s.len() != n
    {
        return Err(bad(
            "nvidia-smi nvlink -s",
            format!("{} GPUs listed, the matrix has {n}", s.len()),
        ));
    }
    let per_link = status
        .as_ref()
        .and_then(|s| s.iter().map(|g| g.1).find(|&v| v > 0.0))
        .unwrap_or(DEFAULT_NVLINK_GBPS);
    gpu_facts(
        n,
        &names,
        status.is_some(),
        per_link,
        numa.len(),
        sources,
        facts,
    );
    let gpu = |i: usize| format!("gpu{i}");
    let devices = (0..n)
        .map(|i| DeviceSpec {
            id: gpu(i),
            kind: DeviceKind::Gpu,
            vendor: "NVIDIA".into(),
            model: names.get(i).cloned().unwrap_or_default(),
            rank: None,
            mem_bw: None,
        })
        .collect();
    let (mut switches, mut links) = pcie_fabric(host, numa.len(), &m, &names);
    let links_per_gpu = |i: usize| status.as_ref().map_or(MAX_NVLINKS, |s| s[i].0.max(1));
    nvlink_fabric(
        host,
        &m,
        per_link,
        links_per_gpu,
        sources,
        facts,
        &mut switches,
        &mut links,
    );
    Ok(TopologySpec {
        name: host.to_string(),
        description: String::new(),
        hosts: vec![HostSpec {
            id: host.to_string(),
            devices,
            nics: Vec::new(),
        }],
        switches,
        links,
        calibration: None,
    })
}

/// What `gpu_host` found and what it assumed about a host of `n` GPUs.
fn gpu_facts(
    n: usize,
    names: &[String],
    have_status: bool,
    per_link: f64,
    numa_nodes: usize,
    sources: &Sources,
    facts: &mut Vec<Fact>,
) {
    facts.push(Fact::found(
        format!("{n} GPUs"),
        sources.at("nvidia-smi topo -m"),
    ));
    facts.push(match names.first() {
        Some(m) => Fact::found(format!("GPU model {m}"), sources.at("nvidia-smi -L")),
        None => Fact::assumed("GPU model unknown", "no nvidia-smi -L"),
    });
    facts.push(if have_status {
        Fact::found(
            format!("NVLink {per_link} GB/s per link"),
            sources.at("nvidia-smi nvlink -s"),
        )
    } else {
        Fact::assumed(
            format!("NVLink {per_link} GB/s per link"),
            "no nvidia-smi nvlink -s: NVLink2 to 4's per-link rate",
        )
    });
    let pcie = pcie_gbps(names.first().map_or("", String::as_str));
    facts.push(Fact::assumed(
        format!("PCIe {pcie} GB/s per GPU"),
        match names.first() {
            Some(m) => format!("the PCIe generation of a {m}"),
            None => "Gen3, the GPU model being unknown".to_string(),
        },
    ));
    if numa_nodes > 1 {
        facts.push(Fact::assumed(
            format!("{SOCKET_GBPS} GB/s between NUMA nodes"),
            "no source gives the socket interconnect (UPI/QPI, Infinity Fabric: 20-40)",
        ));
    }
    facts.push(Fact::assumed(
        format!("latency NVLink {NVLINK_LATENCY_US} µs, PCIe {PCIE_LATENCY_US} µs"),
        "typical figures; no source gives them",
    ));
}

/// A PCIe bridge per NUMA node (all joined through the sockets) and every GPU on its node's
/// bridge.
fn pcie_fabric(
    host: &str,
    numa_nodes: usize,
    m: &GpuMatrix,
    names: &[String],
) -> (Vec<SwitchSpec>, Vec<LinkSpec>) {
    let n = m.links.len();
    let gpu = |i: usize| format!("gpu{i}");
    let nodes = numa_nodes.max(1);
    let bridge = |k: usize| format!("numa{k}");
    let switches: Vec<SwitchSpec> = (0..nodes)
        .map(|k| SwitchSpec {
            id: bridge(k),
            kind: SwitchKind::Pcie,
            host: Some(host.to_string()),
            port_bw: None,
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..nodes {
        for b in a + 1..nodes {
            links.push(link(
                &bridge(a),
                &bridge(b),
                LinkKind::Pcie,
                SOCKET_GBPS,
                PCIE_LATENCY_US,
                1,
            ));
        }
    }
    for i in 0..n {
        let node = m.numa[i].map_or(0, |k| k as usize).min(nodes - 1);
        let bw = pcie_gbps(names.get(i).map_or("", String::as_str));
        links.push(link(
            &gpu(i),
            &bridge(node),
            LinkKind::Pcie,
            bw,
            PCIE_LATENCY_US,
            1,
        ));
    }
    (switches, links)
}

/// NVLink: one fabric of equal bonds everywhere beyond what direct links allow is an
/// NVSwitch; otherwise direct bonds.
#[allow(clippy::too_many_arguments)]
fn nvlink_fabric(
    host: &str,
    m: &GpuMatrix,
    per_link: f64,
    links_per_gpu: impl Fn(usize) -> u32,
    sources: &Sources,
    facts: &mut Vec<Fact>,
    switches: &mut Vec<SwitchSpec>,
    links: &mut Vec<LinkSpec>,
) {
    let n = m.links.len();
    let gpu = |i: usize| format!("gpu{i}");
    let pairs: Vec<(usize, usize, u32)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .filter_map(|(i, j)| match m.links[i][j] {
            GpuLink::NvLink(k) => Some((i, j, k)),
            _ => None,
        })
        .collect();
    let every_pair = n >= 3 && pairs.len() == n * (n - 1) / 2;
    let bond = pairs.first().map_or(0, |p| p.2);
    let uniform = every_pair && pairs.iter().all(|p| p.2 == bond);
    let switched = uniform && (0..n).any(|i| bond * (n as u32 - 1) > links_per_gpu(i));
    if switched {
        facts.push(Fact::found(
            format!("every GPU pair NV{bond}: an NVSwitch fabric, {bond} links per GPU"),
            sources.at("nvidia-smi topo -m"),
        ));
        switches.push(SwitchSpec {
            id: "nvswitch".into(),
            kind: SwitchKind::NvSwitch,
            host: Some(host.to_string()),
            port_bw: None,
        });
        for i in 0..n {
            links.push(link(
                &gpu(i),
                "nvswitch",
                LinkKind::NvLink,
                per_link,
                NVLINK_LATENCY_US / 2.0,
                bond,
            ));
        }
    } else {
        facts.push(Fact::found(
            format!("{} GPU pairs joined by NVLink", pairs.len()),
            sources.at("nvidia-smi topo -m"),
        ));
        for (i, j, k) in pairs {
            links.push(link(
                &gpu(i),
                &gpu(j),
                LinkKind::NvLink,
                per_link,
                NVLINK_LATENCY_US,
                k,
            ));
        }
    }
}

/// Runs `nvidia-smi ARGS`; `None` when it is missing or fails.
fn nvidia_smi(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `nvidia-smi`'s topology matrix, NVLink status and GPU list on this machine; empty
/// [`Sources`] when it is missing or fails (a machine without NVIDIA GPUs).
pub fn nvidia_sources() -> Sources {
    match nvidia_smi(&["topo", "-m"]) {
        Some(m) => Sources {
            topo_matrix: Some(m),
            nvlink_status: nvidia_smi(&["nvlink", "-s"]),
            gpu_list: nvidia_smi(&["-L"]),
            origin: Some("run on this machine".into()),
        },
        None => Sources {
            origin: Some("nvidia-smi missing or failing on this machine".into()),
            ..Sources::default()
        },
    }
}

/// Detects the machine whose sysfs is at `sysfs` (`/sys` for this one) with GPU facts from
/// `sources` ([`nvidia_sources`] here): `hcclc topo detect` and the Python
/// `Topology.detect()`. `mem_bw` (GB/s per rank) overrides the measurement: CPU ranks get a
/// copy probe of this machine without it. `name` defaults to the host name. A sysfs root
/// that cannot be read, or that lists no CPU, is an error.
pub fn detect(
    sysfs: &Path,
    sources: &Sources,
    name: Option<&str>,
    mem_bw: Option<f64>,
) -> Result<Detected, TopologyError> {
    if let Some(bw) = mem_bw
        && !(bw.is_finite() && bw > 0.0)
    {
        return Err(TopologyError::Detect {
            tool: "detect".into(),
            message: format!("memory bandwidth {bw}: must be a positive number"),
        });
    }
    let cpus = cpus(sysfs)?;
    let nets = net_devices(sysfs);
    let cores: u32 = cpus.per_node.iter().sum::<u32>().max(1);
    let mem_bw = match mem_bw {
        Some(bw) => MemBw {
            gbps: bw,
            origin: Origin::Given("--mem-bw".into()),
        },
        None if sources.topo_matrix.is_none() => MemBw {
            gbps: crate::probe::probe_host().per_rank_gbps(cores),
            origin: Origin::Found(format!(
                "a memory-copy probe of this machine, shared by {cores} ranks"
            )),
        },
        // GPU hosts have no CPU ranks: the figure is not used.
        None => MemBw {
            gbps: crate::generate::CPU_MEM_BW,
            origin: Origin::Assumed("not used: the ranks are GPUs".into()),
        },
    };
    let name = name.map(str::to_string).unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "this-machine".to_string())
    });
    describe(&name, &cpus, (&nets, sysfs), &mem_bw, sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count() {
        assert_eq!(cpu_count("0-19,40-59"), Some(40));
        assert_eq!(cpu_count("0"), Some(1));
        assert_eq!(cpu_count("3,5-6"), Some(3));
        assert_eq!(cpu_count("5-3"), None);
        assert_eq!(cpu_count("x"), None);
    }

    #[test]
    fn malformed_matrices_are_errors() {
        for bad in [
            "",
            "\tNIC0\nNIC0\t X \n",
            "\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV1\t X \n",
            "\tGPU0\tGPU1\nGPU0\t X \tQQ\nGPU1\tQQ\t X \n",
            "\tGPU0\tGPU1\nGPU0\t X \tNVx\nGPU1\tNVx\t X \n",
            "\tGPU0\tGPU1\nGPU0\t X \tNV2\n",
        ] {
            assert!(parse_topo_matrix(bad).is_err(), "{bad:?}");
        }
    }
}
