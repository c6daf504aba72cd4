//! A machine as an SVG picture (`hcclc topo show --svg`), laid out here and drawn with
//! plotters' drawing API.
//!
//! Each host is a box: its NICs and the switches wired to no device (CPUs) on top (towards
//! the network), the switches wired to devices (NVSwitch, PCIe) in the middle, its devices at
//! the bottom in rank order; every row above the devices is ordered by where its neighbours
//! are. Links between two devices of a host hang below them as arcs, deeper the farther
//! apart their ends are, so that the arcs of a mesh or a cube stay apart, labelled with their
//! bandwidth where arcs differ; links within another row arch above it. Network switches sit
//! in rows above the hosts, nearest the hosts those wired to NICs. A link's colour is its
//! kind, its width grows with its bandwidth, and the legend names every (kind, bandwidth)
//! drawn.
//!
//! Up to [`MAX_DETAILED_RANKS`] ranks every device is drawn; beyond, as `topo show --dot`
//! does, each host is one box (its devices and NICs counted) and the links between a host
//! and a switch are merged, their bandwidth summed. Past [`MAX_DRAWN`] hosts (or switches of
//! one row) the first ones are drawn and a last box counts the others.

use super::PlotError;
use hccl_topologies::dot::MAX_DETAILED_RANKS;
use hccl_topologies::{DeviceKind, LinkKind, Node, SwitchKind, Topology};
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, HashMap};

/// Most hosts, and switches of one row, drawn before the rest are counted in one box.
pub const MAX_DRAWN: usize = 24;

const FONT: &str = "sans-serif";
const MARGIN: i32 = 30;
const NODE_H: i32 = 40;
const ROW_GAP: i32 = 80;
/// Rows of a host, from the top: NICs and switches wired to no device (CPUs), switches
/// wired to devices, devices.
const HOST_ROWS: usize = 3;
const HOST_GAP: i32 = 40;
/// Estimated width of a character of the node labels (font size 15, which plotters' SVG
/// backend writes as 12 pixels; sans-serif runs about 0.55 em).
const CHAR_W: f64 = 7.0;

/// A drawn box.
#[derive(Debug, Clone)]
struct Item {
    lines: Vec<String>,
    fill: RGBColor,
    /// Centre, set by the layout.
    x: i32,
    y: i32,
    w: i32,
    /// Links to items of its own row hang below it (devices, hosts), else arch above.
    below: bool,
}

/// A drawn link between two items.
#[derive(Debug, Clone)]
struct Link {
    a: usize,
    b: usize,
    kind: LinkKind,
    /// Total bandwidth per direction (GB/s), links merged.
    bw: f64,
    count: u32,
    /// Both ends in one row: drawn as an arc (set by the layout).
    arc: bool,
}

fn gbps(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

fn colour(kind: LinkKind) -> RGBColor {
    match kind {
        LinkKind::NvLink => RGBColor(90, 160, 0),
        LinkKind::Hccs => RGBColor(200, 40, 40),
        LinkKind::Xgmi => RGBColor(220, 90, 20),
        LinkKind::Pcie => RGBColor(60, 110, 200),
        LinkKind::InfiniBand => RGBColor(130, 60, 170),
        LinkKind::Roce => RGBColor(170, 60, 130),
        LinkKind::Ethernet => RGBColor(200, 130, 0),
        LinkKind::Memory => RGBColor(120, 120, 120),
    }
}

fn device_kind(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Gpu => "GPU",
        DeviceKind::Npu => "NPU",
        DeviceKind::Cpu => "CPU",
    }
}

fn switch_kind(kind: SwitchKind) -> &'static str {
    match kind {
        SwitchKind::NvSwitch => "NVSwitch",
        SwitchKind::Pcie => "PCIe switch",
        SwitchKind::Leaf => "leaf switch",
        SwitchKind::Spine => "spine switch",
        SwitchKind::Memory => "memory",
    }
}

/// `id` without its host's prefix (`n0.gpu3` in host `n0.dgx-h100` is `gpu3`).
fn local_id<'a>(id: &'a str, host: &str) -> &'a str {
    match (id.split_once('.'), host.split_once('.')) {
        (Some((p, rest)), Some((q, _))) if p == q && !rest.is_empty() => rest,
        _ => id,
    }
}

fn item(lines: Vec<String>, fill: RGBColor) -> Item {
    let longest = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let w = ((longest as f64 * CHAR_W) as i32 + 16).max(64);
    Item {
        lines,
        fill,
        x: 0,
        y: 0,
        w,
        below: fill == DEVICE_FILL,
    }
}

const DEVICE_FILL: RGBColor = RGBColor(219, 233, 246);
const NIC_FILL: RGBColor = RGBColor(255, 243, 205);
const SWITCH_FILL: RGBColor = RGBColor(232, 232, 232);
const HOST_FILL: RGBColor = RGBColor(219, 233, 246);

/// What the picture holds before layout: items per host (NICs, switches, devices) or per
/// network row, and links.
struct Scene {
    title: String,
    /// Per drawn host: its name and its three rows of items.
    hosts: Vec<(String, [Vec<usize>; HOST_ROWS])>,
    /// Network switches by level (1: wired to a host).
    network: Vec<Vec<usize>>,
    items: Vec<Item>,
    links: Vec<Link>,
    note: Option<String>,
}

/// The SVG text of a picture of `topo`.
pub fn topology_svg(topo: &Topology) -> Result<String, PlotError> {
    let scene = if topo.nranks() <= MAX_DETAILED_RANKS {
        detailed(topo)
    } else {
        summary(topo)
    };
    draw(scene)
}

/// Network switches by distance from the hosts: level 1 is wired to something in a host.
fn levels(topo: &Topology) -> HashMap<NodeIndex, usize> {
    let g = &topo.graph;
    let in_host = |n: NodeIndex| !matches!(g[n], Node::Switch { host: None, .. });
    let mut level: HashMap<NodeIndex, usize> = HashMap::new();
    let mut frontier: Vec<NodeIndex> = g.node_indices().filter(|&n| in_host(n)).collect();
    let mut depth = 0;
    while !frontier.is_empty() {
        depth += 1;
        let mut next = Vec::new();
        for n in frontier {
            for m in g.neighbors(n) {
                if !in_host(m) && !level.contains_key(&m) {
                    level.insert(m, depth);
                    next.push(m);
                }
            }
        }
        next.sort_unstable();
        frontier = next;
    }
    level
}

/// The first [`MAX_DRAWN`] - 1 of `list` and, for the rest, a box counting them (`what`).
fn elide(list: &mut Vec<usize>, items: &mut Vec<Item>, what: &str) -> usize {
    if list.len() <= MAX_DRAWN {
        return 0;
    }
    let hidden = list.len() - (MAX_DRAWN - 1);
    list.truncate(MAX_DRAWN - 1);
    items.push(item(
        vec![format!("… {hidden} more"), what.to_string()],
        RGBColor(250, 250, 250),
    ));
    list.push(items.len() - 1);
    hidden
}

/// Network switches as items, by level; `of` maps graph nodes to items.
fn network_rows(
    topo: &Topology,
    items: &mut Vec<Item>,
    of: &mut HashMap<NodeIndex, usize>,
) -> (Vec<Vec<usize>>, usize) {
    let g = &topo.graph;
    let level = levels(topo);
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut hidden = 0;
    let mut by_level: BTreeMap<usize, Vec<NodeIndex>> = BTreeMap::new();
    for (&n, &l) in &level {
        by_level.entry(l).or_default().push(n);
    }
    for (_, mut nodes) in by_level {
        nodes.sort_unstable();
        let mut row = Vec::new();
        for &n in &nodes {
            if let Node::Switch { id, kind, .. } = &g[n] {
                items.push(item(
                    vec![id.clone(), switch_kind(*kind).to_string()],
                    SWITCH_FILL,
                ));
                of.insert(n, items.len() - 1);
                row.push(items.len() - 1);
            }
        }
        let before: Vec<usize> = row.clone();
        hidden += elide(&mut row, items, "switches");
        for gone in before.iter().filter(|i| !row.contains(i)) {
            of.retain(|_, v| v != gone);
        }
        rows.push(row);
    }
    (rows, hidden)
}

/// The links between drawn items: one per full-duplex pair of edges whose ends are drawn
/// (as items `of` names), merged per pair of items and link kind (bandwidths and counts
/// summed); edges inside one item (a host's box in the summary) are left out.
fn merged_links(topo: &Topology, of: &HashMap<NodeIndex, usize>) -> Vec<Link> {
    let mut merged: BTreeMap<(usize, usize, String), Link> = BTreeMap::new();
    for e in topo.graph.edge_references() {
        if e.source() > e.target() {
            continue;
        }
        let (Some(&a), Some(&b)) = (of.get(&e.source()), of.get(&e.target())) else {
            continue;
        };
        if a == b {
            continue;
        }
        let w = e.weight();
        let (a, b) = (a.min(b), a.max(b));
        let link = merged
            .entry((a, b, format!("{:?}", w.kind)))
            .or_insert(Link {
                a,
                b,
                kind: w.kind,
                bw: 0.0,
                count: 0,
                arc: false,
            });
        link.bw += w.bw;
        link.count += w.count.max(1);
    }
    merged.into_values().collect()
}

fn detailed(topo: &Topology) -> Scene {
    let g = &topo.graph;
    let mut items = Vec::new();
    let mut of: HashMap<NodeIndex, usize> = HashMap::new();
    let mut hosts: Vec<(String, [Vec<usize>; HOST_ROWS])> = topo
        .hosts
        .iter()
        .map(|h| (h.clone(), Default::default()))
        .collect();
    // Devices in rank order, then NICs and host switches in node order.
    let mut order: Vec<NodeIndex> = topo.ranks.clone();
    order.extend(
        g.node_indices()
            .filter(|&n| !matches!(g[n], Node::Device { .. })),
    );
    for n in order {
        let (host, row, it) = match &g[n] {
            Node::Device {
                id,
                rank,
                host,
                kind,
                ..
            } => (
                *host,
                2,
                item(
                    vec![
                        local_id(id, &topo.hosts[*host]).to_string(),
                        format!("{} rank {rank}", device_kind(*kind)),
                    ],
                    DEVICE_FILL,
                ),
            ),
            Node::Nic { id, host, bw } => (
                *host,
                0,
                item(
                    vec![
                        local_id(id, &topo.hosts[*host]).to_string(),
                        format!("NIC {} GB/s", gbps(*bw)),
                    ],
                    NIC_FILL,
                ),
            ),
            Node::Switch {
                id,
                kind,
                host: Some(host),
                ..
            } => (
                *host,
                if g.neighbors(n).any(|m| matches!(g[m], Node::Device { .. })) {
                    1
                } else {
                    0
                },
                item(
                    vec![
                        local_id(id, &topo.hosts[*host]).to_string(),
                        switch_kind(*kind).to_string(),
                    ],
                    SWITCH_FILL,
                ),
            ),
            Node::Switch { host: None, .. } => continue,
        };
        items.push(it);
        of.insert(n, items.len() - 1);
        hosts[host].1[row].push(items.len() - 1);
    }
    let (network, hidden) = network_rows(topo, &mut items, &mut of);
    let links = merged_links(topo, &of);
    Scene {
        title: format!(
            "{} ({} ranks, {} host{})",
            topo.name,
            topo.nranks(),
            topo.nhosts(),
            if topo.nhosts() == 1 { "" } else { "s" }
        ),
        hosts,
        network,
        items,
        links,
        note: (hidden > 0).then(|| format!("{hidden} network switches not drawn")),
    }
}

fn summary(topo: &Topology) -> Scene {
    let g = &topo.graph;
    let mut items = Vec::new();
    let mut of: HashMap<NodeIndex, usize> = HashMap::new();
    let mut devices = vec![(0u32, 0u32, String::new()); topo.nhosts()];
    for n in g.node_indices() {
        match &g[n] {
            Node::Device { host, kind, .. } => {
                devices[*host].0 += 1;
                devices[*host].2 = device_kind(*kind).to_string();
            }
            Node::Nic { host, .. } => devices[*host].1 += 1,
            _ => {}
        }
    }
    let mut row: Vec<usize> = Vec::new();
    for (h, name) in topo.hosts.iter().enumerate() {
        let (d, nics, kind) = &devices[h];
        items.push(item(
            vec![name.clone(), format!("{d} {kind}, {nics} NICs")],
            HOST_FILL,
        ));
        row.push(items.len() - 1);
    }
    let hidden_hosts = elide(&mut row, &mut items, "hosts");
    let drawn_host = |h: usize| {
        row.get(h)
            .copied()
            .filter(|_| h < MAX_DRAWN - 1 || hidden_hosts == 0)
    };
    for n in g.node_indices() {
        let host = match &g[n] {
            Node::Device { host, .. } | Node::Nic { host, .. } => Some(*host),
            Node::Switch { host, .. } => *host,
        };
        if let Some(i) = host.and_then(drawn_host) {
            of.insert(n, i);
        }
    }
    let (network, hidden) = network_rows(topo, &mut items, &mut of);
    let links = merged_links(topo, &of);
    let mut notes = Vec::new();
    if hidden_hosts > 0 {
        notes.push(format!("{hidden_hosts} hosts and their links not drawn"));
    }
    if hidden > 0 {
        notes.push(format!("{hidden} network switches not drawn"));
    }
    Scene {
        title: format!(
            "{} ({} ranks, {} hosts): one box per host, links between a host and a switch merged",
            topo.name,
            topo.nranks(),
            topo.nhosts()
        ),
        hosts: vec![(String::new(), [Vec::new(), Vec::new(), row])],
        network,
        items,
        links,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

/// The label of a link: `2×25 GB/s`, `400 GB/s (8 links)`.
fn link_label(l: &Link) -> String {
    if l.count <= 1 {
        format!("{} GB/s", gbps(l.bw))
    } else if l.arc || l.count <= 4 {
        format!("{}×{} GB/s", l.count, gbps(l.bw / f64::from(l.count)))
    } else {
        format!("{} GB/s ({} links)", gbps(l.bw), l.count)
    }
}

/// Lays out the scene and draws it.
fn draw(mut scene: Scene) -> Result<String, PlotError> {
    if scene.items.is_empty() {
        return Err(PlotError::Empty("the topology has no node".into()));
    }
    let page = lay_out(&mut scene);
    render(&scene, &page)
}

/// Where [`lay_out`] put things: the legend, the host boxes, the page's size.
struct Page {
    /// Legend entries: (kind, bandwidth, label) → (colour, stroke width).
    legend: BTreeMap<(String, u64, String), (RGBColor, u32)>,
    legend_cols: usize,
    /// Per host: its box's left edge and width.
    host_boxes: Vec<(i32, i32)>,
    host_top: i32,
    host_h: i32,
    width: i32,
    height: i32,
    note_h: i32,
    /// The widest link's bandwidth (strokes scale with it).
    max_bw: f64,
}

/// A link's stroke width: 1 to 5 by the square root of its share of the widest bandwidth.
fn stroke(bw: f64, max_bw: f64) -> u32 {
    if max_bw > 0.0 {
        1 + (4.0 * (bw / max_bw).sqrt()).round() as u32
    } else {
        1
    }
}

/// An arc's depth by the distance of its ends (negative: above the row, where there is less
/// room).
fn arc_of(l: &Link, items: &[Item]) -> i32 {
    let d = (items[l.a].x - items[l.b].x).abs();
    if items[l.a].below {
        22 + d / 4
    } else {
        -(16 + d / 12).min(ROW_GAP - 34)
    }
}

/// Width of a row of items with their gaps.
fn slot(items: &[Item], row: &[usize]) -> i32 {
    row.iter().map(|&i| items[i].w + 16).sum::<i32>()
}

/// Lays out the scene: hosts side by side, the network rows above them (farthest first),
/// every item placed in its row, links between items of one row drawn as arcs.
fn lay_out(scene: &mut Scene) -> Page {
    let max_bw = scene.links.iter().map(|l| l.bw).fold(0.0, f64::max);
    // Legend entries: (kind, label) → style, in kind order then bandwidth.
    let mut legend: BTreeMap<(String, u64, String), (RGBColor, u32)> = BTreeMap::new();
    for l in &scene.links {
        legend.insert(
            (
                l.kind.label().to_string(),
                (l.bw * 1000.0) as u64,
                format!("{} {}", l.kind.label(), link_label(l)),
            ),
            (colour(l.kind), stroke(l.bw, max_bw)),
        );
    }
    // Horizontal layout: hosts side by side, each as wide as its widest row.
    let mut x = MARGIN;
    let mut host_boxes = Vec::new();
    let mut arc_depth = 0;
    for (_, rows) in &scene.hosts {
        let width = rows
            .iter()
            .map(|r| slot(&scene.items, r))
            .max()
            .unwrap_or(0)
            .max(120)
            + 24;
        host_boxes.push((x, width));
        x += width + HOST_GAP;
    }
    let hosts_w = x - HOST_GAP + MARGIN;
    let net_w = scene
        .network
        .iter()
        .map(|r| slot(&scene.items, r) + 2 * MARGIN)
        .max()
        .unwrap_or(0);
    let title_w = (scene.title.chars().count() as f64 * CHAR_W * 1.35) as i32 + 2 * MARGIN;
    let width = hosts_w.max(net_w).max(title_w).max(800);
    // Vertical layout: title, legend, network rows (farthest first), hosts.
    let legend_cols = ((width - 2 * MARGIN) / 250).max(1) as usize;
    let legend_h = legend.len().div_ceil(legend_cols) as i32 * 22 + 10;
    let mut y = 50 + legend_h + 20;
    // Rows from the top: network levels, farthest first, then the hosts' rows (the same
    // offsets in every host; rows no host has take no room).
    let mut net_y = vec![0; scene.network.len()];
    for k in (0..scene.network.len()).rev() {
        net_y[k] = y + NODE_H / 2;
        y += NODE_H + ROW_GAP;
    }
    let host_top = y;
    let (row_y, ry) = host_rows(scene, host_top);
    place_items(scene, &host_boxes, &row_y, &net_y, width);
    for l in scene.links.iter().filter(|l| l.arc) {
        arc_depth = arc_depth.max(arc_of(l, &scene.items) + 18);
    }
    let host_h = ry - host_top - ROW_GAP + 20 + 16 + arc_depth;
    let note_h = if scene.note.is_some() { 24 } else { 0 };
    let height = host_top + host_h + MARGIN + note_h;

    Page {
        legend,
        legend_cols,
        host_boxes,
        host_top,
        host_h,
        width,
        height,
        note_h,
        max_bw,
    }
}

/// The rows of the hosts from `host_top`: each row's centre (the same offsets in every
/// host; rows no host has take no room), and where the last row ends.
fn host_rows(scene: &Scene, host_top: i32) -> ([i32; HOST_ROWS], i32) {
    let mut row_y = [0i32; HOST_ROWS];
    let row_of: HashMap<usize, usize> = scene
        .hosts
        .iter()
        .flat_map(|(_, rows)| {
            rows.iter()
                .enumerate()
                .flat_map(|(r, row)| row.iter().map(move |&i| (i, r)))
        })
        .collect();
    // Links within a host's top row arch above it: room for them.
    let arches_on_top = scene
        .links
        .iter()
        .any(|l| row_of.get(&l.a) == Some(&0) && row_of.get(&l.b) == Some(&0));
    let mut ry = host_top
        + if scene.hosts.first().is_none_or(|h| h.0.is_empty()) {
            10
        } else {
            34
        }
        + if arches_on_top { ROW_GAP - 34 } else { 0 };
    for (r, row_y) in row_y.iter_mut().enumerate() {
        if scene.hosts.iter().any(|(_, rows)| !rows[r].is_empty()) {
            *row_y = ry + NODE_H / 2;
            ry += NODE_H + ROW_GAP - 20;
        }
    }
    (row_y, ry)
}

/// Places every item: devices in rank order, then every row above by the mean position of
/// its items' neighbours already placed (fewer crossings), then the network levels from the
/// hosts up; links within one row become arcs.
fn place_items(
    scene: &mut Scene,
    host_boxes: &[(i32, i32)],
    row_y: &[i32; HOST_ROWS],
    net_y: &[i32],
    width: i32,
) {
    let mut neighbours: Vec<Vec<usize>> = vec![Vec::new(); scene.items.len()];
    for l in &scene.links {
        neighbours[l.a].push(l.b);
        neighbours[l.b].push(l.a);
    }
    let mut placed = vec![false; scene.items.len()];
    let mut place = |items: &mut Vec<Item>, row: &[usize], left: i32, room: i32, y: i32| {
        let mut order: Vec<(f64, usize, usize)> = row
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let xs: Vec<f64> = neighbours[i]
                    .iter()
                    .filter(|&&j| placed[j])
                    .map(|&j| f64::from(items[j].x))
                    .collect();
                let key = if xs.is_empty() {
                    f64::INFINITY
                } else {
                    xs.iter().sum::<f64>() / xs.len() as f64
                };
                (key, k, i)
            })
            .collect();
        // Items without placed neighbours keep their order, after the others.
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let w = slot(items, row);
        let mut cx = left + (room - w) / 2;
        for (_, _, i) in order {
            let it = &mut items[i];
            it.x = cx + 8 + it.w / 2;
            it.y = y;
            cx += it.w + 16;
            placed[i] = true;
        }
    };
    for ((_, rows), &(hx, hw)) in scene.hosts.iter().zip(host_boxes) {
        for r in (0..HOST_ROWS).rev() {
            place(&mut scene.items, &rows[r], hx, hw, row_y[r]);
        }
    }
    for (row, &y) in scene.network.iter().zip(net_y) {
        place(&mut scene.items, row, 0, width, y);
    }
    for l in &mut scene.links {
        l.arc = scene.items[l.a].y == scene.items[l.b].y;
    }
}

/// The page's SVG: title, legend, host boxes, links (widest first), host names, arc labels,
/// items, note.
fn render(scene: &Scene, page: &Page) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (page.width as u32, page.height as u32))
            .into_drawing_area();
        root.fill(&WHITE)?;
        root.draw(&Text::new(
            scene.title.clone(),
            (MARGIN, 14),
            text(24).color(&BLACK),
        ))?;
        // Legend.
        for (k, ((_, _, label), (c, w))) in page.legend.iter().enumerate() {
            let (col, row) = ((k % page.legend_cols) as i32, (k / page.legend_cols) as i32);
            let (lx, ly) = (MARGIN + col * 250, 50 + row * 22 + 8);
            root.draw(&PathElement::new(
                vec![(lx, ly), (lx + 28, ly)],
                c.stroke_width(*w),
            ))?;
            root.draw(&Text::new(
                label.clone(),
                (lx + 36, ly),
                text(15).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        // Host boxes.
        for (h, (name, _)) in scene.hosts.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let (hx, hw) = page.host_boxes[h];
            root.draw(&Rectangle::new(
                [(hx, page.host_top), (hx + hw, page.host_top + page.host_h)],
                RGBColor(250, 250, 252).filled(),
            ))?;
            root.draw(&Rectangle::new(
                [(hx, page.host_top), (hx + hw, page.host_top + page.host_h)],
                RGBColor(140, 140, 140).stroke_width(1),
            ))?;
        }
        let items = &scene.items;
        draw_links(&root, scene, page.max_bw)?;
        // Host names, over the links that cross them.
        for (h, (name, _)) in scene.hosts.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let (hx, _) = page.host_boxes[h];
            let label = format!("host {name}");
            let w = (label.chars().count() as f64 * 8.0) as i32 + 8;
            root.draw(&Rectangle::new(
                [
                    (hx + 4, page.host_top + 4),
                    (hx + 4 + w, page.host_top + 26),
                ],
                RGBColor(250, 250, 252).filled(),
            ))?;
            root.draw(&Text::new(
                label,
                (hx + 8, page.host_top + 8),
                text(17).color(&RGBColor(60, 60, 60)),
            ))?;
        }
        draw_arc_labels(&root, scene)?;
        draw_items(&root, items)?;
        if let Some(note) = &scene.note {
            root.draw(&Text::new(
                note.clone(),
                (MARGIN, page.height - page.note_h - 4),
                text(16).color(&RGBColor(90, 90, 90)),
            ))?;
        }
        root.present()?;
    }
    Ok(svg)
}

type Area<'s> = DrawingArea<SVGBackend<'s>, plotters::coord::Shift>;

/// A text style of `size` pixels.
fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font())
}

/// The links, widest first so that thin ones stay visible on top.
fn draw_links(root: &Area<'_>, scene: &Scene, max_bw: f64) -> Result<(), PlotError> {
    let mut order: Vec<&Link> = scene.links.iter().collect();
    order.sort_by(|a, b| b.bw.total_cmp(&a.bw));
    let items = &scene.items;
    for l in &order {
        let (a, b) = (&items[l.a], &items[l.b]);
        let style = colour(l.kind).mix(0.85).stroke_width(stroke(l.bw, max_bw));
        if l.arc {
            let (x0, x1) = (a.x.min(b.x), a.x.max(b.x));
            let depth = arc_of(l, items);
            let base = a.y + NODE_H / 2 * depth.signum();
            let pts: Vec<(i32, i32)> = (0..=24)
                .map(|k| {
                    let t = std::f64::consts::PI * f64::from(k) / 24.0;
                    let cx = f64::from(x0 + x1) / 2.0;
                    let rx = f64::from(x1 - x0) / 2.0;
                    (
                        (cx - rx * t.cos()).round() as i32,
                        base + (f64::from(depth) * t.sin()).round() as i32,
                    )
                })
                .collect();
            root.draw(&PathElement::new(pts, style))?;
        } else {
            // From the bottom of the upper item to the top of the lower one.
            let (up, down) = if a.y <= b.y { (a, b) } else { (b, a) };
            let (y0, y1) = if up.y == down.y {
                (up.y, down.y)
            } else {
                (up.y + NODE_H / 2, down.y - NODE_H / 2)
            };
            root.draw(&PathElement::new(vec![(up.x, y0), (down.x, y1)], style))?;
        }
    }
    Ok(())
}

/// Arc labels at the arcs' lowest (or highest) points, unless every arc has the same kind
/// and bandwidth (the legend then says it once).
fn draw_arc_labels(root: &Area<'_>, scene: &Scene) -> Result<(), PlotError> {
    let items = &scene.items;
    let mut arc_kinds: Vec<(LinkKind, String)> = scene
        .links
        .iter()
        .filter(|l| l.arc)
        .map(|l| (l.kind, link_label(l)))
        .collect();
    arc_kinds.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.label().cmp(b.0.label())));
    arc_kinds.dedup();
    let label_arcs = arc_kinds.len() > 1;
    for l in scene.links.iter().filter(|l| l.arc && label_arcs) {
        let (a, b) = (&items[l.a], &items[l.b]);
        let depth = arc_of(l, items);
        let at = ((a.x + b.x) / 2, a.y + NODE_H / 2 * depth.signum() + depth);
        let label = link_label(l);
        let w = (label.chars().count() as f64 * 6.6) as i32 + 6;
        root.draw(&Rectangle::new(
            [(at.0 - w / 2, at.1 - 7), (at.0 + w / 2, at.1 + 7)],
            WHITE.mix(0.85).filled(),
        ))?;
        root.draw(&Text::new(
            label,
            at,
            text(14)
                .color(&colour(l.kind))
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// The items: a box each, with its lines of text.
fn draw_items(root: &Area<'_>, items: &[Item]) -> Result<(), PlotError> {
    for it in items {
        if it.x == 0 && it.y == 0 {
            continue;
        }
        let (x0, y0) = (it.x - it.w / 2, it.y - NODE_H / 2);
        root.draw(&Rectangle::new(
            [(x0, y0), (x0 + it.w, y0 + NODE_H)],
            it.fill.filled(),
        ))?;
        root.draw(&Rectangle::new(
            [(x0, y0), (x0 + it.w, y0 + NODE_H)],
            RGBColor(90, 90, 90).stroke_width(1),
        ))?;
        let n = it.lines.len() as i32;
        for (k, line) in it.lines.iter().enumerate() {
            let dy = (k as i32 * 2 - (n - 1)) * 8;
            root.draw(&Text::new(
                line.clone(),
                (it.x, it.y + dy),
                text(if k == 0 { 15 } else { 14 })
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        }
    }
    Ok(())
}
