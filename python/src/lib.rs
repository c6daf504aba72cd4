//! `hccl._hccl`: the native half of the `hccl` Python package.
//!
//! It calls the crates' public API and nothing else; the pure-Python package (`hccl/`) wraps
//! it in documented classes (rows as dataclasses, tables, the algorithm language) and is what
//! users import. Structured results cross as JSON text (rows, summaries, reports), which the
//! Python side decodes: one encoding, the same fields as `hcclc --json`.
//!
//! Every failure is a Python exception of the `hccl.Error` hierarchy carrying the located
//! message the command line prints; no input reaches a Rust panic (a panic would still only
//! raise `pyo3_runtime.PanicException`, never abort the interpreter).

mod array;
mod comm;
mod lang;

use hccl_compiler::cost::CostModel;
use hccl_compiler::families::Candidate;
use hccl_compiler::report::{self, ReportError};
use hccl_compiler::search::{self, Options, Progress, SearchError};
use hccl_compiler::synth::SynthLevel;
use hccl_ir::verify::{VerifyError as IrVerifyError, verify_entry};
use hccl_ir::{CollectiveKind, PlanFile, Protocol};
use hccl_topologies::{Topology as RsTopology, TopologySpec};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

create_exception!(
    _hccl,
    Error,
    PyException,
    "Base class of every error hccl raises."
);
create_exception!(
    _hccl,
    TopologyError,
    Error,
    "A topology that cannot be read, built or generated (file, line and field in the message)."
);
create_exception!(
    _hccl,
    PlanError,
    Error,
    "A plan file or MSCCL XML that cannot be read or written (file, line and column)."
);
create_exception!(
    _hccl,
    VerifyError,
    Error,
    "A schedule that does not implement its collective or can deadlock (rank, stream, step)."
);
create_exception!(
    _hccl,
    CompileError,
    Error,
    "A compile that cannot run with the options given, or finds no verified schedule."
);
create_exception!(
    _hccl,
    AlgorithmError,
    Error,
    "An algorithm written in hccl.lang that cannot be built (an op out of range, a bad chunk count)."
);

fn topo_err(e: impl std::fmt::Display) -> PyErr {
    TopologyError::new_err(e.to_string())
}

fn plan_err(e: impl std::fmt::Display) -> PyErr {
    PlanError::new_err(e.to_string())
}

fn search_err(e: SearchError) -> PyErr {
    CompileError::new_err(e.to_string())
}

fn report_err(e: ReportError) -> PyErr {
    match e {
        ReportError::Input(m) => PlanError::new_err(m),
        ReportError::Failed(m) => CompileError::new_err(m),
    }
}

/// Largest rank count the generators accept (as `hcclc topo gen`).
const MAX_GEN_RANKS: u64 = 1 << 16;

fn check_ranks(what: &str, n: u64) -> PyResult<()> {
    if (1..=MAX_GEN_RANKS).contains(&n) {
        Ok(())
    } else {
        Err(TopologyError::new_err(format!(
            "{what} must give between 1 and {MAX_GEN_RANKS} ranks, got {n}"
        )))
    }
}

fn check_positive(what: &str, x: f64) -> PyResult<()> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(TopologyError::new_err(format!(
            "{what} must be a finite number > 0, got {x}"
        )))
    }
}

fn protocols(names: Option<Vec<String>>) -> PyResult<Vec<Protocol>> {
    match names {
        None => Ok(Protocol::ALL.to_vec()),
        Some(list) => {
            let mut out = Vec::new();
            for name in list {
                let p = Protocol::from_name(&name).ok_or_else(|| {
                    CompileError::new_err(format!(
                        "unknown protocol `{name}` (known: LL, LL128, Simple)"
                    ))
                })?;
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            if out.is_empty() {
                return Err(CompileError::new_err("no protocol given"));
            }
            Ok(out)
        }
    }
}

fn collective_kind(name: &str) -> PyResult<CollectiveKind> {
    CollectiveKind::from_name(name).ok_or_else(|| {
        CompileError::new_err(format!(
            "unknown collective `{name}` (known: allreduce, allgather, reducescatter, broadcast, \
             reduce, alltoall)"
        ))
    })
}

fn check_sizes(sizes: &[u64]) -> PyResult<()> {
    if sizes.is_empty() {
        return Err(CompileError::new_err("no message sizes given"));
    }
    if sizes.contains(&0) {
        return Err(CompileError::new_err(
            "message sizes must be at least 1 byte",
        ));
    }
    Ok(())
}

/// `hcclc`'s table of `rows` on `t`, and the line saying which calibration predicted them.
fn table_text(title: &str, t: &RsTopology, rows: &[search::Row]) -> String {
    format!(
        "{}{}\n",
        report::table(title, t, rows),
        report::calibration_line(t, &calibration_origin(t))
    )
}

/// Where a topology's calibration comes from, as far as Python knows it: its name.
fn calibration_origin(t: &RsTopology) -> String {
    format!("the topology {}", t.name)
}

fn rows_json(rows: &[search::Row]) -> String {
    Value::Array(rows.iter().map(report::row_json).collect()).to_string()
}

/// A machine: devices, hosts, NICs, switches and links (`hccl_topologies::Topology`).
#[pyclass(module = "hccl._hccl", name = "Topology", frozen)]
struct PyTopology {
    inner: Arc<RsTopology>,
}

impl PyTopology {
    fn wrap(t: RsTopology) -> PyTopology {
        PyTopology { inner: Arc::new(t) }
    }

    fn build(spec: TopologySpec) -> PyResult<PyTopology> {
        hccl_topologies::build(spec, "<generated>")
            .map(PyTopology::wrap)
            .map_err(topo_err)
    }
}

#[pymethods]
impl PyTopology {
    /// A RON file's path or a shipped machine's name.
    #[staticmethod]
    fn load(py: Python<'_>, spec: PathBuf) -> PyResult<PyTopology> {
        let spec = spec.to_string_lossy().into_owned();
        py.detach(|| hccl_topologies::load_spec(&spec))
            .map(PyTopology::wrap)
            .map_err(topo_err)
    }

    /// A topology from RON text; `origin` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>"))]
    fn from_ron(text: &str, origin: &str) -> PyResult<PyTopology> {
        hccl_topologies::from_ron(text, origin)
            .map(PyTopology::wrap)
            .map_err(topo_err)
    }

    /// Names of the shipped machines.
    #[staticmethod]
    fn shipped_names() -> Vec<String> {
        hccl_topologies::shipped()
            .iter()
            .map(|(n, _)| n.to_string())
            .collect()
    }

    #[staticmethod]
    fn ring(ranks: u64, bw: f64, latency: f64) -> PyResult<PyTopology> {
        check_ranks("ranks", ranks)?;
        check_positive("bw", bw)?;
        check_positive("latency", latency)?;
        PyTopology::build(hccl_topologies::generate::ring(ranks as u32, bw, latency))
    }

    #[staticmethod]
    fn torus(dims: Vec<u64>, bw: f64, latency: f64) -> PyResult<PyTopology> {
        if dims.is_empty() || dims.len() > 3 || dims.contains(&0) {
            return Err(TopologyError::new_err(format!(
                "dims must be 1 to 3 positive extents, got {dims:?}"
            )));
        }
        check_ranks("dims", dims.iter().fold(1u64, |a, &d| a.saturating_mul(d)))?;
        check_positive("bw", bw)?;
        check_positive("latency", latency)?;
        let dims: Vec<u32> = dims.iter().map(|&d| d as u32).collect();
        PyTopology::build(hccl_topologies::generate::torus(&dims, bw, latency))
    }

    #[staticmethod]
    fn cluster(nodes: u64, r#box: &PyTopology) -> PyResult<PyTopology> {
        let boxed = &r#box.inner;
        if boxed.spec.hosts.iter().all(|h| h.nics.is_empty()) {
            return Err(TopologyError::new_err(format!(
                "box {}: it has no NICs, so copies of it cannot be networked (for CPU hosts, \
                 generate the box with Topology.host(ranks, nic_bw=GBPS))",
                boxed.name
            )));
        }
        check_ranks("nodes", nodes.saturating_mul(u64::from(boxed.nranks())))?;
        PyTopology::build(hccl_topologies::generate::cluster(
            nodes as u32,
            &boxed.spec,
        ))
    }

    #[staticmethod]
    #[pyo3(signature = (ranks, mem_bw = None, nic_bw = None, nic_latency = None))]
    fn host(
        py: Python<'_>,
        ranks: u64,
        mem_bw: Option<f64>,
        nic_bw: Option<f64>,
        nic_latency: Option<f64>,
    ) -> PyResult<PyTopology> {
        check_ranks("ranks", ranks)?;
        if let Some(bw) = mem_bw {
            check_positive("mem_bw", bw)?;
        }
        if let Some(bw) = nic_bw {
            check_positive("nic_bw", bw)?;
        }
        if let Some(latency) = nic_latency {
            if nic_bw.is_none() {
                return Err(TopologyError::new_err(
                    "nic_latency needs nic_bw: without nic_bw the host has no NIC",
                ));
            }
            check_positive("nic_latency", latency)?;
        }
        let spec = py
            .detach(|| {
                hccl_compiler::cost::calibrate::host_spec(
                    ranks as u32,
                    mem_bw,
                    nic_bw.map(|bw| (bw, nic_latency)),
                    None,
                )
            })
            .map_err(TopologyError::new_err)?;
        PyTopology::build(spec)
    }

    /// This machine (sysfs and nvidia-smi), with the notes on what was found and assumed.
    #[staticmethod]
    #[pyo3(signature = (sysfs = PathBuf::from("/sys"), name = None, mem_bw = None))]
    fn detect(
        py: Python<'_>,
        sysfs: PathBuf,
        name: Option<String>,
        mem_bw: Option<f64>,
    ) -> PyResult<(PyTopology, Vec<String>)> {
        if !sysfs.is_dir() {
            return Err(TopologyError::new_err(format!(
                "{}: no such directory (the sysfs to read)",
                sysfs.display()
            )));
        }
        let detected = py
            .detach(|| {
                let sources = hccl_topologies::detect::nvidia_sources();
                hccl_topologies::detect::detect(&sysfs, &sources, name.as_deref(), mem_bw)
            })
            .map_err(topo_err)?;
        let notes = detected.notes();
        Ok((PyTopology::build(detected.spec)?, notes))
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    #[getter]
    fn description(&self) -> String {
        self.inner.description.clone()
    }

    /// Which calibration predictions for this topology use (`hcclc compile --json`'s
    /// `calibration`), as JSON.
    #[getter]
    fn calibration(&self) -> String {
        report::calibration_json(&self.inner, &calibration_origin(&self.inner)).to_string()
    }

    #[getter]
    fn hash(&self) -> String {
        self.inner.hash.clone()
    }

    #[getter]
    fn nranks(&self) -> u32 {
        self.inner.nranks()
    }

    #[getter]
    fn nhosts(&self) -> usize {
        self.inner.nhosts()
    }

    /// `hcclc topo show --json`: hosts, devices, links, injection, bandwidth matrix, bisection.
    fn summary_json(&self, py: Python<'_>) -> PyResult<String> {
        let t = self.inner.clone();
        let summary = py.detach(|| hccl_topologies::summarize(&t));
        serde_json::to_string(&summary).map_err(topo_err)
    }

    /// The spec as RON (what `Topology.load` reads back).
    fn to_ron(&self) -> String {
        hccl_topologies::to_ron(&self.inner.spec)
    }

    fn svg(&self, py: Python<'_>) -> PyResult<String> {
        let t = self.inner.clone();
        py.detach(|| hccl_compiler::plot::topology_svg(&t))
            .map_err(|e| TopologyError::new_err(e.to_string()))
    }

    fn dot(&self) -> String {
        hccl_topologies::dot::to_dot(&self.inner)
    }

    /// Direct links between ranks (no switch or NIC between them) as JSON: per ordered pair
    /// `a → b`, the link kind, bandwidth (GB/s, all parallel links), latency (µs), count.
    fn rank_links_json(&self, py: Python<'_>) -> String {
        let t = self.inner.clone();
        py.detach(|| {
            let n = t.nranks();
            let mut out = Vec::new();
            if n <= 4096 {
                for a in 0..n {
                    for b in 0..n {
                        if a == b {
                            continue;
                        }
                        if let Some(e) = t.direct_edge(a, b) {
                            let edge = &t.graph[e];
                            out.push(json!({
                                "a": a,
                                "b": b,
                                "kind": format!("{:?}", edge.kind),
                                "bw": edge.bw,
                                "latency": edge.latency,
                                "count": edge.count,
                            }));
                        }
                    }
                }
            }
            Value::Array(out).to_string()
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Topology({:?}, nranks={}, nhosts={})",
            self.inner.name,
            self.inner.nranks(),
            self.inner.nhosts()
        )
    }
}

/// A plan file: verified schedules and the sizes each serves (`hccl_ir::PlanFile`).
#[pyclass(module = "hccl._hccl", name = "Plan", frozen)]
struct PyPlan {
    inner: Arc<PlanFile>,
}

impl PyPlan {
    fn wrap(p: PlanFile) -> PyPlan {
        PyPlan { inner: Arc::new(p) }
    }

    /// The plan explained on `topo` at `sizes` (GIL released).
    fn rows(
        &self,
        py: Python<'_>,
        topo: &Arc<RsTopology>,
        sizes: Vec<u64>,
    ) -> PyResult<Vec<search::Row>> {
        check_sizes(&sizes)?;
        let (plan, t) = (self.inner.clone(), topo.clone());
        py.detach(|| {
            let options = Options {
                sizes,
                model: CostModel::for_topology(&t),
                ..Options::default()
            };
            search::evaluate_plan(&t, &plan, &options)
        })
        .map_err(search_err)
    }
}

fn verify_errors_json(errors: &[IrVerifyError]) -> Value {
    Value::Array(
        errors
            .iter()
            .map(|e| {
                json!({
                    "rank": e.at.map(|a| a.rank),
                    "stream": e.at.map(|a| a.stream),
                    "step": e.at.map(|a| a.step),
                    "channel": e.channel,
                    "kind": e.kind.name(),
                    "message": e.message,
                    "text": e.to_string(),
                })
            })
            .collect(),
    )
}

fn report_json(r: &hccl_ir::verify::Report) -> Value {
    json!({
        "ranks": r.ranks,
        "streams": r.streams,
        "steps": r.steps,
        "connections": r.connections,
        "messages": r.messages,
        "chunks_sent": r.chunks_sent,
        "reductions": r.reductions,
        "depth": r.depth,
    })
}

#[pymethods]
impl PyPlan {
    /// A plan file (RON), or an MSCCL algorithm (by its `.xml` extension).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<PyPlan> {
        let is_xml = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("xml"));
        py.detach(|| {
            if is_xml {
                hccl_ir::msccl::load_xml(&path)
                    .map(|i| i.into_plan(&path.display().to_string()))
                    .map_err(plan_err)
            } else {
                PlanFile::load(&path).map_err(plan_err)
            }
        })
        .map(PyPlan::wrap)
    }

    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>"))]
    fn from_ron(py: Python<'_>, text: &str, origin: &str) -> PyResult<PyPlan> {
        py.detach(|| PlanFile::from_ron(text, origin))
            .map(PyPlan::wrap)
            .map_err(plan_err)
    }

    /// The executor's built-in plans for `world` ranks (what a communicator runs when given
    /// no plan): hand-written, topology-agnostic schedules.
    #[staticmethod]
    fn builtin(world: u32) -> PyResult<PyPlan> {
        if world == 0 || world > 4096 {
            return Err(PlanError::new_err(format!(
                "built-in plans are for 1 to 4096 ranks, not {world}"
            )));
        }
        Ok(PyPlan::wrap(hccl_executor::fallback::plan(world)))
    }

    /// MSCCL XML text → a plan (its entries unverified until `verify`), with the importer's
    /// warnings.
    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>"))]
    fn from_msccl_xml(text: &str, origin: &str) -> PyResult<(PyPlan, Vec<String>)> {
        let imported = hccl_ir::msccl::import_xml(text, origin).map_err(plan_err)?;
        let warnings = imported.warnings.clone();
        Ok((PyPlan::wrap(imported.into_plan(origin)), warnings))
    }

    /// Writes the plan atomically (nothing half-written on failure).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let plan = self.inner.clone();
        py.detach(|| plan.save(&path)).map_err(plan_err)
    }

    fn to_ron(&self) -> String {
        self.inner.to_ron()
    }

    #[getter]
    fn hash(&self) -> String {
        self.inner.content_hash()
    }

    #[getter]
    fn topology(&self) -> String {
        self.inner.meta.topology.clone()
    }

    #[getter]
    fn topology_hash(&self) -> String {
        self.inner.meta.topology_hash.clone()
    }

    #[getter]
    fn compiler(&self) -> String {
        self.inner.meta.compiler.clone()
    }

    fn __len__(&self) -> usize {
        self.inner.entries.len()
    }

    /// The entries as JSON: collective, root, sizes, algorithm, protocol, ranks, chunks,
    /// channels, steps, in_place, schedule hash.
    fn entries_json(&self) -> String {
        let hashes = self.inner.schedule_hashes();
        Value::Array(
            self.inner
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    json!({
                        "index": i,
                        "collective": e.schedule.collective.kind().name(),
                        "root": e.schedule.collective.root(),
                        "min_bytes": e.min_bytes,
                        "max_bytes": e.max_bytes,
                        "algorithm": e.algorithm,
                        "protocol": e.protocol.name(),
                        "nranks": e.schedule.nranks,
                        "chunks": e.schedule.chunks,
                        "channels": e.channel_count(),
                        "steps": e.step_count(),
                        "in_place": e.schedule.in_place,
                        "hash": hashes.get(i),
                    })
                })
                .collect(),
        )
        .to_string()
    }

    /// Verifies every entry: `(True, reports)` or `(False, [(entry, errors)])`, as JSON text.
    fn verify(&self, py: Python<'_>) -> (bool, String) {
        let plan = self.inner.clone();
        py.detach(|| {
            let mut reports = Vec::new();
            let mut failed = Vec::new();
            for (i, entry) in plan.entries.iter().enumerate() {
                match verify_entry(entry) {
                    Ok(r) => reports.push(report_json(&r)),
                    Err(errors) => failed.push(json!({
                        "entry": i,
                        "collective": entry.schedule.collective.to_string(),
                        "algorithm": entry.algorithm,
                        "errors": verify_errors_json(&errors),
                    })),
                }
            }
            if failed.is_empty() {
                (true, Value::Array(reports).to_string())
            } else {
                (false, Value::Array(failed).to_string())
            }
        })
    }

    /// `hcclc explain` on `topo` at `sizes`: the rows (JSON) and the table (`title` names
    /// the plan in it).
    fn explain(
        &self,
        py: Python<'_>,
        topo: &PyTopology,
        sizes: Vec<u64>,
        title: &str,
    ) -> PyResult<(String, String)> {
        let t = topo.inner.clone();
        let rows = self.rows(py, &t, sizes)?;
        Ok((rows_json(&rows), table_text(title, &t, &rows)))
    }

    /// The predicted timeline of one call: `(trace JSON, summary JSON, SVG picture)`.
    #[pyo3(signature = (topo, bytes, collective = None, links = 8, label = "plan"))]
    fn trace(
        &self,
        py: Python<'_>,
        topo: &PyTopology,
        bytes: u64,
        collective: Option<&str>,
        links: usize,
        label: &str,
    ) -> PyResult<(String, String, String)> {
        let kind = collective.map(collective_kind).transpose()?;
        let (plan, t) = (self.inner.clone(), topo.inner.clone());
        py.detach(|| {
            let trace = report::predicted_trace(&plan, label, &t, bytes, kind, links)
                .map_err(report_err)?;
            let s = &trace.summary;
            let title = format!(
                "predicted · {} · {} · {} · {}",
                s["collective"].as_str().unwrap_or_default(),
                s["algorithm"].as_str().unwrap_or_default(),
                t.name,
                hccl_ir::units::format_bytes(bytes)
            );
            let (svg, _) = hccl_compiler::plot::timeline_svg(&trace.doc, &title)
                .map_err(|e| CompileError::new_err(e.to_string()))?;
            Ok((trace.doc.to_json(), trace.summary.to_string(), svg))
        })
    }

    /// The busbw chart (SVG) of rows explained on `topo` at `sizes`.
    fn plot(
        &self,
        py: Python<'_>,
        topo: &PyTopology,
        sizes: Vec<u64>,
        name: &str,
    ) -> PyResult<String> {
        let t = topo.inner.clone();
        let rows = self.rows(py, &t, sizes)?;
        report::busbw_svg(name, &t, &rows).map_err(|e| CompileError::new_err(e.to_string()))
    }

    /// Entry `entry` as MSCCL XML, with the limits of MSCCL's runtime it exceeds.
    fn to_msccl_xml(&self, entry: usize) -> PyResult<(String, Vec<String>)> {
        let e = self.inner.entries.get(entry).ok_or_else(|| {
            PlanError::new_err(format!(
                "no entry {entry}: the plan has {}",
                self.inner.entries.len()
            ))
        })?;
        hccl_ir::msccl::export_xml(e)
            .map(|x| (x.xml, x.warnings))
            .map_err(plan_err)
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(topology={:?}, entries={})",
            self.inner.meta.topology,
            self.inner.entries.len()
        )
    }
}

/// `hcclc compile`: `(plan, rows JSON, the table as text, skipped collectives' reasons)`. The GIL is released
/// while the search runs; `progress(collective, done, total, collectives_done,
/// collectives_total)` is called between phases, and Ctrl-C (or an exception from
/// `progress`) stops the search at its next phase boundary and is raised here.
#[pyfunction]
#[pyo3(signature = (topo, collectives = None, sizes = None, algo = None, proto = None,
    synth = "auto", candidates = Vec::new(), sim_budget = None, progress = None,
    cache = true))]
#[allow(clippy::too_many_arguments)]
fn compile(
    py: Python<'_>,
    topo: &PyTopology,
    collectives: Option<Vec<String>>,
    sizes: Option<Vec<u64>>,
    algo: Option<Vec<String>>,
    proto: Option<Vec<String>>,
    synth: &str,
    candidates: Vec<PyRef<'_, PyPlan>>,
    sim_budget: Option<usize>,
    progress: Option<Py<PyAny>>,
    cache: bool,
) -> PyResult<(PyPlan, String, String, Vec<String>)> {
    let t = topo.inner.clone();
    let mut kinds = Vec::new();
    for name in collectives.unwrap_or_else(|| {
        CollectiveKind::ALL
            .iter()
            .map(|k| k.name().to_string())
            .collect()
    }) {
        let k = collective_kind(&name)?;
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        return Err(CompileError::new_err("no collective given"));
    }
    let sizes = sizes.unwrap_or_else(|| {
        search::geometric_sizes(search::DEFAULT_MIN_BYTES, search::DEFAULT_MAX_BYTES, 2)
    });
    check_sizes(&sizes)?;
    if sim_budget == Some(0) {
        return Err(CompileError::new_err("sim_budget must be at least 1"));
    }
    let synth = SynthLevel::from_name(synth).ok_or_else(|| {
        CompileError::new_err(format!("synth={synth:?}: expected off, auto or full"))
    })?;
    let (extra, extra_identity) = compile_candidates(&t, &candidates)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let options = Options {
        collectives: kinds,
        sizes,
        algorithms: algo,
        protocols: protocols(proto)?,
        extra,
        model: CostModel::for_topology(&t),
        sim_budget: sim_budget.unwrap_or(Options::default().sim_budget),
        synth,
        partial: true,
        cancel: Some(cancel.clone()),
        cache_dir: if cache {
            hccl_compiler::synth::cache::default_dir()
        } else {
            None
        },
    };
    // The plan cache, as `hcclc compile` reads and writes it.
    let cache = options.cache_dir.clone().and_then(|dir| {
        search::plan_cache::key(&t, &options, Some(&extra_identity)).map(|key| (dir, key))
    });
    if let Some((dir, key)) = &cache
        && let Some((plan, rows)) = py.detach(|| cached_compile(dir, key))
    {
        let table = table_text("(compiled in Python)", &topo.inner, &rows);
        return Ok((PyPlan::wrap(plan), rows_json(&rows), table, Vec::new()));
    }
    let clock_stops = hccl_compiler::clock::clock_stops();
    let (tx, rx) = std::sync::mpsc::channel::<Progress>();
    let worker = std::thread::Builder::new()
        .name("hccl-compile".into())
        .spawn(move || {
            let compiled = search::compile_with_progress(&t, &options, &mut |p| {
                let _ = tx.send(p);
            });
            if let (Some((dir, key)), Ok(c)) = (&cache, &compiled) {
                keep_compile(dir, key, c, clock_stops);
            }
            compiled
        })
        .map_err(|e| CompileError::new_err(format!("cannot start the compile thread: {e}")))?;
    // Wait with the GIL released; take it back briefly to report progress and to see Ctrl-C.
    let rx = std::sync::Mutex::new(rx);
    let mut interrupted: Option<PyErr> = None;
    loop {
        let got = py.detach(|| match rx.lock() {
            Ok(rx) => rx.recv_timeout(Duration::from_millis(50)),
            Err(_) => Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
        });
        match got {
            Ok(p) => {
                if interrupted.is_none()
                    && let Some(cb) = &progress
                    && let Err(e) = cb.call1(
                        py,
                        (
                            p.collective.name(),
                            p.done,
                            p.total,
                            p.collectives_done,
                            p.collectives_total,
                        ),
                    )
                {
                    cancel.store(true, Ordering::Relaxed);
                    interrupted = Some(e);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if interrupted.is_none()
            && let Err(e) = py.check_signals()
        {
            cancel.store(true, Ordering::Relaxed);
            interrupted = Some(e);
        }
    }
    let result = py.detach(|| worker.join());
    if let Some(e) = interrupted {
        return Err(e);
    }
    let compiled = result
        .map_err(|_| {
            CompileError::new_err("the compile thread panicked (a bug: please report it)")
        })?
        .map_err(search_err)?;
    if compiled.plan.entries.is_empty()
        && let Some(first) = compiled.skipped.first()
    {
        return Err(search_err(first.clone()));
    }
    let skipped = compiled.skipped.iter().map(ToString::to_string).collect();
    let rows = rows_json(&compiled.rows);
    let table = table_text("(compiled in Python)", &topo.inner, &compiled.rows);
    Ok((PyPlan::wrap(compiled.plan), rows, table, skipped))
}

/// The external candidates of a compile, each entry checked (its rank count, the verifier),
/// and what names them for the plan cache: their plans' text.
fn compile_candidates(
    t: &RsTopology,
    candidates: &[PyRef<'_, PyPlan>],
) -> PyResult<(Vec<Candidate>, Vec<u8>)> {
    let mut extra = Vec::new();
    let mut identity = Vec::new();
    for plan in candidates {
        for (i, entry) in plan.inner.entries.iter().enumerate() {
            if entry.schedule.nranks != t.nranks() {
                return Err(CompileError::new_err(format!(
                    "candidate {} entry {i} is for {} ranks but {} has {}",
                    entry.algorithm,
                    entry.schedule.nranks,
                    t.name,
                    t.nranks()
                )));
            }
            if let Err(errors) = verify_entry(entry) {
                return Err(VerifyError::new_err(format!(
                    "candidate {} entry {i} does not verify: {}",
                    entry.algorithm, errors[0]
                )));
            }
            extra.push(Candidate::imported(entry.clone()));
        }
        let text = plan.inner.to_ron();
        identity.extend_from_slice(&(text.len() as u64).to_le_bytes());
        identity.extend_from_slice(text.as_bytes());
    }
    Ok((extra, identity))
}

/// The plan and rows the plan cache holds under `key` in `dir`, if a whole entry is there.
fn cached_compile(dir: &std::path::Path, key: &str) -> Option<(PlanFile, Vec<search::Row>)> {
    let hit = search::plan_cache::load(dir, key)?;
    let plan = PlanFile::from_ron(&hit.plan_text, "the plan cache").ok()?;
    Some((plan, hit.rows))
}

/// Stores a compile in the plan cache when it is whole and did not depend on the clock
/// (no solve stopped at a time limit since `clock_stops` was read), as `hcclc compile` does.
fn keep_compile(dir: &std::path::Path, key: &str, c: &search::CompiledPlan, clock_stops: u64) {
    if !c.skipped.is_empty() || hccl_compiler::clock::clock_stops() != clock_stops {
        return;
    }
    // A cache that cannot be written costs the next compile its search.
    let _ = search::plan_cache::store(dir, key, &c.plan.to_ron(), &c.rows, &c.report);
}

/// A measured or predicted trace file as an SVG picture (`hcclc trace show`).
#[pyfunction]
fn trace_svg(py: Python<'_>, path: PathBuf, title: &str) -> PyResult<String> {
    py.detach(|| {
        let doc = hccl_ir::trace::TraceFile::load(&path).map_err(plan_err)?;
        doc.check().map_err(|e| {
            PlanError::new_err(format!("{}: not a valid trace: {e}", path.display()))
        })?;
        hccl_compiler::plot::timeline_svg(&doc, title)
            .map(|(svg, _)| svg)
            .map_err(|e| PlanError::new_err(e.to_string()))
    })
}

/// Parses `4K`, `16M`, `1G` or a plain number of bytes (powers of 1024).
#[pyfunction]
fn parse_bytes(text: &str) -> PyResult<u64> {
    hccl_ir::units::parse_bytes(text).ok_or_else(|| {
        CompileError::new_err(format!(
            "bad size {text:?} (expected e.g. 4096, 64K, 1M, 2G)"
        ))
    })
}

/// `min, 2·min, …` up to and including `max`.
#[pyfunction]
fn geometric_sizes(min: u64, max: u64) -> PyResult<Vec<u64>> {
    if min == 0 || min > max {
        return Err(CompileError::new_err(format!(
            "bad size range {min}..{max}: need 0 < MIN <= MAX"
        )));
    }
    Ok(search::geometric_sizes(min, max, 2))
}

#[pymodule]
fn _hccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("TopologyError", py.get_type::<TopologyError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("VerifyError", py.get_type::<VerifyError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("AlgorithmError", py.get_type::<AlgorithmError>())?;
    m.add_class::<PyTopology>()?;
    m.add_class::<PyPlan>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(trace_svg, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(geometric_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(array::array_info, m)?)?;
    lang::register(m)?;
    comm::register(m)?;
    Ok(())
}
