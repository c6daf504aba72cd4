//! `hcclc topo show|gen`: summarise a topology, or generate one of a parametric family.

use crate::cli_error::{CliError, print_json};
use crate::compile_cmd::load_topology;
use clap::{Args, Subcommand};
use hccl_topologies::{Summary, TopologySpec, generate, summarize};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum TopoCommand {
    /// Summarise a topology: devices, links, bandwidth matrix, bisection and injection bandwidth.
    Show(ShowArgs),
    /// Generate a topology description (RON) of a parametric family.
    #[command(subcommand)]
    Gen(GenCommand),
    /// Describe this machine (RON): CPUs and NUMA nodes and network interfaces from sysfs,
    /// memory bandwidth from a copy probe, GPUs and their NVLink/PCIe matrix from
    /// `nvidia-smi` where it exists. Every fact, with where it was found or why it was
    /// assumed, goes to stderr (and to `facts` with --json). A sysfs root that cannot be
    /// read is an error.
    Detect(DetectArgs),
}

#[derive(Args, Debug)]
pub struct DetectArgs {
    /// Name of the topology [default: this host's name].
    #[arg(long)]
    pub name: Option<String>,
    /// Read sysfs from this directory (a recorded tree) instead of /sys.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs: PathBuf,
    /// Recorded `nvidia-smi topo -m` output, instead of running nvidia-smi.
    #[arg(long, value_name = "FILE")]
    pub topo_matrix: Option<PathBuf>,
    /// Recorded `nvidia-smi nvlink -s` output (with --topo-matrix).
    #[arg(long, value_name = "FILE", requires = "topo_matrix")]
    pub nvlink_status: Option<PathBuf>,
    /// Recorded `nvidia-smi -L` output (with --topo-matrix).
    #[arg(long, value_name = "FILE", requires = "topo_matrix")]
    pub gpu_list: Option<PathBuf>,
    /// Per-rank memory bandwidth of a CPU host (GB/s) [default: measured by a copy probe].
    #[arg(long, allow_negative_numbers = true)]
    pub mem_bw: Option<f64>,
    #[command(flatten)]
    pub out: GenOut,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Topology file (RON) or the name of a shipped machine (e.g. dgx1-v100).
    pub file: String,
    /// Print one JSON document instead of text.
    #[arg(long, conflicts_with = "dot")]
    pub json: bool,
    /// Print the machine as a Graphviz graph (render with `dot -Tsvg`): devices by host,
    /// links labelled by kind and bandwidth; hosts summarised beyond 64 ranks.
    #[arg(long)]
    pub dot: bool,
    /// Draw the machine as an SVG picture instead of the report: devices grouped by host,
    /// links by kind and bandwidth (legend, and labels on the links within a row); hosts
    /// summarised beyond 64 ranks.
    #[arg(long, value_name = "FILE.svg", conflicts_with = "dot")]
    pub svg: Option<std::path::PathBuf>,
}

/// Output options shared by every generator.
#[derive(Args, Debug)]
pub struct GenOut {
    /// Write the RON here (atomically) instead of printing it.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Print one JSON document (the spec, and where it was written) instead of RON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum GenCommand {
    /// A ring of GPUs.
    Ring {
        #[arg(long)]
        ranks: u32,
        /// Per-link bandwidth per direction (GB/s).
        #[arg(long)]
        bw: f64,
        /// Per-hop latency (µs).
        #[arg(long)]
        latency: f64,
        #[command(flatten)]
        out: GenOut,
    },
    /// A 2-D or 3-D torus of GPUs with wraparound links.
    Torus {
        /// Dimension sizes, e.g. 4x4 or 2x4x4.
        #[arg(long)]
        dims: String,
        #[arg(long)]
        bw: f64,
        #[arg(long)]
        latency: f64,
        #[command(flatten)]
        out: GenOut,
    },
    /// K copies of a box joined by a rail-optimised leaf/spine network.
    Cluster {
        #[arg(long)]
        nodes: u32,
        /// Shipped machine name or topology file of one box.
        #[arg(long = "box")]
        box_: String,
        #[command(flatten)]
        out: GenOut,
    },
    /// A two-level non-blocking fat tree of single-GPU hosts.
    FatTree {
        #[arg(long)]
        ranks: u32,
        /// Hosts per leaf switch (also the number of spines).
        #[arg(long, default_value_t = 8)]
        per_leaf: u32,
        #[arg(long)]
        bw: f64,
        #[arg(long)]
        latency: f64,
        #[command(flatten)]
        out: GenOut,
    },
    /// CPU ranks sharing one host's memory (what the CPU executor runs on), optionally with a
    /// NIC so that `topo gen cluster --box` can network copies of the host.
    Host {
        #[arg(long)]
        ranks: u32,
        /// Per-rank memory bandwidth (GB/s); default: measured on this machine (a memory-copy
        /// probe, shared among ranks when there are more ranks than cores).
        #[arg(long, allow_negative_numbers = true)]
        mem_bw: Option<f64>,
        /// Give the host one Ethernet NIC, shared by its ranks, of this bandwidth per direction
        /// (GB/s = 1e9 B/s; 1.25 is 10 Gbit/s). Without it the host has no NIC.
        #[arg(long, allow_negative_numbers = true)]
        nic_bw: Option<f64>,
        /// One-way latency of a small message between two such hosts, NIC to NIC, TCP stacks
        /// included (µs) [default: 25]; needs --nic-bw.
        #[arg(long, allow_negative_numbers = true)]
        nic_latency: Option<f64>,
        /// Take the cost-model calibration of this calibrated topology (written by
        /// `hccl-perf --calibrate` or `hcclc calibrate`), and its memory bandwidth unless
        /// --mem-bw is given (the calibration's bandwidth curve is relative to it).
        #[arg(long, value_name = "TOPO")]
        calibration: Option<String>,
        #[command(flatten)]
        out: GenOut,
    },
}

/// Largest generated topology accepted (ranks), so a typo cannot ask for billions of nodes.
const MAX_GEN_RANKS: u64 = 1 << 16;

pub fn run(cmd: TopoCommand) -> Result<(), CliError> {
    match cmd {
        TopoCommand::Show(args) => show(args),
        TopoCommand::Gen(cmd) => generate_cmd(cmd),
        TopoCommand::Detect(args) => detect(args),
    }
}

fn detect(args: DetectArgs) -> Result<(), CliError> {
    use hccl_topologies::detect;
    let read = |p: &Option<PathBuf>| -> Result<Option<String>, CliError> {
        p.as_ref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map_err(|e| CliError::Input(format!("{}: {e}", p.display())))
            })
            .transpose()
    };
    let sources = if args.topo_matrix.is_some() {
        let files: Vec<String> = [&args.topo_matrix, &args.nvlink_status, &args.gpu_list]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        detect::Sources {
            topo_matrix: read(&args.topo_matrix)?,
            nvlink_status: read(&args.nvlink_status)?,
            gpu_list: read(&args.gpu_list)?,
            origin: Some(format!("recorded in {}", files.join(", "))),
        }
    } else {
        detect::nvidia_sources()
    };
    if let Some(bw) = args.mem_bw
        && !(bw.is_finite() && bw > 0.0)
    {
        return Err(CliError::Input(format!(
            "--mem-bw {bw}: must be a positive number"
        )));
    }
    let detected = detect::detect(&args.sysfs, &sources, args.name.as_deref(), args.mem_bw)
        .map_err(CliError::input)?;
    for fact in &detected.facts {
        eprintln!("hcclc: detected: {fact}");
    }
    let facts: Vec<serde_json::Value> = detected
        .facts
        .iter()
        .map(|f| {
            serde_json::json!({
                "fact": f.fact,
                "origin": f.origin.kind(),
                "detail": f.origin.detail(),
            })
        })
        .collect();
    emit_with(detected.spec, args.out, Some(facts))
}

fn show(args: ShowArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.file)?;
    if args.dot {
        print!("{}", hccl_topologies::dot::to_dot(&topo));
        return Ok(());
    }
    if let Some(path) = &args.svg {
        let svg = hccl_compiler::plot::topology_svg(&topo)
            .map_err(|e| CliError::Failed(e.to_string()))?;
        hccl_ir::write_atomic(path, svg.as_bytes())
            .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
        let summarised = topo.nranks() > hccl_topologies::dot::MAX_DETAILED_RANKS;
        if args.json {
            print_json(&serde_json::json!({
                "svg": path.display().to_string(),
                "topology": topo.name,
                "ranks": topo.nranks(),
                "hosts": topo.nhosts(),
                "hosts_summarised": summarised,
            }));
        } else {
            println!(
                "{}: {} ({} ranks, {} host{}{})",
                path.display(),
                topo.name,
                topo.nranks(),
                topo.nhosts(),
                if topo.nhosts() == 1 { "" } else { "s" },
                if summarised { ", one box per host" } else { "" }
            );
        }
        return Ok(());
    }
    let summary = summarize(&topo);
    if args.json {
        let value = serde_json::to_value(&summary)
            .map_err(|e| CliError::Input(format!("cannot encode summary: {e}")))?;
        print_json(&value);
    } else {
        print!("{}", render(&summary));
    }
    Ok(())
}

fn gbps(x: f64) -> String {
    if x.is_infinite() {
        "inf".to_string()
    } else if x == x.round() {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// The text form of `topo show`.
pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "topology {}", s.name);
    if !s.description.is_empty() {
        let _ = writeln!(o, "  {}", s.description);
    }
    let _ = writeln!(o, "hash      {}", s.hash);
    let _ = writeln!(o, "ranks     {}", s.nranks);
    let _ = writeln!(o, "hosts     {}", s.hosts.len());
    for h in &s.hosts {
        let ranks: Vec<String> = h.ranks.iter().map(|r| r.to_string()).collect();
        let _ = writeln!(o, "  {:<20} ranks {}", h.id, ranks.join(","));
    }
    let _ = writeln!(o, "devices");
    for (label, n) in &s.devices {
        let _ = writeln!(o, "  {n:>4} × {label}");
    }
    let _ = writeln!(o, "nics      {}", s.nics);
    if !s.switches.is_empty() {
        let _ = writeln!(o, "switches");
        for (kind, n) in &s.switches {
            let _ = writeln!(o, "  {n:>4} × {kind}");
        }
    }
    let _ = writeln!(
        o,
        "links (entries, physical links, total GB/s per direction)"
    );
    for l in &s.links {
        let _ = writeln!(
            o,
            "  {:<12} {:>5} {:>6} {:>10}",
            l.kind,
            l.entries,
            l.links,
            gbps(l.total_bw)
        );
    }
    let inj: Vec<String> = s.injection_bw.iter().map(|&x| gbps(x)).collect();
    let _ = writeln!(o, "injection bandwidth per rank (GB/s): {}", inj.join(" "));
    let _ = writeln!(o, "bandwidth matrix (GB/s, max-flow rank -> rank)");
    let cells: Vec<Vec<String>> = s
        .bw_matrix
        .iter()
        .map(|row| row.iter().map(|&x| gbps(x)).collect())
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(String::len)
        .chain(std::iter::once(s.nranks.to_string().len()))
        .max()
        .unwrap_or(1);
    let head: Vec<String> = (0..s.nranks).map(|r| format!("{r:>width$}")).collect();
    let _ = writeln!(o, "  {:>4} {}", "", head.join(" "));
    for (r, row) in cells.iter().enumerate() {
        let row: Vec<String> = row.iter().map(|c| format!("{c:>width$}")).collect();
        let _ = writeln!(o, "  {r:>4} {}", row.join(" "));
    }
    match &s.bisection {
        Some(b) => {
            let side: Vec<String> = b.side.iter().map(|r| r.to_string()).collect();
            let _ = writeln!(
                o,
                "bisection {} GB/s ({}); weakest cut: ranks {{{}}} vs the rest",
                gbps(b.bw),
                b.method,
                side.join(",")
            );
        }
        None => {
            let _ = writeln!(o, "bisection n/a (one rank)");
        }
    }
    let _ = writeln!(o, "hop diameter {}", s.hop_diameter);
    o
}

fn check_positive(flag: &str, x: f64) -> Result<(), CliError> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(CliError::Input(format!(
            "--{flag} must be a finite number > 0, got {x}"
        )))
    }
}

fn check_ranks(flag: &str, n: u64) -> Result<(), CliError> {
    if (1..=MAX_GEN_RANKS).contains(&n) {
        Ok(())
    } else {
        Err(CliError::Input(format!(
            "--{flag} must give between 1 and {MAX_GEN_RANKS} ranks, got {n}"
        )))
    }
}

/// Parses `AxB[xC]` into dimension sizes.
fn parse_dims(text: &str) -> Result<Vec<u32>, CliError> {
    let bad = || {
        CliError::Input(format!(
            "--dims {text:?}: expected 2 or 3 sizes >= 1 joined by 'x', e.g. 4x4 or 2x4x4"
        ))
    };
    let dims = text
        .split(['x', 'X'])
        .map(|p| p.trim().parse::<u32>().map_err(|_| bad()))
        .collect::<Result<Vec<u32>, CliError>>()?;
    if !(2..=3).contains(&dims.len()) || dims.contains(&0) {
        return Err(bad());
    }
    Ok(dims)
}

fn generate_cmd(cmd: GenCommand) -> Result<(), CliError> {
    let (spec, out) = match cmd {
        GenCommand::Ring {
            ranks,
            bw,
            latency,
            out,
        } => {
            check_ranks("ranks", u64::from(ranks))?;
            check_positive("bw", bw)?;
            check_positive("latency", latency)?;
            (generate::ring(ranks, bw, latency), out)
        }
        GenCommand::Torus {
            dims,
            bw,
            latency,
            out,
        } => {
            let dims = parse_dims(&dims)?;
            check_ranks("dims", dims.iter().map(|&d| u64::from(d)).product())?;
            check_positive("bw", bw)?;
            check_positive("latency", latency)?;
            (generate::torus(&dims, bw, latency), out)
        }
        GenCommand::Cluster { nodes, box_, out } => {
            let boxed = load_topology(&box_)?;
            if boxed.spec.hosts.iter().all(|h| h.nics.is_empty()) {
                return Err(CliError::Input(format!(
                    "--box {box_}: the box has no NICs, so copies of it cannot be networked \
                     (for CPU hosts, generate the box with `hcclc topo gen host --nic-bw GBPS`)"
                )));
            }
            check_ranks("nodes", u64::from(nodes) * u64::from(boxed.nranks()))?;
            (generate::cluster(nodes, &boxed.spec), out)
        }
        GenCommand::FatTree {
            ranks,
            per_leaf,
            bw,
            latency,
            out,
        } => {
            check_ranks("ranks", u64::from(ranks))?;
            if per_leaf == 0 || per_leaf > 1024 {
                return Err(CliError::Input(format!(
                    "--per-leaf must be between 1 and 1024, got {per_leaf}"
                )));
            }
            check_positive("bw", bw)?;
            check_positive("latency", latency)?;
            (generate::fat_tree(ranks, per_leaf, bw, latency), out)
        }
        GenCommand::Host {
            ranks,
            mem_bw,
            nic_bw,
            nic_latency,
            calibration,
            out,
        } => {
            check_ranks("ranks", u64::from(ranks))?;
            // Flags first, so a bad one is reported before the memory probe runs.
            if let Some(bw) = mem_bw {
                check_positive("mem-bw", bw)?;
            }
            if let Some(bw) = nic_bw {
                check_positive("nic-bw", bw)?;
            }
            if let Some(latency) = nic_latency {
                if nic_bw.is_none() {
                    return Err(CliError::Input(
                        "--nic-latency needs --nic-bw: without --nic-bw the host has no NIC".into(),
                    ));
                }
                check_positive("nic-latency", latency)?;
            }
            let calibrated = match &calibration {
                Some(path) => {
                    let topo = load_topology(path)?;
                    let Some(cal) = topo.spec.calibration.clone() else {
                        return Err(CliError::Input(format!(
                            "{path}: has no calibration (write one with hccl-perf --calibrate)"
                        )));
                    };
                    if topo.nranks() != ranks {
                        eprintln!(
                            "hcclc: note: {path} was calibrated for {} ranks, this host has \
                             {ranks}; latencies depend on the rank count (calibrate with -g \
                             {ranks} for exact numbers)",
                            topo.nranks()
                        );
                    }
                    Some((cal, topo.mem_bw(0)))
                }
                None => None,
            };
            let spec = hccl_compiler::cost::calibrate::host_spec(
                ranks,
                mem_bw,
                nic_bw.map(|bw| (bw, nic_latency)),
                calibrated,
            )
            .map_err(CliError::Input)?;
            (spec, out)
        }
    };
    emit(spec, out)
}

fn emit(spec: TopologySpec, out: GenOut) -> Result<(), CliError> {
    emit_with(spec, out, None)
}

/// [`emit`], with `topo detect`'s facts (each found, given or assumed) in the JSON.
fn emit_with(
    spec: TopologySpec,
    out: GenOut,
    facts: Option<Vec<serde_json::Value>>,
) -> Result<(), CliError> {
    // Every generated spec must build; a failure here is a bad parameter combination.
    let topo = hccl_topologies::build(spec, "<generated>").map_err(CliError::input)?;
    let text = hccl_topologies::to_ron(&topo.spec);
    if let Some(path) = &out.output {
        hccl_ir::write_atomic(path, text.as_bytes())
            .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    }
    if out.json {
        let mut value = serde_json::json!({
            "name": topo.name,
            "hash": topo.hash,
            "nranks": topo.nranks(),
            "nhosts": topo.nhosts(),
            "output": out.output.as_ref().map(|p| p.display().to_string()),
            "ron": text,
        });
        if let Some(facts) = facts {
            value["facts"] = serde_json::Value::from(facts);
        }
        print_json(&value);
    } else if out.output.is_none() {
        print!("{text}");
    }
    Ok(())
}
