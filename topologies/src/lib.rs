//! Topology descriptions: the RON format people write, its validation, the `petgraph`
//! machine graph, shipped machines and generators for parametric families.
//!
//! Entry points: [`load`] / [`from_ron`] read a file, [`build`] validates a spec,
//! [`shipped_by_name`] returns a machine shipped with the crate, and [`generate`] builds specs for
//! parametric families (rings, tori, fat trees, clusters of boxes, CPU hosts).

pub mod analysis;
pub mod detect;
pub mod dot;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod generate;
pub mod model;
pub mod parse;
pub mod probe;
pub mod shipped;

pub use analysis::{
    Bisection, Summary, bandwidth_matrix, bisection, hop_diameter, hosts, injection_bw, max_flow,
    summarize,
};
pub use error::{Pos, Problem, TopologyError};
pub use model::{
    Calibration, DeviceKind, DeviceSpec, Edge, HostSpec, LinkKind, LinkSpec, NicSpec, Node,
    SwitchKind, SwitchSpec, Topology, TopologySpec,
};
pub use parse::{
    build, default_mem_bw, from_bytes, from_ron, load, parse_spec, to_ron, validate_ranks,
};
pub use shipped::{load_spec, shipped, shipped_by_name, shipped_or_err, shipped_text};
