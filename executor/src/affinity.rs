//! CPU affinity: binding a rank (the calling thread) to one core, as `mpirun` does by
//! default when ranks do not outnumber cores.
//!
//! Binding matters on a small shared host: an unbound pair of busy ranks may be placed on the
//! same core, where every message costs a context switch, while a bound pair always runs on
//! two cores. Launchers (and `hccl-perf`, which is its own launcher) decide whether to bind;
//! the executor never binds by itself.

use crate::error::{ExecError, Result};

/// Words of the CPU mask passed to the kernel (1024 CPUs).
#[cfg(target_os = "linux")]
const MASK_WORDS: usize = 16;

#[cfg(target_os = "linux")]
unsafe extern "C" {
    fn sched_getaffinity(pid: i32, cpusetsize: usize, mask: *mut u64) -> i32;
    fn sched_setaffinity(pid: i32, cpusetsize: usize, mask: *const u64) -> i32;
}

/// The CPUs the calling thread may run on, in ascending order (empty where unknown).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        let mut mask = [0u64; MASK_WORDS];
        // SAFETY: the mask is valid for `size_of_val(&mask)` bytes; pid 0 is this thread.
        let rc = unsafe { sched_getaffinity(0, std::mem::size_of_val(&mask), mask.as_mut_ptr()) };
        if rc != 0 {
            return Vec::new();
        }
        (0..MASK_WORDS * 64)
            .filter(|&c| mask[c / 64] >> (c % 64) & 1 == 1)
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Binds the calling thread to the `index`-th CPU it may run on (wrapping around), and
/// returns that CPU's number.
pub fn bind_current_thread(index: usize) -> Result<usize> {
    let cpus = allowed_cpus();
    if cpus.is_empty() {
        return Err(ExecError::Invalid(
            "cannot bind to a core: the allowed CPU set is unknown on this system".into(),
        ));
    }
    let cpu = cpus[index % cpus.len()];
    #[cfg(target_os = "linux")]
    {
        let mut mask = [0u64; MASK_WORDS];
        mask[cpu / 64] |= 1 << (cpu % 64);
        // SAFETY: as in `allowed_cpus`.
        let rc = unsafe { sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) };
        if rc != 0 {
            return Err(ExecError::Invalid(format!(
                "cannot bind to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(cpu)
}

/// Lets the calling thread run on every CPU the process's cpuset allows again (for helper
/// threads a bound rank starts: they must not compete with the rank for its one core).
pub fn unbind_current_thread() {
    #[cfg(target_os = "linux")]
    {
        // The kernel intersects the mask with the cpuset's CPUs.
        let mask = [u64::MAX; MASK_WORDS];
        // SAFETY: as in `allowed_cpus`.
        let _ = unsafe { sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_keeps_the_thread_inside_its_allowed_set() {
        std::thread::spawn(|| {
            let before = allowed_cpus();
            if before.is_empty() {
                assert!(bind_current_thread(0).is_err());
                return;
            }
            let last = before.len() - 1;
            let cpu = bind_current_thread(last).expect("bind to an allowed CPU");
            assert_eq!(cpu, before[last]);
            assert_eq!(allowed_cpus(), vec![cpu]);
            // Indices wrap around the (now single-CPU) set.
            assert_eq!(bind_current_thread(5).expect("bind again"), cpu);
        })
        .join()
        .expect("the binding thread");
    }
}
