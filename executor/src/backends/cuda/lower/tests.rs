//! Host replay of lowered calls: results against a reference for every built-in schedule,
//! and a happens-before race check of the command order (vector clocks over queues and
//! events), so the ordering the GPU relies on is tested without a GPU.

use super::*;
use crate::dtype::{DataType, Element, Kernels, ReduceOp, combine_slices};
use crate::fallback;
use crate::program::{ConnTable, compile};
use half::{bf16, f16};
use hccl_ir::{Dep, Op, PlanEntry, PlanFile, Protocol, Schedule, Step, Stream};
use std::collections::HashMap;

/// Host memory per allocation.
struct Host {
    mems: HashMap<Mem, Vec<u64>>,
}

impl Host {
    fn ptr(&mut self, s: &Span) -> *mut u8 {
        let v = self.mems.get_mut(&s.mem).expect("allocated");
        assert!(s.off + s.len <= v.len() * 8, "{s:?} out of bounds");
        v.as_mut_ptr().cast::<u8>().wrapping_add(s.off)
    }
}

fn alloc(low: &Lowered, n: u32) -> Host {
    let words = |b: usize| vec![0u64; b.div_ceil(8).max(1)];
    let mut mems = HashMap::new();
    for r in 0..n {
        mems.insert(Mem::Send(r), words(low.send_bytes));
        mems.insert(Mem::Recv(r), words(low.recv_bytes));
        mems.insert(Mem::Scratch(r), words(low.scratch_bytes[r as usize]));
        mems.insert(Mem::Temp(r), words(low.temp_bytes));
    }
    for (i, &(_, b)) in low.staging.iter().enumerate() {
        mems.insert(Mem::Staging(i as u32), words(b));
    }
    Host { mems }
}

/// Runs the commands in issue order (a valid schedule when the race check passes).
fn execute(host: &mut Host, low: &Lowered, k: &Kernels, es: usize, nranks: u32) {
    for c in &low.cmds {
        match *c {
            Cmd::Wait { .. } | Cmd::Record { .. } => {}
            Cmd::Copy { dst, src, .. } => {
                assert_eq!(dst.len, src.len);
                assert!(!dst.overlaps(&src), "overlapping copy {dst:?} {src:?}");
                let (d, s) = (host.ptr(&dst), host.ptr(&src));
                // SAFETY: in bounds (checked by `ptr`) and not overlapping.
                unsafe { std::ptr::copy_nonoverlapping(s, d, dst.len) };
            }
            Cmd::Reduce { dst, a, b, .. } => {
                assert!(a.len == dst.len && b.len == dst.len);
                for x in [&a, &b] {
                    assert!(
                        *x == dst || !x.overlaps(&dst),
                        "partial overlap {dst:?} {x:?}"
                    );
                }
                let (d, pa, pb) = (host.ptr(&dst), host.ptr(&a), host.ptr(&b));
                // SAFETY: in bounds, element-aligned (u64 backing, offsets multiples of es).
                unsafe { (k.scalar)(d, pa, pb, dst.len / es) };
            }
            Cmd::Divide { span, .. } => {
                let p = host.ptr(&span);
                let div = k.finish.expect("divide only for avg");
                // SAFETY: as above.
                unsafe { div(p, span.len / es, nranks) };
            }
        }
    }
}

/// Every pair of commands on different queues that touch overlapping memory, one of them
/// writing, must be ordered by queue order and event waits; every wait must follow its
/// record in issue order.
fn check_races(low: &Lowered) {
    let nq = low.queues.len();
    let mut clock = vec![vec![0u32; nq]; nq];
    let mut ev: HashMap<u32, Vec<u32>> = HashMap::new();
    // (queue, vector clock, spans read, spans written) per work command
    type Access = (usize, Vec<u32>, Vec<Span>, Vec<Span>);
    let mut acc: Vec<Access> = Vec::new();
    for c in &low.cmds {
        let q = c.queue() as usize;
        match *c {
            Cmd::Record { event, .. } => {
                ev.insert(event, clock[q].clone());
            }
            Cmd::Wait { event, .. } => {
                let e = ev.get(&event).expect("wait issued before its record");
                for (x, y) in clock[q].iter_mut().zip(e) {
                    *x = (*x).max(*y);
                }
            }
            Cmd::Copy { dst, src, .. } => {
                clock[q][q] += 1;
                acc.push((q, clock[q].clone(), vec![src], vec![dst]));
            }
            Cmd::Reduce { dst, a, b, .. } => {
                clock[q][q] += 1;
                acc.push((q, clock[q].clone(), vec![a, b], vec![dst]));
            }
            Cmd::Divide { span, .. } => {
                clock[q][q] += 1;
                acc.push((q, clock[q].clone(), vec![span], vec![span]));
            }
        }
    }
    for i in 0..acc.len() {
        for j in i + 1..acc.len() {
            let (qi, ci, ri, wi) = &acc[i];
            let (qj, cj, rj, wj) = &acc[j];
            if qi == qj {
                continue;
            }
            let conflict = wi
                .iter()
                .any(|w| wj.iter().chain(rj).any(|x| w.overlaps(x)))
                || wj.iter().any(|w| ri.iter().any(|x| w.overlaps(x)));
            let ordered = ci[*qi] <= cj[*qi];
            assert!(
                !conflict || ordered,
                "race between command {i} (queue {qi}) and {j} (queue {qj})"
            );
        }
    }
}

fn value<T: Element>(op: ReduceOp, rank: u32, i: usize, seed: u64) -> T {
    let h = (u64::from(rank) * 7919 + i as u64 * 104_729 + seed * 31).wrapping_mul(0x9e37_79b9);
    let v = (h >> 20) as i64;
    T::from_i64(match op {
        ReduceOp::Prod => [1, 2, -1, -2][(v & 3) as usize],
        _ => (v % 7) - 3,
    })
}

fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    // SAFETY: `Element` types are plain numbers without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        .to_vec()
}

/// Expected output of every rank (None where it is unspecified): the reference result
/// ([`hccl_ir::reference`]).
fn reference<T: Element>(
    coll: Collective,
    op: ReduceOp,
    n: u32,
    inputs: &[Vec<T>],
) -> Vec<Option<Vec<T>>> {
    hccl_ir::reference::expected(
        coll,
        inputs,
        |acc, x| combine_slices(op, acc, x),
        |acc| {
            if op == ReduceOp::Avg {
                for v in acc {
                    *v = v.div_count(n);
                }
            }
        },
    )
}

/// Lowers entry `index` for a call, replays it on the host and compares with the reference.
fn run_case<T: Element>(plan: &PlanFile, index: usize, op: ReduceOp, total: usize, in_place: bool) {
    let entry = &plan.entries[index];
    let n = entry.schedule.nranks;
    let coll = entry.schedule.collective;
    let conns = ConnTable::build([&entry.schedule]);
    let entries: Vec<Entry> = (0..n)
        .map(|r| compile(index, entry, r, &conns).expect("compiles"))
        .collect();
    let es = std::mem::size_of::<T>();
    let shape = CallShape {
        collective: coll,
        op,
        esize: es,
        total,
        in_place,
    };
    let low = lower(&entries, &shape, &OneDevice).expect("lowers");
    check_races(&low);
    let mut host = alloc(&low, n);
    let (inl, outl) = shape.extents(n);
    let blk = total / n as usize;
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| (0..inl).map(|i| value(op, r, i, index as u64)).collect())
        .collect();
    for r in 0..n {
        let bytes = bytes_of(&inputs[r as usize]);
        let (mem, off) = match (in_place, coll.kind()) {
            (false, _) => (Mem::Send(r), 0),
            (true, CollectiveKind::AllGather) => (Mem::Recv(r), r as usize * blk * es),
            (true, _) => (Mem::Recv(r), 0),
        };
        let p = host.ptr(&Span {
            mem,
            off,
            len: bytes.len(),
        });
        // SAFETY: in bounds (checked by `ptr`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    }
    let k = Kernels::new(T::DTYPE, op);
    execute(&mut host, &low, &k, es, n);
    let want = reference(coll, op, n, &inputs);
    for r in 0..n {
        let Some(w) = &want[r as usize] else { continue };
        let off = match (in_place, coll.kind()) {
            (true, CollectiveKind::ReduceScatter) => r as usize * blk * es,
            _ => 0,
        };
        let p = host.ptr(&Span {
            mem: Mem::Recv(r),
            off,
            len: outl * es,
        });
        // SAFETY: in bounds (checked by `ptr`).
        let got = unsafe { std::slice::from_raw_parts(p, outl * es) };
        assert_eq!(
            got,
            &bytes_of(w)[..],
            "{coll} {} op {op} n {n} total {total} in_place {in_place} (entry {index}, {}) rank {r}",
            T::DTYPE,
            entry.algorithm,
        );
    }
}

fn run_dtype(d: DataType, plan: &PlanFile, i: usize, op: ReduceOp, total: usize, ip: bool) {
    match d {
        DataType::F32 => run_case::<f32>(plan, i, op, total, ip),
        DataType::F64 => run_case::<f64>(plan, i, op, total, ip),
        DataType::F16 => run_case::<f16>(plan, i, op, total, ip),
        DataType::BF16 => run_case::<bf16>(plan, i, op, total, ip),
        DataType::I8 => run_case::<i8>(plan, i, op, total, ip),
        DataType::U8 => run_case::<u8>(plan, i, op, total, ip),
        DataType::I32 => run_case::<i32>(plan, i, op, total, ip),
        DataType::U32 => run_case::<u32>(plan, i, op, total, ip),
        DataType::I64 => run_case::<i64>(plan, i, op, total, ip),
        DataType::U64 => run_case::<u64>(plan, i, op, total, ip),
    }
}

#[test]
fn every_builtin_entry_replays_correctly_on_the_host() {
    for n in [1u32, 2, 3, 8] {
        for (channels, parts) in [(2, 1), (1, 3)] {
            let plan = fallback::plan_with(n, channels, parts);
            for i in 0..plan.entries.len() {
                let coll = plan.entries[i].schedule.collective;
                let ops: &[ReduceOp] = if coll.kind().reduces() {
                    &ReduceOp::ALL
                } else {
                    &[ReduceOp::Sum]
                };
                let blocked = matches!(
                    coll.kind(),
                    CollectiveKind::AllGather
                        | CollectiveKind::ReduceScatter
                        | CollectiveKind::AllToAll
                );
                let totals: Vec<usize> = if blocked {
                    vec![n as usize, n as usize * 37]
                } else {
                    vec![1, 5, 1001]
                };
                for &op in ops {
                    for &total in &totals {
                        for ip in [false, true] {
                            run_dtype(DataType::I32, &plan, i, op, total, ip);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_dtype_and_op_on_the_ring() {
    let plan = fallback::plan_with(4, 2, 2);
    for (i, e) in plan.entries.iter().enumerate() {
        if e.schedule.collective != Collective::AllReduce || e.algorithm != "ring" {
            continue;
        }
        for d in DataType::ALL {
            for op in ReduceOp::ALL {
                run_dtype(d, &plan, i, op, 203, e.schedule.in_place);
            }
        }
    }
}

#[test]
fn in_place_ring_orders_overwrites_after_direct_reads() {
    // In place, the ring's sends read chunks their sender overwrites later: the lowering
    // must order those writes after the reads (checked by the race check) or stage.
    let plan = fallback::plan_with(8, 1, 1);
    let i = plan
        .entries
        .iter()
        .position(|e| {
            e.schedule.collective == Collective::AllReduce
                && e.algorithm == "ring"
                && e.schedule.in_place
        })
        .expect("ring entry");
    run_case::<f32>(&plan, i, ReduceOp::Sum, 4096, true);
}

/// Rank 0 sends `in[0]`, then overwrites it with a message from rank 1, then sends `in[1]`
/// on another channel; rank 1 takes `in[1]`'s message before the first. Reading the first
/// message in place would need the overwrite to wait for a read that itself waits for the
/// overwrite: the message must be staged.
fn cyclic_plan() -> PlanFile {
    let mut s = Schedule::empty(Collective::AllReduce, 2, 2, false).expect("shape");
    s.ranks[0].streams = vec![
        Stream {
            channel: 0,
            steps: vec![
                Step::new(
                    Op::Send {
                        to: 1,
                        src: Loc::input(0),
                    },
                    1,
                ),
                Step::new(
                    Op::Recv {
                        from: 1,
                        dst: Loc::input(0),
                    },
                    1,
                ),
            ],
        },
        Stream {
            channel: 1,
            steps: vec![
                Step::new(
                    Op::Send {
                        to: 1,
                        src: Loc::input(1),
                    },
                    1,
                )
                .with_deps([Dep { stream: 0, step: 1 }]),
            ],
        },
    ];
    s.ranks[1].streams = vec![
        Stream {
            channel: 1,
            steps: vec![Step::new(
                Op::Recv {
                    from: 0,
                    dst: Loc::output(1),
                },
                1,
            )],
        },
        Stream {
            channel: 0,
            steps: vec![
                Step::new(
                    Op::Send {
                        to: 0,
                        src: Loc::input(0),
                    },
                    1,
                ),
                Step::new(
                    Op::Recv {
                        from: 0,
                        dst: Loc::output(0),
                    },
                    1,
                )
                .with_deps([Dep { stream: 0, step: 0 }]),
            ],
        },
    ];
    let mut plan = PlanFile::new(hccl_ir::PlanMeta {
        topology: "test".into(),
        topology_hash: String::new(),
        compiler: "test".into(),
    });
    plan.entries.push(PlanEntry {
        min_bytes: 0,
        max_bytes: None,
        algorithm: "cyclic".into(),
        protocol: Protocol::Simple,
        cost: None,
        symmetry: None,
        synthesis: None,
        schedule: s,
        template: None,
    });
    plan
}

#[test]
fn messages_whose_direct_read_would_deadlock_are_staged() {
    let plan = cyclic_plan();
    let entry = &plan.entries[0];
    let conns = ConnTable::build([&entry.schedule]);
    let entries: Vec<Entry> = (0..2)
        .map(|r| compile(0, entry, r, &conns).expect("compiles"))
        .collect();
    let shape = CallShape {
        collective: Collective::AllReduce,
        op: ReduceOp::Sum,
        esize: 4,
        total: 10,
        in_place: false,
    };
    let low = lower(&entries, &shape, &OneDevice).expect("lowers");
    assert_eq!(low.staged_for_order, 1);
    check_races(&low);
    let mut host = alloc(&low, 2);
    let inputs: [Vec<i32>; 2] = [(0..10).collect(), (100..110).collect()];
    for r in 0..2u32 {
        let b = bytes_of(&inputs[r as usize]);
        let p = host.ptr(&Span {
            mem: Mem::Send(r),
            off: 0,
            len: 40,
        });
        // SAFETY: in bounds.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, 40) };
    }
    execute(
        &mut host,
        &low,
        &Kernels::new(DataType::I32, ReduceOp::Sum),
        4,
        2,
    );
    let p = host.ptr(&Span {
        mem: Mem::Recv(1),
        off: 0,
        len: 40,
    });
    // SAFETY: in bounds.
    let got = unsafe { std::slice::from_raw_parts(p.cast::<i32>(), 10) };
    assert_eq!(
        got,
        &inputs[0][..],
        "rank 1 receives rank 0's original input"
    );
}

#[test]
fn unmatched_messages_are_errors() {
    let mut plan = cyclic_plan();
    plan.entries[0].schedule.ranks[1].streams.remove(0);
    let entry = &plan.entries[0];
    let conns = ConnTable::build([&entry.schedule]);
    let entries: Vec<Entry> = (0..2)
        .map(|r| compile(0, entry, r, &conns).expect("compiles"))
        .collect();
    let shape = CallShape {
        collective: Collective::AllReduce,
        op: ReduceOp::Sum,
        esize: 4,
        total: 10,
        in_place: false,
    };
    let err = lower(&entries, &shape, &OneDevice).expect_err("unmatched send");
    assert!(err.to_string().contains("never receives"), "{err}");
}

#[test]
fn the_race_check_notices_missing_waits() {
    let plan = fallback::plan_with(4, 2, 1);
    let i = plan
        .entries
        .iter()
        .position(|e| e.schedule.collective == Collective::AllReduce && e.algorithm == "ring")
        .expect("ring entry");
    let entry = &plan.entries[i];
    let conns = ConnTable::build([&entry.schedule]);
    let entries: Vec<Entry> = (0..4)
        .map(|r| compile(i, entry, r, &conns).expect("compiles"))
        .collect();
    let shape = CallShape {
        collective: Collective::AllReduce,
        op: ReduceOp::Sum,
        esize: 4,
        total: 64,
        in_place: entry.schedule.in_place,
    };
    let mut low = lower(&entries, &shape, &OneDevice).expect("lowers");
    check_races(&low);
    low.cmds.retain(|c| !matches!(c, Cmd::Wait { .. }));
    let caught = std::panic::catch_unwind(|| check_races(&low));
    assert!(caught.is_err(), "dropping every wait must leave races");
}

/// A pseudo-random AllToAllv layout for `n` ranks: counts up to `max` with zeros among
/// them, and on both sides blocks in a shuffled order with gaps between them.
fn random_layout(n: usize, max: usize, seed: u64) -> BlockLayout {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |m: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % m.max(1) as u64) as usize
    };
    let counts: Vec<Vec<usize>> = (0..n)
        .map(|_| {
            (0..n)
                .map(|_| if next(4) == 0 { 0 } else { next(max + 1) })
                .collect()
        })
        .collect();
    let mut spread = |counts: &[usize]| {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, next(i + 1));
        }
        let mut displs = vec![0; n];
        let mut at = 0;
        for p in order {
            at += next(3);
            displs[p] = at;
            at += counts[p];
        }
        displs
    };
    let recv_counts: Vec<Vec<usize>> = (0..n)
        .map(|r| (0..n).map(|p| counts[p][r]).collect())
        .collect();
    BlockLayout {
        send_displs: counts.iter().map(|c| spread(c)).collect(),
        recv_displs: recv_counts.iter().map(|c| spread(c)).collect(),
        send_counts: counts,
        recv_counts,
    }
}

/// Lowers an AllToAllv of `layout` on entry `index`, replays it on the host and checks
/// every block arrived and nothing outside the blocks was written.
fn run_v_case(plan: &PlanFile, index: usize, layout: &BlockLayout) {
    let entry = &plan.entries[index];
    let n = entry.schedule.nranks;
    let conns = ConnTable::build([&entry.schedule]);
    let entries: Vec<Entry> = (0..n)
        .map(|r| compile(index, entry, r, &conns).expect("compiles"))
        .collect();
    let es = 4;
    let low = lower_v(&entries, layout, es, &OneDevice).expect("lowers");
    check_races(&low);
    let mut host = alloc(&low, n);
    const UNTOUCHED: u64 = 0xabab_abab_abab_abab;
    for r in 0..n {
        host.mems
            .get_mut(&Mem::Recv(r))
            .expect("allocated")
            .fill(UNTOUCHED);
    }
    let inputs: Vec<Vec<i32>> = (0..n as usize)
        .map(|r| {
            (0..layout.send_len(r))
                .map(|i| value(ReduceOp::Sum, r as u32, i, 11))
                .collect()
        })
        .collect();
    for r in 0..n {
        let bytes = bytes_of(&inputs[r as usize]);
        if bytes.is_empty() {
            continue;
        }
        let p = host.ptr(&Span {
            mem: Mem::Send(r),
            off: 0,
            len: bytes.len(),
        });
        // SAFETY: in bounds (checked by `ptr`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    }
    execute(
        &mut host,
        &low,
        &Kernels::new(DataType::I32, ReduceOp::Sum),
        es,
        n,
    );
    for r in 0..n as usize {
        let words = &host.mems[&Mem::Recv(r as u32)];
        // SAFETY: the u64 backing viewed as the bytes it holds.
        let got: &[u8] =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) };
        let mut covered = vec![false; got.len()];
        for (p, sent) in inputs.iter().enumerate() {
            let c = layout.recv_counts[r][p];
            if c == 0 {
                continue;
            }
            let (d, sd) = (layout.recv_displs[r][p], layout.send_displs[p][r]);
            let want = bytes_of(&sent[sd..sd + c]);
            assert_eq!(
                &got[d * es..(d + c) * es],
                &want[..],
                "{} n {n}: rank {r}'s block from rank {p}",
                entry.algorithm
            );
            covered[d * es..(d + c) * es].fill(true);
        }
        let stray = (0..got.len()).find(|&i| !covered[i] && got[i] != 0xab);
        assert_eq!(
            stray, None,
            "rank {r}: a byte outside its blocks was written"
        );
    }
}

#[test]
fn alltoallv_replays_with_per_block_sizes_on_the_host() {
    for n in [1u32, 2, 3, 5, 8] {
        for (channels, parts) in [(2, 1), (1, 3)] {
            let plan = fallback::alltoall_plan(n, channels, parts);
            for (seed, max) in [(1, 0), (2, 1), (3, 9), (4, 100)] {
                let layout = random_layout(n as usize, max, seed + u64::from(n) * 10);
                run_v_case(&plan, 0, &layout);
            }
            run_v_case(
                &plan,
                0,
                &BlockLayout::packed(vec![vec![7; n as usize]; n as usize]),
            );
        }
    }
}

#[test]
fn alltoallv_layouts_that_cannot_run_are_errors() {
    let n = 3;
    let plan = fallback::alltoall_plan(n, 1, 1);
    let conns = ConnTable::build([&plan.entries[0].schedule]);
    let entries: Vec<Entry> = (0..n)
        .map(|r| compile(0, &plan.entries[0], r, &conns).expect("compiles"))
        .collect();
    let err = |layout: &BlockLayout| {
        lower_v(&entries, layout, 4, &OneDevice)
            .expect_err("must be refused")
            .to_string()
    };
    let mut disagree = BlockLayout::packed(vec![vec![2; 3]; 3]);
    disagree.recv_counts[2][0] = 3;
    assert!(
        err(&disagree).contains("rank 0 sends 2 elements to rank 2, which receives 3"),
        "{}",
        err(&disagree)
    );
    let mut overlap = BlockLayout::packed(vec![vec![2; 3]; 3]);
    overlap.recv_displs[1][2] = 1;
    assert!(err(&overlap).contains("rank 1's receive blocks from ranks 0 and 2 overlap"));
    let mut short = BlockLayout::packed(vec![vec![2; 3]; 3]);
    short.send_displs[1].pop();
    assert!(err(&short).contains("rank 1 has 2 send displacements for 3 ranks"));
    let mut huge = BlockLayout::packed(vec![vec![2; 3]; 3]);
    huge.send_displs[0][1] = usize::MAX;
    assert!(err(&huge).contains("overflows"));
    // An AllToAll that relays blocks through other ranks cannot take per-block sizes.
    let ring = fallback::plan_with(n, 1, 1);
    let i = ring
        .entries
        .iter()
        .position(|e| e.schedule.collective == Collective::AllReduce && !e.schedule.in_place)
        .expect("allreduce entry");
    let conns = ConnTable::build([&ring.entries[i].schedule]);
    let relay: Vec<Entry> = (0..n)
        .map(|r| compile(i, &ring.entries[i], r, &conns).expect("compiles"))
        .collect();
    let e = lower_v(
        &relay,
        &BlockLayout::packed(vec![vec![2; 3]; 3]),
        4,
        &OneDevice,
    )
    .expect_err("an allreduce is no alltoall")
    .to_string();
    assert!(e.contains("cannot be replayed with per-block sizes"), "{e}");
}
