//! Test-only fault injection (feature `fault-injection`; the executor's own tests turn it
//! on, release builds never carry it): flips a bit of one message after its checksum was
//! taken, so the checksum tests see corruption caught. The target comes from
//! `HCCL_FAULT_CORRUPT=SITE:RANK:N` (child processes of the tests) or [`arm`] (ranks that
//! are threads of the test): the `N`-th message (from 0) that rank `RANK` handles at `SITE`:
//!
//! - `slot`: a message the rank writes into a slot on its own host (after sealing it, when
//!   checksums are on);
//! - `wire`: a read of a data part's bytes from the network (before they are checked, when
//!   checksums are on).
//!
//! Without the feature nothing of this exists but a `corrupt` that is `false`.

/// Where a message is corrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// Written into a slot of this host.
    Slot,
    /// Read from the network.
    Wire,
}

#[cfg(feature = "fault-injection")]
mod armed {
    use super::Site;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0 before the first use, 1 when nothing is armed (the common case: no lock), 2 armed.
    static ARMED: AtomicU8 = AtomicU8::new(0);

    /// The target and how many messages of it were seen; `None` before the first use.
    type State = Option<(Option<(Site, u32, u64)>, u64)>;
    static STATE: Mutex<State> = Mutex::new(None);

    fn from_env() -> Option<(Site, u32, u64)> {
        let v = std::env::var("HCCL_FAULT_CORRUPT").ok()?;
        let mut it = v.split(':');
        let site = match it.next()? {
            "slot" => Site::Slot,
            "wire" => Site::Wire,
            _ => return None,
        };
        Some((site, it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    }

    /// Corrupts the `nth` message (from 0) rank `rank` handles at `site` from now on.
    pub fn arm(site: Site, rank: u32, nth: u64) {
        *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some((Some((site, rank, nth)), 0));
        ARMED.store(2, Ordering::Release);
    }

    pub(crate) fn corrupt(site: Site, rank: u32) -> bool {
        if ARMED.load(Ordering::Acquire) == 1 {
            return false;
        }
        let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
        let (target, seen) = st.get_or_insert_with(|| {
            let t = from_env();
            let _ = ARMED.compare_exchange(
                0,
                if t.is_some() { 2 } else { 1 },
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            (t, 0)
        });
        match *target {
            Some((s, r, nth)) if s == site && r == rank => {
                let k = *seen;
                *seen += 1;
                k == nth
            }
            _ => false,
        }
    }
}

#[cfg(feature = "fault-injection")]
pub use armed::arm;
#[cfg(feature = "fault-injection")]
pub(crate) use armed::corrupt;

/// Whether to corrupt this message: never, without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn corrupt(_site: Site, _rank: u32) -> bool {
    false
}
