//! Why a topology could not be read or built.
//!
//! Every error names its origin (a path, or a label such as `<shipped dgx1-v100>`), and where
//! the problem can be placed in the text, a 1-based `line:col`.

use thiserror::Error;

/// A 1-based position in a topology text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// Line, from 1.
    pub line: usize,
    /// Column (in characters), from 1.
    pub col: usize,
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A semantic problem of a well-formed topology description.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Problem {
    #[error("the topology has no devices")]
    NoDevices,
    #[error("duplicate id \"{id}\" (ids of hosts, devices, NICs and switches share one namespace)")]
    DuplicateId { id: String },
    #[error("link {index} ({a} -> {b}): unknown endpoint \"{endpoint}\"")]
    UnknownEndpoint {
        index: usize,
        a: String,
        b: String,
        endpoint: String,
    },
    #[error("link {index} ({a} -> {b}): a link cannot join \"{a}\" to itself")]
    SelfLoop { index: usize, a: String, b: String },
    #[error("link {index} ({a} -> {b}): count must be at least 1")]
    ZeroCount { index: usize, a: String, b: String },
    #[error("{what}: {field} must be a finite number > 0, found {value}")]
    BadNumber {
        what: String,
        field: &'static str,
        value: f64,
    },
    #[error("NIC \"{nic}\": kind {kind} is not a network link kind (InfiniBand, Roce or Ethernet)")]
    NicKind { nic: String, kind: String },
    #[error("switch \"{switch}\": unknown host \"{host}\"")]
    UnknownHost { switch: String, host: String },
    #[error("device \"{device}\": rank is given for some devices but not for this one")]
    MissingRank { device: String },
    #[error("device \"{device}\": rank {rank} is also the rank of \"{other}\"")]
    DuplicateRank {
        device: String,
        rank: u32,
        other: String,
    },
    #[error("device \"{device}\": rank {rank} is out of range; ranks must be exactly 0..{n}")]
    RankOutOfRange { device: String, rank: u32, n: usize },
    #[error(
        "calibration, bandwidth knot {index}: sizes must ascend, but {bytes} B follows {previous} B"
    )]
    CalibrationOrder {
        index: usize,
        bytes: u64,
        previous: u64,
    },
    #[error(
        "device \"{device}\" is unreachable from device \"{from}\" (no path of links joins them)"
    )]
    Unreachable { device: String, from: String },
}

/// Why a topology could not be loaded or built.
#[derive(Debug, Error)]
pub enum TopologyError {
    #[error("{path}: cannot read topology file: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not a text file (invalid UTF-8 at byte {offset})")]
    NotText { origin: String, offset: usize },
    #[error(
        "{origin}: empty topology file (expected a RON `( name: ..., hosts: [...], links: [...] )`)"
    )]
    Empty { origin: String },
    #[error("{origin}:{pos}: {message}")]
    Syntax {
        origin: String,
        pos: Pos,
        message: String,
    },
    #[error("{origin}{}: {problem}", pos.map(|p| format!(":{p}")).unwrap_or_default())]
    Invalid {
        origin: String,
        /// Where the offending item is written, when it could be found in the text.
        pos: Option<Pos>,
        problem: Box<Problem>,
    },
    #[error("{tool}: {message}")]
    Detect { tool: String, message: String },
    #[error("topology \"{name}\" has {found} ranks but {expected} were expected")]
    RankCount {
        name: String,
        expected: u32,
        found: u32,
    },
    #[error("unknown shipped topology \"{name}\" (shipped: {known})")]
    UnknownShipped { name: String, known: String },
}
