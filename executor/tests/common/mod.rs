//! Test support: deterministic inputs, a plain sequential reference, and a driver that runs
//! a list of calls on every rank of a thread group (one thread per rank, spawned once).

#![allow(dead_code)]

use half::{bf16, f16};
use hccl_executor::dtype::combine_slices;
use hccl_executor::{Buffers, Communicator, Config, DataType, Element, ReduceOp, ThreadGroup};
use hccl_ir::{Collective, CollectiveKind, PlanFile};
use std::time::Duration;

/// A loopback rendezvous port for ranks this test starts (below the ephemeral range, so no
/// parallel test's socket can take it between the pick and rank 0's listen).
pub fn free_port() -> u16 {
    hccl_executor::process::local_rendezvous_port().expect("a free rendezvous port")
}

/// One call to make on every rank.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub collective: Collective,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub in_place: bool,
    /// Elements of the whole collective buffer (nccl-tests "size" in elements).
    pub count: usize,
    pub seed: u64,
}

/// A small-integer input value that keeps every reduction exact (also in f16/bf16).
fn value(case: &Case, rank: u32, i: usize) -> i64 {
    let mut h =
        case.seed ^ (u64::from(rank) << 40) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 32;
    match case.op {
        ReduceOp::Prod => [1, 2, 1, -1][(h % 4) as usize],
        _ => (h % 7) as i64 - 3,
    }
}

fn unsigned(d: DataType) -> bool {
    matches!(d, DataType::U8 | DataType::U32 | DataType::U64)
}

/// The rank's input buffer (for in-place calls: the buffer's initial contents).
pub fn input<T: Element>(case: &Case, n: u32, rank: u32) -> Vec<T> {
    let len = input_len(case, n);
    let make = |r: u32, i: usize| {
        let v = value(case, r, i);
        T::from_i64(if unsigned(case.dtype) { v.abs() } else { v })
    };
    match (case.collective.kind(), case.in_place) {
        (CollectiveKind::AllGather, true) => {
            // The rank's block holds its input; the rest is garbage to be overwritten.
            let block = case.count / n as usize;
            (0..len)
                .map(|i| {
                    if i / block.max(1) == rank as usize {
                        make(rank, i - rank as usize * block)
                    } else {
                        T::from_i64(99)
                    }
                })
                .collect()
        }
        _ => (0..len).map(|i| make(rank, i)).collect(),
    }
}

fn input_len(case: &Case, n: u32) -> usize {
    match case.collective.kind() {
        CollectiveKind::AllGather if !case.in_place => case.count / n as usize,
        _ => case.count,
    }
}

fn output_len(case: &Case, n: u32) -> usize {
    match case.collective.kind() {
        CollectiveKind::ReduceScatter if !case.in_place => case.count / n as usize,
        _ => case.count,
    }
}

/// The logical inputs of every rank (AllGather: the rank's block).
fn logical_inputs<T: Element>(case: &Case, n: u32) -> Vec<Vec<T>> {
    (0..n)
        .map(|r| {
            let v = input::<T>(case, n, r);
            if case.collective.kind() == CollectiveKind::AllGather && case.in_place {
                let b = case.count / n as usize;
                v[r as usize * b..(r as usize + 1) * b].to_vec()
            } else {
                v
            }
        })
        .collect()
}

/// What `rank` must hold afterwards, as (offset in its output-side buffer, values): the
/// reference result ([`hccl_ir::reference`]) placed as the buffers are.
pub fn expected<T: Element>(case: &Case, n: u32, rank: u32) -> Option<(usize, Vec<T>)> {
    let ins = logical_inputs::<T>(case, n);
    let want = hccl_ir::reference::expected_rank(
        case.collective,
        &ins,
        rank as usize,
        |acc, x| combine_slices(case.op, acc, x),
        |acc| {
            if case.op == ReduceOp::Avg {
                for v in acc {
                    *v = v.div_count(n);
                }
            }
        },
    )?;
    let off = match case.collective {
        Collective::ReduceScatter if case.in_place => rank as usize * (case.count / n as usize),
        _ => 0,
    };
    Some((off, want))
}

/// Runs `case` on `comm` and checks the result; returns a description of the first mismatch.
pub fn check_typed<T: Element + std::fmt::Debug>(
    comm: &mut Communicator,
    case: &Case,
) -> Result<(), String> {
    let n = comm.world_size();
    let rank = comm.rank();
    let mut inp = input::<T>(case, n, rank);
    let mut out = vec![T::from_i64(77); output_len(case, n)];
    let res = if case.in_place {
        comm.run(case.collective, case.op, Buffers::InPlace(&mut inp))
    } else {
        comm.run(
            case.collective,
            case.op,
            Buffers::OutOfPlace {
                input: &inp,
                output: &mut out,
            },
        )
    };
    res.map_err(|e| format!("{case:?} rank {rank}: {e}"))?;
    let got = if case.in_place { &inp } else { &out };
    if let Some((off, want)) = expected::<T>(case, n, rank) {
        let slice = &got[off..off + want.len()];
        if let Some(i) =
            (0..want.len()).find(|&i| slice[i].to_f64().to_bits() != want[i].to_f64().to_bits())
        {
            return Err(format!(
                "{case:?} rank {rank}: element {i}: got {:?}, want {:?}",
                slice[i], want[i]
            ));
        }
    }
    Ok(())
}

/// Dispatches [`check_typed`] on the case's data type.
pub fn check(comm: &mut Communicator, case: &Case) -> Result<(), String> {
    match case.dtype {
        DataType::F32 => check_typed::<f32>(comm, case),
        DataType::F64 => check_typed::<f64>(comm, case),
        DataType::F16 => check_typed::<f16>(comm, case),
        DataType::BF16 => check_typed::<bf16>(comm, case),
        DataType::I8 => check_typed::<i8>(comm, case),
        DataType::U8 => check_typed::<u8>(comm, case),
        DataType::I32 => check_typed::<i32>(comm, case),
        DataType::U32 => check_typed::<u32>(comm, case),
        DataType::I64 => check_typed::<i64>(comm, case),
        DataType::U64 => check_typed::<u64>(comm, case),
    }
}

/// Test configuration: a timeout long enough for slow CI machines.
pub fn config() -> Config {
    Config::default().with_timeout(Duration::from_secs(60))
}

/// Runs every case on every rank of a fresh group; returns all mismatches.
pub fn run_cases(plan: PlanFile, n: u32, cfg: Config, cases: &[Case]) -> Vec<String> {
    let comms = ThreadGroup::with_config(plan, n, cfg).expect("group");
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for mut comm in comms {
            let errors = &errors;
            s.spawn(move || {
                for case in cases {
                    if let Err(e) = check(&mut comm, case) {
                        errors.lock().unwrap().push(e);
                        // The group may be poisoned now; stop this rank.
                        comm.abort();
                        return;
                    }
                }
            });
        }
    });
    errors.into_inner().unwrap()
}

/// Element counts for a collective on `n` ranks: `base` scaled so that rank-blocked
/// collectives get whole blocks.
pub fn count_for(coll: Collective, n: u32, base: usize) -> usize {
    match coll.kind() {
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
            base * n as usize
        }
        _ => base,
    }
}

/// Every collective for `n` ranks (rooted ones at rank 0 and rank n-1).
pub fn collectives(n: u32) -> Vec<Collective> {
    let mut v = vec![
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 0 },
    ];
    if n > 1 {
        v.push(Collective::Broadcast { root: n - 1 });
        v.push(Collective::Reduce { root: n - 1 });
    }
    v
}

/// Waits for a child, killing it if it outlives `limit` (so a bug cannot hang the suite).
pub fn wait_output(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> (Option<i32>, String) {
    use std::io::Read;
    let mut out = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if start.elapsed() < limit => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    (code, reader.join().unwrap_or_default())
}

/// Every collective of `n` ranks × `combos` × in/out of place × element counts `bases`
/// (scaled so that rank-blocked collectives get whole blocks), seeds from `seed` up.
pub fn cases(n: u32, combos: &[(DataType, ReduceOp)], bases: &[usize], seed: u64) -> Vec<Case> {
    let mut out = Vec::new();
    let mut seed = seed;
    for coll in collectives(n) {
        for &(dtype, op) in combos {
            for in_place in [false, true] {
                for &base in bases {
                    seed += 1;
                    out.push(Case {
                        collective: coll,
                        dtype,
                        op,
                        in_place,
                        count: count_for(coll, n, base),
                        seed,
                    });
                }
            }
        }
    }
    out
}

/// The body of a rank process of the multi-process tests: joins the group from the
/// launcher's environment, then plays `role`: `all` checks `cases(world)` and prints
/// `DONE rank R`; `loop` runs in-place AllReduces of `loop_elems` floats for at most two
/// minutes, printing `READY` after the first. Errors are printed as `ERROR: ...`
/// (exit 2 at start-up, 3 in the loop) or `FAIL: ...` (exit 1).
pub fn run_child(role: &str, cases: &dyn Fn(u32) -> Vec<Case>, loop_elems: usize) -> ! {
    use hccl_executor::{PlanSource, ProcessGroup};
    use std::io::Write;
    let mut comm = match ProcessGroup::init(PlanSource::Builtin) {
        Ok(c) => c,
        Err(e) => {
            println!("ERROR: {e}");
            std::process::exit(2);
        }
    };
    match role {
        "all" => {
            for case in cases(comm.world_size()) {
                if let Err(e) = check(&mut comm, &case) {
                    println!("FAIL: {e}");
                    std::process::exit(1);
                }
            }
            println!("DONE rank {}", comm.rank());
            std::process::exit(0);
        }
        "loop" => {
            // Bounded, so that a failing parent cannot leave ranks running for long.
            let start = std::time::Instant::now();
            let mut buf = vec![1.0f32; loop_elems];
            for i in 0.. {
                if start.elapsed() > Duration::from_secs(120) {
                    break;
                }
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
                    println!("ERROR: {e}");
                    std::process::exit(3);
                }
                if i == 0 {
                    println!("READY");
                    let _ = std::io::stdout().flush();
                }
            }
            std::process::exit(0);
        }
        other => {
            println!("ERROR: unknown role {other}");
            std::process::exit(2);
        }
    }
}

/// Makes `cmd` (this test executable, possibly behind `ip netns exec`) a rank process of the
/// multi-process tests: it runs the test `child_test` alone, in role `role` (read from
/// `HCCL_TEST_ROLE`), with torchrun's variables, stdout piped and stderr inherited.
pub fn rank_command<'c>(
    cmd: &'c mut std::process::Command,
    child_test: &str,
    role: &str,
    (rank, world): (u32, u32),
    master: (&str, &str),
    token: &str,
) -> &'c mut std::process::Command {
    use std::process::Stdio;
    cmd.args([child_test, "--exact", "--nocapture", "--test-threads=1"])
        .env("HCCL_TEST_ROLE", role)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", master.0)
        .env("MASTER_PORT", master.1)
        .env("HCCL_JOB_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
}

/// Joins a process group whose ranks are threads of this test, rendezvousing on loopback:
/// rank `r` holds `ranks[r]`'s plan, claims its host (`None`: this machine's identity; a
/// name emulates a host of its own, as `HCCL_HOST_ID` does) and runs with its config.
pub fn join_group(
    ranks: Vec<(PlanFile, Option<String>, Config)>,
    token: &str,
) -> Vec<hccl_executor::Result<Communicator>> {
    use hccl_executor::{Bootstrap, ProcessGroup};
    hccl_executor::config::init_tracing();
    let boot = Bootstrap {
        addr: format!("127.0.0.1:{}", free_port()),
        token: token.into(),
        host: None,
    };
    let n = ranks.len() as u32;
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(r, (plan, host, cfg))| {
                let mut boot = boot.clone();
                boot.host = host;
                s.spawn(move || ProcessGroup::init_with(plan, r as u32, n, &boot, cfg))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}
