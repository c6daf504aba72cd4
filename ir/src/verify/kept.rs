//! Memory a verification's simulation keeps for the next one, inside [`keep_buffers`].
//!
//! A simulation holds each rank's slots (their values, and their access history on ranks
//! with several streams), two arrays per buffer per rank: a compile's winners of 130k-160k
//! chunks per rank are tens of megabytes of fresh pages each, and faulting them in was most
//! of a DGX-1 compile's page faults. Inside [`keep_buffers`] the arrays of a finished
//! simulation go on a shelf and the next one takes them (refilled, already mapped); when the
//! last scope ends the shelves are emptied, so a process that verifies once (a job checking
//! its plan at start) keeps nothing.

use super::sim::Access;
use super::value::Value;
use std::sync::{Mutex, MutexGuard};

/// Arrays shorter than this are not kept (the allocator serves them well).
const LEAST_KEPT: usize = 1 << 12;
/// Most arrays a shelf holds (those given back past it are freed).
const MOST_KEPT: usize = 64;

struct Shelves {
    /// Open [`keep_buffers`] scopes, on every thread.
    scopes: usize,
    values: Vec<Vec<Value>>,
    accesses: Vec<Vec<Access>>,
}

static SHELVES: Mutex<Shelves> = Mutex::new(Shelves {
    scopes: 0,
    values: Vec::new(),
    accesses: Vec::new(),
});

fn shelves() -> MutexGuard<'static, Shelves> {
    // The shelves hold no invariant a panic could break mid-way.
    SHELVES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` with the verifier keeping its simulations' largest arrays for the next
/// simulation (on any thread) until the last such scope ends: for a process that verifies
/// many schedules in a row, as a compile does. Results are the same either way.
pub fn keep_buffers<T>(f: impl FnOnce() -> T) -> T {
    struct Scope;
    impl Drop for Scope {
        fn drop(&mut self) {
            let mut s = shelves();
            s.scopes -= 1;
            if s.scopes == 0 {
                s.values = Vec::new();
                s.accesses = Vec::new();
            }
        }
    }
    shelves().scopes += 1;
    let _scope = Scope;
    f()
}

/// The shelved array with the least capacity of at least `len`, or none.
fn best_fit<T>(shelf: &mut Vec<Vec<T>>, len: usize) -> Option<Vec<T>> {
    let at = (0..shelf.len())
        .filter(|&i| shelf[i].capacity() >= len)
        .min_by_key(|&i| shelf[i].capacity())?;
    Some(shelf.swap_remove(at))
}

/// `len` copies of `fill`, in a kept array when one fits.
fn filled<T: Clone>(
    pick: impl FnOnce(&mut Shelves) -> Option<Vec<T>>,
    len: usize,
    fill: T,
) -> Vec<T> {
    let kept = if len >= LEAST_KEPT {
        let mut s = shelves();
        if s.scopes > 0 { pick(&mut s) } else { None }
    } else {
        None
    };
    let mut v = kept.unwrap_or_default();
    v.clear();
    v.resize(len, fill);
    v
}

pub(super) fn values(len: usize, fill: Value) -> Vec<Value> {
    filled(|s| best_fit(&mut s.values, len), len, fill)
}

pub(super) fn accesses(len: usize, fill: Access) -> Vec<Access> {
    filled(|s| best_fit(&mut s.accesses, len), len, fill)
}

/// Shelves a finished simulation's arrays, inside a scope.
pub(super) fn give_back(
    values: impl IntoIterator<Item = Vec<Value>>,
    accesses: impl IntoIterator<Item = Vec<Access>>,
) {
    let mut s = shelves();
    if s.scopes == 0 {
        return;
    }
    for v in values {
        if v.capacity() >= LEAST_KEPT && s.values.len() < MOST_KEPT {
            s.values.push(v);
        }
    }
    for a in accesses {
        if a.capacity() >= LEAST_KEPT && s.accesses.len() < MOST_KEPT {
            s.accesses.push(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LEAST_KEPT, keep_buffers, shelves, values};
    use crate::verify::value::Value;

    /// Inside a scope an array comes back for the next simulation; after the last scope
    /// nothing is kept.
    #[test]
    fn arrays_are_kept_inside_scopes_only() {
        let len = LEAST_KEPT * 2;
        keep_buffers(|| {
            let v = values(len, Value::UNINIT);
            let at = v.as_ptr();
            super::give_back([v], []);
            let again = values(len - 1, Value::UNINIT);
            assert_eq!(again.as_ptr(), at);
            assert!(again.iter().all(|x| *x == Value::UNINIT) && again.len() == len - 1);
            super::give_back([again], []);
        });
        // Other tests may hold a scope at the same time; none is open here once they end.
        let s = shelves();
        assert!(s.scopes > 0 || s.values.is_empty());
    }
}
