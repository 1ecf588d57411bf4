/* kernels._cpu: Python bindings of the compiled CPU kernels (CPython C API and the
 * buffer protocol; no numpy headers). Every entry point checks its buffers' shapes,
 * types and contiguity, raises TypeError/ValueError on a mismatch, and releases the
 * GIL while it computes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decode.h"
#include "mixture.h"
#include "ops.h"
#include "prefill.h"
#include "quants.h"

#if defined(__linux__)
#include <sched.h>
#endif

static int g_isa = ISA_GENERIC;  /* in use */
static int g_best = ISA_GENERIC; /* the CPU's highest */
static int g_threads = 1;

static const char *isa_names[ISA_COUNT] = {"generic", "avx2", "avx512"};

static int usable_cores(void) {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
#endif
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ------------------------------------------------------------------ buffers */

typedef struct {
    Py_buffer v;
    int held;
} Buf;

static void release(Buf *b) {
    if (b->held) {
        PyBuffer_Release(&b->v);
        b->held = 0;
    }
}

static int is_f32(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != 4)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return f[0] == 'f' && f[1] == '\0';
}

static int is_i64(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != 8)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

enum { ANY = 0, F32 = 1, I64 = 2 };

/* A C-contiguous buffer of `ndim` dimensions (ndim 0: any) and element kind `kind`. */
static int get(PyObject *o, Buf *b, const char *name, int ndim, int kind, int writable) {
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
static int overlap(const Buf *a, const Buf *b) {
    const char *a0 = (const char *)a->v.buf, *b0 = (const char *)b->v.buf;
    return a->v.len > 0 && b->v.len > 0 && a0 < b0 + b->v.len && b0 < a0 + a->v.len;
}

static Py_ssize_t dim(const Buf *b, int i) { return b->v.shape ? b->v.shape[i] : b->v.len; }

/* Whether a buffer's elements are format `c` of `itemsize` bytes. */
static int is_format(const Py_buffer *v, char c, Py_ssize_t itemsize) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize != itemsize)
        return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    return f[0] == c && f[1] == '\0';
}

/* The KV type of a cache buffer (kv.h), or -1. */
static int kv_type(const Py_buffer *v, Py_ssize_t Dh) {
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
static int kv_of(const Buf *kc, const Buf *vc, Py_ssize_t Dh, kv_cache *kv) {
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
static Py_ssize_t row_values(int qt, Py_ssize_t row_bytes) {
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

/* ------------------------------------------------------------------ functions */

static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(isa_names[g_isa]);
}

static int isa_from_name(const char *s) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcmp(s, isa_names[i]) == 0)
            return i;
    return -1;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "set_isa takes 'generic', 'avx2' or 'avx512'");
        return NULL;
    }
    const int i = isa_from_name(s);
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "unknown ISA '%s' (generic, avx2, avx512)", s);
        return NULL;
    }
    if (i > g_best) {
        PyErr_Format(PyExc_ValueError, "this CPU does not run %s (best: %s)", s,
                     isa_names[g_best]);
        return NULL;
    }
    g_isa = i;
    kv_set_isa(i);
    Py_RETURN_NONE;
}

static PyObject *py_supported_isas(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *t = PyTuple_New(g_best + 1);
    if (t == NULL)
        return NULL;
    for (int i = 0; i <= g_best; i++) {
        PyObject *s = PyUnicode_FromString(isa_names[i]);
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static const char *act_names[] = {"float32", "bfloat16"};

static PyObject *py_activations(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(act_names[cpu_activations(g_isa)]);
}

static PyObject *py_supported_activations(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return cpu_bf16_supported() ? Py_BuildValue("(ss)", act_names[0], act_names[1])
                                : Py_BuildValue("(s)", act_names[0]);
}

static PyObject *py_set_activations(PyObject *self, PyObject *arg) {
    (void)self;
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "set_activations takes 'float32' or 'bfloat16'");
        return NULL;
    }
    const int act = strcmp(s, "float32") == 0 ? ACT_FLOAT32 : strcmp(s, "bfloat16") == 0 ? ACT_BFLOAT16 : -1;
    if (act < 0) {
        PyErr_Format(PyExc_ValueError, "unknown activations '%s' (float32, bfloat16)", s);
        return NULL;
    }
    if (cpu_set_activations(act) != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "bfloat16 activations need a CPU with AVX-512 BF16 (and a compiler "
                        "that knows it); this one runs float32 only");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_set_threads(PyObject *self, PyObject *arg) {
    (void)self;
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "set_threads needs 1..1024 threads, got %ld", n);
        return NULL;
    }
    g_threads = (int)n;
    Py_RETURN_NONE;
}

static PyObject *py_get_threads(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(g_threads);
}

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

static PyObject *py_linear(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return linear_call(args, kw, 0);
}

static PyObject *py_linear_prefill(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return linear_call(args, kw, 1);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args, PyObject *kw) {
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

/* ------------------------------------------------------------------ decode ops */

static int same_shape(const Buf *b, int ndim, const Py_ssize_t *want) {
    for (int i = 0; i < ndim; i++)
        if (b->v.shape[i] != want[i])
            return 0;
    return 1;
}

/* attention_prefill(q, k, v, kcache, vcache, layer, slot, start, scale, window, softcap,
 * out): a prompt chunk of one sequence, T rows at positions start .. start + T - 1 of
 * `slot`. Every row's k/v is written first, then row t attends causally over positions
 * 0 .. start + t (the last `window` of them with a window): cpu_attention_prefill, one job
 * per (KV head, block of rows) that reads each key and value once. MemoryError when a
 * job's scratch cannot be allocated. */
/* What both attention kernels take, checked against each other: q (n, H, Dh), k and v
 * (n, Hkv, Dh), kcache and vcache two (n_layer, n_slots, Hkv, n_ctx, Dh) arrays, out
 * (n, H * Dh); `layer` inside the cache, a number for scale, softcap >= 0. Returns 0, or
 * -1 with the error set; attn_release in both cases. */
typedef struct {
    Buf q, k, v, kc, vc, o;
    kv_cache kv;
} AttnBufs;

static void attn_release(AttnBufs *a) {
    release(&a->q);
    release(&a->k);
    release(&a->v);
    release(&a->kc);
    release(&a->vc);
    release(&a->o);
}

static int attn_get(PyObject *oq, PyObject *ok, PyObject *ov, PyObject *okc, PyObject *ovc,
                    PyObject *oo, Py_ssize_t layer, double scale, double softcap,
                    AttnBufs *a) {
    if (get(oq, &a->q, "q", 3, F32, 0) || get(ok, &a->k, "k", 3, F32, 0) ||
        get(ov, &a->v, "v", 3, F32, 0) || get(okc, &a->kc, "kcache", 5, ANY, 1) ||
        get(ovc, &a->vc, "vcache", 5, ANY, 1) || get(oo, &a->o, "out", 2, F32, 1))
        return -1;
    const Py_ssize_t n = dim(&a->q, 0), H = dim(&a->q, 1), Dh = dim(&a->q, 2);
    const Py_ssize_t n_layer = dim(&a->kc, 0), Hkv = dim(&a->kc, 2);
    if (kv_of(&a->kc, &a->vc, Dh, &a->kv))
        return -1;
    if (Hkv < 1 || H % Hkv != 0) {
        PyErr_Format(PyExc_ValueError,
                     "kcache (n_layer, n_slots, Hkv, n_ctx, Dh) must have Hkv dividing H=%zd "
                     "and Dh=%zd",
                     H, Dh);
        return -1;
    }
    const Py_ssize_t kv_shape[3] = {n, Hkv, Dh}, o_shape[2] = {n, H * Dh};
    if (!same_shape(&a->k, 3, kv_shape) || !same_shape(&a->v, 3, kv_shape)) {
        PyErr_Format(PyExc_ValueError, "k and v must be (rows, Hkv, Dh) = (%zd, %zd, %zd)", n,
                     Hkv, Dh);
        return -1;
    }
    if (!same_shape(&a->vc, 5, a->kc.v.shape)) {
        PyErr_SetString(PyExc_ValueError, "vcache must have kcache's shape");
        return -1;
    }
    if (a->kc.v.buf == a->vc.v.buf) {
        PyErr_SetString(PyExc_ValueError, "kcache and vcache must be different arrays");
        return -1;
    }
    if (!same_shape(&a->o, 2, o_shape)) {
        PyErr_Format(PyExc_ValueError, "out must be (rows, H * Dh) = (%zd, %zd)", n, H * Dh);
        return -1;
    }
    if (layer < 0 || layer >= n_layer) {
        PyErr_Format(PyExc_ValueError, "layer %zd out of range (n_layer=%zd)", layer, n_layer);
        return -1;
    }
    if (!(scale == scale) || !(softcap >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "scale must be a number and softcap >= 0");
        return -1;
    }
    return 0;
}

/* The optional `sinks` argument: None (NULL), or a float32 vector of H logits. Returns 0,
 * or -1 with the error set. */
static int sinks_get(PyObject *os, Buf *b, Py_ssize_t H, const float **sinks) {
    *sinks = NULL;
    if (os == NULL || os == Py_None)
        return 0;
    if (get(os, b, "sinks", 1, F32, 0))
        return -1;
    if (dim(b, 0) != H) {
        PyErr_Format(PyExc_ValueError, "sinks must have H=%zd entries", H);
        return -1;
    }
    *sinks = (const float *)b->v.buf;
    return 0;
}

static PyObject *py_attention_prefill(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"q",     "k",     "v",      "kcache",  "vcache",  "layer", "slot",
                             "start", "scale", "window", "softcap", "out", "sinks", NULL};
    PyObject *oq, *ok, *ov, *okc, *ovc, *oo, *osk = NULL;
    Py_ssize_t layer, slot, start, window;
    double scale, softcap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOnnndndO|O:attention_prefill", kwlist, &oq,
                                     &ok, &ov, &okc, &ovc, &layer, &slot, &start, &scale,
                                     &window, &softcap, &oo, &osk))
        return NULL;
    AttnBufs a = {0};
    Buf sk = {0};
    const float *sinks = NULL;
    PyObject *ret = NULL;
    if (attn_get(oq, ok, ov, okc, ovc, oo, layer, scale, softcap, &a) ||
        sinks_get(osk, &sk, dim(&a.q, 1), &sinks))
        goto done;
    const Py_ssize_t T = dim(&a.q, 0), H = dim(&a.q, 1), Dh = dim(&a.q, 2);
    const Py_ssize_t n_slots = dim(&a.kc, 1), Hkv = dim(&a.kc, 2), n_ctx = dim(&a.kc, 3);
    if (slot < 0 || slot >= n_slots || start < 0 || start + T > n_ctx) {
        PyErr_Format(PyExc_ValueError,
                     "slot %zd or positions %zd..%zd out of range (n_slots=%zd, n_ctx=%zd)",
                     slot, start, start + T, n_slots, n_ctx);
        goto done;
    }
    {
        const int nt = g_threads;
        int rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = cpu_attention_prefill(nt, (const float *)a.q.v.buf, (const float *)a.k.v.buf,
                                   (const float *)a.v.v.buf, &a.kv, layer, slot, start, T, H,
                                   Hkv, Dh, (float)scale, window, (float)softcap, sinks,
                                   (float *)a.o.v.buf);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    attn_release(&a);
    release(&sk);
    return ret;
}

static PyObject *py_attention_decode(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"q",         "k",     "v",      "kcache",  "vcache", "layer",
                             "slots",     "positions", "scale", "window", "softcap", "out",
                             "sinks",     NULL};
    PyObject *oq, *ok, *ov, *okc, *ovc, *os, *op, *oo, *osk = NULL;
    Py_ssize_t layer, window;
    double scale, softcap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOnOOdndO|O:attention_decode", kwlist, &oq,
                                     &ok, &ov, &okc, &ovc, &layer, &os, &op, &scale, &window,
                                     &softcap, &oo, &osk))
        return NULL;
    AttnBufs a = {0};
    Buf sl = {0}, po = {0}, sk = {0};
    const float *sinks = NULL;
    PyObject *ret = NULL;
    if (attn_get(oq, ok, ov, okc, ovc, oo, layer, scale, softcap, &a) ||
        get(os, &sl, "slots", 1, I64, 0) || get(op, &po, "positions", 1, I64, 0) ||
        sinks_get(osk, &sk, dim(&a.q, 1), &sinks))
        goto done;
    const Py_ssize_t B = dim(&a.q, 0), H = dim(&a.q, 1), Dh = dim(&a.q, 2);
    const Py_ssize_t n_slots = dim(&a.kc, 1), Hkv = dim(&a.kc, 2), n_ctx = dim(&a.kc, 3);
    if (dim(&sl, 0) != B || dim(&po, 0) != B) {
        PyErr_Format(PyExc_ValueError, "slots and positions must have B=%zd entries", B);
        goto done;
    }
    const int64_t *slots = (const int64_t *)sl.v.buf, *pos = (const int64_t *)po.v.buf;
    for (Py_ssize_t b = 0; b < B; b++) {
        if (slots[b] < 0 || slots[b] >= n_slots) {
            PyErr_Format(PyExc_ValueError, "slot %lld out of range (n_slots=%zd)",
                         (long long)slots[b], n_slots);
            goto done;
        }
        if (pos[b] < 0 || pos[b] >= n_ctx) {
            PyErr_Format(PyExc_ValueError, "position %lld out of range (n_ctx=%zd)",
                         (long long)pos[b], n_ctx);
            goto done;
        }
        /* One slot may hold several rows (a speculative verify pass: consecutive
         * positions), since every row's K/V is written before any row attends; the same
         * position twice would be two writes racing for one cache row. */
        for (Py_ssize_t c = 0; c < b; c++)
            if (slots[c] == slots[b] && pos[c] == pos[b]) {
                PyErr_Format(PyExc_ValueError,
                             "slot %lld position %lld appears twice in one batch",
                             (long long)slots[b], (long long)pos[b]);
                goto done;
            }
    }
    {
        const int nt = g_threads;
        Py_BEGIN_ALLOW_THREADS;
        cpu_attention_decode(nt, (const float *)a.q.v.buf, (const float *)a.k.v.buf,
                             (const float *)a.v.v.buf, &a.kv, layer, slots, pos, B, H, Hkv, Dh,
                             (float)scale, window, (float)softcap, sinks, (float *)a.o.v.buf);
        Py_END_ALLOW_THREADS;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    attn_release(&a);
    release(&sl);
    release(&po);
    release(&sk);
    return ret;
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "w", "eps", "out", NULL};
    PyObject *ox, *ow, *oo;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOdO:rms_norm", kwlist, &ox, &ow, &eps, &oo))
        return NULL;
    Buf x = {0}, w = {0}, o = {0};
    PyObject *ret = NULL;
    if (get(ox, &x, "x", 2, F32, 0) || get(ow, &w, "w", 1, F32, 0) ||
        get(oo, &o, "out", 2, F32, 1))
        goto done;
    const Py_ssize_t n = dim(&x, 0), D = dim(&x, 1);
    if (dim(&w, 0) != D || dim(&o, 0) != n || dim(&o, 1) != D) {
        PyErr_Format(PyExc_ValueError, "rms_norm: w must be (%zd,) and out (%zd, %zd)", D, n, D);
        goto done;
    }
    {
        const int nt = g_threads;
        Py_BEGIN_ALLOW_THREADS;
        cpu_rms_norm(nt, (const float *)x.v.buf, (const float *)w.v.buf, (float)eps, n, D,
                     (float *)o.v.buf);
        Py_END_ALLOW_THREADS;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&x);
    release(&w);
    release(&o);
    return ret;
}

static PyObject *py_rope(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "positions", "cos", "sin", "neox", NULL};
    PyObject *ox, *op, *oc, *os;
    int neox;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOp:rope", kwlist, &ox, &op, &oc, &os, &neox))
        return NULL;
    Buf x = {0}, p = {0}, c = {0}, s = {0};
    PyObject *ret = NULL;
    if (get(ox, &x, "x", 3, F32, 1) || get(op, &p, "positions", 1, I64, 0) ||
        get(oc, &c, "cos", 2, F32, 0) || get(os, &s, "sin", 2, F32, 0))
        goto done;
    const Py_ssize_t n = dim(&x, 0), H = dim(&x, 1), Dh = dim(&x, 2);
    const Py_ssize_t n_pos = dim(&c, 0);
    if (Dh % 2 != 0 || dim(&c, 1) != Dh / 2 || dim(&s, 0) != n_pos || dim(&s, 1) != Dh / 2) {
        PyErr_Format(PyExc_ValueError,
                     "rope: x's head size %zd must be even and cos/sin (n_pos, %zd), the same "
                     "shape",
                     Dh, Dh / 2);
        goto done;
    }
    if (dim(&p, 0) != n) {
        PyErr_Format(PyExc_ValueError, "rope: positions must have %zd entries", n);
        goto done;
    }
    const int64_t *pos = (const int64_t *)p.v.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pos[i] < 0 || pos[i] >= n_pos) {
            PyErr_Format(PyExc_ValueError, "rope: position %lld outside the table (n_pos=%zd)",
                         (long long)pos[i], n_pos);
            goto done;
        }
    {
        const int nt = g_threads;
        Py_BEGIN_ALLOW_THREADS;
        cpu_rope(nt, (float *)x.v.buf, pos, (const float *)c.v.buf, (const float *)s.v.buf, n, H,
                 Dh, neox);
        Py_END_ALLOW_THREADS;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&x);
    release(&p);
    release(&c);
    release(&s);
    return ret;
}

/* ------------------------------------------------------------------ fused decode step */

/* glu(gate_up, act, out): out (n, F) = act(gate_up[:, :F]) * gate_up[:, F:]; act 0 silu,
 * 1 gelu_tanh. The per-op path's activation, the same code as the fused step's. */
static PyObject *py_glu(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"gate_up", "act", "out", NULL};
    PyObject *og, *oo;
    int act;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiO:glu", kwlist, &og, &act, &oo))
        return NULL;
    Buf g = {0}, o = {0};
    PyObject *ret = NULL;
    if (get(og, &g, "gate_up", 2, F32, 0) || get(oo, &o, "out", 2, F32, 1))
        goto done;
    const Py_ssize_t n = dim(&g, 0), F = dim(&g, 1) / 2;
    if (act != ACT_SILU && act != ACT_GELU_TANH) {
        PyErr_Format(PyExc_ValueError, "glu: act must be 0 (silu) or 1 (gelu_tanh), got %d", act);
        goto done;
    }
    if (dim(&g, 1) % 2 != 0 || dim(&o, 0) != n || dim(&o, 1) != F || overlap(&g, &o)) {
        PyErr_Format(PyExc_ValueError,
                     "glu: gate_up must be (n, 2F) and out a separate (n, F) = (%zd, %zd)", n, F);
        goto done;
    }
    {
        Py_BEGIN_ALLOW_THREADS;
        cpu_glu((const float *)g.v.buf, n, F, act, (float *)o.v.buf);
        Py_END_ALLOW_THREADS;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&g);
    release(&o);
    return ret;
}

/* moe_route(logits, k, gating, norm_topk, scale, chosen, weights): each row of logits
 * (n, E) float32 routed to its k experts, best first: chosen (n, k) int64 and weights
 * (n, k) float32 (cpu_moe_route; gating 0 softmax, 1 sigmoid, 2 softmax_topk). The
 * routing of the per-op path and of the fused step alike. */
static PyObject *py_moe_route(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ol, *oc, *ow;
    Py_ssize_t k;
    int gating, norm_topk;
    double scale;
    if (!PyArg_ParseTuple(args, "OnipdOO:moe_route", &ol, &k, &gating, &norm_topk, &scale, &oc,
                          &ow))
        return NULL;
    Buf l = {0}, c = {0}, w = {0};
    PyObject *ret = NULL;
    if (get(ol, &l, "logits", 2, F32, 0) || get(oc, &c, "chosen", 2, I64, 1) ||
        get(ow, &w, "weights", 2, F32, 1))
        goto done;
    const Py_ssize_t n = dim(&l, 0), E = dim(&l, 1);
    if (k < 1 || k > E || gating < GATE_SOFTMAX || gating > GATE_SOFTMAX_TOPK ||
        dim(&c, 0) != n || dim(&c, 1) != k || dim(&w, 0) != n || dim(&w, 1) != k) {
        PyErr_Format(PyExc_ValueError,
                     "moe_route: need 1 <= k <= E = %zd, gating 0..2, chosen and weights (%zd, "
                     "k)",
                     E, n);
        goto done;
    }
    {
        int rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = cpu_moe_route((const float *)l.v.buf, n, E, k, gating, norm_topk, (float)scale,
                           (int64_t *)c.v.buf, (float *)w.v.buf);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&l);
    release(&c);
    release(&w);
    return ret;
}

/* A compiled plan: the layers' pointers, and the Python objects that own that memory
 * (held until the plan is dropped). */
typedef struct {
    dec_model model;
    dec_moe *moes; /* n_layer, where a layer's `moe` points (zeroed for dense layers) */
    PyObject *keep;
} DecodePlan;

static void moes_free(dec_moe *moes, Py_ssize_t n) {
    if (moes == NULL)
        return;
    for (Py_ssize_t i = 0; i < n; i++) {
        free(moes[i].gate_up);
        free(moes[i].down);
    }
    free(moes);
}

static const char *PLAN_NAME = "kernels._cpu.decode_plan";

static void plan_free(PyObject *capsule) {
    DecodePlan *p = PyCapsule_GetPointer(capsule, PLAN_NAME);
    if (p == NULL)
        return;
    moes_free(p->moes, p->model.n_layer);
    free(p->model.layers);
    Py_XDECREF(p->keep);
    free(p);
}

/* The pointer of a float32 vector of n values (None -> NULL when optional). */
static int plan_vector(PyObject *o, const char *name, Py_ssize_t n, int optional,
                       const float **out) {
    *out = NULL;
    if (o == Py_None && optional)
        return 0;
    Buf b = {0};
    if (get(o, &b, name, 1, F32, 0))
        return -1;
    if (dim(&b, 0) != n) {
        PyErr_Format(PyExc_ValueError, "decode_plan: %s must have %zd values, got %zd", name, n,
                     dim(&b, 0));
        release(&b);
        return -1;
    }
    *out = (const float *)b.v.buf;
    release(&b); /* the plan's `keep` list holds the array */
    return 0;
}

/* A matrix from a list of (qtype, blocks (rows, row_bytes), col0) parts that tile its N
 * output rows, each row holding K values. */
static int plan_matrix(PyObject *o, const char *name, Py_ssize_t N, Py_ssize_t K,
                       dec_matrix *m) {
    PyObject *seq = PySequence_Fast(o, "decode_plan: a matrix must be a list of parts");
    if (seq == NULL)
        return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (n < 1 || n > DECODE_MAX_PARTS) {
        PyErr_Format(PyExc_ValueError, "decode_plan: %s must have 1..%d parts, got %zd", name,
                     DECODE_MAX_PARTS, n);
        goto done;
    }
    m->n_parts = (int)n;
    m->N = N;
    m->K = K;
    Py_ssize_t next = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int qt;
        PyObject *ow;
        Py_ssize_t col0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iOn", &qt, &ow, &col0))
            goto done;
        Buf w = {0};
        if (get(ow, &w, name, 2, ANY, 0))
            goto done;
        const Py_ssize_t rows = dim(&w, 0), row_bytes = dim(&w, 1) * w.v.itemsize;
        const Py_ssize_t kw = row_values(qt, row_bytes);
        m->part[i] = (dec_part){qt, (const uint8_t *)w.v.buf, (size_t)row_bytes, rows, col0};
        release(&w);
        if (kw < 0)
            goto done;
        if (kw != K || col0 != next || rows < 1) {
            PyErr_Format(PyExc_ValueError,
                         "decode_plan: %s part %zd must hold rows %zd.. of K=%zd values, got "
                         "col0=%zd, %zd rows of %zd",
                         name, i, next, K, col0, rows, kw);
            goto done;
        }
        next += rows;
    }
    if (next != N) {
        PyErr_Format(PyExc_ValueError, "decode_plan: %s parts hold %zd rows, need %zd", name,
                     next, N);
        goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* A list of E matrices (each a list of parts) of N x K into a fresh array. */
static int plan_matrices(PyObject *o, const char *name, Py_ssize_t E, Py_ssize_t N,
                         Py_ssize_t K, dec_matrix **out) {
    PyObject *seq = PySequence_Fast(o, "decode_plan: experts must be a list of matrices");
    if (seq == NULL)
        return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(seq) != E) {
        PyErr_Format(PyExc_ValueError, "decode_plan: %s must hold %zd experts", name, E);
        goto done;
    }
    *out = calloc((size_t)E, sizeof(dec_matrix));
    if (*out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t e = 0; e < E; e++)
        if (plan_matrix(PySequence_Fast_GET_ITEM(seq, e), name, N, K, &(*out)[e]))
            goto done;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* A layer's mixture: (E, k, F, gating, norm_topk, scale, router, router_bias, gate_ups,
 * downs, Fs, shared_gate_up, shared_down); gating 0 softmax, 1 sigmoid, 2 softmax_topk
 * (mixture.h); the shared expert's matrices None where Fs is 0. */
static int plan_moe(PyObject *o, Py_ssize_t D, dec_moe *m) {
    Py_ssize_t E, k, F, Fs;
    int gating, norm_topk;
    double scale;
    PyObject *orouter, *obias, *ogus, *odowns, *osgu, *osdown;
    if (!PyArg_ParseTuple(o, "nnnipdOOOOnOO:decode_plan moe", &E, &k, &F, &gating, &norm_topk,
                          &scale, &orouter, &obias, &ogus, &odowns, &Fs, &osgu, &osdown))
        return -1;
    if (E < 1 || k < 1 || k > E || F < 1 || Fs < 0 || gating < GATE_SOFTMAX ||
        gating > GATE_SOFTMAX_TOPK) {
        PyErr_SetString(PyExc_ValueError, "decode_plan: bad mixture dims");
        return -1;
    }
    *m = (dec_moe){E, k, F, gating, norm_topk, (float)scale};
    m->Fs = Fs;
    if (plan_matrix(orouter, "router", E, D, &m->router) ||
        plan_vector(obias, "router_bias", E, 1, &m->router_bias) ||
        plan_matrices(ogus, "expert gate_up", E, 2 * F, D, &m->gate_up) ||
        plan_matrices(odowns, "expert down", E, D, F, &m->down))
        return -1;
    if (Fs > 0 && (plan_matrix(osgu, "shared gate_up", 2 * Fs, D, &m->shared_gate_up) ||
                   plan_matrix(osdown, "shared down", D, Fs, &m->shared_down)))
        return -1;
    return 0;
}

/* decode_plan(dims, layers, keep) -> plan. dims: (D, H, Hkv, Dh, F, eps, scale, softcap,
 * neox, act). layers: a tuple per layer, (attn_norm, ffn_norm, qkv_bias, q_norm, k_norm,
 * post_attention_norm, post_ffw_norm, cos, sin, window, qkv, out, gate_up, down, moe), the
 * optional vectors None when absent, each matrix a list of (qtype, blocks, col0); moe
 * None, or a mixture (plan_moe) with gate_up and down None. keep:
 * any object holding every array the layers name (the plan keeps a reference). */
static PyObject *py_decode_plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *odims, *olayers, *keep;
    if (!PyArg_ParseTuple(args, "OOO:decode_plan", &odims, &olayers, &keep))
        return NULL;
    dec_model mdl = {0};
    Py_ssize_t D, H, Hkv, Dh, F;
    double eps, scale, softcap;
    int neox, act;
    if (!PyArg_ParseTuple(odims, "nnnnndddpi", &D, &H, &Hkv, &Dh, &F, &eps, &scale, &softcap,
                          &neox, &act))
        return NULL;
    if (D < 1 || H < 1 || Hkv < 1 || H % Hkv || Dh < 2 || Dh % 2 || F < 1 || !(softcap >= 0) ||
        (act != ACT_SILU && act != ACT_GELU_TANH)) {
        PyErr_SetString(PyExc_ValueError, "decode_plan: bad dims");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(olayers, "decode_plan: layers must be a list");
    if (seq == NULL)
        return NULL;
    const Py_ssize_t n_layer = PySequence_Fast_GET_SIZE(seq);
    mdl = (dec_model){(int)n_layer, NULL, D, H, Hkv, Dh, F, (float)eps, (float)scale,
                      (float)softcap, neox, act};
    mdl.layers = calloc(n_layer > 0 ? (size_t)n_layer : 1, sizeof(dec_layer));
    dec_moe *moes = calloc(n_layer > 0 ? (size_t)n_layer : 1, sizeof(dec_moe));
    if (mdl.layers == NULL || moes == NULL) {
        Py_DECREF(seq);
        free(mdl.layers);
        free(moes);
        return PyErr_NoMemory();
    }
    const Py_ssize_t Dq = H * Dh, Nqkv = Dq + 2 * Hkv * Dh;
    for (Py_ssize_t li = 0; li < n_layer; li++) {
        dec_layer *L = &mdl.layers[li];
        PyObject *an, *fn, *bias, *qn, *kn, *pan, *pfn, *oc, *os, *oqkv, *oout, *ogu, *odown;
        PyObject *omoe;
        Py_ssize_t window;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, li), "OOOOOOOOOnOOOOO", &an, &fn,
                              &bias, &qn, &kn, &pan, &pfn, &oc, &os, &window, &oqkv, &oout, &ogu,
                              &odown, &omoe))
            goto fail;
        if (plan_vector(an, "attn_norm", D, 0, &L->attn_norm) ||
            plan_vector(fn, "ffn_norm", D, 0, &L->ffn_norm) ||
            plan_vector(bias, "qkv_bias", Nqkv, 1, &L->qkv_bias) ||
            plan_vector(qn, "q_norm", Dh, 1, &L->q_norm) ||
            plan_vector(kn, "k_norm", Dh, 1, &L->k_norm) ||
            plan_vector(pan, "post_attention_norm", D, 1, &L->post_attention_norm) ||
            plan_vector(pfn, "post_ffw_norm", D, 1, &L->post_ffw_norm))
            goto fail;
        if ((L->q_norm == NULL) != (L->k_norm == NULL)) {
            PyErr_SetString(PyExc_ValueError, "decode_plan: q_norm and k_norm go together");
            goto fail;
        }
        Buf c = {0}, s = {0};
        if (get(oc, &c, "cos", 2, F32, 0) || get(os, &s, "sin", 2, F32, 0)) {
            release(&c);
            goto fail;
        }
        const int table_ok = dim(&c, 1) == Dh / 2 && same_shape(&s, 2, c.v.shape);
        L->cos = (const float *)c.v.buf;
        L->sin = (const float *)s.v.buf;
        L->n_pos = dim(&c, 0);
        release(&c);
        release(&s);
        if (!table_ok) {
            PyErr_Format(PyExc_ValueError, "decode_plan: cos/sin must be (n_pos, %zd)", Dh / 2);
            goto fail;
        }
        L->window = window;
        if (plan_matrix(oqkv, "qkv", Nqkv, D, &L->qkv) || plan_matrix(oout, "out", D, Dq, &L->out))
            goto fail;
        if (omoe != Py_None) {
            if (plan_moe(omoe, D, &moes[li]))
                goto fail;
            L->moe = &moes[li];
        } else if (plan_matrix(ogu, "gate_up", 2 * F, D, &L->gate_up) ||
                   plan_matrix(odown, "down", D, F, &L->down))
            goto fail;
    }
    Py_DECREF(seq);
    DecodePlan *plan = malloc(sizeof(DecodePlan));
    if (plan == NULL) {
        moes_free(moes, n_layer);
        free(mdl.layers);
        return PyErr_NoMemory();
    }
    plan->model = mdl;
    plan->moes = moes;
    plan->keep = keep;
    Py_INCREF(keep);
    PyObject *cap = PyCapsule_New(plan, PLAN_NAME, plan_free);
    if (cap == NULL) {
        Py_DECREF(keep);
        moes_free(moes, n_layer);
        free(mdl.layers);
        free(plan);
    }
    return cap;
fail:
    Py_DECREF(seq);
    moes_free(moes, n_layer);
    free(mdl.layers);
    return NULL;
}

/* decode_layers(plan, x, slots, positions, kcache, vcache): x (B, D) in place through
 * every layer of the plan (cpu_decode_layers). */
static PyObject *py_decode_layers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ocap, *ox, *os, *op, *okc, *ovc;
    if (!PyArg_ParseTuple(args, "OOOOOO:decode_layers", &ocap, &ox, &os, &op, &okc, &ovc))
        return NULL;
    DecodePlan *plan = PyCapsule_GetPointer(ocap, PLAN_NAME);
    if (plan == NULL)
        return NULL;
    const dec_model *m = &plan->model;
    Buf x = {0}, s = {0}, p = {0}, kc = {0}, vc = {0};
    PyObject *ret = NULL;
    if (get(ox, &x, "x", 2, F32, 1) || get(os, &s, "slots", 1, I64, 0) ||
        get(op, &p, "positions", 1, I64, 0) || get(okc, &kc, "kcache", 5, ANY, 1) ||
        get(ovc, &vc, "vcache", 5, ANY, 1))
        goto done;
    kv_cache kv;
    if (kv_of(&kc, &vc, m->Dh, &kv))
        goto done;
    const Py_ssize_t B = dim(&x, 0);
    if (dim(&x, 1) != m->D || dim(&s, 0) != B || dim(&p, 0) != B) {
        PyErr_Format(PyExc_ValueError,
                     "decode_layers: x must be (B, %lld) and slots, positions (B,)",
                     (long long)m->D);
        goto done;
    }
    const Py_ssize_t n_slots = dim(&kc, 1), n_ctx = dim(&kc, 3);
    if (dim(&kc, 0) < m->n_layer || dim(&kc, 2) != m->Hkv ||
        !same_shape(&vc, 5, kc.v.shape) || kc.v.buf == vc.v.buf || overlap(&x, &kc) ||
        overlap(&x, &vc)) {
        PyErr_SetString(PyExc_ValueError,
                        "decode_layers: kcache and vcache must be two separate (n_layer, n_slots, "
                        "Hkv, n_ctx, Dh) arrays of the plan's shape");
        goto done;
    }
    const int64_t *sl = (const int64_t *)s.v.buf, *pos = (const int64_t *)p.v.buf;
    for (Py_ssize_t b = 0; b < B; b++) {
        int64_t n_pos = n_ctx;
        for (int li = 0; li < m->n_layer; li++)
            if (m->layers[li].n_pos < n_pos)
                n_pos = m->layers[li].n_pos;
        if (sl[b] < 0 || sl[b] >= n_slots || pos[b] < 0 || pos[b] >= n_pos) {
            PyErr_Format(PyExc_ValueError,
                         "decode_layers: row %zd at slot %lld, position %lld: outside the cache "
                         "(%zd slots) or the window (%lld positions)",
                         b, (long long)sl[b], (long long)pos[b], n_slots, (long long)n_pos);
            goto done;
        }
    }
    {
        const int isa = g_isa, nt = g_threads;
        int rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = cpu_decode_layers(isa, nt, m, (float *)x.v.buf, B, sl, pos, &kv);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&x);
    release(&s);
    release(&p);
    release(&kc);
    release(&vc);
    return ret;
}

/* moe_ffn(plan, layer, h, out): the plan's mixture of `layer` (cpu_moe_ffn) for the rows
 * h (n, D) float32 into out (n, D): each row's bits those of the fused decode step, alone
 * or with any others (a prefill's many rows, several prompts' packed). */
static PyObject *py_moe_ffn(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ocap, *oh, *oo;
    int layer;
    if (!PyArg_ParseTuple(args, "OiOO:moe_ffn", &ocap, &layer, &oh, &oo))
        return NULL;
    DecodePlan *plan = PyCapsule_GetPointer(ocap, PLAN_NAME);
    if (plan == NULL)
        return NULL;
    const dec_model *m = &plan->model;
    if (layer < 0 || layer >= m->n_layer || m->layers[layer].moe == NULL) {
        PyErr_Format(PyExc_ValueError, "moe_ffn: layer %d of the plan has no mixture", layer);
        return NULL;
    }
    Buf h = {0}, o = {0};
    PyObject *ret = NULL;
    if (get(oh, &h, "h", 2, F32, 0) || get(oo, &o, "out", 2, F32, 1))
        goto done;
    const Py_ssize_t n = dim(&h, 0);
    if (dim(&h, 1) != m->D || dim(&o, 0) != n || dim(&o, 1) != m->D || overlap(&h, &o)) {
        PyErr_Format(PyExc_ValueError, "moe_ffn: h and out must be two separate (n, %lld) arrays",
                     (long long)m->D);
        goto done;
    }
    if (n > 0) {
        const int isa = g_isa, nt = g_threads;
        int rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = cpu_moe_ffn(isa, nt, m->layers[layer].moe, m->act, (const float *)h.v.buf, n, m->D,
                         (float *)o.v.buf);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&h);
    release(&o);
    return ret;
}

/* ------------------------------------------------------------------ tokenizer helper */

/* spm_pairs(tokens, normal, vocab) -> (owners, lefts, rights), three bytes objects of
 * int64: every split of a normal piece tokens[i] (normal[i] true, len >= 2) into two
 * vocabulary pieces, as (i, vocab[left], vocab[right]), pieces in order, cuts in order.
 * The loop of inference/engine/text/tokenizer.py's _spm_merges, ~10x faster (a 262k-piece
 * vocabulary has ~1.2M cuts: 2+ s in Python). */
static PyObject *py_spm_pairs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tokens, *normal, *vocab;
    if (!PyArg_ParseTuple(args, "O!O!O!:spm_pairs", &PyList_Type, &tokens, &PyList_Type, &normal,
                          &PyDict_Type, &vocab))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(tokens);
    if (PyList_GET_SIZE(normal) != n) {
        PyErr_SetString(PyExc_ValueError, "spm_pairs: tokens and normal differ in length");
        return NULL;
    }
    Py_ssize_t cap = 1024, len = 0;
    int64_t *buf = malloc((size_t)cap * 3 * sizeof(int64_t));
    if (buf == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyList_GET_ITEM(tokens, i);
        const int is_normal = PyObject_IsTrue(PyList_GET_ITEM(normal, i));
        if (is_normal < 0)
            goto fail;
        if (!is_normal || !PyUnicode_Check(piece))
            continue;
        const Py_ssize_t L = PyUnicode_GET_LENGTH(piece);
        for (Py_ssize_t cut = 1; cut < L; cut++) {
            PyObject *left = PyUnicode_Substring(piece, 0, cut);
            if (left == NULL)
                goto fail;
            PyObject *lid = PyDict_GetItemWithError(vocab, left); /* borrowed */
            Py_DECREF(left);
            if (lid == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                continue;
            }
            PyObject *right = PyUnicode_Substring(piece, cut, L);
            if (right == NULL)
                goto fail;
            PyObject *rid = PyDict_GetItemWithError(vocab, right);
            Py_DECREF(right);
            if (rid == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                continue;
            }
            const long long l = PyLong_AsLongLong(lid), r = PyLong_AsLongLong(rid);
            if ((l == -1 || r == -1) && PyErr_Occurred())
                goto fail;
            if (len == cap) {
                cap *= 2;
                int64_t *grown = realloc(buf, (size_t)cap * 3 * sizeof(int64_t));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                buf = grown;
            }
            buf[3 * len] = (int64_t)i;
            buf[3 * len + 1] = (int64_t)l;
            buf[3 * len + 2] = (int64_t)r;
            len++;
        }
    }
    {
        /* three columns out of the interleaved rows */
        PyObject *cols[3] = {NULL, NULL, NULL};
        for (int c = 0; c < 3; c++) {
            cols[c] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(len * sizeof(int64_t)));
            if (cols[c] == NULL) {
                for (int d = 0; d < c; d++)
                    Py_DECREF(cols[d]);
                goto fail;
            }
            int64_t *dst = (int64_t *)PyBytes_AS_STRING(cols[c]);
            for (Py_ssize_t k = 0; k < len; k++)
                dst[k] = buf[3 * k + c];
        }
        free(buf);
        PyObject *ret = PyTuple_Pack(3, cols[0], cols[1], cols[2]);
        for (int c = 0; c < 3; c++)
            Py_DECREF(cols[c]);
        return ret;
    }
fail:
    free(buf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"isa", py_isa, METH_NOARGS, "isa() -> 'avx512' | 'avx2' | 'generic': the kernels in use."},
    {"set_isa", py_set_isa, METH_O,
     "set_isa(name): use a lower ISA's kernels (tests); ValueError if the CPU lacks it."},
    {"supported_isas", py_supported_isas, METH_NOARGS,
     "supported_isas() -> tuple of the ISA levels this CPU runs, lowest first."},
    {"activations", py_activations, METH_NOARGS,
     "activations() -> 'float32' | 'bfloat16': what linear's products round x and W to\n"
     "(bfloat16 only while set and the AVX-512 kernels are in use)."},
    {"supported_activations", py_supported_activations, METH_NOARGS,
     "supported_activations() -> ('float32',) or ('float32', 'bfloat16') on AVX-512 BF16."},
    {"set_activations", py_set_activations, METH_O,
     "set_activations(name): 'float32' (default) or 'bfloat16' (opt-in; ValueError where\n"
     "the CPU lacks AVX-512 BF16). linear (decode) only: linear_prefill stays float32."},
    {"set_threads", py_set_threads, METH_O, "set_threads(n): threads per call (the caller and n - 1 pool workers)."},
    {"get_threads", py_get_threads, METH_NOARGS, "get_threads() -> threads per call."},
    {"linear", (PyCFunction)(void (*)(void))py_linear, METH_VARARGS | METH_KEYWORDS,
     "linear(qtype, w, x, out, col0=0): out[b, col0 + r] = sum_k W[r, k] * x[b, k].\n"
     "w: (N, row_bytes) GGUF blocks (float32/uint16 values for F32/F16/BF16); x: (B, K)\n"
     "float32; out: (B, ldo) float32. Row (b, r) is bitwise independent of B, the other\n"
     "rows and the thread count."},
    {"linear_prefill", (PyCFunction)(void (*)(void))py_linear_prefill,
     METH_VARARGS | METH_KEYWORDS,
     "linear_prefill(qtype, w, x, out, col0=0): linear's product, arguments and checks, for\n"
     "many rows of x (a prompt chunk): tiles of w's rows dequantised into a cache-sized\n"
     "buffer, then a blocked kernel over every row of x. Within float32 rounding of\n"
     "linear's; the bits do not depend on the thread count, the other rows or (B > 4) B."},
    {"dequantize", (PyCFunction)(void (*)(void))py_dequantize, METH_VARARGS | METH_KEYWORDS,
     "dequantize(qtype, w, out): w (R, row_bytes) -> out (R, K) float32, bitwise as gguf."},
    {"attention_prefill", (PyCFunction)(void (*)(void))py_attention_prefill,
     METH_VARARGS | METH_KEYWORDS,
     "attention_prefill(q, k, v, kcache, vcache, layer, slot, start, scale, window, softcap, "
     "out, sinks=None): one sequence's prompt chunk, causal, written into the KV cache first."},
    {"attention_decode", (PyCFunction)(void (*)(void))py_attention_decode,
     METH_VARARGS | METH_KEYWORDS,
     "attention_decode(q, k, v, kcache, vcache, layer, slots, positions, scale, window,\n"
     "softcap, out, sinks=None): write each row's k/v into its slot at its position, then\n"
     "attend (GQA, sliding window if window > 0, soft-cap if softcap > 0, a sink logit per\n"
     "head in each softmax's denominator if sinks (H,)). q (B, H, Dh), k/v (B, Hkv, Dh),\n"
     "caches (n_layer, n_slots, Hkv, n_ctx, Dh), slots/positions int64 (B,), out\n"
     "(B, H * Dh); all float32 but slots/positions."},
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_VARARGS | METH_KEYWORDS,
     "rms_norm(x, w, eps, out): out = x / sqrt(mean(x * x) + eps) * w over the last axis."},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_VARARGS | METH_KEYWORDS,
     "rope(x, positions, cos, sin, neox): rotate x (n, H, Dh) in place; cos/sin\n"
     "(n_pos, Dh / 2); neox: halves (qwen) instead of adjacent pairs (llama)."},
    {"glu", (PyCFunction)(void (*)(void))py_glu, METH_VARARGS | METH_KEYWORDS,
     "glu(gate_up, act, out): out (n, F) = act(gate_up[:, :F]) * gate_up[:, F:];\n"
     "act 0 silu, 1 gelu_tanh."},
    {"moe_route", py_moe_route, METH_VARARGS,
     "moe_route(logits, k, gating, norm_topk, scale, chosen, weights): each row's k experts\n"
     "and their weights (kernels/cpu/mixture.h), into chosen (n, k) int64, weights (n, k)."},
    {"decode_plan", py_decode_plan, METH_VARARGS,
     "decode_plan(dims, layers, keep) -> plan: a decoder stack's weights, checked once, for\n"
     "decode_layers (see kernels/cpu_backend.py's decode_stack for the shapes)."},
    {"decode_layers", py_decode_layers, METH_VARARGS,
     "decode_layers(plan, x, slots, positions, kcache, vcache): one decode step of every\n"
     "layer for x (B, D) in place, bitwise the per-op kernels' result."},
    {"moe_ffn", py_moe_ffn, METH_VARARGS,
     "moe_ffn(plan, layer, h, out): the plan's mixture of that layer for rows h (n, D) into\n"
     "out (n, D), each row the bits the fused decode step gives it (kernels/cpu/mixture.h)."},
    {"spm_pairs", py_spm_pairs, METH_VARARGS,
     "spm_pairs(tokens, normal, vocab) -> (owners, lefts, rights): int64 bytes of every split\n"
     "of a normal piece into two vocabulary pieces (SentencePiece merges, tokenizer.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu",
                                    "Compiled CPU kernels over GGUF blocks (see kernels/cpu/).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu(void) {
    f16_table_init();
    g_best = cpu_best_isa();
    g_isa = g_best;
    const char *env = getenv("PANTHEON_CPU_ISA");
    if (env && *env) {
        const int i = isa_from_name(env);
        if (i < 0) {
            PyErr_Format(PyExc_ImportError,
                         "PANTHEON_CPU_ISA=%s: use generic, avx2 or avx512", env);
            return NULL;
        }
        if (i < g_isa)
            g_isa = i; /* only ever lower: a higher level than the CPU runs would crash */
    }
    kv_set_isa(g_isa);
    g_threads = usable_cores();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *q = PyDict_New();
    if (q == NULL || PyModule_AddObject(m, "QTYPES", q) != 0) {
        Py_XDECREF(q);
        Py_DECREF(m);
        return NULL;
    }
    static const int qts[] = {QT_F32,  QT_F16,  QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                              QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_BF16, QT_MXFP4};
    for (size_t i = 0; i < sizeof(qts) / sizeof(qts[0]); i++) {
        PyObject *v = PyLong_FromLong(qts[i]);
        if (v == NULL || PyDict_SetItemString(q, qt_name(qts[i]), v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(m);
            return NULL;
        }
        Py_DECREF(v);
    }
    return m;
}
