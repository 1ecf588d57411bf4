/* kernels._cpu: the products (linear, linear_prefill) and dequantize. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "bind.h"

/* linear and linear_prefill: the same arguments, checks and result; `prefill` picks the
 * kernel (the decode one, or dequantised tiles for many rows of x). */
static PyObject *linear_call(PyObject *args, PyObject *kw, int prefill) {
    static char *kwlist[] = {"qtype", "w", "x", "out", "col0", NULL};
    int qt;
    PyObject *ow, *ox, *oo;
    Py_ssize_t col0 = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, prefill ? "iOOO|n:linear_prefill" : "iOOO|n:linear",
                                     kwlist, &qt, &ow, &ox, &oo, &col0))
        return NULL;
    Buf w = {0}, x = {0}, o = {0};
    if (get(ow, &w, "w", 2, ANY, 0) || get(ox, &x, "x", 2, F32, 0) ||
        get(oo, &o, "out", 2, F32, 1))
        goto fail;
    const Py_ssize_t N = dim(&w, 0), row_bytes = dim(&w, 1) * w.v.itemsize;
    const Py_ssize_t B = dim(&x, 0), K = dim(&x, 1), ldo = dim(&o, 1);
    const Py_ssize_t Kw = row_values(qt, row_bytes);
    if (Kw < 0)
        goto fail;
    if (Kw != K) {
        PyErr_Format(PyExc_ValueError,
                     "w rows hold %zd %s values (%zd bytes) but x has K=%zd (a row of K=%zd "
                     "needs %zd bytes)",
                     Kw, qt_name(qt), row_bytes, K, K,
                     K % qt_block(qt) ? (Py_ssize_t)-1 : K / qt_block(qt) * qt_tsize(qt));
        goto fail;
    }
    if (dim(&o, 0) != B) {
        PyErr_Format(PyExc_ValueError, "out has %zd rows, x has %zd", dim(&o, 0), B);
        goto fail;
    }
    if (overlap(&o, &x) || overlap(&o, &w)) {
        PyErr_SetString(PyExc_ValueError, "out must not share memory with x or w");
        goto fail;
    }
    if (col0 < 0 || col0 > ldo || N > ldo - col0) {
        PyErr_Format(PyExc_ValueError, "out has %zd columns: too few for %zd rows of w at col0=%zd",
                     ldo, N, col0);
        goto fail;
    }
    {
        const int isa = g_isa, nt = g_threads;
        const uint8_t *wp = (const uint8_t *)w.v.buf;
        const float *xp = (const float *)x.v.buf;
        float *op = (float *)o.v.buf + col0;
        int rc = 0;
        Py_BEGIN_ALLOW_THREADS;
        if (K == 0) {
            for (Py_ssize_t b = 0; b < B; b++)
                for (Py_ssize_t r = 0; r < N; r++)
                    op[b * ldo + r] = 0.f;
        } else if (prefill) {
            rc = cpu_linear_prefill(isa, nt, qt, wp, (size_t)row_bytes, N, K, xp, B, op, ldo);
        } else {
            cpu_linear(isa, nt, qt, wp, (size_t)row_bytes, N, K, xp, B, op, ldo);
        }
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    release(&w);
    release(&x);
    release(&o);
    Py_RETURN_NONE;
fail:
    release(&w);
    release(&x);
    release(&o);
    return NULL;
}

PyObject *py_linear(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return linear_call(args, kw, 0);
}

PyObject *py_linear_prefill(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return linear_call(args, kw, 1);
}

PyObject *py_dequantize(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"qtype", "w", "out", NULL};
    int qt;
    PyObject *ow, *oo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOO:dequantize", kwlist, &qt, &ow, &oo))
        return NULL;
    Buf w = {0}, o = {0};
    if (get(ow, &w, "w", 2, ANY, 0) || get(oo, &o, "out", 2, F32, 1))
        goto fail;
    const Py_ssize_t R = dim(&w, 0), row_bytes = dim(&w, 1) * w.v.itemsize;
    const Py_ssize_t K = row_values(qt, row_bytes);
    if (K < 0)
        goto fail;
    if (dim(&o, 0) != R || dim(&o, 1) != K) {
        PyErr_Format(PyExc_ValueError, "out must be (%zd, %zd) for %zd %s rows, got (%zd, %zd)", R,
                     K, R, qt_name(qt), dim(&o, 0), dim(&o, 1));
        goto fail;
    }
    if (overlap(&o, &w)) {
        PyErr_SetString(PyExc_ValueError, "out must not share memory with w");
        goto fail;
    }
    {
        const int isa = g_isa, nt = g_threads;
        const uint8_t *wp = (const uint8_t *)w.v.buf;
        float *op = (float *)o.v.buf;
        Py_BEGIN_ALLOW_THREADS;
        cpu_dequantize(isa, nt, qt, wp, (size_t)row_bytes, R, K, op);
        Py_END_ALLOW_THREADS;
    }
    release(&w);
    release(&o);
    Py_RETURN_NONE;
fail:
    release(&w);
    release(&o);
    return NULL;
}
