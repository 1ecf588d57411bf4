/* kernels._cpu: greedy rows' logits (greedy.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bind.h"
#include "greedy.h"

PyObject *py_greedy_fast(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyBool_FromLong(cpu_greedy_fast(g_isa));
}

/* A Q8_0 matrix (N, row_bytes) and K from its rows, or -1 with the error set. */
static Py_ssize_t q8_0_rows(const Buf *w) {
    const Py_ssize_t row_bytes = dim(w, 1) * w->v.itemsize;
    return row_values(QT_Q8_0, row_bytes);
}

PyObject *py_greedy_prep(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ow, *oo, *os;
    if (!PyArg_ParseTuple(args, "OOO:greedy_prep", &ow, &oo, &os))
        return NULL;
    Buf w = {0}, o = {0}, s = {0};
    if (get(ow, &w, "w", 2, ANY, 0) || get(oo, &o, "norms", 1, F32, 1) ||
        get(os, &s, "sums", 2, ANY, 1))
        goto fail;
    const Py_ssize_t K = q8_0_rows(&w), N = dim(&w, 0);
    if (K < 0)
        goto fail;
    if (dim(&o, 0) != N || dim(&s, 0) != N || dim(&s, 1) != K / 32 || s.v.itemsize != 2) {
        PyErr_Format(PyExc_ValueError, "norms must be (%zd,) float32, sums (%zd, %zd) int16", N,
                     N, K / 32);
        goto fail;
    }
    {
        const uint8_t *wp = (const uint8_t *)w.v.buf;
        const size_t rb = (size_t)(dim(&w, 1) * w.v.itemsize);
        float *op = (float *)o.v.buf;
        Py_BEGIN_ALLOW_THREADS;
        cpu_greedy_prep_q8_0(wp, rb, N, K, op, (int16_t *)s.v.buf);
        Py_END_ALLOW_THREADS;
    }
    release(&w), release(&o), release(&s);
    Py_RETURN_NONE;
fail:
    release(&w), release(&o), release(&s);
    return NULL;
}

PyObject *py_greedy_logits(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ow, *on, *os, *ox, *oof, *oid, *oo, *oc;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:greedy_logits", &ow, &on, &os, &ox, &oof, &oid, &oo,
                          &oc))
        return NULL;
    Buf w = {0}, n = {0}, sm = {0}, x = {0}, bo = {0}, bi = {0}, o = {0}, c = {0};
    if (get(ow, &w, "w", 2, ANY, 0) || get(on, &n, "norms", 1, F32, 0) ||
        get(os, &sm, "sums", 2, ANY, 0) ||
        get(ox, &x, "x", 2, F32, 0) || get(oof, &bo, "ban_off", 1, I64, 0) ||
        get(oid, &bi, "ban_ids", 1, I64, 0) || get(oo, &o, "out", 2, F32, 1) ||
        get(oc, &c, "candidates", 1, I64, 1))
        goto fail;
    const Py_ssize_t K = q8_0_rows(&w), N = dim(&w, 0), B = dim(&x, 0);
    if (K < 0)
        goto fail;
    if (dim(&x, 1) != K || dim(&n, 0) != N || dim(&o, 0) != B || dim(&o, 1) != N ||
        dim(&sm, 0) != N || dim(&sm, 1) != K / 32 || sm.v.itemsize != 2 ||
        dim(&bo, 0) != B + 1 || dim(&c, 0) != B) {
        PyErr_Format(PyExc_ValueError,
                     "greedy_logits: w (%zd, K=%zd) needs norms (%zd,), sums (%zd, %zd) int16, "
                     "x (B, %zd), out (B, %zd), ban_off (B + 1,), candidates (B,); B = %zd",
                     N, K, N, N, K / 32, K, N, B);
        goto fail;
    }
    const int64_t *off = (const int64_t *)bo.v.buf;
    const Py_ssize_t n_ids = dim(&bi, 0);
    for (Py_ssize_t b = 0; b < B; b++)
        if (off[0] != 0 || off[b] > off[b + 1] || off[b + 1] > n_ids) {
            PyErr_SetString(PyExc_ValueError, "ban_off must rise from 0 to len(ban_ids)");
            goto fail;
        }
    if (overlap(&o, &x) || overlap(&o, &w) || overlap(&o, &n)) {
        PyErr_SetString(PyExc_ValueError, "out must not share memory with x, w or norms");
        goto fail;
    }
    {
        const int isa = g_isa, nt = g_threads;
        const size_t rb = (size_t)(dim(&w, 1) * w.v.itemsize);
        int rc = 0;
        Py_BEGIN_ALLOW_THREADS;
        rc = cpu_greedy_logits(isa, nt, (const uint8_t *)w.v.buf, rb, N, K,
                               (const float *)n.v.buf, (const int16_t *)sm.v.buf,
                               (const float *)x.v.buf, B, off,
                               (const int64_t *)bi.v.buf, (float *)o.v.buf, (int64_t *)c.v.buf);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    release(&w), release(&n), release(&sm), release(&x), release(&bo), release(&bi), release(&o), release(&c);
    Py_RETURN_NONE;
fail:
    release(&w), release(&n), release(&sm), release(&x), release(&bo), release(&bi), release(&o), release(&c);
    return NULL;
}
