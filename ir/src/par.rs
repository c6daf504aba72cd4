//! Work spread over the cores: [`par_map`] (every phase of the compiler's search runs its
//! work through it; a plan's text is written with it).

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Cores taken by the helper threads of every [`par_map`] of this process running at once,
/// less those lent by callers left waiting for their helpers: with the first caller, at
/// most the cores ([`std::thread::available_parallelism`]).
static TAKEN: AtomicIsize = AtomicIsize::new(0);

/// Takes a core for a helper if fewer than `most` are taken.
fn take_helper(most: usize) -> bool {
    let most = isize::try_from(most).unwrap_or(isize::MAX);
    TAKEN
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < most).then_some(n + 1)
        })
        .is_ok()
}

/// Lends this thread's core ([`TAKEN`]) until dropped: its caller waits for its helpers.
struct Waiting;

impl Waiting {
    fn start() -> Waiting {
        TAKEN.fetch_sub(1, Ordering::AcqRel);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        TAKEN.fetch_add(1, Ordering::AcqRel);
    }
}

/// Gives a helper's place back when dropped (also when its work panics).
struct Helper;

impl Drop for Helper {
    fn drop(&mut self) {
        TAKEN.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The cores this process may use ([`std::thread::available_parallelism`], at least 1), read
/// once: on Linux each reading opens the process's cgroup files, which a compile's thousands
/// of [`par_map`] calls would otherwise repeat.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `f` applied to every item, results in item order: the outcome does not depend on how the
/// work was spread. A panic in `f` is propagated.
///
/// The calling thread works through the items, and before each one it starts a helper
/// thread (one fewer than the cores per call) if the process has a core free for it: the
/// helpers of every `par_map` running at once, nested ones too, stay below the cores, the
/// calling thread counting as the first, and a caller left waiting for its helpers lends
/// its core to the others meanwhile. Work nested inside a `par_map` item (a compile's
/// collectives side by side, each costing candidates side by side) then runs on the threads
/// already busy instead of oversubscribing the cores, and joins freed cores item by item.
/// Threads that are not `par_map`'s (a background solve) are not counted.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let most = cores().saturating_sub(1);
    if most == 0 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    // Items from `next` on, each taken by one thread.
    let work = || {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            out.push((i, f(item)));
        }
        out
    };
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let mut helpers = Vec::new();
        let mut mine = Vec::new();
        loop {
            // Items left beside the one this thread takes next: one helper for each at most.
            let left = items.len().saturating_sub(next.load(Ordering::Relaxed) + 1);
            if helpers.len() < most.min(left) && take_helper(most) {
                let (work, place) = (&work, Helper);
                // A thread the system will not start gives its place back with the closure
                // that holds it, and this thread carries on alone.
                if let Ok(h) = std::thread::Builder::new().spawn_scoped(scope, move || {
                    let _place = place;
                    work()
                }) {
                    helpers.push(h);
                }
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            mine.push((i, f(item)));
        }
        // Nothing left to take: this thread's core is free for other calls' helpers until its
        // own helpers are done.
        let _waiting = (!helpers.is_empty()).then(Waiting::start);
        helpers
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .chain(mine)
            .collect()
    });
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::{TAKEN, par_map};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn results_keep_item_order_nested_or_not() {
        let items: Vec<u64> = (0..200).collect();
        let got = par_map(&items, |&x| {
            let inner: Vec<u64> = (0..x % 7).collect();
            par_map(&inner, |&y| y * x).iter().sum::<u64>() + x
        });
        let want: Vec<u64> = items
            .iter()
            .map(|&x| (0..x % 7).map(|y| y * x).sum::<u64>() + x)
            .collect();
        assert_eq!(got, want);
        assert!(par_map(&[] as &[u64], |&x| x).is_empty());
    }

    /// However deep the nesting, no more threads run items at once than the cores (the
    /// helpers' count, with the calling thread, never passes them); one more at most when
    /// another test's call, waiting for its helpers, lends its core meanwhile. Unbounded
    /// nesting would run the cores squared (4 threads on 2 cores).
    #[test]
    fn nested_calls_stay_within_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let items: Vec<u32> = (0..16).collect();
        par_map(&items, |_| {
            par_map(&items, |_| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
                running.fetch_sub(1, Ordering::SeqCst);
            })
        });
        assert!(
            peak.load(Ordering::SeqCst) <= cores + 1,
            "{peak:?} > {cores} + 1"
        );
        assert!(TAKEN.load(Ordering::SeqCst) < cores as isize);
    }

    #[test]
    fn a_panic_in_an_item_reaches_the_caller_and_frees_its_helpers() {
        let items: Vec<u32> = (0..8).collect();
        let caught = std::panic::catch_unwind(|| {
            par_map(&items, |&x| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                assert!(x != 5, "item 5");
                x
            })
        });
        assert!(caught.is_err());
        // Every helper gave its place back: a later call still gets the cores.
        assert_eq!(par_map(&items, |&x| x + 1), (1..9).collect::<Vec<u32>>());
    }
}
