//! The per-run arrays of the simulator ([`super::steps::Steps`], [`super::flow`]), kept by
//! each thread between its runs: a search runs the same schedule at every size and protocol,
//! and allocating, zeroing and (for arrays past the allocator's mmap threshold) faulting in
//! fresh arrays each time was a fifth of a small schedule's run.
//!
//! A run takes its arrays from its thread's [`Buffers`] ([`with`]), resized and filled as a
//! fresh `vec![value; n]` would be, and hands them back when it ends. Nothing carries over
//! from one run to the next but capacity.

use std::any::{Any, TypeId};
use std::cell::RefCell;

/// Arrays of more elements than this are not kept (a 32,768-rank schedule's would hold
/// hundreds of megabytes per thread between compiles).
pub(super) const KEEP_ELEMENTS: usize = 1 << 20;

/// Arrays of each element type a run uses, ready for the next run.
#[derive(Default)]
pub(super) struct Buffers {
    /// Per element type, its kept arrays (a `Vec<Vec<T>>` behind `Any`); a handful of types.
    shelves: Vec<(TypeId, Box<dyn Any>)>,
    lists: Vec<Vec<Vec<u32>>>,
}

/// An element type [`Buffers`] keeps arrays of: any plain value type.
pub(super) trait Element: Clone + 'static {}

impl<T: Clone + 'static> Element for T {}

impl Buffers {
    /// The kept arrays of element type `T`.
    fn shelf<T: Element>(&mut self) -> &mut Vec<Vec<T>> {
        let id = TypeId::of::<T>();
        let at = match self.shelves.iter().position(|(t, _)| *t == id) {
            Some(at) => at,
            None => {
                self.shelves.push((id, Box::new(Vec::<Vec<T>>::new())));
                self.shelves.len() - 1
            }
        };
        match self.shelves[at].1.downcast_mut::<Vec<Vec<T>>>() {
            Some(shelf) => shelf,
            None => unreachable!("a shelf holds arrays of the type it is filed under"),
        }
    }

    /// `vec![value; n]`, in a kept array where there is one.
    pub(super) fn filled<T: Element>(&mut self, n: usize, value: T) -> Vec<T> {
        let mut v = self.shelf::<T>().pop().unwrap_or_default();
        v.clear();
        v.resize(n, value);
        v
    }

    /// An empty array, in a kept one where there is one.
    pub(super) fn empty<T: Element>(&mut self) -> Vec<T> {
        let mut v = self.shelf::<T>().pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Keeps `v` for a later run.
    pub(super) fn keep<T: Element>(&mut self, v: Vec<T>) {
        if v.capacity() > 0 && v.capacity() <= KEEP_ELEMENTS {
            self.shelf::<T>().push(v);
        }
    }

    /// `n` empty lists (`vec![Vec::new(); n]`), in kept lists where there are.
    pub(super) fn lists(&mut self, n: usize) -> Vec<Vec<u32>> {
        let mut v = self.lists.pop().unwrap_or_default();
        v.truncate(n);
        v.iter_mut().for_each(Vec::clear);
        v.resize_with(n, Vec::new);
        v
    }

    /// Keeps lists from [`Buffers::lists`] for a later run.
    pub(super) fn keep_lists(&mut self, v: Vec<Vec<u32>>) {
        if v.capacity() > 0 && v.capacity() <= KEEP_ELEMENTS {
            self.lists.push(v);
        }
    }
}

/// Runs `f` on this thread's [`Buffers`]; a nested call (none is made today) gets fresh
/// ones rather than failing.
pub(super) fn with<R>(f: impl FnOnce(&mut Buffers) -> R) -> R {
    thread_local! {
        static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
    }
    BUFFERS.with(|b| match b.try_borrow_mut() {
        Ok(mut b) => f(&mut b),
        Err(_) => f(&mut Buffers::default()),
    })
}
