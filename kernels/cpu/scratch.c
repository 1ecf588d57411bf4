/* See scratch.h. Each thread's kept blocks are freed when the thread ends (a pthread key's
 * destructor: an engine thread ends when its model is unloaded). */
#include "scratch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *block[SCRATCH_SLOTS];
    size_t bytes[SCRATCH_SLOTS];
} kept_blocks;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void free_kept(void *p) {
    kept_blocks *k = p;
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        free(k->block[i]);
    free(k);
}

static void make_key(void) { (void)pthread_key_create(&g_key, free_kept); }

static kept_blocks *thread_blocks(void) {
    (void)pthread_once(&g_once, make_key);
    kept_blocks *k = pthread_getspecific(g_key);
    if (k == NULL) {
        k = calloc(1, sizeof(kept_blocks));
        if (k != NULL && pthread_setspecific(g_key, k) != 0) {
            free(k);
            k = NULL;
        }
    }
    return k;
}

static void *aligned(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes > 0 ? bytes : 64) == 0 ? p : NULL;
}

void *scratch_take(int slot, size_t bytes) {
    kept_blocks *k = bytes <= SCRATCH_KEEP ? thread_blocks() : NULL;
    if (k == NULL)
        return aligned(bytes);
    if (k->bytes[slot] < bytes) {
        free(k->block[slot]);
        k->block[slot] = aligned(bytes);
        k->bytes[slot] = k->block[slot] != NULL ? bytes : 0;
    }
    return k->block[slot];
}

void scratch_give_back(int slot, void *block) {
    (void)pthread_once(&g_once, make_key); /* no take may have made the key yet */
    kept_blocks *k = pthread_getspecific(g_key);
    if (k == NULL || block != k->block[slot])
        free(block);
}
