//! The threads backend: all ranks in one process, sharing one heap arena.
//!
//! [`ThreadGroup::new`] checks the plan once and returns one [`Communicator`] per rank; each
//! is then driven by its own caller thread (the caller's threads *are* the ranks, so a call
//! costs no thread hand-off). Ranks signal through the lock-free connection rings of
//! [`crate::arena`].

use crate::arena::{Arena, Layout};
use crate::comm::{Communicator, RankState, Shared, prepare_plan};
use crate::config::Config;
use crate::error::{ExecError, Result};
use hccl_ir::PlanFile;
use std::sync::Arc;

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
    pub fn from_source(source: crate::config::PlanSource, n: u32) -> Result<Vec<Communicator>> {
        let config = Config::from_env()?;
        ThreadGroup::with_config(source.load(n)?, n, config)
    }

    /// `n` communicators over `plan` with an explicit configuration.
    pub fn with_config(plan: PlanFile, n: u32, config: Config) -> Result<Vec<Communicator>> {
        let hash = plan.content_hash();
        build(&plan, hash, n, config)
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
        let Some(plan) = plans.into_iter().next() else {
            return vec![Err(ExecError::Invalid(
                "a group needs at least one rank".into(),
            ))];
        };
        match build(&plan, hashes[0].clone(), n, config) {
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

fn build(plan: &PlanFile, hash: String, n: u32, config: Config) -> Result<Vec<Communicator>> {
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
    });
    Ok(states
        .into_iter()
        .enumerate()
        .map(|(r, st)| Communicator::new(r as u32, Arc::clone(&shared), st))
        .collect())
}
