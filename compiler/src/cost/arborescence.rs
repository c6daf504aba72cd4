//! Minimum-cost spanning arborescences (Chu–Liu/Edmonds): the pricing step of tree packing.
//!
//! Every non-root vertex takes its cheapest incoming edge; if those edges close a cycle, the
//! cycle is contracted into one vertex (an edge entering it costs what it saves over the
//! cycle edge it replaces), the smaller problem is solved, and the cycle is expanded again
//! with one of its edges dropped. `O(n³)` on a dense graph of `n` vertices, which is what
//! rank graphs are (every ordered pair of ranks has a route).

/// A minimum-cost arborescence of the dense digraph on `n` vertices rooted at `root`, where
/// `cost(u, v)` is the cost of edge `u → v` (`f64::INFINITY`: no edge). Returns each vertex's
/// parent (`None` for the root), or `None` when some vertex cannot be reached from the root.
pub fn min_arborescence(
    n: usize,
    root: usize,
    cost: impl Fn(usize, usize) -> f64,
) -> Option<Vec<Option<usize>>> {
    if root >= n {
        return None;
    }
    let m: Vec<Vec<f64>> = (0..n)
        .map(|u| {
            (0..n)
                .map(|v| if u == v { f64::INFINITY } else { cost(u, v) })
                .collect()
        })
        .collect();
    let mut parent = vec![None; n];
    for (u, v) in solve(&m, root)? {
        parent[v] = Some(u);
    }
    Some(parent)
}

/// The arborescence's edges, in this level's vertex numbering.
fn solve(m: &[Vec<f64>], root: usize) -> Option<Vec<(usize, usize)>> {
    let n = m.len();
    // Cheapest incoming edge of every non-root vertex.
    let mut inn = vec![usize::MAX; n];
    for v in (0..n).filter(|&v| v != root) {
        let mut best = f64::INFINITY;
        for (u, row) in m.iter().enumerate() {
            if u != v && row[v] < best {
                best = row[v];
                inn[v] = u;
            }
        }
        if !best.is_finite() {
            return None;
        }
    }
    let Some(cycle) = find_cycle(&inn, root) else {
        return Some((0..n).filter(|&v| v != root).map(|v| (inn[v], v)).collect());
    };
    // Contract the cycle into vertex `c` (numbered after the others).
    let mut in_cycle = vec![false; n];
    for &v in &cycle {
        in_cycle[v] = true;
    }
    let mut id = vec![0usize; n];
    let mut k = 0;
    for v in 0..n {
        if !in_cycle[v] {
            id[v] = k;
            k += 1;
        }
    }
    let c = k;
    for &v in &cycle {
        id[v] = c;
    }
    let n2 = k + 1;
    // Cost and the edge of this level each contracted edge stands for.
    let mut m2 = vec![vec![f64::INFINITY; n2]; n2];
    let mut orig = vec![vec![(0usize, 0usize); n2]; n2];
    for u in 0..n {
        for v in 0..n {
            let (cu, cv) = (id[u], id[v]);
            if cu == cv || !m[u][v].is_finite() {
                continue;
            }
            let w = if in_cycle[v] {
                m[u][v] - m[inn[v]][v]
            } else {
                m[u][v]
            };
            if w < m2[cu][cv] {
                m2[cu][cv] = w;
                orig[cu][cv] = (u, v);
            }
        }
    }
    let inner = solve(&m2, id[root])?;
    let mut edges = Vec::with_capacity(n - 1);
    let mut entered = usize::MAX;
    for (cu, cv) in inner {
        let (u, v) = orig[cu][cv];
        if cv == c {
            entered = v;
        }
        edges.push((u, v));
    }
    // Every cycle vertex keeps its cycle edge but the one the tree now enters by.
    for &v in &cycle {
        if v != entered {
            edges.push((inn[v], v));
        }
    }
    Some(edges)
}

/// A cycle of the functional graph `v → inn[v]` (non-root vertices), if any.
fn find_cycle(inn: &[usize], root: usize) -> Option<Vec<usize>> {
    let n = inn.len();
    let mut mark = vec![usize::MAX; n];
    for s in 0..n {
        let mut v = s;
        while v != root && mark[v] == usize::MAX {
            mark[v] = s;
            v = inn[v];
        }
        if v != root && mark[v] == s {
            let mut cycle = vec![v];
            let mut w = inn[v];
            while w != v {
                cycle.push(w);
                w = inn[w];
            }
            return Some(cycle);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cost of an arborescence given as parents.
    fn total(parent: &[Option<usize>], cost: &dyn Fn(usize, usize) -> f64) -> f64 {
        parent
            .iter()
            .enumerate()
            .filter_map(|(v, p)| p.map(|u| cost(u, v)))
            .sum()
    }

    /// Whether `parent` is a spanning arborescence rooted at `root`.
    fn is_arborescence(parent: &[Option<usize>], root: usize) -> bool {
        parent[root].is_none()
            && (0..parent.len()).all(|v| {
                let mut w = v;
                for _ in 0..parent.len() {
                    match parent[w] {
                        None => return w == root,
                        Some(u) => w = u,
                    }
                }
                false
            })
    }

    /// Brute force over every parent assignment (small `n` only).
    fn brute(n: usize, root: usize, cost: &dyn Fn(usize, usize) -> f64) -> f64 {
        let mut best = f64::INFINITY;
        let others: Vec<usize> = (0..n).filter(|&v| v != root).collect();
        let total_combos = (n as u64).pow(others.len() as u32);
        for code in 0..total_combos {
            let mut parent = vec![None; n];
            let mut c = code;
            for &v in &others {
                let u = (c % n as u64) as usize;
                c /= n as u64;
                parent[v] = Some(u);
            }
            if others.iter().any(|&v| parent[v] == Some(v)) || !is_arborescence(&parent, root) {
                continue;
            }
            best = best.min(total(&parent, cost));
        }
        best
    }

    #[test]
    fn matches_brute_force_on_random_dense_graphs() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 1000) as f64 / 10.0
        };
        for n in 2..=6 {
            for _ in 0..30 {
                let w: Vec<f64> = (0..n * n).map(|_| next()).collect();
                let cost = |u: usize, v: usize| w[u * n + v];
                for root in [0, n - 1] {
                    let parent = min_arborescence(n, root, cost).expect("complete graph");
                    assert!(is_arborescence(&parent, root));
                    let got = total(&parent, &cost);
                    let want = brute(n, root, &cost);
                    assert!(
                        (got - want).abs() < 1e-9,
                        "n={n} root={root}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn unreachable_vertices_give_none() {
        // Vertex 2 has no incoming edge.
        let cost = |_u: usize, v: usize| if v == 2 { f64::INFINITY } else { 1.0 };
        assert_eq!(min_arborescence(3, 0, cost), None);
        assert_eq!(min_arborescence(3, 3, |_, _| 1.0), None);
    }

    /// A cheap cycle away from the root must be broken where entering it costs least.
    #[test]
    fn breaks_cycles_at_the_cheapest_entry() {
        // 1 ⇄ 2 cost 1 each; root 0 → 1 costs 10, 0 → 2 costs 5.
        let cost = |u: usize, v: usize| match (u, v) {
            (1, 2) | (2, 1) => 1.0,
            (0, 1) => 10.0,
            (0, 2) => 5.0,
            _ => f64::INFINITY,
        };
        let parent = min_arborescence(3, 0, cost).unwrap();
        assert_eq!(parent, vec![None, Some(2), Some(0)]);
    }
}
