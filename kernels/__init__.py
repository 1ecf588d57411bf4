"""Compute backends behind one interface (kernels.backend.Backend): the numpy reference,
the compiled CPU kernels (`cpu`: GGUF blocks kept as they are, kernels/cpu/) when the
extension was built, and the GPU backend (`cuda`: kernels/cuda/backend.py on a die of
kernels/devices/dies.py) where CuPy sees a device.

Nothing here imports Django. `backend_name()` answers "what can this process run on?":
`cuda` when CuPy is installed and sees at least one usable device, else `cpu`.
`get_backend(name)` is how a model chooses its kernels at load time; "auto" is the
compiled CPU backend when it was built, else numpy (`kernel_name()` says which, and
GET / reports it: never a silent fallback).
"""

from __future__ import annotations

import functools
import weakref

from kernels.backend import Backend


def dies_visible() -> int:
    """Dies the die manager holds (kernels.devices.dies): the CUDA devices CuPy can use, 0
    without CuPy, driver or card."""
    from kernels.devices import dies

    return len(dies.manager())


def array_module(x):
    """numpy (for any numpy array, subclasses included), or CuPy for a CuPy array: for
    code above the seam that must not import a backend (the device sampler)."""
    from kernels.reference.backend import array_module as of

    return of(x)


def compiled_spm_splits():
    """The compiled SentencePiece split function (kernels/cpu/text.py), or None where the
    compiled kernels were not built: for the tokenizer, which reaches kernels only here."""
    from kernels.cpu.text import compiled_spm_splits as of

    return of()


def backend_name() -> str:
    """The backend token: cuda where CUDA dies were probed, else cpu (dies a test
    installed are host memory: this process still computes on the CPU)."""
    from kernels.devices import dies

    return "cuda" if dies.manager().kind == "cuda" else "cpu"


# The GGUF types the compiled CPU kernels compute on as blocks (the extension's QTYPES;
# named here too so that memory estimates need not import it).
CPU_KERNEL_TYPES = frozenset(
    ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
)


def _make_numpy() -> Backend:
    from kernels.reference.backend import NumpyBackend

    return NumpyBackend()


def _make_cpu() -> Backend:
    from kernels.cpu.backend import CpuBackend

    return CpuBackend()


def _make_cuda() -> Backend:
    from kernels.devices import dies

    found = dies.manager()
    if found.kind != "cuda":
        raise ValueError("the cuda backend needs CuPy and a CUDA device; none is visible here")
    return die_backend(found.dies[0])


def die_backend(die) -> Backend:
    """The backend that computes on `die` (one per die): the CUDA kernels on a CUDA die,
    the xp array code on numpy on a host die (the suite's)."""
    backend = _die_backends.get(die)
    if backend is None:
        if die.kind == "cuda":
            from kernels.cuda.backend import CudaBackend

            backend = CudaBackend(die.ordinal)
        else:
            from kernels.xp.backend import XpBackend

            backend = XpBackend(die.xp)
        _die_backends[die] = backend
    return backend


_die_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _make_auto() -> Backend:
    from kernels.cpu import load_extension

    return get_backend("cpu" if load_extension() is not None else "numpy")


# name -> factory. A backend registers here and nowhere else: models never name one.
BACKENDS = {"numpy": _make_numpy, "cpu": _make_cpu, "cuda": _make_cuda, "auto": _make_auto}
DEFAULT_BACKEND = "auto"


def kernel_name(name: str = DEFAULT_BACKEND) -> str:
    """What backend `name` computes with: "cpu" (compiled kernels) or "numpy" (also
    when "cpu" was asked for but the extension is not built: loads then fail, clearly)."""
    try:
        return get_backend(name).name
    except ValueError:
        return "numpy"


def kernel_isa(name: str = DEFAULT_BACKEND) -> str | None:
    """The SIMD level the compiled kernels chose at import ("avx512", "avx2",
    "generic"); None on the numpy backend."""
    try:
        return getattr(get_backend(name), "isa", None)
    except ValueError:
        return None


def kernel_activations(name: str = DEFAULT_BACKEND) -> str | None:
    """What the compiled decode products round activations to ("float32", or "bfloat16"
    when PANTHEON_ACTIVATIONS asked for it and the CPU has it); None on numpy."""
    try:
        return getattr(get_backend(name), "activations", None)
    except ValueError:
        return None


@functools.cache
def get_backend(name: str = DEFAULT_BACKEND) -> Backend:
    """The backend called `name` (one shared instance per process)."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}") from None
    return factory()
