//! Errors of the IR crate: reading plan files. Verification failures live in
//! [`crate::verify`] because they name steps, not file positions.

use thiserror::Error;

/// A position in a text file, 1-based, with the problem found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub path: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl Located {
    /// Converts a RON error into a located message.
    pub fn from_ron(path: &str, err: &ron::error::SpannedError) -> Located {
        Located {
            path: path.to_string(),
            line: err.span.start.line,
            col: err.span.start.col,
            message: err.code.to_string(),
        }
    }
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.path, self.line, self.col, self.message
        )
    }
}

/// Why a plan file could not be read.
#[derive(Debug, Error)]
pub enum PlanError {
    #[error("{path}: cannot read plan file: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a text file (invalid UTF-8 at byte {offset})")]
    NotText { path: String, offset: usize },
    #[error("{0}")]
    Parse(Located),
    #[error(
        "{path}: plan format version {found} is not supported by this build (it reads versions {min} to {supported}); recompile the plan with a matching hcclc",
        min = crate::plan::MIN_FORMAT_VERSION
    )]
    Version {
        path: String,
        found: u64,
        /// The newest version this build reads ([`crate::FORMAT_VERSION`]); it reads back to
        /// [`crate::plan::MIN_FORMAT_VERSION`].
        supported: u32,
    },
    /// A schedule of a sealed plan (see [`crate::plan::Seal`]) is not one the verifier
    /// passed: the file was edited after it was compiled.
    #[error(
        "{path}: entry {entry} ({collective} {algorithm}) was changed after its plan was verified: its schedule's hash {hash} is not among the plan's `verified` seals; recompile the plan, or delete its `verified` list to have every entry verified when it is loaded"
    )]
    Edited {
        path: String,
        entry: usize,
        collective: crate::schedule::Collective,
        algorithm: String,
        hash: String,
    },
    /// A symmetric entry whose expansion would take a full load of its plan past the plan's
    /// limit on expanded steps ([`crate::plan::expansion_limit`]): refused before anything
    /// of it is allocated (a small file can stand for billions of steps).
    #[error(
        "{path}: entry {entry} ({collective}): its {nranks} ranks × {template_steps} template steps expand to {expanded} steps, which with the {before} steps of the plan's explicit entries and of the symmetric entries before it exceed the plan's limit of {limit} steps ({why}); set HCCL_PLAN_MAX_STEPS to raise the limit, or load the plan as templates (hcclc verify, HCCL_VERIFY=full)"
    )]
    TooLarge {
        path: String,
        entry: usize,
        collective: crate::schedule::Collective,
        nranks: u32,
        template_steps: u64,
        /// `nranks × template_steps`.
        expanded: u64,
        /// Steps of the plan's explicit entries and of the symmetric entries before it.
        before: u64,
        limit: u64,
        /// Where the limit comes from.
        why: String,
    },
    /// `HCCL_PLAN_MAX_STEPS` is not a positive number.
    #[error("HCCL_PLAN_MAX_STEPS={value}: expected a positive number of steps")]
    MaxSteps { value: String },
    /// A symmetric entry that passed its checks could not be expanded.
    #[error("{path}: entry {entry} ({collective}): {source}")]
    Expand {
        path: String,
        entry: usize,
        collective: crate::schedule::Collective,
        #[source]
        source: crate::symmetric::SymmetryError,
    },
    #[error(
        "{path}: entry {entry} ({collective} {algorithm}): rank {rank}'s program was changed after its plan was verified: its digest {hash} is not the one the plan's `verified` seals record for rank {rank}; recompile the plan, or delete its `verified` list to have every entry verified when it is loaded"
    )]
    EditedRank {
        path: String,
        entry: usize,
        collective: crate::schedule::Collective,
        algorithm: String,
        rank: u32,
        hash: String,
    },
}
