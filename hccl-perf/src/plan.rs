//! The plan a run measures: the user's (`--plan`) or one compiled for this machine (or
//! `--topo`, `--algo`, `--proto`), with the built-in AllReduce entries the ranks synchronise
//! with.

use crate::args::{Args, Backend, Failure};
use hccl::compiler::search;
use hccl::executor::Config;
use hccl::ir::{Collective, CollectiveKind, PlanFile, Protocol};
use hccl::topologies::Topology;
use std::path::PathBuf;

/// The plan (given, or compiled for this machine), its label, and the topology it was
/// compiled for when it was compiled here.
pub(crate) fn obtain_plan(
    args: &Args,
    kind: CollectiveKind,
    n: u32,
    probe: bool,
) -> Result<(PlanFile, String, Option<Topology>), Failure> {
    if let Some(path) = &args.plan {
        let plan =
            hccl::executor::config::load_path(path).map_err(|e| Failure::Usage(e.to_string()))?;
        return Ok((plan, path.display().to_string(), None));
    }
    let topo = match &args.topo {
        Some(path) => {
            let topo = hccl::topologies::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
            hccl::topologies::validate_ranks(&topo, n)
                .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
            topo
        }
        None => {
            let mem_bw = if probe {
                hccl::topologies::probe::probe_host().per_rank_gbps(n)
            } else {
                hccl::topologies::generate::CPU_MEM_BW
            };
            let mut spec = hccl::topologies::generate::host(n, mem_bw);
            // Until this machine is calibrated (`--calibrate`, then `--topo`), the fits of the
            // development machine for as many ranks per core.
            let cores = hccl::executor::affinity::allowed_cpus().len() as u32;
            spec.calibration = Some(hccl::compiler::cost::calibrate::builtin_cpu_calibration(
                n, cores,
            ));
            hccl::topologies::build(spec, "this machine")
                .map_err(|e| Failure::Usage(e.to_string()))?
        }
    };
    let forced = forced_algo(args);
    let mut kinds = vec![kind];
    if args.backend == Backend::Process && kind != CollectiveKind::AllReduce && forced.is_none() {
        // The process backend synchronises ranks with small AllReduces (with a forced family
        // that may not do AllReduce, the built-in entries serve: `with_control_entries`).
        kinds.push(CollectiveKind::AllReduce);
    }
    let options = search::Options {
        collectives: kinds,
        sizes: search::geometric_sizes(8.min(args.min_bytes), args.max_bytes.max(8), 2),
        algorithms: forced.clone().map(|a| vec![a]),
        model: hccl::compiler::cost::CostModel::for_topology(&topo),
        protocols: forced_protocols(args)?,
        ..search::Options::default()
    };
    let compiled = search::compile(&topo, &options).map_err(|e| match &forced {
        Some(algo) => Failure::Usage(format!(
            "cannot force algorithm `{algo}` for {} on {n} ranks: {e}",
            kind.name()
        )),
        None => Failure::Runtime(e.to_string()),
    })?;
    let only = forced.map_or(String::new(), |a| format!(", {a} only"));
    let calibrated = match &topo.spec.calibration {
        Some(c) if c.source.starts_with("built-in") => ", built-in calibration",
        Some(_) => ", calibrated",
        None => "",
    };
    let label = format!(
        "compiled for {} ({} GB/s per rank{calibrated}{only})",
        topo.name,
        topo.mem_bw(0)
    );
    Ok((compiled.plan, label, Some(topo)))
}

/// Says so on stderr when `HCCL_ALGO` names a family the plan has no entry of for `coll`:
/// the communicator then runs the plan's own choice, which the `algorithm` column shows.
pub(crate) fn warn_unforced(plan: &PlanFile, coll: Collective, config: &Config) {
    if let Some(algo) = &config.algo {
        let has = plan.entries.iter().any(|e| {
            e.schedule.collective.kind() == coll.kind() && e.algorithm.eq_ignore_ascii_case(algo)
        });
        if !has {
            eprintln!(
                "hccl-perf: HCCL_ALGO={algo} could not be forced: the plan has no {algo} entry \
                 for {} (the plan's own choice runs; compile without --plan, or with \
                 `hcclc compile --algo {algo}`)",
                coll.kind().name()
            );
        }
    }
}

/// The user's plan file, absolute, for the JSON report.
pub(crate) fn user_plan_file(args: &Args) -> Option<PathBuf> {
    args.plan
        .as_ref()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
}

/// The protocols the default plan is compiled with: `--proto`, else `HCCL_PROTO`, else all.
fn forced_protocols(args: &Args) -> Result<Vec<Protocol>, Failure> {
    let text = args.proto.clone().or_else(|| {
        std::env::var("HCCL_PROTO")
            .ok()
            .filter(|v| !v.trim().is_empty())
    });
    match text {
        Some(text) => {
            Protocol::parse_list(&text).map_err(|e| Failure::Usage(format!("--proto: {e}")))
        }
        None => Ok(Protocol::ALL.to_vec()),
    }
}

/// The family the default plan is compiled from: `--algo`, else `HCCL_ALGO`.
fn forced_algo(args: &Args) -> Option<String> {
    args.algo.clone().or_else(|| {
        std::env::var("HCCL_ALGO")
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

/// Makes sure the plan can synchronise ranks and sum their straggler reports: adds the
/// built-in AllReduce entries when the plan has none (e.g. an imported AllGather).
pub(crate) fn with_control_entries(mut plan: PlanFile, world: u32) -> PlanFile {
    let has_allreduce = plan
        .entries
        .iter()
        .any(|e| e.schedule.collective == Collective::AllReduce);
    if !has_allreduce {
        let builtin = hccl::executor::fallback::plan(world);
        plan.entries.extend(
            builtin
                .entries
                .into_iter()
                .filter(|e| e.schedule.collective == Collective::AllReduce),
        );
    }
    plan
}
