//! Straggler accounting: how long a rank waited for each other rank, and the group's view of
//! who held everyone up.
//!
//! # What is counted
//!
//! The engine ([`crate::engine`]) reads the clock only once a wait outlasts its spin phase
//! (a few polls); such a *timed* wait ends when a sweep makes progress again, which reads the
//! clock once more, and its length is recorded here. Waits that end while spinning cost
//! microseconds and are not counted, so the fast path (no wait) and short spins never touch
//! the clock. Time in calls is taken from the first and every 64th call ([`TIME_EVERY`]
//! replays), the only calls that read the clock whether they wait or not.
//!
//! A wait names a peer: the sender of an awaited message, or the receiver whose slot is
//! still full (it has not consumed this rank's earlier messages). Either way that peer is
//! behind this rank. The wait is charged to the *cause* of that peer's lateness, along the
//! chain of waits (`engine::charge_to`): when the peer was itself waiting, and running, for
//! most of this wait, the wait is charged where the peer's own wait was, and so on; the
//! first rank on the chain that was not waiting, or not running, is the cause. Ranks publish
//! their current wait (whom, when they last polled, how long they have waited while running)
//! and their last finished one (when, how long, charged to whom) in their header line
//! ([`crate::arena`]). So in a ring a slow rank's delay, which reaches every rank
//! downstream of it, is charged to the slow rank alone, and a healthy job's waits spread
//! over the ranks. A wait for
//! another stream of the rank itself (a dependency; the engine names a peer whenever any
//! stream waits for one) is charged to the rank itself: it shows in [`WaitStats`] but never
//! in the group's view ([`StragglerReport`]). Time the waiting rank itself did not run (a
//! gap of 5 ms or more between two polls of the wait: descheduled, or stopped) is not
//! charged, so a stopped rank does not blame the peers it happened to be waiting for.
//!
//! A stopped or descheduled rank is never passed over for the rank it last waited for: its
//! published wait stops being refreshed (older than 2 ms, it is no wait), or, once it runs
//! again inside the wait, counts only the time it ran; its finished wait, if it mostly did
//! not run, names itself. A rank of another host is charged directly (its waits are in its
//! own host's region).
//!
//! Per rank held up by: total, count, largest and a histogram of the waits in log-scale
//! buckets (HDR-style: four linear sub-buckets per power of two from 1 µs, so a percentile is
//! placed within 25 % of its value), allocated the first time that rank is waited for and
//! never again.

use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB: u32 = 4;
/// Waits shorter than `1.25 · 2^MIN_LOG` ns (1.28 µs) share the first bucket.
const MIN_LOG: u32 = 10;
/// Powers of two covered: up to `2^(MIN_LOG + OCTAVES)` ns (275 s); longer waits share the
/// last bucket.
const OCTAVES: u32 = 28;
/// Buckets of a histogram.
pub(crate) const BUCKETS: usize = (OCTAVES * SUB) as usize;

/// The bucket of a wait of `ns` nanoseconds.
#[inline]
fn bucket(ns: u64) -> usize {
    if ns < 1 << MIN_LOG {
        return 0;
    }
    let log = 63 - ns.leading_zeros();
    if log >= MIN_LOG + OCTAVES {
        return BUCKETS - 1;
    }
    let sub = ((ns >> (log - 2)) & 3) as u32;
    ((log - MIN_LOG) * SUB + sub) as usize
}

/// The upper edge of bucket `i` (exclusive), in nanoseconds.
fn upper(i: usize) -> u64 {
    let (log, sub) = (MIN_LOG + i as u32 / SUB, u64::from(i as u32 % SUB));
    (5 + sub) << (log - 2)
}

/// The `q`-quantile (0 < q ≤ 1) of the waits of histogram `hist` (`count` waits, the longest
/// `max` ns): the upper edge of the bucket that holds it, at most `max`.
fn quantile<C: Copy + Into<u64>>(hist: &[C], count: u64, max: u64, q: f64) -> u64 {
    if count == 0 {
        return 0;
    }
    let want = ((q * count as f64).ceil() as u64).clamp(1, count);
    let mut seen = 0u64;
    for (i, &c) in hist.iter().enumerate() {
        seen += c.into();
        if seen >= want {
            return upper(i).min(max);
        }
    }
    max
}

/// The waits charged to one rank.
#[derive(Clone)]
struct Held {
    rank: u32,
    total_ns: u64,
    count: u64,
    max_ns: u64,
    hist: [u32; BUCKETS],
}

/// One rank's wait accounting, kept by its engine across calls.
#[derive(Default)]
pub(crate) struct Waits {
    /// Per rank: one plus its index in `held`; 0 while never waited for.
    slot: Vec<u32>,
    held: Vec<Held>,
    /// Replays (one per call; an AllToAllv's count exchange is one more), and the
    /// nanoseconds spent in those of them that were timed ([`Waits::time_replay`]).
    replays: u64,
    timed: u64,
    timed_ns: u64,
}

/// One replay in this many is timed: two clock reads in every call would cost an 8-byte
/// call a measurable share of its fraction of a microsecond.
pub const TIME_EVERY: u64 = 64;

impl Waits {
    /// Counts a replay; whether to time it (the first and every [`TIME_EVERY`]-th).
    #[inline]
    pub(crate) fn time_replay(&mut self) -> bool {
        self.replays += 1;
        self.replays % TIME_EVERY == 1
    }

    /// Adds a timed replay's duration.
    pub(crate) fn timed_replay(&mut self, d: Duration) {
        self.timed += 1;
        self.timed_ns = self
            .timed_ns
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Nanoseconds spent replaying calls, estimated from the timed ones.
    fn replay_ns(&self) -> u64 {
        if self.timed == 0 {
            return 0;
        }
        (u128::from(self.timed_ns) * u128::from(self.replays) / u128::from(self.timed))
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Charges a wait of `d` to rank `rank`.
    #[inline(never)]
    pub(crate) fn record(&mut self, rank: u32, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let r = rank as usize;
        if r >= self.slot.len() {
            self.slot.resize(r + 1, 0);
        }
        if self.slot[r] == 0 {
            self.held.push(Held {
                rank,
                total_ns: 0,
                count: 0,
                max_ns: 0,
                hist: [0; BUCKETS],
            });
            self.slot[r] = self.held.len() as u32;
        }
        let h = &mut self.held[self.slot[r] as usize - 1];
        h.total_ns = h.total_ns.saturating_add(ns);
        h.count += 1;
        h.max_ns = h.max_ns.max(ns);
        let b = &mut h.hist[bucket(ns)];
        *b = b.saturating_add(1);
    }

    /// This rank's numbers ([`WaitStats`]); `calls`: the calls it made.
    pub(crate) fn stats(&self, rank: u32, calls: u64) -> WaitStats {
        let mut peers: Vec<PeerWaits> = self
            .held
            .iter()
            .map(|h| PeerWaits {
                peer: h.rank,
                total_s: secs(h.total_ns),
                count: h.count,
                p50_s: secs(quantile(&h.hist, h.count, h.max_ns, 0.5)),
                p99_s: secs(quantile(&h.hist, h.count, h.max_ns, 0.99)),
                max_s: secs(h.max_ns),
            })
            .collect();
        peers.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then(a.peer.cmp(&b.peer)));
        WaitStats {
            rank,
            calls,
            time_in_calls_s: secs(self.replay_ns()),
            waited_s: secs(self.held.iter().map(|h| h.total_ns).sum()),
            peers,
        }
    }

    /// This rank's contribution to the group's view, to be summed over ranks: per rank `r`
    /// of `world`, [`ROW`] words (total ns, count, 1 if this rank waited for it, the
    /// histogram), then this rank's replay time (one word). Waits charged to `me` itself are
    /// left out. The second vector, maxed over ranks, holds the longest wait per rank.
    pub(crate) fn group_rows(&self, me: u32, world: u32) -> (Vec<u64>, Vec<u64>) {
        let n = world as usize;
        let mut sums = vec![0u64; n * ROW + 1];
        let mut maxes = vec![0u64; n];
        for h in self.held.iter().filter(|h| h.rank != me && h.rank < world) {
            let row = &mut sums[h.rank as usize * ROW..][..ROW];
            row[0] = h.total_ns;
            row[1] = h.count;
            row[2] = 1;
            for (w, &c) in row[3..].iter_mut().zip(&h.hist) {
                *w = u64::from(c);
            }
            maxes[h.rank as usize] = h.max_ns;
        }
        sums[n * ROW] = self.replay_ns();
        (sums, maxes)
    }
}

/// Words per rank in [`Waits::group_rows`].
pub(crate) const ROW: usize = 3 + BUCKETS;

fn secs(ns: u64) -> f64 {
    ns as f64 * 1e-9
}

/// The group's view from the rows of every rank summed (`sums`) and maxed (`maxes`), see
/// [`Waits::group_rows`]; `host_of` names a rank's host.
pub(crate) fn report(
    sums: &[u64],
    maxes: &[u64],
    world: u32,
    host_of: impl Fn(u32) -> String,
) -> StragglerReport {
    let n = world as usize;
    let total: u64 = (0..n).map(|r| sums[r * ROW]).fold(0, u64::saturating_add);
    let mut culprits: Vec<Culprit> = (0..n)
        .filter(|&r| sums[r * ROW + 1] > 0)
        .map(|r| {
            let row = &sums[r * ROW..][..ROW];
            let (count, max) = (row[1], maxes[r]);
            Culprit {
                rank: r as u32,
                host: host_of(r as u32),
                share: if total > 0 {
                    row[0] as f64 / total as f64
                } else {
                    0.0
                },
                total_s: secs(row[0]),
                count,
                waiters: row[2] as u32,
                p50_s: secs(quantile(&row[3..], count, max, 0.5)),
                p99_s: secs(quantile(&row[3..], count, max, 0.99)),
                max_s: secs(max),
            }
        })
        .collect();
    culprits.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then(a.rank.cmp(&b.rank)));
    StragglerReport {
        ranks: world,
        total_wait_s: secs(total),
        time_in_calls_s: secs(sums[n * ROW]),
        waits: culprits.iter().map(|c| c.count).sum(),
        culprits,
    }
}

/// The host name of a host identity: `name/boot-id` (the default identity the backends
/// give a host) loses its boot id; anything else (`HCCL_HOST_ID`) stays.
///
/// A suffix the rendezvous added to tell apart ranks that claim one host but cannot share
/// memory (`+shm:…`, `+machine:…`) stays after the name.
pub(crate) fn host_name(id: &str) -> String {
    let (base, suffix) = match id.find("+machine:").or_else(|| id.find("+shm:")) {
        Some(i) => id.split_at(i),
        None => (id, ""),
    };
    match base.rsplit_once('/') {
        Some((name, boot))
            if boot.len() == 36 && boot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') =>
        {
            format!("{name}{suffix}")
        }
        _ => id.to_string(),
    }
}

/// What one rank waited for ([`crate::Communicator::stats`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitStats {
    /// The rank these numbers are of.
    pub rank: u32,
    /// Collective calls it made (an AllToAllv counts its count exchange too).
    pub calls: u64,
    /// Seconds it spent replaying them, from a call's first step to its last, waits
    /// included: estimated from the first and every 64th call, which alone read the clock.
    pub time_in_calls_s: f64,
    /// Seconds of timed waits in all (the sum over `peers`).
    pub waited_s: f64,
    /// The ranks it was held up by, longest total first (see [`crate::waits`] for how a wait
    /// is charged). Its own rank stands for waits on another stream of its own.
    pub peers: Vec<PeerWaits>,
}

/// The waits one rank charged to one other.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerWaits {
    /// The rank that held it up.
    pub peer: u32,
    /// Seconds waited for it.
    pub total_s: f64,
    /// Waits.
    pub count: u64,
    /// Median wait, seconds (the upper edge of its histogram bucket, at most `max_s`).
    pub p50_s: f64,
    /// 99th percentile wait, seconds (likewise).
    pub p99_s: f64,
    /// Longest wait, seconds.
    pub max_s: f64,
}

/// The group's view ([`crate::Communicator::straggler_report`]): the ranks the others waited
/// for most, identical on every rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StragglerReport {
    /// Ranks of the communicator.
    pub ranks: u32,
    /// Seconds all ranks waited for other ranks, together.
    pub total_wait_s: f64,
    /// Seconds all ranks spent in calls, together (estimated as in
    /// [`WaitStats::time_in_calls_s`]).
    pub time_in_calls_s: f64,
    /// Waits counted.
    pub waits: u64,
    /// Every rank some rank waited for, largest share first.
    pub culprits: Vec<Culprit>,
}

/// A rank others waited for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Culprit {
    pub rank: u32,
    /// Its host (the host identity without the boot id).
    pub host: String,
    /// Its share of all waiting (0 to 1).
    pub share: f64,
    /// Seconds the others waited for it.
    pub total_s: f64,
    /// Waits for it.
    pub count: u64,
    /// How many ranks waited for it.
    pub waiters: u32,
    /// Median wait for it over all ranks, seconds (to 25 %).
    pub p50_s: f64,
    /// 99th percentile wait for it over all ranks, seconds (to 25 %).
    pub p99_s: f64,
    /// Longest wait for it, seconds.
    pub max_s: f64,
}

/// A rank dominates when it holds at least this share of all waiting (and 1.5 / ranks:
/// of two ranks, each waits for the other) ...
pub const DOMINANT_SHARE: f64 = 0.3;
/// ... at least this many times the share of the rank waited for next (in a healthy job the
/// causes of waiting spread over the ranks: no rank stands out) ...
/// ... and waiting is at least this fraction of the time in calls.
pub const DOMINANT_WAITING: f64 = 0.05;
/// (See [`DOMINANT_SHARE`].)
pub const DOMINANT_LEAD: f64 = 1.5;

impl StragglerReport {
    /// The rank that held the others up most, when it dominates: at least
    /// [`DOMINANT_SHARE`] (and `1.5 / ranks`) of all waiting, [`DOMINANT_LEAD`] times the
    /// share of the next rank, and waiting at least [`DOMINANT_WAITING`] of the time in
    /// calls.
    pub fn dominant(&self) -> Option<&Culprit> {
        let top = self.culprits.first()?;
        let next = self.culprits.get(1).map_or(0.0, |c| c.share);
        let need = DOMINANT_SHARE.max(1.5 / f64::from(self.ranks.max(1)));
        (top.share >= need
            && top.share >= DOMINANT_LEAD * next
            && self.total_wait_s >= DOMINANT_WAITING * self.time_in_calls_s)
            .then_some(top)
    }
}

/// Seconds as a short human-readable duration.
fn human(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

impl fmt::Display for Culprit {
    /// `rank 3 on host b: 61% of all waiting, p99 wait 4.2 ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} on host {}: {:.0}% of all waiting, p99 wait {}",
            self.rank,
            self.host,
            self.share * 100.0,
            human(self.p99_s)
        )
    }
}

impl fmt::Display for StragglerReport {
    /// The three ranks waited for most, `; `-separated, after the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} waited in all over {} ranks ({:.0}% of the time in calls)",
            human(self.total_wait_s),
            self.ranks,
            if self.time_in_calls_s > 0.0 {
                self.total_wait_s / self.time_in_calls_s * 100.0
            } else {
                0.0
            }
        )?;
        for (i, c) in self.culprits.iter().take(3).enumerate() {
            write!(f, "{}{c}", if i == 0 { ": " } else { "; " })?;
        }
        Ok(())
    }
}

impl fmt::Display for WaitStats {
    /// `rank 0: 3 calls, 1.2 ms in calls, 0.8 ms waiting; for rank 3: 0.7 ms in 2 waits, p99
    /// 0.5 ms; …` (the three ranks waited for most).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}: {} calls, {} in calls, {} waiting",
            self.rank,
            self.calls,
            human(self.time_in_calls_s),
            human(self.waited_s)
        )?;
        for (i, p) in self.peers.iter().take(3).enumerate() {
            write!(
                f,
                "{}for rank {}: {} in {} waits, p99 {}",
                if i == 0 { "; " } else { ", " },
                p.peer,
                human(p.total_s),
                p.count,
                human(p.p99_s)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_hold_their_values_within_a_quarter() {
        for i in 1..BUCKETS {
            assert!(upper(i) > upper(i - 1), "bucket {i}");
        }
        let mut ns = 1u64;
        while ns < 1 << 40 {
            let b = bucket(ns);
            assert!(ns < upper(b) || b == BUCKETS - 1, "{ns} ns in bucket {b}");
            if b > 0 && b < BUCKETS - 1 {
                assert!(ns >= upper(b - 1), "{ns} ns in bucket {b}");
                // Relative width: at most a quarter of the lower edge.
                assert!((upper(b) - upper(b - 1)) * 4 <= upper(b - 1), "bucket {b}");
            }
            ns = ns * 9 / 8 + 1;
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_and_group_report_follow_the_waits() {
        let ms = |x: u64| Duration::from_micros(x * 1000);
        // Rank 0 waited 99 times 1 ms for rank 3 and once 40 ms; 10 times 0.1 ms for rank 1;
        // once for itself.
        let mut w = Waits::default();
        for _ in 0..99 {
            w.record(3, ms(1));
        }
        w.record(3, ms(40));
        for _ in 0..10 {
            w.record(1, Duration::from_micros(100));
        }
        w.record(0, ms(2));
        // 128 replays, of which the 1st and the 65th are timed, at 7.8125 ms: 1 s in all.
        for _ in 0..128 {
            if w.time_replay() {
                w.timed_replay(Duration::from_nanos(7_812_500));
            }
        }
        assert_eq!(w.replay_ns(), 1_000_000_000);
        let s = w.stats(0, 7);
        assert_eq!((s.calls, s.peers.len()), (7, 3));
        let p3 = &s.peers[0];
        assert_eq!((p3.peer, p3.count), (3, 100));
        assert!((p3.total_s - 0.139).abs() < 1e-9, "{p3:?}");
        // 1 ms lies in [0.917, 1.049) ms; the 99th of 100 waits is still 1 ms, the max 40.
        assert!(p3.p50_s >= 1e-3 && p3.p50_s <= 1.25e-3, "{p3:?}");
        assert!(p3.p99_s >= 1e-3 && p3.p99_s <= 1.25e-3, "{p3:?}");
        assert!((p3.max_s - 0.040).abs() < 1e-12);
        assert_eq!(quantile(&[0u32, 0, 2], 2, 5000, 1.0), upper(2).min(5000));

        // Rank 2 waited 60 ms once for rank 3 and once 10 ms for rank 0.
        let mut w2 = Waits::default();
        w2.record(3, ms(60));
        w2.record(0, ms(10));
        assert!(w2.time_replay() && !w2.time_replay());
        w2.timed_replay(ms(500));
        assert_eq!(w2.replay_ns(), 1_000_000_000);
        let world = 4;
        let (mut sums, mut maxes) = w.group_rows(0, world);
        let (s2, m2) = w2.group_rows(2, world);
        for (a, b) in sums.iter_mut().zip(&s2) {
            *a += b;
        }
        for (a, b) in maxes.iter_mut().zip(&m2) {
            *a = (*a).max(*b);
        }
        let r = report(&sums, &maxes, world, |r| format!("h{}", r / 2));
        // Rank 0's wait for itself is left out: 139 + 1 + 60 + 10 = 210 ms.
        assert!((r.total_wait_s - 0.210).abs() < 1e-9, "{r:?}");
        let top = &r.culprits[0];
        assert_eq!((top.rank, top.waiters, top.count), (3, 2, 101));
        assert!((top.share - 0.199 / 0.210).abs() < 1e-9);
        assert_eq!(top.host, "h1");
        assert!((top.max_s - 0.060).abs() < 1e-12);
        assert_eq!(
            r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
            [3, 0, 1]
        );
        assert_eq!(r.dominant().map(|c| c.rank), Some(3));
        let line = top.to_string();
        assert!(
            line.starts_with("rank 3 on host h1: 95% of all waiting, p99 wait "),
            "{line}"
        );
        // Waiting that is a sliver of the time in calls makes no rank dominant.
        let quiet = StragglerReport {
            time_in_calls_s: 100.0,
            ..r.clone()
        };
        assert!(quiet.dominant().is_none());
    }

    #[test]
    fn host_names_lose_only_a_boot_id() {
        assert_eq!(
            host_name("node7/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
            "node7"
        );
        assert_eq!(host_name("rack/b"), "rack/b");
        assert_eq!(
            host_name("node7/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0+shm:23:1"),
            "node7+shm:23:1"
        );
        assert_eq!(host_name("b"), "b");
    }
}
