//! Bus bandwidth against message size: one panel per collective, each a few series, both
//! axes log-scaled (sizes by powers of two, labelled `1K`, `4M`, ...). Font sizes are as
//! asked of plotters, whose SVG backend writes text at 0.8 of them.

use super::PlotError;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// A solid line with a marker at every point (what was chosen or measured).
    Solid,
    /// A dashed line (a comparison: NCCL's choice, a prediction).
    Dashed,
    /// A thin dotted line (a bound).
    Dotted,
}

/// One curve: `(bytes, busbw GB/s)` points; points that are not positive are skipped (a
/// log axis cannot show them).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub line: Line,
    pub points: Vec<(u64, f64)>,
    /// Notes written below the series at some of its sizes (`(bytes, text)`), e.g. the
    /// algorithm where it changes.
    pub notes: Vec<(u64, String)>,
}

/// One chart: a title (the collective) and its series, drawn in order with the colours
/// blue, orange, grey, green, red, purple.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(230, 120, 10),
    RGBColor(100, 100, 100),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

const PANEL_W: u32 = 640;
const PANEL_H: u32 = 460;
const TITLE_H: u32 = 50;

/// `2^x` bytes as `1K`, `16M`, ... when `x` is a whole number, else empty (no tick label).
fn size_label(x: f64) -> String {
    if (x - x.round()).abs() > 1e-6 || !(0.0..63.0).contains(&x) {
        return String::new();
    }
    hccl_ir::units::format_bytes(1u64 << (x.round() as u32))
}

/// A bandwidth tick: `0.01`, `0.5`, `20`, `400`.
fn gbps_label(y: f64) -> String {
    if y >= 10.0 {
        format!("{y:.0}")
    } else {
        let s = format!("{y:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The positive points of a series, as `(log2 bytes, GB/s)`.
fn plotted(s: &Series) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .filter(|(b, y)| *b > 0 && y.is_finite() && *y > 0.0)
        .map(|&(b, y)| ((b as f64).log2(), y))
        .collect()
}

/// The SVG text of the panels under a common `title`, two per row (one when alone).
pub fn busbw_chart(title: &str, panels: &[Panel]) -> Result<String, PlotError> {
    if panels.is_empty() {
        return Err(PlotError::Empty("no collective".into()));
    }
    for p in panels {
        if p.series.iter().all(|s| plotted(s).is_empty()) {
            return Err(PlotError::Empty(format!(
                "{}: no positive bandwidth",
                p.title
            )));
        }
    }
    let cols = if panels.len() == 1 { 1 } else { 2 };
    let rows = panels.len().div_ceil(cols);
    // Wide enough for the title (26 asked, about 12 pixels a character).
    let title_w = title.chars().count() as u32 * 12 + 40;
    let size = (
        (PANEL_W * cols as u32).max(title_w),
        TITLE_H + PANEL_H * rows as u32,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (head, body) = root.split_vertically(TITLE_H);
        head.draw(&Text::new(
            title.to_string(),
            (20, 15),
            ("sans-serif", 26).into_font().color(&BLACK),
        ))?;
        let areas = body.split_evenly((rows, cols));
        for (area, panel) in areas.iter().zip(panels) {
            draw_panel(area, panel)?;
        }
        root.present()?;
    }
    Ok(svg)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let curves: Vec<(&Series, Vec<(f64, f64)>)> =
        panel.series.iter().map(|s| (s, plotted(s))).collect();
    let all = curves.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    // A little room left of the first size (its note) and right of the last.
    let pad = if x1 - x0 < 1.0 { 0.5 } else { 0.3 };
    x0 -= pad;
    x1 += pad;
    // Room above the highest curve for the notes; below the lowest, down to a power of ten
    // when one is near (a log axis labels powers of ten only).
    let decade = 10f64.powf((y0 / 1.2).log10().floor());
    let y0 = if y0 / 1.2 / decade < 3.0 {
        decade * 0.999
    } else {
        y0 / 1.5
    };
    let y1 = y1 * 8.0;
    let ticks = ((x1 - x0).round() as usize + 1).clamp(2, 14);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 22))
        .margin(14)
        .margin_right(34)
        .x_label_area_size(52)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log scale)")
        .y_desc("bus bandwidth (GB/s, log scale)")
        .x_labels(ticks)
        .x_label_formatter(&|x| size_label(*x))
        .y_label_formatter(&|y| gbps_label(*y))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .x_max_light_lines(1)
        .y_max_light_lines(1)
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;
    for (i, (series, points)) in curves.into_iter().enumerate() {
        if points.is_empty() {
            continue;
        }
        let colour = COLOURS[i % COLOURS.len()];
        let style = match series.line {
            Line::Solid => colour.stroke_width(3),
            Line::Dashed => colour.stroke_width(2),
            Line::Dotted => colour.stroke_width(2),
        };
        let line = series.line;
        let drawn = match series.line {
            Line::Solid => chart.draw_series(LineSeries::new(points.clone(), style))?,
            Line::Dashed => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 9, 5, style))?
            }
            Line::Dotted => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 3, 4, style))?
            }
        };
        drawn.label(series.name.clone()).legend(move |(x, y)| {
            // 24 pixels of the line, dashed as it is.
            let (dash, gap) = match line {
                Line::Solid => (24, 0),
                Line::Dashed => (8, 4),
                Line::Dotted => (3, 4),
            };
            DashedPathElement::new(vec![(x, y), (x + 24, y)], dash, gap, style)
        });
        if series.line == Line::Solid {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
        }
        // Notes above their points, reading upwards so that neighbours do not collide (the
        // curves rise to the right: the space above them is free; the legend is below).
        let note_style = TextStyle::from(("sans-serif", 14).into_font())
            .color(&colour)
            .transform(FontTransform::Rotate270);
        let at = |bytes: u64| {
            let x = (bytes as f64).log2();
            points.iter().find(|p| (p.0 - x).abs() < 1e-9).copied()
        };
        chart.draw_series(series.notes.iter().filter_map(|(bytes, text)| {
            let p = at(*bytes)?;
            Some(EmptyElement::at(p) + Text::new(text.clone(), (-7, -10), note_style.clone()))
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .draw()?;
    Ok(())
}
