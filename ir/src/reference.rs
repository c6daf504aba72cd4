//! The result a collective must produce from given inputs: the one reference the tests of
//! every crate compare against (the verifier proves it symbolically, see [`crate::verify`]).
//!
//! Inputs and outputs are *logical*: `inputs[r]` is what rank `r` contributes (for AllGather
//! its block, for every other collective the whole buffer), an output is what a rank's
//! output buffer holds afterwards, whatever the buffers' placement (in place or not).
//! Element types and the reduction are the caller's: a reduction folds the inputs in rank
//! order, starting from rank 0's, with `combine(acc, x)` (`acc ← acc ⊕ x` elementwise), then
//! applies `finish(acc)` once (an average divides by the rank count; most reductions do
//! nothing). Callers that compare bit for bit get the order they must reproduce.

use crate::schedule::Collective;

/// Every rank's expected output (indexed by rank), `None` where the collective promises
/// nothing (Reduce's ranks other than the root). The reduction runs at most once.
///
/// With `n = inputs.len()` ranks: AllReduce gives every rank the reduction; Reduce gives it
/// to the root; ReduceScatter gives rank `r` block `r` of it (blocks of `len / n`
/// elements); Broadcast gives every rank the root's input; AllGather gives every rank the
/// inputs concatenated in rank order; AllToAll gives rank `r` block `r` of every rank's
/// input, in rank order. Returns nothing for no ranks.
pub fn expected<T: Clone>(
    collective: Collective,
    inputs: &[Vec<T>],
    combine: impl Fn(&mut [T], &[T]),
    finish: impl Fn(&mut [T]),
) -> Vec<Option<Vec<T>>> {
    let reduced = (collective.kind().reduces() && !inputs.is_empty())
        .then(|| reduce(inputs, &combine, &finish));
    let reduced = reduced.as_deref().unwrap_or(&[]);
    (0..inputs.len())
        .map(|r| rank_output(collective, inputs, r, reduced))
        .collect()
}

/// Rank `rank`'s expected output ([`expected`] for one rank): reduces only when that rank's
/// output needs it.
pub fn expected_rank<T: Clone>(
    collective: Collective,
    inputs: &[Vec<T>],
    rank: usize,
    combine: impl Fn(&mut [T], &[T]),
    finish: impl Fn(&mut [T]),
) -> Option<Vec<T>> {
    if rank >= inputs.len() {
        return None;
    }
    let needs = match collective {
        Collective::Reduce { root } => root as usize == rank,
        c => c.kind().reduces(),
    };
    let reduced = needs.then(|| reduce(inputs, &combine, &finish));
    rank_output(collective, inputs, rank, reduced.as_deref().unwrap_or(&[]))
}

/// The inputs (at least one) folded in rank order, then finished.
fn reduce<T: Clone>(
    inputs: &[Vec<T>],
    combine: &impl Fn(&mut [T], &[T]),
    finish: &impl Fn(&mut [T]),
) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        combine(&mut acc, x);
    }
    finish(&mut acc);
    acc
}

/// Rank `rank`'s output, given the reduction when the collective reduces.
fn rank_output<T: Clone>(
    collective: Collective,
    inputs: &[Vec<T>],
    rank: usize,
    reduced: &[T],
) -> Option<Vec<T>> {
    let n = inputs.len();
    let block = |len: usize| {
        let b = len / n;
        rank * b..(rank + 1) * b
    };
    Some(match collective {
        Collective::AllReduce => reduced.to_vec(),
        Collective::Reduce { root } => {
            if root as usize != rank {
                return None;
            }
            reduced.to_vec()
        }
        Collective::ReduceScatter => reduced[block(reduced.len())].to_vec(),
        Collective::Broadcast { root } => inputs.get(root as usize)?.clone(),
        Collective::AllGather => inputs.concat(),
        Collective::AllToAll => inputs
            .iter()
            .flat_map(|x| x[block(x.len())].iter().cloned())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(acc: &mut [i64], x: &[i64]) {
        for (a, b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }

    fn none(_: &mut [i64]) {}

    /// Rank `r`'s element `i` is `10·r + i`.
    fn inputs(n: i64, len: i64) -> Vec<Vec<i64>> {
        (0..n)
            .map(|r| (0..len).map(|i| 10 * r + i).collect())
            .collect()
    }

    #[test]
    fn every_collective_over_three_ranks() {
        let ins = inputs(3, 6);
        let sum: Vec<i64> = (0..6).map(|i| 30 + 3 * i).collect();
        let all = |c| expected(c, &ins, add, none);
        assert_eq!(all(Collective::AllReduce), vec![Some(sum.clone()); 3]);
        assert_eq!(
            all(Collective::Reduce { root: 1 }),
            [None, Some(sum.clone()), None]
        );
        assert_eq!(
            all(Collective::ReduceScatter),
            [0, 1, 2].map(|r| Some(sum[2 * r..2 * r + 2].to_vec()))
        );
        assert_eq!(
            all(Collective::Broadcast { root: 2 }),
            vec![Some(ins[2].clone()); 3]
        );
        assert_eq!(
            all(Collective::AllToAll)[1],
            Some(vec![2, 3, 12, 13, 22, 23])
        );
        let blocks = inputs(3, 2);
        assert_eq!(
            expected(Collective::AllGather, &blocks, add, none)[2],
            Some(vec![0, 1, 10, 11, 20, 21])
        );
    }

    #[test]
    fn one_rank_agrees_with_all_and_reduces_in_rank_order_then_finishes() {
        let ins = inputs(4, 8);
        for c in [
            Collective::AllReduce,
            Collective::Reduce { root: 3 },
            Collective::ReduceScatter,
            Collective::Broadcast { root: 0 },
            Collective::AllGather,
            Collective::AllToAll,
        ] {
            let all = expected(c, &ins, add, none);
            for (r, want) in all.iter().enumerate() {
                assert_eq!(&expected_rank(c, &ins, r, add, none), want, "{c} rank {r}");
            }
        }
        // Subtraction shows the order: ((x0 − x1) − x2) − x3, then halved.
        let sub = |acc: &mut [i64], x: &[i64]| {
            for (a, b) in acc.iter_mut().zip(x) {
                *a -= b;
            }
        };
        let half = |acc: &mut [i64]| acc.iter_mut().for_each(|v| *v /= 2);
        let got = expected_rank(Collective::AllReduce, &ins, 0, sub, half);
        assert_eq!(got.unwrap()[0], (0 - 10 - 20 - 30) / 2);
        assert!(expected(Collective::AllReduce, &[] as &[Vec<i64>], add, none).is_empty());
        assert_eq!(
            expected_rank(Collective::AllReduce, &ins, 4, add, none),
            None
        );
    }
}
