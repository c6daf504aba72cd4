//! The `HCCL_*` variables the workspace reads ([`KNOWN_VARS`]: the table of `docs/env.md`,
//! which the facade's `tests/it/env_table.rs` keeps equal to this list and to what the sources
//! read), and the check a communicator makes of its environment when it starts
//! ([`crate::Config::from_env`]): every `HCCL_*` variable set that is not a known name is a
//! warning on stderr, printed whatever `HCCL_DEBUG` says, naming the closest known name, so
//! that a misspelt setting is not silently without effect.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Every `HCCL_*` variable some part of the workspace reads: the executor's, the plan
/// reader's, the compiler's, `hccl-perf`'s, and those of the test harnesses and scripts (set
/// around test runs whose processes start communicators). The rows of `docs/env.md`.
pub const KNOWN_VARS: &[&str] = &[
    "HCCL_PLAN",
    "HCCL_PLAN_MAX_STEPS",
    "HCCL_ALGO",
    "HCCL_PROTO",
    "HCCL_TIMEOUT",
    "HCCL_SLOT_BYTES",
    "HCCL_VERIFY",
    "HCCL_CHECK_CALLS",
    "HCCL_CHECKSUM",
    "HCCL_STREAM_WRITES",
    "HCCL_TRACE",
    "HCCL_TRACE_CALLS",
    "HCCL_DEBUG",
    "HCCL_JOB_TOKEN",
    "HCCL_HOST_ID",
    "HCCL_SHM_DIR",
    "HCCL_SOCKET_IFNAME",
    "HCCL_NSOCKS",
    "HCCL_NTHREADS",
    "HCCL_NET",
    "HCCL_IB_HCA",
    "HCCL_SEARCH_TRACE",
    "HCCL_CACHE_DIR",
    "HCCL_PERF_BIND",
    "HCCL_PERF_TOPO",
    "HCCL_PERF_PLAN_LABEL",
    "HCCL_FAULT_CORRUPT",
    "HCCL_TEST_BYTES",
    "HCCL_TEST_ROLE",
    "HCCL_TEST_STOP_FILE",
    "HCCL_TEST_VICTIM",
    "HCCL_NETNS_ROLE",
    "HCCL_NETNS_ADDR",
    "HCCL_REGEN_DATA",
    "HCCL_TEST_TORCH",
    "HCCL_PY_PROFILE",
    "HCCL_TORCH_ASYNC",
    "HCCL_CI_HIGHS",
];

/// The known name closest to `name` (Levenshtein distance; the first of equals in
/// [`KNOWN_VARS`] order).
pub fn closest_known(name: &str) -> &'static str {
    KNOWN_VARS
        .iter()
        .copied()
        .min_by_key(|k| strsim::levenshtein(name, k))
        .unwrap_or("HCCL_PLAN")
}

/// The warning for an `HCCL_*` variable that is not a known name.
pub fn unknown_var_warning(name: &str) -> String {
    format!(
        "hccl: warning: {name} is set but is not a variable hccl reads (did you mean {}?); \
         it has no effect (every variable: docs/env.md)",
        closest_known(name)
    )
}

/// Whether `name` is an `HCCL_*` variable that is not a known name.
fn is_unknown(name: &str) -> bool {
    name.starts_with("HCCL_") && !KNOWN_VARS.contains(&name)
}

/// The warnings for the names among `names` that start with `HCCL_` and are not known, in
/// order, each once.
pub fn unknown_var_warnings<I, S>(names: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut seen = BTreeSet::new();
    names
        .into_iter()
        .filter(|n| {
            let n = n.as_ref();
            is_unknown(n) && seen.insert(n.to_string())
        })
        .map(|n| unknown_var_warning(n.as_ref()))
        .collect()
}

/// The value of variable `name`, unless unset or blank.
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Prints on stderr a warning for every unknown `HCCL_*` variable of this process's
/// environment, each name once per process (a process may start many communicators).
pub(crate) fn warn_unknown_vars() {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !is_unknown(name) {
            continue;
        }
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.insert(name.to_string()) {
            eprintln!("{}", unknown_var_warning(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_warned_with_the_closest_known_name() {
        let warnings = unknown_var_warnings([
            "HCCL_ALGOO",
            "HCCL_PLAN",
            "PATH",
            "HCCL_TIMOUT",
            "HCCL_ALGOO",
            "HCCL_CHEKSUM",
        ]);
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(
            warnings[0].contains("HCCL_ALGOO is set but is not a variable hccl reads")
                && warnings[0].contains("did you mean HCCL_ALGO?"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1].contains("did you mean HCCL_TIMEOUT?"),
            "{}",
            warnings[1]
        );
        assert!(
            warnings[2].contains("did you mean HCCL_CHECKSUM?"),
            "{}",
            warnings[2]
        );
        assert_eq!(closest_known("HCCL_NSOCK"), "HCCL_NSOCKS");
        assert_eq!(closest_known("HCCL_SOCKET_IFNAMES"), "HCCL_SOCKET_IFNAME");
    }

    #[test]
    fn known_names_are_not_warned_and_are_listed_once() {
        assert!(unknown_var_warnings(KNOWN_VARS.iter().copied()).is_empty());
        let set: BTreeSet<&str> = KNOWN_VARS.iter().copied().collect();
        assert_eq!(set.len(), KNOWN_VARS.len(), "a name is listed twice");
        for name in KNOWN_VARS {
            assert!(
                name.starts_with("HCCL_")
                    && name[5..]
                        .bytes()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'),
                "{name}"
            );
        }
    }
}
