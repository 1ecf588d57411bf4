"""A synthetic Qwen3-30B-A3B-shaped mixture of experts beside llama-server, on the CPU.

    python bench/bench_moe_peer.py [--out DIR] [--layers 24] [--hidden 1024] [--experts 64]
        [--expert-ffn 256] [--top-k 8] [--heads 16] [--kv-heads 4] [--head-dim 64]
        [--threads 2] [--reps 3] [--peer-cmd CMD] [--no-peer] [--profile] [--json OUT]

Qwen3-30B-A3B itself (48 layers, hidden 2048, 128 experts of 768, top-8) does not fit
this host, so this writes, once, a random-weight `qwen3moe` GGUF of the same make scaled
down (the default: 24 layers, hidden 1024, 64 experts of 256, top-8, 16 query / 4 KV
heads of 64: ~1.3 B parameters, ~0.22 B active, a ~1.4 GB file) under --out (default
~/.cache/pantheon-bench/), named by its shape and seed. The file is what
scripts/reference_moe.py writes for the tiny test model at this shape: its tensor plan,
random values, Q8_0 matrices, F32 router and norms, and SmolLM2's 8192-token vocabulary
with Qwen3's template; tensors are generated and written one at a time (a seeded
generator, in file order), so writing needs one tensor's memory, not the model's.

Then, in the same run: the host's read bandwidth (a numpy sum over a 1 GiB array, one
thread and two), our server (Daphne, PANTHEON_THREADS=--threads, 8 slots of 4096) and
llama-server (-t --threads -np 8 -c 32768) on the file (ours with PANTHEON_NO_THINK=1, so
its answers are content, as the peer's are), started as bench/bench_peer.py
starts them; a greedy probe answered by both; then --reps runs of
`../shared/tools/perf.py ours=URL llamacpp=URL --reps 1 --no-long` (prefill, decode one
stream, 8-stream aggregate decode, turn-2 TTFT; interleaved ours/peer), each rep's
ratios ours/peer and their medians; and the roofline: the bytes one decoded token reads
(attention, router and norms of every layer, its top-k experts, the output matrix, one
embedding row) against the measured bandwidth, and for 8 streams the bytes of one step
whose rows pick experts uniformly at random (the expected union of their choices).
--profile records our server under py-spy during one single-stream and one 8-stream
decode and prints the busiest functions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import gguf  # noqa: E402
from reference_moe import (  # noqa: E402
    N_VOCAB,
    add_metadata,
    random_tensor,
    read_vocabulary,
    stored,
    stored_type,
    tensor_plan,
)

from bench.bench_peer import (  # noqa: E402
    SLOTS,
    TOTAL_CTX,
    peer_command,
    run_perf,
    running_peer,
)

NAME = "qwen3moe-synth"  # the served name on both servers
DEFAULT_OUT = Path.home() / ".cache" / "pantheon-bench"
LOAD_TIMEOUT_S = 600  # our server's load of a ~1.4 GB file on a busy 2-core host
PY_SPY = Path(sys.executable).parent / "py-spy"  # the venv's (dev dependency)
FIGURES = [  # perf.py's keys: (key, label, higher is better)
    ("decode_tok_s", "decode tok/s, one stream", True),
    ("agg8_tok_s", "aggregate decode tok/s, 8 streams", True),
    ("prefill_tok_s", "prefill tok/s (~640-token prompt)", True),
    ("turn2_ttft_s", "turn-2 TTFT s, ~1.9k cached tokens", False),
]


# --- the file -----------------------------------------------------------------------------


def shape_of(args) -> dict:
    """reference_moe's DIMS keys for this run's shape."""
    return dict(
        n_layer=args.layers,
        d_model=args.hidden,
        n_head=args.heads,
        n_kv_head=args.kv_heads,
        head_dim=args.head_dim,
        n_expert=args.experts,
        n_used=args.top_k,
        d_expert=args.expert_ffn,
    )


def file_name(dims: dict, seed: int) -> str:
    d = dims
    return (
        f"synth-qwen3moe-L{d['n_layer']}-D{d['d_model']}-E{d['n_expert']}x{d['d_expert']}"
        f"-k{d['n_used']}-h{d['n_head']}-{d['n_kv_head']}x{d['head_dim']}-s{seed}.gguf"
    )


def stored_bytes(name: str, shape: tuple[int, ...]) -> int:
    block, size = gguf.GGML_QUANT_SIZES[stored_type(name, len(shape))]
    return math.prod(shape) // block * size


def write_model(path: Path, dims: dict, seed: int, title: str = "") -> None:
    """Write the GGUF tensor by tensor (a .partial file, renamed when complete). At the tiny
    model's shape, seed and title this writes tests/reference/tiny/tiny-qwen3moe.gguf."""
    plan = tensor_plan(dims, N_VOCAB)
    total = sum(stored_bytes(name, shape) for name, shape, _ in plan)
    largest = max(math.prod(shape) for _, shape, _ in plan)
    need = largest * 40  # float64 draws, float32 values and quantize()'s temporaries
    available = psutil.virtual_memory().available
    if available < need + 2**30:
        sys.exit(f"{available / 2**30:.1f} GiB free: writing needs ~{need / 2**30:.1f} GiB")
    path.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(path.parent).free < total * 1.1:
        sys.exit(f"{path.parent} lacks the {total / 1e9:.2f} GB the file needs")
    partial = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(partial), arch="qwen3moe")
    title = title or f"{path.stem} (random weights, benchmark only)"
    add_metadata(w, dims, read_vocabulary(), title, 3 * dims["d_model"])
    for name, shape, _ in plan:
        qtype = stored_type(name, len(shape))
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), stored_bytes(name, shape))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), stored_bytes(name, shape), raw_dtype=qtype
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    t0 = time.monotonic()
    for i, (name, shape, scale) in enumerate(plan):
        data, _ = stored(name, random_tensor(rng, shape, scale))
        w.write_tensor_data(data)
        del data
        if name.endswith("ffn_down_exps.weight"):
            print(f"  {name} ({i + 1}/{len(plan)}, {time.monotonic() - t0:.0f} s)", flush=True)
    w.close()
    partial.rename(path)


def model_file(args, dims: dict) -> Path:
    path = args.out.expanduser() / file_name(dims, args.seed)
    if path.is_file():
        print(f"model: {path} (cached)", flush=True)
        return path
    print(f"writing {path} ...", flush=True)
    t0 = time.monotonic()
    write_model(path, dims, args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {time.monotonic() - t0:.0f} s)")
    return path


# --- the roofline -------------------------------------------------------------------------


def traffic(dims: dict) -> dict:
    """Parameters and bytes: the file's, one decoded token's, one 8-row step's."""
    plan = tensor_plan(dims, N_VOCAB)
    size = {name: stored_bytes(name, shape) for name, shape, _ in plan}
    count = {name: math.prod(shape) for name, shape, _ in plan}
    E, k = dims["n_expert"], dims["n_used"]
    experts = sum(v for n, v in size.items() if "_exps." in n)
    expert_params = sum(v for n, v in count.items() if "_exps." in n)
    embed = size["token_embd.weight"]
    dense = sum(size.values()) - experts - embed  # attention, router, norms, output
    row = embed // N_VOCAB
    union8 = E * (1 - (1 - k / E) ** SLOTS)  # distinct experts of 8 rows, uniform routing
    dense_params = sum(count.values()) - expert_params - count["token_embd.weight"]
    return {
        "params_total": sum(count.values()),
        "params_active": dense_params + expert_params * k // E + dims["d_model"],
        "file_tensor_bytes": sum(size.values()),
        "bytes_per_token": dense + row + experts * k // E,
        "experts_per_layer_8_rows": round(union8, 1),
        "bytes_per_8_row_step": int(dense + SLOTS * row + experts * union8 / E),
    }


def read_bandwidth(reps: int = 3) -> dict:
    """GB/s of a numpy float32 sum over 1 GiB: one thread, and two halves in two threads."""
    a = np.ones(2**28, dtype=np.float32)  # written once, so every page is resident
    halves = [a[: a.size // 2], a[a.size // 2 :]]

    def timed(fn) -> float:
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return a.nbytes / best / 1e9

    def two() -> None:
        threads = [threading.Thread(target=h.sum) for h in halves]  # the sum drops the GIL
        [t.start() for t in threads]
        [t.join() for t in threads]

    return {"one_thread_gb_s": round(timed(a.sum), 2), "two_threads_gb_s": round(timed(two), 2)}


# --- the servers --------------------------------------------------------------------------


def chat(url: str, content: str, max_tokens: int, stream: bool = False) -> dict:
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if not stream:
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
    body["stream"] = True
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for _ in r.iter_lines():
            pass
    return {}


def probe(servers: dict[str, str]) -> dict:
    """A greedy 16-token answer from each server: random weights, but finite logits give
    ordinary tokens (and the same ones on both, unless a routing choice is a near tie)."""
    out = {}
    for name, url in servers.items():
        answer = chat(url, "What is the capital of France?", 16)
        choice = answer["choices"][0]
        out[name] = {
            "text": choice["message"]["content"],
            "finish_reason": choice.get("finish_reason"),
            "completion_tokens": answer.get("usage", {}).get("completion_tokens"),
        }
        print(f"probe {name}: {out[name]}", flush=True)
    if not out["ours"]["text"]:
        sys.exit("our server answered the probe with no text: activations not finite?")
    return out


def profile(pid: int, label: str, url: str, streams: int, out_dir: Path, top: int = 15) -> dict:
    """py-spy's samples of our server while `streams` concurrent chats decode 96 tokens:
    the functions where most samples were (self time) and the share of each."""
    raw = out_dir / f"py-spy-{label}.txt"
    exe = str(PY_SPY) if PY_SPY.is_file() else shutil.which("py-spy") or "py-spy"
    cmd = [exe, "record", "--nonblocking", "-p", str(pid), "-r", "100", "-f", "raw"]
    spy = subprocess.Popen([*cmd, "-o", str(raw)], stdout=subprocess.DEVNULL)
    time.sleep(1.0)
    threads = [
        threading.Thread(target=chat, args=(url, f"Write a long story, part {i}.", 96, True))
        for i in range(streams)
    ]
    [t.start() for t in threads]
    [t.join() for t in threads]
    spy.send_signal(signal.SIGINT)
    spy.wait(60)
    leaves: Counter = Counter()
    for line in raw.read_text().splitlines() if raw.is_file() else []:
        stack, _, n = line.rpartition(" ")
        leaves[stack.rsplit(";", 1)[-1]] += int(n)
    total = sum(leaves.values()) or 1
    busiest = [(frame, round(n / total, 3)) for frame, n in leaves.most_common(top)]
    print(f"py-spy, ours, {label} ({total} samples):")
    for frame, share in busiest:
        print(f"  {share:6.1%}  {frame}")
    return {"samples": total, "busiest": busiest}


def measure(args, model: Path, data_dir: Path) -> dict:
    import tests.e2e.daphne_server as daphne

    daphne.LOAD_TIMEOUT_S = LOAD_TIMEOUT_S
    env = {
        "PANTHEON_THREADS": str(args.threads),
        "PANTHEON_MAX_SESSIONS": str(SLOTS),
        "PANTHEON_MAX_CONCURRENT": str(SLOTS),
        "PANTHEON_CTX_CAP": str(TOTAL_CTX // SLOTS),
        # Qwen3's template thinks by default: our server would stream a random model's
        # tokens as reasoning_content, which perf.py does not count; llama-server sends
        # them as content (no <think> tag ever comes).
        "PANTHEON_NO_THINK": "1",
    }
    cmd, why_not = peer_command(args)
    if cmd is None:
        print(f"llama-server not available: peer skipped ({why_not})", flush=True)
    result: dict = {"peer_skipped": why_not or None, "reps": []}
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(daphne.running_server(data_dir / "ours", {NAME: model}, **env))
        health = httpx.get(srv.url + "/", timeout=10).json()
        result["ours_backend"] = health.get("kernel") or health.get("backend")
        print(f"ours: {srv.url} (pid {srv.proc.pid}, backend {result['ours_backend']})")
        servers = {"ours": srv.url}
        if cmd is not None:
            log = data_dir / "llama-server.log"
            url, proc = stack.enter_context(running_peer(cmd, model, args.threads, log, alias=NAME))
            print(f"peer: {url} (pid {proc.pid})", flush=True)
            servers["llamacpp"] = url
        result["probe"] = probe(servers)
        for rep in range(args.reps):
            perf = run_perf(servers, 1, model=NAME, extra=("--no-long",))
            figures = {
                "ours": {k: perf["ours"][k] for k, *_ in FIGURES},
                "peer": {k: perf["llamacpp"][k] for k, *_ in FIGURES} if cmd else {},
            }
            figures["ratios"] = {
                k: round(figures["ours"][k] / figures["peer"][k], 3) if cmd else None
                for k, *_ in FIGURES
            }
            print(f"rep {rep + 1}: {json.dumps(figures)}", flush=True)
            result["reps"].append(figures)
        if args.profile:
            result["profile"] = {
                "decode": profile(srv.proc.pid, "decode", srv.url, 1, data_dir),
                "8 streams": profile(srv.proc.pid, "8-streams", srv.url, SLOTS, data_dir),
            }
    return result


# --- the report ---------------------------------------------------------------------------


def median(reps: list[dict], side: str, key: str) -> float | None:
    values = [r[side][key] for r in reps if r[side].get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def report(result: dict) -> str:
    reps, lines = result["reps"], []
    head = f"{'figure':38} {'llama-server':>12} {'Pantheon':>10} {'ours/peer':>10}  per rep"
    lines += [head, "-" * len(head)]
    for key, label, higher in FIGURES:
        o, p = median(reps, "ours", key), median(reps, "peer", key)
        ratio = median(reps, "ratios", key)
        each = ", ".join(
            "-" if r["ratios"][key] is None else f"{r['ratios'][key]:.2f}" for r in reps
        )
        note = "" if higher else " (lower is better)"
        r_txt = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"{label:38} {p or '-':>12} {o:>10} {r_txt:>10}  {each}{note}")
    t, bw = result["traffic"], result["bandwidth"]
    per_token, per_step = t["bytes_per_token"], t["bytes_per_8_row_step"]
    lines.append("")
    lines.append(
        f"bytes read per decoded token {per_token / 1e6:.1f} MB; per 8-row step "
        f"{per_step / 1e6:.1f} MB ({t['experts_per_layer_8_rows']} experts/layer, uniform routing)"
    )
    for threads, gb_s in (
        ("1 thread", bw["one_thread_gb_s"]),
        ("2 threads", bw["two_threads_gb_s"]),
    ):
        lines.append(
            f"roofline at {gb_s} GB/s ({threads}): decode {gb_s * 1e9 / per_token:.1f} tok/s, "
            f"8 streams {SLOTS * gb_s * 1e9 / per_step:.1f} tok/s"
        )
    for side in ("ours", "peer"):
        dec, agg = median(reps, side, "decode_tok_s"), median(reps, side, "agg8_tok_s")
        if dec and agg:
            lines.append(
                f"{side}: decode reads {dec * per_token / 1e9:.2f} GB/s, 8 streams "
                f"{agg / SLOTS * per_step / 1e9:.2f} GB/s"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the GGUF is cached")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--expert-ffn", type=int, default=256, help="each expert's hidden width")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--threads", type=int, default=2, help="threads of each server (2)")
    ap.add_argument("--reps", type=int, default=3, help="perf.py runs (3; at most 8)")
    ap.add_argument("--peer-cmd", help="the command that runs llama-server (default: the tool)")
    ap.add_argument("--build-peer", action="store_true", help="let the tool build the peer")
    ap.add_argument("--no-peer", action="store_true", help="measure ours alone")
    ap.add_argument("--write-only", action="store_true", help="write the GGUF, measure nothing")
    ap.add_argument("--profile", action="store_true", help="py-spy our server after the reps")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    if not 1 <= args.reps <= SLOTS:
        ap.error(f"--reps must be 1..{SLOTS} (each rep parks one session in a slot)")
    dims = shape_of(args)
    model = model_file(args, dims)
    if args.write_only:
        return
    result = {"model": str(model), "shape": dims, "threads": args.threads, "slots": SLOTS}
    result["file_bytes"] = model.stat().st_size
    result["traffic"] = traffic(dims)
    result["bandwidth"] = read_bandwidth()
    print(f"read bandwidth: {result['bandwidth']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pantheon-moe-bench-") as tmp:
        (Path(tmp) / "ours").mkdir()
        result |= measure(args, model, Path(tmp))
    t = result["traffic"]
    print()
    print(
        f"{model.name}: {t['params_total'] / 1e9:.2f} B parameters ({t['params_active'] / 1e9:.3f} B"
        f" active), {result['file_bytes'] / 1e9:.2f} GB; {args.threads} threads each, {SLOTS} "
        f"slots, {len(result['reps'])} rep(s), ours on {result['ours_backend']}"
    )
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
