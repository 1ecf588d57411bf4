/* See pool.h. The job is published seqlock-style: `state` holds (generation << 32) | next
 * index; an odd generation means the caller is writing a new job. A worker copies the job,
 * then claims an index with a compare-and-swap on the state it read first, so a claim
 * succeeds only if the job it copied is still the current one. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_WORKERS 255
#define IDX_MASK 0xffffffffull
/* A waiting worker polls with `pause` this many times, then with sched_yield (so that a
 * caller the OS put on the same core gets it) this many more, then sleeps. */
#define SPIN_POLLS 256
#define YIELD_POLLS 4000

static _Atomic uint64_t g_state = 0;          /* (gen << 32) | next index */
static _Atomic(pool_fn) g_fn = NULL;
static _Atomic(void *) g_ctx = NULL;
static _Atomic int64_t g_n = 0;
static _Atomic int64_t g_done = 0;             /* indices finished in this generation */
static _Atomic uint32_t g_posted = 0;          /* bumped per job: what workers wait on */
static _Atomic int g_sleepers = 0;
static int g_workers = 0;                      /* started (under g_start_lock) */
static pthread_mutex_t g_start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_run_lock = PTHREAD_MUTEX_INITIALIZER; /* one caller at a time */
static pthread_mutex_t g_sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_sleep_cond = PTHREAD_COND_INITIALIZER;

/* Claim and run indices of the current job until none is left. */
static void drain(void) {
    for (;;) {
        uint64_t s = atomic_load(&g_state);
        if ((s >> 32) & 1)
            return; /* a job is being written: nothing of ours to claim */
        const pool_fn fn = atomic_load_explicit(&g_fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&g_ctx, memory_order_relaxed);
        const int64_t n = atomic_load_explicit(&g_n, memory_order_relaxed);
        /* seqlock read side: the claim below fails if the job changed meanwhile */
        atomic_thread_fence(memory_order_acquire);
        const int64_t i = (int64_t)(s & IDX_MASK);
        if (fn == NULL || i >= n)
            return;
        if (atomic_compare_exchange_weak(&g_state, &s, s + 1)) {
            fn(ctx, i);
            atomic_fetch_add(&g_done, 1);
        }
    }
}

static void *worker(void *arg) {
    (void)arg;
    uint32_t seen = atomic_load(&g_posted);
    for (;;) {
        int polls = 0;
        while (atomic_load(&g_posted) == seen) {
            if (++polls < SPIN_POLLS) {
                CPU_RELAX();
                continue;
            }
            if (polls < SPIN_POLLS + YIELD_POLLS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&g_sleep_lock);
            atomic_fetch_add(&g_sleepers, 1);
            while (atomic_load(&g_posted) == seen)
                pthread_cond_wait(&g_sleep_cond, &g_sleep_lock);
            atomic_fetch_sub(&g_sleepers, 1);
            pthread_mutex_unlock(&g_sleep_lock);
        }
        seen = atomic_load(&g_posted);
        drain();
    }
    return NULL;
}

static void ensure_workers(int want) {
    if (want > MAX_WORKERS)
        want = MAX_WORKERS;
    if (want <= g_workers)
        return;
    pthread_mutex_lock(&g_start_lock);
    while (g_workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* fewer workers: the caller runs what they do not */
        g_workers++;
    }
    pthread_mutex_unlock(&g_start_lock);
}

void pool_run(int nthreads, int64_t n_jobs, pool_fn fn, void *ctx) {
    if (n_jobs <= 0)
        return;
    if (nthreads <= 1 || n_jobs == 1 || pthread_mutex_trylock(&g_run_lock) != 0) {
        for (int64_t i = 0; i < n_jobs; i++)
            fn(ctx, i);
        return;
    }
    ensure_workers(nthreads - 1);
    /* Publish: odd generation while writing, then even with index 0. */
    const uint64_t gen = atomic_load(&g_state) >> 32;
    atomic_store(&g_state, ((gen + 1) << 32) | IDX_MASK);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&g_fn, fn, memory_order_relaxed);
    atomic_store_explicit(&g_ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&g_n, n_jobs, memory_order_relaxed);
    atomic_store(&g_done, 0);
    atomic_store(&g_state, (gen + 2) << 32);
    atomic_fetch_add(&g_posted, 1);
    if (atomic_load(&g_sleepers) > 0) {
        pthread_mutex_lock(&g_sleep_lock);
        pthread_cond_broadcast(&g_sleep_cond);
        pthread_mutex_unlock(&g_sleep_lock);
    }
    drain();
    /* Every index is claimed; wait for the ones a worker is still running. */
    int polls = 0;
    while (atomic_load(&g_done) < n_jobs) {
        if (++polls < SPIN_POLLS)
            CPU_RELAX();
        else
            sched_yield();
    }
    /* Retire the job so that no late worker finds it. */
    atomic_store(&g_state, ((gen + 3) << 32) | IDX_MASK);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&g_fn, NULL, memory_order_relaxed);
    atomic_store(&g_state, (gen + 4) << 32);
    pthread_mutex_unlock(&g_run_lock);
}
