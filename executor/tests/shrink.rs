//! Recovery after a lost rank: the survivors of a loop of AllReduces get an error naming the
//! lost rank, shrink the communicator (`Communicator::shrink`), check the new world and
//! finish the loop with the results of the survivors — on the threads backend, on one host
//! with processes (one of them killed with SIGKILL) and across emulated hosts over TCP. The
//! process tests print the recovery's timeline (time to detect, to shrink, to the next
//! correct result; run with `--nocapture` to see it).
//!
//! A test binary of its own, not a module of `tests/it/`: it starts itself again as rank
//! processes that run one test by its exact name, and kills one of them.

mod common;

use hccl_executor::{
    Communicator, ExecError, PlanOrigin, PlanSource, ProcessGroup, ReduceOp, ThreadGroup, fallback,
};
use hccl_ir::PlanFile;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROLE: &str = "HCCL_TEST_ROLE";

/// A survivor's timeline in ms after the kill (error, shrunk, next correct result) and its
/// `TIMELINE` line.
type Timeline = (f64, f64, f64, String);
const ELEMS: usize = 1000;

/// What old rank `old` contributes at iteration `it`: exact in f32 for these sizes.
fn contribution(old: u32, it: u64) -> f32 {
    ((old + 1) as u64 * (it % 1000 + 1)) as f32
}

/// One iteration of the loop: an AllReduce of every rank's contribution, checked against
/// the sum over `ranks` (the old ranks of the group's members, by new rank).
fn step(comm: &mut Communicator, ranks: &[u32], it: u64) -> Result<(), ExecError> {
    let me = ranks[comm.rank() as usize];
    let mut buf = vec![contribution(me, it); ELEMS];
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    let want: f32 = ranks.iter().map(|&r| contribution(r, it)).sum();
    assert!(
        buf.iter().all(|&v| v == want),
        "rank {me} iteration {it}: got {} want {want}",
        buf[0]
    );
    Ok(())
}

/// The lost rank an error names.
fn lost_rank(e: &ExecError) -> Option<u32> {
    match e {
        ExecError::PeerFailed { failed, .. } => Some(*failed),
        ExecError::Timeout {
            peer, blocked_by, ..
        } => Some(blocked_by.unwrap_or(*peer)),
        _ => None,
    }
}

/// Where the survivors resume: the most iterations any of them completed (a lost rank may
/// let some survivors finish an iteration that others did not).
fn resume_point(comm: &mut Communicator, done: u64) -> u64 {
    let mut v = [done];
    comm.all_reduce_in_place(&mut v, ReduceOp::Max)
        .expect("agreeing on the iteration");
    v[0]
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

#[test]
fn threads_survivors_shrink_and_finish_the_loop() {
    const ITERS: u64 = 12;
    const VICTIM: u32 = 1;
    let cfg = common::config().with_timeout(Duration::from_secs(5));
    let comms = ThreadGroup::with_config(fallback::plan(4), 4, cfg).expect("group");
    let all: Vec<u32> = (0..4).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let all = &all;
                s.spawn(move || {
                    let me = comm.rank();
                    let mut it = 0;
                    let err = loop {
                        if me == VICTIM && it == 4 {
                            // This rank stops taking part: its thread "dies".
                            drop(comm);
                            return;
                        }
                        match step(&mut comm, all, it) {
                            Ok(()) => it += 1,
                            Err(e) => break e,
                        }
                        assert!(it < ITERS, "rank {me}: the lost rank went unnoticed");
                    };
                    assert_eq!(lost_rank(&err), Some(VICTIM), "rank {me}: {err}");
                    assert!(err.to_string().contains("rank 1 failed"), "{err}");
                    let mut new = comm.shrink(&[VICTIM]).expect("shrink");
                    // The old communicator stays poisoned.
                    let old = step(&mut comm, all, it).unwrap_err();
                    assert!(matches!(old, ExecError::Poisoned { .. }), "{old}");
                    assert_eq!(new.world_size(), 3);
                    let survivors = [0, 2, 3];
                    assert_eq!(survivors[new.rank() as usize], me);
                    // The 4-rank plan in memory has no 3-rank entries.
                    assert_eq!(new.plan_origin(), &PlanOrigin::Builtin);
                    assert_eq!(new.plan_hash(), fallback::plan(3).content_hash());
                    let from = resume_point(&mut new, it);
                    assert!(from >= 4, "rank {me}: resumes at {from}");
                    for it in from..ITERS {
                        step(&mut new, &survivors, it).expect("after the shrink");
                    }
                    // A shrink of the shrunk group: rank 3 (new rank 2) goes too.
                    if me == 3 {
                        return;
                    }
                    let mut two = new.shrink(&[2]).expect("second shrink");
                    assert_eq!(two.world_size(), 2);
                    step(&mut two, &[0, 2], ITERS).expect("after the second shrink");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    });
}

#[test]
fn shrink_refuses_bad_failed_sets_without_hanging() {
    let cfg = common::config().with_timeout(Duration::from_secs(3));
    let mut comms = ThreadGroup::with_config(fallback::plan(4), 4, cfg).expect("group");
    let e = comms[0].shrink(&[4]).unwrap_err();
    assert!(e.to_string().contains("not a rank of this 4-rank"), "{e}");
    let e = comms[1].shrink(&[1, 2]).unwrap_err();
    assert!(e.to_string().contains("only survivors shrink"), "{e}");
    // Survivors that disagree on the failed ranks all fail, naming both sets.
    drop(comms.pop());
    let start = Instant::now();
    let sets: [&[u32]; 3] = [&[3], &[3], &[1, 3]];
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(sets)
            .map(|(mut comm, set)| s.spawn(move || comm.shrink(set).map(|_| ())))
            .collect();
        for h in handles {
            let e = h.join().expect("rank").unwrap_err();
            // Rank 1 is in the last set: it may be refused for that before it meets.
            let text = e.to_string();
            assert!(
                text.contains("every survivor must pass the same failed ranks")
                    || text.contains("only survivors shrink")
                    || text.contains("timed out"),
                "{text}"
            );
        }
    });
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// A directory of plan files (each one `name` and its plan).
fn plan_dir(tag: &str, plans: &[(&str, PlanFile)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hccl-shrink-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plan dir");
    for (name, plan) in plans {
        plan.save(&dir.join(name)).expect("save a plan");
    }
    dir
}

/// A 3-rank plan that is not the built-in one: its AllReduce entries all one algorithm.
fn three_rank_plan() -> PlanFile {
    let mut p = fallback::plan(3);
    p.meta.topology = "shrink-test-3".into();
    let algo = p
        .entries
        .iter()
        .find(|e| e.schedule.collective == hccl_ir::Collective::AllReduce)
        .map(|e| e.algorithm.clone())
        .expect("an AllReduce entry");
    p.entries
        .retain(|e| e.schedule.collective != hccl_ir::Collective::AllReduce || e.algorithm == algo);
    p
}

/// The hash of the plan for `n` ranks that `dir` gives.
fn dir_hash(dir: &std::path::Path, n: u32) -> String {
    let mut p = hccl_executor::config::load_path(dir).expect("plan dir");
    p.entries.retain(|e| e.schedule.nranks == n);
    p.content_hash()
}

/// Shrinks a 4-rank group from `source` to ranks 0..3 and returns each survivor's plan
/// origin and hash, after one correct AllReduce on the new group.
fn shrink_from(source: PlanSource) -> Vec<(PlanOrigin, String, String)> {
    let cfg = common::config().with_timeout(Duration::from_secs(5));
    let plan = match &source {
        PlanSource::Path(p) => hccl_executor::config::load_path(p).expect("plan"),
        PlanSource::Plan(p) => p.clone(),
        PlanSource::Builtin => fallback::plan(4),
    };
    let mut comms = ThreadGroup::with_config(plan, 4, cfg).expect("group");
    drop(comms.pop());
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let source = source.clone();
                s.spawn(move || {
                    let before = comm.plan_hash().to_string();
                    let mut new = comm.shrink_with(&[3], source).expect("shrink");
                    step(&mut new, &[0, 1, 2], 7).expect("after the shrink");
                    (
                        new.plan_origin().clone(),
                        new.plan_hash().to_string(),
                        before,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

#[test]
fn a_plan_directory_for_several_world_sizes_gives_the_shrunk_plan() {
    let four = fallback::plan(4);
    let three = three_rank_plan();
    let both = plan_dir(
        "both",
        &[
            ("a4.plan.ron", four.clone()),
            ("b3.plan.ron", three.clone()),
        ],
    );
    let only4 = plan_dir("only4", &[("a4.plan.ron", four.clone())]);
    // The directory with plans for 4 and 3 ranks: 4 ranks run its 4-rank entries, the
    // survivors its 3-rank entries.
    for (origin, hash, before) in shrink_from(PlanSource::Path(both.clone())) {
        assert_eq!(origin, PlanOrigin::Path(both.clone()));
        assert_eq!(hash, dir_hash(&both, 3));
        assert_ne!(hash, fallback::plan(3).content_hash());
        assert_eq!(before, dir_hash(&both, 4));
    }
    // Without a 3-rank plan: the built-in one.
    for (origin, hash, _) in shrink_from(PlanSource::Path(only4.clone())) {
        assert_eq!(origin, PlanOrigin::Builtin);
        assert_eq!(hash, fallback::plan(3).content_hash());
    }
    // A plan in memory with entries for both world sizes.
    let mut merged = four.clone();
    merged.entries.extend(three.entries.clone());
    let mut want = merged.clone();
    want.entries.retain(|e| e.schedule.nranks == 3);
    for (origin, hash, before) in shrink_from(PlanSource::Plan(merged.clone())) {
        assert_eq!(origin, PlanOrigin::Memory);
        assert_eq!(hash, want.content_hash());
        assert_eq!(before, four.content_hash());
    }
    let _ = std::fs::remove_dir_all(both);
    let _ = std::fs::remove_dir_all(only4);
}

/// In a child process: a rank of the loop. It prints `READY` after its third iteration,
/// and when the loop fails, shrinks without the rank the error names (which must be
/// `HCCL_TEST_VICTIM`), agrees with the other survivors where to resume, runs 10 more
/// iterations and prints its timeline (Unix nanoseconds) and `DONE`.
fn shrink_child() -> ! {
    let fail = |what: String| -> ! {
        println!("FAIL: {what}");
        std::process::exit(1);
    };
    let victim: u32 = std::env::var("HCCL_TEST_VICTIM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail("no HCCL_TEST_VICTIM".into()));
    let mut comm =
        ProcessGroup::init(PlanSource::Builtin).unwrap_or_else(|e| fail(format!("init: {e}")));
    let me = comm.rank();
    let all: Vec<u32> = (0..comm.world_size()).collect();
    let start = Instant::now();
    let mut it = 0;
    let mut last_ok = unix_ns();
    let err = loop {
        if start.elapsed() > Duration::from_secs(60) {
            fail(format!("rank {me}: no failure within a minute"));
        }
        match step(&mut comm, &all, it) {
            Ok(()) => {
                last_ok = unix_ns();
                it += 1;
            }
            Err(e) => break e,
        }
        if it == 3 {
            println!("READY");
            let _ = std::io::stdout().flush();
        }
        // The rest of a training step.
        std::thread::sleep(Duration::from_millis(1));
    };
    let detected = unix_ns();
    if lost_rank(&err) != Some(victim) {
        fail(format!("rank {me}: the error names another rank: {err}"));
    }
    println!("ERROR: {err}");
    let mut new = comm
        .shrink(&[victim])
        .unwrap_or_else(|e| fail(format!("rank {me}: shrink: {e}")));
    let shrunk = unix_ns();
    let survivors: Vec<u32> = all.iter().copied().filter(|&r| r != victim).collect();
    if new.world_size() != 3 || survivors[new.rank() as usize] != me {
        fail(format!(
            "rank {me}: new rank {} of {}",
            new.rank(),
            new.world_size()
        ));
    }
    let from = resume_point(&mut new, it);
    let mut first = 0;
    for it in from..from + 10 {
        if let Err(e) = step(&mut new, &survivors, it) {
            fail(format!("rank {me} after the shrink: {e}"));
        }
        if first == 0 {
            first = unix_ns();
        }
    }
    println!(
        "TIMELINE rank={me} new={} last_ok={last_ok} detected={detected} shrunk={shrunk} first={first} origin={:?}",
        new.rank(),
        new.plan_origin()
    );
    println!("DONE");
    let _ = std::io::stdout().flush();
    // Say goodbye to the peers before leaving (the old communicator, too).
    drop(new);
    drop(comm);
    std::process::exit(0);
}

#[test]
fn shrink_child_role() {
    if std::env::var(ROLE).as_deref() == Ok("shrink") {
        shrink_child();
    }
}

/// Starts 4 ranks of the loop (`hosts[r]`: rank r's `HCCL_HOST_ID`), SIGKILLs `victim`
/// once it has run three iterations, checks that the survivors finish, and returns each
/// survivor's timeline in ms from the kill: (detected, shrunk, first correct result), with
/// its output.
fn kill_one_of_four(
    victim: u32,
    hosts: Option<[&str; 4]>,
    env: &[(&str, String)],
) -> Vec<Timeline> {
    let exe = std::env::current_exe().expect("test executable");
    let port = common::free_port().to_string();
    let mut children: Vec<Option<Child>> = (0..4u32)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            common::rank_command(
                &mut cmd,
                "shrink_child_role",
                "shrink",
                (r, 4),
                ("127.0.0.1", &port),
                "shrink-test-token",
            )
            .env_remove("HCCL_PLAN")
            .env("HCCL_TIMEOUT", "10")
            .env("HCCL_TEST_VICTIM", victim.to_string());
            if let Some(hosts) = hosts {
                cmd.env("HCCL_HOST_ID", hosts[r as usize]);
            }
            for (k, v) in env {
                cmd.env(k, v);
            }
            Some(cmd.spawn().expect("spawn a rank"))
        })
        .collect();
    let mut v = children[victim as usize].take().expect("victim");
    let mut lines = BufReader::new(v.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        let read = lines.read_line(&mut line).unwrap_or(0);
        if read == 0 {
            let _ = v.kill();
            let _ = v.wait();
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("rank {victim} ended before its third iteration");
        }
        if line.contains("READY") {
            break;
        }
    }
    let killed = unix_ns();
    v.kill().expect("kill the victim");
    let _ = v.wait();
    // Every survivor waited for (or killed past the limit) before any assertion, so a
    // failing rank leaves no process behind.
    let finished: Vec<(usize, Option<i32>, String)> = children
        .into_iter()
        .enumerate()
        .filter_map(|(r, c)| c.map(|c| (r, c)))
        .map(|(r, c)| {
            let (code, text) = common::wait_output(c, Duration::from_secs(60));
            (r, code, text)
        })
        .collect();
    let mut out = Vec::new();
    for (r, code, text) in finished {
        assert_eq!(code, Some(0), "rank {r}:\n{text}");
        assert!(
            text.contains(&format!("rank {victim} failed")),
            "rank {r}:\n{text}"
        );
        let tl = text
            .lines()
            .find_map(|l| l.find("TIMELINE").map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("rank {r}: no timeline:\n{text}"))
            .to_string();
        let field = |name: &str| -> u128 {
            tl.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("rank {r}: {name} in {tl}"))
        };
        let ms = |t: u128| (t as f64 - killed as f64) / 1e6;
        let (d, s, f) = (field("detected"), field("shrunk"), field("first"));
        println!(
            "rank {r}: detected {:.1} ms after the kill, shrunk {:.1} ms later, next correct result {:.1} ms after the shrink ({:.1} ms after the kill)",
            ms(d),
            ms(s) - ms(d),
            ms(f) - ms(s),
            ms(f)
        );
        out.push((ms(d), ms(s), ms(f), tl));
    }
    out
}

fn print_summary(what: &str, t: &[Timeline]) {
    let max = |f: &dyn Fn(&Timeline) -> f64| t.iter().map(f).fold(f64::MIN, f64::max);
    println!(
        "{what}: the last survivor to get there, in ms after the kill: error {:.1}, shrunk communicator {:.1}, next correct result {:.1}",
        max(&|x| x.0),
        max(&|x| x.1),
        max(&|x| x.2)
    );
}

#[test]
fn processes_on_one_host_shrink_after_a_kill() {
    let t = kill_one_of_four(2, None, &[]);
    assert_eq!(t.len(), 3);
    for (_, _, _, tl) in &t {
        assert!(tl.contains("origin=Builtin"), "{tl}");
    }
    print_summary("one host, rank 2 killed", &t);
}

#[test]
fn processes_on_two_hosts_shrink_after_rank_0_is_killed() {
    // Hosts interleaved (ranks 0 and 2 on one, 1 and 3 on the other): once rank 0 is gone,
    // the lowest survivor, rank 1, leads the shrink from the other host, at the address of
    // its data listener. The plan directory holds plans for 4 and for 3 ranks.
    let dir = plan_dir(
        "hosts",
        &[
            ("a4.plan.ron", fallback::plan(4)),
            ("b3.plan.ron", three_rank_plan()),
        ],
    );
    let hosts = ["shrink-a", "shrink-b", "shrink-a", "shrink-b"];
    let env = [("HCCL_PLAN", dir.display().to_string())];
    let t = kill_one_of_four(0, Some(hosts), &env);
    assert_eq!(t.len(), 3);
    for (_, _, _, tl) in &t {
        assert!(tl.contains("origin=Path"), "{tl}");
    }
    print_summary("two hosts, rank 0 killed", &t);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_abort_unblocks_ranks_across_hosts_which_then_shrink() {
    // 2 emulated hosts × 2 ranks (threads of this test, TCP between the hosts). Rank 3 never
    // calls: ranks 0–2 block in an AllReduce until rank 0's abort handle, used from another
    // thread, ends the call on all three; they shrink without rank 3 and go on.
    let cfg = common::config().with_timeout(Duration::from_secs(20));
    let hosts = ["abort-h0", "abort-h0", "abort-h1", "abort-h1"];
    let ranks = hosts
        .iter()
        .map(|h| (fallback::plan(4), Some(h.to_string()), cfg.clone()))
        .collect();
    let mut comms: Vec<Communicator> = common::join_group(ranks, "abort-shrink-token")
        .into_iter()
        .map(|c| c.expect("join"))
        .collect();
    let stuck = comms.pop().expect("rank 3");
    let handle = comms[0].abort_handle();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            handle.abort();
        });
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let me = comm.rank();
                    let err = step(&mut comm, &[0, 1, 2, 3], 0).unwrap_err();
                    assert!(err.to_string().contains("aborted"), "rank {me}: {err}");
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "rank {me}: the abort took {:?}",
                        start.elapsed()
                    );
                    let mut new = comm.shrink(&[3]).expect("shrink");
                    assert_eq!((new.rank(), new.world_size()), (me, 3));
                    for it in 0..3 {
                        step(&mut new, &[0, 1, 2], it).expect("after the shrink");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank");
        }
    });
    drop(stuck);
}

#[test]
fn processes_that_disagree_on_the_failed_ranks_are_refused_by_name() {
    // One host, ranks as threads of this test: rank 3 leaves, ranks 0 and 1 shrink without
    // it, rank 2 also without rank 1. Rank 0 leads both views of the shrink and refuses the
    // survivor that means another group; nobody waits for the timeout.
    let cfg = common::config().with_timeout(Duration::from_secs(20));
    let ranks = (0..4)
        .map(|_| (fallback::plan(4), None, cfg.clone()))
        .collect();
    let mut comms: Vec<Communicator> = common::join_group(ranks, "mismatch-token")
        .into_iter()
        .map(|c| c.expect("join"))
        .collect();
    drop(comms.pop());
    let start = Instant::now();
    let sets: [&[u32]; 3] = [&[3], &[3], &[1, 3]];
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(sets)
            .map(|(mut comm, set)| s.spawn(move || comm.shrink(set).map(|_| ())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank").unwrap_err().to_string())
            .collect()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    for e in &errors {
        assert!(
            e.contains("every survivor must pass the same failed ranks")
                && e.contains("without ranks [1, 3]"),
            "{errors:#?}"
        );
    }
}
