/* What the compiled core's Python-facing files share: the capsules that carry a store's
 * chunks and dictionary, and the checks every buffer from Python passes before it is read
 * or written. */
#ifndef CHUTE_PYFACE_H
#define CHUTE_PYFACE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "gather.h"

#define CDICT_CAPSULE "chute.zstd_cdict"
#define DDICT_CAPSULE "chute.zstd_ddict"
#define CHUNKS_CAPSULE "chute.chunk_maps"

/* The chunks a gather reads (see map_chunks and chunks_from_buffers). `sizes` is each
 * chunk's real extent: a read refuses a limit past it. */
typedef struct {
    size_t n;
    uint8_t **bases;
    uint64_t *sizes;
    Py_buffer *views; /* NULL for mapped files; else one held view per chunk */
} chunk_maps;

/* True when a PEP 3118 format describes plain data: no Python object, no pointer. */
int chute_plain_format(const char *f);

/* A C-contiguous buffer of at least `count` aligned plain-data items of `size` bytes
 * (writable if asked), or -1 with a ValueError naming it `what` (nothing left held). */
int chute_get_items(PyObject *obj, Py_buffer *view, size_t size, size_t count, int writable,
                    const char *what);

/* A writable, C-contiguous, plain-data buffer, or -1 with a clear exception. */
int chute_get_dst(PyObject *obj, Py_buffer *view);

/* The Python buffers behind a zr_store, held while it is read. */
typedef struct {
    Py_buffer table, limits, sums;
} store_views;

/* A zr_store from a snapshot's (table, limits, chunks, ddict, sums or None, strict): every
 * buffer held in `views` (release with chute_release_store, also after a failure) and every
 * chunk limit checked against its chunk's extent. 0, or -1 with an exception set. */
int chute_open_store(PyObject *table, PyObject *limits, PyObject *chunks, PyObject *ddict,
                     PyObject *sums, int strict, store_views *views, zr_store *out);
void chute_release_store(store_views *views);

/* The token reader's entries (tokens_module.c). */
PyObject *chute_py_read_tokens(PyObject *self, PyObject *args);
PyObject *chute_py_pack_groups(PyObject *self, PyObject *args);
PyObject *chute_py_read_packed(PyObject *self, PyObject *args);
PyObject *chute_py_read_windows(PyObject *self, PyObject *args);

#endif
