//! The machine as a Graphviz graph (`hcclc topo show --dot`): devices, NICs and switches,
//! grouped by host, links labelled by kind, per-link bandwidth and count.
//!
//! Up to [`MAX_DETAILED_RANKS`] ranks every device is drawn; beyond, each host is one node
//! (its devices, NICs and switches summed up) and links between the same host or switch and
//! the same peer are merged, their bandwidth added: a summary whose size grows with hosts and
//! network switches, not ranks.

use crate::model::{Node, Topology};
use petgraph::visit::EdgeRef;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Largest topology drawn device by device.
pub const MAX_DETAILED_RANKS: u32 = 64;

/// A DOT string: quotes and backslashes escaped, line breaks as DOT's `\n`.
fn quote(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("\"{escaped}\"")
}

fn gbps(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The DOT text of `topo` (undirected: one edge per full-duplex link).
pub fn to_dot(topo: &Topology) -> String {
    let detailed = topo.nranks() <= MAX_DETAILED_RANKS;
    let g = &topo.graph;
    // What a graph node is drawn as: itself, or (summarised) its host.
    let drawn = |n: petgraph::graph::NodeIndex| -> String {
        match &g[n] {
            Node::Device { host, .. } | Node::Nic { host, .. } if !detailed => {
                format!("host:{}", topo.hosts[*host])
            }
            Node::Switch {
                host: Some(host), ..
            } if !detailed => format!("host:{}", topo.hosts[*host]),
            node => node.id().to_string(),
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "graph {} {{", quote(&topo.name));
    let _ = writeln!(
        out,
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", rankdir=LR];",
        quote(&format!(
            "{} ({} ranks, {} hosts){}",
            topo.name,
            topo.nranks(),
            topo.nhosts(),
            if detailed { "" } else { ": hosts summarised" }
        ))
    );
    let _ = writeln!(
        out,
        "  node [fontname=\"Helvetica\", fontsize=10]; edge [fontname=\"Helvetica\", fontsize=9];"
    );
    // Nodes, by host.
    let mut by_host: BTreeMap<Option<usize>, Vec<String>> = BTreeMap::new();
    let mut host_sizes: BTreeMap<usize, (u32, u32)> = BTreeMap::new();
    for n in g.node_indices() {
        let (host, line) = match &g[n] {
            Node::Device {
                id,
                rank,
                host,
                kind,
                ..
            } => {
                host_sizes.entry(*host).or_default().0 += 1;
                (
                    Some(*host),
                    format!(
                        "{} [shape=box, style=filled, fillcolor=\"#dbe9f6\", label={}];",
                        quote(id),
                        quote(&format!("{id}\n{kind:?} rank {rank}"))
                    ),
                )
            }
            Node::Nic { id, host, bw } => {
                host_sizes.entry(*host).or_default().1 += 1;
                (
                    Some(*host),
                    format!(
                        "{} [shape=ellipse, label={}];",
                        quote(id),
                        quote(&format!("{id}\n{} GB/s", gbps(*bw)))
                    ),
                )
            }
            Node::Switch { id, kind, host, .. } => (
                *host,
                format!(
                    "{} [shape=diamond, label={}];",
                    quote(id),
                    quote(&format!("{id}\n{kind:?}"))
                ),
            ),
        };
        let summarised = !detailed && !matches!(g[n], Node::Switch { host: None, .. });
        if !summarised {
            by_host.entry(host).or_default().push(line);
        }
    }
    if !detailed {
        for (h, (devices, nics)) in &host_sizes {
            by_host.entry(Some(*h)).or_default().push(format!(
                "{} [shape=box3d, label={}];",
                quote(&format!("host:{}", topo.hosts[*h])),
                quote(&format!(
                    "{}\n{devices} devices, {nics} NICs",
                    topo.hosts[*h]
                ))
            ));
        }
    }
    for (host, lines) in &by_host {
        match host {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "  subgraph {} {{\n    label={}; style=rounded; color=\"#888888\";",
                    quote(&format!("cluster_{}", topo.hosts[*h])),
                    quote(&topo.hosts[*h])
                );
                for l in lines {
                    let _ = writeln!(out, "    {l}");
                }
                let _ = writeln!(out, "  }}");
            }
            None => {
                for l in lines {
                    let _ = writeln!(out, "  {l}");
                }
            }
        }
    }
    // Links: one per full-duplex pair of edges (a < b), merged per drawn pair and kind.
    let mut links: BTreeMap<(String, String, String), (f64, u32, f64)> = BTreeMap::new();
    for e in g.edge_references() {
        let (a, b) = (drawn(e.source()), drawn(e.target()));
        if a == b || e.source() > e.target() {
            continue;
        }
        let w = e.weight();
        let per_link = w.bw / f64::from(w.count.max(1));
        let slot = links
            .entry((a, b, format!("{:?}", w.kind)))
            .or_insert((0.0, 0, per_link));
        slot.0 += w.bw;
        slot.1 += w.count;
    }
    for ((a, b, kind), (total, count, per_link)) in &links {
        let label = if *count <= 1 {
            format!("{kind} {} GB/s", gbps(*total))
        } else if detailed {
            format!("{kind} {count}×{} GB/s", gbps(*per_link))
        } else {
            format!("{kind} {} GB/s ({count} links)", gbps(*total))
        };
        let _ = writeln!(
            out,
            "  {} -- {} [label={}];",
            quote(a),
            quote(b),
            quote(&label)
        );
    }
    out.push_str("}\n");
    out
}
