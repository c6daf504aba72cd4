//! The routed critical path's walks of one prepared schedule, kept so that most later
//! questions "is the path past this limit?" are settled without walking again.
//!
//! Under one protocol and one model, a message's streaming time is `x × count / least`
//! (`x`: a chunk's bytes over the protocol's bytes per µs per GB/s, [`super::reach`]) and its
//! latency does not depend on the size. Every step's end is then the largest of sums
//! `latency + x × weight` over the chains of steps and messages that lead to it, with
//! weights ≥ 0: the path `F(x)` is a maximum of affine functions of `x` with nonnegative
//! slopes, so it is **nondecreasing and convex**. From walks at `x1 < x2` it follows, for
//! any `x`:
//!
//! - `F(x) ≥ F(x1)` from `x ≥ x1` (nondecreasing);
//! - `F(x) ≤` the chord through the two walks, for `x1 ≤ x ≤ x2` (convex);
//! - `F(x) ≥` the chord's line outside `[x1, x2]` (convex).
//!
//! A question is settled from these only with a margin that covers the rounding of every
//! walk: a walk over `n` steps sums at most `2n + 2` terms, each computed with a few
//! roundings, so its value lies within a relative `(2n + 64) × ε` of `F` ([`Curve::settle`]).
//! Otherwise it walks, and the walk joins the points. The answer is therefore the one a walk
//! would give, to the bit: where the walk's own rounding could decide, it walks. (Relative
//! rounding needs every term ≥ 0: where a latency is negative the caller always walks.) A
//! question at the very inputs of an earlier walk (the chunk's bytes and the bytes per µs
//! per GB/s, to the bit) takes that walk's value as it is: the walk is deterministic.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a curve depends on besides the schedule and its network (a prepared schedule is
/// run on the network it was prepared for, as its flow routes are): the protocol and its
/// per-message latency on each link class.
pub(super) type CurveKey = [u64; 4];

/// Walked points of one curve: the path under one protocol and one model.
#[derive(Debug)]
struct Curve {
    key: CurveKey,
    /// Ascending in `x`.
    points: Vec<Point>,
}

/// One walk of a curve.
#[derive(Debug, Clone, Copy)]
struct Point {
    x: f64,
    /// `F(x)` as walked: finite.
    last: f64,
    /// The walk's inputs `(chunk bytes, bytes per µs per GB/s)` as bits.
    inputs: (u64, u64),
}

/// The walks of one prepared schedule's routed critical path (the module docs); empty when
/// the schedule is cloned.
#[derive(Debug, Default)]
pub struct PathPoints {
    curves: Mutex<Vec<Curve>>,
    /// Walks taken through [`PathPoints::settle_or_walk`].
    walks: AtomicUsize,
}

impl Clone for PathPoints {
    fn clone(&self) -> PathPoints {
        PathPoints::default()
    }
}

/// Whether `base + last` is past `threshold`, as the walk's caller decides it.
#[inline]
fn past(base: f64, last: f64, threshold: f64) -> bool {
    let path = base + last;
    path.is_finite() && path > threshold
}

impl Curve {
    /// Whether a walk at `x` would find `base + F(x) > threshold` (`Some`), when the walks
    /// so far decide it; `delta` bounds a walk's relative rounding.
    fn settle(
        &self,
        (x, inputs): (f64, (u64, u64)),
        (base, threshold): (f64, f64),
        delta: f64,
    ) -> Option<bool> {
        let pts = &self.points;
        let i = pts.partition_point(|p| p.x < x);
        if let Some(p) = pts.get(i)
            && p.x == x
            && p.inputs == inputs
        {
            // A walk of these inputs gave this value, and gives it every time.
            return Some(past(base, p.last, threshold));
        }
        // Bounds on the exact F(x), each less (more) the most the walks' rounding could move
        // it; `slack` covers the few roundings of the bound's own arithmetic.
        let slack = 1.0 + 8.0 * f64::EPSILON;
        let mut lo = f64::NEG_INFINITY;
        let mut hi = f64::INFINITY;
        if i > 0 {
            lo = lo.max(pts[i - 1].last * (1.0 - delta));
        }
        let line = |a: Point, b: Point| {
            // The line through two walks at x, and how far the walks' rounding could move it.
            let (x1, t1, x2, t2) = (a.x, a.last, b.x, b.last);
            let k = (x - x1) / (x2 - x1);
            let at = t1 + k * (t2 - t1);
            let err = delta * (t1.abs() * (1.0 - k).abs() + t2.abs() * k.abs());
            (at, err * slack + at.abs() * 4.0 * f64::EPSILON)
        };
        if i >= 2 {
            let (at, err) = line(pts[i - 2], pts[i - 1]);
            lo = lo.max(at - err);
        }
        if i + 1 < pts.len() {
            let (at, err) = line(pts[i], pts[i + 1]);
            lo = lo.max(at - err);
        }
        if i > 0 && i < pts.len() {
            let (at, err) = line(pts[i - 1], pts[i]);
            hi = hi.min(at + err);
        }
        // A walk at x reads within `delta` of F(x), and adding the base rounds once more.
        if base >= 0.0 && lo >= 0.0 && (base + lo * (1.0 - delta)) / slack > threshold {
            return Some(true);
        }
        if base >= 0.0 && hi.is_finite() && (base + hi * (1.0 + delta)) * slack <= threshold {
            return Some(false);
        }
        None
    }

    /// Adds a walk's value at `x` (finite values only: the bounds need them).
    fn add(&mut self, (x, inputs): (f64, (u64, u64)), last: f64) {
        if !last.is_finite() {
            return;
        }
        let i = self.points.partition_point(|p| p.x < x);
        if self.points.get(i).is_none_or(|p| p.x != x) {
            self.points.insert(i, Point { x, last, inputs });
        }
    }
}

impl PathPoints {
    /// Whether `base + F(x)` is finite and past `threshold`, for the curve `key` of a
    /// schedule of `steps` steps whose every latency is at least 0: settled from the walks
    /// so far where they can ([`Curve::settle`]), else by `walk` (the last step's end,
    /// `None` where the schedule would deadlock), whose value then joins them.
    pub(super) fn settle_or_walk(
        &self,
        (key, steps, (chunk_bytes, per_gbps)): (CurveKey, usize, (f64, f64)),
        (base, threshold): (f64, f64),
        walk: impl FnOnce() -> Option<f64>,
    ) -> bool {
        let x = chunk_bytes / per_gbps;
        let at = (x, (chunk_bytes.to_bits(), per_gbps.to_bits()));
        // Rounding of one walk (module docs), with room to spare.
        let delta = (2.0 * steps as f64 + 64.0) * f64::EPSILON;
        let usable = x.is_finite() && x >= 0.0 && delta < 1e-6;
        if usable {
            let curves = self.lock();
            if let Some(answer) = curves
                .iter()
                .find(|c| c.key == key)
                .and_then(|c| c.settle(at, (base, threshold), delta))
            {
                return answer;
            }
        }
        self.walks.fetch_add(1, Ordering::Relaxed);
        let Some(last) = walk() else {
            return false; // deadlocked: an infinite path, never past (see `path_bound_past`)
        };
        if usable {
            let mut curves = self.lock();
            match curves.iter_mut().find(|c| c.key == key) {
                Some(c) => c.add(at, last),
                None => {
                    let mut c = Curve {
                        key,
                        points: Vec::new(),
                    };
                    c.add(at, last);
                    curves.push(c);
                }
            }
        }
        past(base, last, threshold)
    }

    /// Walks taken so far.
    pub(super) fn walks(&self) -> usize {
        self.walks.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Curve>> {
        self.curves.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tag: u64) -> CurveKey {
        [tag; 4]
    }

    /// A convex nondecreasing curve: the largest of a few lines.
    fn f(x: f64) -> f64 {
        [(3.0, 0.5), (1.0, 2.0), (0.0, 7.0)]
            .iter()
            .map(|&(l, s)| l + s * x)
            .fold(0.0, f64::max)
    }

    #[test]
    fn settles_from_walks_as_a_walk_would() {
        let pp = PathPoints::default();
        let mut walks = 0;
        let xs = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0];
        for round in 0..3 {
            for (j, &x) in xs.iter().enumerate() {
                // Thresholds on both sides of the value, near and far.
                for t in [0.5, 0.999, 1.0, 1.001, 2.0] {
                    let threshold = (1.0 + f(x)) * t;
                    let got = pp.settle_or_walk((key(7), 10, (x, 1.0)), (1.0, threshold), || {
                        walks += 1;
                        Some(f(x))
                    });
                    assert_eq!(
                        got,
                        past(1.0, f(x), threshold),
                        "x {x} t {t} round {round} j {j}"
                    );
                }
            }
        }
        // Every point is walked at most once; most questions after the first few are not.
        assert!(walks <= xs.len(), "{walks} walks");
        assert!(walks >= 2);
    }

    #[test]
    fn curves_apart_and_deadlocks() {
        let pp = PathPoints::default();
        assert!(pp.settle_or_walk((key(1), 10, (1.0, 1.0)), (0.0, 1.0), || Some(2.0)));
        // Another key walks on its own.
        let mut walked = false;
        assert!(
            !pp.settle_or_walk((key(2), 10, (1.0, 1.0)), (0.0, 1.0), || {
                walked = true;
                Some(0.5)
            })
        );
        assert!(walked);
        // A deadlocked walk is never past.
        assert!(!pp.settle_or_walk((key(3), 10, (1.0, 1.0)), (0.0, 1.0), || None));
        // Clones start empty.
        let c = pp.clone();
        let mut walked = false;
        c.settle_or_walk((key(1), 10, (1.0, 1.0)), (0.0, 1.0), || {
            walked = true;
            Some(2.0)
        });
        assert!(walked);
    }
}
