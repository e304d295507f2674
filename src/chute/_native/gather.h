/* The record store's read loop: a batch of records gathered into one buffer, decoded. */
#ifndef CHUTE_GATHER_H
#define CHUTE_GATHER_H
#include <stddef.h>
#include <stdint.h>

#include "format.h"
#include "zstd_api.h"

/* Error codes, translated into exceptions by the Python layer, which reads them from the
 * module's constants (GE_INDEX ...): this list is their only definition. */
#define CHUTE_GATHER_ERRORS(X)                                                          \
    X(GE_INDEX, 1)      /* index outside 0..length */                                   \
    X(GE_CHUNK, 2)      /* chunk_id outside the store's chunks */                       \
    X(GE_BOUNDS, 3)     /* offset + phys_length past the chunk's end */                 \
    X(GE_TOO_LARGE, 4)  /* logic or phys length over the format's cap */                \
    X(GE_CODEC, 5)      /* unknown codec tag */                                         \
    X(GE_NO_DICT, 6)    /* zstd_dict record in a store without dict.zr */               \
    X(GE_DECODE, 7)     /* zstd reported an error */                                    \
    X(GE_LENGTH, 8)     /* decoded size differs from logic_length, or raw phys != logic */ \
    X(GE_DST, 9)        /* destination slot too small or outside the buffer */          \
    X(GE_CHECKSUM, 10)  /* logical bytes differ from the sidecar's CRC-32C */           \
    X(GE_NOMEM, 11)                                                                     \
    X(GE_TABLE, 12)     /* table entry differs from where its checksum says the record was */ \
    X(GE_SUMS, 13)      /* the sidecar is in step with the table but has no entry for it */

#define CHUTE_ENUM_ERROR(name, value) name = value,
enum { GE_OK = 0, CHUTE_GATHER_ERRORS(CHUTE_ENUM_ERROR) };
#undef CHUTE_ENUM_ERROR

typedef struct {
    int code;
    size_t pos; /* position in the batch of the first failing record */
    long long detail;
} gather_error;

/* One store as the read loops see it: its table, its chunks, its dictionary and sidecar. */
typedef struct {
    const zr_loc *table;
    uint64_t length;
    const uint8_t *const *bases; /* each chunk file, mapped read-only */
    const uint64_t *limits;       /* readable bytes of each chunk */
    uint32_t nchunks;
    const ZSTD_DDict *ddict;
    const zr_sum *sums; /* NULL: no checksum check */
    uint64_t nsums;
    int strict; /* the sidecar is in step with the table: a mismatch is damage, not an edit */
} zr_store;

typedef struct {
    const zr_store *stores; /* index i reads stores[which[i]], or stores[0] without which */
    const int32_t *which;   /* NULL (one store), or each in 0..nstores, checked by the caller */
    const int64_t *idx;
    size_t n;
    uint8_t *dst;
    size_t dst_len;
    const uint64_t *dst_off; /* NULL: record i goes to i * stride and must be stride bytes */
    uint64_t stride;
    size_t max_threads;
    gather_error err; /* out */
    uint64_t unchecked; /* out: records whose sidecar entry did not match the table */
} gather_args;

void chute_gather(gather_args *a);

/* What decoding a record costs, in bytes of plain copy: a compressed one a frame set-up plus
 * a few times its bytes. The read loops split a batch by this, not by records. */
enum { FRAME_COST = 4096, DECODE_FACTOR = 4 };
static inline uint64_t chute_record_work(const zr_loc *loc) {
    return loc->codec == CODEC_RAW ? loc->logic_length
                                   : FRAME_COST + DECODE_FACTOR * (uint64_t)loc->logic_length;
}

/* The most shards to split `work` into on max_threads: one per `shard_work` bytes of it (a
 * small batch is cheaper on one core than a wake-up), and a few per thread at most, so a
 * thread that wakes late (the machine is busy) still finds work left. */
size_t chute_work_shards(uint64_t work, size_t max_threads, uint64_t shard_work);

/* Record ix of a store, checked as a gather checks it (location, lengths, decode, checksum):
 * *data is its logical bytes (inside the mapped chunk for a raw record, else decoded into
 * scratch, MAX_RECORD bytes, allocated by the caller), *length their count. Returns a GE_*
 * code; *unchecked counts a record whose sidecar entry could not vouch for it. */
int chute_record_view(const zr_store *s, ZSTD_DCtx **dctx, int64_t ix, uint8_t *scratch,
                      const uint8_t **data, uint32_t *length, long long *detail,
                      uint64_t *unchecked);

#endif
