#include "pyface.h"

#include <string.h>

/* Field names (between colons) are skipped; an 'O' or '&' anywhere else is refused: writing
 * record bytes over an object's pointers would crash the interpreter later. */
int chute_plain_format(const char *f) {
    if (!f) return 1; /* no format: unsigned bytes */
    for (; *f; f++) {
        if (*f == ':') {
            const char *end = strchr(f + 1, ':');
            if (!end) return 0;
            f = end;
        } else if (*f == 'O' || *f == '&') {
            return 0;
        }
    }
    return 1;
}

int chute_get_items(PyObject *obj, Py_buffer *view, size_t size, size_t count, int writable,
                    const char *what) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (!chute_plain_format(view->format) || view->itemsize != (Py_ssize_t)size ||
        (uintptr_t)view->buf % size || (size_t)view->len < count * size) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be %zu aligned plain items of %zu bytes (got %zd bytes of "
                     "itemsize %zd)",
                     what, count, size, view->len, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

int chute_get_dst(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_BufferError) &&
            !PyErr_ExceptionMatches(PyExc_ValueError) &&
            !PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError,
                        "out must be a writeable C-contiguous buffer of a plain dtype");
        return -1;
    }
    if (!chute_plain_format(view->format)) {
        PyErr_Format(PyExc_TypeError,
                     "out has buffer format '%s', which holds Python objects or pointers: "
                     "records can only be gathered into plain-data buffers",
                     view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

int chute_open_store(PyObject *table, PyObject *limits, PyObject *chunks, PyObject *ddict,
                     PyObject *sums, int strict, store_views *v, zr_store *out) {
    memset(v, 0, sizeof *v);
    memset(out, 0, sizeof *out);
    if (PyObject_GetBuffer(table, &v->table, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(limits, &v->limits, PyBUF_C_CONTIGUOUS) < 0) return -1;
    chunk_maps *maps = PyCapsule_GetPointer(chunks, CHUNKS_CAPSULE);
    if (!maps) return -1;
    if (sums != Py_None && PyObject_GetBuffer(sums, &v->sums, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((size_t)v->limits.len < maps->n * sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "limits shorter than the chunk list");
        return -1;
    }
    const uint64_t *limit = v->limits.buf;
    for (size_t c = 0; c < maps->n; c++) {
        if (limit[c] > maps->sizes[c]) {
            PyErr_Format(PyExc_ValueError,
                         "the limit of chunk %zu (%llu bytes) is past its end (%llu bytes)", c,
                         (unsigned long long)limit[c], (unsigned long long)maps->sizes[c]);
            return -1;
        }
    }
    if (ddict != Py_None) {
        out->ddict = PyCapsule_GetPointer(ddict, DDICT_CAPSULE);
        if (!out->ddict) return -1;
    }
    out->table = v->table.buf;
    out->length = (uint64_t)v->table.len / sizeof(zr_loc);
    out->bases = (const uint8_t *const *)maps->bases;
    out->limits = limit;
    out->nchunks = (uint32_t)maps->n;
    if (v->sums.buf) {
        out->sums = v->sums.buf;
        out->nsums = (uint64_t)v->sums.len / sizeof(zr_sum);
        out->strict = strict;
    }
    return 0;
}

void chute_release_store(store_views *v) {
    if (v->table.obj) PyBuffer_Release(&v->table);
    if (v->limits.obj) PyBuffer_Release(&v->limits);
    if (v->sums.obj) PyBuffer_Release(&v->sums);
}
