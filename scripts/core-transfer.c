// Core-to-core transfer probe (scripts/core-transfer.sh): one thread on the first allowed CPU
// writes 256 KiB messages into two slots, another thread on the second copies each out, as
// the executor's ranks do through their shared slots. Prints, per round, the writer's and the
// reader's copy rates (GB/s, copy time only) with regular stores and with non-temporal
// (streamed) stores. On the 2-vCPU development VM the writer's regular stores fall from 8-9
// to about 2 GB/s for seconds at a time; streamed stores do not.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MSG = 256 << 10, SLOTS = 2, SRC = 32 << 20, MESSAGES = 1024 };

static char *src, *dst, *slots;
static _Atomic long written, read_;
static int streamed, cpu[2];
static double wsec, rsec;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) static void copy(char *d, const char *s, size_t n, int nt) {
    for (size_t i = 0; i + 32 <= n; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(s + i));
        if (nt)
            _mm256_stream_si256((__m256i *)(d + i), v);
        else
            _mm256_storeu_si256((__m256i *)(d + i), v);
    }
    if (nt)
        _mm_sfence();
}

static void pin(int c) {
    cpu_set_t m;
    CPU_ZERO(&m);
    CPU_SET(c, &m);
    sched_setaffinity(0, sizeof m, &m);
}

static void *writer(void *arg) {
    (void)arg;
    pin(cpu[0]);
    for (long k = 0; k < MESSAGES; k++) {
        while (k - atomic_load(&read_) >= SLOTS)
            _mm_pause();
        double t = now();
        copy(slots + (k % SLOTS) * MSG, src + (k * MSG) % SRC, MSG, streamed);
        wsec += now() - t;
        atomic_store(&written, k + 1);
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    pin(cpu[1]);
    for (long k = 0; k < MESSAGES; k++) {
        while (atomic_load(&written) <= k)
            _mm_pause();
        double t = now();
        copy(dst + (k * MSG) % SRC, slots + (k % SLOTS) * MSG, MSG, 0);
        rsec += now() - t;
        atomic_store(&read_, k + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    for (int c = 0, found = 0; c < CPU_SETSIZE && found < 2; c++)
        if (CPU_ISSET(c, &allowed))
            cpu[found++] = c;
    src = aligned_alloc(4096, SRC);
    dst = aligned_alloc(4096, SRC);
    slots = aligned_alloc(4096, SLOTS * MSG);
    memset(src, 1, SRC);
    memset(dst, 2, SRC);
    memset(slots, 0, SLOTS * MSG);
    printf("round  regular: writer reader GB/s   streamed: writer reader GB/s\n");
    for (int r = 0; r < rounds; r++) {
        double rate[2][2];
        for (streamed = 0; streamed < 2; streamed++) {
            pthread_t w, d;
            written = read_ = 0;
            wsec = rsec = 0;
            pthread_create(&w, NULL, writer, NULL);
            pthread_create(&d, NULL, reader, NULL);
            pthread_join(w, NULL);
            pthread_join(d, NULL);
            rate[streamed][0] = (double)MESSAGES * MSG / wsec / 1e9;
            rate[streamed][1] = (double)MESSAGES * MSG / rsec / 1e9;
        }
        printf("%5d  %16.1f %6.1f   %17.1f %6.1f\n", r, rate[0][0], rate[0][1], rate[1][0],
               rate[1][1]);
        fflush(stdout);
    }
    return 0;
}
