//! Latency-optimal synthesis in SCCL's model (steps, rounds, chunks), by mixed-integer
//! linear programming, and the Pareto frontier over (steps, rounds per chunk).
//!
//! **The model** (SCCL, Cai et al., PPoPP 2021). Ranks joined by directed links of
//! bandwidth `b(u, v)` chunks per round ([`LinkMatrix`]: the topology's direct
//! device-to-device links, in units of the slowest one, times the link count; pairs without a
//! direct link are not used — traffic through switches, NICs or host bridges is outside the
//! model, so a topology whose ranks only meet at a switch has no links here). An algorithm has
//! `S` steps; step `s` has `r_s ≥ 1` rounds, `R = Σ r_s`; in step `s` link `(u, v)` carries at
//! most `b(u, v)·r_s` chunks; a chunk that arrives in step `s` can be forwarded from step
//! `s + 1`. A collective over `C` chunks per buffer piece (AllGather: every rank starts with
//! `C` chunks, `n·C` in all; Broadcast: the root's `C`) then costs about `S·α + (R/C)·M·β`
//! for buffers of `M` bytes per piece: `R/C` rounds per chunk is the bandwidth cost.
//!
//! **One instance** `(S, R, C)` ([`solve_instance`]) is a feasibility MILP over binary sends
//! `x[c, u, v, s]` (chunk `c` crosses `u → v` in step `s`) and integer rounds `r_s`:
//!
//! ```text
//! Σ_{u,s} x[c,u,v,s] = 1                 every rank v that needs c (received exactly once)
//! x[c,u,v,s] ≤ Σ_{w, s'<s} x[c,w,u,s']    u ≠ origin(c): u forwards only what it holds
//! Σ_c x[c,u,v,s] ≤ b(u,v)·r_s             link capacity in step s
//! Σ_s r_s = R,  1 ≤ r_s                   the rounds split is part of the search
//! ```
//!
//! Possession is implicit (a rank holds `c` from the step after it receives it); a chunk is
//! never sent twice to one rank; sends from a rank that cannot hold the chunk yet (hop
//! distance from its origin ≥ s) are not variables at all. The solves, cheapest first
//! ([`solve_base`]):
//!
//! 1. the **relaxation**: chunks of one origin are interchangeable, so their sends are summed
//!    into integer counts `y[o, u, v, s]` (the same constraints summed over the origin's
//!    chunks). Every algorithm gives a solution of it, so its infeasibility proves the
//!    instance infeasible. It runs once with the rounds split free, then once per split
//!    `r_1 + … + r_S = R` (balanced splits first), each split it refutes is proven
//!    impossible; an instance whose every split is refuted is proven infeasible;
//! 2. per split left, a **dive** over the **symmetric** per-chunk model: with automorphisms
//!    `π_o` of the link matrix taking a representative origin `ρ` to every origin `o` of its
//!    orbit ([`automorphisms`]; on DGX-1 two orbits of four), only the representatives'
//!    chunks are variables, chunk `k` of `o` follows `π_o` of the path of chunk `k` of `ρ`,
//!    and the capacities sum over the images. The dive solves its LP, fixes the largest
//!    fractional send to 1 (to 0 when that makes the LP infeasible) and repeats until the LP
//!    is integral: an algorithm, checked against the model ([`Algorithm::check`]). A dive that
//!    dies proves nothing (microlp's own branch and bound on this model runs past a minute
//!    for DGX-1's 3-step instance; the dive takes half a second);
//! 3. per split still left, the aggregate over the representatives and its decomposition into
//!    chunks, origin by origin (a small MILP per origin within the aggregate's sends, else
//!    within what the others leave of the links);
//! 4. the **exact** per-chunk model over every split, with the time left.
//!
//! Chunks of one origin are ordered by the sum of their send steps (symmetry breaking).
//! Every solve has a time limit; a call that runs out reports [`Stop::TimeLimit`] (microlp
//! reports no bound for a feasibility problem, so no gap is known).
//!
//! **The frontier** ([`pareto`]): for `S` from the least possible (the largest hop distance
//! a chunk must travel) to `max_steps`, instances `(R, C)` with `C ≤ max_chunks` in
//! increasing `R/C` (then `C`), skipping ratios below the proven bound ([`bandwidth_bound`]:
//! for every set `X` of ranks, the chunks that must enter `X` over its inbound capacity and
//! those that must leave it over its outbound) and ratios no better than the last point; the
//! first feasible one is a point. It stops when `R/C` meets the bound.
//!
//! **Combining collectives** by SCCL's duality: a ReduceScatter (Reduce) is an AllGather
//! (Broadcast) over the transposed links run backwards ([`Algorithm::reversed`]): every send
//! `u → v` in step `s` becomes `v → u` in step `S + 1 − s`, and a received chunk is added to
//! the receiver's contribution instead of copied.
//!
//! [`lower`] turns an algorithm into a chunk schedule: step-major sends, one IR chunk per
//! algorithm chunk, runs of consecutive chunks on one link in one step as one message (a
//! step with `r_s` rounds moves up to `b·r_s` chunks per link, which is what the simulator
//! then prices).

mod decompose;
mod dive;
mod frontier;
mod model;
mod problem;
mod solve;

pub use frontier::{
    Frontier, MilpFrontier, ParetoOptions, ParetoPoint, SEARCH_MAX_RANKS, cached_pareto,
    candidates, lower, lower_allreduce, needs_frontier, pareto, prime, prime_in, record,
    solve_instance,
};
pub use problem::{
    Algorithm, Instance, LinkMatrix, MAX_CHUNKS, MAX_RANKS, MAX_ROUNDS, MAX_STEPS, Perm, Ratio,
    Solved, Stop, Transfer, automorphisms, bandwidth_bound, cut_bound, least_steps, origins_of,
};
pub use solve::{compositions, solve_base};
