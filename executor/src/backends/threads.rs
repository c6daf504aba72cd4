//! The threads backend: all ranks in one process, sharing one heap arena.
//!
//! [`ThreadGroup::new`] checks the plan once and returns one [`Communicator`] per rank; each
//! is then driven by its own caller thread (the caller's threads *are* the ranks, so a call
//! costs no thread hand-off). Ranks signal through the lock-free connection rings of
//! [`crate::arena`].

use crate::arena::{Arena, Layout};
use crate::comm::{Backend, Communicator, RankState, Shared, next_origin};
use crate::config::{Config, PlanOrigin, PlanSource, split_world};
use crate::error::{ExecError, Result};
use crate::plan_checks::prepare_plan;
use hccl_ir::PlanFile;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Builds the communicators of an in-process group.
#[derive(Debug, Clone, Copy)]
pub struct ThreadGroup;

impl ThreadGroup {
    /// `n` communicators over `plan` with the default configuration (plus environment
    /// overrides, see [`Config::from_env`]).
    #[allow(clippy::new_ret_no_self)] // the brief's API: one communicator per rank
    pub fn new(plan: PlanFile, n: u32) -> Result<Vec<Communicator>> {
        ThreadGroup::with_config(plan, n, Config::from_env()?)
    }

    /// `n` communicators over a plan from `source` (`HCCL_PLAN` overrides it) with the
    /// configuration from the environment.
    pub fn from_source(source: PlanSource, n: u32) -> Result<Vec<Communicator>> {
        let config = Config::from_env()?;
        let source = source.resolve();
        let plan_origin = source.origin();
        let (plan, origin) = source.load_split(n)?;
        let hash = plan.content_hash();
        build(&plan, hash, n, config, origin, plan_origin)
    }

    /// `n` communicators over `plan` with an explicit configuration. A plan with entries for
    /// several world sizes runs those for `n` ranks (its others serve
    /// [`Communicator::shrink`]).
    pub fn with_config(plan: PlanFile, n: u32, config: Config) -> Result<Vec<Communicator>> {
        let mut plan = plan;
        let rest = split_world(&mut plan, n);
        let hash = plan.content_hash();
        build(
            &plan,
            hash,
            n,
            config,
            PlanSource::Plan(rest),
            PlanOrigin::Memory,
        )
    }

    /// One communicator per rank where every rank brings its own plan, as separate processes
    /// would: the plans' hashes are compared first, and on a mismatch every rank gets an
    /// error naming the ranks that disagree.
    pub fn with_plans(plans: Vec<PlanFile>, config: Config) -> Vec<Result<Communicator>> {
        let n = plans.len() as u32;
        let hashes: Vec<String> = plans.iter().map(PlanFile::content_hash).collect();
        if let Some(odd) = hashes.iter().position(|h| *h != hashes[0]) {
            return (0..n)
                .map(|me| {
                    let other = if me == odd as u32 { 0 } else { odd as u32 };
                    Err(ExecError::PlanMismatch {
                        me,
                        mine: hashes[me as usize].clone(),
                        rank: other,
                        theirs: hashes[other as usize].clone(),
                    })
                })
                .collect();
        }
        let Some(mut plan) = plans.into_iter().next() else {
            return vec![Err(ExecError::Invalid(
                "a group needs at least one rank".into(),
            ))];
        };
        let rest = split_world(&mut plan, n);
        let built = build(
            &plan,
            hashes[0].clone(),
            n,
            config,
            PlanSource::Plan(rest),
            PlanOrigin::Memory,
        );
        match built {
            Ok(comms) => comms.into_iter().map(Ok).collect(),
            Err(e) => {
                let msg = e.to_string();
                std::iter::once(Err(e))
                    .chain((1..n).map(|_| Err(ExecError::Invalid(msg.clone()))))
                    .collect()
            }
        }
    }
}

fn build(
    plan: &PlanFile,
    hash: String,
    n: u32,
    config: Config,
    origin: PlanSource,
    plan_origin: PlanOrigin,
) -> Result<Vec<Communicator>> {
    let (keep, conns) = prepare_plan(plan, n, &config)?;
    let layout = Layout::new(n as usize, conns.len(), config.slot_bytes);
    let arena = Arena::heap(layout).ok_or_else(|| {
        ExecError::Invalid(format!(
            "cannot allocate {} bytes of connection memory",
            layout.total
        ))
    })?;
    let states = (0..n)
        .map(|r| RankState::new(plan, &keep, &conns, r, &config, None))
        .collect::<Result<Vec<_>>>()?;
    tracing::info!(
        ranks = n,
        entries = keep.len(),
        connections = conns.len(),
        arena_bytes = layout.total,
        plan = %hash,
        "threads group ready"
    );
    let shared = Arc::new(Shared {
        arena: Arc::new(arena),
        net: None,
        world: n,
        config,
        plan_hash: hash,
        check_pids: false,
        spin_polls: crate::comm::spin_polls_for(n),
        origin,
        plan_origin,
        backend: Box::new(Meeting::new(n)),
    });
    Ok(states
        .into_iter()
        .enumerate()
        .map(|(r, st)| Communicator::new(r as u32, Arc::clone(&shared), st))
        .collect())
}

/// Where the surviving threads of a group meet to shrink it ([`Communicator::shrink`]):
/// every communicator of the group holds it. The last survivor to arrive builds the new
/// group (plan checks, a new heap arena) and hands every survivor its communicator; the
/// failed ranks' memory and the old arena stay out of it.
pub(crate) struct Meeting {
    state: Mutex<MeetState>,
    cv: Condvar,
}

struct MeetState {
    /// The first survivor to arrive and the failed ranks it passed.
    failed: Option<(u32, Vec<u32>)>,
    /// Per old rank: arrived.
    arrived: Vec<bool>,
    /// Per old rank: its communicator in the new group, until it takes it.
    comms: Vec<Option<Communicator>>,
    /// Why the meeting failed; every survivor gets it.
    error: Option<String>,
    /// The new group was built (a second shrink of the same group is refused).
    built: bool,
}

impl Meeting {
    fn new(world: u32) -> Meeting {
        Meeting {
            state: Mutex::new(MeetState {
                failed: None,
                arrived: vec![false; world as usize],
                comms: (0..world).map(|_| None).collect(),
                error: None,
                built: false,
            }),
            cv: Condvar::new(),
        }
    }
}

impl Backend for Meeting {
    /// This machine's ([`crate::backends::net::host_id`]): every rank is a thread of this process.
    fn host_of(&self, _rank: u32) -> String {
        crate::backends::net::host_id()
    }

    /// Never: every rank is a thread of this process.
    fn process_gone(&self, _arena: &Arena, _p: u32) -> bool {
        false
    }

    /// Rank `me` (a survivor of `failed`, the survivors being `alive`) joins the meeting and
    /// waits, at most the timeout, for its communicator in the group of `alive`, whose plan
    /// comes from `chosen` (`from`: the source it was chosen from).
    fn shrink(
        &self,
        me: u32,
        failed: &[u32],
        alive: &[u32],
        chosen: PlanSource,
        from: PlanSource,
        config: Config,
    ) -> Result<Communicator> {
        let fail = |message: String| ExecError::Bootstrap { rank: me, message };
        let deadline = Instant::now() + config.timeout;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &st.error {
            return Err(fail(e.clone()));
        }
        if st.arrived[me as usize] || (st.built && st.comms[me as usize].is_none()) {
            return Err(fail(format!(
                "shrink: rank {me} already shrank this communicator"
            )));
        }
        match &st.failed {
            None => st.failed = Some((me, failed.to_vec())),
            Some((first, theirs)) if theirs.as_slice() != failed => {
                let e = format!(
                    "shrink: rank {me} passes failed ranks {failed:?} but rank {first} passed \
                     {theirs:?}: every survivor must pass the same failed ranks"
                );
                st.error = Some(e.clone());
                self.cv.notify_all();
                return Err(fail(e));
            }
            Some(_) => {}
        }
        st.arrived[me as usize] = true;
        if alive.iter().all(|&r| st.arrived[r as usize]) {
            // The last survivor builds the group for everyone.
            let n = alive.len() as u32;
            let plan_origin = chosen.origin();
            let built = chosen.load_split(n).and_then(|(plan, rest)| {
                let hash = plan.content_hash();
                build(
                    &plan,
                    hash,
                    n,
                    config.clone(),
                    next_origin(rest, from),
                    plan_origin,
                )
            });
            match built {
                Ok(comms) => {
                    for (comm, &old) in comms.into_iter().zip(alive) {
                        st.comms[old as usize] = Some(comm);
                    }
                    st.built = true;
                }
                Err(e) => st.error = Some(format!("shrink: building the group: {e}")),
            }
            self.cv.notify_all();
        }
        loop {
            if let Some(comm) = st.comms[me as usize].take() {
                return Ok(comm);
            }
            if let Some(e) = &st.error {
                return Err(fail(e.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<u32> = alive
                    .iter()
                    .copied()
                    .filter(|&r| !st.arrived[r as usize])
                    .collect();
                let e = format!(
                    "shrink: timed out after {:.1} s waiting for ranks {missing:?} to shrink \
                     the communicator too",
                    config.timeout.as_secs_f64()
                );
                st.error = Some(e.clone());
                self.cv.notify_all();
                return Err(fail(e));
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
