/* Index generation for the step loader. Every index is a pure function of
 * (mode, length, batch, seed, step, position), so any step is computed directly: no state,
 * no replay on seek. The Python layer (chute.sampler) validates arguments; this module owns
 * the arithmetic and releases the GIL for large batches. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { MODE_SEQUENTIAL = 0, MODE_IID = 1, MODE_CYCLIC = 2 };

#define GOLDEN 0x9E3779B97F4A7C15ull
#define FEISTEL_ROUNDS 4
#define NOGIL_MIN 4096

typedef unsigned __int128 u128;

/* SplitMix64's finaliser: a fast bijective 64-bit mixer with full avalanche. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The key of one step, separated per mode so that modes sharing a seed stay unrelated. */
static inline uint64_t step_key(uint64_t seed, uint64_t domain, uint64_t counter) {
    return mix64(mix64(seed ^ (domain * GOLDEN)) ^ mix64(counter + GOLDEN));
}

static void fill_sequential(uint64_t length, uint64_t batch, uint64_t step, uint64_t first,
                            uint64_t *out, size_t n) {
    uint64_t pos = (uint64_t)(((u128)step * batch + first) % length);
    for (size_t i = 0; i < n; i++) {
        out[i] = pos;
        if (++pos == length) pos = 0;
    }
}

/* Uniform draws in [0, length) with Lemire's multiply-and-reject. Draw j of attempt a is
 * SplitMix64 output j of a stream keyed by (seed, step, a); rejection is rare, so redraws
 * take the next attempt's stream at the same position. */
static void fill_iid(uint64_t length, uint64_t seed, uint64_t step, uint64_t first,
                     uint64_t *out, size_t n) {
    const uint64_t key = step_key(seed, MODE_IID, step);
    const uint64_t threshold = (0 - length) % length;
    for (size_t i = 0; i < n; i++) {
        uint64_t j = first + i;
        u128 m = (u128)mix64(key + (j + 1) * GOLDEN) * length;
        for (uint64_t a = 1; (uint64_t)m < threshold; a++) {
            uint64_t k = mix64(key ^ mix64(a * GOLDEN));
            m = (u128)mix64(k + (j + 1) * GOLDEN) * length;
        }
        out[i] = (uint64_t)(m >> 64);
    }
}

typedef struct {
    uint64_t length, mask, keys[FEISTEL_ROUNDS];
    unsigned half;
} feistel_t;

static void feistel_init(feistel_t *f, uint64_t length, uint64_t seed, uint64_t cycle) {
    unsigned bits = 64 - (unsigned)__builtin_clzll(length - 1); /* length >= 2 */
    bits += bits & 1;
    f->length = length;
    f->half = bits / 2;
    f->mask = (1ull << f->half) - 1; /* half <= 32 */
    uint64_t key = step_key(seed, MODE_CYCLIC, cycle);
    for (int r = 0; r < FEISTEL_ROUNDS; r++) f->keys[r] = mix64(key + (uint64_t)(r + 1) * GOLDEN);
}

/* A bijection on [0, 4^half) by a balanced Feistel network; cycle-walking (re-encrypting
 * until the value lands below length) restricts it to a bijection on [0, length). */
static inline uint64_t feistel_permute(const feistel_t *f, uint64_t x) {
    do {
        uint64_t left = x >> f->half, right = x & f->mask;
        for (int r = 0; r < FEISTEL_ROUNDS; r++) {
            uint64_t next = left ^ (mix64(right ^ f->keys[r]) & f->mask);
            left = right;
            right = next;
        }
        x = (left << f->half) | right;
    } while (x >= f->length);
    return x;
}

/* Cycle c is a fresh permutation of the whole index space; it yields length / batch full
 * batches and drops the remainder, which the next permutation places differently. */
static void fill_cyclic(uint64_t length, uint64_t batch, uint64_t seed, uint64_t step,
                        uint64_t first, uint64_t *out, size_t n) {
    if (length == 1) {
        for (size_t i = 0; i < n; i++) out[i] = 0;
        return;
    }
    uint64_t per_cycle = length / batch;
    feistel_t f;
    feistel_init(&f, length, seed, step / per_cycle);
    uint64_t pos = (step % per_cycle) * batch + first;
    for (size_t i = 0; i < n; i++) out[i] = feistel_permute(&f, pos + i);
}

static int get_u64(PyObject *obj, const char *name, uint64_t *value) {
    PyObject *index = PyNumber_Index(obj);
    if (!index) return -1;
    *value = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (*value == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s must be an int in [0, 2**64)", name);
        return -1;
    }
    return 0;
}

/* fill(mode, length, batch, seed, step, first, out): writes positions first..first+len(out)
 * of the batch at `step` into the uint64 buffer `out`. */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *names[] = {"mode", "length", "batch", "seed", "step", "first"};
    uint64_t v[6];
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "fill takes 7 arguments");
    for (int i = 0; i < 6; i++)
        if (get_u64(args[i], names[i], &v[i]) < 0) return NULL;
    uint64_t mode = v[0], length = v[1], batch = v[2], seed = v[3], step = v[4], first = v[5];
    Py_buffer out;
    if (PyObject_GetBuffer(args[6], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    size_t n = (size_t)out.len / sizeof(uint64_t);
    const char *error = NULL;
    if (out.len % (Py_ssize_t)sizeof(uint64_t) || ((uintptr_t)out.buf % sizeof(uint64_t)))
        error = "out must be an aligned uint64 buffer";
    else if (length == 0 || batch == 0)
        error = "length and batch must be positive";
    else if (first > batch || n > batch - first)
        error = "positions run past the end of the batch";
    else if (mode == MODE_CYCLIC && batch > length)
        error = "a cyclic batch cannot exceed the index space";
    else if (mode > MODE_CYCLIC)
        error = "unknown sampler mode";
    if (error) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    uint64_t *dst = out.buf;
    PyThreadState *state = n >= NOGIL_MIN ? PyEval_SaveThread() : NULL;
    switch (mode) {
    case MODE_SEQUENTIAL: fill_sequential(length, batch, step, first, dst, n); break;
    case MODE_IID: fill_iid(length, seed, step, first, dst, n); break;
    default: fill_cyclic(length, batch, seed, step, first, dst, n); break;
    }
    if (state) PyEval_RestoreThread(state);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* One window of the shard-window sampler: stream offset x = begins[0] + P(first + i), P the
 * cycle's permutation of the window's begins[m] - begins[0] records (keyed by key and cycle,
 * as a cyclic cycle is), and out[i] = x + shift[t] for the last shard t with begins[t] <= x.
 * Whatever the tables hold, every read stays inside them. */
static void fill_window_records(const uint64_t *begins, const uint64_t *shift, size_t m,
                                uint64_t key, uint64_t cycle, uint64_t first, uint64_t *out,
                                size_t n) {
    uint64_t low = begins[0], length = begins[m] - low;
    feistel_t f;
    if (length > 1) feistel_init(&f, length, key, cycle);
    for (size_t i = 0; i < n; i++) {
        uint64_t x = low + (length > 1 ? feistel_permute(&f, first + i) : 0);
        size_t lo = 0, hi = m; /* the answer lies in [lo, hi) */
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (begins[mid] <= x) lo = mid;
            else hi = mid;
        }
        out[i] = x + shift[lo];
    }
}

/* What is wrong with fill_window's buffers (begins, shift, out) and window position
 * `first`, or NULL; sets *m and *n (shifts and outputs) when nothing is. */
static const char *check_window(const Py_buffer *views, uint64_t first, size_t *m, size_t *n) {
    for (int i = 0; i < 3; i++)
        if (views[i].len % (Py_ssize_t)sizeof(uint64_t) ||
            ((uintptr_t)views[i].buf % sizeof(uint64_t)))
            return "begins, shift and out must be aligned uint64 buffers";
    *m = (size_t)views[1].len / sizeof(uint64_t);
    *n = (size_t)views[2].len / sizeof(uint64_t);
    if (*m == 0 || (size_t)views[0].len / sizeof(uint64_t) != *m + 1)
        return "a window needs m >= 1 shifts and m + 1 begins";
    const uint64_t *begins = views[0].buf;
    if (begins[*m] <= begins[0]) return "the window holds no records";
    uint64_t length = begins[*m] - begins[0];
    if (first > length || *n > length - first) return "positions run past the end of the window";
    return NULL;
}

/* fill_window(begins, shift, key, cycle, first, out): positions first..first+len(out) of one
 * window's records in a cycle (see fill_window_records); begins holds the m + 1 increasing
 * stream offsets of its m shards, shift m values. */
static PyObject *fill_window(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *names[] = {"key", "cycle", "first"};
    static const int flags[] = {PyBUF_C_CONTIGUOUS, PyBUF_C_CONTIGUOUS,
                                PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS};
    uint64_t v[3];
    if (nargs != 6) return PyErr_Format(PyExc_TypeError, "fill_window takes 6 arguments");
    for (int i = 0; i < 3; i++)
        if (get_u64(args[i + 2], names[i], &v[i]) < 0) return NULL;
    PyObject *objects[3] = {args[0], args[1], args[5]};
    Py_buffer views[3];
    int got = 0;
    while (got < 3 && PyObject_GetBuffer(objects[got], &views[got], flags[got]) == 0) got++;
    size_t m = 0, n = 0;
    const char *error = got == 3 ? check_window(views, v[2], &m, &n) : NULL;
    if (got == 3 && !error) {
        PyThreadState *state = n >= NOGIL_MIN ? PyEval_SaveThread() : NULL;
        fill_window_records(views[0].buf, views[1].buf, m, v[0], v[1], v[2], views[2].buf, n);
        if (state) PyEval_RestoreThread(state);
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    if (got < 3) return NULL;
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "Write a slice of the batch at one step into a uint64 buffer."},
    {"fill_window", (PyCFunction)(void (*)(void))fill_window, METH_FASTCALL,
     "Write positions of one window's records in a cycle of the shard-window sampler."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampler", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sampler(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    /* the mode codes, checked against chute.loader._sampler's at import */
    if (PyModule_AddIntConstant(m, "MODE_SEQUENTIAL", MODE_SEQUENTIAL) < 0 ||
        PyModule_AddIntConstant(m, "MODE_IID", MODE_IID) < 0 ||
        PyModule_AddIntConstant(m, "MODE_CYCLIC", MODE_CYCLIC) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
