//! The contention constraints of symmetric templates ([`Contention`]) and their cache
//! ([`ContentionCache`], held by the simulator and filled by `symmetric.rs`).

use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The contention constraints of a template's peers (see `Simulator::contention`, `symmetric.rs`).
#[derive(Debug, Clone)]
pub(super) struct Contention {
    pub(super) class_resources: Vec<Vec<(u32, u32)>>,
    pub(super) class_rows: Vec<Vec<(u32, u32)>>,
    pub(super) row_classes: Vec<Vec<(u32, u32)>>,
    pub(super) row_cap: Vec<f64>,
    pub(super) equivariant: bool,
}

/// What `Simulator::contention`, `symmetric.rs` caches: per symmetry and sorted peer list.
/// Contention constraints per symmetry and peer list, and a turn for computing them (two
/// candidates of one family asking at once compute them once: the second waits for the
/// first and finds them cached).
#[derive(Debug, Default)]
pub(super) struct ContentionCache {
    pub(super) held: std::sync::Mutex<FxHashMap<ContentionKey, Arc<Contention>>>,
    pub(super) turn: std::sync::Mutex<()>,
}

/// A symmetry and a template's distinct peers.
pub(super) type ContentionKey = (hccl_ir::Symmetry, Vec<u32>);

impl ContentionCache {
    pub(super) fn get(&self, key: &ContentionKey) -> Option<Arc<Contention>> {
        self.held.lock().ok().and_then(|c| c.get(key).cloned())
    }
}
