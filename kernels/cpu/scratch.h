/* Per-thread scratch blocks for a step's temporaries, kept between calls.
 *
 * The server fixes glibc's mmap threshold at 256 KB (kernels/devices/threads.py), so a
 * temporary past it is a fresh mapping per call, faulted in page by page: the synthetic
 * MoE's decode step allocated ~900 KB per mixture layer, ~6,000 page faults per B = 8
 * step, 17 % of the step on this VM (bench/RESULTS.md, 2026-12-04 third session). A block
 * of up to SCRATCH_KEEP bytes stays with its thread for the next call instead; a larger
 * one (a long prompt's mixture) is allocated and freed as before. */
#ifndef PANTHEON_SCRATCH_H
#define PANTHEON_SCRATCH_H

#include <stddef.h>

#define SCRATCH_KEEP ((size_t)8 << 20)
enum { SCRATCH_DECODE = 0, SCRATCH_MIXTURE = 1, SCRATCH_SLOTS = 2 };

/* A 64-byte aligned block of `bytes` (contents undefined), NULL when out of memory. Only
 * the caller's thread may use it, until it calls scratch_give_back or takes `slot` again. */
void *scratch_take(int slot, size_t bytes);
void scratch_give_back(int slot, void *block);

#endif
