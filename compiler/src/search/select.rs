//! The select-and-verify phase: the winner at every size, verified; a winner that fails
//! is dropped and the sizes it won are decided again.

use super::context::{Costed, Search};
use super::options::SearchError;
use super::par::par_map;
use hccl_ir::CollectiveKind;

/// What the phase decided: every size's winner `(candidate, protocol)`, or the collective
/// has none (`Err`: the error to skip it with or fail on), with how many candidates were
/// verified and how many of them failed.
pub(super) struct Selection {
    pub(super) winners: Result<Vec<(usize, usize)>, SearchError>,
    pub(super) verified: usize,
    pub(super) failed: usize,
    /// Sizes no verified candidate covers.
    pub(super) uncovered: usize,
}

/// The select-and-verify phase for `kind` over `costed`. An error when a size is below the
/// least size of every selectable candidate (an option the user can change).
pub(super) fn select_and_verify(
    search: &Search<'_>,
    kind: CollectiveKind,
    costed: &mut [Costed],
) -> Result<Selection, SearchError> {
    let sizes = &search.sizes;
    let (mut verified, mut failed) = (0, 0);
    // Winners per size, re-deciding when a winner fails verification.
    let winners = loop {
        let winners = pick_winners(costed, sizes, search.options.protocols.len());
        let mut todo: Vec<usize> = winners
            .iter()
            .flatten()
            .map(|&(c, _)| c)
            .filter(|&c| costed[c].verified.is_none())
            .collect();
        todo.sort_unstable();
        todo.dedup();
        let results = par_map(&todo, |&c| costed[c].candidate.verify().is_ok());
        let mut all_ok = true;
        for (&c, ok) in todo.iter().zip(results) {
            costed[c].verified = Some(ok);
            all_ok &= ok;
            verified += 1;
            failed += usize::from(!ok);
        }
        if all_ok {
            break winners;
        }
    };
    if let Some(si) = winners.iter().position(Option::is_none) {
        // A size below the least size of every selectable candidate (deep synthesized
        // pipelines start at some size) is an option the user can change.
        let bytes = sizes[si];
        let selectable: Vec<&Costed> = costed.iter().filter(|c| c.selectable).collect();
        if !selectable.is_empty() && selectable.iter().all(|c| c.candidate.min_bytes > bytes) {
            let least = selectable
                .iter()
                .map(|c| c.candidate.min_bytes)
                .min()
                .unwrap_or(0);
            return Err(SearchError::BadOptions(format!(
                "{kind} at {bytes} B: every allowed candidate starts at a larger size (the \
                 least at {least} B); allow more algorithms (--algo) or start --sizes there"
            )));
        }
    }
    let uncovered = winners.iter().filter(|w| w.is_none()).count();
    let winners = winners
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| SearchError::NoCandidate {
            collective: kind,
            topology: search.topo.name.clone(),
            tried: costed.len(),
        });
    Ok(Selection {
        winners,
        verified,
        failed,
        uncovered,
    })
}

/// How much faster than the best so far a later `(candidate, protocol)` must be to win
/// (relative): the simulator's times carry rounding (a time had on the line between two
/// runs, [`super::costing`], differs from its run's in the last bits), and of two equally
/// fast schedules the earlier (the simpler, of one family) is kept.
pub(super) const TIE: f64 = 1e-12;

/// Best `(candidate, protocol)` per size among selectable, not-rejected candidates: the
/// first of those within [`TIE`] of the fastest.
fn pick_winners(
    costed: &[Costed],
    sizes: &[u64],
    nprotocols: usize,
) -> Vec<Option<(usize, usize)>> {
    (0..sizes.len())
        .map(|si| winner_at(costed, si, nprotocols).map(|(_, c, p)| (c, p)))
        .collect()
}

/// The winner at size index `si` as [`pick_winners`] picks it: `(time µs, candidate,
/// protocol)`.
pub(super) fn winner_at(
    costed: &[Costed],
    si: usize,
    nprotocols: usize,
) -> Option<(f64, usize, usize)> {
    let mut best: Option<(f64, usize, usize)> = None;
    for (c, costed) in costed.iter().enumerate() {
        if !costed.selectable || costed.verified == Some(false) {
            continue;
        }
        for p in 0..nprotocols {
            let Some(t) = costed.times[p].as_ref().map(|t| t[si]) else {
                continue;
            };
            if t.is_finite() && best.is_none_or(|(bt, _, _)| t < bt - bt.abs() * TIE) {
                best = Some((t, c, p));
            }
        }
    }
    best
}
