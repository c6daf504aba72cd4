//! Topology descriptions: the RON format people write, its validation, the `petgraph`
//! machine graph, shipped machines and generators for parametric families.

pub mod model;

pub use model::{
    DeviceKind, DeviceSpec, Edge, HostSpec, LinkKind, LinkSpec, NicSpec, Node, SwitchKind,
    SwitchSpec, Topology, TopologySpec,
};
