//! Fitting the cost model to measurements of one machine ([`fit`]).
//!
//! Input: schedules that ran, and for each a measured time at some sizes (from `hccl-perf`,
//! on any backend: CPU threads or processes, GPUs, a network). Output: a [`Calibration`] for
//! the topology they ran on, and per observation the prediction before and after.
//!
//! The fit keeps the model's structure (the simulator, its routes and contention, the
//! protocols' relative costs) and corrects three kinds of constant:
//!
//! - `base_scale`: the once-per-collective latency. It enters every prediction additively,
//!   so it is fitted on cached simulations;
//! - `message_scale[class]`: the per-message latency of each link class the schedules use
//!   (classes no schedule uses stay at 1);
//! - the bandwidth curve: one factor per measured size (a knot), since a collective whose data
//!   fits in caches moves faster than one in DRAM and no single factor fits both.
//!
//! The objective is the sum of squared log errors `ln(predicted / measured)²` (a 2× over- and
//! under-estimate weigh the same), plus a small pull of every log-parameter towards 0 so
//! that a parameter the data cannot see (a bandwidth factor at 8 bytes) stays at 1. It is
//! minimised by Levenberg–Marquardt over the log-parameters, with a finite-difference
//! Jacobian (a bandwidth knot only moves the observations at its size, so its column costs
//! a few simulations).

use super::CostError;
use super::model::{CostModel, LinkClass};
use super::network::Network;
use super::prepared::Prepared;
use super::sim::Simulator;
use hccl_ir::{Protocol, Schedule};
use hccl_topologies::{Calibration, Topology};

/// One measurement: schedule `schedule` (an index into the schedules given to [`fit`]) took
/// `measured_us` for a collective of `bytes` under `protocol`.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub schedule: usize,
    pub protocol: Protocol,
    pub bytes: u64,
    pub measured_us: f64,
    /// What to call it in reports (the algorithm, the run it came from).
    pub label: String,
}

/// Measurements being gathered for [`fit`]: each distinct schedule stored once, under a key
/// the caller chooses (a plan file and entry, a family and entry).
#[derive(Debug, Default)]
pub struct Measurements<K> {
    pub schedules: Vec<Schedule>,
    pub observations: Vec<Observation>,
    index: std::collections::HashMap<K, usize>,
}

impl<K: std::hash::Hash + Eq> Measurements<K> {
    pub fn new() -> Measurements<K> {
        Measurements {
            schedules: Vec::new(),
            observations: Vec::new(),
            index: std::collections::HashMap::new(),
        }
    }

    /// Records that `entry` (known as `key`) took `measured_us` at `bytes`.
    pub fn add(
        &mut self,
        key: K,
        entry: &hccl_ir::PlanEntry,
        bytes: u64,
        measured_us: f64,
        label: String,
    ) {
        let schedules = &mut self.schedules;
        let schedule = *self.index.entry(key).or_insert_with(|| {
            schedules.push(entry.schedule.clone());
            schedules.len() - 1
        });
        self.observations.push(Observation {
            schedule,
            protocol: entry.protocol,
            bytes,
            measured_us,
            label,
        });
    }
}

/// One observation's predictions.
#[derive(Debug, Clone, PartialEq)]
pub struct FitRow {
    pub label: String,
    pub bytes: u64,
    pub measured_us: f64,
    /// Predicted by the uncalibrated model.
    pub before_us: f64,
    /// Predicted by the fitted model.
    pub after_us: f64,
}

impl FitRow {
    /// Relative error of the fitted prediction: `(predicted − measured) / measured`.
    pub fn error(&self) -> f64 {
        self.after_us / self.measured_us - 1.0
    }

    /// Relative error of the uncalibrated prediction.
    pub fn error_before(&self) -> f64 {
        self.before_us / self.measured_us - 1.0
    }
}

/// What [`fit`] found.
#[derive(Debug, Clone)]
pub struct FitReport {
    pub calibration: Calibration,
    pub rows: Vec<FitRow>,
}

impl FitReport {
    /// Median of `|error|` over the rows, after (or before) the fit.
    pub fn median_abs_error(&self, after: bool) -> f64 {
        let mut e: Vec<f64> = self
            .rows
            .iter()
            .map(|r| {
                if after {
                    r.error().abs()
                } else {
                    r.error_before().abs()
                }
            })
            .collect();
        e.sort_by(f64::total_cmp);
        e.get(e.len() / 2).copied().unwrap_or(0.0)
    }

    /// The rows as a table: label, size, measured, predicted before and after, errors.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<28} {:>12} {:>13} {:>12} {:>8} {:>12} {:>8}\n",
            "algorithm", "bytes", "measured_us", "before_us", "error", "after_us", "error"
        );
        for r in &self.rows {
            out += &format!(
                "{:<28} {:>12} {:>13.2} {:>12.2} {:>7.0}% {:>12.2} {:>7.0}%\n",
                r.label,
                r.bytes,
                r.measured_us,
                r.before_us,
                r.error_before() * 100.0,
                r.after_us,
                r.error() * 100.0
            );
        }
        out
    }

    /// The report as JSON: the calibration, the error summary and every row.
    pub fn to_json(&self) -> serde_json::Value {
        let cal = &self.calibration;
        serde_json::json!({
            "calibration": {
                "source": cal.source,
                "base_scale": cal.base_scale,
                "message_scale": cal.message_scale,
                "step_scale": cal.step_scale,
                "send_scale": cal.send_scale,
                "recv_scale": cal.recv_scale,
                "local_scale": cal.local_scale,
                "cores": cal.cores,
                "bandwidth": cal.bandwidth,
            },
            "median_abs_error_before": self.median_abs_error(false),
            "median_abs_error": self.median_abs_error(true),
            "within_25pct": self.within(0.25),
            "rows": self.rows.iter().map(|r| serde_json::json!({
                "algorithm": r.label,
                "bytes": r.bytes,
                "measured_us": r.measured_us,
                "predicted_before_us": r.before_us,
                "predicted_us": r.after_us,
                "error": r.error(),
            })).collect::<Vec<_>>(),
        })
    }

    /// Fraction of rows whose fitted prediction is within `tolerance` (0.25 = ±25%).
    pub fn within(&self, tolerance: f64) -> f64 {
        if self.rows.is_empty() {
            return 1.0;
        }
        let n = self
            .rows
            .iter()
            .filter(|r| r.error().abs() <= tolerance)
            .count();
        n as f64 / self.rows.len() as f64
    }
}

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrateError {
    #[error("no measurements to fit")]
    Empty,
    #[error(
        "measurement {index} ({label}, {bytes} B): time must be a finite number > 0, found {value}"
    )]
    BadTime {
        index: usize,
        label: String,
        bytes: u64,
        value: f64,
    },
    #[error(
        "measurement {index} ({label}): it names schedule {schedule}, but only {count} were given"
    )]
    NoSchedule {
        index: usize,
        label: String,
        schedule: usize,
        count: usize,
    },
    #[error("schedule {index}: {source}")]
    Cost {
        index: usize,
        #[source]
        source: CostError,
    },
}

/// Pull of each log-parameter towards 0 (factor 1) in the objective.
const PRIOR: f64 = 1e-3;
/// Search range of every factor: `[1/RANGE, RANGE]`.
const RANGE: f64 = 64.0;
/// Most Levenberg–Marquardt iterations.
const ITERATIONS: usize = 60;

/// Fits a calibration of `topo` to `observations` of `schedules`; `source` says where the
/// measurements come from and is kept in the calibration, as are the cores of `topo`'s own
/// calibration, if any (a fact of the machine, not fitted).
pub fn fit(
    topo: &Topology,
    schedules: &[Schedule],
    observations: &[Observation],
    source: &str,
) -> Result<FitReport, CalibrateError> {
    if observations.is_empty() {
        return Err(CalibrateError::Empty);
    }
    for (index, o) in observations.iter().enumerate() {
        if !(o.measured_us.is_finite() && o.measured_us > 0.0) {
            return Err(CalibrateError::BadTime {
                index,
                label: o.label.clone(),
                bytes: o.bytes,
                value: o.measured_us,
            });
        }
        if o.schedule >= schedules.len() {
            return Err(CalibrateError::NoSchedule {
                index,
                label: o.label.clone(),
                schedule: o.schedule,
                count: schedules.len(),
            });
        }
    }
    let base_model = CostModel::uncalibrated_for(topo);
    let mut sim = Simulator::new(Network::new(topo), base_model.clone());
    let prepared: Vec<Prepared> = schedules
        .iter()
        .enumerate()
        .map(|(index, s)| {
            sim.prepare(s)
                .map_err(|source| CalibrateError::Cost { index, source })
        })
        .collect::<Result<_, _>>()?;
    let classes: Vec<LinkClass> = LinkClass::ALL
        .into_iter()
        .filter(|&c| {
            observations
                .iter()
                .any(|o| prepared[o.schedule].uses_class(c))
        })
        .collect();
    let mut knots: Vec<u64> = observations.iter().map(|o| o.bytes).collect();
    knots.sort_unstable();
    knots.dedup();

    let mut f = Fitter {
        sim: &mut sim,
        base_model: &base_model,
        prepared: &prepared,
        obs: observations,
        classes: &classes,
        cpu: base_model.cpu.is_some(),
        knots: &knots,
        template: Calibration {
            cores: topo.spec.calibration.as_ref().and_then(|c| c.cores),
            ..Calibration::identity(source)
        },
    };
    let before: Vec<f64> = f
        .parts(&f.template.clone(), &all_of(observations))?
        .iter()
        .map(|&(rest, base)| rest + base)
        .collect();
    // Two starts for a CPU host: the model's nominal figures, and the built-in fit of the
    // development VM. The parameters of the CPU model trade off against each other (a step's
    // fixed cost against the per-message latency, say), so the fit has more than one local
    // minimum; from the nominal start alone it sometimes settled in one that predicts half
    // the rows more than 25% off. The lower loss wins.
    let (loss, mut theta) = f.solve(vec![0.0; f.parameters()])?;
    if f.cpu {
        let cores = f.template.cores.unwrap_or(topo.nranks());
        let start = f.theta_of(&builtin_cpu_calibration(topo.nranks(), cores));
        let (other_loss, other) = f.solve(start)?;
        if other_loss < loss {
            theta = other;
        }
    }
    let mut cal = f.calibration(&theta);
    for v in cal
        .bandwidth
        .iter_mut()
        .map(|k| &mut k.1)
        .chain(cal.message_scale.iter_mut())
        .chain([
            &mut cal.base_scale,
            &mut cal.step_scale,
            &mut cal.send_scale,
            &mut cal.recv_scale,
            &mut cal.local_scale,
        ])
    {
        // Three significant digits: the measurements are not more precise, and the topology
        // file stays readable.
        *v = round_sig(*v, 3);
    }
    let after: Vec<f64> = f
        .parts(&cal, &all_of(observations))?
        .iter()
        .map(|&(rest, base)| rest + base)
        .collect();
    let rows = observations
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(o, (&b, &a))| FitRow {
            label: o.label.clone(),
            bytes: o.bytes,
            measured_us: o.measured_us,
            before_us: b,
            after_us: a,
        })
        .collect();
    Ok(FitReport {
        calibration: cal,
        rows,
    })
}

/// How the source of [`builtin_cpu_calibration`] begins: a calibration whose source begins
/// so is the development machine's, not the machine's own.
pub const BUILTIN_SOURCE: &str = "built-in:";

/// The calibration a CPU host gets when it has none of its own (`hccl-perf` without `--topo`,
/// `hcclc topo gen host` without `--calibration`): the fits `scripts/fidelity.sh` made on the
/// development VM (AMD EPYC, 2 cores, process backend, 2026-12-01) for 2 ranks (a core each),
/// 3 ranks and 4 ranks on 2 cores, chosen by how many ranks share a core, with `cores` set to
/// this machine's. Its bandwidth factors are relative to the topology's memory bandwidth (the
/// probe's), so the cache-against-DRAM shape carries over to similar machines; calibrate a
/// machine for numbers of its own.
pub fn builtin_cpu_calibration(ranks: u32, cores: u32) -> Calibration {
    let cores = cores.max(1);
    let (setting, mut cal) = if ranks <= cores {
        (
            "a core per rank",
            Calibration {
                base_scale: 0.0185,
                message_scale: [0.463, 1.0, 1.0],
                step_scale: 1.42,
                send_scale: 0.0156,
                recv_scale: 1.95,
                local_scale: 0.141,
                bandwidth: vec![
                    (8, 3.18),
                    (32, 7.18),
                    (128, 0.924),
                    (512, 1.4),
                    (2048, 2.41),
                    (8192, 3.18),
                    (32768, 3.48),
                    (131072, 3.54),
                    (524288, 3.75),
                    (2097152, 4.04),
                    (8388608, 2.18),
                    (33554432, 1.39),
                    (134217728, 1.36),
                    (268435456, 1.37),
                ],
                ..Calibration::identity("")
            },
        )
    } else if ranks < 2 * cores {
        (
            "up to two ranks per core",
            Calibration {
                base_scale: 0.121,
                message_scale: [13.4, 1.0, 1.0],
                step_scale: 5.83,
                send_scale: 0.624,
                recv_scale: 2.62,
                local_scale: 0.0156,
                bandwidth: vec![
                    (8, 1.7),
                    (32, 2.98),
                    (128, 9.43),
                    (512, 17.7),
                    (2048, 7.93),
                    (8192, 6.97),
                    (32768, 7.27),
                    (131072, 7.35),
                    (524288, 8.15),
                    (2097152, 7.87),
                    (8388608, 4.41),
                    (33554432, 4.01),
                    (134217728, 3.83),
                    (268435456, 3.94),
                ],
                ..Calibration::identity("")
            },
        )
    } else {
        (
            "two or more ranks per core",
            Calibration {
                base_scale: 0.229,
                message_scale: [19.2, 1.0, 1.0],
                step_scale: 5.18,
                send_scale: 0.14,
                recv_scale: 3.91,
                local_scale: 0.0156,
                bandwidth: vec![
                    (8, 2.28),
                    (32, 5.62),
                    (128, 7.28),
                    (512, 10.7),
                    (2048, 8.41),
                    (8192, 11.8),
                    (32768, 12.5),
                    (131072, 13.9),
                    (524288, 15.8),
                    (2097152, 10.4),
                    (8388608, 6.67),
                    (33554432, 6.5),
                    (134217728, 6.36),
                    (268435456, 6.41),
                ],
                ..Calibration::identity("")
            },
        )
    };
    cal.source = format!(
        "{BUILTIN_SOURCE} fitted on the development VM (AMD EPYC, 2 cores, process backend, \
         2026-12-01), {setting}"
    );
    cal.cores = Some(cores);
    cal
}

fn all_of(obs: &[Observation]) -> Vec<usize> {
    (0..obs.len()).collect()
}

/// The fit's state. Parameters `θ` are logs of the factors: `θ[0]` the base scale, then one
/// message scale per class in `classes`, then (CPU model) the step, send, receive and local scales, then one
/// bandwidth factor per knot.
struct Fitter<'a> {
    sim: &'a mut Simulator,
    base_model: &'a CostModel,
    prepared: &'a [Prepared],
    obs: &'a [Observation],
    classes: &'a [LinkClass],
    /// Whether the CPU model's step cost and send traffic are fitted too.
    cpu: bool,
    knots: &'a [u64],
    /// What the fit starts from and does not fit (the source, the cores).
    template: Calibration,
}

impl Fitter<'_> {
    fn calibration(&self, theta: &[f64]) -> Calibration {
        let mut cal = self.template.clone();
        cal.base_scale = theta[0].exp();
        for (j, c) in self.classes.iter().enumerate() {
            cal.message_scale[c.index()] = theta[1 + j].exp();
        }
        let mut off = 1 + self.classes.len();
        if self.cpu {
            cal.step_scale = theta[off].exp();
            cal.send_scale = theta[off + 1].exp();
            cal.recv_scale = theta[off + 2].exp();
            cal.local_scale = theta[off + 3].exp();
            off += 4;
        }
        cal.bandwidth = self
            .knots
            .iter()
            .enumerate()
            .map(|(j, &b)| (b, theta[off + j].exp()))
            .collect();
        cal
    }

    /// Simulated time without the base latency, and the base latency, of each observation
    /// in `which` under `cal`.
    fn parts(
        &mut self,
        cal: &Calibration,
        which: &[usize],
    ) -> Result<Vec<(f64, f64)>, CalibrateError> {
        self.sim.model = self.base_model.calibrated(cal);
        which
            .iter()
            .map(|&i| {
                let o = &self.obs[i];
                let est = self
                    .sim
                    .run(&self.prepared[o.schedule], o.bytes, o.protocol)
                    .map_err(|source| CalibrateError::Cost {
                        index: o.schedule,
                        source,
                    })?;
                Ok((est.time_us - est.base_us, est.base_us))
            })
            .collect()
    }

    /// Log predictions of every observation under `theta`.
    fn log_pred(&mut self, theta: &[f64], which: &[usize]) -> Result<Vec<f64>, CalibrateError> {
        let cal = self.calibration(theta);
        Ok(self
            .parts(&cal, which)?
            .iter()
            .map(|&(rest, base)| safe_ln(rest + base))
            .collect())
    }

    /// Residuals: log errors of the observations, then the prior's pull on each parameter.
    fn residuals(&self, log_pred: &[f64], theta: &[f64]) -> Vec<f64> {
        let mut r: Vec<f64> = log_pred
            .iter()
            .zip(self.obs)
            .map(|(&lp, o)| lp - o.measured_us.ln())
            .collect();
        r.extend(theta.iter().map(|t| PRIOR.sqrt() * t));
        r
    }

    /// How many parameters `θ` has.
    fn parameters(&self) -> usize {
        1 + self.classes.len() + if self.cpu { 4 } else { 0 } + self.knots.len()
    }

    /// `cal` as parameters (its bandwidth factor at each knot), clamped to the fit's range.
    fn theta_of(&self, cal: &Calibration) -> Vec<f64> {
        let mut factors = vec![cal.base_scale];
        factors.extend(self.classes.iter().map(|c| cal.message_scale[c.index()]));
        if self.cpu {
            factors.extend([
                cal.step_scale,
                cal.send_scale,
                cal.recv_scale,
                cal.local_scale,
            ]);
        }
        factors.extend(self.knots.iter().map(|&b| cal.bandwidth_factor(b)));
        let limit = RANGE.ln();
        factors
            .iter()
            .map(|v| safe_ln(*v).clamp(-limit, limit))
            .collect()
    }

    /// Levenberg–Marquardt on the residuals from `theta`, with a finite-difference Jacobian
    /// (the base scale's column is exact: it only adds `base × scale`). Returns the loss
    /// (the sum of squared residuals) and the parameters it ended at.
    fn solve(&mut self, mut theta: Vec<f64>) -> Result<(f64, Vec<f64>), CalibrateError> {
        let n = self.obs.len();
        let global = 1 + self.classes.len() + if self.cpu { 4 } else { 0 };
        let np = self.parameters();
        let all = all_of(self.obs);
        let at_knot: Vec<Vec<usize>> = self
            .knots
            .iter()
            .map(|&b| {
                all.iter()
                    .copied()
                    .filter(|&i| self.obs[i].bytes == b)
                    .collect()
            })
            .collect();
        let mut lp = self.log_pred(&theta, &all)?;
        let mut res = self.residuals(&lp, &theta);
        let mut loss: f64 = res.iter().map(|r| r * r).sum();
        let mut lambda = 1e-2;
        let h = 1e-3;
        let limit = RANGE.ln();
        for _ in 0..ITERATIONS {
            // Jacobian of the log predictions (rows: observations; the prior rows are
            // diagonal and added below).
            let mut jac = vec![vec![0.0; np]; n];
            let cal = self.calibration(&theta);
            let parts = self.parts(&cal, &all)?;
            for i in 0..n {
                let (rest, base) = parts[i];
                jac[i][0] = if rest + base > 0.0 {
                    base / (rest + base)
                } else {
                    0.0
                };
            }
            for j in 1..np {
                let which: &[usize] = if j < global {
                    &all
                } else {
                    &at_knot[j - global]
                };
                let mut t2 = theta.clone();
                t2[j] += h;
                let lp2 = self.log_pred(&t2, which)?;
                for (k, &i) in which.iter().enumerate() {
                    jac[i][j] = (lp2[k] - lp[i]) / h;
                }
            }
            // Normal equations with the prior rows: (JᵀJ + P + λ·diag) δ = −(Jᵀr + P θ).
            let mut a = vec![vec![0.0; np]; np];
            let mut g = vec![0.0; np];
            for i in 0..n {
                for p in 0..np {
                    if jac[i][p] == 0.0 {
                        continue;
                    }
                    g[p] += jac[i][p] * res[i];
                    for q in 0..np {
                        a[p][q] += jac[i][p] * jac[i][q];
                    }
                }
            }
            for p in 0..np {
                a[p][p] += PRIOR;
                g[p] += PRIOR.sqrt() * res[n + p];
            }
            let mut improved = false;
            for _ in 0..12 {
                let mut m = a.clone();
                for p in 0..np {
                    m[p][p] += lambda * a[p][p].max(1e-9);
                }
                let rhs: Vec<f64> = g.iter().map(|v| -v).collect();
                let Some(delta) = solve_dense(m, rhs) else {
                    lambda *= 10.0;
                    continue;
                };
                let t2: Vec<f64> = theta
                    .iter()
                    .zip(&delta)
                    .map(|(t, d)| (t + d).clamp(-limit, limit))
                    .collect();
                let lp2 = self.log_pred(&t2, &all)?;
                let res2 = self.residuals(&lp2, &t2);
                let loss2: f64 = res2.iter().map(|r| r * r).sum();
                if loss2 < loss {
                    let gain = loss - loss2;
                    theta = t2;
                    lp = lp2;
                    res = res2;
                    loss = loss2;
                    lambda = (lambda / 3.0).max(1e-9);
                    improved = gain > 1e-10 * loss.max(1e-12);
                    break;
                }
                lambda *= 4.0;
            }
            if !improved {
                break;
            }
        }
        Ok((loss, theta))
    }
}

fn safe_ln(v: f64) -> f64 {
    if v > 0.0 && v.is_finite() {
        v.ln()
    } else {
        30.0
    }
}

/// Solves `m x = rhs` by Gaussian elimination with partial pivoting; `None` when singular.
fn solve_dense(mut m: Vec<Vec<f64>>, mut rhs: Vec<f64>) -> Option<Vec<f64>> {
    let n = rhs.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[piv][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, piv);
        rhs.swap(col, piv);
        let (upper, lower) = m.split_at_mut(col + 1);
        let pivot_row = &upper[col];
        for (k, row) in lower.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            if f != 0.0 {
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
                rhs[col + 1 + k] -= f * rhs[col];
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| m[row][k] * x[k]).sum();
        x[row] = (rhs[row] - s) / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

fn round_sig(v: f64, digits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - 1 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// The spec of `ranks` CPU ranks on this machine (`hcclc topo gen host`, the Python
/// `Topology.host`): `mem_bw` GB/s per rank, else the calibration's, else a copy probe of
/// this machine; with `nic` = (GB/s, latency µs, default TCP's) a NIC, making it a box for
/// [`hccl_topologies::generate::cluster`]. `calibrated` (a calibration and the memory
/// bandwidth it was measured with) is kept; without one, a host without NIC gets the built-in
/// calibration (the development machine's fits for as many ranks per core), and a networked
/// host the uncalibrated model, since the built-in fits know nothing of its network.
pub fn host_spec(
    ranks: u32,
    mem_bw: Option<f64>,
    nic: Option<(f64, Option<f64>)>,
    calibrated: Option<(Calibration, f64)>,
) -> Result<hccl_topologies::TopologySpec, String> {
    use hccl_topologies::generate;
    let mem_bw = match (mem_bw, &calibrated) {
        (Some(bw), _) => bw,
        (None, Some((_, bw))) => *bw,
        (None, None) => hccl_topologies::probe::probe_host().per_rank_gbps(ranks),
    };
    if !(mem_bw.is_finite() && mem_bw > 0.0) {
        return Err(format!(
            "--mem-bw must be a finite number > 0, got {mem_bw}"
        ));
    }
    let mut spec = match nic {
        Some((nic_bw, latency)) => generate::host_with_nic(
            ranks,
            mem_bw,
            nic_bw,
            latency.unwrap_or(generate::TCP_NIC_LATENCY_US),
        ),
        None => generate::host(ranks, mem_bw),
    };
    spec.calibration = match calibrated {
        Some((cal, _)) => Some(cal),
        None if nic.is_none() => {
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get() as u32);
            Some(builtin_cpu_calibration(ranks, cores))
        }
        None => None,
    };
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::all_families;
    use hccl_ir::Collective;

    fn host(n: u32) -> Topology {
        hccl_topologies::build(hccl_topologies::generate::host(n, 10.0), "h").unwrap()
    }

    /// Schedules of every family that does AllReduce on `topo` (first candidate each).
    fn schedules(topo: &Topology) -> Vec<(String, Schedule)> {
        let mut out = Vec::new();
        for f in all_families() {
            for p in f
                .param_space(topo, Collective::AllReduce)
                .into_iter()
                .take(1)
            {
                if let Some(c) = f
                    .generate(topo, Collective::AllReduce, p)
                    .into_iter()
                    .next()
                {
                    out.push((f.name().to_string(), c.schedule));
                }
            }
        }
        out
    }

    /// Measurements made up by a known calibration are fitted back to it.
    #[test]
    fn recovers_a_known_calibration() {
        let topo = host(4);
        let scheds = schedules(&topo);
        assert!(
            scheds.len() >= 3,
            "families for 4 CPU ranks: {}",
            scheds.len()
        );
        let truth = Calibration {
            source: "truth".into(),
            base_scale: 3.0,
            message_scale: [5.0, 1.0, 1.0],
            step_scale: 4.0,
            send_scale: 0.5,
            recv_scale: 2.0,
            local_scale: 0.5,
            cores: None,
            bandwidth: vec![(8, 1.0), (4096, 2.0), (1 << 20, 1.5), (64 << 20, 0.5)],
        };
        let model = CostModel::uncalibrated_for(&topo).calibrated(&truth);
        let sim = Simulator::new(Network::new(&topo), model);
        let mut obs = Vec::new();
        let just: Vec<Schedule> = scheds.iter().map(|(_, s)| s.clone()).collect();
        for (i, (name, s)) in scheds.iter().enumerate() {
            for &(bytes, _) in &truth.bandwidth {
                let t = sim.simulate(s, bytes, Protocol::Simple).unwrap().time_us;
                obs.push(Observation {
                    schedule: i,
                    protocol: Protocol::Simple,
                    bytes,
                    measured_us: t,
                    label: name.clone(),
                });
            }
        }
        let report = fit(&topo, &just, &obs, "test").unwrap();
        let max_err = report
            .rows
            .iter()
            .map(|r| r.error().abs())
            .fold(0.0, f64::max);
        assert!(
            max_err < 0.02,
            "worst error after the fit: {max_err}: {:?}",
            report.calibration
        );
        assert!(
            report.median_abs_error(false) > 0.3,
            "the data must need a fit"
        );
        let cal = &report.calibration;
        assert!((cal.message_scale[0] / 5.0 - 1.0).abs() < 0.1, "{cal:?}");
        // The CPU weights and the bandwidth factors trade against each other (all weights
        // and all factors × c predict the same), so parameters are only pinned to about 10%.
        assert!(
            (cal.bandwidth_factor(64 << 20) / 0.5 - 1.0).abs() < 0.1,
            "{cal:?}"
        );
        assert_eq!(
            cal.message_scale[2], 1.0,
            "no network message: no network fit"
        );
    }

    #[test]
    fn bad_input_is_refused_with_the_measurement_named() {
        let topo = host(2);
        let scheds: Vec<Schedule> = schedules(&topo).into_iter().map(|(_, s)| s).collect();
        let o = |t: f64, s: usize| Observation {
            schedule: s,
            protocol: Protocol::Simple,
            bytes: 64,
            measured_us: t,
            label: "ring".into(),
        };
        assert_eq!(
            fit(&topo, &scheds, &[], "x").unwrap_err(),
            CalibrateError::Empty
        );
        let e = fit(&topo, &scheds, &[o(f64::NAN, 0)], "x").unwrap_err();
        assert!(e.to_string().contains("measurement 0 (ring, 64 B)"), "{e}");
        let e = fit(&topo, &scheds, &[o(1.0, 99)], "x").unwrap_err();
        assert!(matches!(e, CalibrateError::NoSchedule { .. }), "{e}");
    }

    #[test]
    fn bandwidth_curve_interpolates_in_log_space() {
        let cal = Calibration {
            bandwidth: vec![(1 << 10, 1.0), (1 << 20, 4.0)],
            ..Calibration::identity("t")
        };
        assert_eq!(cal.bandwidth_factor(8), 1.0);
        assert_eq!(cal.bandwidth_factor(1 << 30), 4.0);
        // Halfway in log size is halfway in log factor: 2.
        assert!((cal.bandwidth_factor(1 << 15) - 2.0).abs() < 1e-9);
        assert_eq!(Calibration::identity("t").bandwidth_factor(123), 1.0);
    }
}
