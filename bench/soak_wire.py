"""The cluster soak's clients (bench/soak_cluster.py): one request in each wire format,
and the check that each stream ended in its format's way.

A stream's ending, per format (what an instance sends, and what the router sends for an
instance that died mid-answer: cluster/stream_errors.py):
- OpenAI chat and completions: `data: [DONE]`, or a `data: {"error": ...}` event;
- Anthropic Messages: `event: message_stop`, or `event: error`;
- Responses: `response.completed` (`response.incomplete` when max_output_tokens cut it),
  or `response.failed` / an `error` event;
- Ollama: a last line with `"done": true`, or an `{"error": ...}` line.
Anything else (the connection cut, a last event of another kind) is a cut stream.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench.soak import MODEL, TOPICS, user

HUGE = "lorem ipsum dolor sit amet " * 80_000  # ~2 MB of text to tokenize
EMBED_INPUTS = [f"a longer sentence to embed here, number {i}" for i in range(64)]
TERMINAL_RESPONSES = ("response.completed", "response.incomplete")  # the response is stored
SHORT = {"temperature": 0.7, "seed": 7}


@dataclass
class Tally:
    """What the clients saw: statuses by route, stream endings by format, the stored
    responses and the kept sessions to check at the end."""

    statuses: dict = field(default_factory=lambda: defaultdict(Counter))  # route -> status
    by_key: dict = field(default_factory=lambda: defaultdict(Counter))  # key -> status
    refusals: Counter = field(default_factory=Counter)  # "status route role: error type"
    endings: dict = field(default_factory=lambda: defaultdict(Counter))  # format -> ending
    errors: list = field(default_factory=list)  # what failed a check, first ones kept
    victim_4xx: list = field(default_factory=list)  # refusals of a victim, first ones kept
    transport_errors: int = 0
    stored: dict = field(default_factory=dict)  # response id -> key
    kept_sessions: dict = field(default_factory=dict)  # session id -> (key, messages)

    def note(self, route: str, role: str, reply_status: int, body: bytes = b"") -> None:
        self.statuses[route][reply_status] += 1
        self.by_key[role][reply_status] += 1
        if reply_status >= 400:
            self.refusals[f"{reply_status} {route} {role}: {error_type(body)}"] += 1
        if reply_status >= 500:
            self.fail(f"{route}: {reply_status} {body[:300]!r}")
        elif reply_status >= 400 and role == "victim" and len(self.victim_4xx) < 30:
            self.victim_4xx.append(f"[{time.strftime('%H:%M:%S')}] {route}: {body[:200]!r}")

    def fail(self, what: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(f"[{time.strftime('%H:%M:%S')}] {what[:400]}")


def error_type(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return "?"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        return str(error.get("type") or error.get("code") or "?")
    return str(error or "?")


class Client:
    """One looping client of the router: an httpx.AsyncClient, its key and its role."""

    def __init__(self, http, key: str, role: str, tally: Tally, keep_sessions: int = 0):
        self.http, self.key, self.role, self.tally = http, key, role, tally
        self.headers = {"Authorization": f"Bearer {key}"}
        self.last_response_id: str | None = None
        self.keep_sessions = keep_sessions  # sessions this client leaves unreleased

    async def post_json(self, route: str, body: dict) -> dict | None:
        reply = await self.http.post(route, json=body, headers=self.headers)
        self.tally.note(route, self.role, reply.status_code, reply.content)
        if reply.status_code != 200:
            return None
        try:
            return reply.json()
        except ValueError:
            self.tally.fail(f"{route}: a 200 that is no JSON: {reply.content[:200]!r}")
            return None

    async def stream(self, route: str, fmt: str, body: dict) -> list[str]:
        """The stream's lines; notes how it ended (`fmt`'s ending, an error event, cut)."""
        lines: list[str] = []
        async with self.http.stream("POST", route, json=body, headers=self.headers) as reply:
            if reply.status_code != 200:
                await reply.aread()
                self.tally.note(route, self.role, reply.status_code, reply.content)
                return []
            self.tally.note(route, self.role, 200)
            try:
                async for line in reply.aiter_lines():
                    if line:
                        lines.append(line)
            except Exception as exc:  # the connection broke: judged by what came
                lines.append(f"<cut: {type(exc).__name__}>")
        ending = stream_ending(fmt, lines)
        self.tally.endings[fmt][ending] += 1
        if ending == "cut":
            self.tally.fail(f"{route}: stream cut, last lines {lines[-2:]!r}")
        return lines


def stream_ending(fmt: str, lines: list[str]) -> str:
    """ "ok", "error" (the format's error ending) or "cut"."""
    if not lines:
        return "cut"
    if fmt == "ollama":
        try:
            last = json.loads(lines[-1])
        except ValueError:
            return "cut"
        if isinstance(last, dict) and "error" in last:
            return "error"
        return "ok" if isinstance(last, dict) and last.get("done") is True else "cut"
    events = sse_events(lines)
    if not events:
        return "cut"
    name, data = events[-1]
    if fmt == "openai":
        if data == "[DONE]":
            return "ok"
        return "error" if "error" in _json(data) else "cut"
    if fmt == "anthropic":
        return {"message_stop": "ok", "error": "error"}.get(name, "cut")
    if fmt == "responses":
        if name in TERMINAL_RESPONSES:
            return "ok"
        return "error" if name in ("response.failed", "error") else "cut"
    raise ValueError(fmt)


def sse_events(lines: list[str]) -> list[tuple[str, str]]:
    """(event name, data) for each `data:` line, named by the `event:` line before it."""
    events, name = [], ""
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            events.append((name, line[5:].strip()))
            name = ""
    return events


def _json(data: str) -> dict:
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def topic() -> str:
    return random.choice(TOPICS)


async def openai_chat(c: Client) -> None:
    body = {"model": MODEL, "messages": user(f"Write about {topic()}."), "max_tokens": 12}
    if random.random() < 0.5:
        await c.stream("/v1/chat/completions", "openai", {**body, **SHORT, "stream": True})
    else:
        await c.post_json("/v1/chat/completions", {**body, **SHORT})


async def completions(c: Client) -> None:
    body = {"model": MODEL, "prompt": f"A short note on {topic()}:", "max_tokens": 12, **SHORT}
    if random.random() < 0.5:
        await c.stream("/v1/completions", "openai", {**body, "stream": True})
    else:
        await c.post_json("/v1/completions", body)


async def anthropic(c: Client) -> None:
    body = {"model": MODEL, "max_tokens": 12, "stream": True, **SHORT}
    await c.stream("/v1/messages", "anthropic", {**body, "messages": user(f"Name {topic()}.")})


async def responses(c: Client) -> None:
    body = {
        "model": MODEL,
        "input": f"One line about {topic()}.",
        "max_output_tokens": 12,
        "store": True,
        "stream": True,
        **SHORT,
    }
    if c.last_response_id and random.random() < 0.5:
        body["previous_response_id"] = c.last_response_id
    lines = await c.stream("/v1/responses", "responses", body)
    for name, data in sse_events(lines):
        if name in TERMINAL_RESPONSES:
            response_id = _json(data).get("response", {}).get("id")
            if response_id:  # acknowledged: GET /v1/responses/{id} must find it at the end
                c.tally.stored[response_id] = c.key
                c.last_response_id = response_id


async def ollama(c: Client) -> None:
    body = {"model": MODEL, "messages": user(f"Describe {topic()}."), "stream": True}
    await c.stream("/api/chat", "ollama", {**body, "options": {"num_predict": 12, "seed": 7}})


async def session(c: Client) -> None:
    """Turns under one session id, then a release; or, while this client has fewer
    unreleased sessions than it keeps, left held (checked at the end)."""
    sid = f"soak-{random.getrandbits(48):012x}"
    messages = [{"role": "system", "content": "You answer in one short sentence."}]
    for _ in range(random.randint(1, 3)):
        messages.append({"role": "user", "content": f"Tell me about {topic()}."})
        body = {"model": MODEL, "messages": messages, "max_tokens": 12, "session_id": sid}
        answer = await c.post_json("/v1/chat/completions", body)
        if answer is None:
            break
        messages.append(answer["choices"][0]["message"])
    acknowledged = len(messages) > 2 and messages[-1]["role"] == "assistant"
    if acknowledged and c.keep_sessions > 0:
        c.keep_sessions -= 1
        c.tally.kept_sessions[sid] = (c.key, messages)
        return
    reply = await c.http.post(
        "/session/release", json={"model": MODEL, "session_id": sid}, headers=c.headers
    )
    c.tally.note("/session/release", c.role, reply.status_code, reply.content)


VICTIM_KINDS = [openai_chat, completions, anthropic, responses, ollama, session]


async def victim_request(c: Client) -> None:
    await random.choice(VICTIM_KINDS)(c)


async def flood_request(c: Client) -> None:
    if random.random() < 0.5:
        await c.post_json("/tokenize", {"model": MODEL, "content": HUGE})
    else:
        await c.post_json("/v1/embeddings", {"model": MODEL, "input": EMBED_INPUTS})
