//! SVG pictures drawn with `plotters` (its SVG backend only: no fonts or system libraries;
//! text sizes are estimated from the font size).
//!
//! - [`chart`]: bus bandwidth against message size, one panel per collective, log-scaled
//!   axes (`hcclc explain --plot`, `hccl-perf --plot`, which reuses it: `hccl-perf` already
//!   depends on the compiler for its plans and predictions, and both charts then look alike).
//! - [`topo`]: a machine: devices grouped by host, links by kind and bandwidth
//!   (`hcclc topo show --svg`).
//! - [`timeline`]: a trace file's steps, a row per stream of each rank (`hcclc trace show
//!   --svg`).

pub mod chart;
pub mod timeline;
pub mod topo;

pub use chart::{Line, Panel, Series, busbw_chart};
pub use timeline::{TimelineSummary, timeline_svg};
pub use topo::topology_svg;

/// A drawing that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Nothing to draw (no panel, or no positive point in a panel).
    #[error("nothing to plot: {0}")]
    Empty(String),
    /// The drawing backend failed.
    #[error("drawing failed: {0}")]
    Draw(String),
}

impl<E: std::error::Error + Send + Sync> From<plotters::drawing::DrawingAreaErrorKind<E>>
    for PlotError
{
    fn from(e: plotters::drawing::DrawingAreaErrorKind<E>) -> PlotError {
        PlotError::Draw(e.to_string())
    }
}
