//! What a [`Simulator`](super::Simulator)'s flow runs cost, by purpose and outcome
//! ([`RunTally`]): the profile of a search's simulation work, which `HCCL_SEARCH_TRACE`
//! prints at the end of a compile.
//!
//! The caller names the purpose of the runs a thread makes next ([`runs_for`]); each run
//! adds its outcome and its thread time under that name. Runs cost tens of microseconds to
//! seconds; a tally costs two clock reads and an uncontended lock.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::Instant;

thread_local! {
    /// The purpose this thread's runs are tallied under ([`runs_for`]).
    static PURPOSE: Cell<&'static str> = const { Cell::new("other") };
}

/// Tallies the flow runs this thread makes from now on under `purpose` (until the next
/// call; a thread starts with "other").
pub fn runs_for(purpose: &'static str) {
    PURPOSE.set(purpose);
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Run to its end with no limit.
    Whole,
    /// Ended within its limit.
    Within,
    /// Stopped past its limit.
    Stopped,
    /// Not run: a lower bound was already past its limit.
    Bounded,
    /// Failed (deadlock, too large).
    Failed,
}

/// The runs of one purpose.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunCounts {
    /// What the runs were for ([`runs_for`]).
    pub purpose: &'static str,
    /// Runs to their end without a limit.
    pub whole: u64,
    /// Runs with a limit that ended within it.
    pub within: u64,
    /// Runs stopped past their limit.
    pub stopped: u64,
    /// Runs a lower bound made unnecessary.
    pub bounded: u64,
    /// Runs that failed.
    pub failed: u64,
    /// Thread seconds spent in runs (on a busy machine, more than the CPU time).
    pub seconds: f64,
}

impl RunCounts {
    /// Runs made (not counting those a bound saved).
    pub fn runs(&self) -> u64 {
        self.whole + self.within + self.stopped + self.failed
    }
}

/// Every purpose's [`RunCounts`] of one simulator, in order of first use.
#[derive(Debug, Default)]
pub(super) struct RunTally {
    counts: Mutex<Vec<RunCounts>>,
}

impl RunTally {
    /// Adds a run that started at `since` and ended as `outcome`, under this thread's
    /// purpose.
    pub(super) fn add(&self, since: Option<Instant>, outcome: Outcome) {
        let seconds = since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let purpose = PURPOSE.get();
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let at = match counts.iter().position(|c| c.purpose == purpose) {
            Some(at) => at,
            None => {
                counts.push(RunCounts {
                    purpose,
                    ..RunCounts::default()
                });
                counts.len() - 1
            }
        };
        let c = &mut counts[at];
        match outcome {
            Outcome::Whole => c.whole += 1,
            Outcome::Within => c.within += 1,
            Outcome::Stopped => c.stopped += 1,
            Outcome::Bounded => c.bounded += 1,
            Outcome::Failed => c.failed += 1,
        }
        c.seconds += seconds;
    }

    /// The counts so far.
    pub(super) fn counts(&self) -> Vec<RunCounts> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{Outcome, RunTally, runs_for};

    #[test]
    fn runs_are_tallied_under_their_threads_purpose() {
        let tally = RunTally::default();
        tally.add(None, Outcome::Whole);
        runs_for("screen");
        tally.add(None, Outcome::Within);
        tally.add(None, Outcome::Stopped);
        std::thread::scope(|s| {
            s.spawn(|| {
                runs_for("cost");
                tally.add(None, Outcome::Bounded);
            });
        });
        tally.add(None, Outcome::Failed);
        let counts = tally.counts();
        let names: Vec<&str> = counts.iter().map(|c| c.purpose).collect();
        assert_eq!(names, ["other", "screen", "cost"]);
        assert_eq!((counts[0].whole, counts[0].runs()), (1, 1));
        let screen = &counts[1];
        assert_eq!(
            (screen.within, screen.stopped, screen.failed, screen.runs()),
            (1, 1, 1, 3)
        );
        assert_eq!((counts[2].bounded, counts[2].runs()), (1, 0));
        runs_for("other");
    }
}
