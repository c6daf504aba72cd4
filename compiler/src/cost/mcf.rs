//! The AllToAll flow bound: the maximum concurrent multi-commodity flow over the simulator's
//! routes, a linear program (`good_lp`, microlp).
//!
//! Every ordered pair of ranks must move the same amount (`M/N` bytes of an `M`-byte
//! AllToAll). A schedule moves data only in messages between ranks, each along the route the
//! simulator gives that pair, and may forward data through other ranks; so it is a flow on
//! the rank graph whose edge `a → b` occupies every resource of route `a → b`. No schedule
//! then finishes before `(M/N) / λ`, where `λ` is the largest rate every pair can be given at
//! once with flows split over any such paths within every resource's capacity. Flows are
//! aggregated by source (one commodity per source rank, delivering `λ` to every other rank),
//! which is exact for this demand. The route cuts of [`super::bounds`] are this LP's dual
//! restricted to single cuts, so the flow bound is never weaker.

use super::Network;
use good_lp::{
    Expression, IntoAffineExpression, ProblemVariables, Solution, SolverModel, Variable,
    constraint, variable,
};
use std::collections::HashMap;

impl Network {
    /// The AllToAll flow rate of this network (GB/s per ordered rank pair; see
    /// this module), solved once.
    pub fn alltoall_rate(&self) -> Option<f64> {
        *self.alltoall.get_or_init(|| alltoall_rate(self))
    }
}

/// Largest LP (sources × rank pairs) solved; larger machines keep the cut bounds alone.
pub const MAX_VARIABLES: usize = 20_000;

/// The largest rate (GB/s) every ordered pair of ranks can be given at once, or `None` when
/// the LP is too large ([`MAX_VARIABLES`]), a pair has no route, or the solver fails.
pub fn alltoall_rate(network: &Network) -> Option<f64> {
    let n = network.nranks() as usize;
    if n < 2 || n * n * (n - 1) > MAX_VARIABLES {
        return None;
    }
    let pairs: Vec<(u32, u32)> = (0..n as u32)
        .flat_map(|a| (0..n as u32).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let routes = network.routes(&pairs).ok()?;
    let mut vars = ProblemVariables::new();
    let lambda = vars.add(variable().min(0.0));
    // flow[s][p]: source s's data on rank pair p.
    let flow: Vec<Vec<Variable>> = (0..n)
        .map(|_| {
            pairs
                .iter()
                .map(|_| vars.add(variable().min(0.0)))
                .collect()
        })
        .collect();
    let model = vars.maximise(lambda).using(crate::lp::solver);
    let model = with_flow_rows(
        model,
        network,
        &pairs,
        |p| &routes[p].resources,
        &flow,
        lambda,
    );
    let solution = model.solve().ok()?;
    let rate = solution.value(lambda);
    (rate.is_finite() && rate > 0.0).then_some(rate)
}

/// The flow LP's rows over `pairs` (every ordered pair of `network`'s ranks, in order), shared
/// by the bound above and the AllToAll synthesizer (`synth::alltoall`): per resource of finite
/// capacity (ascending), the flow of every source over every pair whose route (`route(p)`,
/// its resources with multiplicity) crosses it, within the capacity; per source `s` and
/// other rank `v`, the net flow of `s`'s data into `v` equals `demand`. `flow[s][p]` is
/// source `s`'s flow on pair `p`.
pub fn with_flow_rows<'r, M, D>(
    mut model: M,
    network: &Network,
    pairs: &[(u32, u32)],
    route: impl Fn(usize) -> &'r [u32],
    flow: &[Vec<Variable>],
    demand: D,
) -> M
where
    M: SolverModel,
    D: IntoAffineExpression + Copy,
{
    let n = network.nranks() as usize;
    // Resource rows: the pairs whose route crosses each resource, with multiplicity.
    let mut rows: HashMap<u32, Vec<(usize, f64)>> = HashMap::new();
    for p in 0..pairs.len() {
        for &r in route(p) {
            let row = rows.entry(r).or_default();
            match row.last_mut() {
                Some(last) if last.0 == p => last.1 += 1.0,
                _ => row.push((p, 1.0)),
            }
        }
    }
    let mut keys: Vec<u32> = rows.keys().copied().collect();
    keys.sort_unstable();
    for r in keys {
        let cap = network.capacity[r as usize];
        if !cap.is_finite() {
            continue;
        }
        let load: Expression = rows[&r]
            .iter()
            .flat_map(|&(p, k)| flow.iter().map(move |f| k * f[p]))
            .sum();
        model = model.with(constraint!(load <= cap));
    }
    // Conservation: every rank but the source keeps `demand` of each source's data.
    for (s, f) in flow.iter().enumerate() {
        for v in (0..n).filter(|&v| v != s) {
            let mut net_in = Expression::from(0.0);
            for (p, &(a, b)) in pairs.iter().enumerate() {
                if b as usize == v {
                    net_in += f[p];
                } else if a as usize == v {
                    net_in -= f[p];
                }
            }
            model = model.with(constraint!(net_in == demand));
        }
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(spec: hccl_topologies::TopologySpec) -> Network {
        Network::new(&hccl_topologies::build(spec, "t").unwrap())
    }

    /// A 4-ring of 100 GB/s links: 8 neighbour pairs use one hop, 4 opposite pairs two (split
    /// both ways), so 16 λ ≤ 8 × 100 and λ = 50 GB/s.
    #[test]
    fn ring_of_four_gives_half_a_link_per_pair() {
        let rate = alltoall_rate(&network(hccl_topologies::generate::ring(4, 100.0, 1.0)))
            .expect("solves");
        assert!((rate - 50.0).abs() < 1e-6, "{rate}");
    }

    /// Two ranks share one link each way: the pair gets all of it.
    #[test]
    fn two_ranks_get_the_link() {
        let rate =
            alltoall_rate(&network(hccl_topologies::generate::ring(2, 40.0, 1.0))).expect("solves");
        assert!((rate - 40.0).abs() < 1e-6, "{rate}");
    }
}
