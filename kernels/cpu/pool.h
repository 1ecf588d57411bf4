/* A small thread pool for the compiled kernels: the caller and up to n - 1 workers claim
 * the indices 0 .. n_jobs - 1 of a job from one atomic counter; the caller returns once
 * every index has run. A worker that is not running when the job is posted (its core is
 * busy with another process) simply finds nothing left to claim: unlike a fork/join
 * barrier, the caller never waits for a thread that has not started. Each index runs
 * wholly on one thread, so results never depend on the thread count. */
#ifndef PANTHEON_CPU_POOL_H
#define PANTHEON_CPU_POOL_H

#include <stdint.h>

typedef void (*pool_fn)(void *ctx, int64_t index);

/* Run fn(ctx, i) for i in [0, n_jobs) on up to `nthreads` threads (the caller included).
 * Calls from several threads at once are fine: one at a time gets the workers, the
 * others run their jobs on their own thread. */
void pool_run(int nthreads, int64_t n_jobs, pool_fn fn, void *ctx);

#endif
