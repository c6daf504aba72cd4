//! The sweep every rank runs: warm-up, the iteration count (fixed or calibrated to `-T`), the
//! timed calls, the check, one `Row` per size; the barrier that combines the ranks' times
//! (threads: `ThreadSync`; processes: the communicator itself, `CommSync`).

use crate::args::{Args, Counts, Failure};
use crate::data::{RankBuffers, Shape, VBuffers, call, count_matrix, count_wrong, fill, shape};
use half::{bf16, f16};
use hccl::executor::{Buffers, Communicator, DataType, Element, ReduceOp};
use hccl::ir::Collective;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Synchronisation among the ranks: a barrier that also combines one number (sum and max).
pub(crate) trait RankSync {
    /// Contributes `x` and waits for every rank; returns (sum, max) over ranks.
    fn combine(&mut self, comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure>;
    /// Tells the others this rank failed, so nobody waits for it.
    fn abort(&mut self);
}

struct Round {
    arrived: u32,
    generation: u64,
    aborted: bool,
    sum: f64,
    max: f64,
    last: (f64, f64),
}

/// A barrier for the threads backend that a failing rank can break.
pub(crate) struct ThreadSync {
    state: Mutex<Round>,
    cv: Condvar,
    n: u32,
}

impl ThreadSync {
    pub(crate) fn new(n: u32) -> ThreadSync {
        ThreadSync {
            state: Mutex::new(Round {
                arrived: 0,
                generation: 0,
                aborted: false,
                sum: 0.0,
                max: f64::MIN,
                last: (0.0, 0.0),
            }),
            cv: Condvar::new(),
            n,
        }
    }
}

impl RankSync for Arc<ThreadSync> {
    fn combine(&mut self, _comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure> {
        let broken = || Failure::Runtime("another rank failed".into());
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.aborted {
            return Err(broken());
        }
        let generation = st.generation;
        st.sum += x;
        st.max = st.max.max(x);
        st.arrived += 1;
        if st.arrived == self.n {
            st.last = (st.sum, st.max);
            st.arrived = 0;
            st.sum = 0.0;
            st.max = f64::MIN;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st.last);
        }
        while st.generation == generation && !st.aborted {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.generation == generation {
            return Err(broken());
        }
        Ok(st.last)
    }

    fn abort(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.aborted = true;
        self.cv.notify_all();
    }
}

/// Across processes the communicator itself synchronises: two small AllReduces.
pub(crate) struct CommSync;

impl RankSync for CommSync {
    fn combine(&mut self, comm: &mut Communicator, x: f64) -> Result<(f64, f64), Failure> {
        let mut v = [x];
        comm.run(
            Collective::AllReduce,
            ReduceOp::Sum,
            Buffers::InPlace(&mut v),
        )?;
        let mut m = [x];
        comm.run(
            Collective::AllReduce,
            ReduceOp::Max,
            Buffers::InPlace(&mut m),
        )?;
        Ok((v[0], m[0]))
    }

    fn abort(&mut self) {}
}

/// One measured row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) shape: Shape,
    pub(crate) iters: u64,
    pub(crate) time_us: f64,
    pub(crate) time_max_us: f64,
    pub(crate) wrong: Option<u64>,
    /// The plan entry the calls used (after `HCCL_ALGO` / `HCCL_PROTO`).
    pub(crate) entry: Option<hccl::executor::EntryInfo>,
}

/// Everything a rank needs to run the sweep.
pub(crate) struct Sweep {
    pub(crate) coll: Collective,
    /// An AllToAllv (`coll` is AllToAll) of these counts.
    pub(crate) vary: Option<Counts>,
    pub(crate) op: ReduceOp,
    pub(crate) dtype: DataType,
    pub(crate) sizes: Vec<u64>,
    pub(crate) args: Args,
    pub(crate) n: u32,
}

/// Runs the whole sweep on one rank; returns the rows (identical on every rank).
fn sweep<T: Element>(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::new();
    let mut b = RankBuffers::<T> {
        input: Vec::new(),
        output: Vec::new(),
    };
    let in_place = sw.args.in_place;
    let mut v: Option<VBuffers<T>> = None;
    for &nominal in &sw.sizes {
        let mut s = shape(sw.coll.kind(), nominal, sw.dtype.size(), sw.n);
        let mut largest = 0;
        if let Some(counts) = sw.vary {
            let m = count_matrix(counts, sw.args.seed, sw.n, s.count / sw.n as usize);
            let total: usize = m.iter().flatten().sum();
            largest = m.iter().flatten().copied().max().unwrap_or(0);
            s.count = total / sw.n as usize;
            s.bytes = (s.count * sw.dtype.size()) as u64;
            v = Some(VBuffers::new(&m, rank));
        } else {
            fill(&mut b, sw.coll, sw.op, rank, &s, in_place);
        }
        let mut once = |comm: &mut Communicator, b: &mut RankBuffers<T>| match &mut v {
            Some(v) => v.call(comm),
            None => call(comm, sw.coll, sw.op, b, in_place),
        };
        for _ in 0..sw.args.warmup {
            once(comm, &mut b)?;
        }
        // Iteration count: fixed, or calibrated to the time budget (agreed on by all ranks).
        let iters = match sw.args.target {
            None => sw.args.iters.max(1),
            Some(target) => {
                // Calibrate on rounds of growing length until one fills a tenth of the
                // budget (a few cold calls would overestimate small sizes by 10-100x and
                // leave the timed loop too short to average out a single preemption).
                let mut probe = 1u64;
                let per_call = loop {
                    sync.combine(comm, 0.0)?;
                    let start = Instant::now();
                    for _ in 0..probe {
                        once(comm, &mut b)?;
                    }
                    let (_, slowest) = sync.combine(comm, start.elapsed().as_secs_f64())?;
                    if slowest >= target / 10.0 || probe >= 1 << 24 {
                        break slowest / probe as f64;
                    }
                    // Aim straight at the tenth (at most 16x longer per round).
                    let want = (target / 10.0 / slowest.max(1e-9) * probe as f64).ceil() as u64;
                    probe = want.clamp(probe * 2, probe * 16);
                };
                ((target / per_call.max(1e-9)).ceil() as u64).clamp(1, 50_000_000)
            }
        };
        sync.combine(comm, 0.0)?;
        let start = Instant::now();
        for _ in 0..iters {
            once(comm, &mut b)?;
        }
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        let (sum, max) = sync.combine(comm, mine)?;
        let wrong = if sw.args.check {
            let local = match &mut v {
                Some(v) => {
                    v.output.fill(T::default());
                    v.call(comm)?;
                    v.count_wrong(rank)
                }
                None => {
                    fill(&mut b, sw.coll, sw.op, rank, &s, in_place);
                    call(comm, sw.coll, sw.op, &mut b, in_place)?;
                    count_wrong(&b, sw.coll, sw.op, sw.n, rank, &s, in_place)
                }
            };
            let (total, _) = sync.combine(comm, local as f64)?;
            Some(total as u64)
        } else {
            None
        };
        let row = Row {
            shape: s,
            iters,
            time_us: sum / f64::from(sw.n) * 1e6,
            time_max_us: max * 1e6,
            wrong,
            entry: if sw.vary.is_some() {
                comm.all_to_all_v_entry((largest * sw.n as usize * sw.dtype.size()) as u64)
            } else {
                comm.entry_for(sw.coll, s.bytes, in_place)
            },
        };
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

fn run_typed<T: Element>(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    let res = sweep::<T>(sw, rank, comm, sync, on_row);
    if res.is_err() {
        sync.abort();
        comm.abort();
    }
    res
}

pub(crate) fn dispatch(
    sw: &Sweep,
    rank: u32,
    comm: &mut Communicator,
    sync: &mut dyn RankSync,
    on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Failure> {
    match sw.dtype {
        DataType::F32 => run_typed::<f32>(sw, rank, comm, sync, on_row),
        DataType::F64 => run_typed::<f64>(sw, rank, comm, sync, on_row),
        DataType::F16 => run_typed::<f16>(sw, rank, comm, sync, on_row),
        DataType::BF16 => run_typed::<bf16>(sw, rank, comm, sync, on_row),
        DataType::I8 => run_typed::<i8>(sw, rank, comm, sync, on_row),
        DataType::U8 => run_typed::<u8>(sw, rank, comm, sync, on_row),
        DataType::I32 => run_typed::<i32>(sw, rank, comm, sync, on_row),
        DataType::U32 => run_typed::<u32>(sw, rank, comm, sync, on_row),
        DataType::I64 => run_typed::<i64>(sw, rank, comm, sync, on_row),
        DataType::U64 => run_typed::<u64>(sw, rank, comm, sync, on_row),
    }
}
