#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 256
/* How long a worker that just ran a job keeps polling for the next before it sleeps, and how
 * long a caller polls for its helpers to finish before it sleeps: a sleeping thread takes
 * tens of microseconds to wake on a busy or virtual machine, which is the whole cost of a
 * small gather, while back-to-back gathers (a loader's) come well within this. Workers a job
 * had no room for sleep at once, so a many-core machine running narrow gathers burns no
 * more than the threads that work. */
#define SPIN_NS 100000L

typedef struct {
    chute_shard_fn fn;
    void *ctx;
    size_t n, nshards;
    atomic_size_t next;   /* next shard to claim */
    atomic_size_t done;   /* shards finished (changed under state_lock, polled without) */
    atomic_size_t active; /* workers holding a pointer to this job (likewise) */
    size_t helpers;       /* workers that may join: max_threads - 1 */
} job_t;

static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER; /* one job in the pool at a time */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static job_t *current;
static atomic_ulong generation; /* changed under state_lock, polled without */
static size_t nworkers;
static int started;
static int atfork_registered;

static void shard_bounds(const job_t *job, size_t s, size_t *b, size_t *e) {
    size_t base = job->n / job->nshards, extra = job->n % job->nshards;
    *b = s * base + (s < extra ? s : extra);
    *e = *b + base + (s < extra ? 1 : 0);
}

/* Claims and runs shards until none are left; returns how many it ran. */
static size_t run_shards(job_t *job) {
    size_t ran = 0;
    for (;;) {
        size_t s = atomic_fetch_add(&job->next, 1);
        if (s >= job->nshards) return ran;
        size_t b, e;
        shard_bounds(job, s, &b, &e);
        job->fn(job->ctx, b, e, s);
        ran++;
    }
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Polls, for at most SPIN_NS, until ready(arg) holds; whether it did. */
static int spin_until(int (*ready)(const void *), const void *arg) {
    long until = now_ns() + SPIN_NS;
    for (unsigned k = 1; !ready(arg); k++) {
        if ((k & 63) == 0) {
            if (now_ns() > until) return 0;
            sched_yield(); /* one core may be all there is: let the thread we wait on run */
        }
    }
    return 1;
}

static int moved_on(const void *seen) {
    return atomic_load(&generation) != *(const unsigned long *)seen;
}

static int finished(const void *job) {
    const job_t *j = job;
    return atomic_load(&j->done) >= j->nshards && atomic_load(&j->active) == 0;
}

static void *worker_main(void *arg) {
    (void)arg;
    unsigned long seen = 0;
    int ran_one = 0; /* only a worker that just ran a job polls for the next before sleeping */
    for (;;) {
        if (ran_one) spin_until(moved_on, &seen);
        pthread_mutex_lock(&state_lock);
        while (atomic_load(&generation) == seen) pthread_cond_wait(&work_cv, &state_lock);
        seen = atomic_load(&generation);
        job_t *job = current;
        ran_one = job && atomic_load(&job->active) < job->helpers;
        if (!ran_one) { /* no room in this job (it wants fewer threads): back to sleep */
            pthread_mutex_unlock(&state_lock);
            continue;
        }
        atomic_fetch_add(&job->active, 1);
        pthread_mutex_unlock(&state_lock);
        size_t ran = run_shards(job);
        pthread_mutex_lock(&state_lock);
        atomic_fetch_add(&job->done, ran);
        atomic_fetch_sub(&job->active, 1);
        pthread_cond_broadcast(&done_cv);
        pthread_mutex_unlock(&state_lock);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: start afresh on first use. */
static void after_fork_child(void) {
    pthread_mutex_init(&submit_lock, NULL);
    pthread_mutex_init(&state_lock, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    current = NULL;
    started = 0;
    nworkers = 0;
}

static void ensure_started(void) {
    if (started) return;
    if (!atfork_registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_registered = 1;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
    size_t want = cpus > 1 ? (size_t)cpus - 1 : 0;
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (size_t i = 0; i < want; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker_main, NULL) != 0) break;
        nworkers++;
    }
    pthread_attr_destroy(&attr);
    started = 1;
}

size_t chute_shard_count(size_t n, size_t min_block, size_t max_shards) {
    if (n == 0) return 0;
    if (min_block == 0) min_block = 1;
    size_t s = (n + min_block - 1) / min_block;
    if (max_shards == 0) max_shards = 1;
    return s < max_shards ? s : max_shards;
}

size_t chute_parallel(size_t n, size_t min_block, size_t max_shards, size_t max_threads,
                      chute_shard_fn fn, void *ctx) {
    size_t nshards = chute_shard_count(n, min_block, max_shards);
    if (nshards == 0) return 0;
    job_t job = {.fn = fn, .ctx = ctx, .n = n, .nshards = nshards};
    job.helpers = max_threads > 1 ? max_threads - 1 : 0;
    atomic_init(&job.next, 0);
    atomic_init(&job.done, 0);
    atomic_init(&job.active, 0);
    if (nshards == 1 || job.helpers == 0 || pthread_mutex_trylock(&submit_lock) != 0) {
        run_shards(&job);
        return nshards;
    }
    pthread_mutex_lock(&state_lock);
    ensure_started();
    if (nworkers == 0) {
        pthread_mutex_unlock(&state_lock);
        pthread_mutex_unlock(&submit_lock);
        run_shards(&job);
        return nshards;
    }
    current = &job;
    atomic_fetch_add(&generation, 1);
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&state_lock);

    size_t ran = run_shards(&job);
    atomic_fetch_add(&job.done, ran);
    /* The job lives on this stack: wait for every worker to let go of it (polling first:
     * they are running, and a sleeping caller wakes late). */
    spin_until(finished, &job);
    pthread_mutex_lock(&state_lock);
    while (!finished(&job)) pthread_cond_wait(&done_cv, &state_lock);
    current = NULL;
    pthread_mutex_unlock(&state_lock);
    pthread_mutex_unlock(&submit_lock);
    return nshards;
}
