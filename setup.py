"""Builds kernels._cpu, the compiled CPU kernels (kernels/cpu/*.c), in place.

`make` runs `python setup.py -q build_ext --inplace` when the sources change; `pip install
-e .` builds it too. The extension is optional: where it does not compile (no C compiler)
the install still succeeds and the server runs on the numpy backend. Threads: its own
small pthread pool (kernels/cpu/pool.c), not OpenMP, whose fork/join barrier waits for
every thread even when another process holds its core.

No -march=native: the binary runs on any x86-64 and picks its AVX-512 / AVX2 / portable
kernels at import (kernels/cpu/linear.c). -ffp-contract=off: the kernels' fused
multiply-adds are all explicit, which is what keeps their arithmetic fixed.
"""

from setuptools import Extension, setup

CPU_SOURCES = [
    "kernels/cpu/_cpu.c",
    "kernels/cpu/bind_linear.c",
    "kernels/cpu/bind_ops.c",
    "kernels/cpu/bind_plan.c",
    "kernels/cpu/bind_spm.c",
    "kernels/cpu/bind_greedy.c",
    "kernels/cpu/greedy.c",
    "kernels/cpu/linear.c",
    "kernels/cpu/linear_generic.c",
    "kernels/cpu/linear_run.c",
    "kernels/cpu/ops.c",
    "kernels/cpu/attention_decode.c",
    "kernels/cpu/attention_prefill.c",
    "kernels/cpu/pool.c",
    "kernels/cpu/prefill.c",
    "kernels/cpu/decode.c",
    "kernels/cpu/mixture.c",
    "kernels/cpu/kv.c",
    "kernels/cpu/scratch.c",
]
CPU_HEADERS = [
    "kernels/cpu/bind.h",
    "kernels/cpu/quants.h",
    "kernels/cpu/linear_simd.h",
    "kernels/cpu/ops.h",
    "kernels/cpu/vec_math.h",
    "kernels/cpu/pool.h",
    "kernels/cpu/prefill.h",
    "kernels/cpu/decode.h",
    "kernels/cpu/greedy.h",
    "kernels/cpu/mixture.h",
    "kernels/cpu/kv.h",
    "kernels/cpu/scratch.h",
]

setup(
    ext_modules=[
        Extension(
            "kernels._cpu",
            sources=CPU_SOURCES,
            depends=CPU_HEADERS,
            include_dirs=["kernels/cpu"],
            extra_compile_args=["-O3", "-pthread", "-ffp-contract=off", "-std=gnu11"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
