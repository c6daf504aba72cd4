//! Reading topology text ([`from_ron`], [`load`]), writing it ([`to_ron`]) and turning a spec
//! into a validated [`Topology`] ([`build`]).

use crate::error::{Pos, Problem, TopologyError};
use crate::model::{DeviceKind, Edge, Node, Topology, TopologySpec};
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;

/// Nesting deeper than this is refused by the RON parser instead of overflowing the stack.
/// A valid topology nests at most 5 levels (spec / hosts / host / devices / device).
const RECURSION_LIMIT: usize = 32;

/// Default local memory bandwidth (GB/s) for a device of `kind` and `model` when the file does
/// not give `mem_bw`. Sources (vendor datasheets, peak HBM/DRAM bandwidth):
/// - V100 SXM2: 900 GB/s HBM2 (NVIDIA Tesla V100 datasheet).
/// - A100 40 GB: 1555 GB/s; A100 80 GB: 2039 GB/s (NVIDIA A100 datasheet).
/// - H100 SXM5: 3350 GB/s HBM3 (NVIDIA H100 datasheet); H200: 4800 GB/s HBM3e (H200 datasheet).
/// - Ascend 910: 1200 GB/s HBM2 (Huawei Ascend 910 product brief, "1.2 TB/s").
/// - CPU ranks: 10 GB/s, a conservative single-thread memcpy rate on a server core (a DDR4
///   channel peaks at 25.6 GB/s; one core rarely sustains more than about 10).
///
/// Unknown GPU/NPU models fall back to the V100 figure, the slowest HBM listed.
pub fn default_mem_bw(kind: DeviceKind, model: &str) -> f64 {
    let m = model.to_ascii_lowercase();
    match kind {
        DeviceKind::Cpu => 10.0,
        DeviceKind::Npu => 1200.0,
        DeviceKind::Gpu => {
            if m.contains("h200") {
                4800.0
            } else if m.contains("h100") {
                3350.0
            } else if m.contains("a100") && m.contains("80") {
                2039.0
            } else if m.contains("a100") {
                1555.0
            } else {
                900.0
            }
        }
    }
}

/// Parses topology text. `origin` names the source (a path) in errors.
pub fn from_ron(text: &str, origin: &str) -> Result<Topology, TopologyError> {
    let spec = parse_spec(text, origin)?;
    build_located(spec, origin, Some(text))
}

/// Parses topology text into the spec only (no semantic checks).
pub fn parse_spec(text: &str, origin: &str) -> Result<TopologySpec, TopologyError> {
    if is_blank(text) {
        return Err(TopologyError::Empty {
            origin: origin.to_string(),
        });
    }
    let options = ron::Options::default().with_recursion_limit(RECURSION_LIMIT);
    options
        .from_str::<TopologySpec>(text)
        .map_err(|err| TopologyError::Syntax {
            origin: origin.to_string(),
            pos: Pos {
                line: err.span.start.line,
                col: err.span.start.col,
            },
            message: err.code.to_string(),
        })
}

/// Reads, parses and builds a topology file.
pub fn load(path: &Path) -> Result<Topology, TopologyError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TopologyError::Io {
        path: origin.clone(),
        source,
    })?;
    from_bytes(&bytes, &origin)
}

/// Parses and builds topology bytes (checks UTF-8 first).
pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Topology, TopologyError> {
    let text = std::str::from_utf8(bytes).map_err(|err| TopologyError::NotText {
        origin: origin.to_string(),
        offset: err.valid_up_to(),
    })?;
    from_ron(text, origin)
}

/// Serialises a spec to pretty RON; equal specs give equal text (the canonical form hashed
/// into [`Topology::hash`]).
pub fn to_ron(spec: &TopologySpec) -> String {
    let config = ron::ser::PrettyConfig::new()
        .indentor("  ".to_string())
        .struct_names(false)
        .depth_limit(4);
    let mut text = ron::ser::to_string_pretty(spec, config).expect("topology specs serialise");
    text.push('\n');
    text
}

/// Validates a spec and builds its machine graph. `origin` names the source in errors.
pub fn build(spec: TopologySpec, origin: &str) -> Result<Topology, TopologyError> {
    build_located(spec, origin, None)
}

/// Checks that the topology has exactly `expected` ranks.
pub fn validate_ranks(topo: &Topology, expected: u32) -> Result<(), TopologyError> {
    if topo.nranks() == expected {
        Ok(())
    } else {
        Err(TopologyError::RankCount {
            name: topo.name.clone(),
            expected,
            found: topo.nranks(),
        })
    }
}

/// True when the text holds nothing but whitespace and comments.
fn is_blank(text: &str) -> bool {
    let mut rest = text.trim_start();
    loop {
        if rest.is_empty() {
            return true;
        }
        if let Some(r) = rest.strip_prefix("//") {
            rest = r
                .split_once('\n')
                .map(|(_, r)| r)
                .unwrap_or("")
                .trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            match r.split_once("*/") {
                Some((_, r)) => rest = r.trim_start(),
                None => return false, // unterminated comment: let the parser say so
            }
        } else {
            return false;
        }
    }
}

/// Where an item is written in the text, found by searching for it.
enum Where<'a> {
    /// The `nth` (0-based) occurrence of the quoted id.
    Id(&'a str, usize),
    /// The `index`-th entry of the top-level `links` list.
    Link(usize),
}

fn locate(text: Option<&str>, at: Where<'_>) -> Option<Pos> {
    let text = text?;
    let offset = match at {
        Where::Id(id, nth) => {
            let needle = format!("\"{id}\"");
            text.match_indices(&needle).nth(nth).map(|(i, _)| i)?
        }
        Where::Link(index) => link_offsets(text).get(index).copied()?,
    };
    Some(pos_of(text, offset))
}

fn pos_of(text: &str, offset: usize) -> Pos {
    // Offsets come from searches, so they are char boundaries; `get` keeps this panic-free.
    let before = text.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    Pos {
        line,
        col: before.get(line_start..).unwrap_or("").chars().count() + 1,
    }
}

/// Byte offsets of the entries of the top-level `links: [...]` list, skipping strings and
/// comments.
fn link_offsets(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    let mut in_links: Option<usize> = None; // depth of the links list's contents
    let mut expect_item = false;
    let mut out = Vec::new();
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' => {
                if expect_item {
                    out.push(i);
                    expect_item = false;
                }
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'(' | b'[' | b'{' => {
                if expect_item {
                    out.push(i);
                    expect_item = false;
                }
                depth += 1;
            }
            b')' | b']' | b'}' => {
                if in_links == Some(depth) {
                    return out;
                }
                depth = depth.saturating_sub(1);
            }
            b',' if in_links == Some(depth) => expect_item = true,
            _ if c.is_ascii_whitespace() => {}
            _ => {
                if depth == 1
                    && in_links.is_none()
                    && bytes[i..].starts_with(b"links")
                    && (i == 0 || !is_ident(bytes[i - 1]))
                {
                    // `links` is ASCII, so i + 5 is a char boundary.
                    let rest = text.get(i + 5..).unwrap_or("").trim_start();
                    if let Some(rest) = rest.strip_prefix(':')
                        && rest.trim_start().starts_with('[')
                    {
                        let open = text.len() - rest.trim_start().len();
                        in_links = Some(depth + 1);
                        depth += 1;
                        expect_item = true;
                        i = open + 1;
                        continue;
                    }
                }
                if expect_item {
                    out.push(i);
                    expect_item = false;
                }
                while i + 1 < bytes.len() && is_ident(bytes[i + 1]) {
                    i += 1;
                }
            }
        }
        i += 1;
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn check_number(
    what: impl FnOnce() -> String,
    field: &'static str,
    value: f64,
) -> Result<(), Problem> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Problem::BadNumber {
            what: what(),
            field,
            value,
        })
    }
}

/// A calibration's numbers are finite and positive and its knots ascend.
fn check_calibration(cal: &crate::model::Calibration) -> Result<(), Problem> {
    let what = || "calibration".to_string();
    check_number(what, "base_scale", cal.base_scale)?;
    check_number(what, "step_scale", cal.step_scale)?;
    check_number(what, "send_scale", cal.send_scale)?;
    check_number(what, "recv_scale", cal.recv_scale)?;
    check_number(what, "local_scale", cal.local_scale)?;
    if let Some(cores) = cal.cores {
        check_number(what, "cores", f64::from(cores))?;
    }
    for (class, &scale) in cal.message_scale.iter().enumerate() {
        check_number(
            || format!("calibration, link class {class}"),
            "message_scale",
            scale,
        )?;
    }
    for (i, &(bytes, factor)) in cal.bandwidth.iter().enumerate() {
        check_number(
            || format!("calibration, bandwidth knot {i} ({bytes} B)"),
            "factor",
            factor,
        )?;
        if i > 0 && bytes <= cal.bandwidth[i - 1].0 {
            return Err(Problem::CalibrationOrder {
                index: i,
                bytes,
                previous: cal.bandwidth[i - 1].0,
            });
        }
    }
    Ok(())
}

/// Where a validation problem is reported: the file (or name) and, when the text is at hand,
/// the position of the offending entry in it.
struct Locator<'t> {
    origin: &'t str,
    text: Option<&'t str>,
}

impl Locator<'_> {
    fn invalid(&self, pos: Option<Pos>, problem: Problem) -> TopologyError {
        TopologyError::Invalid {
            origin: self.origin.to_string(),
            pos,
            problem: Box::new(problem),
        }
    }

    /// The first occurrence of a quoted id.
    fn id_pos(&self, id: &str) -> Option<Pos> {
        locate(self.text, Where::Id(id, 0))
    }
}

fn build_located(
    spec: TopologySpec,
    origin: &str,
    text: Option<&str>,
) -> Result<Topology, TopologyError> {
    let at = Locator { origin, text };
    check_ids(&spec, &at)?;
    let ndevices: usize = spec.hosts.iter().map(|h| h.devices.len()).sum();
    if ndevices == 0 {
        return Err(at.invalid(None, Problem::NoDevices));
    }
    check_numbers(&spec, &at)?;
    let devices: Vec<(usize, &crate::model::DeviceSpec)> = spec
        .hosts
        .iter()
        .enumerate()
        .flat_map(|(h, host)| host.devices.iter().map(move |d| (h, d)))
        .collect();
    let rank_of = assign_ranks(&devices, &at)?;
    let mut graph: DiGraph<Node, Edge> = DiGraph::new();
    let (index, ranks, host_of) = add_nodes(&spec, &devices, &rank_of, &mut graph, &at)?;
    add_links(&spec, &index, &mut graph, &at)?;
    check_connected(&graph, &ranks, &at)?;
    if let Some(cal) = &spec.calibration {
        let pos = text.and_then(|t| t.find("calibration").map(|o| pos_of(t, o)));
        check_calibration(cal).map_err(|p| at.invalid(pos, p))?;
    }

    let hash = blake3::hash(to_ron(&spec).as_bytes()).to_hex().to_string();
    Ok(Topology {
        name: spec.name.clone(),
        description: spec.description.clone(),
        hash,
        graph,
        ranks,
        host_of,
        hosts: spec.hosts.iter().map(|h| h.id.clone()).collect(),
        spec,
    })
}

/// Ids: one namespace for hosts, devices, NICs and switches.
fn check_ids(spec: &TopologySpec, at: &Locator) -> Result<(), TopologyError> {
    let mut ids: Vec<&str> = Vec::new();
    for host in &spec.hosts {
        ids.push(&host.id);
        ids.extend(host.devices.iter().map(|d| d.id.as_str()));
        ids.extend(host.nics.iter().map(|n| n.id.as_str()));
    }
    ids.extend(spec.switches.iter().map(|s| s.id.as_str()));
    let mut seen: HashSet<&str> = HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            // The second occurrence of the quoted id in the text is the duplicate, unless a
            // link mentioned it first; fall back to the first.
            let pos = locate(at.text, Where::Id(id, 1)).or(at.id_pos(id));
            return Err(at.invalid(pos, Problem::DuplicateId { id: id.to_string() }));
        }
    }
    Ok(())
}

/// The numbers of devices, NICs and switches (links are checked as they are added).
fn check_numbers(spec: &TopologySpec, at: &Locator) -> Result<(), TopologyError> {
    for host in &spec.hosts {
        for d in &host.devices {
            if let Some(bw) = d.mem_bw {
                check_number(|| format!("device \"{}\"", d.id), "mem_bw", bw)
                    .map_err(|p| at.invalid(at.id_pos(&d.id), p))?;
            }
        }
        for n in &host.nics {
            check_number(|| format!("NIC \"{}\"", n.id), "bw", n.bw)
                .map_err(|p| at.invalid(at.id_pos(&n.id), p))?;
            if let Some(latency) = n.latency {
                check_number(|| format!("NIC \"{}\"", n.id), "latency", latency)
                    .map_err(|p| at.invalid(at.id_pos(&n.id), p))?;
            }
            if let Some(kind) = n.kind
                && !kind.is_network()
            {
                return Err(at.invalid(
                    at.id_pos(&n.id),
                    Problem::NicKind {
                        nic: n.id.clone(),
                        kind: format!("{kind:?}"),
                    },
                ));
            }
        }
    }
    for s in &spec.switches {
        if let Some(bw) = s.port_bw {
            check_number(|| format!("switch \"{}\"", s.id), "port_bw", bw)
                .map_err(|p| at.invalid(at.id_pos(&s.id), p))?;
        }
    }
    Ok(())
}

/// Ranks: all given (exactly 0..n) or none (file order). The rank of each device, in file
/// order.
fn assign_ranks(
    devices: &[(usize, &crate::model::DeviceSpec)],
    at: &Locator,
) -> Result<Vec<u32>, TopologyError> {
    let ndevices = devices.len();
    let any_rank = devices.iter().any(|(_, d)| d.rank.is_some());
    let mut rank_of = Vec::with_capacity(ndevices);
    let mut owner: Vec<Option<&str>> = vec![None; ndevices];
    for (i, (_, d)) in devices.iter().enumerate() {
        let rank = match (any_rank, d.rank) {
            (false, _) => i as u32,
            (true, None) => {
                return Err(at.invalid(
                    at.id_pos(&d.id),
                    Problem::MissingRank {
                        device: d.id.clone(),
                    },
                ));
            }
            (true, Some(r)) => r,
        };
        let Some(slot) = owner.get_mut(rank as usize) else {
            return Err(at.invalid(
                at.id_pos(&d.id),
                Problem::RankOutOfRange {
                    device: d.id.clone(),
                    rank,
                    n: ndevices,
                },
            ));
        };
        if let Some(other) = slot {
            return Err(at.invalid(
                at.id_pos(&d.id),
                Problem::DuplicateRank {
                    device: d.id.clone(),
                    rank,
                    other: other.to_string(),
                },
            ));
        }
        *slot = Some(&d.id);
        rank_of.push(rank);
    }
    Ok(rank_of)
}

/// The graph's node of each id, and per rank its device's node and its host.
type Nodes<'s> = (HashMap<&'s str, NodeIndex>, Vec<NodeIndex>, Vec<usize>);

/// Graph nodes: devices, NICs and switches.
fn add_nodes<'s>(
    spec: &'s TopologySpec,
    devices: &[(usize, &'s crate::model::DeviceSpec)],
    rank_of: &[u32],
    graph: &mut DiGraph<Node, Edge>,
    at: &Locator,
) -> Result<Nodes<'s>, TopologyError> {
    let ndevices = devices.len();
    let mut index: HashMap<&str, NodeIndex> = HashMap::new();
    let mut ranks = vec![NodeIndex::end(); ndevices];
    let mut host_of = vec![0usize; ndevices];
    for (i, (h, d)) in devices.iter().enumerate() {
        let rank = rank_of[i];
        let mem_bw = d.mem_bw.unwrap_or_else(|| default_mem_bw(d.kind, &d.model));
        let node = graph.add_node(Node::Device {
            id: d.id.clone(),
            rank,
            host: *h,
            kind: d.kind,
            mem_bw,
        });
        index.insert(&d.id, node);
        ranks[rank as usize] = node;
        host_of[rank as usize] = *h;
    }
    for (h, host) in spec.hosts.iter().enumerate() {
        for n in &host.nics {
            let node = graph.add_node(Node::Nic {
                id: n.id.clone(),
                host: h,
                bw: n.bw,
            });
            index.insert(&n.id, node);
        }
    }
    let host_index: HashMap<&str, usize> = spec
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.id.as_str(), i))
        .collect();
    for s in &spec.switches {
        let host = match &s.host {
            None => None,
            Some(h) => match host_index.get(h.as_str()) {
                Some(&i) => Some(i),
                None => {
                    return Err(at.invalid(
                        at.id_pos(&s.id),
                        Problem::UnknownHost {
                            switch: s.id.clone(),
                            host: h.clone(),
                        },
                    ));
                }
            },
        };
        let node = graph.add_node(Node::Switch {
            id: s.id.clone(),
            kind: s.kind,
            host,
            port_bw: s.port_bw,
        });
        index.insert(&s.id, node);
    }
    Ok((index, ranks, host_of))
}

/// Links: two directed edges each.
fn add_links(
    spec: &TopologySpec,
    index: &HashMap<&str, NodeIndex>,
    graph: &mut DiGraph<Node, Edge>,
    at: &Locator,
) -> Result<(), TopologyError> {
    for (k, l) in spec.links.iter().enumerate() {
        let pos = || locate(at.text, Where::Link(k));
        let what = || format!("link {k} ({} -> {})", l.a, l.b);
        let mut ends = [NodeIndex::end(); 2];
        for (slot, endpoint) in ends.iter_mut().zip([&l.a, &l.b]) {
            *slot = *index.get(endpoint.as_str()).ok_or_else(|| {
                at.invalid(
                    pos(),
                    Problem::UnknownEndpoint {
                        index: k,
                        a: l.a.clone(),
                        b: l.b.clone(),
                        endpoint: endpoint.clone(),
                    },
                )
            })?;
        }
        if l.a == l.b {
            return Err(at.invalid(
                pos(),
                Problem::SelfLoop {
                    index: k,
                    a: l.a.clone(),
                    b: l.b.clone(),
                },
            ));
        }
        if l.count == 0 {
            return Err(at.invalid(
                pos(),
                Problem::ZeroCount {
                    index: k,
                    a: l.a.clone(),
                    b: l.b.clone(),
                },
            ));
        }
        check_number(what, "bw", l.bw).map_err(|p| at.invalid(pos(), p))?;
        check_number(what, "latency", l.latency).map_err(|p| at.invalid(pos(), p))?;
        let bw = l.bw * f64::from(l.count);
        if !bw.is_finite() {
            return Err(at.invalid(
                pos(),
                Problem::BadNumber {
                    what: what(),
                    field: "bw × count",
                    value: bw,
                },
            ));
        }
        let edge = Edge {
            kind: l.kind,
            bw,
            latency: l.latency,
            count: l.count,
        };
        graph.add_edge(ends[0], ends[1], edge.clone());
        graph.add_edge(ends[1], ends[0], edge);
    }
    Ok(())
}

/// Connectivity over devices (paths may pass through NICs and switches).
fn check_connected(
    graph: &DiGraph<Node, Edge>,
    ranks: &[NodeIndex],
    at: &Locator,
) -> Result<(), TopologyError> {
    let start = ranks[0];
    let mut reached = vec![false; graph.node_count()];
    reached[start.index()] = true;
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.neighbors(v) {
            if !reached[w.index()] {
                reached[w.index()] = true;
                queue.push_back(w);
            }
        }
    }
    for &r in ranks {
        if !reached[r.index()] {
            let device = graph[r].id().to_string();
            return Err(at.invalid(
                at.id_pos(&device),
                Problem::Unreachable {
                    device,
                    from: graph[start].id().to_string(),
                },
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_offsets_skip_strings_and_comments() {
        let text = "(\n  name: \"links: [\", // links: [\n  links: [\n    (a: \"x\"),\n    (a: \"y\"),\n  ],\n)";
        let offs = link_offsets(text);
        assert_eq!(offs.len(), 2);
        assert_eq!(pos_of(text, offs[0]), Pos { line: 4, col: 5 });
        assert_eq!(pos_of(text, offs[1]), Pos { line: 5, col: 5 });
    }

    #[test]
    fn blank_detection() {
        assert!(is_blank("  \n// c\n /* x */ "));
        assert!(!is_blank("/* open"));
        assert!(!is_blank("()"));
    }
}
