//! Bulk copies without `rep movsb`, and how a rank writes large messages for another core
//! ([`PeerWrites`]: through the cache, or past it while that has collapsed).
//!
//! glibc's `memcpy` copies between about 2 KiB and the non-temporal threshold with `rep
//! movsb`, which on AMD Zen cores runs some 20× slower when source and destination sit at
//! certain relative offsets: measured on the development VM (AMD EPYC), 64 KiB copied at
//! 2.3 GB/s when `dst − src ≡ 16 (mod 4096)` against 46 GB/s at other offsets. That offset is
//! exactly what a 16-byte-aligned `Vec` (a user's buffer) and a 64-byte-aligned slot produce,
//! so every send and receive of a few KiB to a few hundred KiB could hit it. A plain loop of
//! unaligned vector loads and stores runs at full speed at every offset.

/// Below this many bytes `memcpy` does not use `rep movsb`; it is the fastest there.
const SMALL: usize = 1024;

/// Messages from this many bytes are written by [`PeerWrites`], which may bypass the cache.
const STREAM_MIN: usize = 64 << 10;

/// While a rank tries the other way (see [`PeerWrites`]), one in this many large messages
/// is written that way.
const EXPLORE_EVERY: u32 = 16;

/// Cached writes of large messages slower than this many bytes per ns (GB/s) have collapsed:
/// on the development VM they run at about 9 GB/s in its usual state and 1.7–2.3 GB/s in its
/// slow periods.
const COLLAPSED: f64 = 4.0;

/// Streamed writes are taken over collapsed cached ones when faster by more than this factor.
const STREAM_GAIN: f64 = 2.0;

/// How a rank writes large messages into the slots another core reads: through the cache
/// (regular stores), or past it (non-temporal stores) while cached writes have collapsed.
///
/// Why: a regular store to a slot needs the line back from the reader's cache. On the
/// development VM (2 vCPUs, AMD EPYC) that costs little most of the time, but for seconds at
/// a time it does not: a producer thread copying 256 KiB messages into two slots that a
/// consumer thread copies out then writes at 1.7–2.3 GB/s, against 8–9 GB/s otherwise
/// (whole processes at a time, with or without ASLR and core binding; prefetching the
/// lines for writing does not help). Non-temporal stores write 6–19 GB/s in those periods.
/// Otherwise they cost the reader, which then loads the message from memory instead of a
/// cache: 2-rank AllReduce ran 1.2–2.3× slower with every large message streamed. And the
/// writer's own rates cannot tell that: at 256 KiB its streamed writes of 128 KiB messages
/// ran 20–27 GB/s against 9 GB/s cached, while the call ran 1.2–1.3× slower streamed. Nor can
/// its history: a slow period often covers a whole job of a few seconds.
///
/// So a rank times every message from [`STREAM_MIN`] bytes (two clock reads against a copy
/// of 5 µs or more) and writes through the cache unless that has collapsed (below
/// [`COLLAPSED`] on average): then it tries streamed writes, one message in
/// [`EXPLORE_EVERY`], and streams while they are faster by more than [`STREAM_GAIN`],
/// trying cached writes one message in [`EXPLORE_EVERY`] to see them recover.
#[derive(Debug, Default)]
pub(crate) struct PeerWrites {
    /// The configured way (`HCCL_STREAM_WRITES`): chosen as below, or fixed.
    pub(crate) how: crate::StreamWrites,
    /// Writing past the cache now.
    streamed: bool,
    /// Bytes per ns of cached and of streamed writes (moving averages; 0 until measured).
    rate: [f64; 2],
    /// Large messages written so far.
    count: u32,
}

impl PeerWrites {
    /// Copies `len` bytes from `src` into a slot another core reads, then makes them visible
    /// before any later store (the publishing release store).
    ///
    /// # Safety
    /// As [`copy`].
    #[inline]
    pub(crate) unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        if len < STREAM_MIN || !can_stream() {
            // SAFETY: forwarded contract.
            unsafe { copy(dst, src, len) };
            return;
        }
        match self.how {
            crate::StreamWrites::Auto => {}
            // SAFETY (both): forwarded contract; `can_stream` checked the CPU.
            crate::StreamWrites::Always => return unsafe { stream(dst, src, len) },
            crate::StreamWrites::Never => return unsafe { copy(dst, src, len) },
        }
        self.count = self.count.wrapping_add(1);
        let streamed =
            self.streamed ^ (self.count.is_multiple_of(EXPLORE_EVERY) && self.exploring());
        let start = std::time::Instant::now();
        // SAFETY: forwarded contract; `can_stream` checked the CPU.
        unsafe {
            if streamed {
                stream(dst, src, len);
            } else {
                copy(dst, src, len);
            }
        }
        let rate = len as f64 / (start.elapsed().as_nanos() as f64).max(1.0);
        self.record(streamed, rate);
    }

    /// Whether the way not in use is tried now and then: always while streaming, and while
    /// cached writes have collapsed.
    fn exploring(&self) -> bool {
        self.streamed || (self.rate[0] > 0.0 && self.rate[0] < COLLAPSED)
    }

    /// Takes a measured rate (bytes per ns) of one way into account and picks the way.
    fn record(&mut self, streamed: bool, rate: f64) {
        let r = &mut self.rate[usize::from(streamed)];
        *r = if *r == 0.0 {
            rate
        } else {
            0.75 * *r + 0.25 * rate
        };
        let [cached, streamed] = self.rate;
        self.streamed = cached < COLLAPSED && cached * STREAM_GAIN < streamed;
    }
}

/// Whether [`stream`] bypasses the cache on this CPU.
#[inline]
fn can_stream() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Copies `len` bytes with non-temporal stores where [`can_stream`], then fences them.
///
/// # Safety
/// As [`copy`].
unsafe fn stream(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if can_stream() {
            // SAFETY: forwarded contract; AVX2 is present.
            unsafe { x86::stream_avx2(dst, src, len) };
            return;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { copy(dst, src, len) }
}

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: both ranges valid for `len` bytes, not overlapping.
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    if len < SMALL {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: forwarded contract; AVX2 is present.
            unsafe { x86::copy_avx2(dst, src, len) };
        } else {
            // SAFETY: forwarded contract; SSE2 is part of x86-64.
            unsafe { x86::copy_sse2(dst, src, len) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

/// Copies `len` bytes from `src` to `dst`, which may overlap.
///
/// # Safety
/// As [`std::ptr::copy`].
#[inline]
pub(crate) unsafe fn copy_overlapping(dst: *mut u8, src: *const u8, len: usize) {
    let (d, s) = (dst as usize, src as usize);
    if d.abs_diff(s) >= len {
        // SAFETY: the ranges are disjoint; forwarded contract.
        unsafe { copy(dst, src, len) };
    } else {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy(src, dst, len) };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm_sfence, _mm_storeu_si128, _mm256_loadu_si256,
        _mm256_storeu_si256, _mm256_stream_si256,
    };

    /// The loop of the AVX2 copies: `$len` bytes from `$src` to `$dst`, 128 per iteration
    /// by unaligned loads and `$store`, the tail by `memcpy`. Expanded in place (inside the
    /// `avx2` target feature), as a function generic over the store would not be inlined.
    macro_rules! avx2_loop {
        ($dst:expr, $src:expr, $len:expr, $store:ident) => {{
            const STEP: usize = 128;
            let (dst, src, len): (*mut u8, *const u8, usize) = ($dst, $src, $len);
            let mut i = 0;
            while i + STEP <= len {
                let s = src.add(i);
                let d = dst.add(i);
                let a = _mm256_loadu_si256(s.cast::<__m256i>());
                let b = _mm256_loadu_si256(s.add(32).cast::<__m256i>());
                let c = _mm256_loadu_si256(s.add(64).cast::<__m256i>());
                let e = _mm256_loadu_si256(s.add(96).cast::<__m256i>());
                $store(d.cast::<__m256i>(), a);
                $store(d.add(32).cast::<__m256i>(), b);
                $store(d.add(64).cast::<__m256i>(), c);
                $store(d.add(96).cast::<__m256i>(), e);
                i += STEP;
            }
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        }};
    }

    /// # Safety
    /// As [`super::copy`], and the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn stream_avx2(dst: *mut u8, src: *const u8, len: usize) {
        // Regular stores up to dst's first 32-byte boundary: non-temporal stores need it.
        let head = dst.align_offset(32).min(len);
        // SAFETY: every access is inside [0, len) of both ranges; the streamed stores are
        // at 32-byte multiples from dst + head, which is 32-byte aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            avx2_loop!(
                dst.add(head),
                src.add(head),
                len - head,
                _mm256_stream_si256
            );
            // Non-temporal stores are weakly ordered: fence them before the publishing store.
            _mm_sfence();
        }
    }

    /// # Safety
    /// As [`super::copy`], and the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_avx2(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: every access is inside [0, len) of both ranges; unaligned loads and stores.
        unsafe { avx2_loop!(dst, src, len, _mm256_storeu_si256) }
    }

    /// # Safety
    /// As [`super::copy`].
    pub(super) unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
        const STEP: usize = 64;
        let mut i = 0;
        // SAFETY: every access is inside [0, len) of both ranges; unaligned loads and stores.
        unsafe {
            while i + STEP <= len {
                let s = src.add(i);
                let d = dst.add(i);
                let a = _mm_loadu_si128(s.cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
                let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
                _mm_storeu_si128(d.cast::<__m128i>(), a);
                _mm_storeu_si128(d.add(16).cast::<__m128i>(), b);
                _mm_storeu_si128(d.add(32).cast::<__m128i>(), c);
                _mm_storeu_si128(d.add(48).cast::<__m128i>(), e);
                i += STEP;
            }
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type CopyFn = unsafe fn(*mut u8, *const u8, usize);

    /// Copies with `f` at every length of `lens` and (source, destination) offset pair, into
    /// a guarded buffer: the bytes must arrive exactly, and nothing around them change.
    fn exact(f: CopyFn, lens: &[usize], offsets: &[(usize, usize)]) {
        let max = lens.iter().max().copied().unwrap_or(0) + 64;
        let src: Vec<u8> = (0..max as u32).map(|i| (i * 13 + 5) as u8).collect();
        for &len in lens {
            for &(soff, doff) in offsets {
                let mut dst = vec![0xAAu8; len + 128];
                // SAFETY: both ranges are in bounds and distinct allocations.
                unsafe { f(dst.as_mut_ptr().add(doff), src.as_ptr().add(soff), len) };
                let what = format!("len {len} offsets {soff} {doff}");
                assert_eq!(&dst[doff..doff + len], &src[soff..soff + len], "{what}");
                assert!(dst[..doff].iter().all(|&b| b == 0xAA), "before: {what}");
                assert!(dst[doff + len..].iter().all(|&b| b == 0xAA), "past: {what}");
            }
        }
    }

    #[test]
    fn copies_every_length_and_offset_exactly() {
        let lens = [0, 1, 63, 1023, 1024, 1025, 1151, 4096, 5000, 9000];
        exact(copy, &lens, &[(0, 0), (1, 1), (16, 16), (33, 33)]);
    }

    #[test]
    fn streamed_copies_are_exact_at_every_length_and_offset() {
        let lens = [
            0,
            31,
            100,
            1000,
            STREAM_MIN - 1,
            STREAM_MIN,
            2 * STREAM_MIN + 77,
        ];
        exact(stream, &lens, &[(0, 0), (1, 0), (0, 1), (16, 33), (31, 7)]);
    }

    #[test]
    fn peer_writes_stream_only_while_cached_writes_have_collapsed() {
        let mut w = PeerWrites::default();
        // Nothing timed yet, and steady cached writes: nothing else is tried.
        assert!(!w.exploring() && !w.streamed);
        for _ in 0..20 {
            w.record(false, 9.0);
        }
        assert!(!w.exploring() && !w.streamed);
        // Streamed writes far faster for the writer while cached ones are healthy (the
        // reader pays for them): cached.
        w.record(true, 25.0);
        assert!(!w.streamed);
        // Cached writes collapse (a slow period): streamed writes are tried...
        for _ in 0..8 {
            w.record(false, 2.0);
        }
        assert!(w.exploring());
        // ...and streamed while they win by more than the gain (25 GB/s once, now 9).
        assert!(w.streamed);
        for _ in 0..8 {
            w.record(true, 9.0);
        }
        assert!(w.streamed && w.exploring());
        // Not when they gain less.
        let mut v = PeerWrites::default();
        v.record(false, 2.0);
        v.record(true, 3.0);
        assert!(v.exploring() && !v.streamed);
        // Cached writes recover: back to cached, and streamed ones are no longer tried.
        for _ in 0..8 {
            w.record(false, 9.0);
        }
        assert!(!w.streamed && !w.exploring());
    }

    #[test]
    fn peer_writes_copy_exactly_in_either_way() {
        let mut w = PeerWrites::default();
        let src: Vec<u8> = (0..(STREAM_MIN as u32 * 2))
            .map(|i| (i * 7 + 1) as u8)
            .collect();
        // Streaming (cached writes collapsed), so that both ways run.
        w.record(false, 0.01);
        w.record(true, 1000.0);
        assert!(w.streamed);
        let before = w.rate;
        for round in 0..(2 * EXPLORE_EVERY as usize) {
            let len = STREAM_MIN + round * 64 + round % 3;
            let mut dst = vec![0u8; len];
            // SAFETY: both ranges are in bounds and distinct allocations.
            unsafe { w.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
            assert_eq!(dst, src[..len], "round {round}");
        }
        if can_stream() {
            assert_eq!(w.count, 2 * EXPLORE_EVERY);
            assert!(w.rate[0] != before[0], "cached writes were timed");
            assert!(w.rate[1] != before[1], "streamed writes were timed");
        }
    }
}
