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
    uint8_t *out; /* the spans' tokens, end to end */
    uint64_t out_len;
    uint32_t itemsize;
    int64_t *doc_counts; /* NULL, or one per span: the document starts inside it */
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

#endif

/* A packed group laid out as rows of `width` tokens: row b holds the pieces edges[b] ..
 * edges[b + 1] - 1, piece p being tokens[starts[p] - base .. + lengths[p]) of the group's
 * tokens (read from stream offset `base`), followed by padding (token 0). Segment ids count
 * a row's pieces from 1 (0: padding), positions count from 0 in each piece. Returns 0, or -1
 * when a piece falls outside the tokens or a row overflows (nothing is written past the
 * outputs either way). */
int chute_pack_rows(const uint8_t *tokens, uint64_t ntokens, uint32_t itemsize, int64_t base,
                    const int64_t *starts, const int64_t *lengths, const int64_t *edges,
                    uint64_t npieces, uint64_t rows, uint64_t width, uint8_t *out_tokens,
                    int32_t *out_ids, int32_t *out_positions);
