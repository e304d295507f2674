/* Curve kernels for the metric plots and the dashboard: the debiased EMA and per-bucket
 * extreme picking (the M4 thinning), one pass each over a slice of a column, with the GIL
 * released. The Python layer (chute.metrics._smooth) chooses the buckets; every buffer is
 * checked here (format, contiguity, length, writability) before it is read or written. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define NOGIL_MIN 4096

/* Take a C-contiguous buffer of one plain item type ('d' double, 'q' int64); NULL on error. */
static int get_view(PyObject *obj, Py_buffer *view, const char *what, char type, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
    int ok = fmt[0] == type && fmt[1] == '\0' && view->itemsize == 8 &&
             ((uintptr_t)view->buf % 8) == 0;
    if (!ok && type == 'q' && fmt[1] == '\0' && view->itemsize == 8 && fmt[0] == 'l') ok = 1;
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be an aligned %s buffer", what,
                     type == 'd' ? "float64" : "int64");
        return -1;
    }
    return 0;
}

/* The EMA recurrence acc = f acc + (1 - f) v, w = f w + (1 - f) over finite values, four
 * rows at a time where all four are finite: each of the four is computed from the state
 * before them, so the chain of dependent operations is one per four rows, not four. */
static void ema_run(const double *v, size_t n, double f, double *acc_io, double *w_io,
                    double *dst, const int64_t *at, size_t m) {
    const double g = 1 - f, p[5] = {1, f, f * f, f * f * f, f * f * f * f};
    double acc = *acc_io, w = *w_io, a[4], ws[4];
    size_t i = 0, k = 0;
    while (i < n) {
        size_t step = 1;
        if (i + 4 <= n && isfinite(v[i]) && isfinite(v[i + 1]) && isfinite(v[i + 2]) &&
            isfinite(v[i + 3])) {
            double s1 = v[i], s2 = f * s1 + v[i + 1], s3 = f * s2 + v[i + 2],
                   s4 = f * s3 + v[i + 3];
            a[0] = p[1] * acc + g * s1;
            a[1] = p[2] * acc + g * s2;
            a[2] = p[3] * acc + g * s3;
            a[3] = p[4] * acc + g * s4;
            for (int j = 0; j < 4; j++) ws[j] = p[j + 1] * w + (1 - p[j + 1]);
            step = 4;
        } else {
            if (isfinite(v[i])) {
                acc = f * acc + g * v[i];
                w = f * w + g;
            }
            a[0] = acc;
            ws[0] = w;
        }
        if (!at) {
            for (size_t j = 0; j < step; j++) dst[i + j] = ws[j] > 0 ? a[j] / ws[j] : NAN;
        } else {
            for (; k < m && (size_t)at[k] < i + step; k++) {
                size_t j = (size_t)at[k] - i;
                dst[k] = ws[j] > 0 ? a[j] / ws[j] : NAN;
            }
        }
        acc = a[step - 1];
        w = ws[step - 1];
        i += step;
    }
    *acc_io = acc;
    *w_io = w;
}

/* ema(values, factor, acc, weight, out, at) -> (acc, weight): the debiased EMA after each
 * row, written to out at every row (at None) or at the rows listed in at (increasing, inside
 * values; out as long as at); a non-finite value neither moves nor decays it (the previous
 * smoothed value, NaN before any finite one, is carried). */
static PyObject *ema(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) return PyErr_Format(PyExc_TypeError, "ema takes 6 arguments");
    double f = PyFloat_AsDouble(args[1]), acc = PyFloat_AsDouble(args[2]),
           w = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!(f >= 0 && f < 1)) return PyErr_Format(PyExc_ValueError, "factor must be in [0, 1)");
    Py_buffer in, out, atv = {0};
    int have_at = args[5] != Py_None;
    if (get_view(args[0], &in, "values", 'd', 0) < 0) return NULL;
    if (get_view(args[4], &out, "out", 'd', 1) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    if (have_at && get_view(args[5], &atv, "at", 'q', 0) < 0) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    size_t n = (size_t)in.len / 8, m = have_at ? (size_t)atv.len / 8 : n;
    const int64_t *at = have_at ? atv.buf : NULL;
    const char *error = (size_t)out.len / 8 != m ? "out must be as long as values, or at" : NULL;
    for (size_t k = 0; k < m && at && !error; k++)
        if (at[k] < 0 || (size_t)at[k] >= n || (k && at[k] <= at[k - 1]))
            error = "at must increase strictly inside values";
    if (error) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        if (have_at) PyBuffer_Release(&atv);
        return PyErr_Format(PyExc_ValueError, "%s", error);
    }
    const double *v = in.buf;
    double *dst = out.buf;
    PyThreadState *state = n >= NOGIL_MIN ? PyEval_SaveThread() : NULL;
    ema_run(v, n, f, &acc, &w, dst, at, m);
    if (state) PyEval_RestoreThread(state);
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    if (have_at) PyBuffer_Release(&atv);
    return Py_BuildValue("(dd)", acc, w);
}

/* extremes(y, starts, out) -> count: for each bucket [starts[k], starts[k+1]) (the last one
 * to the end of y) its first row, the first row of its least and of its greatest value
 * (NaN ignored; an all-NaN bucket gives its first row) and its last row, written to out in
 * increasing order without repeats. starts must increase strictly and lie inside y. */
static PyObject *extremes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "extremes takes 3 arguments");
    Py_buffer yv, sv, ov;
    if (get_view(args[0], &yv, "y", 'd', 0) < 0) return NULL;
    if (get_view(args[1], &sv, "starts", 'q', 0) < 0) {
        PyBuffer_Release(&yv);
        return NULL;
    }
    if (get_view(args[2], &ov, "out", 'q', 1) < 0) {
        PyBuffer_Release(&yv);
        PyBuffer_Release(&sv);
        return NULL;
    }
    const double *y = yv.buf;
    const int64_t *starts = sv.buf;
    int64_t *out = ov.buf;
    int64_t n = (int64_t)(yv.len / 8), m = (int64_t)(sv.len / 8);
    const char *error = NULL;
    if ((size_t)ov.len / 8 < 4 * (size_t)m) error = "out must hold 4 rows per bucket";
    for (int64_t k = 0; k < m && !error; k++)
        if (starts[k] < 0 || starts[k] >= n || (k && starts[k] <= starts[k - 1]))
            error = "starts must increase strictly inside y";
    if (error) {
        PyBuffer_Release(&yv);
        PyBuffer_Release(&sv);
        PyBuffer_Release(&ov);
        return PyErr_Format(PyExc_ValueError, "%s", error);
    }
    PyThreadState *state = n >= NOGIL_MIN ? PyEval_SaveThread() : NULL;
    int64_t count = 0;
    for (int64_t k = 0; k < m; k++) {
        int64_t a = starts[k], b = k + 1 < m ? starts[k + 1] : n;
        int64_t lo = -1, hi = -1;
        for (int64_t i = a; i < b; i++) {
            double v = y[i];
            if (v != v) continue;
            if (lo < 0 || v < y[lo]) lo = i;
            if (hi < 0 || v > y[hi]) hi = i;
        }
        if (lo < 0) lo = hi = a;
        int64_t pick[4] = {a, lo < hi ? lo : hi, lo < hi ? hi : lo, b - 1};
        for (int j = 0; j < 4; j++)
            if (count == 0 || pick[j] > out[count - 1]) out[count++] = pick[j];
    }
    if (state) PyEval_RestoreThread(state);
    PyBuffer_Release(&yv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ov);
    return PyLong_FromLongLong(count);
}

static PyMethodDef methods[] = {
    {"ema", (PyCFunction)(void (*)(void))ema, METH_FASTCALL,
     "Debiased exponential moving average of a float64 slice, continuing a state."},
    {"extremes", (PyCFunction)(void (*)(void))extremes, METH_FASTCALL,
     "First, least, greatest and last row of each bucket of a float64 slice."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_curves", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__curves(void) { return PyModule_Create(&module); }
