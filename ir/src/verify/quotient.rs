//! Verification of a rank-symmetric schedule on its template alone ([`verify_symmetric`]).
//!
//! A [`SymmetricSchedule`] stores one program (the template, run by the rank at grid
//! position 0) and a translation group; rank `P` runs the template translated by `P`'s
//! coordinates ([`crate::symmetric`]). Expanding it costs `nranks` programs; this verifier
//! proves the same properties as [`super::verify`] on the expansion from the template and the
//! group alone, so its time and memory grow with one rank's program (plus the lane check
//! below, which grows with the ranks times the chunks of the template's multi-block runs).
//!
//! # Why one program suffices
//!
//! *Matching and deadlock.* The template's connection `(r0 → p', channel)` is, translated, every
//! rank's connection to its peer at the same relative offset; the rank at position `Q` sends
//! to `r0` exactly the translate of the template's sends to `p'` with `p' ⊕ Q = 0`. So the
//! template's receives from `q` pair with its own sends to `p' = rank at (−pos(q))` (k-th with
//! k-th, counts equal), and one quotient connection stands for all `nranks` translates. The
//! wait-for graph of the expansion (program order, dependencies, send → receive and
//! receive → the send that reuses its slot) covers the template's wait-for graph: a cycle
//! in one projects to, or lifts to, a cycle in the other. So the expansion deadlocks iff the
//! quotient run (the template, its receives fed by its own sends) stops early; since it is
//! a bounded Kahn network as in [`super`], one run decides it. That run is the expansion's
//! *lockstep* run (every rank runs step `i` together), so message depths agree too.
//!
//! *Values.* Invariant: rank `P`'s slot `φ_P(c)` holds the translate `t_P` of the template's
//! slot `c` (φ moves chunks of mapped buffers, `t_P` moves a value's origin chunk and
//! renames its contributor ranks). A run in a mapped buffer becomes, on rank `P`, the least
//! image of its chunks, read in buffer order: so rank `P` reads lane `i` of its run from
//! template lane `ρ_P⁻¹(i)`, where `ρ_P` is the lane permutation the translation induces on
//! the run. The invariant survives every step iff, for every rank `P` (the *lane check*):
//! 1. every mapped run's image is contiguous (else the least-image run reads other chunks);
//! 2. a step's operands (source, destination, the message it receives or sends) share one
//!    lane order `L_step(P)`;
//! 3. a message from template send `s` to template receive `r` (from the peer at `Q`)
//!    satisfies `L_s(P ⊕ Q) = L_r(P) ∘ L_s(Q)`: the sender of rank `P`, at `P ⊕ Q`, orders
//!    the lanes as `P`'s receive expects them.
//!
//! Since translations compose (`t_{P⊕Q} = t_P ∘ t_Q`), condition 3 is checked as
//! `L_{a'}(P) = L_r(P)` with `a' = t_Q(a)` the sender's run moved to the peer: every check
//! is then under the one translation `P`, so the lane check builds one lookup table per rank
//! ([`SymmetryTable::memo_for_runs`]) and reads every run's chunks from it.
//!
//! *Lanes by orbits.* Rank by rank, the lane check costs the ranks times the chunks of every
//! checked run, which on tens of thousands of ranks is billions for the long runs of
//! halving and doubling. A check that two runs `a`, `b` (or one lone run) keep contiguous
//! images and one lane order under every translation is decided instead on the orbit of
//! the pair: for every generator `g` and every pair `(a', b')` reachable from `(a, b)` by
//! generators, `a'` and `b'` have contiguous images and `L_{a'}(g) = L_{b'}(g)`. That
//! suffices: writing `P = g ⊕ Q`, `L_a(g ⊕ Q) = L_{t_Q(a)}(g) ∘ L_a(Q)` (translations
//! compose), and likewise for `b`, so by induction on `Q` the two orders agree for every
//! `P`, and images stay contiguous since `t_Q(a)` is one of the runs checked. The orbit of a
//! run of `2^k` blocks under XOR translations has `nranks / 2^k` pairs, so long runs cost
//! little; a check whose orbit grows past a quarter of `nranks` over the generators' count
//! (short runs) or that fails there (to name the first failing rank) is checked rank by
//! rank.
//!
//! Under these the quotient run computes rank `r0`'s values exactly: a message received from
//! `q` is the template's message translated by `pos(q)` with its lanes put in `L_s(pos(q))`
//! order. The postcondition is then checked on `r0`; it holds on every rank when the
//! collective's expected result is itself carried along by the translations (the
//! *covariance* check: AllGather, ReduceScatter and AllToAll need every translation to move
//! rank `j`'s block to the translated rank's, offsets kept; generators suffice, since
//! translations compose). Rooted collectives have no rank symmetry.
//!
//! *Races* are checked on the template's streams with their vector clocks, as in the full
//! verifier: they concern one rank's own streams and, by the lane check, the template's
//! runs overlap iff their translates do.
//!
//! Errors name template steps (rank `r0`); [`ErrorKind::Symmetry`] names a failed lane or
//! covariance check. The expanded verifier stays the oracle: tests compare both verdicts on
//! every symmetric schedule the compiler's families emit and on mutated templates.

use super::sim::{self, Quot};
use super::structure::{self, ConnInfo, Ends, Layout};
use super::{ErrorKind, Report, Sink, VerifyError};
use crate::dag::StepNumbering;
use crate::schedule::{Collective, Loc, Op, RankProgram, Schedule};
use crate::symmetric::{SymmetricSchedule, SymmetryTable, Translation};
use rustc_hash::FxHashSet;

/// Most chunk translations the lane check may spend (the sum over the checks it needs of the
/// run's chunks times the ranks); past it, [`verify_symmetric`] reports
/// [`ErrorKind::Limit`].
pub const MAX_LANE_WORK: u64 = 1 << 30;

/// Verifies a rank-symmetric schedule from its template: the verdict of
/// [`super::verify_report`] on [`SymmetricSchedule::expand`], without expanding (see the
/// module docs). The report counts as the expansion would (every rank's streams, steps,
/// connections and messages).
pub fn verify_symmetric(s: &SymmetricSchedule) -> Result<Report, Vec<VerifyError>> {
    verify_with(s, false)
}

/// [`verify_symmetric`] with every lane check tried on its orbit first, however short its
/// runs and however large its orbit (see the module docs, *Lanes by orbits*): the same
/// verdict, by the other way; what tests compare.
#[doc(hidden)]
pub fn verify_symmetric_by_orbits(s: &SymmetricSchedule) -> Result<Report, Vec<VerifyError>> {
    verify_with(s, true)
}

fn verify_with(s: &SymmetricSchedule, all_orbits: bool) -> Result<Report, Vec<VerifyError>> {
    let mut sink = Sink::default();
    let header = |sink: &mut Sink, kind: ErrorKind, message: String| {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind,
            message,
        })
    };
    let table = match s.table() {
        Ok(t) => t,
        Err(e) => {
            header(&mut sink, ErrorKind::Header, format!("symmetry: {e}"));
            return Err(sink.finish().err().unwrap_or_default());
        }
    };
    let n = s.nranks;
    let r0 = s.symmetry.ranks[0];
    if n > 1
        && matches!(
            s.collective,
            Collective::Broadcast { .. } | Collective::Reduce { .. }
        )
    {
        header(
            &mut sink,
            ErrorKind::Symmetry,
            format!(
                "{} has a root, which no translation of {n} ranks keeps in place",
                s.collective
            ),
        );
        return Err(sink.finish().err().unwrap_or_default());
    }
    let sparse = sparse_schedule(s, r0);
    structure::check_header(&sparse, &mut sink);
    if sink.total() == 0 {
        structure::check_limits(&sparse, Some(r0), &mut sink);
    }
    if sink.total() == 0 {
        check_covariance(s, &table, &mut sink);
    }
    if sink.total() > 0 {
        return Err(sink.finish().err().unwrap_or_default());
    }
    let Some((layout, sends, recvs)) = quotient_layout(&sparse, &table, r0, &mut sink) else {
        return Err(sink.finish().err().unwrap_or_default());
    };
    check_lanes(s, &table, &layout, &sends, &recvs, all_orbits, &mut sink);
    if sink.total() > 0 {
        return Err(sink.finish().err().unwrap_or_default());
    }
    let quot = Quot {
        table: &table,
        rank: r0,
    };
    let stats = sim::simulate(&sparse, &layout, &mut sink, false, Some(quot));
    sink.finish()?;
    let per = u64::from(n);
    Ok(Report {
        ranks: n,
        streams: s.template.streams.len() * n as usize,
        steps: s.template_step_count() * n as usize,
        connections: layout.conns.len() * n as usize,
        messages: stats.messages * per,
        chunks_sent: stats.chunks_sent * per,
        reductions: stats.reductions * per,
        depth: stats.depth,
    })
}

/// The size limits of [`verify_symmetric`]: the header, then the template's buffers, work
/// and clocks against [`super::MAX_SLOTS`], [`super::MAX_WORK`] and [`super::MAX_CLOCKS`]
/// (one rank's worth: the symmetric verifier models one rank). The lane check's own limit
/// ([`MAX_LANE_WORK`]) is checked when it runs.
pub fn check_limits_symmetric(s: &SymmetricSchedule) -> Result<(), Vec<VerifyError>> {
    let mut sink = Sink::default();
    let Some(&r0) = s.symmetry.ranks.first().filter(|&&r| r < s.nranks) else {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Header,
            message: "symmetry: the grid names no rank of the schedule".to_string(),
        });
        return sink.finish();
    };
    let sparse = sparse_schedule(s, r0);
    structure::check_header(&sparse, &mut sink);
    if sink.total() == 0 {
        structure::check_limits(&sparse, Some(r0), &mut sink);
    }
    sink.finish()
}

/// The schedule with the template as `r0`'s program and every other program empty.
fn sparse_schedule(s: &SymmetricSchedule, r0: u32) -> Schedule {
    let empty = RankProgram {
        scratch_chunks: 0,
        streams: Vec::new(),
    };
    let mut ranks = vec![empty; s.nranks as usize];
    ranks[r0 as usize] = s.template.clone();
    Schedule::from_header(s.header(), ranks)
}

/// The template's own connections: its sends to `p'` on a channel pair with its receives
/// from the rank at `−pos(p')` on that channel. Returns the layout and each connection's
/// sends and receives (global stream, step, count).
fn quotient_layout(
    sparse: &Schedule,
    table: &SymmetryTable,
    r0: u32,
    sink: &mut Sink,
) -> Option<(Layout, Vec<Ends>, Vec<Ends>)> {
    let before = sink.total();
    structure::check_rank_program(sparse, r0, sink);
    let n = sparse.nranks;
    let prog = &sparse.ranks[r0 as usize];
    let streams = StepNumbering::of(sparse)
        .map_err(|e| structure::too_large(e, sink))
        .ok()?;
    let mut layout = Layout {
        streams,
        ..Layout::default()
    };
    // The rank at −pos(r): whose translated sends reach r0 as the template's sends to r.
    let partner = |r: u32| {
        table
            .position_of(r)
            .and_then(|p| table.rank_at(table.inverse_position(p)))
    };
    let base = layout.streams.stream_base(r0);
    let mut sends: Vec<Ends> = Vec::new();
    let mut recvs: Vec<Ends> = Vec::new();
    let mut sender_of: Vec<Option<usize>> = Vec::new();
    let mut receiver_of: Vec<Option<usize>> = Vec::new();
    for (si, st) in prog.streams.iter().enumerate() {
        let gs = base + si;
        for (idx, step) in st.steps.iter().enumerate() {
            let ends = [
                (step.op.send_peer().map(|to| (to, to)), true),
                (
                    step.op
                        .recv_peer()
                        .and_then(|from| partner(from).map(|p| (p, from))),
                    false,
                ),
            ];
            for (end, is_send) in ends {
                let Some((to, from)) = end else { continue };
                if to >= n || to == r0 || from >= n || from == r0 {
                    continue; // reported by the rank's own checks
                }
                let key = (r0, to, st.channel);
                let next = layout.conns.len() as u32;
                let ci = *layout.conn_index.entry(key).or_insert(next) as usize;
                if ci == layout.conns.len() {
                    let Some(recv_from) = partner(to) else {
                        continue;
                    };
                    layout.conns.push(ConnInfo {
                        key,
                        recv_from,
                        sender: usize::MAX,
                        receiver: usize::MAX,
                    });
                    layout
                        .conn_index
                        .insert((recv_from, r0, st.channel), ci as u32);
                    sends.push(Vec::new());
                    recvs.push(Vec::new());
                    sender_of.push(None);
                    receiver_of.push(None);
                }
                if is_send {
                    sender_of[ci] = Some(gs);
                    sends[ci].push((gs, idx, step.count));
                } else {
                    receiver_of[ci] = Some(gs);
                    recvs[ci].push((gs, idx, step.count));
                }
            }
        }
    }
    structure::match_ends(&mut layout, &sends, &recvs, &sender_of, &receiver_of, sink);
    (sink.total() == before).then_some((layout, sends, recvs))
}

/// The translations carry the collective's expected result along: for AllGather,
/// ReduceScatter and AllToAll, every generator moves rank `j`'s block (chunks `j·k ..`) to
/// the translated rank's block, keeping offsets within it.
fn check_covariance(s: &SymmetricSchedule, table: &SymmetryTable, sink: &mut Sink) {
    let n = s.nranks;
    if n < 2
        || !matches!(
            s.collective,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll
        )
    {
        return;
    }
    let k = s.chunks / n;
    for g in table.generators() {
        let Some(t) = table.translation(g) else {
            continue;
        };
        for c in 0..s.chunks {
            let img = t.origin(c);
            let owner = t.rank(c / k);
            if img / k != owner || img % k != c % k {
                sink.push(VerifyError {
                    at: None,
                    channel: None,
                    kind: ErrorKind::Symmetry,
                    message: format!(
                        "the translation by grid position {g} moves chunk {c} (rank {}'s block) to chunk {img}, but it moves rank {} to rank {owner}: the translated ranks would not compute their {} results",
                        c / k,
                        c / k,
                        s.collective
                    ),
                });
                return;
            }
        }
    }
}

/// The lane order of a run under the translation `t` (memoised or not): lane `i` of the
/// template's run is lane `out[i]` of the translated rank's (the least image, in buffer
/// order). `None` when the run does not move (unmapped buffer, one chunk, or a translation
/// that shifts it whole); `Err` when its image is not contiguous.
fn lanes_by(
    table: &SymmetryTable,
    t: &Translation<'_>,
    run: Loc,
    count: u32,
) -> Result<Option<Vec<u32>>, ()> {
    if count <= 1 || !table.maps(run.buf) {
        return Ok(None);
    }
    let least = t.loc(run, count).off;
    let mut out = Vec::with_capacity(count as usize);
    let mut seen = vec![false; count as usize];
    let mut shift = true;
    for i in 0..count {
        let lane = t.slot(run.buf, run.off + i).wrapping_sub(least);
        match seen.get_mut(lane as usize) {
            Some(s) if !*s => *s = true,
            _ => return Err(()),
        }
        shift &= lane == i;
        out.push(lane);
    }
    Ok((!shift).then_some(out))
}

/// `a == b` for lane orders, `None` being the identity.
fn same(a: &Option<Vec<u32>>, b: &Option<Vec<u32>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), None) | (None, Some(x)) => x.iter().enumerate().all(|(i, &l)| l == i as u32),
        (Some(x), Some(y)) => x == y,
    }
}

/// Whether the runs `a` and `b` (`None`: a lone operand) of `count` chunks have a contiguous
/// image and one lane order under every translation, decided on the orbit of the pair under
/// the generators `gens` instead of rank by rank (see the module docs, *Lanes by orbits*):
/// `Some(true)` when every pair of the orbit passes under every generator, `Some(false)` at
/// the first that fails, `None` once the orbit holds more than `cap` pairs (the caller then
/// checks rank by rank).
fn orbit_check(
    table: &SymmetryTable,
    gens: &[Translation<'_>],
    a: Loc,
    b: Option<Loc>,
    count: u32,
    cap: usize,
) -> Option<bool> {
    let mut seen: FxHashSet<(Loc, Option<Loc>)> = FxHashSet::default();
    seen.insert((a, b));
    let mut stack = vec![(a, b)];
    while let Some((x, y)) = stack.pop() {
        for t in gens {
            let lx = lanes_by(table, t, x, count);
            let ly = y.map(|y| lanes_by(table, t, y, count));
            match (lx, ly) {
                (Err(()), _) | (_, Some(Err(()))) => return Some(false),
                (Ok(lx), Some(Ok(ly))) if !same(&lx, &ly) => return Some(false),
                _ => {}
            }
            let next = (t.loc(x, count), y.map(|y| t.loc(y, count)));
            if seen.insert(next) {
                if seen.len() > cap {
                    return None;
                }
                stack.push(next);
            }
        }
    }
    Some(true)
}

/// Whether translations can reorder a run: only when it is in a mapped buffer and has two
/// chunks or more.
fn moving(table: &SymmetryTable, run: Loc, count: u32) -> bool {
    count > 1 && table.maps(run.buf)
}

/// The run whose chunk order a step's message follows (its source, else its destination).
fn lane_run(op: &Op) -> Option<Loc> {
    op.src().or(op.dst())
}

/// The lane check of the module docs (conditions 1-3), over every rank: the distinct checks
/// of steps and messages, those decided on their orbits, then the rest rank by rank.
fn check_lanes(
    s: &SymmetricSchedule,
    table: &SymmetryTable,
    layout: &Layout,
    sends: &[Ends],
    recvs: &[Ends],
    all_orbits: bool,
    sink: &mut Sink,
) {
    let n = s.nranks as usize;
    let prog = &s.template;
    let r0 = s.symmetry.ranks[0];
    let mut first = step_checks(prog, table);
    let mut msgs = message_checks(s, table, layout, sends, recvs);
    // Checks decided on their orbits under the generators (long runs have small orbits:
    // the translations that only reorder a run inside itself fix it); the others, and any
    // that fails there (to name the first failing rank), are checked rank by rank below.
    let gens: Vec<Translation<'_>> = table
        .generators()
        .into_iter()
        .filter_map(|g| table.translation(g))
        .collect();
    let cap = if all_orbits {
        usize::MAX
    } else {
        n / (4 * gens.len().max(1))
    };
    let by_orbit = |a: Loc, b: Option<Loc>, count: u32| {
        (all_orbits || count as usize > 4 * gens.len())
            && orbit_check(table, &gens, a, b, count, cap) == Some(true)
    };
    first.retain(|&(si, ti)| {
        let step = &prog.streams[si].steps[ti];
        let (a, b) = match (step.op.src(), step.op.dst()) {
            (Some(a), b) => (a, b),
            (None, Some(b)) => (b, None),
            (None, None) => return true, // nothing to check; never keyed
        };
        !by_orbit(a, b, step.count)
    });
    msgs.retain(|&(_, _, a2, b, count)| !by_orbit(a2, Some(b), count));
    let work: u64 = first
        .iter()
        .map(|&(si, ti)| {
            let step = &prog.streams[si].steps[ti];
            let operands = u64::from(step.op.src().is_some()) + u64::from(step.op.dst().is_some());
            u64::from(step.count) * operands
        })
        .chain(msgs.iter().map(|m| 2 * u64::from(m.4)))
        .sum::<u64>()
        .saturating_mul(n as u64);
    if work > MAX_LANE_WORK {
        sink.push(VerifyError {
            at: None,
            channel: None,
            kind: ErrorKind::Limit,
            message: format!(
                "the lane check would translate {work} chunks (runs of several blocks, over {n} ranks), more than the verifier allows ({MAX_LANE_WORK})"
            ),
        });
        return;
    }
    let (step_problem, msg_problem) = rank_by_rank(prog, table, n, &first, &msgs);
    let place = |si: usize, ti: usize| (r0, si as u32, ti, prog.streams[si].channel);
    for (&(si, ti), problem) in first.iter().zip(step_problem) {
        if let Some(p) = problem {
            structure::step_error(sink, place(si, ti), ErrorKind::Symmetry, p);
        }
    }
    for (&(ri, rj, _, _, _), problem) in msgs.iter().zip(msg_problem) {
        if let Some(pos) = problem {
            let from = prog.streams[ri].steps[rj].op.recv_peer().unwrap_or(r0);
            structure::step_error(
                sink,
                place(ri, rj),
                ErrorKind::Symmetry,
                format!(
                    "on the rank at grid position {pos}, the message from rank {from}'s translate arrives in another chunk order than this receive's run takes it (the translations permute the sending and receiving runs inconsistently)"
                ),
            );
        }
    }
}

/// The template's steps to check (stream, step): the first of each distinct key of runs
/// that can reorder, so that every operand run stays contiguous and source and destination
/// keep one order.
fn step_checks(prog: &RankProgram, table: &SymmetryTable) -> Vec<(usize, usize)> {
    let mut runs: FxHashSet<(Loc, Option<Loc>, u32)> = FxHashSet::default();
    let mut first: Vec<(usize, usize)> = Vec::new();
    for (si, st) in prog.streams.iter().enumerate() {
        for (ti, step) in st.steps.iter().enumerate() {
            let (src, dst) = (step.op.src(), step.op.dst());
            let class = |r: Loc| table.lane_class(r, step.count);
            let moves = |r: Loc| moving(table, r, step.count);
            let key = match (src, dst) {
                (Some(a), Some(b)) if moves(a) || moves(b) => {
                    (class(a), Some(class(b)), step.count)
                }
                (Some(a), _) | (None, Some(a)) if moves(a) => (class(a), None, step.count),
                _ => continue,
            };
            if runs.insert(key) {
                first.push((si, ti));
            }
        }
    }
    first
}

/// The template's messages to check, the first of each distinct key (sender's lane run,
/// receiver's lane run, the sender's position, count), as (receiving stream, step, the
/// sender's run translated by the sender's position, the receiver's run, count).
fn message_checks(
    s: &SymmetricSchedule,
    table: &SymmetryTable,
    layout: &Layout,
    sends: &[Ends],
    recvs: &[Ends],
) -> Vec<(usize, usize, Loc, Loc, u32)> {
    let prog = &s.template;
    let mut messages: FxHashSet<(Loc, Loc, usize, u32)> = FxHashSet::default();
    let mut msg_first: Vec<(usize, usize, usize, usize)> = Vec::new();
    let base = layout.streams.stream_base(s.symmetry.ranks[0]);
    for (ci, conn) in layout.conns.iter().enumerate() {
        let Some(q) = table.position_of(conn.recv_from) else {
            continue;
        };
        for (&(sg, sidx, count), &(rg, ridx, _)) in sends[ci].iter().zip(&recvs[ci]) {
            let sstep = &prog.streams[sg - base].steps[sidx];
            let rstep = &prog.streams[rg - base].steps[ridx];
            let (Some(a), Some(b)) = (lane_run(&sstep.op), lane_run(&rstep.op)) else {
                continue;
            };
            if !moving(table, a, count) && !moving(table, b, count) {
                continue;
            }
            let key = (
                table.lane_class(a, count),
                table.lane_class(b, count),
                q,
                count,
            );
            if messages.insert(key) {
                msg_first.push((sg - base, sidx, rg - base, ridx));
            }
        }
    }
    // Condition 3 with one translation: when the sender's run `a` moves under the peer's
    // translation `Q` to the contiguous run `a' = t_Q(a)` in lane order `L_s(Q)`, then
    // `t_{P⊕Q} = t_P ∘ t_Q` (the group is abelian) gives `L_s(P ⊕ Q) = L_{a'}(P) ∘ L_s(Q)`,
    // so `L_s(P ⊕ Q) = L_r(P) ∘ L_s(Q)` holds iff `L_{a'}(P) = L_r(P)`: every check below is
    // under the one translation `P`, and one memo per rank serves them all.
    let mut msgs: Vec<(usize, usize, Loc, Loc, u32)> = Vec::with_capacity(msg_first.len());
    for &(si, ti, ri, rj) in &msg_first {
        let sstep = &prog.streams[si].steps[ti];
        let rstep = &prog.streams[ri].steps[rj];
        let (Some(a), Some(b)) = (lane_run(&sstep.op), lane_run(&rstep.op)) else {
            continue;
        };
        let Some(from) = rstep.op.recv_peer() else {
            continue;
        };
        let (Some(q), count) = (table.position_of(from), rstep.count) else {
            continue;
        };
        let Some(tq) = table.translation(q) else {
            continue;
        };
        if lanes_by(table, &tq, a, count).is_err() {
            continue; // reported by the step check
        }
        msgs.push((ri, rj, tq.loc(a, count), b, count));
    }
    msgs
}

/// The step and message checks on every rank in turn: per check, the first failing rank's
/// problem (a check stops at its first failure).
fn rank_by_rank(
    prog: &RankProgram,
    table: &SymmetryTable,
    n: usize,
    first: &[(usize, usize)],
    msgs: &[(usize, usize, Loc, Loc, u32)],
) -> (Vec<Option<String>>, Vec<Option<usize>>) {
    let mut step_problem: Vec<Option<String>> = vec![None; first.len()];
    let mut msg_problem: Vec<Option<usize>> = vec![None; msgs.len()];
    let mut msg_done = vec![false; msgs.len()];
    let mut open = first.len() + msgs.len();
    let counts: Vec<u32> = first
        .iter()
        .map(|&(si, ti)| prog.streams[si].steps[ti].count)
        .chain(msgs.iter().map(|m| m.4))
        .collect();
    for pos in 1..n {
        if open == 0 {
            break;
        }
        let Some(memo) = table.memo_for_runs(pos, counts.iter().copied()) else {
            break;
        };
        let Some(t) = table.translation_with(&memo) else {
            break;
        };
        for (k, &(si, ti)) in first.iter().enumerate() {
            if step_problem[k].is_some() {
                continue;
            }
            let step = &prog.streams[si].steps[ti];
            let (src, dst) = (step.op.src(), step.op.dst());
            let a = src.map(|r| lanes_by(table, &t, r, step.count));
            let b = dst.map(|r| lanes_by(table, &t, r, step.count));
            step_problem[k] = match (a, b) {
                (Some(Err(())), _) => Some(format!(
                    "its source run's image on the rank at grid position {pos} is not contiguous"
                )),
                (_, Some(Err(()))) => Some(format!(
                    "its destination run's image on the rank at grid position {pos} is not contiguous"
                )),
                (Some(Ok(a)), Some(Ok(b))) if !same(&a, &b) => Some(format!(
                    "the rank at grid position {pos} reads its source and writes its destination in different chunk orders (the translation permutes the two runs differently)"
                )),
                _ => None,
            };
            if step_problem[k].is_some() {
                open -= 1;
            }
        }
        for (k, &(_, _, a2, b, count)) in msgs.iter().enumerate() {
            if msg_done[k] {
                continue;
            }
            match (
                lanes_by(table, &t, a2, count),
                lanes_by(table, &t, b, count),
            ) {
                (Ok(ls), Ok(lr)) => {
                    if !same(&ls, &lr) {
                        msg_problem[k] = Some(pos);
                        msg_done[k] = true;
                        open -= 1;
                    }
                }
                // Not contiguous: the step check reports it.
                _ => {
                    msg_done[k] = true;
                    open -= 1;
                }
            }
        }
    }
    (step_problem, msg_problem)
}
