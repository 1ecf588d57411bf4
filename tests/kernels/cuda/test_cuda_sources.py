"""What can be proven about the CUDA C kernels (kernels/cuda/, issue 16) without a GPU: each
program, as NVRTC will get it, compiles for sm_90 with nvcc, warning-free, with exactly the
entry points the launchers use and no fused multiply-adds where the twins are bitwise; no
standard header is included (NVRTC has none); the block decoders, compiled for the host,
decode every type bitwise as xp_quants; and the backend refuses clearly without CuPy."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernels.cuda import kernels as cuda_kernels
from kernels.xp import quants as xp_quants
from tests.tiny_gguf import random_blocks

NVCC = shutil.which("nvcc")
CXX = shutil.which("g++")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not on PATH")


@pytest.fixture(scope="module")
def ptx(tmp_path_factory) -> dict[str, str]:
    """{program: PTX for sm_90}, compiled once from the text NVRTC compiles."""
    if NVCC is None:
        pytest.skip("nvcc (the CUDA toolkit) is not on PATH")
    out = {}
    for name in cuda_kernels.PROGRAMS:
        src = tmp_path_factory.mktemp("cuda") / name
        src.write_text(cuda_kernels.program(name))
        target = src.with_suffix(".ptx")
        cmd = [NVCC, "--ptx", "-arch=sm_90", *cuda_kernels.OPTIONS, "-Werror", "all-warnings"]
        result = subprocess.run(
            [*cmd, "-o", str(target), str(src)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{name}:\n{result.stderr}"
        out[name] = target.read_text()
    return out


def entry(ptx_text: str, name: str) -> str:
    """The PTX of one kernel."""
    return re.search(rf"\.entry {name}\(.*?\n}}", ptx_text, flags=re.S)[0]


@needs_nvcc
@pytest.mark.parametrize("name", sorted(cuda_kernels.PROGRAMS))
def test_each_program_compiles_with_exactly_the_kernels_the_launchers_use(ptx, name):
    entries = set(re.findall(r"\.entry (\w+)\(", ptx[name]))
    assert entries == set(cuda_kernels.PROGRAMS[name])


@needs_nvcc
def test_the_bitwise_kernels_have_no_fused_multiply_adds(ptx):
    # --fmad=false reaches the compiler: what the twins repeat operation for operation
    # rounds every product and sum (expf / tanhf / sqrtf inside keep their own FMAs).
    assert "fma." not in ptx["quant.cu"]
    for kernel in ("rms_norm", "rope"):
        assert "fma." not in entry(ptx["ops.cu"], kernel)


def test_the_sources_include_only_their_own_headers():
    files = cuda_kernels.sources()
    assert {"blocks.cuh", "quant.cu", "ops.cu", "attention.cu"} <= set(files)
    for name, text in files.items():
        for included in re.findall(r"^\s*#\s*include\s*(\S+)", text, flags=re.M):
            assert included.strip('"') in files, f"{name} includes {included}"
    for name in cuda_kernels.PROGRAMS:
        assert "#include" not in cuda_kernels.program(name)


# The decoders of blocks.cuh on the host: __device__ is nothing, __uint_as_float a copy.
HOST_SHIM = r"""
#include <cstring>
#define __device__
#define __forceinline__ inline
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
#include "blocks.cuh"
template <class T> static void rows(const u8* W, float* out, int N, int K) {
    for (int n = 0; n < N; ++n)
        for (int pos = 0; pos < K; pos += 8)
            T::decode8(W + (size_t)n * (K / T::VALUES) * T::BYTES + pos / T::VALUES * T::BYTES,
                       pos % T::VALUES, out + (size_t)n * K + pos);
}
#define HOST(name, T) \
    extern "C" void dequantize_##name(const u8* W, float* out, int N, int K) { rows<T>(W, out, N, K); }
PANTHEON_BLOCK_TYPES(HOST)
"""


@pytest.fixture(scope="module")
def host_decoders(tmp_path_factory):
    if CXX is None:
        pytest.skip("g++ is not on PATH")
    work = tmp_path_factory.mktemp("blocks")
    (work / "shim.cpp").write_text(HOST_SHIM)
    lib = work / "blocks.so"
    cmd = [CXX, "-O2", "-shared", "-fPIC", "-ffp-contract=off", "-I", str(cuda_kernels.CUDA_DIR)]
    result = subprocess.run(
        [*cmd, "-o", str(lib), str(work / "shim.cpp")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize("qtype", list(cuda_kernels.QTYPES), ids=lambda q: q.name)
def test_the_block_decoders_are_bitwise_xp_quants(host_decoders, qtype):
    rows, k = 7, 3 * cuda_kernels.values_per_block(qtype)
    if qtype == Q.F32:  # random bytes are not all finite floats
        values = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
        blocks = values.view(np.uint8).reshape(rows, -1)
    else:
        blocks = random_blocks(f"host-{qtype.name}", (rows, k), qtype)
    out = np.empty((rows, k), dtype=np.float32)
    fn = getattr(host_decoders, f"dequantize_{cuda_kernels.QTYPES[qtype]}")
    fn(blocks.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), rows, k)
    ref = xp_quants.dequantize(np, blocks, qtype)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_float16_subnormals_infinities_and_signs_decode_exactly(host_decoders):
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every float16 bit pattern
    halves = halves[~np.isnan(halves.view(np.float16))]  # NaN payloads: not compared
    halves = halves[: len(halves) // 32 * 32].reshape(-1, 32)
    out = np.empty(halves.shape, dtype=np.float32)
    blocks = np.ascontiguousarray(halves).view(np.uint8)
    host_decoders.dequantize_f16(
        blocks.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), len(out), 32
    )
    assert np.array_equal(
        out.view(np.uint32), halves.view(np.float16).astype(np.float32).view(np.uint32)
    )


def test_the_cuda_backend_says_what_is_missing():
    # Here: no CuPy (or no device); on the GPU machine: no die 999.
    from kernels.cuda.backend import CudaBackend

    with pytest.raises(RuntimeError, match="the cuda backend (needs CuPy|was asked for die 999)"):
        CudaBackend(999)
