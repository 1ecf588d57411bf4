/* kernels._cpu: Python bindings of the compiled CPU kernels (CPython C API and the
 * buffer protocol; no numpy headers). Every entry point checks its buffers' shapes,
 * types and contiguity, raises TypeError/ValueError on a mismatch, and releases the
 * GIL while it computes. This file: the module, its settings (ISA, activations,
 * threads) and the method table; the entry points are in bind_*.c (bind.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bind.h"

#if defined(__linux__)
#include <sched.h>
#endif

int g_isa = ISA_GENERIC;  /* in use */
static int g_best = ISA_GENERIC; /* the CPU's highest */
int g_threads = 1;

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
    {"greedy_fast", py_greedy_fast, METH_NOARGS,
     "greedy_fast() -> whether greedy_logits screens with int8 dot products here (AVX-512\n"
     "VNNI); elsewhere it is exact but no faster than linear."},
    {"greedy_prep", py_greedy_prep, METH_VARARGS,
     "greedy_prep(w, norms, sums): what greedy_logits needs of a Q8_0 matrix (N, K), once:\n"
     "norms (N,) float32 ||W[r]||_2 rounded up, sums (N, K / 32) int16 each block's quants."},
    {"greedy_logits", py_greedy_logits, METH_VARARGS,
     "greedy_logits(w, norms, sums, x, ban_off, ban_ids, out, candidates): linear's Q8_0 product\n"
     "for rows that want only their argmax: out[b] holds linear's exact value for every\n"
     "token that could be row b's largest one not in ban_ids[ban_off[b]:ban_off[b + 1]],\n"
     "-inf elsewhere (kernels/cpu/greedy.h); candidates[b]: how many were computed."},
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
