/* kernels._cpu: the per-op decoder kernels (attention, rms_norm, rope, glu) and the
 * mixture router (moe_route). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "bind.h"

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

PyObject *py_attention_prefill(PyObject *self, PyObject *args, PyObject *kw) {
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

PyObject *py_attention_decode(PyObject *self, PyObject *args, PyObject *kw) {
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

PyObject *py_rms_norm(PyObject *self, PyObject *args, PyObject *kw) {
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

PyObject *py_rope(PyObject *self, PyObject *args, PyObject *kw) {
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


/* glu(gate_up, act, out): out (n, F) = act(gate_up[:, :F]) * gate_up[:, F:]; act 0 silu,
 * 1 gelu_tanh. The per-op path's activation, the same code as the fused step's. */
PyObject *py_glu(PyObject *self, PyObject *args, PyObject *kw) {
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
PyObject *py_moe_route(PyObject *self, PyObject *args) {
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
