/* A small persistent thread pool that splits a range into contiguous shards. */
#ifndef CHUTE_POOL_H
#define CHUTE_POOL_H
#include <stddef.h>

/* Runs fn(ctx, begin, end, shard) over [0, n) in up to `max_shards` contiguous blocks of at
 * least `min_block` items each, on at most `max_threads` threads: the caller claims shards
 * itself and up to max_threads - 1 pool workers claim the rest. If another call holds the
 * pool, every shard runs inline on the caller (so concurrent callers each keep a core busy
 * rather than queueing). Safe to call without the GIL. */
typedef void (*chute_shard_fn)(void *ctx, size_t begin, size_t end, size_t shard);
size_t chute_parallel(size_t n, size_t min_block, size_t max_shards, size_t max_threads,
                      chute_shard_fn fn, void *ctx);

/* Upper bound on how many shards chute_parallel can make for max_shards. */
size_t chute_shard_count(size_t n, size_t min_block, size_t max_shards);

#endif
