//! Describes this machine (`hcclc topo detect`): CPUs and NUMA nodes and network interfaces
//! from sysfs, memory bandwidth from the copy probe, and, where `nvidia-smi` exists, the
//! GPUs and their NVLink and PCIe matrix (`nvidia-smi topo -m`, `nvidia-smi nvlink -s`,
//! `nvidia-smi -L`).
//!
//! Every source is text, read by a parser that takes the text, so recorded outputs (a sysfs
//! tree copied to a directory, saved `nvidia-smi` outputs) describe other machines exactly as
//! a live run would. What the sources do not say is assumed and listed in
//! [`Detected::notes`].
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
    DeviceKind, DeviceSpec, HostSpec, LinkKind, NicSpec, SwitchKind, SwitchSpec, TopologySpec,
};
use std::path::Path;

/// What a detection found, and what it assumed.
#[derive(Debug, Clone)]
pub struct Detected {
    pub spec: TopologySpec,
    /// One line per fact taken from a source or assumed.
    pub notes: Vec<String>,
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
}

/// A network interface found in sysfs.
#[derive(Debug, Clone, PartialEq)]
pub struct NetDev {
    pub name: String,
    /// Line rate (GB/s per direction).
    pub gbps: f64,
}

/// CPUs per NUMA node (one node when sysfs lists none).
pub fn numa_cpus(sysfs: &Path) -> Vec<u32> {
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
    if counts.is_empty() {
        let online = std::fs::read_to_string(sysfs.join("devices/system/cpu/online"))
            .ok()
            .and_then(|l| cpu_count(l.trim()));
        return vec![online.unwrap_or(1)];
    }
    counts
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

/// The topology of a machine with `sockets` CPU sockets (when known) and `numa` CPUs per
/// NUMA node, network interfaces `nets`,
/// `mem_bw` GB/s of memory bandwidth per CPU rank, and the GPUs `sources` describe (CPU ranks,
/// one per core, when there are none).
pub fn describe(
    host: &str,
    (sockets, numa): (Option<u32>, &[u32]),
    nets: &[NetDev],
    mem_bw: f64,
    sources: &Sources,
) -> Result<Detected, TopologyError> {
    let mut notes = vec![format!(
        "{} CPUs in {}{} NUMA node(s) (sysfs)",
        numa.iter().sum::<u32>(),
        sockets.map_or(String::new(), |s| format!("{s} socket(s), ")),
        numa.len()
    )];
    let mut spec = match &sources.topo_matrix {
        Some(text) => gpu_host(host, numa, parse_topo_matrix(text)?, sources, &mut notes)?,
        None => {
            let cores = numa.iter().sum::<u32>().max(1);
            notes.push(format!(
                "no GPU (no nvidia-smi): {cores} CPU ranks sharing memory, {mem_bw:.1} GB/s each (copy probe)"
            ));
            let mut spec = crate::generate::host(cores, mem_bw);
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
    for (i, nic) in nets.iter().enumerate() {
        let id = format!("nic{i}");
        notes.push(format!(
            "{id}: {} at {} Gbit/s ({:.2} GB/s)",
            nic.name,
            nic.gbps * 8.0,
            nic.gbps
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
        notes.push("no physical network interface up".into());
    }
    spec.description = format!("detected: {}", notes.join("; "));
    Ok(Detected { spec, notes })
}

fn gpu_host(
    host: &str,
    numa: &[u32],
    m: GpuMatrix,
    sources: &Sources,
    notes: &mut Vec<String>,
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
    notes.push(format!(
        "{n} GPUs (nvidia-smi topo -m){}",
        names.first().map(|m| format!(", {m}")).unwrap_or_default()
    ));
    notes.push(match status {
        Some(_) => format!("NVLink {per_link} GB/s per link (nvidia-smi nvlink -s)"),
        None => format!("NVLink {per_link} GB/s per link (assumed; no nvidia-smi nvlink -s)"),
    });
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
    let nodes = numa.len().max(1);
    let bridge = |k: usize| format!("numa{k}");
    let mut switches: Vec<SwitchSpec> = (0..nodes)
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
    // NVLink: one fabric of equal bonds everywhere beyond what direct links allow is an
    // NVSwitch; otherwise direct bonds.
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
    let links_per_gpu = |i: usize| status.as_ref().map_or(MAX_NVLINKS, |s| s[i].0.max(1));
    let switched = uniform && (0..n).any(|i| bond * (n as u32 - 1) > links_per_gpu(i));
    if switched {
        notes.push(format!(
            "every GPU pair NV{bond}: an NVSwitch fabric, {bond} links per GPU"
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
        notes.push(format!("{} GPU pairs joined by NVLink", pairs.len()));
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
        },
        None => Sources::default(),
    }
}

/// Detects the machine whose sysfs is at `sysfs` (`/sys` for this one) with GPU facts from
/// `sources` ([`nvidia_sources`] here): `hcclc topo detect` and the Python
/// `Topology.detect()`. `mem_bw` (GB/s per rank) overrides the measurement: CPU ranks get a
/// copy probe of this machine without it, GPUs the default. `name` defaults to the host name.
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
    let numa = numa_cpus(sysfs);
    let nets = net_devices(sysfs);
    let cores: u32 = numa.iter().sum::<u32>().max(1);
    let mem_bw = match mem_bw {
        Some(bw) => bw,
        None if sources.topo_matrix.is_none() => crate::probe::probe_host().per_rank_gbps(cores),
        None => crate::generate::CPU_MEM_BW,
    };
    let name = name.map(str::to_string).unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "this-machine".to_string())
    });
    describe(&name, (sockets(sysfs), &numa), &nets, mem_bw, sources)
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
