//! The algorithm language's back end: `hccl.lang` records an algorithm's ops in Python
//! (`hccl/lang.py`) and builds them here with the compiler's `ScheduleBuilder`, keeping for
//! every built step the author's ops that made it.

use crate::{
    AlgorithmError, PyPlan, PyTopology, check_sizes, collective_kind, protocols, report_json,
    rows_json, search_err, table_text, verify_errors_json,
};
use hccl_compiler::builder::{BuildError, Origins, ScheduleBuilder};
use hccl_compiler::cost::CostModel;
use hccl_compiler::search::{self, Options, SearchError};
use hccl_ir::verify::verify_report;
use hccl_ir::{
    Buf, Collective, CollectiveKind, Loc, Op, PlanEntry, PlanFile, PlanMeta, Protocol, Schedule,
    StepRef,
};
use pyo3::prelude::*;
use serde_json::{Value, json};
use std::sync::Arc;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Built>()?;
    m.add_function(wrap_pyfunction!(build_algorithm, m)?)?;
    Ok(())
}

/// One op of `hccl.lang`, as the Python side records it (see `hccl/lang.py`).
type OpTuple = (String, u32, i64, i64, String, u32, String, u32, u32, u32);

fn buf(name: &str) -> PyResult<Buf> {
    match name {
        "input" | "i" => Ok(Buf::Input),
        "output" | "o" => Ok(Buf::Output),
        "scratch" | "s" => Ok(Buf::Scratch),
        _ => Err(AlgorithmError::new_err(format!(
            "unknown buffer {name:?} (input, output or scratch)"
        ))),
    }
}

fn peer(p: i64, what: &str) -> PyResult<u32> {
    u32::try_from(p).map_err(|_| AlgorithmError::new_err(format!("{what} {p} is not a rank")))
}

/// A built algorithm: its schedule, and which op of the author's list made each step.
#[pyclass(module = "hccl._hccl", name = "Built", frozen)]
struct Built {
    schedule: Arc<Schedule>,
    origins: Origins,
    /// `op_ids[rank][k]`: the author's op that recorded the builder's k-th op on `rank`.
    op_ids: Vec<Vec<usize>>,
}

impl Built {
    fn ops_of(&self, at: StepRef) -> Vec<usize> {
        let ids = &self.op_ids[at.rank as usize];
        let mut out: Vec<usize> = self
            .origins
            .of(at)
            .into_iter()
            .filter_map(|k| ids.get(k).copied())
            .collect();
        out.dedup();
        out
    }

    fn entry(&self, name: &str, protocol: Protocol) -> PlanEntry {
        PlanEntry {
            min_bytes: 0,
            max_bytes: None,
            algorithm: name.to_string(),
            protocol,
            cost: None,
            schedule: (*self.schedule).clone(),
            symmetry: None,
            synthesis: None,
            template: None,
        }
    }
}

/// Builds an algorithm from its recorded ops. An op that cannot be recorded raises
/// `AlgorithmError(message, op_index)`.
#[pyfunction]
#[pyo3(signature = (collective, root, nranks, chunks, in_place, fusion, ops))]
#[allow(clippy::too_many_arguments)]
fn build_algorithm(
    py: Python<'_>,
    collective: &str,
    root: u32,
    nranks: u32,
    chunks: u32,
    in_place: bool,
    fusion: bool,
    ops: Vec<OpTuple>,
) -> PyResult<Built> {
    let kind = collective_kind(collective).map_err(|e| AlgorithmError::new_err(e.to_string()))?;
    if nranks == 0 {
        return Err(AlgorithmError::new_err(
            "an algorithm needs at least 1 rank",
        ));
    }
    if chunks == 0 {
        return Err(AlgorithmError::new_err(
            "an algorithm needs at least 1 chunk",
        ));
    }
    let coll = match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllToAll => Collective::AllToAll,
        CollectiveKind::Broadcast | CollectiveKind::Reduce if root >= nranks => {
            return Err(AlgorithmError::new_err(format!(
                "root {root} is not a rank (nranks {nranks})"
            )));
        }
        CollectiveKind::Broadcast => Collective::Broadcast { root },
        CollectiveKind::Reduce => Collective::Reduce { root },
    };
    let mut b = ScheduleBuilder::new(coll, nranks, chunks, in_place);
    b.set_fusion(fusion);
    let mut op_ids: Vec<Vec<usize>> = vec![Vec::new(); nranks as usize];
    for (id, op) in ops.into_iter().enumerate() {
        let (code, rank, a, c, b1, o1, b2, o2, count, ch) = op;
        let with_id = |e: PyErr| {
            let msg = e.value(py).to_string();
            AlgorithmError::new_err((msg, id))
        };
        if rank >= nranks {
            return Err(AlgorithmError::new_err((
                format!("rank {rank} is out of range (nranks {nranks})"),
                id,
            )));
        }
        let before: Vec<usize> = (0..nranks).map(|r| b.ops_on(r)).collect();
        let l1 = Loc::new(buf(&b1).map_err(with_id)?, o1);
        let l2 = Loc::new(buf(&b2).map_err(with_id)?, o2);
        record_op(&mut b, &code, rank, (a, c), (l1, l2), (count, ch), nranks).map_err(with_id)?;
        if let Some(e) = b.error() {
            return Err(AlgorithmError::new_err((e.to_string(), id)));
        }
        for (r, ids) in op_ids.iter_mut().enumerate() {
            let now = b.ops_on(r as u32);
            ids.extend(std::iter::repeat_n(id, now - before[r]));
        }
    }
    let (schedule, origins) = py.detach(|| b.build_traced()).map_err(|e| {
        let (rank, index) = match &e {
            BuildError::RankOutOfRange { rank, index, .. }
            | BuildError::OutOfBounds { rank, index, .. }
            | BuildError::ZeroCount { rank, index }
            | BuildError::SelfPeer { rank, index } => (Some(*rank), Some(*index)),
            BuildError::TooLarge { rank, .. } => (Some(*rank), None),
            BuildError::BadChunks { .. } => (None, None),
        };
        let id = rank
            .zip(index)
            .and_then(|(r, i)| op_ids.get(r as usize)?.get(i).copied());
        AlgorithmError::new_err((e.to_string(), id))
    })?;
    Ok(Built {
        schedule: Arc::new(schedule),
        origins,
        op_ids,
    })
}

/// Records one op of `hccl.lang` on `rank` into the builder: `copy`/`reduce` to rank `a`,
/// or a step whose peers are `a` (from or to) and `c` (to), at locations `l1`, `l2`, of
/// `count` chunks on channel `ch`.
fn record_op(
    b: &mut ScheduleBuilder,
    code: &str,
    rank: u32,
    (a, c): (i64, i64),
    (l1, l2): (Loc, Loc),
    (count, ch): (u32, u32),
    nranks: u32,
) -> PyResult<()> {
    let op = match code {
        "copy" | "reduce" => {
            let dst = peer(a, "destination rank")?;
            if dst >= nranks {
                return Err(AlgorithmError::new_err(format!(
                    "destination rank {dst} is out of range (nranks {nranks})"
                )));
            }
            if code == "copy" {
                b.copy((rank, l1), (dst, l2), count, ch);
            } else {
                b.reduce((rank, l1), (dst, l2), count, ch);
            }
            return Ok(());
        }
        "fence" => {
            b.fence(rank);
            return Ok(());
        }
        "send" => Op::Send {
            to: peer(a, "to")?,
            src: l1,
        },
        "recv" => Op::Recv {
            from: peer(a, "from")?,
            dst: l1,
        },
        "rrc" => Op::RecvReduceCopy {
            from: peer(a, "from")?,
            src: l1,
            dst: l2,
        },
        "rrs" => Op::RecvReduceSend {
            from: peer(a, "from")?,
            to: peer(c, "to")?,
            src: l1,
        },
        "rrcs" => Op::RecvReduceCopySend {
            from: peer(a, "from")?,
            to: peer(c, "to")?,
            src: l1,
            dst: l2,
        },
        "rcs" => Op::RecvCopySend {
            from: peer(a, "from")?,
            to: peer(c, "to")?,
            dst: l1,
        },
        other => return Err(AlgorithmError::new_err(format!("unknown op {other:?}"))),
    };
    b.push(rank, op, count, ch);
    Ok(())
}

#[pymethods]
impl Built {
    /// `(True, report JSON)` or `(False, errors JSON)`, each error with the author's op ids
    /// (`ops`) that made the step it names.
    fn verify(&self, py: Python<'_>) -> (bool, String) {
        let s = self.schedule.clone();
        match py.detach(|| verify_report(&s)) {
            Ok(r) => (true, report_json(&r).to_string()),
            Err(errors) => {
                let mut list = verify_errors_json(&errors);
                if let Value::Array(items) = &mut list {
                    for (item, e) in items.iter_mut().zip(&errors) {
                        let ops = e.at.map(|at| self.ops_of(at)).unwrap_or_default();
                        item["ops"] = json!(ops);
                    }
                }
                (false, list.to_string())
            }
        }
    }

    /// Rows (JSON, and as `hcclc`'s table) at `sizes` under the fastest of `protocols`,
    /// beside NCCL's choice and the bound, in the compiler's simulator.
    #[pyo3(signature = (topo, sizes, protocols_ = None, name = "algorithm"))]
    fn cost(
        &self,
        py: Python<'_>,
        topo: &PyTopology,
        sizes: Vec<u64>,
        protocols_: Option<Vec<String>>,
        name: &str,
    ) -> PyResult<(String, String)> {
        check_sizes(&sizes)?;
        let protos = protocols(protocols_)?;
        let (s, t) = (self.schedule.clone(), topo.inner.clone());
        py.detach(|| {
            let options = Options {
                sizes,
                model: CostModel::for_topology(&t),
                ..Options::default()
            };
            let offered: Vec<Protocol> = protos
                .iter()
                .copied()
                .filter(|&p| options.model.offers(p))
                .collect();
            if offered.is_empty() {
                return Err(SearchError::BadOptions(format!(
                    "none of the protocols {} runs on {}",
                    protos
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                    t.name
                )));
            }
            search::evaluate_schedule(&t, name, &s, &offered, &options)
                .map(|r| (rows_json(&r), table_text(name, &t, &r)))
        })
        .map_err(search_err)
    }

    /// A plan of this one schedule for every size, under `protocol`.
    fn to_plan(&self, name: &str, protocol: &str, topology: &str) -> PyResult<PyPlan> {
        let p = protocols(Some(vec![protocol.to_string()]))?[0];
        let mut plan = PlanFile::new(PlanMeta {
            topology: topology.to_string(),
            topology_hash: String::new(),
            compiler: format!("hccl.lang {}", env!("CARGO_PKG_VERSION")),
        });
        plan.entries.push(self.entry(name, p));
        Ok(PyPlan::wrap(plan))
    }

    /// The author's op ids that made step `(rank, stream, step)`.
    fn ops_at(&self, rank: u32, stream: u32, step: u32) -> Vec<usize> {
        if rank as usize >= self.op_ids.len() {
            return Vec::new();
        }
        self.ops_of(StepRef { rank, stream, step })
    }

    /// The built programs as JSON: per rank, per stream, its channel and steps (op mnemonic,
    /// peers, locations, count, dependencies, the author's op ids).
    fn programs_json(&self) -> String {
        let s = &self.schedule;
        let loc = |l: Option<Loc>| l.map(|l| l.to_string());
        let ranks: Vec<Value> = s
            .ranks
            .iter()
            .enumerate()
            .map(|(r, prog)| {
                let streams: Vec<Value> = prog
                    .streams
                    .iter()
                    .enumerate()
                    .map(|(si, st)| {
                        let steps: Vec<Value> = st
                            .steps
                            .iter()
                            .enumerate()
                            .map(|(k, step)| {
                                json!({
                                    "op": step.op.mnemonic(),
                                    "from": step.op.recv_peer(),
                                    "to": step.op.send_peer(),
                                    "src": loc(step.op.src()),
                                    "dst": loc(step.op.dst()),
                                    "count": step.count,
                                    "deps": step.deps.iter().map(|d| [d.stream, d.step]).collect::<Vec<_>>(),
                                    "ops": self.ops_of(StepRef { rank: r as u32, stream: si as u32, step: k as u32 }),
                                })
                            })
                            .collect();
                        json!({ "channel": st.channel, "steps": steps })
                    })
                    .collect();
                json!({ "scratch_chunks": prog.scratch_chunks, "streams": streams })
            })
            .collect();
        Value::Array(ranks).to_string()
    }

    #[getter]
    fn nranks(&self) -> u32 {
        self.schedule.nranks
    }

    #[getter]
    fn steps(&self) -> usize {
        self.schedule.step_count()
    }

    #[getter]
    fn hash(&self) -> String {
        hccl_ir::schedule_hash(&self.entry("", Protocol::Simple))
    }
}
