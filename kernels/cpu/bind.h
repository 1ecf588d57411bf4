/* What the binding files of kernels._cpu share (_cpu.c holds the module, its settings and
 * its method table; bind_*.c one family of entry points each): the buffer checks every
 * entry point makes, the ISA and thread count in use, and the entry points themselves. */
#ifndef PANTHEON_BIND_H
#define PANTHEON_BIND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "decode.h"
#include "mixture.h"
#include "ops.h"
#include "prefill.h"
#include "quants.h"

extern int g_isa;     /* the ISA whose kernels are in use (_cpu.c) */
extern int g_threads; /* threads per call */

/* ------------------------------------------------------------------ buffers */

typedef struct {
    Py_buffer v;
    int held;
} Buf;

static inline void release(Buf *b) {
    if (b->held) {
        PyBuffer_Release(&b->v);
        b->held = 0;
    }
}

static inline int is_f32(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != 4)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return f[0] == 'f' && f[1] == '\0';
}

static inline int is_i64(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != 8)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

enum { ANY = 0, F32 = 1, I64 = 2 };

/* A C-contiguous buffer of `ndim` dimensions (ndim 0: any) and element kind `kind`. */
static inline int get(PyObject *o, Buf *b, const char *name, int ndim, int kind, int writable) {
    b->held = 0;
    if (PyObject_GetBuffer(o, &b->v, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an array (buffer), not %.100s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    b->held = 1;
    if (writable && b->v.readonly) {
        PyErr_Format(PyExc_ValueError, "%s must be writable", name);
        goto fail;
    }
    if (ndim && b->v.ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, got %d-D", name, ndim, b->v.ndim);
        goto fail;
    }
    if (!PyBuffer_IsContiguous(&b->v, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous", name);
        goto fail;
    }
    if (kind == F32 && !is_f32(&b->v)) {
        PyErr_Format(PyExc_TypeError, "%s must be float32 (format 'f'), got format '%s'", name,
                     b->v.format ? b->v.format : "B");
        goto fail;
    }
    if (kind == I64 && !is_i64(&b->v)) {
        PyErr_Format(PyExc_TypeError, "%s must be int64, got format '%s'", name,
                     b->v.format ? b->v.format : "B");
        goto fail;
    }
    return 0;
fail:
    release(b);
    return -1;
}

/* Whether two buffers share any byte (an output must not alias an input). */
static inline int overlap(const Buf *a, const Buf *b) {
    const char *a0 = (const char *)a->v.buf, *b0 = (const char *)b->v.buf;
    return a->v.len > 0 && b->v.len > 0 && a0 < b0 + b->v.len && b0 < a0 + a->v.len;
}

static inline Py_ssize_t dim(const Buf *b, int i) { return b->v.shape ? b->v.shape[i] : b->v.len; }

/* Whether a buffer's elements are format `c` of `itemsize` bytes. */
static inline int is_format(const Py_buffer *v, char c, Py_ssize_t itemsize) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != itemsize)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return f[0] == c && f[1] == '\0';
}

/* The KV type of a cache buffer (kv.h), or -1. */
static inline int kv_type(const Py_buffer *v, Py_ssize_t Dh) {
    if (is_f32(v))
        return KV_F32;
    if (is_format(v, 'e', 2))
        return KV_F16;
    if (is_format(v, 'B', 1) && Dh % KV_QK == 0)
        return KV_Q8_0;
    return -1;
}

/* A KV cache (kv.h) from its two 5-D buffers (n_layer, n_slots, Hkv, n_ctx, row) holding
 * heads of Dh values: float32 or float16 rows of Dh, or uint8 rows of Dh / 32 Q8_0 blocks.
 * Returns 0, or -1 with the error set. */
static inline int kv_of(const Buf *kc, const Buf *vc, Py_ssize_t Dh, kv_cache *kv) {
    const int type = kv_type(&kc->v, Dh);
    const int64_t row = type < 0 ? -1 : kv_row_bytes(type, Dh) / (int64_t)kc->v.itemsize;
    if (type < 0 || dim(kc, 4) != row) {
        PyErr_Format(PyExc_ValueError,
                     "kcache must be (n_layer, n_slots, Hkv, n_ctx, row) float32 or float16 "
                     "rows of Dh=%zd, or uint8 rows of Dh / 32 Q8_0 blocks (format '%s', "
                     "last dimension %zd)",
                     Dh, kc->v.format ? kc->v.format : "B", dim(kc, 4));
        return -1;
    }
    if (kv_type(&vc->v, Dh) != type) {
        PyErr_SetString(PyExc_ValueError, "vcache must have kcache's type");
        return -1;
    }
    *kv = (kv_cache){kc->v.buf, vc->v.buf, type, dim(kc, 1), dim(kc, 3)};
    return 0;
}

/* The number of values K of a row of `row_bytes` bytes of type qt, or -1 (error set). */
static inline Py_ssize_t row_values(int qt, Py_ssize_t row_bytes) {
    if (qt_name(qt) == NULL) {
        PyErr_Format(PyExc_ValueError, "qtype %d has no compiled kernel", qt);
        return -1;
    }
    const int bs = qt_block(qt), ts = qt_tsize(qt);
    if (row_bytes % ts != 0) {
        PyErr_Format(PyExc_ValueError,
                     "w has %zd bytes per row, not a whole number of %s blocks (%d bytes each)",
                     row_bytes, qt_name(qt), ts);
        return -1;
    }
    return row_bytes / ts * bs;
}

static inline int same_shape(const Buf *b, int ndim, const Py_ssize_t *want) {
    for (int i = 0; i < ndim; i++)
        if (b->v.shape[i] != want[i])
            return 0;
    return 1;
}

/* ------------------------------------------------------------------ entry points */

PyObject *py_linear(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_linear_prefill(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_dequantize(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_attention_prefill(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_attention_decode(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_rms_norm(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_rope(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_glu(PyObject *self, PyObject *args, PyObject *kw);
PyObject *py_moe_route(PyObject *self, PyObject *args);
PyObject *py_decode_plan(PyObject *self, PyObject *args);
PyObject *py_decode_layers(PyObject *self, PyObject *args);
PyObject *py_moe_ffn(PyObject *self, PyObject *args);
PyObject *py_spm_pairs(PyObject *self, PyObject *args);
PyObject *py_greedy_fast(PyObject *self, PyObject *noargs);
PyObject *py_greedy_prep(PyObject *self, PyObject *args);
PyObject *py_greedy_logits(PyObject *self, PyObject *args);

#endif
