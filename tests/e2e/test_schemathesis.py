"""Schemathesis against the real server: every operation of /openapi.json, fuzzed with a
bounded number of examples, must answer without a 5xx, with a status code, a content type
and a body the document declares.

The server is `daphne pantheon_site.asgi:application` serving the shipped SmolLM2 with a
small context window; tests/e2e/schemathesis_hooks.py keeps fuzzed completions to a few
tokens, so a run takes a few minutes on two cores. The failing cases (with a curl line that
reproduces each) are printed when the test fails.

Tuning: PANTHEON_FUZZ_EXAMPLES (examples per operation and phase, default 6) and
PANTHEON_FUZZ_SEED (default fixed, so CI runs the same cases every time; set it to explore).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import SMOLLM2_NAME
from tests.e2e.daphne_server import REPO_ROOT, running_server

# 6 keeps `make test` under 20 minutes on 2 cores with ~90 operations; a deeper run:
# PANTHEON_FUZZ_EXAMPLES=50.
MAX_EXAMPLES = os.environ.get("PANTHEON_FUZZ_EXAMPLES", "6")
SEED = os.environ.get("PANTHEON_FUZZ_SEED", "20261129")
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",  # Retry-After, Allow
        "unsupported_method",  # a method the document does not list: 405 with Allow
        "allow_header_conformance",
    ]
)
RUN_TIMEOUT_S = 900
# Not fuzzed in the first run:
# - watchSession: a watch that is established is held until the client goes, so every
#   successful case would be a request timeout (its errors: tests/e2e/test_session_watch.py).
# - loadModel, unloadModel: they change what is served (schemathesis finds the shipped
#   GGUF in /admin/models/available and loads a second copy; an unload of the only model
#   turns every later completion into a 503). They get the second run, after the others.
# - patchConfig: it changes the server's settings (a queue depth of 0 refuses every
#   waiting request); last run too.
# - shutdownServer: it stops the server; never fuzzed (tests/operators/test_admin_shutdown.py).
FIRST_RUN_EXCLUDED = ("watchSession", "loadModel", "unloadModel", "patchConfig", "shutdownServer")
# The routes without /v1 are the same views as their /v1 twins (wire/urls.py; the same
# bytes: tests/wire/meta/test_meta_routes.py), so fuzzing them again adds ~500 cases and
# nothing else.
SAME_VIEW_AS_V1 = ("/chat/completions", "/models", "/models/{model_id}")
LAST_RUN = ("loadModel", "unloadModel", "patchConfig")


def schemathesis_run(url: str, workdir: Path, *selection: str) -> subprocess.CompletedProcess:
    """`st run` against the live server's /openapi.json, its output captured; each call's
    status is tallied in workdir/tally.txt (schemathesis_hooks.after_call)."""
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        SEED,
        "--workers",
        "1",
        "--request-timeout",
        "120",
        "--output-sanitize",
        "false",
        "--no-color",
        *selection,
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        "PANTHEON_FUZZ_TALLY": str(workdir / "tally.txt"),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    # Its working directory gets schemathesis' cache folder: keep it out of the checkout.
    return subprocess.run(
        command,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _option_each(option: str, values) -> list[str]:
    return [arg for value in values for arg in (option, value)]


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)  # two runs plus the server's start
def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path, smollm2_path):
    data = tmp_path / "data"
    data.mkdir()
    with running_server(
        data,
        {SMOLLM2_NAME: smollm2_path},
        PANTHEON_CTX_CAP="128",  # prompts and completions stay short on a CPU
    ) as srv:
        first = schemathesis_run(
            srv.url,
            tmp_path,
            *_option_each("--exclude-operation-id", FIRST_RUN_EXCLUDED),
            *_option_each("--exclude-path", SAME_VIEW_AS_V1),
        )
        # The model is still served after the first run (nothing in it may unload it).
        health = httpx.get(srv.url + "/", timeout=10).json()
        last = schemathesis_run(
            srv.url, tmp_path, *_option_each("--include-operation-id", LAST_RUN)
        )
        log = srv.log_tail()
    print(tally_table(tmp_path / "tally.txt"))
    assert health["models"].get(SMOLLM2_NAME) == "loaded", health
    assert first.returncode == 0, f"schemathesis failed:\n{_tail(first)}\nserver log:\n{log}"
    assert last.returncode == 0, f"schemathesis failed:\n{_tail(last)}\nserver log:\n{log}"


def tally_table(path: Path) -> str:
    """Cases per operation and the statuses they got, e.g.
    `POST /v1/chat/completions  212  200:131 400:70 422:11`."""
    counts: dict[str, Counter] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            method, route, status = line.split(" ")
            counts.setdefault(f"{method} {route}", Counter())[status] += 1
    other: Counter = Counter()
    for op in [op for op in counts if op.startswith("other ")]:
        other += counts.pop(op)
    if other:
        counts["(methods a path does not list)"] = other
    rows = [
        f"{op:<42} {sum(c.values()):>5}  " + " ".join(f"{s}:{n}" for s, n in sorted(c.items()))
        for op, c in sorted(counts.items())
    ]
    total = sum(sum(c.values()) for c in counts.values())
    return "\n".join(["cases per operation:", *rows, f"{'total':<42} {total:>5}"])


def _tail(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr)[-30000:]
