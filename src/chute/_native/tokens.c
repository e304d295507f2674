#include "tokens.h"

#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "zctx.h"

/* Bytes of plain copy that make another shard worth waking a thread for: more than for a
 * gather, as a span is read where it lies (one copy, no record set-up); waking a thread
 * costs some 3 us here, the time to copy 64 KiB. */
enum { SHARD_WORK = 256 * 1024 };

static uint64_t le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

typedef struct {
    int code;
    size_t span;
    int64_t record;
    long long detail;
} tok_error;

/* The document starts a shard found, in span order. */
typedef struct {
    int64_t *v;
    uint64_t n, cap;
} tok_docs;

typedef struct {
    tok_args *a;
    const uint64_t *at; /* each span's first token in out */
    tok_error *errs;    /* one per shard */
    uint64_t *unchecked;
    tok_docs *docs;
} tok_job;

static int push(tok_docs *d, int64_t v) {
    if (d->n == d->cap) {
        uint64_t cap = d->cap ? 2 * d->cap : 256;
        int64_t *grown = realloc(d->v, cap * sizeof *grown);
        if (!grown) return GE_NOMEM;
        d->v = grown;
        d->cap = cap;
    }
    d->v[d->n++] = v;
    return GE_OK;
}

/* Record r of a source's records gathered end to end: its bytes, found by bisection. */
static int gathered_view(const tok_source *s, int64_t r, const uint8_t **data, uint32_t *length,
                         long long *detail) {
    uint64_t lo = 0, hi = s->ngathered;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (s->records[mid] < r)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == s->ngathered || s->records[lo] != r) {
        *detail = r;
        return GE_INDEX;
    }
    uint64_t begin = s->offsets[lo], end = s->offsets[lo + 1];
    if (begin > end || end > s->gathered_len || end - begin > MAX_RECORD) {
        *detail = (long long)end;
        return GE_BOUNDS;
    }
    *data = s->gathered + begin;
    *length = (uint32_t)(end - begin);
    return GE_OK;
}

/* The header of record r says what its place in the stream holds; its token and document
 * counts. */
static int check_header(const tok_source *s, int64_t r, const uint8_t *h, uint32_t length,
                        uint64_t *tokens, uint64_t *starts) {
    if (length < TOKEN_HEADER) return TE_HEADER;
    int last = (uint64_t)r == s->nrecords - 1;
    uint64_t want_tokens = last ? s->last_tokens : s->record_tokens;
    *tokens = le(h + 12, 4);
    *starts = le(h + 16, 4);
    int fine = memcmp(h, "CTOK", 4) == 0 && h[4] == TOKEN_VERSION && h[5] == s->code &&
               le(h + 6, 2) == (uint64_t)(last ? TOKEN_FINAL : 0) &&
               le(h + 8, 4) == s->record_tokens && *tokens == want_tokens &&
               le(h + 20, 4) == 0 && le(h + 24, 8) == (uint64_t)r * s->record_tokens &&
               *starts <= *tokens &&
               length == TOKEN_HEADER + *tokens * s->itemsize + 4 * *starts;
    return fine ? GE_OK : TE_HEADER;
}

/* Span k: its tokens to out, the document starts inside it to docs (counted). */
static int read_span(tok_job *job, size_t k, ZSTD_DCtx **dctx, uint64_t *unchecked,
                     tok_error *err, tok_docs *docs) {
    tok_args *a = job->a;
    const tok_source *s = &a->sources[a->which ? a->which[k] : 0];
    uint64_t lo = (uint64_t)a->lo[k], hi = lo + (uint64_t)a->len[k];
    uint64_t size = s->record_tokens, isz = s->itemsize;
    uint8_t *out = a->out ? a->out + job->at[k] * isz : NULL;
    uint64_t before = docs ? docs->n : 0;
    for (uint64_t r = lo / size; lo < hi && r * size < hi; r++) {
        if (a->held_only && !out && !s->gathered && !s->store.sums && r < s->store.length) {
            uint64_t own = r == s->nrecords - 1 ? s->last_tokens : size;
            if (s->store.table[r].logic_length == TOKEN_HEADER + own * isz) continue;
        }
        const uint8_t *data = NULL;
        uint32_t length = 0;
        long long detail = 0;
        int code;
        if (s->gathered) {
            code = gathered_view(s, (int64_t)r, &data, &length, &detail);
        } else {
            uint8_t *scratch = chute_thread_scratch();
            code = scratch ? chute_record_view(&s->store, dctx, (int64_t)r, scratch, &data,
                                               &length, &detail, unchecked)
                           : GE_NOMEM;
        }
        uint64_t tokens = 0, starts = 0;
        if (code == GE_OK) code = check_header(s, (int64_t)r, data, length, &tokens, &starts);
        if (code == GE_OK) {
            uint64_t base = r * size;
            uint64_t a0 = lo > base ? lo : base, b0 = hi < base + tokens ? hi : base + tokens;
            if (out && b0 > a0)
                memcpy(out + (a0 - lo) * isz, data + TOKEN_HEADER + (a0 - base) * isz,
                       (b0 - a0) * isz);
            const uint8_t *offs = data + TOKEN_HEADER + tokens * isz;
            for (uint64_t j = 0; docs && j < starts && code == GE_OK; j++) {
                uint64_t v = le(offs + 4 * j, 4);
                if (v >= tokens || (j && v <= le(offs + 4 * (j - 1), 4))) {
                    code = TE_STARTS;
                } else if (base + v >= a0 && base + v < b0) {
                    code = push(docs, (int64_t)(base + v));
                }
            }
        }
        if (code != GE_OK) {
            *err = (tok_error){code, k, (int64_t)r, detail};
            return code;
        }
    }
    if (docs) a->doc_counts[k] = (int64_t)(docs->n - before);
    return GE_OK;
}

static void read_shard(void *p, size_t begin, size_t end, size_t shard) {
    tok_job *job = p;
    ZSTD_DCtx *dctx = NULL;
    tok_docs *docs = job->docs ? &job->docs[shard] : NULL;
    for (size_t k = begin; k < end; k++)
        if (read_span(job, k, &dctx, &job->unchecked[shard], &job->errs[shard], docs) != GE_OK)
            return;
}

void chute_read_tokens(tok_args *a) {
    a->code = GE_OK;
    a->unchecked = a->ndocs = 0;
    a->docs = NULL;
    uint64_t *at = malloc((a->n + 1) * sizeof *at);
    if (!at) {
        a->code = GE_NOMEM;
        return;
    }
    uint64_t total = 0, work = 0;
    for (size_t k = 0; k < a->n; k++) {
        int32_t w = a->which ? a->which[k] : 0;
        int64_t lo = a->lo[k], len = a->len[k];
        const tok_source *s = w >= 0 && (size_t)w < a->nsources ? &a->sources[w] : NULL;
        if (!s || lo < 0 || len < 0 || (uint64_t)lo > s->num_tokens ||
            (uint64_t)len > s->num_tokens - (uint64_t)lo || s->itemsize != a->itemsize ||
            s->record_tokens == 0) {
            a->code = TE_SPAN;
            a->span = k;
            a->detail = lo;
            free(at);
            return;
        }
        at[k] = a->dest ? (uint64_t)a->dest[k] : total;
        if (a->dest && (a->dest[k] < 0 || a->out_len / a->itemsize < (uint64_t)a->dest[k] ||
                        a->out_len / a->itemsize - (uint64_t)a->dest[k] < (uint64_t)len)) {
            a->code = TE_OUT;
            a->span = k;
            free(at);
            return;
        }
        if (total + (uint64_t)len < total) { /* only hostile spans come near */
            a->code = TE_SPAN;
            a->span = k;
            free(at);
            return;
        }
        total += (uint64_t)len;
        if (a->out) work += (uint64_t)len * s->itemsize; /* without out: headers and starts */
        if (!s->gathered && len) { /* a compressed record costs a frame set-up and its bytes */
            for (uint64_t r = (uint64_t)lo / s->record_tokens;
                 r * s->record_tokens < (uint64_t)(lo + len) && r < s->store.length; r++)
                if (s->store.table[r].codec != CODEC_RAW)
                    work += chute_record_work(&s->store.table[r]);
        }
    }
    at[a->n] = total;
    if (a->out && !a->dest && total * a->itemsize > a->out_len) {
        a->code = TE_OUT;
        a->detail = (long long)(total * a->itemsize);
        free(at);
        return;
    }
    size_t max_shards = chute_work_shards(work, a->max_threads, SHARD_WORK);
    size_t ns = chute_shard_count(a->n, 1, max_shards);
    tok_error *errs = calloc(ns ? ns : 1, sizeof *errs);
    uint64_t *unchecked = calloc(ns ? ns : 1, sizeof *unchecked);
    tok_docs *docs = a->doc_counts ? calloc(ns ? ns : 1, sizeof *docs) : NULL;
    if (!errs || !unchecked || (a->doc_counts && !docs)) {
        a->code = GE_NOMEM;
    } else if (ns) {
        tok_job job = {.a = a, .at = at, .errs = errs, .unchecked = unchecked, .docs = docs};
        chute_parallel(a->n, 1, max_shards, a->max_threads, read_shard, &job);
        for (size_t s = 0; s < ns; s++) {
            a->unchecked += unchecked[s];
            if (errs[s].code != GE_OK && (a->code == GE_OK || errs[s].span < a->span)) {
                a->code = errs[s].code;
                a->span = errs[s].span;
                a->record = errs[s].record;
                a->detail = errs[s].detail;
            }
        }
        uint64_t ndocs = 0;
        for (size_t s = 0; docs && s < ns; s++) ndocs += docs[s].n;
        if (a->code == GE_OK && docs && !(a->docs = malloc((ndocs ? ndocs : 1) * sizeof *a->docs)))
            a->code = GE_NOMEM;
        for (size_t s = 0; a->code == GE_OK && docs && s < ns; s++) {
            if (docs[s].n) memcpy(a->docs + a->ndocs, docs[s].v, docs[s].n * sizeof *a->docs);
            a->ndocs += docs[s].n;
        }
    }
    for (size_t s = 0; docs && s < ns; s++) free(docs[s].v);
    free(docs);
    free(errs);
    free(unchecked);
    free(at);
}

/* Pieces a group's bins may receive beside whole sequences: a piece per span between marks
 * (ndocs + 1) and one more each time a split piece moves on to the next bin (at most bins),
 * with room to spare. */
static uint64_t placed_capacity(uint64_t bins, uint64_t ndocs) { return 2 * bins + ndocs + 2; }

uint64_t chute_pack_capacity(uint64_t bins, uint64_t ndocs) {
    return 2 + bins + 2 * (bins + placed_capacity(bins, ndocs));
}

typedef struct {
    int64_t start, length;
} piece;

static int by_length_then_start(const void *x, const void *y) {
    const piece *a = x, *b = y;
    if (a->length != b->length) return a->length > b->length ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

typedef struct {
    uint64_t bin;
    piece p;
} placed;

int64_t chute_pack_group(int64_t start, int64_t stop, const int64_t *docs, uint64_t ndocs,
                         uint64_t seq_len, uint64_t bins, int64_t *table) {
    if (stop < start || seq_len == 0 || bins == 0) return -1;
    for (uint64_t i = 0; i < ndocs; i++)
        if (docs[i] < start || docs[i] > stop || (i && docs[i] <= docs[i - 1])) return -1;
    uint64_t cap = placed_capacity(bins, ndocs);
    piece *whole = malloc(bins * sizeof *whole);
    uint64_t *first = calloc(bins + 1, sizeof *first); /* each bin's first placed piece */
    piece *intact = malloc((ndocs + 2) * sizeof *intact);
    piece *rest = malloc((ndocs + 2) * sizeof *rest);
    placed *put = malloc(cap * sizeof *put);
    uint64_t *room = malloc(bins * sizeof *room), *open = malloc(bins * sizeof *open);
    uint64_t nwhole = 0, nintact = 0, nrest = 0, nput = 0;
    int64_t result = -1;
    if (!whole || !first || !intact || !rest || !put || !room || !open) goto done;
    int stop_begins = ndocs && docs[ndocs - 1] == stop;
    uint64_t d = ndocs && docs[0] == start ? 1 : 0; /* the next interior document start */
    int64_t a = start;
    int a_begins = ndocs && docs[0] == start;
    while (a < stop) {
        int64_t b = d < ndocs && docs[d] < stop ? docs[d] : stop;
        uint64_t n = (uint64_t)(b - a), full = n / seq_len, tail = n % seq_len;
        if (nwhole + full > bins) goto done;
        for (uint64_t k = 0; k < full; k++)
            whole[nwhole++] = (piece){a + (int64_t)(k * seq_len), (int64_t)seq_len};
        if (tail) {
            piece p = {a + (int64_t)(full * seq_len), (int64_t)tail};
            int keep = full == 0 && a_begins && (b < stop || stop_begins);
            if (keep)
                intact[nintact++] = p;
            else
                rest[nrest++] = p;
        }
        if (b < stop) d++;
        a = b;
        a_begins = 1;
    }
    uint64_t nbins = bins - nwhole, nopen = nbins;
    for (uint64_t k = 0; k < nbins; k++) {
        room[k] = seq_len;
        open[k] = k;
    }
    qsort(intact, nintact, sizeof *intact, by_length_then_start);
    uint64_t nleft = 0; /* intact pieces that fit nowhere whole join rest, after it */
    for (uint64_t i = 0; i < nintact; i++) {
        uint64_t k = 0;
        while (k < nopen && room[open[k]] < (uint64_t)intact[i].length) k++;
        if (k == nopen) {
            rest[nrest + nleft++] = intact[i];
            continue;
        }
        uint64_t bin = open[k];
        put[nput++] = (placed){bin, intact[i]};
        room[bin] -= (uint64_t)intact[i].length;
        if (room[bin] == 0) {
            memmove(open + k, open + k + 1, (nopen - k - 1) * sizeof *open);
            nopen--;
        }
    }
    uint64_t bin = 0;
    for (uint64_t i = 0; i < nrest + nleft; i++) {
        piece p = rest[i];
        while (p.length) {
            while (bin < nbins && room[bin] == 0) bin++;
            if (bin == nbins || nput == cap) goto done;
            uint64_t take = (uint64_t)p.length < room[bin] ? (uint64_t)p.length : room[bin];
            put[nput++] = (placed){bin, {p.start, (int64_t)take}};
            room[bin] -= take;
            p.start += (int64_t)take;
            p.length -= (int64_t)take;
        }
    }
    /* the table: whole sequences first, then each bin's pieces in the order placed */
    uint64_t npieces = nwhole + nput;
    int64_t *edges = table + 1, *starts = edges + bins + 1, *lengths = starts + npieces;
    table[0] = (int64_t)bins;
    uint64_t at = 0;
    edges[0] = 0;
    for (uint64_t k = 0; k < nwhole; k++) {
        starts[at] = whole[k].start;
        lengths[at++] = whole[k].length;
        edges[k + 1] = (int64_t)at;
    }
    for (uint64_t i = 0; i < nput; i++) first[put[i].bin + 1]++; /* a counting sort by bin */
    for (uint64_t k = 0; k < nbins; k++) {
        first[k + 1] += first[k];
        edges[nwhole + k + 1] = (int64_t)(at + first[k + 1]);
    }
    for (uint64_t i = 0; i < nput; i++) {
        uint64_t to = at + first[put[i].bin]++;
        starts[to] = put[i].p.start;
        lengths[to] = put[i].p.length;
    }
    result = (int64_t)(1 + bins + 1 + 2 * npieces);
done:
    free(whole);
    free(first);
    free(intact);
    free(rest);
    free(put);
    free(room);
    free(open);
    return result;
}
