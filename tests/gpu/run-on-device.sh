#!/usr/bin/env bash
# The GPU machine's check (issue 16), one call of the device tool, from the repo root:
#   here, once:  make gpu-wheels          (the server's missing packages into .whl/, ~25 MB)
#   device run:  command "bash tests/gpu/run-on-device.sh", carry [".whl"], timeout_s 480
# The machine has Python 3.12, numpy, CuPy (CUDA 13), pytest, httpx, jinja2, tokenizers
# ..., nothing can be fetched there: Django, Daphne, gguf, llguidance and the rest travel
# as wheels (tests/gpu/wheels.py says which). Runs tests/gpu alone (not the suite's root
# conftest: its Django test fixtures are not needed) with PANTHEON_REQUIRE_GPU=1, so a
# missing device or package fails, then bench/bench_gpu.py; logs and figures go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PANTHEON_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__,
  'devices', cupy.cuda.runtime.getDeviceCount())" 2>&1 | tee -a "$out/gpu.txt"
# One hung test must not take the whole call: pytest-timeout is in the image.
per_test=""
python3 -c "import pytest_timeout" 2>/dev/null && per_test="--timeout=90"
timeout 270 python3 -m pytest -q -rA -p no:cacheprovider -o addopts= --confcutdir=tests/gpu \
    $per_test tests/gpu 2>&1 | tee "$out/gpu-tests.log"
tests_rc="${PIPESTATUS[0]}"
# The figures beside their rooflines, on a SmolLM2-shaped file written there.
timeout 150 python3 bench/bench_gpu.py --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.txt"
exit "$tests_rc"
