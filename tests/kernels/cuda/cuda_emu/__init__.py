"""The CUDA C kernels (kernels/cuda/) run on the host with CUDA's execution semantics, behind
a fake `cupy` module, so kernels.cuda.kernels' launchers and kernels.cuda.backend run
unchanged on it (issue 16). An emulator, not a GPU: it checks the kernels' thread logic
(indexing, grid shapes, barriers, warp shuffles) and the launchers' arguments; emu.h says
what it does not model.

`fake_cupy()` is the module to install as sys.modules["cupy"]. Its arrays are numpy arrays
of a subclass (`DeviceArray`: `isinstance(x, cupy.ndarray)` tells them from host arrays,
as on CuPy); `RawModule(code=...)` compiles the program text with g++ and emu.h, once per
text and process; a kernel call checks every argument against the kernel's parameters
(count, pointer or scalar, width and kind: stricter than CuPy, which passes a Python int as
8 bytes and anything else unchecked), refuses host arrays as CuPy does, then checks the
guard bytes around every array the fake allocated (a write past an end is an error).
Arrays from `empty` start as all-ones bits (NaN as float32), so an output a kernel never
writes shows.
"""

from __future__ import annotations

import atexit
import ctypes
import re
import shutil
import subprocess
import tempfile
import types
import weakref
from pathlib import Path

import numpy as np

CXX = shutil.which("g++")
PRELUDE = Path(__file__).resolve().parent / "emu.h"
FLAGS = ("-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread")
GUARD = 64  # bytes before and after every array the fake allocates
GUARD_BYTE = 0xA5


class EmulatorError(RuntimeError):
    """A kernel broke CUDA's rules (emu.h) or wrote outside its arrays."""


# ---- compiling ----------------------------------------------------------------------------

_built: dict[str, ctypes.CDLL] = {}
_workdir: Path | None = None


def kernel_names(code: str) -> list[str]:
    """The program's `extern "C" __global__` kernels, macros expanded (quant.cu makes its
    kernels with one)."""
    expanded = subprocess.run(
        [CXX, "-E", "-P", "-x", "c++", "-"], input=code, capture_output=True, text=True, check=True
    ).stdout
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(', expanded)


def build(code: str) -> ctypes.CDLL:
    """The program compiled for the host with emu.h, and a registry of its kernels."""
    global _workdir
    if code in _built:
        return _built[code]
    if CXX is None:
        raise EmulatorError("g++ is not on PATH")
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="cuda-emu-"))
        atexit.register(shutil.rmtree, _workdir, ignore_errors=True)
    entries = ",\n".join(f'    emu::entry<{n}>("{n}")' for n in kernel_names(code))
    registry = f"\nstatic const emu::Entry emu_kernels[] = {{\n{entries}\n}};\n"
    src = _workdir / f"program{len(_built)}.cu"
    src.write_text(code + registry + "EMU_EXPORTS(emu_kernels)\n")
    lib_path = src.with_suffix(".so")
    cmd = [CXX, *FLAGS, "-include", str(PRELUDE), "-x", "c++", str(src), "-o", str(lib_path)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        raise EmulatorError(f"g++ failed on {src}:\n{result.stderr}")
    lib = ctypes.CDLL(str(lib_path))
    lib.emu_launch.argtypes = [ctypes.c_char_p, *[ctypes.c_int] * 6, ctypes.c_void_p]
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_signature.argtypes = [ctypes.c_char_p]
    lib.emu_signature.restype = ctypes.c_char_p
    lib.emu_error.restype = ctypes.c_char_p
    _built[code] = lib
    return lib


# ---- device arrays ------------------------------------------------------------------------


class DeviceArray(np.ndarray):
    """An array in the emulated device's memory (host memory, numpy's operations)."""


# The bytes behind each DeviceArray the fake allocated (GUARD bytes, the array, GUARD bytes),
# by id: numpy views lead back to them through .base.
_allocations: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _allocate(shape, dtype, fill: int) -> DeviceArray:
    dtype = np.dtype(dtype)
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.full(size + 2 * GUARD, GUARD_BYTE, dtype=np.uint8)
    raw[GUARD : GUARD + size] = fill
    _allocations[id(raw)] = raw
    return raw[GUARD : GUARD + size].view(dtype).reshape(shape).view(DeviceArray)


def _check_guards(a: np.ndarray, what: str) -> None:
    raw = a
    while isinstance(raw.base, np.ndarray):
        raw = raw.base
    if _allocations.get(id(raw)) is raw:
        if (raw[:GUARD] != GUARD_BYTE).any() or (raw[-GUARD:] != GUARD_BYTE).any():
            raise EmulatorError(f"{what} wrote outside its array")


def empty(shape, dtype=np.float64) -> DeviceArray:
    return _allocate(shape, dtype, 0xFF)  # NaN as floats: unwritten outputs show


def zeros(shape, dtype=np.float64) -> DeviceArray:
    return _allocate(shape, dtype, 0)


def full(shape, value, dtype=None) -> DeviceArray:
    out = empty(shape, np.asarray(value, dtype=dtype).dtype)
    out[...] = value
    return out


def empty_like(a, dtype=None) -> DeviceArray:
    return empty(a.shape, a.dtype if dtype is None else dtype)


def asarray(a, dtype=None) -> DeviceArray:
    """A device array: a device one as it is (converted when dtype says), a host one copied."""
    if isinstance(a, DeviceArray) and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    host = np.asarray(a, dtype=dtype)
    out = empty(host.shape, host.dtype)
    out[...] = host
    return out


def ascontiguousarray(a, dtype=None) -> DeviceArray:
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else asarray(np.ascontiguousarray(a))


def asnumpy(a) -> np.ndarray:
    return np.array(a.view(np.ndarray) if isinstance(a, np.ndarray) else a)


# ---- kernels ------------------------------------------------------------------------------


def _kind(dtype: np.dtype) -> str:
    """numpy's dtype as emu.h names a parameter: "f4", "i4", "u1", ..."""
    kind = {"b": "u", "f": "f", "i": "i", "u": "u"}[dtype.kind]
    return f"{kind}{dtype.itemsize}"


class Kernel:
    """One emulated kernel, called as CuPy's RawKernel is: kernel(grid, block, args)."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        signature = lib.emu_signature(name.encode()).decode()
        if not signature:
            raise AttributeError(f"no kernel {name} in the program")
        self.lib, self.name, self.params = lib, name, signature.split(",")[:-1]

    def __call__(self, grid, block, args):
        grid, block = (tuple(dims) + (1,) * (3 - len(dims)) for dims in (grid, block))
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        keep, pointers = [], (ctypes.c_void_p * len(args))()  # each: where a value is
        for i, (arg, param) in enumerate(zip(args, self.params, strict=True)):
            where = f"{self.name} argument {i} ({param})"
            if isinstance(arg, np.ndarray):
                if not isinstance(arg, DeviceArray):
                    raise TypeError(f"{where}: a host array (CuPy refuses numpy arrays)")
                if not param.startswith("p"):
                    raise TypeError(f"{where}: an array for a scalar parameter")
                if param != "pu1" and _kind(arg.dtype) != param[1:]:
                    raise TypeError(f"{where}: a {arg.dtype} array")
                value = np.array(arg.ctypes.data, dtype=np.uintp)  # the pointer, by pointer
            else:
                # CuPy passes a Python int as int64, a float as float64, a numpy scalar as is.
                value = np.array(arg, dtype=np.int64 if type(arg) is int else None)
                if value.ndim or param.startswith("p") or _kind(value.dtype) != param:
                    raise TypeError(f"{where}: {arg!r} ({value.dtype}) does not fit")
            keep.append(value)
            pointers[i] = value.ctypes.data
        status = self.lib.emu_launch(self.name.encode(), *grid, *block, pointers)
        if status:
            raise EmulatorError(f"{self.name}: {self.lib.emu_error().decode()}")
        for i, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                _check_guards(arg, f"{self.name} (argument {i})")


class RawModule:
    def __init__(self, code: str, options=()):
        self.options = tuple(options)
        self._lib = build(code)

    def get_function(self, name: str) -> Kernel:
        return Kernel(self._lib, name)


# ---- the module ---------------------------------------------------------------------------


class _Device:
    """cupy.cuda.Device: one device, 0; a context manager."""

    def __init__(self, device: int = 0):
        if device != 0:
            raise RuntimeError(f"the emulator has one device, 0 (asked for {device})")
        self.id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeCupy(types.ModuleType):
    """What the launchers and CudaBackend use of CuPy; anything else is numpy's."""

    def __getattr__(self, name):
        return getattr(np, name)


def fake_cupy() -> types.ModuleType:
    if CXX is None:
        raise EmulatorError("g++ is not on PATH")
    cupy = _FakeCupy("cupy")
    functions = (asarray, ascontiguousarray, asnumpy, empty, empty_like, full, zeros)
    for fn in functions:
        setattr(cupy, fn.__name__, fn)
    cupy.ndarray, cupy.RawModule = DeviceArray, RawModule
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    cupy.cuda = types.SimpleNamespace(runtime=runtime, Device=_Device)
    return cupy
