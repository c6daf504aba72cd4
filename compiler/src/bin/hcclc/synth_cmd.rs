//! `hcclc synth`: one synthesizer alone, with its proof of quality. Today: the LP packing of
//! spanning trees for Broadcast, Reduce, AllGather and ReduceScatter
//! (`hccl_compiler::synth`): the trees and their rates against the LP's proven bound (and the
//! max-flow for rooted collectives), the lowered schedule's predicted time against the lower
//! bound, and optionally the verified schedule as a plan.

use crate::cli_error::{CliError, print_json};
use crate::compile_cmd::load_topology;
use clap::Args;
use hccl_compiler::cost::{CostModel, Network, Simulator, bounds};
use hccl_compiler::synth::{self, Direction, MAX_TREES};
use hccl_ir::{Collective, CollectiveKind, PlanEntry, PlanFile, PlanMeta, Protocol};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Largest rank count `hcclc synth` takes (the pricing is cubic in the ranks per round).
const MAX_RANKS: u32 = 64;
/// Most channels per root.
const MAX_CHANNELS: u32 = 64;
/// Most pieces per tree of the lowered schedule.
const MAX_PIECES: u32 = 1024;
/// Sizes the lowered schedule is predicted at.
const SIZES: [u64; 3] = [1 << 10, 1 << 20, 1 << 30];

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Topology file (RON) or the name of a shipped machine (e.g. dgx1-v100).
    pub topo: String,
    /// Collective to synthesize: broadcast, reduce, allgather or reducescatter (LP tree
    /// packing).
    #[arg(short = 'c', long = "collective", default_value = "broadcast")]
    pub collective: String,
    /// Root rank (broadcast and reduce).
    #[arg(long, default_value_t = 0)]
    pub root: u32,
    /// Most trees to keep per root (each a channel of the schedule), 1 to 16.
    #[arg(long, default_value_t = 8, value_name = "K")]
    pub max_trees: u32,
    /// Channels per root (at least the trees kept): a tree owed a larger share of the rate
    /// runs on more channels, since links share their bandwidth among messages fairly.
    #[arg(long, value_name = "C")]
    pub channels: Option<u32>,
    /// Pieces every tree carries (the pipeline depth), 1 to 1024; a tree's pieces are as
    /// large as its share of the rate.
    #[arg(long, default_value_t = 32)]
    pub pieces: u32,
    /// Write the verified schedule as a plan of one entry (every size).
    #[arg(short = 'o', long = "output", value_name = "PLAN")]
    pub output: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SynthArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.topo)?;
    let n = topo.nranks();
    let kind = CollectiveKind::from_name(&args.collective).ok_or_else(|| {
        CliError::Input(format!(
            "unknown collective `{}` (hcclc synth: broadcast, reduce, allgather, reducescatter)",
            args.collective
        ))
    })?;
    let collective = match kind {
        CollectiveKind::Broadcast => Collective::Broadcast { root: args.root },
        CollectiveKind::Reduce => Collective::Reduce { root: args.root },
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        _ => {
            return Err(CliError::Input(format!(
                "hcclc synth does broadcast, reduce, allgather and reducescatter so far (LP \
                 tree packing), not {}; `hcclc compile` searches the built-in families for it",
                kind.name()
            )));
        }
    };
    let rooted = collective.root().is_some();
    if args.root >= n {
        return Err(CliError::Input(format!(
            "--root {}: {} has ranks 0..{}",
            args.root,
            topo.name,
            n.saturating_sub(1)
        )));
    }
    if !(2..=MAX_RANKS).contains(&n) {
        return Err(CliError::Input(format!(
            "{} has {n} ranks; hcclc synth takes 2 to {MAX_RANKS}",
            topo.name
        )));
    }
    if args.max_trees == 0 || args.max_trees as usize > MAX_TREES {
        return Err(CliError::Input(format!(
            "--max-trees {}: expected 1 to {MAX_TREES}",
            args.max_trees
        )));
    }
    if args.pieces == 0 || args.pieces > MAX_PIECES {
        return Err(CliError::Input(format!(
            "--pieces {}: expected 1 to {MAX_PIECES}",
            args.pieces
        )));
    }

    let channels = args.channels.unwrap_or(args.max_trees);
    if channels < args.max_trees || channels > MAX_CHANNELS {
        return Err(CliError::Input(format!(
            "--channels {channels}: expected {} (--max-trees) to {MAX_CHANNELS}",
            args.max_trees
        )));
    }
    let net = Network::new(&topo);
    let started = Instant::now();
    let (roots, direction) = synth::packing_of(collective, n)
        .ok_or_else(|| CliError::Input(format!("{} is not a tree packing", kind.name())))?;
    let pool =
        synth::grow_pool(&net, &roots, direction).map_err(|e| CliError::Failed(e.to_string()))?;
    let packing = synth::prune(&pool, args.max_trees as usize)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let solver_ms = started.elapsed().as_secs_f64() * 1e3;
    let max_flow = rooted.then(|| {
        (0..n)
            .filter(|&v| v != args.root)
            .map(|v| match direction {
                Direction::FromRoot => bounds::max_flow(&net, args.root, v),
                Direction::ToRoot => bounds::max_flow(&net, v, args.root),
            })
            .fold(f64::INFINITY, f64::min)
    });

    let candidates = synth::lower(
        "packed_trees",
        &packing,
        collective,
        args.pieces,
        channels,
        false,
    );
    let Some(candidate) = candidates.into_iter().next() else {
        return Err(CliError::Failed(
            "the packing could not be lowered to a schedule".into(),
        ));
    };
    if let Err(errors) = hccl_ir::verify::verify(&candidate.schedule) {
        return Err(CliError::Failed(format!(
            "the synthesized schedule does not verify: {}",
            errors[0]
        )));
    }
    let model = CostModel::for_topology(&topo);
    let sim = Simulator::new(Network::new(&topo), model);
    let prepared = sim
        .prepare(&candidate.schedule)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let mut predicted = Vec::new();
    for bytes in SIZES {
        let best = Protocol::ALL
            .into_iter()
            .filter(|&p| sim.model.offers(p))
            .filter_map(|p| sim.run(&prepared, bytes, p).ok().map(|e| (p, e.time_us)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let bound = bounds::bound(&sim.network, &sim.model, collective, bytes).total_us;
        if let Some((protocol, time_us)) = best {
            predicted.push((bytes, protocol, time_us, bound));
        }
    }

    // Chunks per piece of every tree (its share of the root's buffer).
    let units = synth::resolution(&packing);
    let mut widths = Vec::with_capacity(packing.trees.len());
    for &root in &packing.roots {
        let rates: Vec<f64> = packing.trees_of(root).map(|t| t.rate).collect();
        widths.extend(synth::piece_widths(&rates, units));
    }
    let trees: Vec<&synth::PackedTree> = packing
        .roots
        .iter()
        .flat_map(|&r| packing.trees_of(r))
        .collect();
    if let Some(out) = &args.output {
        let mut plan = PlanFile::new(PlanMeta {
            topology: topo.name.clone(),
            topology_hash: topo.hash.clone(),
            compiler: format!("hcclc {} synth", env!("CARGO_PKG_VERSION")),
        });
        let protocol = predicted.last().map_or(Protocol::Simple, |&(_, p, _, _)| p);
        plan.entries.push(PlanEntry {
            min_bytes: 0,
            max_bytes: None,
            algorithm: "packed_trees".into(),
            protocol,
            cost: None,
            symmetry: None,
            synthesis: candidate.synthesis.clone(),
            schedule: candidate.schedule.clone(),
        });
        plan.save(out).map_err(CliError::input)?;
    }

    let depth = |parents: &[Option<u32>]| -> usize {
        (0..parents.len())
            .map(|v| {
                let (mut d, mut w) = (0, v);
                while let Some(p) = parents[w] {
                    d += 1;
                    w = p as usize;
                    if d > parents.len() {
                        break;
                    }
                }
                d
            })
            .max()
            .unwrap_or(0)
    };
    if args.json {
        print_json(&json!({
            "topology": topo.name,
            "collective": kind.name(),
            "root": rooted.then_some(args.root),
            "rate_gbps": packing.rate,
            "lp_bound_gbps": packing.bound,
            "optimal": pool.optimal(),
            "column_generation_rounds": pool.rounds,
            "max_flow_gbps": max_flow,
            "pool_trees": packing.pool,
            "pool_rate_gbps": packing.pool_rate,
            "solver_ms": solver_ms,
            "pieces": args.pieces,
            "resolution": units,
            "chunks": candidate.schedule.chunks,
            "steps": candidate.schedule.step_count(),
            "trees": trees.iter().zip(&widths).map(|(t, &width)| json!({
                "root": t.root,
                "rate_gbps": t.rate,
                "share": t.rate / packing.rate,
                "depth": depth(&t.parents),
                "piece_chunks": width,
                "parent": t.parents,
            })).collect::<Vec<_>>(),
            "predicted": predicted.iter().map(|&(bytes, protocol, time_us, bound_us)| json!({
                "bytes": bytes,
                "protocol": protocol.name(),
                "time_us": time_us,
                "bound_us": bound_us,
                "bound_ratio": time_us / bound_us,
            })).collect::<Vec<_>>(),
            "plan": args.output.as_ref().map(|p| p.display().to_string()),
        }));
        return Ok(());
    }
    let whose = if rooted {
        format!(
            " {} rank {}",
            if direction == Direction::FromRoot {
                "from"
            } else {
                "to"
            },
            args.root
        )
    } else {
        String::from(", every rank a root")
    };
    println!(
        "{}{whose} on {} ({n} ranks): LP tree packing",
        kind.name(),
        topo.name
    );
    println!(
        "  rate {:.1} GB/s per root in {} trees; LP bound {:.1} GB/s ({:.1}%, {} after {} column-generation rounds); pool of {} trees reaches {:.1} GB/s; solved in {:.1} ms",
        packing.rate,
        packing.trees.len(),
        packing.bound,
        100.0 * packing.rate / packing.bound,
        if pool.optimal() {
            "optimal"
        } else {
            "not proven optimal"
        },
        pool.rounds,
        packing.pool,
        packing.pool_rate,
        solver_ms
    );
    if let Some(flow) = max_flow {
        println!(
            "  max-flow over the links (any path between any vertices): {flow:.1} GB/s; the packing reaches {:.1}%",
            100.0 * packing.rate / flow
        );
    }
    println!("\n  tree  root  rate(GB/s)  share  depth  width  edges (parent>child)");
    for (i, (t, width)) in trees.iter().zip(&widths).enumerate() {
        let edges: Vec<String> = t
            .parents
            .iter()
            .enumerate()
            .filter_map(|(v, p)| p.map(|u| format!("{u}>{v}")))
            .collect();
        println!(
            "  {i:>4} {:>5} {:>11.2} {:>5.1}% {:>6} {width:>6}  {}",
            t.root,
            t.rate,
            100.0 * t.rate / packing.rate,
            depth(&t.parents),
            edges.join(" ")
        );
    }
    println!(
        "\n  schedule: {} pieces per tree, {} chunks per root ({} per piece round), {} steps, verified",
        args.pieces,
        args.pieces * units,
        units,
        candidate.schedule.step_count()
    );
    println!(
        "\n  {:>6} {:>8} {:>12} {:>12} {:>7}",
        "size", "proto", "time_us", "bound_us", "/bound"
    );
    for (bytes, protocol, time_us, bound_us) in &predicted {
        println!(
            "  {:>6} {:>8} {time_us:>12.2} {bound_us:>12.2} {:>7.3}",
            hccl_ir::units::format_bytes(*bytes),
            protocol.name(),
            time_us / bound_us
        );
    }
    if let Some(out) = &args.output {
        println!("\n  wrote {}", out.display());
    }
    Ok(())
}
