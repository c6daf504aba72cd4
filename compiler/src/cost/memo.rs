//! Per-process memoisation of solver results: a search asks for the same solution once per
//! parameter set and once per bound, and recompiling a topology in the same process reuses
//! it.

use rustc_hash::FxHashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

/// Values computed once per key; concurrent callers for one key wait for the first, callers
/// for other keys do not.
pub(crate) struct Memo<K, V> {
    cells: OnceLock<Mutex<FxHashMap<K, Arc<OnceLock<V>>>>>,
}

impl<K: Eq + Hash, V: Clone> Memo<K, V> {
    /// An empty memo (usable in a `static`).
    pub(crate) const fn new() -> Memo<K, V> {
        Memo {
            cells: OnceLock::new(),
        }
    }

    /// The value for `key`, computed by `compute` the first time.
    pub(crate) fn get(&self, key: K, compute: impl FnOnce() -> V) -> V {
        let cell = {
            let mut map = self
                .cells
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(key).or_default())
        };
        cell.get_or_init(compute).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::Memo;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn computes_once_per_key() {
        static MEMO: Memo<u32, u32> = Memo::new();
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let square = |k: u32| {
            MEMO.get(k, || {
                CALLS.fetch_add(1, Ordering::SeqCst);
                k * k
            })
        };
        let handles: Vec<_> = (0..8)
            .map(|i| std::thread::spawn(move || square(i % 2 + 3)))
            .collect();
        let got: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(got.iter().all(|&v| v == 9 || v == 16));
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    }
}
