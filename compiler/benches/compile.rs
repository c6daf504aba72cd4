//! Compile time, plan size and per-rank load time of AllReduce plans on clusters of DGX H100
//! boxes: 8 ranks (one box), 64, 1024, 4096 and 32,768 ranks, at the default sizes (1 KiB .. 4 GiB,
//! factor 2), which is what `hcclc compile` does.
//!
//! A compile of thousands of ranks takes seconds to a minute, too long for criterion's ten
//! samples, so this is a plain harness: each configuration is compiled `runs` times (3 up to
//! 64 ranks, once beyond) and the median is reported, with the plan's size on disk (symmetric
//! entries stored as one template, see `hccl_ir::symmetric`), what it would be with every
//! entry written out in full (unless that is over 4M steps), the process's peak memory, and
//! the median time of 9 loads of the whole plan as `hcclc verify` and `HCCL_VERIFY=full` read
//! it (symmetric entries as templates, [`PlanFile::load_compact`]; 3 loads when large); then what a rank of a
//! job does at start with the plan file (medians of as many): load its own programs ([`PlanFile::load_for_ranks`], through the rank
//! index of a large plan), check them against the seals and alone
//! ([`hccl_ir::verify::check_rank`]) and name the plan ([`hccl_ir::PlanPart::identity`]);
//! then load the programs of its host's 8 ranks. Last, every entry verified again, as
//! `HCCL_VERIFY=full` does (once; templates on the template).
//!
//! `cargo bench -p hccl-compiler --bench compile [-- RANKS...]` (default: 8 64 1024 4096
//! 32768).

use hccl_compiler::search::{self, Options};
use hccl_ir::{CollectiveKind, PlanFile};
use hccl_topologies::Topology;
use std::time::{Duration, Instant};

fn cluster(nodes: u32) -> Topology {
    let text = hccl_topologies::shipped_text("dgx-h100").expect("dgx-h100 is shipped");
    let spec = hccl_topologies::parse_spec(text, "dgx-h100").expect("shipped spec parses");
    if nodes == 1 {
        return hccl_topologies::build(spec, "dgx-h100").expect("builds");
    }
    hccl_topologies::build(hccl_topologies::generate::cluster(nodes, &spec), "cluster")
        .expect("cluster builds")
}

/// The process's peak resident memory so far (GB): ranks are compiled in increasing order,
/// so after each compile it is that compile's peak (or a smaller one's, never larger).
fn peak_rss_gb() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    usage.ru_maxrss as f64 * 1024.0 / 1e9
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort_unstable();
    xs[xs.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

fn main() {
    // `cargo bench` passes `--bench`; anything numeric selects rank counts.
    let wanted: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ranks = if wanted.is_empty() {
        vec![8, 64, 1024, 4096, 32768]
    } else {
        wanted
    };
    println!(
        "| ranks | compile (median) | peak memory | entries (symmetric) | plan file | written in full | full load | one rank's start | its host's programs | verified again |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for n in ranks {
        if n % 8 != 0 || n == 0 {
            eprintln!("skipping {n}: clusters of 8-GPU boxes only");
            continue;
        }
        let topo = cluster(n / 8);
        let opts = Options {
            collectives: vec![CollectiveKind::AllReduce],
            ..Options::default()
        };
        let runs = if n <= 64 { 3 } else { 1 };
        let mut times = Vec::new();
        let mut compiled = None;
        for _ in 0..runs {
            let (plan, t) = timed(|| search::compile(&topo, &opts).expect("compiles"));
            times.push(t);
            compiled = Some(plan);
        }
        let plan = compiled.expect("at least one run").plan;
        let text = plan.to_ron();
        let compact = plan.entries.iter().filter(|e| e.is_compact()).count();
        // Written out in full: every entry expanded (template entries too), unless that is
        // more than 4M steps (hundreds of MB of text; the 4096-rank plan's deep pipelines).
        let expanded_steps: u64 = plan
            .entries
            .iter()
            .map(|e| match &e.template {
                Some(t) => t.template_step_count() as u64 * u64::from(t.nranks),
                None => e.schedule.step_count() as u64,
            })
            .sum();
        let full_len = (expanded_steps <= 1 << 22).then(|| {
            let mut full = plan.clone();
            for e in &mut full.entries {
                e.expand_template().expect("expands");
                e.symmetry = None;
            }
            full.to_ron().len()
        });
        let reps = if expanded_steps <= 1 << 22 { 9 } else { 3 };
        let loads = |f: &dyn Fn()| median((0..reps).map(|_| timed(f).1).collect());
        let path =
            std::env::temp_dir().join(format!("hccl-bench-{}-{n}.plan.ron", std::process::id()));
        plan.save(&path).expect("plan written");
        // The whole plan as `hcclc verify` and `HCCL_VERIFY=full` read it: symmetric
        // entries held as their templates (`PlanFile::load_compact`).
        let load_all = loads(&|| {
            PlanFile::load_compact(&path).expect("loads");
        });
        // What a rank of a job does at start with a sealed plan file (written as
        // `hcclc compile` writes it, with a rank index when large): load its own programs,
        // check them against the seals and alone, name the plan for the rendezvous; then,
        // once it knows its host, load the host's ranks' programs.
        let rank = n / 2;
        let start_one = loads(&|| {
            let part = PlanFile::load_for_ranks(&path, &[rank]).expect("loads");
            for e in &part.plan.entries {
                hccl_ir::verify::check_rank(&e.schedule, rank).expect("checks");
            }
            assert!(part.identity().is_some(), "sealed");
        });
        let host: Vec<u32> = (rank / 8 * 8..rank / 8 * 8 + 8).collect();
        let start_host = loads(&|| {
            PlanFile::load_for_ranks(&path, &host).expect("loads");
        });
        // With `HCCL_VERIFY=full` (or an unsealed plan) every rank reads the whole plan and
        // verifies every entry again (templates on the template), as `hcclc verify` does.
        let loaded = PlanFile::load_compact(&path).expect("loads");
        let _ = std::fs::remove_file(&path);
        let (_, verify_all) = timed(|| hccl_ir::verify::verify_plan(&loaded).expect("verifies"));
        println!(
            "| {n} | {:.2} s | {:.2} GB | {} ({compact}) | {:.2} MB | {} | {:.1} ms | {:.2} ms | {:.2} ms | {:.0} ms |",
            median(times).as_secs_f64(),
            peak_rss_gb(),
            plan.entries.len(),
            text.len() as f64 / 1e6,
            full_len.map_or_else(
                || format!("– ({:.1}M steps)", expanded_steps as f64 / 1e6),
                |l| format!("{:.2} MB", l as f64 / 1e6)
            ),
            load_all.as_secs_f64() * 1e3,
            start_one.as_secs_f64() * 1e3,
            start_host.as_secs_f64() * 1e3,
            verify_all.as_secs_f64() * 1e3,
        );
    }
}
