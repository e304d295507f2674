/* Python face of the token reader (tokens.c): buffers checked, the loop run without the GIL. */
#include "pyface.h"

#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "tokens.h"

_Static_assert(sizeof(wchar_t) == sizeof(int32_t), "segment ids are filled as wchar_t");

/* One source: ((record_tokens, nrecords, last_tokens, code), where), where is a snapshot's
 * (table, limits, chunks, ddict, sums, strict) or records gathered as (values, offsets,
 * records). Views land in v[0..3). */
static int get_source(PyObject *item, tok_source *s, store_views *sv, Py_buffer *v) {
    PyObject *where;
    unsigned long long size, nrecords, last;
    int code;
    if (!PyArg_Parse(item, "((KKKi)O)", &size, &nrecords, &last, &code, &where)) return -1;
    if ((code != 1 && code != 2) || size == 0 || size > MAX_RECORD || nrecords == 0 ||
        last == 0 || last > size || nrecords > ((uint64_t)1 << 40)) {
        PyErr_Format(PyExc_ValueError,
                     "a token source of %llu records of %llu tokens (the last %llu), dtype code "
                     "%d, is not one a token dataset can be",
                     nrecords, size, last, code);
        return -1;
    }
    s->record_tokens = size;
    s->nrecords = nrecords;
    s->last_tokens = last;
    s->num_tokens = (nrecords - 1) * size + last;
    s->code = (uint8_t)code;
    s->itemsize = code == 1 ? 2 : 4;
    if (!PyTuple_Check(where) || (PyTuple_GET_SIZE(where) != 6 && PyTuple_GET_SIZE(where) != 3)) {
        PyErr_SetString(PyExc_TypeError, "a token source is a snapshot (6 items) or gathered "
                                         "records (3 items)");
        return -1;
    }
    if (PyTuple_GET_SIZE(where) == 6) {
        int strict = PyObject_IsTrue(PyTuple_GET_ITEM(where, 5));
        if (strict < 0) return -1;
        return chute_open_store(PyTuple_GET_ITEM(where, 0), PyTuple_GET_ITEM(where, 1),
                                PyTuple_GET_ITEM(where, 2), PyTuple_GET_ITEM(where, 3),
                                PyTuple_GET_ITEM(where, 4), strict, sv, &s->store);
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(where, 0), &v[0], PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (chute_get_items(PyTuple_GET_ITEM(where, 2), &v[2], 8, 0, 0, "records") < 0) return -1;
    uint64_t n = (uint64_t)v[2].len / 8;
    if (chute_get_items(PyTuple_GET_ITEM(where, 1), &v[1], 8, n + 1, 0, "offsets") < 0) return -1;
    const int64_t *records = v[2].buf;
    for (uint64_t k = 1; k < n; k++) {
        if (records[k] <= records[k - 1]) {
            PyErr_SetString(PyExc_ValueError, "gathered records must rise");
            return -1;
        }
    }
    s->gathered = v[0].buf ? v[0].buf : (const uint8_t *)"";
    s->gathered_len = (uint64_t)v[0].len;
    s->offsets = v[1].buf;
    s->records = records;
    s->ngathered = n;
    return 0;
}

/* The spans lo[k], len[k] of sources[which[k]] (which NULL: all of source 0) read into out
 * (None: document starts only), counting document starts into doc_counts (None: none
 * wanted): read_tokens' tuple. */
static PyObject *read_spans(PyObject *sources_obj, const int32_t *which, const int64_t *lo,
                            const int64_t *len, size_t n, PyObject *out_obj, PyObject *counts_obj,
                            Py_ssize_t threads, int held_only) {
    PyObject *fast = PySequence_Fast(sources_obj, "read_tokens takes a sequence of sources");
    if (!fast) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(fast);
    PyObject *result = NULL;
    Py_buffer out = {0}, counts = {0};
    size_t count = ns > 0 ? (size_t)ns : 1;
    tok_source *sources = calloc(count, sizeof *sources);
    store_views *sv = calloc(count, sizeof *sv);
    Py_buffer *views = calloc(count * 3, sizeof *views);
    if (!sources || !sv || !views) {
        PyErr_NoMemory();
        goto done;
    }
    if (ns == 0 || ns > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "read_tokens needs at least one source");
        goto done;
    }
    for (Py_ssize_t i = 0; i < ns; i++)
        if (get_source(PySequence_Fast_GET_ITEM(fast, i), &sources[i], &sv[i], &views[3 * i]) < 0)
            goto done;
    if (out_obj != Py_None && chute_get_dst(out_obj, &out) < 0) goto done;
    if (counts_obj != Py_None && chute_get_items(counts_obj, &counts, 8, n, 1, "doc_counts") < 0)
        goto done;
    tok_args a = {
        .sources = sources,
        .nsources = (size_t)ns,
        .which = which,
        .lo = lo,
        .len = len,
        .n = n,
        .out = out.buf,
        .out_len = (uint64_t)out.len,
        .itemsize = sources[0].itemsize,
        .doc_counts = counts.buf,
        .held_only = held_only,
        .max_threads = threads > 0 ? (size_t)threads : 1,
    };
    Py_BEGIN_ALLOW_THREADS
    chute_read_tokens(&a);
    Py_END_ALLOW_THREADS
    PyObject *docs = Py_None;
    Py_INCREF(docs);
    if (a.docs) {
        Py_DECREF(docs);
        docs = PyByteArray_FromStringAndSize((const char *)a.docs, (Py_ssize_t)(a.ndocs * 8));
        free(a.docs);
        if (!docs) goto done;
    }
    result = Py_BuildValue("inLLNK", a.code, (Py_ssize_t)a.span, (long long)a.record, a.detail,
                           docs, (unsigned long long)a.unchecked);
done:
    for (Py_ssize_t i = 0; sv && views && i < ns; i++) {
        chute_release_store(&sv[i]);
        for (int j = 0; j < 3; j++)
            if (views[3 * i + j].obj) PyBuffer_Release(&views[3 * i + j]);
    }
    if (out.obj) PyBuffer_Release(&out);
    if (counts.obj) PyBuffer_Release(&counts);
    free(sources);
    free(sv);
    free(views);
    Py_DECREF(fast);
    return result;
}

/* read_tokens(sources, which, lo, len, out, doc_counts, threads, held_only=False)
 *   -> (code, span, record, detail, docs, unchecked). code 0 is success; docs is the
 *      document starts (int64 bytes, span by span) when doc_counts is given, else None;
 *      held_only (with out None): see tok_args. */
PyObject *chute_py_read_tokens(PyObject *self, PyObject *args) {
    PyObject *sources_obj, *which_obj, *lo_obj, *len_obj, *out_obj, *counts_obj;
    Py_ssize_t threads;
    int held_only = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOn|p", &sources_obj, &which_obj, &lo_obj, &len_obj,
                          &out_obj, &counts_obj, &threads, &held_only))
        return NULL;
    Py_buffer lo = {0}, len = {0}, which = {0};
    PyObject *result = NULL;
    if (chute_get_items(lo_obj, &lo, 8, 0, 0, "lo") < 0) goto done;
    size_t n = (size_t)lo.len / 8;
    if (chute_get_items(len_obj, &len, 8, n, 0, "len") < 0) goto done;
    if (which_obj != Py_None && chute_get_items(which_obj, &which, 4, n, 0, "which") < 0) goto done;
    result = read_spans(sources_obj, which.buf, lo.buf, len.buf, n, out_obj, counts_obj, threads,
                        held_only);
done:
    Py_buffer *held[] = {&lo, &len, &which};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}

/* pack_groups(starts, stops, bins, docs, doc_counts, seq_len) -> [bytes]: each group's
 * packing table (int64, see chute_pack_group), group g taking the next doc_counts[g] of docs. */
PyObject *chute_py_pack_groups(PyObject *self, PyObject *args) {
    PyObject *starts_obj, *stops_obj, *bins_obj, *docs_obj, *counts_obj;
    unsigned long long seq_len;
    if (!PyArg_ParseTuple(args, "OOOOOK", &starts_obj, &stops_obj, &bins_obj, &docs_obj,
                          &counts_obj, &seq_len))
        return NULL;
    Py_buffer starts = {0}, stops = {0}, bins = {0}, docs = {0}, counts = {0};
    PyObject *result = NULL, *list = NULL;
    if (chute_get_items(starts_obj, &starts, 8, 0, 0, "starts") < 0) goto done;
    size_t n = (size_t)starts.len / 8;
    if (chute_get_items(stops_obj, &stops, 8, n, 0, "stops") < 0 ||
        chute_get_items(bins_obj, &bins, 8, n, 0, "bins") < 0 ||
        chute_get_items(counts_obj, &counts, 8, n, 0, "doc_counts") < 0 ||
        chute_get_items(docs_obj, &docs, 8, 0, 0, "docs") < 0)
        goto done;
    if (!(list = PyList_New((Py_ssize_t)n))) goto done;
    const int64_t *start = starts.buf, *stop = stops.buf, *nbins = bins.buf, *count = counts.buf;
    uint64_t taken = 0, ndocs = (uint64_t)docs.len / 8;
    for (size_t g = 0; g < n; g++) {
        if (nbins[g] < 1 || nbins[g] > (1 << 20) || count[g] < 0 ||
            (uint64_t)count[g] > ndocs - taken || seq_len == 0 || seq_len > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "group %zu: %lld sequences, %lld document starts", g,
                         (long long)nbins[g], (long long)count[g]);
            goto done;
        }
        uint64_t cap = chute_pack_capacity((uint64_t)nbins[g], (uint64_t)count[g]);
        int64_t *table = malloc(cap * sizeof *table);
        if (!table) {
            PyErr_NoMemory();
            goto done;
        }
        int64_t used = chute_pack_group(start[g], stop[g], (const int64_t *)docs.buf + taken,
                                        (uint64_t)count[g], seq_len, (uint64_t)nbins[g], table);
        taken += (uint64_t)count[g];
        PyObject *bytes = used < 0 ? NULL
                                   : PyBytes_FromStringAndSize((const char *)table,
                                                                   (Py_ssize_t)used * 8);
        free(table);
        if (used < 0)
            PyErr_Format(PyExc_ValueError,
                         "tokens %lld..%lld do not fit %lld sequences of %llu: the document "
                         "starts are not rising inside the group, or the group is too long",
                         (long long)start[g], (long long)stop[g], (long long)nbins[g], seq_len);
        if (!bytes) goto done;
        PyList_SET_ITEM(list, (Py_ssize_t)g, bytes);
    }
    result = list;
    list = NULL;
done:
    Py_XDECREF(list);
    Py_buffer *held[] = {&starts, &stops, &bins, &docs, &counts};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}

/* Row r of a packing table (chute_pack_group's layout, as bytes): its pieces' starts and
 * lengths and their count, checked to lie inside the table; -1 naming what is wrong. */
static int table_row(PyObject *obj, int64_t r, long long key, const int64_t **starts,
                     const int64_t **lengths, int64_t *count) {
    const int64_t *t = PyBytes_Check(obj) ? (const int64_t *)PyBytes_AS_STRING(obj) : NULL;
    uint64_t size = t ? (uint64_t)PyBytes_GET_SIZE(obj) / 8 : 0;
    int fine = t && (uintptr_t)t % 8 == 0 && (uint64_t)PyBytes_GET_SIZE(obj) % 8 == 0 &&
               size >= 3 && t[0] >= 1 && (uint64_t)t[0] + 2 <= size;
    const int64_t *edges = fine ? t + 1 : NULL;
    int64_t npieces = fine ? edges[t[0]] : -1;
    fine = fine && npieces >= 0 && size == 2 + (uint64_t)t[0] + 2 * (uint64_t)npieces;
    if (!fine) {
        PyErr_Format(PyExc_ValueError, "the table of %lld is not a packing table", key);
        return -1;
    }
    if (r < 0 || r >= t[0] || edges[r] < 0 || edges[r] > edges[r + 1] || edges[r + 1] > npieces) {
        PyErr_Format(PyExc_IndexError, "row %lld of the table of %lld is not there",
                     (long long)r, key);
        return -1;
    }
    *starts = edges + t[0] + 1 + edges[r];
    *lengths = edges + t[0] + 1 + npieces + edges[r];
    *count = edges[r + 1] - edges[r];
    return 0;
}

/* read_packed(source, tables, sequences, group, out_tokens, out_ids, out_positions, threads)
 *   -> read_tokens' tuple: sequence q is row q % group of the packing tables[q // group]
 *      (tables: a dict of tables as bytes, from pack_groups; a key it lacks is a KeyError),
 *      laid out as row k of the outputs for sequences[k] (segment ids and positions, and
 *      tokens by the token reader from source, padding 0); all but the table look-ups run
 *      without the GIL. */
PyObject *chute_py_read_packed(PyObject *self, PyObject *args) {
    PyObject *source_obj, *tables_obj, *seq_obj, *tok_obj, *ids_obj, *pos_obj;
    long long group;
    Py_ssize_t threads;
    if (!PyArg_ParseTuple(args, "OO!OLOOOn", &source_obj, &PyDict_Type, &tables_obj, &seq_obj,
                          &group, &tok_obj, &ids_obj, &pos_obj, &threads))
        return NULL;
    PyObject *result = NULL;
    tok_source source = {0};
    store_views sv = {0};
    Py_buffer sviews[3] = {{0}}, seqs = {0}, out = {0}, ids = {0}, positions = {0};
    PyObject **tables = NULL;
    const int64_t **row_starts = NULL, **row_lengths = NULL;
    int64_t *row_count = NULL, *lo = NULL, *len = NULL, *dest = NULL;
    int32_t *ramp = NULL;
    size_t n = 0, kept = 0;
    if (group < 1) {
        PyErr_SetString(PyExc_ValueError, "group must be positive");
        return NULL;
    }
    if (get_source(source_obj, &source, &sv, sviews) < 0) goto done;
    if (chute_get_items(seq_obj, &seqs, 8, 0, 0, "sequences") < 0) goto done;
    n = (size_t)seqs.len / 8;
    if (chute_get_items(tok_obj, &out, source.itemsize, 0, 1, "out_tokens") < 0) goto done;
    size_t width = n ? (size_t)out.len / source.itemsize / n : 0;
    if (n && (size_t)out.len != n * width * source.itemsize) {
        PyErr_SetString(PyExc_ValueError, "out_tokens must hold one whole row per sequence");
        goto done;
    }
    if (chute_get_items(ids_obj, &ids, 4, n * width, 1, "out_ids") < 0 ||
        chute_get_items(pos_obj, &positions, 4, n * width, 1, "out_positions") < 0)
        goto done;
    size_t m = n ? n : 1;
    tables = calloc(m, sizeof *tables);
    row_starts = malloc(m * sizeof *row_starts);
    row_lengths = malloc(m * sizeof *row_lengths);
    row_count = malloc(m * sizeof *row_count);
    if (!tables || !row_starts || !row_lengths || !row_count) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *seq = seqs.buf;
    size_t spans = 0;
    for (; kept < n; kept++) { /* each row's table, held until the call ends, and checked */
        if (seq[kept] < 0) {
            PyErr_Format(PyExc_IndexError, "sequence %lld is negative", (long long)seq[kept]);
            goto done;
        }
        long long key = seq[kept] / group;
        PyObject *number = PyLong_FromLongLong(key);
        PyObject *table = number ? PyDict_GetItemWithError(tables_obj, number) : NULL;
        if (number && !table && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, number);
        Py_XDECREF(number);
        if (!table) goto done;
        tables[kept] = Py_NewRef(table);
        if (table_row(table, seq[kept] % group, key, &row_starts[kept], &row_lengths[kept],
                      &row_count[kept]) < 0)
            goto done;
        uint64_t at = 0;
        for (int64_t p = 0; p < row_count[kept]; p++) {
            int64_t l = row_lengths[kept][p];
            if (l < 0 || (uint64_t)l > width - at) {
                PyErr_Format(PyExc_ValueError, "sequence %lld's pieces overflow its %zu tokens",
                             (long long)seq[kept], width);
                goto done;
            }
            at += (uint64_t)l;
        }
        spans += (size_t)row_count[kept];
    }
    lo = malloc((spans ? spans : 1) * 8);
    len = malloc((spans ? spans : 1) * 8);
    dest = malloc((spans ? spans : 1) * 8);
    if (!lo || !len || !dest) {
        PyErr_NoMemory();
        goto done;
    }
    /* a piece's positions are the first l numbers of this ramp (one copy, not a loop); its
     * segment ids are filled by the C library's wmemset (a wchar_t is 32 bits here), which
     * picks the machine's widest stores, as its memcpy does */
    if (!(ramp = malloc((width ? width : 1) * sizeof *ramp))) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t j = 0; j < width; j++) ramp[j] = (int32_t)j;
    tok_args a = {
        .sources = &source,
        .nsources = 1,
        .lo = lo,
        .len = len,
        .n = spans,
        .out = out.buf,
        .dest = dest,
        .out_len = (uint64_t)out.len,
        .itemsize = source.itemsize,
        .max_threads = threads > 0 ? (size_t)threads : 1,
    };
    Py_BEGIN_ALLOW_THREADS
    size_t sp = 0;
    for (size_t k = 0; k < n; k++) { /* segment ids and positions, and where each piece goes */
        int32_t *row_ids = (int32_t *)ids.buf + k * width;
        int32_t *row_pos = (int32_t *)positions.buf + k * width;
        uint64_t at = 0;
        for (int64_t p = 0; p < row_count[k]; p++) {
            size_t l = (size_t)row_lengths[k][p];
            wmemset((wchar_t *)(row_ids + at), (wchar_t)(p + 1), l);
            memcpy(row_pos + at, ramp, l * sizeof *ramp);
            lo[sp] = row_starts[k][p];
            len[sp] = l;
            dest[sp++] = (int64_t)(k * width + at);
            at += (uint64_t)l;
        }
        memset((uint8_t *)out.buf + (k * width + at) * source.itemsize, 0,
               (width - at) * source.itemsize);
        memset(row_ids + at, 0, (width - at) * 4);
        memset(row_pos + at, 0, (width - at) * 4);
    }
    chute_read_tokens(&a);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("inLLOK", a.code, (Py_ssize_t)a.span, (long long)a.record, a.detail,
                           Py_None, (unsigned long long)a.unchecked);
done:
    free(ramp);
    free(lo);
    free(len);
    free(dest);
    free(row_starts);
    free(row_lengths);
    free(row_count);
    chute_release_store(&sv);
    for (int j = 0; j < 3; j++)
        if (sviews[j].obj) PyBuffer_Release(&sviews[j]);
    for (size_t k = 0; tables && k < n && tables[k]; k++) Py_DECREF(tables[k]);
    free(tables);
    Py_buffer *held[] = {&seqs, &out, &ids, &positions};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}

/* read_windows(sources, offsets, positions, seq_len, out, source_out, doc_counts, threads)
 *   -> read_tokens' tuple. Position p is window p - offsets[s] of source s (offsets: int64,
 *      one more than the sources, rising from 0; None: all positions are windows of the one
 *      source), window w being tokens w * seq_len .. w * seq_len + seq_len inclusive;
 *      source_out (int16, or None) receives each position's source. A position outside every
 *      source's windows is TE_SPAN at its index. */
PyObject *chute_py_read_windows(PyObject *self, PyObject *args) {
    PyObject *sources_obj, *offsets_obj, *pos_obj, *out_obj, *src_obj, *counts_obj;
    unsigned long long seq_len;
    Py_ssize_t threads;
    if (!PyArg_ParseTuple(args, "OOOKOOOn", &sources_obj, &offsets_obj, &pos_obj, &seq_len,
                          &out_obj, &src_obj, &counts_obj, &threads))
        return NULL;
    Py_buffer offsets = {0}, positions = {0}, src = {0};
    int64_t *spans = NULL;
    int32_t *which = NULL;
    PyObject *result = NULL;
    if (chute_get_items(pos_obj, &positions, 8, 0, 0, "positions") < 0) goto done;
    size_t n = (size_t)positions.len / 8;
    Py_ssize_t ns = PySequence_Size(sources_obj);
    if (ns < 0) goto done;
    if (offsets_obj != Py_None &&
        chute_get_items(offsets_obj, &offsets, 8, (size_t)ns + 1, 0, "offsets") < 0)
        goto done;
    if (src_obj != Py_None && chute_get_items(src_obj, &src, 2, n, 1, "source_out") < 0) goto done;
    if (seq_len == 0 || seq_len > ((uint64_t)1 << 40) || ns < 1 || ns > INT16_MAX) {
        PyErr_SetString(PyExc_ValueError, "read_windows: seq_len or the sources out of range");
        goto done;
    }
    spans = malloc((n ? n : 1) * 2 * sizeof *spans);
    which = malloc((n ? n : 1) * sizeof *which);
    if (!spans || !which) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *pos = positions.buf;
    const int64_t *off = offsets.buf;
    int64_t bad = -1;
    for (size_t k = 0; k < n && bad < 0; k++) {
        int32_t s = 0;
        if (off) { /* the last source whose first position is at most p */
            int32_t lo = 0, hi = (int32_t)ns;
            while (hi - lo > 1) {
                int32_t mid = lo + (hi - lo) / 2;
                if ((uint64_t)off[mid] <= pos[k])
                    lo = mid;
                else
                    hi = mid;
            }
            s = lo;
        }
        uint64_t first = off ? (uint64_t)off[s] : 0, end = off ? (uint64_t)off[s + 1] : UINT64_MAX;
        if (pos[k] < first || pos[k] >= end || pos[k] - first > ((uint64_t)1 << 62) / seq_len) {
            bad = (int64_t)k;
            break;
        }
        which[k] = s;
        spans[k] = (int64_t)((pos[k] - first) * seq_len);
        spans[n + k] = (int64_t)seq_len + 1;
        if (src.buf) ((int16_t *)src.buf)[k] = (int16_t)s;
    }
    if (bad >= 0) { /* the caller names the position */
        result = Py_BuildValue("inLLOK", TE_SPAN, (Py_ssize_t)bad, -1LL, 0LL, Py_None, 0ULL);
        goto done;
    }
    /* the token reader checks every span against its stream's tokens: a window past the
     * last whole one is a span past the end */
    result = read_spans(sources_obj, off ? which : NULL, spans, spans + n, n, out_obj, counts_obj,
                        threads, 0);
done:
    free(spans);
    free(which);
    Py_buffer *held[] = {&offsets, &positions, &src};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}
