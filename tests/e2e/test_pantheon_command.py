"""`pantheon serve MODEL.gguf --port N` as a user runs it (`python -m pantheon_cli`, the
command's module, from the project's virtualenv): it migrates its own data dir, prints
the URL, serves the file under its name, and the OpenAI SDK gets an answer. `pantheon
--help` lists the subcommands."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, free_port

pytestmark = pytest.mark.timeout(300)


def test_help_lists_the_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "pantheon_cli", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for command in ("serve", "cluster", "operator", "version"):
        assert command in out


def test_serve_a_gguf_answers_the_openai_sdk(tmp_path, smollm2_path):
    openai = pytest.importorskip("openai")
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pantheon_cli", "serve", str(smollm2_path)]
            + ["--port", str(port), "--data-dir", str(tmp_path / "data"), "-np", "2"],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        name = smollm2_path.name.removesuffix(".gguf")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/", timeout=5).json()["models"].get(name) == "loaded":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail(f"not loaded in time:\n{log.read_text()}")
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        answer = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=8,
            temperature=0,
        )
        assert answer.choices[0].message.content
        assert [m.id for m in client.models.list()] == [name]
        assert client.models.retrieve(name).max_sessions == 2  # -np: PANTHEON_MAX_SESSIONS
        assert f"Pantheon on {url}/" in log.read_text()
        assert (tmp_path / "data" / "pantheon.sqlite3").exists()
    finally:
        proc.terminate()
        proc.wait(30)
