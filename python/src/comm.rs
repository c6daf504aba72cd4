//! `hccl._hccl.Communicator`: the executor's `Communicator` for Python.
//!
//! A blocking call runs on the caller's thread with the GIL released; an asynchronous one is
//! queued to a thread of the communicator's own, which runs the queue in order, and returns a
//! [`Handle`] whose `wait()` (GIL released) gives its result; a blocking call waits for the
//! queue first. The caller's arrays cross as raw pointers and element
//! counts, so NumPy arrays and PyTorch CPU tensors are read and written where they are (no
//! copy, and no dependency on either package here): the Python side (`hccl/comm.py`) checks
//! that they are contiguous, writable and of the declared type, and passes their owners as
//! `keep`, which a queued call holds until it has run (a blocking call's caller holds them
//! anyway). That is the safety contract of this module's `call`, which Python users never
//! call directly.

use crate::{Error, PyPlan};
use hccl_executor::{
    Bootstrap, Buffers, Communicator, Config, DataType, Element, ExecError, PlanSource,
    ProcessGroup, ReduceOp,
};
use hccl_ir::Collective;
use pyo3::create_exception;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

create_exception!(
    _hccl,
    CommError,
    Error,
    "A collective that failed at run time: a lost or slow peer (named), buffers that do not \
     match across ranks, a plan the ranks do not share."
);

fn comm_err(e: ExecError) -> PyErr {
    CommError::new_err(e.to_string())
}

/// The outcome of one call, filled in by the communicator's thread.
#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<(), String>>>,
    ready: Condvar,
}

impl Slot {
    fn set(&self, r: Result<(), String>) {
        if let Ok(mut g) = self.result.lock() {
            *g = Some(r);
        }
        self.ready.notify_all();
    }
}

/// A caller's array: its first element's address and its length in elements.
#[derive(Clone, Copy)]
struct Raw {
    ptr: usize,
    len: usize,
}

/// AllToAllv's send counts, send displacements, receive counts, receive displacements.
type Counts = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>);

/// What one call does.
enum Kind {
    Run(Collective),
    AllToAllV {
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
    },
}

struct Job {
    kind: Kind,
    op: ReduceOp,
    dtype: DataType,
    input: Option<Raw>,
    output: Raw,
    slot: Arc<Slot>,
    /// What keeps a queued call's arrays alive until it has run (the caller's objects):
    /// released by the worker once the call is done, whatever became of its handle.
    keep: Option<Py<PyAny>>,
}

/// Runs `job` on `comm` with the element type `T`.
///
/// # Safety
/// `job`'s pointers must address live, properly aligned arrays of `T` of the given lengths,
/// the output writable and not aliased by anything else during the call (the input may be
/// the output only as `input: None`).
unsafe fn run_typed<T: Element>(comm: &mut Communicator, job: &Job) -> Result<(), ExecError> {
    let out_ptr = if job.output.len == 0 {
        std::ptr::NonNull::<T>::dangling().as_ptr()
    } else {
        job.output.ptr as *mut T
    };
    // SAFETY: the caller guarantees the output array (see above).
    let output: &mut [T] = unsafe { std::slice::from_raw_parts_mut(out_ptr, job.output.len) };
    let input: Option<&[T]> = job.input.map(|r| {
        let p = if r.len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr() as *const T
        } else {
            r.ptr as *const T
        };
        // SAFETY: the caller guarantees the input array.
        unsafe { std::slice::from_raw_parts(p, r.len) }
    });
    match &job.kind {
        Kind::Run(c) => {
            let buffers = match input {
                Some(input) => Buffers::OutOfPlace { input, output },
                None => Buffers::InPlace(output),
            };
            comm.run(*c, job.op, buffers)
        }
        Kind::AllToAllV {
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
        } => {
            let input = input.ok_or_else(|| {
                ExecError::Invalid("AllToAllv needs separate input and output".into())
            })?;
            comm.all_to_all_v(
                input,
                send_counts,
                send_displs,
                output,
                recv_counts,
                recv_displs,
            )
        }
    }
}

fn run_job(comm: &mut Communicator, job: &Job) -> Result<(), ExecError> {
    // SAFETY: the Python side upholds the contract of `call` (module docs).
    unsafe {
        match job.dtype {
            DataType::F32 => run_typed::<f32>(comm, job),
            DataType::F64 => run_typed::<f64>(comm, job),
            DataType::F16 => run_typed::<half::f16>(comm, job),
            DataType::BF16 => run_typed::<half::bf16>(comm, job),
            DataType::I8 => run_typed::<i8>(comm, job),
            DataType::U8 => run_typed::<u8>(comm, job),
            DataType::I32 => run_typed::<i32>(comm, job),
            DataType::U32 => run_typed::<u32>(comm, job),
            DataType::I64 => run_typed::<i64>(comm, job),
            DataType::U64 => run_typed::<u64>(comm, job),
        }
    }
}

/// The communicator, shared by the calling thread (blocking calls run there, with the GIL
/// released, when nothing is queued) and its own thread (queued asynchronous calls);
/// `None` once finalized.
type Shared = Arc<Mutex<Option<Communicator>>>;

fn run_locked(comm: &Shared, job: &Job) -> Result<(), String> {
    match comm.lock() {
        Ok(mut g) => match g.as_mut() {
            Some(c) => run_job(c, job).map_err(|e| e.to_string()),
            None => Err("the communicator was finalized".into()),
        },
        Err(_) => Err("the communicator failed in an earlier call (lock poisoned)".into()),
    }
}

/// The communicator's thread: runs queued calls in submission order until the queue closes.
fn serve(comm: Shared, pending: Arc<AtomicUsize>, rx: mpsc::Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let r = run_locked(&comm, &job);
        pending.fetch_sub(1, Ordering::AcqRel);
        job.slot.set(r);
        // Dropped without the GIL: PyO3 releases the references the next time a thread
        // holds it.
        drop(job.keep);
    }
}

/// A pending call.
#[pyclass(module = "hccl._hccl", frozen)]
pub struct Handle {
    slot: Arc<Slot>,
}

#[pymethods]
impl Handle {
    /// Waits (GIL released) up to `timeout` seconds (forever when `None`); `True` when the
    /// call finished, raising `CommError` if it failed.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let slot = self.slot.clone();
        type Waited = Result<Option<Result<(), String>>, String>;
        let outcome: Waited = py.detach(move || {
            let mut g = slot.result.lock().map_err(|_| "poisoned".to_string())?;
            let deadline =
                timeout.map(|t| std::time::Instant::now() + Duration::from_secs_f64(t.max(0.0)));
            loop {
                if let Some(r) = g.as_ref() {
                    return Ok(Some(r.clone()));
                }
                match deadline {
                    None => {
                        g = slot.ready.wait(g).map_err(|_| "poisoned".to_string())?;
                    }
                    Some(d) => {
                        let now = std::time::Instant::now();
                        if now >= d {
                            return Ok(None);
                        }
                        g = slot
                            .ready
                            .wait_timeout(g, d - now)
                            .map_err(|_| "poisoned".to_string())?
                            .0;
                    }
                }
            }
        });
        match outcome {
            Ok(Some(Ok(()))) => Ok(true),
            Ok(Some(Err(m))) => Err(CommError::new_err(m)),
            Ok(None) => Ok(false),
            Err(m) => Err(CommError::new_err(m)),
        }
    }

    /// Whether the call has finished (successfully or not).
    fn done(&self) -> bool {
        self.slot.result.lock().map(|g| g.is_some()).unwrap_or(true)
    }
}

/// One rank of a job (`hccl_executor::Communicator`): blocking calls run on the caller's
/// thread, asynchronous ones on a thread of the communicator's own, in submission order.
#[pyclass(module = "hccl._hccl", name = "Communicator", frozen)]
pub struct PyComm {
    comm: Shared,
    /// Calls queued and not yet finished: a blocking call runs in place only when none is.
    pending: Arc<AtomicUsize>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    rank: u32,
    world: u32,
    plan_hash: String,
}

impl PyComm {
    fn start(comm: Communicator) -> PyResult<PyComm> {
        let (rank, world, plan_hash) =
            (comm.rank(), comm.world_size(), comm.plan_hash().to_string());
        let comm: Shared = Arc::new(Mutex::new(Some(comm)));
        let pending = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (c, p) = (comm.clone(), pending.clone());
        let worker = std::thread::Builder::new()
            .name(format!("hccl-py-rank{rank}"))
            .spawn(move || serve(c, p, rx))
            .map_err(|e| {
                CommError::new_err(format!("cannot start the communicator thread: {e}"))
            })?;
        Ok(PyComm {
            comm,
            pending,
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            rank,
            world,
            plan_hash,
        })
    }

    fn queue(&self, job: Job) -> PyResult<()> {
        let g = self
            .tx
            .lock()
            .map_err(|_| CommError::new_err("communicator lock poisoned"))?;
        match g.as_ref() {
            Some(tx) => {
                self.pending.fetch_add(1, Ordering::AcqRel);
                tx.send(job).map_err(|_| {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    CommError::new_err("the communicator has stopped")
                })
            }
            None => Err(CommError::new_err("the communicator was finalized")),
        }
    }

    /// Waits (GIL released) until every queued call has finished.
    fn drain(&self, py: Python<'_>) {
        let pending = self.pending.clone();
        py.detach(move || {
            while pending.load(Ordering::Acquire) > 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        });
    }
}

/// Rooted collectives get entries for every root up to this world size (a compiled plan
/// holds root 0's; `PlanFile::ensure_root` relabels them, as `hccl-perf` does per call).
const ALL_ROOTS_UP_TO: u32 = 256;

fn source(plan: Option<&PyPlan>, path: Option<PathBuf>) -> PlanSource {
    match (plan, path) {
        (Some(p), _) => PlanSource::Plan((*p.inner).clone()),
        (None, Some(path)) => PlanSource::Path(path),
        (None, None) => PlanSource::Builtin,
    }
}

/// The plan for `world` ranks from `src`, with entries for every root of Broadcast and Reduce.
fn with_every_root(src: PlanSource, world: u32) -> Result<hccl_ir::PlanFile, ExecError> {
    let mut plan = src.load(world)?;
    if world <= ALL_ROOTS_UP_TO {
        for root in 0..world {
            plan.ensure_root(Collective::Broadcast { root });
            plan.ensure_root(Collective::Reduce { root });
        }
    }
    Ok(plan)
}

fn dtype(name: &str) -> PyResult<DataType> {
    DataType::from_name(name).ok_or_else(|| {
        CommError::new_err(format!(
            "unsupported element type {name:?} (supported: {})",
            DataType::ALL
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    match name.to_ascii_lowercase().as_str() {
        "sum" => Ok(ReduceOp::Sum),
        "prod" | "product" => Ok(ReduceOp::Prod),
        "min" => Ok(ReduceOp::Min),
        "max" => Ok(ReduceOp::Max),
        "avg" | "mean" => Ok(ReduceOp::Avg),
        _ => Err(CommError::new_err(format!(
            "unsupported reduction {name:?} (sum, prod, min, max, avg)"
        ))),
    }
}

#[pymethods]
impl PyComm {
    /// Joins a job from the launcher's environment (RANK/WORLD_SIZE, OMPI_*, PMI_*, SLURM_*;
    /// MASTER_ADDR, MASTER_PORT; the HCCL_* settings), with `plan`, the plan file at `path`,
    /// or (neither) the built-in plans; `HCCL_PLAN` overrides both.
    #[staticmethod]
    #[pyo3(signature = (plan = None, path = None))]
    fn from_env(
        py: Python<'_>,
        plan: Option<PyRef<'_, PyPlan>>,
        path: Option<PathBuf>,
    ) -> PyResult<PyComm> {
        let src = source(plan.as_deref(), path);
        let comm = py
            .detach(|| {
                let (_, world) = hccl_executor::process::rank_world_from_env()?;
                // The built-in plans have every root already (unless HCCL_PLAN names a file).
                let builtin = matches!(src, PlanSource::Builtin);
                let src = if builtin && std::env::var_os("HCCL_PLAN").is_none() {
                    src
                } else {
                    PlanSource::Plan(with_every_root(src, world)?)
                };
                ProcessGroup::init(src)
            })
            .map_err(comm_err)?;
        PyComm::start(comm)
    }

    /// Joins a job as `rank` of `world`, meeting at rank 0's `addr` (`host:port`), with the
    /// plan given (see `from_env`) and the `HCCL_*` settings of the environment. `token`:
    /// a secret every rank presents; `host`: this rank's host identity (ranks of one host
    /// share memory), default `HCCL_HOST_ID`, else this machine's.
    #[staticmethod]
    #[pyo3(signature = (rank, world, addr, plan = None, path = None, token = String::new(), host = None))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        rank: u32,
        world: u32,
        addr: String,
        plan: Option<PyRef<'_, PyPlan>>,
        path: Option<PathBuf>,
        token: String,
        host: Option<String>,
    ) -> PyResult<PyComm> {
        if world == 0 || rank >= world {
            return Err(CommError::new_err(format!(
                "rank {rank} is not a rank of a world of {world}"
            )));
        }
        let src = source(plan.as_deref(), path);
        let boot = Bootstrap { addr, token, host };
        let comm = py
            .detach(|| {
                let config = Config::from_env()?;
                let plan = with_every_root(src, world)?;
                ProcessGroup::init_with(plan, rank, world, &boot, config)
            })
            .map_err(comm_err)?;
        PyComm::start(comm)
    }

    /// A free port on the loopback address for a job this machine starts itself.
    #[staticmethod]
    fn free_port() -> PyResult<u16> {
        hccl_executor::process::local_rendezvous_port()
            .map_err(|e| CommError::new_err(format!("no free port: {e}")))
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    #[getter]
    fn world_size(&self) -> u32 {
        self.world
    }

    #[getter]
    fn plan_hash(&self) -> String {
        self.plan_hash.clone()
    }

    /// One call. Internal: `hccl.Communicator` checks the arrays and keeps them alive (see
    /// the module docs for the contract). `queued`: runs on the communicator's thread after
    /// the calls queued before it, and returns its handle at once; else runs to the end (GIL
    /// released) on this thread, after any queued call, and returns `None`. `keep`: what a
    /// queued call holds until it has run (the arrays' owners), so that neither a dropped
    /// handle nor dropped arrays free memory the call still reads or writes.
    #[pyo3(signature = (queued, collective, op, dtype_, out_ptr, out_len, in_ptr = None, in_len = 0, root = 0, counts = None, keep = None))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        queued: bool,
        collective: &str,
        op: &str,
        dtype_: &str,
        out_ptr: usize,
        out_len: usize,
        in_ptr: Option<usize>,
        in_len: usize,
        root: u32,
        counts: Option<Counts>,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<Option<Handle>> {
        let kind = match collective {
            "allreduce" => Kind::Run(Collective::AllReduce),
            "allgather" => Kind::Run(Collective::AllGather),
            "reducescatter" => Kind::Run(Collective::ReduceScatter),
            "alltoall" => Kind::Run(Collective::AllToAll),
            "broadcast" | "reduce" if root >= self.world => {
                return Err(CommError::new_err(format!(
                    "root {root} is not a rank (world size {})",
                    self.world
                )));
            }
            "broadcast" => Kind::Run(Collective::Broadcast { root }),
            "reduce" => Kind::Run(Collective::Reduce { root }),
            "alltoallv" => {
                let (send_counts, send_displs, recv_counts, recv_displs) =
                    counts.ok_or_else(|| {
                        CommError::new_err(
                            "alltoallv needs send and receive counts and displacements",
                        )
                    })?;
                Kind::AllToAllV {
                    send_counts,
                    send_displs,
                    recv_counts,
                    recv_displs,
                }
            }
            other => {
                return Err(CommError::new_err(format!("unknown collective {other:?}")));
            }
        };
        let job = Job {
            kind,
            op: reduce_op(op)?,
            dtype: dtype(dtype_)?,
            input: in_ptr.map(|ptr| Raw { ptr, len: in_len }),
            output: Raw {
                ptr: out_ptr,
                len: out_len,
            },
            slot: Arc::new(Slot::default()),
            keep,
        };
        if queued {
            let slot = job.slot.clone();
            self.queue(job)?;
            return Ok(Some(Handle { slot }));
        }
        if self.pending.load(Ordering::Acquire) > 0 {
            self.drain(py);
        }
        let comm = self.comm.clone();
        py.detach(move || run_locked(&comm, &job))
            .map_err(CommError::new_err)?;
        Ok(None)
    }

    /// The straggler report as JSON (collective: every rank calls it after the same calls).
    fn straggler_report(&self, py: Python<'_>) -> PyResult<String> {
        self.drain(py);
        let comm = self.comm.clone();
        py.detach(move || {
            let mut g = comm.lock().map_err(|_| "lock poisoned".to_string())?;
            let c = g.as_mut().ok_or("the communicator was finalized")?;
            let report = c.straggler_report().map_err(|e| e.to_string())?;
            serde_json::to_string(&report).map_err(|e| e.to_string())
        })
        .map_err(CommError::new_err)
    }

    /// Ends the communicator after the calls queued and returns its straggler report (JSON);
    /// `None` only when it was already finalized. Collective, like
    /// [`Communicator::finalize`], but a failure is an error, not a missing report: a
    /// communicator that failed in an earlier call (poisoned), a report that could not be
    /// made, a worker thread that died.
    fn finalize(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if let Some(tx) = self.tx.lock().ok().and_then(|mut g| g.take()) {
            drop(tx);
        }
        let worker_died = match self.worker.lock().ok().and_then(|mut g| g.take()) {
            Some(w) => py.detach(move || w.join()).is_err(),
            None => false,
        };
        let comm = self.comm.clone();
        let outcome: Result<Option<String>, String> = py.detach(move || {
            let taken = comm
                .lock()
                .map_err(|_| {
                    "cannot finalize: the communicator failed in an earlier call (lock poisoned)"
                        .to_string()
                })?
                .take();
            let Some(mut c) = taken else {
                return Ok(None);
            };
            if worker_died {
                return Err(
                    "cannot finalize: the communicator's thread for async_op calls died".into(),
                );
            }
            // The report runs two AllReduces through the communicator: on a poisoned one it
            // fails with the reason of the first failure.
            let report = c
                .straggler_report()
                .map_err(|e| format!("cannot finalize (no straggler report): {e}"))?;
            drop(c);
            serde_json::to_string(&report)
                .map(Some)
                .map_err(|e| e.to_string())
        });
        outcome.map_err(CommError::new_err)
    }
}

impl Drop for PyComm {
    fn drop(&mut self) {
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        if let Some(w) = self.worker.lock().ok().and_then(|mut g| g.take()) {
            let _ = w.join();
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CommError", m.py().get_type::<CommError>())?;
    m.add_class::<PyComm>()?;
    m.add_class::<Handle>()?;
    Ok(())
}
