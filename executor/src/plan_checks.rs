//! The checks a plan passes before a group runs it: every entry for the job's world size,
//! verified (or covered by a seal of this build's verifier, or, for a rank holding only its
//! part of a sealed plan, checked as far as its own programs allow), and the entries
//! `HCCL_ALGO` / `HCCL_PROTO` keep.

use crate::config::Config;
use crate::error::{ExecError, Result};
use crate::program::ConnTable;
use hccl_ir::{Collective, PlanFile};

/// Checks the plan and prepares it for a job of `world` ranks in one process: verification,
/// world size, entry filters; every connection.
pub(crate) fn prepare_plan(
    plan: &PlanFile,
    world: u32,
    config: &Config,
) -> Result<(Vec<usize>, ConnTable)> {
    let keep = check_plan(plan, world, config, None)?;
    let conns = ConnTable::build(keep.iter().map(|&i| &plan.entries[i].schedule));
    Ok((keep, conns))
}

/// Every entry is for `world` ranks.
fn check_world(plan: &PlanFile, world: u32) -> Result<()> {
    if world == 0 {
        return Err(ExecError::Invalid("world size must be at least 1".into()));
    }
    for (i, e) in plan.entries.iter().enumerate() {
        if e.schedule.nranks != world {
            return Err(ExecError::WorldSize {
                entry: i,
                plan: e.schedule.nranks,
                world,
            });
        }
    }
    Ok(())
}

/// The start checks of a rank holding a sealed plan's part (see [`hccl_ir::PlanPart`]): the
/// world size and the checks `rank` can make of its own programs alone
/// ([`hccl_ir::verify::check_rank`]); the seals vouch for the rest. The entries it keeps.
pub(crate) fn check_part(
    plan: &PlanFile,
    rank: u32,
    world: u32,
    config: &Config,
) -> Result<Vec<usize>> {
    check_world(plan, world)?;
    for (i, e) in plan.entries.iter().enumerate() {
        if let Err(errs) = hccl_ir::verify::check_rank(&e.schedule, rank) {
            return Err(ExecError::Verify {
                entry: i,
                collective: e.schedule.collective,
                message: errs
                    .iter()
                    .take(3)
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
    }
    tracing::debug!(
        "plan checks: rank {rank}'s programs of {} sealed entries (HCCL_VERIFY={:?})",
        plan.entries.len(),
        config.verify
    );
    filter_entries(plan, config)
}

/// Checks the whole plan: world size, verification of every entry no seal covers (every
/// entry with `HCCL_VERIFY=full`); the entries kept after `HCCL_ALGO` / `HCCL_PROTO`.
/// `hashes`: the plan's [`PlanFile::schedule_hashes`], when the caller has them.
pub(crate) fn check_plan(
    plan: &PlanFile,
    world: u32,
    config: &Config,
    hashes: Option<&[String]>,
) -> Result<Vec<usize>> {
    check_world(plan, world)?;
    // Entries the compiler verified and sealed are not verified again (unless
    // `HCCL_VERIFY=full`): at thousands of ranks that is most of a job's start.
    let sealed = match (config.verify, hashes) {
        (crate::config::VerifyMode::Full, _) => vec![false; plan.entries.len()],
        (crate::config::VerifyMode::Unsealed, Some(h)) => plan.sealed_with(h),
        (crate::config::VerifyMode::Unsealed, None) => plan.sealed(),
    };
    for (i, e) in plan.entries.iter().enumerate() {
        if sealed[i] {
            continue;
        }
        if let Err(errs) = hccl_ir::verify::verify_entry(e) {
            let message = errs
                .iter()
                .take(3)
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            return Err(ExecError::Verify {
                entry: i,
                collective: e.schedule.collective,
                message,
            });
        }
    }
    tracing::debug!(
        "plan checks: {} of {} entries sealed by {} (HCCL_VERIFY={:?})",
        sealed.iter().filter(|s| **s).count(),
        plan.entries.len(),
        hccl_ir::verify::VERIFIER,
        config.verify
    );
    filter_entries(plan, config)
}

/// Applies `HCCL_ALGO` / `HCCL_PROTO`: per collective, keep only matching entries when the
/// plan has any. An `HCCL_ALGO` that no entry of the plan has (a misspelt family, or one the
/// plan was not compiled with) is [`ExecError::Env`] naming the plan's algorithms.
fn filter_entries(plan: &PlanFile, config: &Config) -> Result<Vec<usize>> {
    if let Some(algo) = &config.algo
        && !plan
            .entries
            .iter()
            .any(|e| e.algorithm.eq_ignore_ascii_case(algo))
    {
        let mut names: Vec<&str> = plan.entries.iter().map(|e| e.algorithm.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        return Err(ExecError::Env {
            name: "HCCL_ALGO",
            value: algo.clone(),
            expected: format!(
                "an algorithm of the plan's entries ({}; any case)",
                names.join(", ")
            ),
        });
    }
    let mut keep: Vec<usize> = (0..plan.entries.len()).collect();
    let mut apply = |pred: &dyn Fn(usize) -> bool, what: &str| {
        let mut colls: Vec<Collective> = keep
            .iter()
            .map(|&i| plan.entries[i].schedule.collective)
            .collect();
        colls.sort();
        colls.dedup();
        for coll in colls {
            let of = |i: &usize| plan.entries[*i].schedule.collective == coll;
            if keep.iter().filter(|i| of(i)).any(|&i| pred(i)) {
                keep.retain(|i| !of(i) || pred(*i));
            } else {
                tracing::warn!("{what} is not in the plan for {coll}; using all its entries");
            }
        }
    };
    if let Some(algo) = &config.algo {
        apply(
            &|i| plan.entries[i].algorithm.eq_ignore_ascii_case(algo),
            &format!("HCCL_ALGO={algo}"),
        );
    }
    if let Some(proto) = config.proto {
        apply(
            &|i| plan.entries[i].protocol == proto,
            &format!("HCCL_PROTO={proto}"),
        );
    }
    Ok(keep)
}
