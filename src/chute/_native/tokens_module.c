/* Python face of the token reader (tokens.c): buffers checked, the loop run without the GIL. */
#include "pyface.h"

#include <stdlib.h>
#include <string.h>

#include "tokens.h"

/* A typed, aligned, C-contiguous view of `count` items of `size` bytes (at least), or -1. */
static int get_items(PyObject *obj, Py_buffer *view, size_t size, size_t count, int writable,
                     const char *what) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (!chute_plain_format(view->format) || view->itemsize != (Py_ssize_t)size ||
        (uintptr_t)view->buf % size || (size_t)view->len < count * size) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be %zu aligned plain items of %zu bytes (got %zd bytes of "
                     "itemsize %zd)",
                     what, count, size, view->len, view->itemsize);
        return -1;
    }
    return 0;
}

/* One source: ((record_tokens, nrecords, last_tokens, code), where), where is a snapshot's
 * (table, limits, chunks, ddict, sums, strict) or records gathered as (values, offsets,
 * records). Views land in v[0..3). */
static int get_source(PyObject *item, tok_source *s, store_views *sv, Py_buffer *v) {
    PyObject *params, *where;
    unsigned long long size, nrecords, last;
    int code;
    if (!PyArg_ParseTuple(item, "OO", &params, &where) ||
        !PyArg_ParseTuple(params, "KKKi", &size, &nrecords, &last, &code))
        return -1;
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
    if (get_items(PyTuple_GET_ITEM(where, 2), &v[2], 8, 0, 0, "records") < 0) return -1;
    uint64_t n = (uint64_t)v[2].len / 8;
    if (get_items(PyTuple_GET_ITEM(where, 1), &v[1], 8, n + 1, 0, "offsets") < 0) return -1;
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

/* read_tokens(sources, which, lo, len, out, doc_counts, threads)
 *   -> (code, span, record, detail, docs, unchecked). code 0 is success; docs is the
 *      document starts (int64 bytes, span by span) when doc_counts is given, else None. */
PyObject *chute_py_read_tokens(PyObject *self, PyObject *args) {
    PyObject *sources_obj, *which_obj, *lo_obj, *len_obj, *out_obj, *counts_obj;
    Py_ssize_t threads;
    if (!PyArg_ParseTuple(args, "OOOOOOn", &sources_obj, &which_obj, &lo_obj, &len_obj, &out_obj,
                          &counts_obj, &threads))
        return NULL;
    PyObject *fast = PySequence_Fast(sources_obj, "read_tokens takes a sequence of sources");
    if (!fast) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(fast);
    PyObject *result = NULL;
    Py_buffer lo = {0}, len = {0}, which = {0}, out = {0}, counts = {0};
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
    if (get_items(lo_obj, &lo, 8, 0, 0, "lo") < 0) goto done;
    size_t n = (size_t)lo.len / 8;
    if (get_items(len_obj, &len, 8, n, 0, "len") < 0) goto done;
    if (which_obj != Py_None && get_items(which_obj, &which, 4, n, 0, "which") < 0) goto done;
    if (chute_get_dst(out_obj, &out) < 0) goto done;
    if (counts_obj != Py_None && get_items(counts_obj, &counts, 8, n, 1, "doc_counts") < 0)
        goto done;
    tok_args a = {
        .sources = sources,
        .nsources = (size_t)ns,
        .which = which.buf,
        .lo = lo.buf,
        .len = len.buf,
        .n = n,
        .out = out.buf,
        .out_len = (uint64_t)out.len,
        .itemsize = sources[0].itemsize,
        .doc_counts = counts.buf,
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
    Py_buffer *held[] = {&lo, &len, &which, &out, &counts};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    free(sources);
    free(sv);
    free(views);
    Py_DECREF(fast);
    return result;
}

/* pack_rows(tokens, base, starts, lengths, edges, out_tokens, out_ids, out_positions)
 *   -> None: a packed group's rows laid out (chute_pack_rows); ValueError when the pieces
 *      do not fit the tokens or the rows. */
PyObject *chute_py_pack_rows(PyObject *self, PyObject *args) {
    PyObject *tokens_obj, *starts_obj, *lengths_obj, *edges_obj, *tok_obj, *ids_obj, *pos_obj;
    long long base;
    if (!PyArg_ParseTuple(args, "OLOOOOOO", &tokens_obj, &base, &starts_obj, &lengths_obj,
                          &edges_obj, &tok_obj, &ids_obj, &pos_obj))
        return NULL;
    Py_buffer tokens = {0}, starts = {0}, lengths = {0}, edges = {0}, out = {0}, ids = {0},
              positions = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(tokens_obj, &tokens, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) goto done;
    size_t isz = (size_t)tokens.itemsize;
    if ((isz != 2 && isz != 4) || !chute_plain_format(tokens.format)) {
        PyErr_SetString(PyExc_ValueError, "tokens must be a plain array of 2- or 4-byte items");
        goto done;
    }
    if (get_items(starts_obj, &starts, 8, 0, 0, "starts") < 0) goto done;
    size_t np_ = (size_t)starts.len / 8;
    if (get_items(lengths_obj, &lengths, 8, np_, 0, "lengths") < 0) goto done;
    if (get_items(edges_obj, &edges, 8, 1, 0, "edges") < 0) goto done;
    size_t rows = (size_t)edges.len / 8 - 1;
    if (get_items(tok_obj, &out, isz, 0, 1, "out_tokens") < 0) goto done;
    size_t width = rows ? (size_t)out.len / isz / rows : 0;
    if (get_items(ids_obj, &ids, 4, rows * width, 1, "out_ids") < 0) goto done;
    if (get_items(pos_obj, &positions, 4, rows * width, 1, "out_positions") < 0) goto done;
    if (rows && (size_t)out.len != rows * width * isz) {
        PyErr_SetString(PyExc_ValueError, "out_tokens must hold whole rows");
        goto done;
    }
    int bad;
    Py_BEGIN_ALLOW_THREADS
    bad = chute_pack_rows(tokens.buf, (uint64_t)tokens.len / isz, (uint32_t)isz, base, starts.buf,
                          lengths.buf, edges.buf, np_, rows, width, out.buf, ids.buf,
                          positions.buf);
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "the pieces of a packing do not fit its tokens or rows");
    else
        result = Py_NewRef(Py_None);
done:
    Py_buffer *held[] = {&tokens, &starts, &lengths, &edges, &out, &ids, &positions};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}

/* copy_rows(sources, which, rows, out) -> None: row rows[k] of sources[which[k]] to row k of
 * out, every source and out plain C-contiguous arrays of out's row size. */
PyObject *chute_py_copy_rows(PyObject *self, PyObject *args) {
    PyObject *sources_obj, *which_obj, *rows_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &sources_obj, &which_obj, &rows_obj, &out_obj)) return NULL;
    PyObject *fast = PySequence_Fast(sources_obj, "copy_rows takes a sequence of arrays");
    if (!fast) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(fast);
    Py_buffer which = {0}, rows = {0}, out = {0};
    Py_buffer *views = calloc(ns > 0 ? (size_t)ns : 1, sizeof *views);
    PyObject *result = NULL;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    if (get_items(rows_obj, &rows, 8, 0, 0, "rows") < 0) goto done;
    size_t n = (size_t)rows.len / 8;
    if (get_items(which_obj, &which, 4, n, 0, "which") < 0) goto done;
    if (chute_get_dst(out_obj, &out) < 0) goto done;
    if (n == 0 || ns == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    size_t row = (size_t)out.len / n;
    if (row * n != (size_t)out.len) {
        PyErr_SetString(PyExc_ValueError, "out must hold one whole row per index");
        goto done;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        Py_buffer *v = &views[i];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), v,
                               PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (!chute_plain_format(v->format) || (row && (size_t)v->len % row)) {
            PyErr_Format(PyExc_ValueError, "source %zd is not plain rows of %zu bytes", i, row);
            goto done;
        }
    }
    const int32_t *w = which.buf;
    const int64_t *r = rows.buf;
    for (size_t k = 0; k < n; k++) {
        if (w[k] < 0 || w[k] >= ns || r[k] < 0 ||
            (size_t)r[k] >= (row ? (size_t)views[w[k]].len / row : 0)) {
            PyErr_Format(PyExc_IndexError, "row %lld of source %d is not there", (long long)r[k],
                         (int)w[k]);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (size_t k = 0; k < n; k++)
        memcpy((uint8_t *)out.buf + k * row, (const uint8_t *)views[w[k]].buf + (size_t)r[k] * row,
               row);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; views && i < ns; i++)
        if (views[i].obj) PyBuffer_Release(&views[i]);
    free(views);
    Py_buffer *held[] = {&which, &rows, &out};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    Py_DECREF(fast);
    return result;
}
