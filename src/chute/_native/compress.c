#include "compress.h"

#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "pool.h"
#include "zctx.h"

/* Records per shard below which another thread is not worth waking. */
enum { MIN_BLOCK = 4, SHARDS_PER_THREAD = 4 };

static size_t slot_capacity(uint64_t len, int codec) {
    return codec == CODEC_RAW ? (size_t)len : ZSTD_compressBound((size_t)len);
}

size_t chute_compress_capacity(const uint64_t *src_len, size_t n, int codec) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += slot_capacity(src_len[i], codec);
    return total;
}

typedef struct {
    compress_args *a;
    const size_t *slot; /* where record i's output starts before packing */
    int *nomem;
} compress_job;

static void compress_shard(void *p, size_t begin, size_t end, size_t shard) {
    compress_job *job = p;
    compress_args *a = job->a;
    ZSTD_CCtx *cctx = NULL;
    if (a->codec != CODEC_RAW && !(cctx = chute_thread_cctx())) {
        job->nomem[shard] = 1;
        return;
    }
    if (a->codec == CODEC_ZSTD_DICT) {
        /* A large dictionary's tables cost more to copy into the context than a small record
         * costs to compress: then use them in place ("attach"). */
        ZSTD_CCtx_reset(cctx, ZSTD_RESET_SESSION_AND_PARAMETERS);
        if (a->attach_dict)
            ZSTD_CCtx_setParameter(cctx, ZSTD_C_FORCE_ATTACH_DICT, ZSTD_DICT_FORCE_ATTACH);
        if (ZSTD_isError(ZSTD_CCtx_refCDict(cctx, a->cdict))) {
            job->nomem[shard] = 1;
            return;
        }
    }
    for (size_t i = begin; i < end; i++) {
        const uint8_t *src = a->src + a->src_off[i];
        size_t len = (size_t)a->src_len[i];
        a->crcs[i] = chute_crc32c(0, src, len);
        if (!a->out) { /* raw records already laid out end to end: nothing to copy */
            a->phys_len[i] = (uint32_t)len;
            a->codecs[i] = CODEC_RAW;
            continue;
        }
        uint8_t *out = a->out + job->slot[i];
        size_t r = (size_t)-1;
        if (a->codec != CODEC_RAW && len > 0) {
            size_t cap = slot_capacity(len, a->codec);
            r = a->codec == CODEC_ZSTD_DICT ? ZSTD_compress2(cctx, out, cap, src, len)
                                            : ZSTD_compressCCtx(cctx, out, cap, src, len, a->level);
        }
        if (ZSTD_isError(r) || r >= len) { /* did not shrink: store as is */
            memcpy(out, src, len);
            a->phys_len[i] = (uint32_t)len;
            a->codecs[i] = CODEC_RAW;
        } else {
            a->phys_len[i] = (uint32_t)r;
            a->codecs[i] = (uint8_t)a->codec;
        }
    }
}

void chute_compress(compress_args *a) {
    a->packed = 0;
    a->nomem = 0;
    if (a->n == 0) return;
    size_t max_shards = (a->max_threads ? a->max_threads : 1) * SHARDS_PER_THREAD;
    size_t ns = chute_shard_count(a->n, MIN_BLOCK, max_shards);
    size_t *slot = malloc(a->n * sizeof *slot);
    int *nomem = calloc(ns, sizeof *nomem);
    if (!slot || !nomem) {
        free(slot);
        free(nomem);
        a->nomem = 1;
        return;
    }
    size_t pos = 0;
    for (size_t i = 0; i < a->n; i++) {
        slot[i] = pos;
        pos += slot_capacity(a->src_len[i], a->codec);
    }
    compress_job job = {.a = a, .slot = slot, .nomem = nomem};
    chute_parallel(a->n, MIN_BLOCK, max_shards, a->max_threads, compress_shard, &job);
    for (size_t s = 0; s < ns; s++) a->nomem |= nomem[s];
    /* Pack the records densely; each moves down (or stays), so memmove in order is safe. */
    size_t w = 0;
    for (size_t i = 0; i < a->n && !a->nomem && a->out; i++) {
        if (w != slot[i]) memmove(a->out + w, a->out + slot[i], a->phys_len[i]);
        w += a->phys_len[i];
    }
    a->packed = w;
    free(slot);
    free(nomem);
}
