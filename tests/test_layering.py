"""The engine and the kernels stand alone: importing them loads no Django."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import inference.engine.serving.service, inference.engine.text.tokenizer, inference.engine.types, kernels
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"django", "rest_framework", "channels", "daphne"})
print(",".join(leaked))
"""


def test_engine_and_kernels_import_without_django():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        # No DJANGO_SETTINGS_MODULE: nothing may configure Django behind our back.
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"engine imports pull in: {result.stdout.strip()}"
