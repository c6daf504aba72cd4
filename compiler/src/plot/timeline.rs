//! A timeline of a trace file (`hcclc trace show TRACE.json --svg FILE.svg`): one row per
//! stream of each rank, a bar per step slice from its start to its end, coloured by the
//! step's operation; time in µs along the bottom. Predicted traces (`hcclc explain
//! --trace`) and measured ones (`HCCL_TRACE`, merged) share one layout, so both draw alike.

use super::PlotError;
use hccl_ir::trace::TraceFile;
use plotters::prelude::*;
use std::collections::BTreeMap;

/// Rows drawn at most; the others are counted in the caption.
pub const MAX_ROWS: usize = 48;

const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(230, 120, 10),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One stream's step slices: start and end (µs) and the operation's index.
type Bars = Vec<(f64, f64, usize)>;

/// What [`timeline_svg`] drew.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineSummary {
    /// Rows drawn (rank and stream), of `rows_total`.
    pub rows: usize,
    pub rows_total: usize,
    /// Step slices drawn.
    pub slices: usize,
    /// Operations in the legend, in order of first appearance.
    pub ops: Vec<String>,
    /// The time axis, µs.
    pub span_us: (f64, f64),
}

/// The SVG text of `trace`'s step slices under `title`, and what it holds.
pub fn timeline_svg(
    trace: &TraceFile,
    title: &str,
) -> Result<(String, TimelineSummary), PlotError> {
    // Thread names, and the step slices of every (rank, stream).
    let mut names: BTreeMap<(u32, u32), String> = BTreeMap::new();
    let mut rows: BTreeMap<(u32, u32), Bars> = BTreeMap::new();
    let mut ops: Vec<String> = Vec::new();
    for e in &trace.events {
        match (e.ph.as_str(), e.tid) {
            ("M", Some(tid)) if e.name == "thread_name" => {
                if let Some(n) = e.args.get("name").and_then(|v| v.as_str()) {
                    names.insert((e.pid, tid), n.to_string());
                }
            }
            ("X", Some(tid)) if e.cat.as_deref() == Some("step") => {
                let (Some(ts), Some(dur)) = (e.ts, e.dur) else {
                    continue;
                };
                let op = match ops.iter().position(|o| *o == e.name) {
                    Some(i) => i,
                    None => {
                        ops.push(e.name.clone());
                        ops.len() - 1
                    }
                };
                rows.entry((e.pid, tid))
                    .or_default()
                    .push((ts, ts + dur, op));
            }
            _ => {}
        }
    }
    if rows.is_empty() {
        return Err(PlotError::Empty("the trace has no step slices".into()));
    }
    let rows_total = rows.len();
    let kept: Vec<((u32, u32), Bars)> = rows.into_iter().take(MAX_ROWS).collect();
    let n = kept.len();
    let (mut t0, mut t1) = (f64::MAX, f64::MIN);
    for (_, slices) in &kept {
        for &(a, b, _) in slices {
            t0 = t0.min(a);
            t1 = t1.max(b);
        }
    }
    if t1 <= t0 {
        t1 = t0 + 1.0;
    }
    let pad = (t1 - t0) * 0.01;
    let labels: Vec<String> = kept
        .iter()
        .map(|((pid, tid), _)| match names.get(&(*pid, *tid)) {
            Some(name) => format!("rank {pid} · {name}"),
            None => format!("rank {pid} · thread {tid}"),
        })
        .collect();
    let label_w = labels.iter().map(|l| l.chars().count()).max().unwrap_or(10) as u32 * 8 + 20;
    let size = (1200u32.max(label_w + 700), 150 + 26 * n as u32);
    let caption = if rows_total > n {
        format!("{title} (first {n} of {rows_total} streams)")
    } else {
        title.to_string()
    };
    let mut svg = String::new();
    let slices;
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        // Row i is drawn at y = n - 1 - i, so the first row is on top.
        let y = |i: usize| (n - 1 - i) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(&caption, ("sans-serif", 22))
            .margin(14)
            .margin_right(30)
            .x_label_area_size(48)
            .y_label_area_size(label_w)
            // Room on the right for the legend, clear of the bars.
            .build_cartesian_2d((t0 - pad)..(t1 + 40.0 * pad), -0.5..(n as f64 - 0.5))?;
        chart
            .configure_mesh()
            .x_desc("time (µs)")
            .y_labels(n + 1)
            .y_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() > 1e-6 || i < 0.0 || i >= n as f64 {
                    return String::new();
                }
                labels[n - 1 - i as usize].clone()
            })
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .disable_y_mesh()
            .x_max_light_lines(1)
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215))
            .draw()?;
        let mut drawn = 0;
        for (k, op) in ops.iter().enumerate() {
            let colour = COLOURS[k % COLOURS.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = kept
                .iter()
                .enumerate()
                .flat_map(|(i, (_, slices))| {
                    slices
                        .iter()
                        .filter(move |s| s.2 == k)
                        .map(move |&(a, b, _)| {
                            Rectangle::new(
                                [(a, y(i) - 0.35), (b.max(a + pad * 0.02), y(i) + 0.35)],
                                colour.mix(0.85).filled(),
                            )
                        })
                })
                .collect();
            drawn += bars.len();
            chart
                .draw_series(bars)?
                .label(op.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 18, y + 6)], colour.filled())
                });
        }
        slices = drawn;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(190, 190, 190))
            .label_font(("sans-serif", 14))
            .draw()?;
        root.present()?;
    }
    Ok((
        svg,
        TimelineSummary {
            rows: n,
            rows_total,
            slices,
            ops,
            span_us: (t0, t1),
        },
    ))
}
