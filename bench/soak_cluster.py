"""Cluster soak (issue 36): N minutes of every wire format through the router of a local
cluster (Redis, 2 instances, a router: what `make cluster` starts), with one key flooding
and an instance SIGKILLed every `--kill-every-s` (alternating; the supervisor starts it
again).

    python bench/soak_cluster.py --minutes 30 --json soak.json
    python bench/soak_cluster.py --minutes 3 --kill-every-s 60 --warmup-s 30   # a smoke

Victim clients (`--clients`, over `--victim-keys` console keys) loop over OpenAI chat
(streamed and not), /v1/completions (streamed and not), Anthropic /v1/messages
(streamed), Responses (streamed, store: true, half chained with previous_response_id),
Ollama /api/chat (streamed) and session turns (then a release, or a few kept to the end);
one flood key loops 2 MB /tokenize bodies and 64-input embeddings (bench/soak_wire.py).

Checks (exit status 1 when one fails): no 5xx on any route; no transport error; every
stream ended in its format's way (its normal ending or its documented error event);
no 429 for a victim key; per process (router, each incarnation of each instance) RSS peak
minus the first sample `--warmup-s` after its start <= `--rss-bound-mb`; at the end every
acknowledged stored response answers 200 to GET /v1/responses/{id} and every kept session
answers a next turn with 200 (a re-prefill after its instance died counts as kept).

`--json` also keeps every RSS sample and, per sample, the process's anonymous and
file-backed RSS and an instance's spilled prefixes and parked sessions' bytes (its
/metrics): what moves when RSS moves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import soak_wire  # noqa: E402
from bench.soak import MODEL  # noqa: E402
from cluster.local_cluster import (  # noqa: E402
    NO_REDIS,
    REPO_ROOT,
    find_redis_server,
    free_port,
    pantheon_env,
    start_daphne,
    start_redis,
)
from cluster.supervisor import Supervisor  # noqa: E402

ADMIN_KEY = "soak-admin-key-" + os.urandom(8).hex()
CLIENT_TIMEOUT = httpx.Timeout(600.0, connect=30.0)  # a slow answer on 2 shared cores is no failure
INSTANCE_ENV = {  # as tests/cluster/conftest.py runs its instances, with room for sessions
    "PANTHEON_THREADS": "1",
    "PANTHEON_MAX_CONCURRENT": "4",
    "PANTHEON_MAX_SESSIONS": "16",
}


class SoakCluster:
    """Redis, a router and the instances under one Supervisor, in `root`."""

    def __init__(self, root: Path, instances: int):
        binary = find_redis_server()
        if binary is None:
            sys.exit(NO_REDIS)
        self.supervisor = Supervisor()
        redis_port, router_port = free_port(), free_port()
        self.router_url = f"http://127.0.0.1:{router_port}"
        common = {
            "PANTHEON_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "PANTHEON_CLUSTER_SECRET": os.urandom(32).hex(),
            "PANTHEON_ADMIN_API_KEY": ADMIN_KEY,
            "PANTHEON_ROUTER_KEY": ADMIN_KEY,
        }
        self.supervisor.add("redis", lambda: start_redis(binary, redis_port, root / "redis"))
        self.router_env = pantheon_env(root / "router", PANTHEON_ROLE="router", **common)
        self.router = self.supervisor.add(
            "router",
            lambda: start_daphne(self.router_env, router_port, root / "router" / "daphne.log"),
        )
        self.instances = []
        self.urls: dict[str, str] = {}  # instance name -> its own URL (its /metrics)
        for n in range(1, instances + 1):
            port, folder = free_port(), root / f"instance-{n}"
            self.urls[f"instance-{n}"] = f"http://127.0.0.1:{port}"
            env = pantheon_env(folder, PANTHEON_ROUTER_URL=self.router_url, **common)
            env.update(INSTANCE_ENV)
            self.instances.append(
                self.supervisor.add(
                    f"instance-{n}",
                    lambda e=env, p=port, f=folder: start_daphne(e, p, f / "daphne.log"),
                )
            )
        self.stop_ticking = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.stop_ticking.wait(0.5):
            self.supervisor.tick()

    def make_keys(self, names: list[str]) -> list[str]:
        """Console keys (inference, sessions) in the router's database, as the console
        stores them."""
        code = (
            "from tests.access.helpers import console_key;"
            f"[print(console_key(n, ['inference', 'sessions'])) for n in {names!r}]"
        )
        out = subprocess.run(
            [sys.executable, "-m", "django", "shell", "-c", code],
            cwd=REPO_ROOT,
            env=self.router_env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return out.stdout.strip().splitlines()[-len(names) :]

    def serving(self) -> int:
        """Instances whose reports list a model, as the router sees them."""
        reply = httpx.get(
            self.router_url + "/admin/instances",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )
        return sum(1 for row in reply.json()["data"] if row["models"])

    def wait_serving(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.serving() == len(self.instances):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(1)
        raise RuntimeError(f"not every instance serves after {timeout_s} s")

    def close(self) -> None:
        self.stop_ticking.set()
        self.ticker.join()
        self.supervisor.stop()


def rss_sampler(
    cluster: SoakCluster, every: float, stop: threading.Event, samples: dict, parts: dict
):
    """RSS of the router and of each instance's current process, keyed by name and pid (a
    restarted instance is a new series); `parts` gets its anonymous and file-backed MB
    and, for an instance, what its caches hold (cache_bytes)."""
    t0 = time.monotonic()
    while not stop.wait(every):
        for child in [cluster.router, *cluster.instances]:
            proc = child.proc
            if proc is None or proc.poll() is not None:
                continue
            try:
                rss = psutil.Process(proc.pid).memory_info().rss / 2**20
            except psutil.Error:
                continue
            name = f"{child.name} pid {proc.pid}"
            t = round(time.monotonic() - t0, 1)
            samples.setdefault(name, []).append((t, round(rss, 1)))
            split = rss_parts(proc.pid)
            if split:
                held = cache_bytes(cluster.urls.get(child.name))
                parts.setdefault(name, []).append((t, *split, *held))


HELD_SERIES = ("pantheon_prefix_cache_host_bytes", "pantheon_sessions_parked_bytes")


def cache_bytes(url: str | None) -> tuple[float, ...]:
    """MB an instance's bounded host-memory stores hold by its /metrics (HELD_SERIES,
    summed over models); () for the router or an instance that does not answer."""
    if url is None:
        return ()
    try:
        reply = httpx.get(
            url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5
        )
    except httpx.HTTPError:
        return ()
    held = dict.fromkeys(HELD_SERIES, 0.0)
    for line in reply.text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in held:
            held[name] += float(line.rsplit(" ", 1)[1])
    return tuple(round(v / 2**20, 1) for v in held.values())


def rss_parts(pid: int) -> tuple[float, float] | None:
    """(anonymous, file-backed) resident MB from /proc (Linux), to tell a heap that grows
    from pages of the mapped GGUF; None where /proc has no such lines."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = (ln.partition(":") for ln in lines)
    kb = {k: float(v.split()[0]) for k, _, v in fields if k in ("RssAnon", "RssFile")}
    if len(kb) < 2:
        return None
    return round(kb["RssAnon"] / 1024, 1), round(kb["RssFile"] / 1024, 1)


def rss_figures(samples: dict, warmup_s: float) -> dict:
    """Per series: first, baseline (the first sample warmup_s after the series began),
    peak after it and growth; None where the process did not outlive its warm-up."""
    figures = {}
    for name, series in samples.items():
        start = series[0][0]
        after = [rss for t, rss in series if t >= start + warmup_s]
        row = {"first_mb": series[0][1], "last_mb": series[-1][1], "samples": len(series)}
        if after:
            row.update(baseline_mb=after[0], peak_mb=max(after))
            row["growth_mb"] = round(max(after) - after[0], 1)
            # Transient peaks (a 2 MB body, a 64-input batch) or a trend: the medians of
            # the first and the last minute after the warm-up.
            n = max(1, min(len(after) // 2, 12))
            row["median_first_last_mb"] = [median(after[:n]), median(after[-n:])]
        figures[name] = row
    return figures


def killer(cluster: SoakCluster, every: float, until: float, kills: list, t0: float) -> None:
    """SIGKILL one instance every `every` seconds, alternating."""
    n = 0
    while time.monotonic() + every < until:
        time.sleep(every)
        child = cluster.instances[n % len(cluster.instances)]
        n += 1
        if child.proc is not None and child.proc.poll() is None:
            child.proc.send_signal(signal.SIGKILL)
            kills.append(
                {
                    "t_s": round(time.monotonic() - t0, 1),
                    "at": time.strftime("%H:%M:%S"),
                    "killed": child.name,
                }
            )
            print(f"[{time.monotonic() - t0:6.0f} s] SIGKILL {child.name}", flush=True)


async def traffic(url: str, args, victims: list[str], flood: str, tally, until: float):
    async def loop(i: int, key: str, role: str, request):
        random.seed(1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT) as http:
            client = soak_wire.Client(http, key, role, tally, keep_sessions=args.keep_sessions)
            while time.monotonic() < until:
                try:
                    await request(client)
                except httpx.HTTPError as exc:
                    tally.transport_errors += 1
                    tally.fail(f"transport ({role}): {type(exc).__name__}: {exc}")

    loops = [
        loop(i, victims[i % len(victims)], "victim", soak_wire.victim_request)
        for i in range(args.clients)
    ]
    loops += [loop(100 + i, flood, "flood", soak_wire.flood_request) for i in range(args.flooders)]
    await asyncio.gather(*loops)


async def final_checks(url: str, tally) -> dict:
    """Every acknowledged stored response is found; every kept session continues."""
    lost_responses, lost_sessions = [], []
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT) as http:
        for response_id, key in tally.stored.items():
            reply = await http.get(
                f"/v1/responses/{response_id}", headers={"Authorization": f"Bearer {key}"}
            )
            if reply.status_code != 200 or reply.json().get("id") != response_id:
                lost_responses.append(f"{response_id}: {reply.status_code}")
        for sid, (key, messages) in tally.kept_sessions.items():
            body = {
                "model": MODEL,
                "messages": [*messages, {"role": "user", "content": "And then?"}],
                "max_tokens": 8,
                "session_id": sid,
            }
            reply = await http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            if reply.status_code != 200:
                lost_sessions.append(f"{sid}: {reply.status_code} {reply.content[:120]!r}")
    return {
        "stored_responses": len(tally.stored),
        "lost_responses": lost_responses,
        "kept_sessions": len(tally.kept_sessions),
        "lost_sessions": lost_sessions,
    }


def run(args) -> dict:
    if args.data_dir:  # kept afterwards: the processes' logs
        args.data_dir.mkdir(parents=True, exist_ok=False)
        return run_in(str(args.data_dir), args)
    with tempfile.TemporaryDirectory(prefix="pantheon-soak-cluster-") as root:
        return run_in(root, args)


def run_in(root: str, args) -> dict:
    print(f"starting redis, a router and {args.instances} instances in {root}", flush=True)
    cluster = SoakCluster(Path(root), args.instances)
    try:
        names = [f"victim-{i}" for i in range(args.victim_keys)] + ["flood"]
        *victims, flood = cluster.make_keys(names)
        cluster.wait_serving()
        print(f"router {cluster.router_url}; {args.minutes} min of traffic", flush=True)
        return soak(cluster, args, victims, flood)
    finally:
        cluster.close()


def soak(cluster: SoakCluster, args, victims: list[str], flood: str) -> dict:
    tally, samples, parts, kills = soak_wire.Tally(), {}, {}, []
    stop = threading.Event()
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    sampler = threading.Thread(
        target=rss_sampler, args=(cluster, args.sample_s, stop, samples, parts)
    )
    sampler.start()
    kill_thread = threading.Thread(
        target=killer, args=(cluster, args.kill_every_s, until, kills, t0), daemon=True
    )
    kill_thread.start()
    try:
        asyncio.run(traffic(cluster.router_url, args, victims, flood, tally, until))
        seconds = time.monotonic() - t0
        kill_thread.join()
        cluster.wait_serving()  # the last killed instance is back before the final checks
        time.sleep(args.sample_s * 2)
        final = asyncio.run(final_checks(cluster.router_url, tally))
    finally:
        stop.set()
        sampler.join()
    restarts = {c.name: c.restarts for c in cluster.instances}
    result = summarize(tally, samples, kills, restarts, final, args, seconds)
    result["rss_anon_file_samples"] = parts
    return result


def summarize(tally, samples, kills, restarts, final, args, seconds) -> dict:
    statuses = {r: dict(sorted(c.items())) for r, c in sorted(tally.statuses.items())}
    five_xx = {r: sum(n for s, n in c.items() if s >= 500) for r, c in tally.statuses.items()}
    endings = {f: dict(c) for f, c in sorted(tally.endings.items())}
    rss = rss_figures(samples, args.warmup_s)
    growth = [row["growth_mb"] for row in rss.values() if "growth_mb" in row]
    victim_429 = tally.by_key["victim"].get(429, 0)
    refusals = dict(sorted(tally.refusals.items()))
    checks = {
        "no_5xx": sum(five_xx.values()) == 0,
        "no_transport_error": tally.transport_errors == 0,
        "every_stream_ended": all(c.get("cut", 0) == 0 for c in tally.endings.values()),
        "no_victim_429": victim_429 == 0,
        "rss_flat": max(growth, default=0.0) <= args.rss_bound_mb,
        "no_response_lost": not final["lost_responses"],
        "no_session_lost": not final["lost_sessions"],
    }
    return {
        "minutes": round(seconds / 60, 1),
        "requests": sum(sum(c.values()) for c in tally.statuses.values()),
        "statuses_by_route": statuses,
        "5xx_by_route": {r: n for r, n in five_xx.items() if n},
        "stream_endings": endings,
        "victim_429": victim_429,
        "refusals_by_status_route_key_type": refusals,
        "transport_errors": tally.transport_errors,
        "kills": kills,
        "restarts": restarts,
        "rss": rss,
        "rss_bound_mb": args.rss_bound_mb,
        **final,
        "checks": checks,
        "pass": all(checks.values()),
        "first_errors": tally.errors[:30],
        "first_victim_4xx": tally.victim_4xx,
        "rss_samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--kill-every-s", type=float, default=300)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--clients", type=int, default=6, help="victim clients")
    ap.add_argument("--victim-keys", type=int, default=3)
    ap.add_argument("--flooders", type=int, default=2, help="flood key clients")
    ap.add_argument("--keep-sessions", type=int, default=2, help="per client, unreleased")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--warmup-s", type=float, default=120.0, help="per process, from its start")
    ap.add_argument("--rss-bound-mb", type=float, default=64.0)
    ap.add_argument("--data-dir", type=Path, help="a new folder to keep (default: a temp one)")
    ap.add_argument("--json", help="also write the whole result (RSS samples too) here")
    args = ap.parse_args()
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    result.pop("rss_samples")
    result.pop("rss_anon_file_samples")
    print(json.dumps(result, indent=1))
    failed = [name for name, ok in result["checks"].items() if not ok]
    print(
        f"{'PASS' if result['pass'] else 'FAIL'}: {result['requests']} requests in "
        f"{result['minutes']} min, {len(result['kills'])} kills, "
        f"{sum(result['5xx_by_route'].values())} x 5xx, "
        f"{result['stored_responses']} stored responses ({len(result['lost_responses'])} lost), "
        f"{result['kept_sessions']} kept sessions ({len(result['lost_sessions'])} lost)"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    sys.exit(0 if result["pass"] else 1)


if __name__ == "__main__":
    main()
