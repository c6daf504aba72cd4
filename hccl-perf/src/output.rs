//! What rank 0 prints: the header, a row per size (text or JSON) with the prediction of the
//! plan's cost model, the summary at the end, and the `--plot` chart.

use crate::args::{Args, Failure};
use crate::sweep::Row;
use hccl::executor::{DataType, ReduceOp, StragglerReport};
use hccl::ir::{Collective, PlanFile};
use hccl::topologies::Topology;
use std::path::{Path, PathBuf};

/// Prints rows as they come (text) and collects them for JSON.
pub(crate) struct Printer {
    pub(crate) json: bool,
    /// Simulates entries at the exact size when the topology is known; otherwise the
    /// prediction is the entry's fitted cost.
    pub(crate) predictor: Option<Predictor>,
    pub(crate) plan_file: Option<PathBuf>,
    pub(crate) plan: PlanFile,
    pub(crate) sw_coll: Collective,
    /// What the header and the JSON call the collective (`alltoallv` for an AllToAllv).
    pub(crate) name: String,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    pub(crate) n: u32,
    pub(crate) in_place: bool,
    pub(crate) rows: Vec<serde_json::Value>,
    /// Where `--plot` draws the sweep.
    pub(crate) plot: Option<PathBuf>,
    /// Per row: size, measured busbw and predicted busbw (GB/s), and the algorithm that
    /// ran, for `--plot`.
    pub(crate) points: Vec<(u64, f64, Option<f64>, String)>,
    /// Which calibration the predictions use (a line, and the JSON); `None` without a
    /// topology (a `--plan` of the user's: the predictions are its entries' fitted costs).
    pub(crate) calibration: Option<(String, serde_json::Value)>,
}

/// Which calibration the predictions for `topo` use, and where the topology came from.
pub(crate) fn calibration_of(
    args: &Args,
    topo: Option<&Topology>,
) -> Option<(String, serde_json::Value)> {
    let topo = topo?;
    let from = match &args.topo {
        Some(path) => path.display().to_string(),
        None => "this machine as a `host` topology, bandwidth by a copy probe".to_string(),
    };
    Some((
        hccl::compiler::report::calibration_line(topo, &from),
        hccl::compiler::report::calibration_json(topo, &from),
    ))
}

/// The cost model of the topology a plan was compiled for, simulating entries at the exact
/// size measured (an entry's fitted cost is a straight line over its whole size range).
pub(crate) struct Predictor {
    sim: hccl::compiler::cost::Simulator,
    prepared: std::collections::HashMap<usize, Option<hccl::compiler::cost::Prepared>>,
}

impl Predictor {
    pub(crate) fn new(topo: &Topology) -> Predictor {
        Predictor {
            sim: hccl::compiler::cost::Simulator::new(
                hccl::compiler::cost::Network::new(topo),
                hccl::compiler::cost::CostModel::for_topology(topo),
            ),
            prepared: Default::default(),
        }
    }

    fn predict(&mut self, index: usize, entry: &hccl::ir::PlanEntry, bytes: u64) -> Option<f64> {
        let sim = &self.sim;
        let prepared = self
            .prepared
            .entry(index)
            .or_insert_with(|| sim.prepare(&entry.schedule).ok())
            .as_ref()?;
        sim.run(prepared, bytes, entry.protocol)
            .ok()
            .map(|e| e.time_us)
    }
}

impl Printer {
    pub(crate) fn header(&self, label: &str) {
        if self.json {
            return;
        }
        println!(
            "# hccl-perf: {} {} ranks, {} {}, {}, plan: {label}",
            self.name,
            self.n,
            self.dtype.name(),
            if self.sw_coll.kind().reduces() {
                self.op.name()
            } else {
                "none"
            },
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            }
        );
        if let Some((line, _)) = &self.calibration {
            println!("# {line}");
        }
        println!(
            "# {:>12} {:>12} {:>8} {:>6} {:>5} {:>9} {:>11} {:>8} {:>8} {:>7} {:>11}  algorithm",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "iters",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong",
            "pred(us)"
        );
    }

    pub(crate) fn row(&mut self, row: &Row) {
        let s = &row.shape;
        let algbw = s.bytes as f64 / (row.time_us * 1e-6) / 1e9;
        let busbw = algbw * self.sw_coll.kind().busbw_factor(self.n);
        // What the communicator ran (it applies HCCL_ALGO / HCCL_PROTO), not a lookup of
        // our own, so the column and the environment always agree.
        let predicted = row.entry.as_ref().and_then(|e| {
            let entry = self.plan.entries.get(e.index)?;
            self.predictor
                .as_mut()
                .and_then(|p| p.predict(e.index, entry, s.bytes))
                .or_else(|| entry.cost.map(|c| c.predict_us(s.bytes)))
        });
        let factor = self.sw_coll.kind().busbw_factor(self.n);
        let algorithm = row.entry.as_ref().map_or("-".to_string(), |e| {
            format!("{}/{}", e.algorithm, e.protocol)
        });
        self.points.push((
            s.bytes,
            busbw,
            predicted
                .filter(|p| *p > 0.0)
                .map(|p| s.bytes as f64 / (p * 1e3) * factor),
            algorithm.clone(),
        ));
        let redop = if self.sw_coll.kind().reduces() {
            self.op.name()
        } else {
            "none"
        };
        let root = self.sw_coll.root().map_or(-1, i64::from);
        if self.json {
            self.rows.push(serde_json::json!({
                "bytes": s.bytes,
                "count": s.count,
                "dtype": self.dtype.name(),
                "op": redop,
                "root": root,
                "iters": row.iters,
                "time_us": row.time_us,
                "time_max_us": row.time_max_us,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "wrong": row.wrong,
                "predicted_us": predicted,
                "algorithm": algorithm,
                "entry": row.entry.as_ref().map(|e| e.index),
            }));
            return;
        }
        let wrong = row.wrong.map_or("N/A".to_string(), |w| w.to_string());
        let pred = predicted.map_or("-".to_string(), |p| format!("{p:.2}"));
        println!(
            "  {:>12} {:>12} {:>8} {:>6} {:>5} {:>9} {:>11.2} {:>8.3} {:>8.3} {:>7} {:>11}  {algorithm}",
            s.bytes,
            s.count,
            self.dtype.name(),
            redop,
            root,
            row.iters,
            row.time_us,
            algbw,
            busbw,
            wrong,
            pred
        );
    }
}

/// `--plot`: measured bus bandwidth against the prediction, one panel.
fn write_plot(path: &Path, printer: &Printer, label: &str) -> Result<(), Failure> {
    use hccl::compiler::plot::{Line, Panel, Series, busbw_chart};
    let measured: Vec<(u64, f64)> = printer.points.iter().map(|p| (p.0, p.1)).collect();
    let predicted: Vec<(u64, f64)> = printer
        .points
        .iter()
        .filter_map(|p| p.2.map(|q| (p.0, q)))
        .collect();
    // What ran, written where it changes.
    let notes = printer
        .points
        .iter()
        .enumerate()
        .filter(|(k, p)| *k == 0 || printer.points[k - 1].3 != p.3)
        .map(|(_, p)| (p.0, p.3.clone()))
        .collect();
    let mut series = vec![Series {
        name: "measured".into(),
        line: Line::Solid,
        points: measured,
        notes,
    }];
    if !predicted.is_empty() {
        series.push(Series {
            name: "predicted (the plan's cost model)".into(),
            line: Line::Dashed,
            points: predicted,
            notes: Vec::new(),
        });
    }
    let reduces = printer.sw_coll.kind().reduces();
    let panel = Panel {
        title: format!(
            "{}, {} ranks, {}{}, {}",
            printer.name,
            printer.n,
            printer.dtype.name(),
            if reduces {
                format!(" {}", printer.op.name())
            } else {
                String::new()
            },
            if printer.in_place {
                "in place"
            } else {
                "out of place"
            }
        ),
        series,
    };
    let title = format!("hccl-perf: measured bus bandwidth (plan: {label})");
    let svg =
        busbw_chart(&title, &[panel]).map_err(|e| Failure::Runtime(format!("--plot: {e}")))?;
    hccl::ir::write_atomic(path, svg.as_bytes())
        .map_err(|e| Failure::Usage(format!("--plot {}: cannot write: {e}", path.display())))
}

/// `report`: the run's straggler report (`None` when the ranks could not make one: a rank
/// failed).
pub(crate) fn finish(
    printer: Printer,
    label: &str,
    rows: &[Row],
    report: Option<&StragglerReport>,
) -> Result<(), Failure> {
    if let Some(path) = &printer.plot {
        write_plot(path, &printer, label)?;
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    if printer.json {
        let doc = serde_json::json!({
            "collective": printer.name,
            "root": printer.sw_coll.root(),
            "ranks": printer.n,
            "plan": label,
            // The plan file the rows' `entry` indices refer to (after deriving the measured
            // root), so `hcclc calibrate` can simulate what ran; null for a plan compiled
            // here.
            "plan_file": printer.plan_file.as_ref().map(|p| p.display().to_string()),
            // Which calibration the rows' predictions use (null: no topology known).
            "calibration": printer.calibration.as_ref().map(|c| c.1.clone()),
            "rows": printer.rows,
            // Who the ranks waited for over the whole run (warm-up and synchronisation
            // included): `Communicator::straggler_report`.
            "stragglers": report.and_then(|r| serde_json::to_value(r).ok()),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else if printer.rows.is_empty() {
        let checked = rows.iter().any(|r| r.wrong.is_some());
        if checked {
            println!(
                "# Out of bounds values : {wrong} {}",
                if wrong == 0 { "OK" } else { "FAILED" }
            );
        }
        let avg = rows
            .iter()
            .map(|r| {
                r.shape.bytes as f64 / (r.time_us * 1e-6) / 1e9
                    * printer.sw_coll.kind().busbw_factor(printer.n)
            })
            .sum::<f64>()
            / rows.len().max(1) as f64;
        println!("# Avg bus bandwidth    : {avg:.3}");
        if let Some(top) = report.and_then(StragglerReport::dominant) {
            println!("# Straggler            : {top}");
        }
    }
    if wrong > 0 {
        return Err(Failure::Runtime(format!("{wrong} wrong element(s)")));
    }
    Ok(())
}
