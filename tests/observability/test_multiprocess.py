"""PROMETHEUS_MULTIPROC_DIR: several server processes, one sum."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.observability.helpers import parse

ROOT = Path(__file__).resolve().parents[2]
# One process: count `n` requests, then print a scrape when asked.
SCRIPT = """
import sys
import django

django.setup()
from observability import metrics

metrics.REQUESTS.labels("/v1/models", "200").inc(int(sys.argv[1]))
if sys.argv[2:] == ["scrape"]:
    sys.stdout.write(metrics.exposition()[0].decode())
"""


def run_process(tmp_path: Path, *args: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
        "PANTHEON_DATA_DIR": str(tmp_path / "data"),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_scrape_sums_every_process_counters(tmp_path):
    (tmp_path / "metrics").mkdir()
    run_process(tmp_path, "2")
    samples = parse(run_process(tmp_path, "3", "scrape"))
    route = frozenset({"route": "/v1/models", "status": "200"}.items())
    assert samples[("pantheon_requests_total", route)] == 5
    # The gauges are the answering process's own (it serves no model).
    assert samples[("pantheon_models_loaded", frozenset())] == 0
