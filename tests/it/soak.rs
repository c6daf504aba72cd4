//! The soak driver's logic (`examples/soak.rs`, run by `scripts/soak.sh`) on threads: a short
//! soak finds nothing wrong, and its checks do catch a rank whose data is not what the others'
//! reference assumes.

#[path = "../../examples/soak.rs"]
#[allow(dead_code)]
mod driver;

use driver::{Call, KINDS, Kind, Length, Outcome, Rng};
use hccl::executor::{Config, ThreadGroup, fallback};
use std::time::Duration;

#[test]
fn a_short_soak_on_threads_finds_nothing_wrong() {
    let rep = driver::soak_threads(11, 4, Length::Calls(24), 64 << 10);
    assert_eq!(rep.failures, 0, "{:#?}", rep.first);
    // The warm-up (one call of each kind) and the random calls.
    assert_eq!(rep.calls, KINDS.len() as u64 + 24);
    let p = &rep.processes[0];
    assert!(p.rss_start_kib > 0 && p.fds_start > 0, "{p:?}");
}

#[test]
fn the_checks_catch_a_rank_whose_inputs_differ() {
    let n = 3;
    let cfg = Config::default().with_timeout(Duration::from_secs(30));
    let comms = ThreadGroup::with_config(fallback::plan(n), n, cfg).expect("a thread group");
    let mut rng = Rng::new(5);
    // One call of each kind; AllToAllv last: its block sizes come from the seed too, so rank
    // 1's disagree and the call fails (which poisons the group).
    let calls: Vec<Call> = KINDS
        .iter()
        .map(|&k| Call::random(&mut rng, Some(k), n, 4096, true))
        .collect();
    let seen: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let calls = &calls;
                s.spawn(move || {
                    calls
                        .iter()
                        .map(|call| {
                            let mut call = *call;
                            if comm.rank() == 1 {
                                call.seed ^= 1;
                            }
                            match driver::run_call(&mut comm, &call) {
                                Outcome::Ok => "ok".to_string(),
                                Outcome::Wrong(w) => format!("wrong: {w}"),
                                Outcome::Error(e) => format!("error: {e}"),
                            }
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for (i, call) in calls.iter().enumerate() {
        let outcomes: Vec<&str> = seen.iter().map(|r| r[i].as_str()).collect();
        let caught = if call.kind == Kind::AllToAllV {
            outcomes.iter().any(|o| o.starts_with("error"))
        } else {
            outcomes.iter().any(|o| o.starts_with("wrong"))
        };
        assert!(caught, "{call:?}: {outcomes:#?}");
    }
}
