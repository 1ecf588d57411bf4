"""`pantheon serve MODEL.gguf --port N` as a user runs it (`python -m pantheon_cli`, the
command's module, from the project's virtualenv): it migrates its own data dir, prints
the URL, serves the file under its name, and the OpenAI SDK gets an answer. With
--discover, a fake Ollama store and Hugging Face cache (tests/platform/test_discovery.py
writes them) are listed and serve chat under their names. `pantheon --help` lists the
subcommands."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, free_port
from tests.model_stores import hf_model, ollama_model
from tests.tiny_gguf import write_tiny_llama

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


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_path):
    openai = pytest.importorskip("openai")
    tmp = tmp_path_factory.mktemp("pantheon-command")
    tiny = write_tiny_llama(tmp / "tiny.gguf").read_bytes()
    ollama_model(tmp / "ollama", "tiny", "1b", tiny)
    hf_model(tmp / "hub", "org", "tiny-GGUF", "tiny-F32.gguf", tiny)
    env = {
        **os.environ,
        "OLLAMA_MODELS": str(tmp / "ollama"),
        "HF_HUB_CACHE": str(tmp / "hub"),
        "PANTHEON_LMSTUDIO_MODELS": str(tmp / "none"),
    }
    port = free_port()
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pantheon_cli", "serve", str(smollm2_path), "--discover"]
            + ["--port", str(port), "--data-dir", str(tmp / "data"), "-np", "2"],
            cwd=REPO_ROOT,
            env=env,
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
        yield client, name, url, log, tmp
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_a_gguf_answers_the_openai_sdk(served):
    client, name, url, log, tmp = served
    answer = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].message.content
    assert client.models.retrieve(name).max_sessions == 2  # -np: PANTHEON_MAX_SESSIONS
    assert f"Pantheon on {url}/" in log.read_text()
    assert (tmp / "data" / "pantheon.sqlite3").exists()


def test_discovered_models_are_listed_and_answer_under_their_names(served):
    client, name, *_ = served
    listed = {m.id: m for m in client.models.list()}
    assert listed["tiny:1b"].owned_by == "ollama"
    assert listed["org/tiny-GGUF/tiny-F32"].owned_by == "huggingface"
    for model in ("tiny:1b", "org/tiny-GGUF/tiny-F32"):
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.model == model and answer.usage.completion_tokens > 0
    loaded = {m.id: m for m in client.models.list()}
    assert loaded["tiny:1b"].model_extra.get("loaded") is None  # served now
