//! Machines shipped with the crate (`topologies/machines/*.ron`), embedded at build time.

use crate::error::TopologyError;
use crate::model::Topology;

/// `(name, RON text)` of every shipped machine, in a stable order.
const SHIPPED: &[(&str, &str)] = &[
    ("dgx1-v100", include_str!("../machines/dgx1-v100.ron")),
    ("dgx-a100", include_str!("../machines/dgx-a100.ron")),
    ("dgx-h100", include_str!("../machines/dgx-h100.ron")),
    ("ascend910-8", include_str!("../machines/ascend910-8.ron")),
    (
        "azure-ndv2-2node",
        include_str!("../machines/azure-ndv2-2node.ron"),
    ),
    (
        "h100-cluster-2node",
        include_str!("../machines/h100-cluster-2node.ron"),
    ),
    (
        "h100-cluster-4node",
        include_str!("../machines/h100-cluster-4node.ron"),
    ),
];

/// Every shipped machine as `(name, RON text)`; the name is the file stem.
pub fn shipped() -> &'static [(&'static str, &'static str)] {
    SHIPPED
}

/// The RON text of the shipped machine `name`, if there is one.
pub fn shipped_text(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Builds the shipped machine `name` (`None` when no machine has that name). Shipped files are
/// tested to build, so a `Some` is always a valid topology.
pub fn shipped_by_name(name: &str) -> Option<Topology> {
    let text = shipped_text(name)?;
    crate::parse::from_ron(text, &format!("<shipped {name}>")).ok()
}

/// Like [`shipped_by_name`], with an error that lists the known names.
pub fn shipped_or_err(name: &str) -> Result<Topology, TopologyError> {
    match shipped_text(name) {
        Some(text) => crate::parse::from_ron(text, &format!("<shipped {name}>")),
        None => Err(TopologyError::UnknownShipped {
            name: name.to_string(),
            known: SHIPPED
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A topology named the way every front end takes one: the path of a RON file, or the name
/// of a shipped machine. A path that exists wins; a spec that is neither reads as a missing
/// file when it looks like a path (has a `/` or ends in `.ron`), else as an unknown shipped
/// name (whose error lists the shipped ones).
pub fn load_spec(spec: &str) -> Result<Topology, TopologyError> {
    let path = std::path::Path::new(spec);
    if path.exists() {
        return crate::parse::load(path);
    }
    if shipped_text(spec).is_some() || !(spec.contains('/') || spec.ends_with(".ron")) {
        return shipped_or_err(spec);
    }
    crate::parse::load(path)
}
