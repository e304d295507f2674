/* Python face of the record store's compiled core. Buffers in, buffers out: the Python
 * layer (chute.store) owns files, layout and validation; this module owns the loops. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compress.h"
#include "crc32c.h"
#include "gather.h"
#include "pyface.h"
#include "tokens.h"
#include "zstd_api.h"

/* 16 bytes in one store instruction (movdqa; a q-register store elsewhere): a signal is
 * taken between instructions, so a killed writer cannot leave half of them. */
static inline void store16(uint8_t *dst, const void *src) {
#if defined(__SSE2__)
    _mm_store_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
#else
    __uint128_t v;
    memcpy(&v, src, 16);
    __atomic_store_n((__uint128_t *)dst, v, __ATOMIC_RELAXED);
#endif
}

/* From this dictionary size on, attaching its tables beats copying them per record
 * (measured on 12 KiB records at level 19: 1 MiB dictionary 2.9 -> 5.2 MiB/s, while a
 * 110 KiB one drops from 35 to 7 MiB/s when attached). */
#define ATTACH_DICT_BYTES ((uintptr_t)512 * 1024)

static void cdict_free(PyObject *cap) {
    ZSTD_CDict *d = PyCapsule_GetPointer(cap, CDICT_CAPSULE);
    if (d) ZSTD_freeCDict(d);
}

static void ddict_free(PyObject *cap) {
    ZSTD_DDict *d = PyCapsule_GetPointer(cap, DDICT_CAPSULE);
    if (d) ZSTD_freeDDict(d);
}

static PyObject *make_cdict(PyObject *self, PyObject *args) {
    Py_buffer dict;
    int level;
    if (!PyArg_ParseTuple(args, "y*i", &dict, &level)) return NULL;
    size_t size = (size_t)dict.len;
    ZSTD_CDict *d = ZSTD_createCDict(dict.buf, size, level);
    PyBuffer_Release(&dict);
    if (!d) return PyErr_Format(PyExc_ValueError, "zstd rejected the dictionary");
    PyObject *cap = PyCapsule_New(d, CDICT_CAPSULE, cdict_free);
    /* The context carries the dictionary's size, which decides how records use it. */
    if (cap && PyCapsule_SetContext(cap, (void *)(uintptr_t)size) < 0) Py_CLEAR(cap);
    return cap;
}

static PyObject *make_ddict(PyObject *self, PyObject *args) {
    Py_buffer dict;
    if (!PyArg_ParseTuple(args, "y*", &dict)) return NULL;
    ZSTD_DDict *d = ZSTD_createDDict(dict.buf, (size_t)dict.len);
    PyBuffer_Release(&dict);
    if (!d) return PyErr_Format(PyExc_ValueError, "zstd rejected the dictionary");
    return PyCapsule_New(d, DDICT_CAPSULE, ddict_free);
}

static PyObject *train_dict(PyObject *self, PyObject *args) {
    Py_buffer samples, sizes;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "y*y*n", &samples, &sizes, &capacity)) return NULL;
    PyObject *result = NULL;
    size_t n = (size_t)sizes.len / sizeof(uint64_t);
    size_t *sz = malloc((n ? n : 1) * sizeof *sz);
    void *out = malloc(capacity > 0 ? (size_t)capacity : 1);
    uint64_t total = 0;
    for (size_t i = 0; sz && i < n; i++) {
        sz[i] = (size_t)((const uint64_t *)sizes.buf)[i];
        total += sz[i];
    }
    if (!sz || !out) {
        PyErr_NoMemory();
    } else if (capacity <= 0 || total > (uint64_t)samples.len) {
        PyErr_SetString(PyExc_ValueError, "sample sizes exceed the sample buffer");
    } else {
        size_t r;
        Py_BEGIN_ALLOW_THREADS
        r = ZDICT_trainFromBuffer(out, (size_t)capacity, samples.buf, sz, (unsigned)n);
        Py_END_ALLOW_THREADS
        if (ZDICT_isError(r))
            PyErr_Format(PyExc_ValueError, "zstd could not train a dictionary: %s",
                         ZDICT_getErrorName(r));
        else
            result = PyBytes_FromStringAndSize(out, (Py_ssize_t)r);
    }
    free(sz);
    free(out);
    PyBuffer_Release(&samples);
    PyBuffer_Release(&sizes);
    return result;
}

/* The chunks a gather reads: chunk files mapped read-only, each over the format's 4 GiB span
 * so a file that grows needs no remap (reads stay inside each chunk's validated limit, so they
 * never touch a page past the end of its file); or Python buffers the capsule holds (bytes a
 * remote read fetched), each as long as it is. `sizes` is each chunk's real extent: a gather
 * refuses a limit past it, so no table can make it read outside a buffer. */
#define CHUNK_SPAN ((size_t)1 << 32)

static void chunks_free(PyObject *cap) {
    chunk_maps *m = PyCapsule_GetPointer(cap, CHUNKS_CAPSULE);
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) {
        if (m->views)
            PyBuffer_Release(&m->views[i]);
        else if (m->bases[i])
            munmap(m->bases[i], CHUNK_SPAN);
    }
    free(m->bases);
    free(m->sizes);
    free(m->views);
    free(m);
}

/* An empty chunk list for n chunks (with room for n held views when `buffers`), in a capsule
 * that frees it; NULL with an exception set on failure. */
static PyObject *new_chunks(Py_ssize_t n, int buffers, chunk_maps **out) {
    size_t count = (size_t)(n ? n : 1);
    chunk_maps *m = calloc(1, sizeof *m);
    if (m) {
        m->bases = calloc(count, sizeof *m->bases);
        m->sizes = calloc(count, sizeof *m->sizes);
        if (buffers) m->views = calloc(count, sizeof *m->views);
    }
    if (!m || !m->bases || !m->sizes || (buffers && !m->views)) {
        if (m) {
            free(m->bases);
            free(m->sizes);
            free(m->views);
        }
        free(m);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(m, CHUNKS_CAPSULE, chunks_free);
    if (!cap) {
        free(m->bases);
        free(m->sizes);
        free(m->views);
        free(m);
        return NULL;
    }
    *out = m;
    return cap;
}

static PyObject *map_chunks(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "map_chunks takes a sequence of file descriptors");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    chunk_maps *m = NULL;
    PyObject *cap = new_chunks(n, 0, &m);
    if (!cap) {
        Py_DECREF(fast);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (fd == -1 && PyErr_Occurred()) goto fail;
        void *p = mmap(NULL, CHUNK_SPAN, PROT_READ, MAP_SHARED | MAP_NORESERVE, (int)fd, 0);
        if (p == MAP_FAILED) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto fail;
        }
        m->bases[i] = p;
        m->sizes[i] = CHUNK_SPAN;
        m->n = (size_t)i + 1;
    }
    Py_DECREF(fast);
    return cap;
fail:
    Py_DECREF(fast);
    Py_DECREF(cap);
    return NULL;
}

/* chunks_from_buffers(buffers): chunks over Python buffers (bytes, numpy arrays, obstore's
 * Bytes), held until the capsule dies, so the memory cannot move or go while a gather reads
 * it. Each must be C-contiguous plain bytes; it is only ever read. */
static PyObject *chunks_from_buffers(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "chunks_from_buffers takes a sequence of buffers");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    chunk_maps *m = NULL;
    PyObject *cap = n > 0xFFFF + 1
                        ? PyErr_Format(PyExc_ValueError, "%zd chunks: a table names at most 65536", n)
                        : new_chunks(n, 1, &m);
    if (!cap) {
        Py_DECREF(fast);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer *v = &m->views[i];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), v,
                               PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            if (PyErr_ExceptionMatches(PyExc_BufferError) ||
                PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "chunk %zd is not a C-contiguous buffer", i);
            }
            goto fail;
        }
        m->n = (size_t)i + 1; /* held: released by the capsule from here on */
        if (!chute_plain_format(v->format)) {
            PyErr_Format(PyExc_TypeError,
                         "chunk %zd has buffer format '%s', which holds Python objects or "
                         "pointers: chunks are plain bytes",
                         i, v->format);
            goto fail;
        }
        m->bases[i] = v->buf;
        m->sizes[i] = (uint64_t)v->len;
    }
    Py_DECREF(fast);
    return cap;
fail:
    Py_DECREF(fast);
    Py_DECREF(cap);
    return NULL;
}

/* The records idx[i] (of stores[which[i]], or of the one store) decoded into dst: the one
 * body of gather and gather_many. */
static PyObject *run_gather(gather_args *a, PyObject *idx_obj, PyObject *dst_obj,
                            unsigned long long stride, PyObject *offsets_obj, Py_ssize_t threads,
                            Py_ssize_t nstores, Py_buffer *which) {
    Py_buffer idx = {0}, dst = {0}, offsets = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(idx_obj, &idx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (chute_get_dst(dst_obj, &dst) < 0) goto done;
    if (offsets_obj != Py_None && PyObject_GetBuffer(offsets_obj, &offsets, PyBUF_SIMPLE) < 0)
        goto done;
    a->idx = idx.buf;
    a->n = (size_t)idx.len / sizeof(int64_t);
    a->dst = dst.buf;
    a->dst_len = (size_t)dst.len;
    a->stride = stride;
    if (offsets.buf) {
        if ((size_t)offsets.len < a->n * sizeof(uint64_t)) {
            PyErr_SetString(PyExc_ValueError, "offsets shorter than idx");
            goto done;
        }
        a->dst_off = offsets.buf;
    }
    if (which) {
        if ((size_t)which->len < a->n * sizeof(int32_t) || which->itemsize != 4 ||
            (uintptr_t)which->buf % 4) {
            PyErr_SetString(PyExc_ValueError, "which must be aligned int32, one per index");
            goto done;
        }
        a->which = which->buf;
        for (size_t i = 0; i < a->n; i++) {
            if (a->which[i] < 0 || a->which[i] >= nstores) {
                PyErr_Format(PyExc_IndexError, "index %zu names store %d of %zd", i,
                             (int)a->which[i], nstores);
                goto done;
            }
        }
    }
    a->max_threads = threads > 0 ? (size_t)threads : 1;
    if (a->n <= 1) {
        chute_gather(a); /* not worth a GIL round trip */
    } else {
        Py_BEGIN_ALLOW_THREADS
        chute_gather(a);
        Py_END_ALLOW_THREADS
    }
    result = Py_BuildValue("inLK", a->err.code, (Py_ssize_t)a->err.pos, a->err.detail,
                           (unsigned long long)a->unchecked);
done:
    if (idx.obj) PyBuffer_Release(&idx);
    if (dst.obj) PyBuffer_Release(&dst);
    if (offsets.obj) PyBuffer_Release(&offsets);
    return result;
}

/* gather(table, limits, chunks, idx, dst, stride, offsets, ddict, sums, strict, threads)
 *   -> (code, pos, detail, unchecked). code 0 is success; the caller raises otherwise. */
static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *table, *limits, *chunks, *idx, *dst, *offsets, *ddict, *sums;
    unsigned long long stride;
    Py_ssize_t threads;
    int strict;
    if (!PyArg_ParseTuple(args, "OOOOOKOOOpn", &table, &limits, &chunks, &idx, &dst, &stride,
                          &offsets, &ddict, &sums, &strict, &threads))
        return NULL;
    store_views views;
    zr_store store;
    gather_args a = {.stores = &store};
    PyObject *result = NULL;
    if (chute_open_store(table, limits, chunks, ddict, sums, strict, &views, &store) == 0)
        result = run_gather(&a, idx, dst, stride, offsets, threads, 1, NULL);
    chute_release_store(&views);
    return result;
}

/* gather_many(stores, which, idx, dst, stride, offsets, threads) -> gather's tuple: record
 * idx[i] of stores[which[i]] (each store a snapshot's (table, limits, chunks, ddict, sums,
 * strict)), all in one call across the cores; pos names the failing index. */
static PyObject *gather_many(PyObject *self, PyObject *args) {
    PyObject *stores_obj, *which_obj, *idx, *dst, *offsets;
    unsigned long long stride;
    Py_ssize_t threads;
    if (!PyArg_ParseTuple(args, "OOOOKOn", &stores_obj, &which_obj, &idx, &dst, &stride,
                          &offsets, &threads))
        return NULL;
    PyObject *fast = PySequence_Fast(stores_obj, "gather_many takes a sequence of stores");
    if (!fast) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(fast);
    zr_store *stores = calloc(ns > 0 ? (size_t)ns : 1, sizeof *stores);
    store_views *views = calloc(ns > 0 ? (size_t)ns : 1, sizeof *views);
    Py_buffer which = {0};
    PyObject *result = NULL;
    if (!stores || !views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(fast, i), *table, *limits, *chunks, *ddict, *sums;
        int strict;
        if (!PyArg_Parse(t, "(OOOOOp)", &table, &limits, &chunks, &ddict, &sums, &strict) ||
            chute_open_store(table, limits, chunks, ddict, sums, strict, &views[i], &stores[i]) < 0)
            goto done;
    }
    if (PyObject_GetBuffer(which_obj, &which, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) goto done;
    gather_args a = {.stores = stores};
    result = run_gather(&a, idx, dst, stride, offsets, threads, ns, &which);
done:
    for (Py_ssize_t i = 0; views && i < ns; i++) chute_release_store(&views[i]);
    if (which.obj) PyBuffer_Release(&which);
    free(stores);
    free(views);
    Py_DECREF(fast);
    return result;
}

/* shard_split(starts, idx, which_out, local_out) -> [touched shards, rising]: index idx[i]
 * lies in shard s where starts[s] <= idx[i] < starts[s + 1] (starts: int64, one more than the
 * shards, rising; found by bisection, then checked to hold the index, so starts that do not
 * rise give no shard that does not hold it); which_out[i] (int32) is s's place among the
 * touched shards and local_out[i] (int64) idx[i] - starts[s]. An index in no shard is an
 * IndexError. */
static PyObject *shard_split(PyObject *self, PyObject *args) {
    PyObject *starts_obj, *idx_obj, *which_obj, *local_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &starts_obj, &idx_obj, &which_obj, &local_obj))
        return NULL;
    Py_buffer starts = {0}, idx = {0}, which = {0}, local = {0};
    int32_t *place = NULL;
    PyObject *result = NULL;
    if (chute_get_items(starts_obj, &starts, 8, 2, 0, "starts") < 0) goto done;
    if (chute_get_items(idx_obj, &idx, 8, 0, 0, "idx") < 0) goto done;
    size_t n = (size_t)idx.len / 8, ns = (size_t)starts.len / 8 - 1;
    if (ns > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "shard_split: too many shards");
        goto done;
    }
    if (chute_get_items(which_obj, &which, 4, n, 1, "which_out") < 0 ||
        chute_get_items(local_obj, &local, 8, n, 1, "local_out") < 0)
        goto done;
    if (!(place = malloc(ns * sizeof *place))) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t s = 0; s < ns; s++) place[s] = -1;
    const int64_t *start = starts.buf, *ix = idx.buf;
    int32_t *w = which.buf;
    int64_t *loc = local.buf;
    for (size_t i = 0; i < n; i++) { /* the last shard starting at or before the index */
        size_t lo = 0, hi = ns;
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (start[mid] <= ix[i])
                lo = mid;
            else
                hi = mid;
        }
        if (ix[i] < start[lo] || ix[i] >= start[lo + 1]) { /* also what falling starts give */
            PyErr_Format(PyExc_IndexError, "index %lld lies in no shard", (long long)ix[i]);
            goto done;
        }
        w[i] = (int32_t)lo;
        loc[i] = ix[i] - start[lo];
        place[lo] = 0;
    }
    int32_t touched = 0;
    for (size_t s = 0; s < ns; s++)
        if (place[s] == 0) place[s] = touched++ + 1; /* 1-based while counting */
    if (!(result = PyList_New(touched))) goto done;
    for (size_t s = 0; s < ns; s++) {
        if (place[s] <= 0) continue;
        PyObject *number = PyLong_FromSize_t(s);
        if (!number) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, place[s] - 1, number);
    }
    for (size_t i = 0; i < n; i++) w[i] = place[w[i]] - 1;
done:
    free(place);
    Py_buffer *held[] = {&starts, &idx, &which, &local};
    for (size_t j = 0; j < sizeof held / sizeof *held; j++)
        if (held[j]->obj) PyBuffer_Release(held[j]);
    return result;
}

/* compress(src, offsets, lengths, codec, level, cdict, threads, phys_out, codec_out, crc_out)
 *   -> bytearray of the records packed densely, or None when the codec is raw and the
 *      records already lie end to end in src (then src is what to write). */
static PyObject *compress(PyObject *self, PyObject *args) {
    Py_buffer src, off, len, phys, codecs, crcs;
    int codec, level;
    PyObject *cdict_obj;
    Py_ssize_t threads;
    if (!PyArg_ParseTuple(args, "y*y*y*iiOnw*w*w*", &src, &off, &len, &codec, &level, &cdict_obj,
                          &threads, &phys, &codecs, &crcs))
        return NULL;
    PyObject *out = NULL;
    size_t n = (size_t)len.len / sizeof(uint64_t);
    compress_args a = {0};
    if ((size_t)off.len < n * sizeof(uint64_t) || (size_t)phys.len < n * sizeof(uint32_t) ||
        (size_t)codecs.len < n || (size_t)crcs.len < n * sizeof(uint32_t)) {
        PyErr_SetString(PyExc_ValueError, "compress: output arrays shorter than the batch");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t o = ((const uint64_t *)off.buf)[i], l = ((const uint64_t *)len.buf)[i];
        if (l > MAX_RECORD || o > (uint64_t)src.len || (uint64_t)src.len - o < l) {
            PyErr_Format(PyExc_ValueError, "record %zu: bad source range (%llu bytes at %llu)", i,
                         (unsigned long long)l, (unsigned long long)o);
            goto done;
        }
    }
    if (codec < CODEC_RAW || codec > CODEC_ZSTD_DICT) {
        PyErr_Format(PyExc_ValueError, "unknown codec tag %d", codec);
        goto done;
    }
    if (codec == CODEC_ZSTD_DICT) {
        a.cdict = PyCapsule_GetPointer(cdict_obj, CDICT_CAPSULE);
        if (!a.cdict) goto done;
        a.attach_dict = (uintptr_t)PyCapsule_GetContext(cdict_obj) >= ATTACH_DICT_BYTES;
    }
    int in_place = codec == CODEC_RAW;
    for (size_t i = 1; in_place && i < n; i++) {
        const uint64_t *o = off.buf, *l = len.buf;
        in_place = o[i] == o[i - 1] + l[i - 1];
    }
    if (in_place) { /* raw and end to end already: the source is the output */
        Py_INCREF(Py_None);
        out = Py_None;
    } else {
        size_t cap = chute_compress_capacity(len.buf, n, codec);
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)cap);
        if (!out) goto done;
    }
    a.src = src.buf;
    a.src_off = off.buf;
    a.src_len = len.buf;
    a.n = n;
    a.codec = codec;
    a.level = level;
    a.max_threads = threads > 0 ? (size_t)threads : 1;
    a.out = in_place ? NULL : (uint8_t *)PyByteArray_AS_STRING(out);
    a.phys_len = phys.buf;
    a.codecs = codecs.buf;
    a.crcs = crcs.buf;
    Py_BEGIN_ALLOW_THREADS
    chute_compress(&a);
    Py_END_ALLOW_THREADS
    if (a.nomem) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    if (!in_place && PyByteArray_Resize(out, (Py_ssize_t)a.packed) < 0) Py_CLEAR(out);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&off);
    PyBuffer_Release(&len);
    PyBuffer_Release(&phys);
    PyBuffer_Release(&codecs);
    PyBuffer_Release(&crcs);
    return out;
}

/* The header state (tail_chunk u16 at byte 6, then tail_offset and length as one aligned
 * u64 at byte 8) of meta.zr and of the checksum sidecar, read and published so that another
 * thread or process sees the old state or the new, never a mix. The writer stores tail_chunk
 * first and the (offset, length) word last; the reader loads in the opposite order. A reader
 * that sees a new tail_chunk with the old word reads only old records, which all lie in the
 * chunks it then knows. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Zrecord header is little-endian; this core reads it in place"
#endif

static int state_buffer(PyObject *obj, Py_buffer *view, int writable) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (view->len < 16 || ((uintptr_t)view->buf & 7)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "a header needs an 8-byte aligned buffer of 16 bytes");
        return -1;
    }
    return 0;
}

static PyObject *load_state(PyObject *self, PyObject *obj) {
    Py_buffer b;
    if (state_buffer(obj, &b, 0) < 0) return NULL;
    uint64_t word = __atomic_load_n((const uint64_t *)((const uint8_t *)b.buf + 8), __ATOMIC_ACQUIRE);
    uint16_t chunk = __atomic_load_n((const uint16_t *)((const uint8_t *)b.buf + 6), __ATOMIC_ACQUIRE);
    PyBuffer_Release(&b);
    return Py_BuildValue("IkI", (unsigned)chunk, (unsigned long)(uint32_t)word,
                         (unsigned)(word >> 32));
}

static PyObject *store_state(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned int chunk, offset, length;
    if (!PyArg_ParseTuple(args, "OIII", &obj, &chunk, &offset, &length)) return NULL;
    if (chunk > 0xFFFF) return PyErr_Format(PyExc_ValueError, "tail chunk %u over 16 bits", chunk);
    Py_buffer b;
    if (state_buffer(obj, &b, 1) < 0) return NULL;
    uint8_t *p = b.buf;
    __atomic_store_n((uint16_t *)(p + 6), (uint16_t)chunk, __ATOMIC_RELEASE);
    __atomic_store_n((uint64_t *)(p + 8), (uint64_t)offset | ((uint64_t)length << 32),
                     __ATOMIC_SEQ_CST);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* put_entry(map, offset, entry): one 16-byte entry of meta.zr's table or of the checksum
 * sidecar, written at byte `offset` of the writable map in a single store instruction. A
 * process killed at any moment then leaves the old entry or the new one, never the fields of
 * one beside the fields of the other (numpy assigns a structured element field by field). */
static PyObject *put_entry(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned long long offset;
    Py_buffer entry;
    if (!PyArg_ParseTuple(args, "OKy*", &obj, &offset, &entry)) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&entry);
        return NULL;
    }
    const char *error = NULL;
    if (entry.len != 16)
        error = "an entry is 16 bytes";
    else if (offset > (unsigned long long)b.len || (unsigned long long)b.len - offset < 16)
        error = "the entry lies past the end of the map";
    else if (((uintptr_t)b.buf + offset) % 16)
        error = "the entry is not 16-byte aligned in the map";
    if (!error) store16((uint8_t *)b.buf + offset, entry.buf);
    PyBuffer_Release(&b);
    PyBuffer_Release(&entry);
    if (error) return PyErr_Format(PyExc_ValueError, "put_entry: %s", error);
    Py_RETURN_NONE;
}

/* The store's generation (a u64 at byte 8 of gen.chute), bumped before a delete, compaction
 * or reset changes anything a reader may have read, and checked by readers after each read. */
static PyObject *load_generation(PyObject *self, PyObject *obj) {
    Py_buffer b;
    if (state_buffer(obj, &b, 0) < 0) return NULL;
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* every read of records before this load */
    uint64_t g = __atomic_load_n((const uint64_t *)((const uint8_t *)b.buf + 8), __ATOMIC_SEQ_CST);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(g);
}

/* first_moved(stamps) -> the position of the first (gen.chute map, generation) pair whose map
 * holds another generation now, or -1: many stores' after-read checks in one call. */
static PyObject *first_moved(PyObject *self, PyObject *obj) {
    PyObject *fast = PySequence_Fast(obj, "first_moved takes a sequence of (map, generation)");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), moved = -1;
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* every read of records before these loads */
    for (Py_ssize_t i = 0; i < n && moved < 0; i++) {
        PyObject *map, *item = PySequence_Fast_GET_ITEM(fast, i);
        unsigned long long want;
        Py_buffer b;
        if (!PyArg_Parse(item, "(OK)", &map, &want) || state_buffer(map, &b, 0) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
        uint64_t g = __atomic_load_n((const uint64_t *)((const uint8_t *)b.buf + 8),
                                     __ATOMIC_SEQ_CST);
        PyBuffer_Release(&b);
        if (g != (uint64_t)want) moved = i;
    }
    Py_DECREF(fast);
    return PyLong_FromSsize_t(moved);
}

static PyObject *store_generation(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned long long g;
    if (!PyArg_ParseTuple(args, "OK", &obj, &g)) return NULL;
    Py_buffer b;
    if (state_buffer(obj, &b, 1) < 0) return NULL;
    __atomic_store_n((uint64_t *)((uint8_t *)b.buf + 8), (uint64_t)g, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* before any change the bump announces */
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &buf, &value)) return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = chute_crc32c(value, buf.buf, (size_t)buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, "Decode records into a caller buffer across cores."},
    {"shard_split", shard_split, METH_VARARGS,
     "Each index's shard (its place among those touched) and index within it."},
    {"gather_many", gather_many, METH_VARARGS,
     "Decode records of several stores into a caller buffer in one call across cores."},
    {"read_tokens", chute_py_read_tokens, METH_VARARGS,
     "Spans of token streams, their records' headers checked, in one call across cores."},
    {"read_windows", chute_py_read_windows, METH_VARARGS,
     "Windows of token streams (or of a mixture of them) read in one call."},
    {"pack_groups", chute_py_pack_groups, METH_VARARGS, "Pack groups of a token stream."},
    {"read_packed", chute_py_read_packed, METH_VARARGS,
     "Rows of packed groups laid out, their tokens read in place."},
    {"map_chunks", map_chunks, METH_VARARGS, "Map chunk files read-only for gather."},
    {"chunks_from_buffers", chunks_from_buffers, METH_VARARGS,
     "Hold Python buffers as the chunks of a gather."},
    {"compress", compress, METH_VARARGS, "Compress a batch of records across cores."},
    {"train_dict", train_dict, METH_VARARGS, "Train a zstd dictionary on sample records."},
    {"make_cdict", make_cdict, METH_VARARGS, "Digest a dictionary for compression."},
    {"make_ddict", make_ddict, METH_VARARGS, "Digest a dictionary for decompression."},
    {"crc32c", crc32c, METH_VARARGS, "CRC-32C of a buffer."},
    {"load_state", load_state, METH_O, "Read a header's (tail_chunk, tail_offset, length)."},
    {"store_state", store_state, METH_VARARGS, "Publish a header's state in one step."},
    {"put_entry", put_entry, METH_VARARGS, "Write one 16-byte entry in one store."},
    {"load_generation", load_generation, METH_O, "Read gen.chute's generation."},
    {"first_moved", first_moved, METH_O,
     "The first (gen.chute map, generation) pair whose generation moved, or -1."},
    {"store_generation", store_generation, METH_VARARGS, "Publish a new generation."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_zrecord", NULL, -1, methods};

PyMODINIT_FUNC PyInit__zrecord(void) {
    chute_crc32c_init();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#define CHUTE_ADD_ERROR(name, value)                                                         \
    if (PyModule_AddIntConstant(m, #name, value) < 0) goto fail;
    CHUTE_GATHER_ERRORS(CHUTE_ADD_ERROR)
    CHUTE_TOKEN_ERRORS(CHUTE_ADD_ERROR)
#undef CHUTE_ADD_ERROR
    if (PyModule_AddIntConstant(m, "MAX_RECORD", MAX_RECORD) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "CODEC_RAW", CODEC_RAW) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "CODEC_ZSTD", CODEC_ZSTD) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "CODEC_ZSTD_DICT", CODEC_ZSTD_DICT) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "LOC_SIZE", sizeof(zr_loc)) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "SUM_SIZE", sizeof(zr_sum)) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "ZSTD_MIN_LEVEL", ZSTD_minCLevel()) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "ZSTD_MAX_LEVEL", ZSTD_maxCLevel()) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
