/* kernels._cpu: the fused decode step (decode_plan, decode_layers) and the compiled mixture
 * for a prefill's rows (moe_ffn). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "bind.h"

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
PyObject *py_decode_plan(PyObject *self, PyObject *args) {
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
PyObject *py_decode_layers(PyObject *self, PyObject *args) {
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
PyObject *py_moe_ffn(PyObject *self, PyObject *args) {
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
