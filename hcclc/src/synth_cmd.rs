//! `hcclc synth`: one synthesizer alone, with its proof of quality. Today: the LP packing of
//! spanning trees for Broadcast, Reduce, AllGather and ReduceScatter
//! (`hccl_compiler::synth`): the trees and their rates against the LP's proven bound (and the
//! max-flow for rooted collectives), the lowered schedule's predicted time against the lower
//! bound, and optionally the verified schedule as a plan.

use crate::cli_error::{CliError, print_json};
use crate::compile_cmd::load_topology;
use clap::Args;
use hccl_compiler::cost::{CostModel, Network, Simulator, bounds};
use hccl_compiler::families::Candidate;
use hccl_compiler::synth::milp::{self, LinkMatrix, ParetoOptions};
use hccl_compiler::synth::{self, Direction, MAX_TREES};
use hccl_ir::{
    Collective, CollectiveKind, PlanEntry, PlanFile, PlanMeta, Protocol, Schedule, Synthesis,
};
use hccl_topologies::Topology;
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
    /// Collective to synthesize: broadcast, reduce, allgather, reducescatter or allreduce
    /// (LP tree packing; allreduce over trees that carry data both ways).
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
    /// Write the verified schedule as a plan of one entry (every size); with --pareto, a
    /// directory that gets one plan per frontier point, `<coll>-s<S>-r<R>-c<C>.plan.ron`.
    #[arg(short = 'o', long = "output", value_name = "PLAN|DIR")]
    pub output: Option<PathBuf>,
    /// The Pareto frontier over (steps, rounds per chunk) in SCCL's model, by MILP over the
    /// direct links (allgather, broadcast; reducescatter and reduce as their duals).
    #[arg(long)]
    pub pareto: bool,
    /// With --pareto: most steps, 1 to 8.
    #[arg(long, default_value_t = 4, value_name = "S")]
    pub max_steps: u32,
    /// With --pareto: most chunks per rank's buffer (allgather) or per buffer (broadcast),
    /// 1 to 16.
    #[arg(long, default_value_t = 8, value_name = "C")]
    pub max_chunks: u32,
    /// With --pareto: seconds each instance's solver calls may take together.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub time_limit: f64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// A tree packing `hcclc synth` found, lowered, verified and predicted: what it reports.
struct Synthesized {
    kind: CollectiveKind,
    rooted: bool,
    direction: Direction,
    pool: synth::Pool,
    packing: synth::Packing,
    solver_ms: f64,
    /// Rooted collectives: the least max-flow between the root and another rank (GB/s).
    max_flow: Option<f64>,
    /// AllReduce: what equal blocks reach (GB/s).
    equal_blocks: Option<f64>,
    algorithm: &'static str,
    candidate: Candidate,
    /// Per size of [`SIZES`]: the best protocol, the predicted time and the lower bound (µs).
    predicted: Vec<(u64, Protocol, f64, f64)>,
    /// Chunks per piece round of a root (`synth::resolution`).
    units: u32,
    /// Chunks per piece of every tree, the roots' trees in turn.
    widths: Vec<u32>,
}

pub fn run(args: SynthArgs) -> Result<(), CliError> {
    if args.pareto {
        return run_pareto(&args);
    }
    let topo = load_topology(&args.topo)?;
    let (kind, collective, channels) = packing_request(&args, &topo)?;
    let s = synthesize(&args, &topo, kind, collective, channels)?;
    if let Some(out) = &args.output {
        let protocol = s
            .predicted
            .last()
            .map_or(Protocol::Simple, |&(_, p, _, _)| p);
        let plan = one_entry_plan(
            &topo,
            "synth",
            s.algorithm.into(),
            protocol,
            s.candidate.synthesis.clone(),
            s.candidate.schedule.clone(),
        );
        plan.save(out).map_err(CliError::input)?;
    }
    if args.json {
        print_packing_json(&args, &topo, &s);
    } else {
        print_packing_text(&args, &topo, &s);
    }
    Ok(())
}

/// The collective `hcclc synth` packs trees for, and the channels per root: the arguments
/// checked against `topo` and the limits.
fn packing_request(
    args: &SynthArgs,
    topo: &Topology,
) -> Result<(CollectiveKind, Collective, u32), CliError> {
    let n = topo.nranks();
    let kind = CollectiveKind::from_name(&args.collective).ok_or_else(|| {
        CliError::Input(format!(
            "unknown collective `{}` (hcclc synth: broadcast, reduce, allgather, reducescatter, allreduce)",
            args.collective
        ))
    })?;
    let collective = match kind {
        CollectiveKind::Broadcast => Collective::Broadcast { root: args.root },
        CollectiveKind::Reduce => Collective::Reduce { root: args.root },
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllReduce => Collective::AllReduce,
        _ => {
            return Err(CliError::Input(format!(
                "hcclc synth does broadcast, reduce, allgather, reducescatter and allreduce \
                 (LP tree packing), not {}; `hcclc compile` searches the built-in families for it",
                kind.name()
            )));
        }
    };
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
    Ok((kind, collective, channels))
}

/// Packs the trees (the link-disjoint ones where the search would take them, else the LP's
/// pruned support), lowers them, verifies the schedule and predicts it at [`SIZES`].
fn synthesize(
    args: &SynthArgs,
    topo: &Topology,
    kind: CollectiveKind,
    collective: Collective,
    channels: u32,
) -> Result<Synthesized, CliError> {
    let n = topo.nranks();
    let rooted = collective.root().is_some();
    let net = Network::new(topo);
    let started = Instant::now();
    // AllReduce: trees carrying data both ways, packed from rank 0 (`synth::allreduce`).
    let (roots, direction) = match collective {
        Collective::AllReduce => (vec![0], Direction::Both),
        _ => synth::packing_of(collective, n)
            .ok_or_else(|| CliError::Input(format!("{} is not a tree packing", kind.name())))?,
    };
    let pool =
        synth::grow_pool(&net, &roots, direction).map_err(|e| CliError::Failed(e.to_string()))?;
    // The link-disjoint trees where the search would take them and they fit --max-trees:
    // alone where they reach the bound (no pruning of the LP's support), else against it.
    let disjoint = (direction != Direction::Both)
        .then(|| synth::disjoint_packing(topo, &roots, direction, &pool))
        .flatten()
        .filter(|d| d.trees_of(roots[0]).count() <= args.max_trees as usize);
    let packing = match disjoint {
        Some(d) if synth::reaches_bound(&d) => (*d).clone(),
        _ => {
            let pruned = synth::prune(&pool, args.max_trees as usize)
                .map_err(|e| CliError::Failed(e.to_string()))?;
            match disjoint {
                Some(d) if synth::prefer_disjoint(&d, &pruned) => (*d).clone(),
                _ => pruned,
            }
        }
    };
    let solver_ms = started.elapsed().as_secs_f64() * 1e3;
    let max_flow = rooted.then(|| {
        (0..n)
            .filter(|&v| v != args.root)
            .map(|v| match direction {
                Direction::FromRoot | Direction::Both => bounds::max_flow(&net, args.root, v),
                Direction::ToRoot => bounds::max_flow(&net, v, args.root),
            })
            .fold(f64::INFINITY, f64::min)
    });

    // What equal blocks reach (ReduceScatter then AllGather at the AllGather packing's rate
    // per root), beside the AllReduce trees.
    let equal_blocks = (direction == Direction::Both)
        .then(|| synth::packing_bound(&net, Collective::AllGather))
        .flatten()
        .map(|per_root| f64::from(n) * per_root / 2.0);
    let algorithm = if direction == Direction::Both {
        "packed_allreduce"
    } else {
        "packed_trees"
    };
    let candidates = if direction == Direction::Both {
        synth::allreduce::lower_allreduce(algorithm, &packing, args.pieces, channels, false)
    } else {
        synth::lower(
            algorithm,
            &packing,
            collective,
            args.pieces,
            channels,
            false,
        )
    };
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
    let model = CostModel::for_topology(topo);
    let sim = Simulator::new(Network::new(topo), model);
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
    Ok(Synthesized {
        kind,
        rooted,
        direction,
        pool,
        packing,
        solver_ms,
        max_flow,
        equal_blocks,
        algorithm,
        candidate,
        predicted,
        units,
        widths,
    })
}

/// A plan of one entry (every size): `schedule`, as `hcclc synth` writes it (`how`: the
/// subcommand, in the plan's `compiler` field).
fn one_entry_plan(
    topo: &Topology,
    how: &str,
    algorithm: String,
    protocol: Protocol,
    synthesis: Option<Synthesis>,
    schedule: Schedule,
) -> PlanFile {
    let mut plan = PlanFile::new(PlanMeta {
        topology: topo.name.clone(),
        topology_hash: topo.hash.clone(),
        compiler: format!("hcclc {} {how}", env!("CARGO_PKG_VERSION")),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm,
        protocol,
        cost: None,
        symmetry: None,
        synthesis,
        schedule,
        template: None,
    });
    plan
}

/// The packing's trees, the roots' in turn.
fn trees(packing: &synth::Packing) -> Vec<&synth::PackedTree> {
    packing
        .roots
        .iter()
        .flat_map(|&r| packing.trees_of(r))
        .collect()
}

/// The depth of a tree given by its vertices' parents.
fn tree_depth(parents: &[Option<u32>]) -> usize {
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
}

/// `hcclc synth --json`: one document.
fn print_packing_json(args: &SynthArgs, topo: &Topology, s: &Synthesized) {
    let Synthesized {
        kind,
        rooted,
        pool,
        packing,
        solver_ms,
        max_flow,
        equal_blocks,
        candidate,
        predicted,
        units,
        widths,
        ..
    } = s;
    let trees = trees(packing);
    print_json(&json!({
        "topology": topo.name,
        "collective": kind.name(),
        "root": rooted.then_some(args.root),
        "method": packing.method,
        "rate_gbps": packing.rate,
        "lp_bound_gbps": packing.bound,
        "optimal": pool.optimal(),
        "column_generation_rounds": pool.rounds,
        "max_flow_gbps": max_flow,
        "equal_blocks_gbps": equal_blocks,
        "pool_trees": packing.pool,
        "pool_rate_gbps": packing.pool_rate,
        "solver_ms": solver_ms,
        "solver": hccl_compiler::lp::NAME,
        "pieces": args.pieces,
        "resolution": units,
        "chunks": candidate.schedule.chunks,
        "steps": candidate.schedule.step_count(),
        "trees": trees.iter().zip(widths).map(|(t, &width)| json!({
            "root": t.root,
            "rate_gbps": t.rate,
            "share": t.rate / packing.rate,
            "depth": tree_depth(&t.parents),
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
        "calibration": hccl_compiler::report::calibration_json(
            topo,
            &crate::compile_cmd::topology_origin(&args.topo),
        ),
        "plan": args.output.as_ref().map(|p| p.display().to_string()),
    }));
}

/// `hcclc synth`: the trees, the rate against its bounds, the predicted times.
fn print_packing_text(args: &SynthArgs, topo: &Topology, s: &Synthesized) {
    let Synthesized {
        kind,
        rooted,
        direction,
        pool,
        packing,
        solver_ms,
        max_flow,
        equal_blocks,
        candidate,
        predicted,
        units,
        widths,
        ..
    } = s;
    let (rooted, direction, units) = (*rooted, *direction, *units);
    let n = topo.nranks();
    let trees = trees(packing);
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
    } else if direction == Direction::Both {
        String::from(", every rank's data reduced up a tree and sent back down it")
    } else {
        String::from(", every rank a root")
    };
    println!(
        "{}{whose} on {} ({n} ranks): {}",
        kind.name(),
        topo.name,
        if packing.method == synth::DISJOINT {
            "link-disjoint trees (Edmonds' theorem), against the LP tree packing's bound"
        } else {
            "LP tree packing"
        }
    );
    println!(
        "  rate {:.1} GB/s{} in {} trees; LP bound {:.1} GB/s ({:.1}%, {} after {} column-generation rounds); pool of {} trees reaches {:.1} GB/s; solved in {:.1} ms",
        packing.rate,
        if direction == Direction::Both {
            " in all (each tree rooted anew at its centre when lowered)"
        } else {
            " per root"
        },
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
    if let Some(equal) = equal_blocks {
        println!(
            "  equal blocks (ReduceScatter then AllGather) reach at most {equal:.1} GB/s; the trees {:.1}%",
            100.0 * packing.rate / equal
        );
    }
    if let Some(flow) = max_flow {
        println!(
            "  max-flow over the links (any path between any vertices): {flow:.1} GB/s; the packing reaches {:.1}%",
            100.0 * packing.rate / flow
        );
    }
    println!("\n  tree  root  rate(GB/s)  share  depth  width  edges (parent>child)");
    for (i, (t, width)) in trees.iter().zip(widths).enumerate() {
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
            tree_depth(&t.parents),
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
    for (bytes, protocol, time_us, bound_us) in predicted {
        println!(
            "  {:>6} {:>8} {time_us:>12.2} {bound_us:>12.2} {:>7.3}",
            hccl_ir::units::format_bytes(*bytes),
            protocol.name(),
            time_us / bound_us
        );
    }
    println!(
        "  {}",
        hccl_compiler::report::calibration_line(
            topo,
            &crate::compile_cmd::topology_origin(&args.topo)
        )
    );
    if let Some(out) = &args.output {
        println!("\n  wrote {}", out.display());
    }
}

/// The time of `schedule` on `topo` at every size of [`SIZES`], each with its best protocol.
fn predict(
    topo: &hccl_topologies::Topology,
    schedule: &hccl_ir::Schedule,
) -> Result<Vec<(u64, Protocol, f64)>, CliError> {
    let model = CostModel::for_topology(topo);
    let sim = Simulator::new(Network::new(topo), model);
    let prepared = sim
        .prepare(schedule)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let mut out = Vec::new();
    for bytes in SIZES {
        let best = Protocol::ALL
            .into_iter()
            .filter(|&p| sim.model.offers(p))
            .filter_map(|p| sim.run(&prepared, bytes, p).ok().map(|e| (p, e.time_us)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((protocol, time_us)) = best {
            out.push((bytes, protocol, time_us));
        }
    }
    Ok(out)
}

/// One point of the frontier as `hcclc synth --pareto` reports it: its predicted times at
/// [`SIZES`] (best protocol each) and the plan written for it.
struct ParetoRow {
    predicted: Vec<(u64, Protocol, f64)>,
    plan: Option<PathBuf>,
}

/// The frontier `hcclc synth --pareto` found, every point lowered, verified and predicted.
struct ParetoReport {
    kind: CollectiveKind,
    rooted: bool,
    links: LinkMatrix,
    frontier: milp::Frontier,
    rows: Vec<ParetoRow>,
}

/// `hcclc synth --pareto`: the frontier over (steps, rounds per chunk) in SCCL's model
/// (`hccl_compiler::synth::milp`), every point lowered, verified, predicted and optionally
/// written as a plan.
fn run_pareto(args: &SynthArgs) -> Result<(), CliError> {
    let topo = load_topology(&args.topo)?;
    let (kind, collective) = pareto_request(args, &topo)?;
    let links = LinkMatrix::from_topology(&topo).map_err(|e| CliError::Input(e.to_string()))?;
    let opts = ParetoOptions {
        max_steps: args.max_steps,
        max_chunks: args.max_chunks,
        time_limit: args.time_limit,
    };
    let frontier =
        milp::pareto(&links, collective, opts).map_err(|e| CliError::Input(e.to_string()))?;
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Input(format!("{}: {e}", dir.display())))?;
    }
    let rows = lower_frontier(args, &topo, kind, &frontier)?;
    let report = ParetoReport {
        kind,
        rooted: collective.root().is_some(),
        links,
        frontier,
        rows,
    };
    if args.json {
        print_pareto_json(args, &topo, &report);
    } else {
        print_pareto_text(args, &topo, &report);
    }
    Ok(())
}

/// The collective of `hcclc synth --pareto`: the arguments checked against `topo` and the
/// MILP's limits.
fn pareto_request(
    args: &SynthArgs,
    topo: &Topology,
) -> Result<(CollectiveKind, Collective), CliError> {
    let n = topo.nranks();
    let kind = CollectiveKind::from_name(&args.collective).ok_or_else(|| {
        CliError::Input(format!(
            "unknown collective `{}` (hcclc synth --pareto: allgather, broadcast, \
             reducescatter, reduce)",
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
                "hcclc synth --pareto does allgather, broadcast, reducescatter and reduce, \
                 not {}",
                kind.name()
            )));
        }
    };
    if args.root >= n {
        return Err(CliError::Input(format!(
            "--root {}: {} has ranks 0..{}",
            args.root,
            topo.name,
            n.saturating_sub(1)
        )));
    }
    if !(2..=milp::MAX_RANKS).contains(&n) {
        return Err(CliError::Input(format!(
            "{} has {n} ranks; hcclc synth --pareto takes 2 to {}",
            topo.name,
            milp::MAX_RANKS
        )));
    }
    if !(1..=milp::MAX_STEPS).contains(&args.max_steps) {
        return Err(CliError::Input(format!(
            "--max-steps {}: expected 1 to {}",
            args.max_steps,
            milp::MAX_STEPS
        )));
    }
    if !(1..=milp::MAX_CHUNKS).contains(&args.max_chunks) {
        return Err(CliError::Input(format!(
            "--max-chunks {}: expected 1 to {}",
            args.max_chunks,
            milp::MAX_CHUNKS
        )));
    }
    if !(args.time_limit.is_finite() && args.time_limit > 0.0 && args.time_limit <= 86_400.0) {
        return Err(CliError::Input(format!(
            "--time-limit {}: expected seconds, more than 0 and at most 86400",
            args.time_limit
        )));
    }
    Ok((kind, collective))
}

/// Every point of `frontier` lowered to a schedule, verified, predicted and, with `-o DIR`,
/// written as a plan.
fn lower_frontier(
    args: &SynthArgs,
    topo: &Topology,
    kind: CollectiveKind,
    frontier: &milp::Frontier,
) -> Result<Vec<ParetoRow>, CliError> {
    let mut rows = Vec::new();
    for p in &frontier.points {
        let inst = p.instance();
        let name = format!("milp_s{}_r{}_c{}", inst.steps, inst.rounds, inst.chunks);
        let cand = milp::lower(&name, &p.algorithm).ok_or_else(|| {
            CliError::Failed(format!("{name}: the algorithm could not be lowered"))
        })?;
        if let Err(errors) = hccl_ir::verify::verify(&cand.schedule) {
            return Err(CliError::Failed(format!(
                "{name}: the synthesized schedule does not verify: {}",
                errors[0]
            )));
        }
        let predicted = predict(topo, &cand.schedule)?;
        let plan = match &args.output {
            None => None,
            Some(dir) => {
                let path = dir.join(format!(
                    "{}-s{}-r{}-c{}.plan.ron",
                    kind.name(),
                    inst.steps,
                    inst.rounds,
                    inst.chunks
                ));
                let protocol = predicted.last().map_or(Protocol::Simple, |&(_, p, _)| p);
                let plan = one_entry_plan(
                    topo,
                    "synth --pareto",
                    name.clone(),
                    protocol,
                    Some(milp::record(p, frontier)),
                    cand.schedule.clone(),
                );
                plan.save(&path).map_err(CliError::input)?;
                Some(path)
            }
        };
        rows.push(ParetoRow { predicted, plan });
    }
    Ok(rows)
}

/// Why the search stopped at a frontier point.
fn stop_of(p: &milp::ParetoPoint) -> &'static str {
    if p.proven {
        "least (lower ratios infeasible)"
    } else {
        "feasible; a lower ratio hit the time limit"
    }
}

/// `hcclc synth --pareto --json`: one document.
fn print_pareto_json(args: &SynthArgs, topo: &Topology, report: &ParetoReport) {
    let ParetoReport {
        kind,
        rooted,
        links,
        frontier,
        rows,
    } = report;
    print_json(&json!({
        "topology": topo.name,
        "collective": kind.name(),
        "root": rooted.then_some(args.root),
        "links": links.rows(),
        "link_unit_gbps": links.unit_gbps,
        "bound": {
            "rounds": frontier.bound.num,
            "chunks": frontier.bound.den,
            "rounds_per_chunk": frontier.bound.value(),
        },
        "least_steps": frontier.least_steps,
        "at_bound": frontier.at_bound,
        "max_steps": args.max_steps,
        "max_chunks": args.max_chunks,
        "time_limit_s": args.time_limit,
        "solver_s": frontier.seconds,
        "points": frontier.points.iter().zip(rows).map(|(p, row)| {
            let i = p.instance();
            json!({
                "steps": i.steps,
                "rounds": i.rounds,
                "chunks": i.chunks,
                "rounds_per_chunk": i.ratio().value(),
                "rounds_per_step": p.algorithm.rounds_per_step,
                "transfers": p.algorithm.transfers.len(),
                "proven": p.proven,
                "stop": stop_of(p),
                "solver_s": p.seconds,
                "verified": true,
                "predicted": row.predicted.iter().map(|&(bytes, protocol, time_us)| json!({
                    "bytes": bytes,
                    "protocol": protocol.name(),
                    "time_us": time_us,
                })).collect::<Vec<_>>(),
                "plan": row.plan.as_ref().map(|p| p.display().to_string()),
            })
        }).collect::<Vec<_>>(),
        "tried": frontier.tried.iter().map(|t| json!({
            "steps": t.instance.steps,
            "rounds": t.instance.rounds,
            "chunks": t.instance.chunks,
            "stop": t.stop.name(),
            "solver_s": t.seconds,
            "solves": t.solves.iter().map(|(model, stop, s)| json!({
                "model": model,
                "stop": stop.name(),
                "seconds": s,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    }));
}

/// `hcclc synth --pareto`: the frontier, then every instance tried.
fn print_pareto_text(args: &SynthArgs, topo: &Topology, report: &ParetoReport) {
    let ParetoReport {
        kind,
        rooted,
        links,
        frontier,
        rows,
    } = report;
    let n = topo.nranks();
    println!(
        "{}{} on {} ({n} ranks): Pareto frontier in SCCL's model (MILP over the direct links, \
         {} GB/s per unit)",
        kind.name(),
        if *rooted {
            format!(" (root {})", args.root)
        } else {
            String::new()
        },
        topo.name,
        links.unit_gbps
    );
    println!(
        "  needs >= {} steps and >= {} = {:.4} rounds per chunk (cut bound); searched steps \
         {}..={} and chunks <= {}, {:.1} s per instance",
        frontier.least_steps,
        frontier.bound,
        frontier.bound.value(),
        frontier.least_steps.max(1),
        args.max_steps,
        args.max_chunks,
        args.time_limit
    );
    println!(
        "\n  {:>5} {:>6} {:>6} {:>7} {:>10} {:>12} {:>12} {:>12} {:>9}  stop",
        "steps",
        "rounds",
        "chunks",
        "R/C",
        "split",
        "t(1KiB)us",
        "t(1MiB)us",
        "t(1GiB)us",
        "solver_s"
    );
    for (p, row) in frontier.points.iter().zip(rows) {
        let i = p.instance();
        let split: Vec<String> = p
            .algorithm
            .rounds_per_step
            .iter()
            .map(u32::to_string)
            .collect();
        let t = |k: usize| {
            row.predicted
                .get(k)
                .map_or("-".to_string(), |&(_, _, us)| format!("{us:.2}"))
        };
        println!(
            "  {:>5} {:>6} {:>6} {:>7.4} {:>10} {:>12} {:>12} {:>12} {:>9.3}  {}",
            i.steps,
            i.rounds,
            i.chunks,
            i.ratio().value(),
            split.join("+"),
            t(0),
            t(1),
            t(2),
            p.seconds,
            stop_of(p)
        );
    }
    if frontier.points.is_empty() {
        println!("  (no point within the limits)");
    }
    println!(
        "\n  {}; every point verified; {} instances tried in {:.2} s:",
        if frontier.at_bound {
            "the last point meets the bound"
        } else {
            "the bound is not met within the limits"
        },
        frontier.tried.len(),
        frontier.seconds
    );
    println!(
        "  {:>5} {:>6} {:>6} {:>9}  stop",
        "steps", "rounds", "chunks", "solver_s"
    );
    for t in &frontier.tried {
        println!(
            "  {:>5} {:>6} {:>6} {:>9.3}  {}",
            t.instance.steps,
            t.instance.rounds,
            t.instance.chunks,
            t.seconds,
            t.stop.name()
        );
    }
    for row in rows {
        if let Some(p) = &row.plan {
            println!("  wrote {}", p.display());
        }
    }
}
