/* The token reader: spans of a token stream (chute.TokenDataset's layout: records of a fixed
 * number of tokens, each a 32-byte header, its tokens, then the offsets of the documents that
 * begin in it) copied end to end, every record's header checked against its place. */
#ifndef CHUTE_TOKENS_H
#define CHUTE_TOKENS_H
#include <stddef.h>
#include <stdint.h>

#include "gather.h"

/* Failures of the token layout itself (the record bytes were read fine), after the GE_ codes. */
#define CHUTE_TOKEN_ERRORS(X)                                                              \
    X(TE_SPAN, 40)    /* a span outside its stream, or a source number out of range */     \
    X(TE_HEADER, 41)  /* a record whose header is not the one its place holds */          \
    X(TE_STARTS, 42)  /* document offsets out of order or past the record's tokens */     \
    X(TE_OUT, 43)     /* the output buffers are smaller than the spans */

#define CHUTE_ENUM_TOKEN_ERROR(name, value) name = value,
enum { CHUTE_TOKEN_ERRORS(CHUTE_ENUM_TOKEN_ERROR) };
#undef CHUTE_ENUM_TOKEN_ERROR

enum { TOKEN_HEADER = 32, TOKEN_FINAL = 1, TOKEN_VERSION = 1 };

/* One token stream: where its records are (a mapped store, or records already gathered end to
 * end: `gathered` holds records `records[k]` at gathered[offsets[k]..offsets[k + 1]]) and
 * what its headers must say. */
typedef struct {
    zr_store store; /* used when gathered is NULL */
    const uint8_t *gathered;
    uint64_t gathered_len;
    const uint64_t *offsets;
    const int64_t *records; /* rising */
    uint64_t ngathered;
    uint64_t record_tokens, nrecords, last_tokens, num_tokens;
    uint8_t code;      /* the dtype's code: 1 uint16, 2 uint32 */
    uint32_t itemsize; /* 2 or 4 */
} tok_source;

typedef struct {
    const tok_source *sources;
    size_t nsources;
    const int32_t *which; /* NULL: every span from source 0 */
    const int64_t *lo, *len;
    size_t n;
    uint8_t *out;         /* the spans' tokens (NULL: document starts only) */
    const int64_t *dest;  /* where in out (in tokens) each span goes; NULL: end to end */
    uint64_t out_len;
    uint32_t itemsize;
    int64_t *doc_counts; /* NULL, or one per span: the document starts inside it */
    int held_only;       /* with out NULL: an in-place record whose length in the table
                          * leaves no room for starts is not read (packing's read: such a
                          * record is read, and checked, with its tokens), unless records
                          * are verified (checksums: every read checks every record) */
    size_t max_threads;
    /* out */
    int code;
    size_t span;
    int64_t record;
    long long detail;
    uint64_t unchecked;
    int64_t *docs; /* with doc_counts: the document starts, span by span (free() it) */
    uint64_t ndocs;
} tok_args;

void chute_read_tokens(tok_args *a);


/* One group of a token stream packed into `bins` sequences of `seq_len` (see
 * chute.loader._packing for the rule): tokens start..stop, the documents beginning at
 * docs[0..ndocs) (rising, inside [start, stop]; stop itself where a document begins there or
 * the stream ends). Writes the pieces to table as [bins, edges (bins + 1), piece starts,
 * piece lengths] (sequence b is pieces edges[b] .. edges[b + 1] - 1) and returns the table's
 * length, at most chute_pack_capacity(bins, ndocs); -1 when the tokens do not fit. */
int64_t chute_pack_group(int64_t start, int64_t stop, const int64_t *docs, uint64_t ndocs,
                         uint64_t seq_len, uint64_t bins, int64_t *table);
uint64_t chute_pack_capacity(uint64_t bins, uint64_t ndocs);

#endif
