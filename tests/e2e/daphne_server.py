"""Start the real server for end-to-end tests: `daphne pantheon_site.asgi:application` in a
subprocess, with its own data dir (migrated first) and the models the test names."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LOAD_TIMEOUT_S = 120
PROBE = [{"role": "user", "content": "What is the capital of France?"}]


DATABASE = "pantheon.sqlite3"  # in PANTHEON_DATA_DIR (pantheon_site/settings.py)


@functools.cache
def _migrated_template() -> Path:
    """One freshly migrated database per test process (the migrations read no settings or
    environment), copied into each new data dir: a `manage.py migrate` costs ~2 s and the
    suite starts ~50 servers."""
    folder = Path(tempfile.mkdtemp(prefix="pantheon-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pantheon_site.settings"}
    env["PANTHEON_DATA_DIR"] = str(folder)
    _run_migrate(env)
    return folder / DATABASE


def _run_migrate(env: dict) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=120,
    )


def migrate(data_dir: Path, env: dict) -> None:
    """Give `data_dir` a migrated database: a copy of the template where it has none, else
    `manage.py migrate` on the one it has (a restart on the same data dir)."""
    database = Path(data_dir) / DATABASE
    if database.exists():
        _run_migrate(env)
    else:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_template(), database)


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    # What the server said before the models had loaded (None if they already were).
    health_while_loading: dict | None = None
    chat_while_loading: httpx.Response | None = None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    data_dir: Path,
    models: dict[str, Path],
    *,
    wait_for: list[str] | None = None,
    bind: str = "127.0.0.1",
    daphne_args: list[str] | None = None,
    app: str = "pantheon_site.asgi:application",
    probe_while_loading: bool = False,
    **env_extra: str,
) -> Iterator[Server]:
    """Yield a Server once every model in `models` (or the names in `wait_for`) is loaded;
    kill it afterwards. `models` becomes PANTHEON_MODELS, which seeds an empty database:
    a second server on the same data dir loads what the first had loaded instead. `bind`:
    Daphne's -b (the server is still reached through 127.0.0.1); `daphne_args`: more of
    Daphne's options (e.g. ["-v", "2"]); `app`: the ASGI application Daphne serves (a
    test's wrapper around the server's); `probe_while_loading`: see _wait_until_loaded."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
        "PANTHEON_DATA_DIR": str(data_dir),
        "PANTHEON_MODELS": ",".join(f"{name}={path}" for name, path in models.items()),
        "PANTHEON_MODEL_DIRS": os.pathsep.join(
            sorted({str(Path(p).parent) for p in models.values()})
        ),
        "PYTHONUNBUFFERED": "1",
        **env_extra,
    }
    migrate(data_dir, env)
    port = free_port()
    log = data_dir / "daphne.log"
    with log.open("wb") as log_file:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", bind, "-p", str(port)]
            + list(daphne_args or [])
            + [app],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    srv = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        _wait_until_loaded(srv, list(models) if wait_for is None else wait_for, probe_while_loading)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _loaded_since(srv: Server, names: list[str]) -> bool:
    health = httpx.get(srv.url + "/", timeout=5).json()
    return all(health["models"].get(name) == "loaded" for name in names)


def _wait_until_loaded(srv: Server, names: list[str], probe: bool) -> None:
    """Poll GET / until `names` are loaded. With `probe`, the first health check that
    lists a model still loading is followed by a chat (Server.chat_while_loading): off by
    default, since that chat is answered (and metered) when the load ends meanwhile."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            pytest.fail(f"daphne exited with {srv.proc.returncode}:\n{srv.log_tail()}")
        try:
            health = httpx.get(srv.url + "/", timeout=5).json()
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        states = [health["models"].get(name) for name in names]
        if all(state == "loaded" for state in states):
            return
        if "failed" in states:
            pytest.fail(f"a model failed to load: {health}\n{srv.log_tail()}")
        # Nothing listed yet: the loader is still reading the model list from the database.
        if probe and srv.health_while_loading is None and health["models"]:
            srv.health_while_loading = health
            srv.chat_while_loading = httpx.post(
                srv.url + "/v1/chat/completions", json={"messages": PROBE}, timeout=10
            )
            if srv.chat_while_loading.status_code == 200 and _loaded_since(srv, names):
                # The load finished between the health check and the chat (a busy host):
                # the observation says nothing, so drop it rather than judge it.
                srv.health_while_loading = srv.chat_while_loading = None
        time.sleep(0.2)
    pytest.fail(f"the models did not load within {LOAD_TIMEOUT_S} s:\n{srv.log_tail()}")
