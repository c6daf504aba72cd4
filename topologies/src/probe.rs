//! Measures this machine, so the compiler can describe it: the memory-copy bandwidth one core
//! reaches and how many cores there are. The CPU executor's plans are compiled for a `host`
//! topology built from these numbers instead of a GPU machine's by habit.

use std::time::Instant;

/// Buffer size of the probe: large enough to leave the caches on common machines.
const PROBE_BYTES: usize = 64 << 20;

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostProbe {
    /// Memory-copy bandwidth of one core (GB/s of bytes copied), best of a few runs.
    pub copy_gbps: f64,
    /// Cores available to this process.
    pub cores: u32,
}

/// Copies a 64 MiB buffer a few times and reports the best rate; takes about 30–100 ms.
pub fn probe_host() -> HostProbe {
    let src = vec![1u8; PROBE_BYTES];
    let mut dst = vec![0u8; PROBE_BYTES];
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let copy_gbps = if best > 0.0 {
        PROBE_BYTES as f64 / best / 1e9
    } else {
        crate::generate::CPU_MEM_BW
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    HostProbe { copy_gbps, cores }
}

impl HostProbe {
    /// Bandwidth each of `ranks` ranks gets when they share the probed cores: a rank that
    /// shares a core with others gets its share of that core.
    pub fn per_rank_gbps(&self, ranks: u32) -> f64 {
        let share = f64::from(self.cores.max(1)) / f64::from(ranks.max(1));
        // Rounded to 0.1 GB/s: the probe is not more precise, and topology files stay tidy.
        ((self.copy_gbps * share.min(1.0) * 10.0).round() / 10.0).max(0.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscribed_ranks_share_cores() {
        let probe = HostProbe {
            copy_gbps: 12.0,
            cores: 2,
        };
        assert_eq!(probe.per_rank_gbps(2), 12.0);
        assert_eq!(probe.per_rank_gbps(8), 3.0);
        assert_eq!(probe.per_rank_gbps(1), 12.0);
    }

    #[test]
    fn probe_reports_a_positive_finite_rate() {
        let probe = probe_host();
        assert!(probe.copy_gbps.is_finite() && probe.copy_gbps > 0.0);
        assert!(probe.cores >= 1);
    }
}
