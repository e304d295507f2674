/* The record store's write loop: a batch of records compressed (and checksummed) in parallel. */
#ifndef CHUTE_COMPRESS_H
#define CHUTE_COMPRESS_H
#include <stddef.h>
#include <stdint.h>

#include "format.h"
#include "zstd_api.h"

typedef struct {
    const uint8_t *src;
    const uint64_t *src_off;
    const uint64_t *src_len;
    size_t n;
    int codec; /* CODEC_RAW, CODEC_ZSTD or CODEC_ZSTD_DICT */
    int level;
    const ZSTD_CDict *cdict;
    int attach_dict; /* use the dictionary's tables in place instead of copying them */
    size_t max_threads;
    uint8_t *out;       /* capacity chute_compress_capacity(); packed densely on return;
                           NULL for raw records already end to end in src (sums only) */
    uint32_t *phys_len; /* out */
    uint8_t *codecs;    /* out: the codec actually used (raw when a record did not shrink) */
    uint32_t *crcs;     /* out: CRC-32C of each record's logical bytes */
    size_t packed;      /* out: total bytes in `out` */
    int nomem;          /* out */
} compress_args;

size_t chute_compress_capacity(const uint64_t *src_len, size_t n, int codec);
void chute_compress(compress_args *a);

#endif
