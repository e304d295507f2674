#define _GNU_SOURCE
#include "gather.h"

#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "pool.h"
#include "zctx.h"

/* Work, in bytes of plain copy, that makes another shard worth waking a thread for. */
enum { SHARD_WORK = 48 * 1024, SHARDS_PER_THREAD = 4 };

size_t chute_work_shards(uint64_t work, size_t max_threads, uint64_t shard_work) {
    size_t most = (max_threads ? max_threads : 1) * SHARDS_PER_THREAD;
    uint64_t by_work = work / shard_work + 1;
    return by_work < most ? (size_t)by_work : most;
}

/* Where record loc lies is inside its chunk's readable bytes, and its lengths under the cap. */
static int check_loc(const zr_store *s, const zr_loc *loc, long long *detail) {
    if (loc->chunk_id >= s->nchunks) {
        *detail = loc->chunk_id;
        return GE_CHUNK;
    }
    if (loc->logic_length > MAX_RECORD || loc->phys_length > MAX_RECORD) {
        *detail = loc->logic_length;
        return GE_TOO_LARGE;
    }
    if ((uint64_t)loc->offset + loc->phys_length > s->limits[loc->chunk_id]) {
        *detail = (long long)loc->offset + loc->phys_length;
        return GE_BOUNDS;
    }
    if (loc->codec == CODEC_RAW && loc->phys_length != loc->logic_length) {
        *detail = loc->phys_length;
        return GE_LENGTH;
    }
    return GE_OK;
}

/* Decodes one compressed record into out[0..logic). *dctx is the thread's decoder, fetched on
 * the first compressed record. */
static int decode_zstd(const zr_store *s, ZSTD_DCtx **dctx, const zr_loc *loc, uint8_t *out,
                       long long *detail) {
    const uint8_t *src = s->bases[loc->chunk_id] + loc->offset;
    if (loc->codec != CODEC_ZSTD && loc->codec != CODEC_ZSTD_DICT) {
        *detail = loc->codec;
        return GE_CODEC;
    }
    if (loc->codec == CODEC_ZSTD_DICT && !s->ddict) return GE_NO_DICT;
    if (!*dctx && !(*dctx = chute_thread_dctx())) return GE_NOMEM;
    size_t r = loc->codec == CODEC_ZSTD
                   ? ZSTD_decompressDCtx(*dctx, out, loc->logic_length, src, loc->phys_length)
                   : ZSTD_decompress_usingDDict(*dctx, out, loc->logic_length, src,
                                                loc->phys_length, s->ddict);
    if (ZSTD_isError(r)) {
        *detail = (long long)r;
        return GE_DECODE;
    }
    if (r != loc->logic_length) {
        *detail = (long long)r;
        return GE_LENGTH;
    }
    return GE_OK;
}

/* Decodes one record into out[0..logic). Returns a GE_* code. */
static int decode_one(const zr_store *s, ZSTD_DCtx **dctx, const zr_loc *loc, uint8_t *out,
                      long long *detail) {
    int code = check_loc(s, loc, detail);
    if (code != GE_OK) return code;
    if (loc->codec == CODEC_RAW) {
        if (loc->logic_length) memcpy(out, s->bases[loc->chunk_id] + loc->offset, loc->logic_length);
        return GE_OK;
    }
    return decode_zstd(s, dctx, loc, out, detail);
}

/* Record ix's logical bytes against the sidecar: GE_OK, or the damage they show. A record the
 * sidecar cannot vouch for (an edit by a writer that keeps none) counts in *unchecked. */
static int check_sum(const zr_store *s, int64_t ix, const zr_loc *loc, const uint8_t *bytes,
                     long long *detail, uint64_t *unchecked) {
    const zr_sum *sum = (uint64_t)ix < s->nsums ? &s->sums[ix] : NULL;
    int same = sum && sum->offset == loc->offset && sum->chunk_id == loc->chunk_id &&
               sum->phys_length == loc->phys_length && sum->codec == loc->codec;
    if (sum && sum->valid && same) {
        uint32_t c = chute_crc32c(0, bytes, loc->logic_length);
        if (c != sum->crc) {
            *detail = c;
            return GE_CHECKSUM;
        }
    } else if (sum && sum->valid && s->strict) {
        return GE_TABLE;
    } else if (!sum && s->strict) {
        *detail = (long long)s->nsums; /* in step, yet shorter than the table: truncated */
        return GE_SUMS;
    } else {
        (*unchecked)++;
    }
    return GE_OK;
}

int chute_record_view(const zr_store *s, ZSTD_DCtx **dctx, int64_t ix, uint8_t *scratch,
                      const uint8_t **data, uint32_t *length, long long *detail,
                      uint64_t *unchecked) {
    if (ix < 0 || (uint64_t)ix >= s->length) {
        *detail = ix;
        return GE_INDEX;
    }
    const zr_loc *loc = &s->table[ix];
    int code = check_loc(s, loc, detail);
    if (code != GE_OK) return code;
    if (loc->codec == CODEC_RAW) {
        *data = s->bases[loc->chunk_id] + loc->offset;
    } else {
        code = decode_zstd(s, dctx, loc, scratch, detail);
        if (code != GE_OK) return code;
        *data = scratch;
    }
    *length = loc->logic_length;
    return s->sums ? check_sum(s, ix, loc, *data, detail, unchecked) : GE_OK;
}

/* The store index i of a batch reads. */
static inline const zr_store *store_of(const gather_args *a, size_t i) {
    return &a->stores[a->which ? a->which[i] : 0];
}

typedef struct {
    gather_args *a;
    gather_error *errs; /* one per shard */
    uint64_t *unchecked;
} gather_job;

static void gather_shard(void *p, size_t begin, size_t end, size_t shard) {
    gather_job *job = p;
    gather_args *a = job->a;
    gather_error *err = &job->errs[shard];
    ZSTD_DCtx *dctx = NULL;
    for (size_t i = begin; i < end; i++) {
        long long detail = 0;
        int64_t ix = a->idx[i];
        const zr_store *st = store_of(a, i);
        int code = GE_OK;
        if (ix < 0 || (uint64_t)ix >= st->length) {
            code = GE_INDEX;
            detail = ix;
        } else {
            const zr_loc *loc = &st->table[ix];
            uint64_t off = a->dst_off ? a->dst_off[i] : (uint64_t)i * a->stride;
            uint64_t want = a->dst_off ? loc->logic_length : a->stride;
            if (loc->logic_length > MAX_RECORD || loc->phys_length > MAX_RECORD) {
                /* damage, not a size mismatch: say so before comparing with the slot */
                code = GE_TOO_LARGE;
                detail = loc->logic_length > MAX_RECORD ? loc->logic_length : loc->phys_length;
            } else if (loc->codec == CODEC_RAW && loc->phys_length != loc->logic_length) {
                code = GE_LENGTH; /* likewise: a raw record has one length */
                detail = loc->phys_length;
            } else if (loc->logic_length != want) {
                code = GE_DST;
                detail = loc->logic_length;
            } else if (off > a->dst_len || a->dst_len - off < loc->logic_length) {
                code = GE_DST;
                detail = (long long)off;
            } else {
                uint8_t *out = a->dst + off;
                code = decode_one(st, &dctx, loc, out, &detail);
                if (code == GE_OK && st->sums)
                    code = check_sum(st, ix, loc, out, &detail, &job->unchecked[shard]);
            }
        }
        if (code != GE_OK) {
            err->code = code;
            err->pos = i;
            err->detail = detail;
            return;
        }
    }
}

void chute_gather(gather_args *a) {
    memset(&a->err, 0, sizeof a->err);
    a->unchecked = 0;
    /* Split by work, not records: a small batch is cheaper on one core than a wake-up. A
     * compressed record costs a frame set-up plus a few times its bytes in a plain copy. */
    uint64_t work = 0;
    for (size_t i = 0; i < a->n; i++) {
        int64_t ix = a->idx[i];
        const zr_store *st = store_of(a, i);
        if (ix >= 0 && (uint64_t)ix < st->length) work += chute_record_work(&st->table[ix]);
    }
    size_t max_shards = chute_work_shards(work, a->max_threads, SHARD_WORK);
    size_t min_block = 1;
    size_t ns = chute_shard_count(a->n, min_block, max_shards);
    if (ns == 0) return;
    gather_error *errs = calloc(ns, sizeof *errs);
    uint64_t *unchecked = calloc(ns, sizeof *unchecked);
    if (!errs || !unchecked) {
        free(errs);
        free(unchecked);
        a->err.code = GE_NOMEM;
        return;
    }
    gather_job job = {.a = a, .errs = errs, .unchecked = unchecked};
    chute_parallel(a->n, min_block, max_shards, a->max_threads, gather_shard, &job);
    for (size_t s = 0; s < ns; s++) {
        a->unchecked += unchecked[s];
        if (errs[s].code != GE_OK && (a->err.code == GE_OK || errs[s].pos < a->err.pos))
            a->err = errs[s];
    }
    free(errs);
    free(unchecked);
}
