//! Starting the ranks: threads of this process (`--backend threads`), rank processes of this
//! program (`--backend process -g N`, optionally as `--hosts K` emulated hosts), or one rank
//! of a job a launcher started (`mpirun`, torchrun, srun); and the settings that would be
//! ignored, refused.

use crate::args::{Args, Backend, Failure, collective_name, is_v, nominal_sizes, parse_choice};
use crate::output::{Predictor, Printer, calibration_of, finish};
use crate::plan::{obtain_plan, user_plan_file, warn_unforced, with_control_entries};
use crate::sweep::{CommSync, Row, Sweep, ThreadSync, dispatch};
use hccl::executor::{Bootstrap, Config, ProcessGroup, StragglerReport, ThreadGroup};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What a rank thread of the threads backend ends with: its rows and the straggler report
/// its `finalize` returned.
type RankOutcome = (Result<Vec<Row>, Failure>, Option<StragglerReport>);

/// `--backend threads`: every rank a thread of this process, rank 0 printing.
pub(crate) fn run_threads(args: &Args, trace: Option<&Path>) -> Result<(), Failure> {
    let (coll, dtype, op) = parse_choice(args)?;
    let n = args.ranks;
    if n == 0 {
        return Err(Failure::Usage("need -g >= 1".into()));
    }
    if let Some(r) = coll.root().filter(|&r| r >= n) {
        return Err(Failure::Usage(format!(
            "--root {r} is not a rank of -g {n} (ranks 0..{})",
            n - 1
        )));
    }
    let sizes = nominal_sizes(args)?;
    let (plan, label, topo) = obtain_plan(args, coll.kind(), n, true)?;
    // AllReduce entries for the straggler report at the end (appended: the measured
    // entries keep their indices).
    let mut plan = with_control_entries(plan, n);
    plan.ensure_root(coll);
    let mut config = Config::from_env()?;
    if let Some(dir) = trace {
        let calls = hccl::executor::trace::calls_from_env()?;
        config = config.with_trace(Some(hccl::executor::trace::TraceConfig {
            dir: dir.to_path_buf(),
            calls,
        }));
    }
    warn_unforced(&plan, coll, &config);
    let comms = ThreadGroup::with_config(plan.clone(), n, config)
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let sw = Arc::new(Sweep {
        coll,
        vary: is_v(args).then_some(args.counts),
        op,
        dtype,
        sizes,
        args: args.clone(),
        n,
    });
    let sync = Arc::new(ThreadSync::new(n));
    let printer = Printer {
        json: args.json,
        predictor: topo.as_ref().map(Predictor::new),
        calibration: calibration_of(args, topo.as_ref()),
        plan_file: user_plan_file(args),
        plan,
        sw_coll: coll,
        name: collective_name(args),
        dtype,
        op,
        n,
        in_place: args.in_place,
        rows: Vec::new(),
        plot: args.plot.clone(),
        points: Vec::new(),
    };
    printer.header(&label);
    let printer = Mutex::new(printer);
    let binding = should_bind(args, n);
    let results: Vec<RankOutcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let sw = Arc::clone(&sw);
                let mut sync = Arc::clone(&sync);
                let printer = &printer;
                scope.spawn(move || {
                    if binding {
                        bind(rank as u32);
                    }
                    let rows = dispatch(&sw, rank as u32, &mut comm, &mut sync, |row| {
                        if rank == 0 {
                            printer.lock().unwrap_or_else(|e| e.into_inner()).row(row);
                        }
                    });
                    // Collective: a rank whose sweep failed aborted the communicator, so
                    // the others' finalize fails fast instead of waiting for it.
                    let report = comm.finalize();
                    (rows, report)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (Err(Failure::Runtime("a rank panicked".into())), None))
            })
            .collect()
    });
    let printer = printer.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut rows = None;
    let mut report = None;
    for (res, rep) in results {
        match res {
            Ok(r) => rows = rows.or(Some(r)),
            Err(e) => return Err(e),
        }
        report = report.or(rep);
    }
    finish(printer, &label, &rows.unwrap_or_default(), report.as_ref())
}

/// Set by `hccl-perf` for the rank processes it starts when they should bind to cores.
const BIND_ENV: &str = "HCCL_PERF_BIND";

/// Set by `hccl-perf` for its rank processes: the topology their plan was compiled for (empty:
/// none known).
const TOPO_ENV: &str = "HCCL_PERF_TOPO";

/// Set by `hccl-perf` for its rank processes: how the plan they are handed was made.
const LABEL_ENV: &str = "HCCL_PERF_PLAN_LABEL";

/// Whether `n` ranks get a core each.
fn should_bind(args: &Args, n: u32) -> bool {
    !args.no_bind && n as usize <= hccl::executor::affinity::allowed_cpus().len()
}

/// Binds this thread to the core of `rank`; failure only costs speed, so it is a warning.
fn bind(rank: u32) {
    if let Err(e) = hccl::executor::affinity::bind_current_thread(rank as usize) {
        eprintln!("hccl-perf: rank {rank}: {e}; running unbound");
    }
}

/// The launchers' rank variables this process sees (empty: not under a launcher).
const LAUNCHER_VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];

/// Whether a launcher started this process (one of [`LAUNCHER_VARS`] is set).
pub(crate) fn under_launcher() -> bool {
    launcher_var().is_some()
}

/// The first launcher variable set, as `NAME=value`.
fn launcher_var() -> Option<String> {
    LAUNCHER_VARS
        .iter()
        .find_map(|v| std::env::var_os(v).map(|value| format!("{v}={}", value.to_string_lossy())))
}

/// Settings that no backend or setting would honour: an error saying what to do instead,
/// never a silently ignored flag.
pub(crate) fn refuse_ignored(args: &Args) -> Result<(), Failure> {
    if args.hosts > 1 && args.backend == Backend::Threads {
        return Err(Failure::Usage(format!(
            "--hosts {} needs --backend process: emulated hosts are rank processes with \
             their own HCCL_HOST_ID, and the threads backend runs every rank in this one \
             process (add --backend process)",
            args.hosts
        )));
    }
    if let Some(var) = launcher_var() {
        if args.calibrate.is_some() {
            return Err(Failure::Usage(format!(
                "--calibrate under a launcher ({var} is set): calibration starts its own rank \
                 processes for every family, so run it once without mpirun/torchrun/srun \
                 (`hccl-perf --calibrate OUT.ron --backend process -g N`) and give OUT.ron \
                 to the launched ranks with --topo OUT.ron"
            )));
        }
        // hccl-perf's own rank processes carry the label it hands down; a launcher's do not.
        if args.hosts > 1 && std::env::var_os(LABEL_ENV).is_none() {
            return Err(Failure::Usage(format!(
                "--hosts {} under a launcher ({var} is set): the launcher's ranks are on \
                 their real hosts; to emulate hosts, set HCCL_HOST_ID per rank instead, or \
                 run hccl-perf --backend process -g N --hosts K without the launcher",
                args.hosts
            )));
        }
    }
    Ok(())
}

/// One rank of a process job (started by us or by a launcher).
pub(crate) fn run_process_rank(args: &Args) -> Result<(), Failure> {
    let (coll, dtype, op) = parse_choice(args)?;
    let (rank, world) = hccl::executor::process::rank_world_from_env()?;
    if coll.root().is_some_and(|r| r >= world) {
        return Err(Failure::Usage(format!("root must be < {world}")));
    }
    let sizes = nominal_sizes(args)?;
    // Every rank must hold the same plan: a plan handed down by the parent (HCCL_PLAN), the
    // user's, or one compiled without the machine probe (whose numbers differ per process).
    let (plan, label) = match std::env::var_os("HCCL_PLAN") {
        Some(path) => {
            let plan = hccl::executor::config::load_path(Path::new(&path))
                .map_err(|e| Failure::Usage(e.to_string()))?;
            (
                plan,
                std::env::var(LABEL_ENV).unwrap_or_else(|_| "compiled for this machine".into()),
            )
        }
        None => {
            let (plan, label, _) = obtain_plan(args, coll.kind(), world, false)?;
            (plan, label)
        }
    };
    let topo = match std::env::var_os(TOPO_ENV).filter(|p| !p.is_empty()) {
        Some(p) => hccl::topologies::load(Path::new(&p)).ok(),
        None => None,
    };
    let mut plan = with_control_entries(plan, world);
    plan.ensure_root(coll);
    if std::env::var_os(BIND_ENV).is_some() {
        bind(rank);
    }
    let config = Config::from_env()?;
    if rank == 0 {
        warn_unforced(&plan, coll, &config);
    }
    let mut comm =
        ProcessGroup::init_with(plan.clone(), rank, world, &Bootstrap::from_env(), config)?;
    let sw = Sweep {
        coll,
        vary: is_v(args).then_some(args.counts),
        op,
        dtype,
        sizes,
        args: args.clone(),
        n: world,
    };
    let mut printer = Printer {
        json: args.json,
        predictor: topo.as_ref().map(Predictor::new),
        calibration: calibration_of(args, topo.as_ref()),
        plan_file: user_plan_file(args),
        plan,
        sw_coll: coll,
        name: collective_name(args),
        dtype,
        op,
        n: world,
        in_place: args.in_place,
        rows: Vec::new(),
        plot: args.plot.clone(),
        points: Vec::new(),
    };
    if rank == 0 {
        printer.header(&label);
    }
    let rows = dispatch(&sw, rank, &mut comm, &mut CommSync, |row| {
        if rank == 0 {
            printer.row(row);
        }
    })?;
    // Collective, like the sweep: every rank of the job gets here or has failed it.
    let report = comm.finalize();
    if rank == 0 {
        finish(printer, &label, &rows, report.as_ref())
    } else {
        let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
        if wrong > 0 {
            Err(Failure::Runtime(format!("{wrong} wrong element(s)")))
        } else {
            Ok(())
        }
    }
}

/// Starts `-g N` rank processes of this program and waits for them.
pub(crate) fn launch_processes(args: &Args, trace: Option<&Path>) -> Result<(), Failure> {
    let (coll, _, _) = parse_choice(args)?;
    let n = args.ranks;
    if n == 0 {
        return Err(Failure::Usage("need -g >= 1".into()));
    }
    if args.hosts == 0 || args.hosts > n || !n.is_multiple_of(args.hosts) {
        return Err(Failure::Usage(format!(
            "--hosts {} must divide the {n} ranks",
            args.hosts
        )));
    }
    nominal_sizes(args)?;
    // Compile (with the probe) once here and hand the same plan to every rank.
    let (plan, label, topo) = obtain_plan(args, coll.kind(), n, true)?;
    let mut plan = with_control_entries(plan, n);
    plan.ensure_root(coll);
    let dir = std::env::temp_dir();
    let random = RandomState::new().build_hasher().finish();
    let plan_path = dir.join(format!(
        "hccl-perf-{}-{random:016x}.plan.ron",
        std::process::id()
    ));
    plan.save(&plan_path)
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    // The topology the plan was compiled for, so that rank 0 can simulate its entries.
    let topo_path = topo.map(|t| {
        let path = plan_path.with_extension("topo.ron");
        let _ = hccl::ir::write_atomic(&path, hccl::topologies::to_ron(&t.spec).as_bytes());
        path
    });
    let port = hccl::executor::process::local_rendezvous_port()
        .map_err(|e| Failure::Runtime(format!("no free port for the rendezvous: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| Failure::Runtime(e.to_string()))?;
    let token = format!("{:016x}", RandomState::new().build_hasher().finish());
    let mut children = Vec::new();
    let binding = should_bind(args, n);
    for rank in 0..n {
        let mut command = std::process::Command::new(&exe);
        if binding {
            command.env(BIND_ENV, "1");
        } else {
            command.env_remove(BIND_ENV);
        }
        if let Some(dir) = trace {
            command.env("HCCL_TRACE", dir);
        }
        if args.hosts > 1 {
            let per_host = n / args.hosts;
            command.env(
                "HCCL_HOST_ID",
                format!("hccl-perf-{token}-h{}", rank / per_host),
            );
        }
        let child = command
            .args(std::env::args_os().skip(1))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("HCCL_JOB_TOKEN", &token)
            .env("HCCL_PLAN", &plan_path)
            .env(TOPO_ENV, topo_path.as_deref().unwrap_or(Path::new("")))
            .env(LABEL_ENV, &label)
            .spawn()
            .map_err(|e| Failure::Runtime(format!("cannot start rank {rank}: {e}")));
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let _ = std::fs::remove_file(&plan_path);
                if let Some(p) = &topo_path {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
    }
    let mut worst = 0;
    for (rank, mut child) in children.into_iter().enumerate() {
        let code = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
        if code != 0 {
            eprintln!("hccl-perf: rank {rank} exited with code {code}");
        }
        worst = worst.max(code);
    }
    let _ = std::fs::remove_file(&plan_path);
    if let Some(p) = &topo_path {
        let _ = std::fs::remove_file(p);
    }
    match worst {
        0 => Ok(()),
        2 => Err(Failure::Usage("a rank rejected its input".into())),
        _ => Err(Failure::Runtime("a rank failed".into())),
    }
}
