"""Route classes: which scope a path needs and how large its body may be.

One table for the security layers (pantheon_site/stack.py): the key check, the browser
defences, the body limits, the access log. Paths are the contract's, exact (no trailing
slash variants); anything not listed is a client route.

Every decision is made on `canonical(path)`, and the outermost ASGI layer
(pantheon_site.stack.canonical_path) puts that same string in scope["path"] before
anything routes on it: `//session/watch`, `/v1/../session/watch` and `/session/./watch`
are /session/watch for the key check, the body limit, the access log, Channels and Django
alike.
"""

from __future__ import annotations

# Scopes a key may carry (access/models.py). `session_export` is its own scope because an
# export returns the conversation's tokens, i.e. the prompts. `metrics`: a Prometheus
# scraper's key reads GET /metrics and nothing else.
INFERENCE, SESSIONS, SESSION_EXPORT, ADMIN = "inference", "sessions", "session_export", "admin"
METRICS = "metrics"
SCOPES = (INFERENCE, SESSIONS, SESSION_EXPORT, ADMIN, METRICS)
OPEN = "open"  # no key needed

RESTORE_PATH = "/session/restore"
SESSION_PATHS = frozenset({RESTORE_PATH, "/session/release", "/session/watch", "/session/estimate"})
EXPORT_PATH = "/admin/session/export"
METRICS_PATH = "/metrics"
REGISTRY_PREFIX = "/registry/"  # a router's (cluster/): instances register and heartbeat
# Bodies that may be large: a conversation (long prompts) in each wire format, with the
# spellings without /v1 some clients use, texts to embed or tokenize, and a restore (a KV
# blob).
LARGE_BODY_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/completion",  # llama-server's (wire/llamacpp)
        "/infill",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/api/chat",  # Ollama's API (wire/ollama)
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        RESTORE_PATH,
    }
)
# Open routes (no key): the health checks (GET / and llama.cpp's /health) and this
# server's OpenAPI document.
OPEN_PATHS = frozenset({"/", "/health", "/openapi.json"})
FILES_PATH = "/v1/files"  # uploads (multipart): PANTHEON_FILES_MAX_BYTES, plus the form

MIB = 1024 * 1024
LARGE_BODY_BYTES = 64 * MIB
MANAGEMENT_BODY_BYTES = 4 * MIB
RESTORE_SLACK_BYTES = 1 << 20  # a restore body's JSON and blob header beyond the KV


def canonical(path: str) -> str:
    """The one spelling of a (percent-decoded) path that scope and route are decided on:
    empty and "." segments dropped, ".." resolved (never above the root), a trailing slash
    kept. "//session/watch" -> "/session/watch"; "/console/./" -> "/console/"."""
    parts = path.split("/")
    out: list[str] = []
    for part in parts:
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    trailing = bool(out) and parts[-1] in ("", ".", "..")
    return "/" + "/".join(out) + ("/" if trailing else "")


def scope_for(path: str) -> str:
    """The scope a request to `path` needs, or OPEN."""
    if path in OPEN_PATHS:
        return OPEN
    if path == "/console" or path.startswith(("/console/", "/static/")):
        return OPEN  # the Django admin: its own login, CSRF and session protections
    if path in SESSION_PATHS:
        return SESSIONS
    if path == EXPORT_PATH:
        return SESSION_EXPORT
    if path == METRICS_PATH:
        return METRICS
    if path == "/admin" or path.startswith(("/admin/", REGISTRY_PREFIX)):
        return ADMIN  # the router's /registry/ routes: serve instances, with the router key
    return INFERENCE


def is_management(path: str) -> bool:
    """Operator and session routes: JSON only (415 for a declared non-JSON body)."""
    return scope_for(path) in (ADMIN, SESSIONS, SESSION_EXPORT)


def body_limit(path: str) -> int:
    """The most body bytes a request to `path` may send (413 beyond, before parsing).
    /session/restore may go further when a served model's full-window blob needs it: the
    same number its view reads up to (restore_body_limit)."""
    if path == RESTORE_PATH:
        return max(LARGE_BODY_BYTES, restore_body_limit())
    if path == FILES_PATH:
        from django.conf import settings

        return settings.PANTHEON_FILES_MAX_BYTES + RESTORE_SLACK_BYTES
    return LARGE_BODY_BYTES if path in LARGE_BODY_PATHS else MANAGEMENT_BODY_BYTES


# Where restore_body_limit looks beyond this process's models: the router has none, so it
# takes the largest limit its instances report (cluster/restore_limit.py installs that).
_restore_limit_sources: list = []


def add_restore_limit_source(source) -> None:
    """`source()` -> a restore body limit in bytes that restore_body_limit also honours."""
    _restore_limit_sources.append(source)


def restore_body_limit() -> int:
    """The most body bytes a restore takes: DATA_UPLOAD_MAX_MEMORY_SIZE (the large-body
    route class's 64 MiB), or what a whole context window of the largest served model
    needs when that is more: the blob is every KV byte of a conversation in base64
    (SmolLM2: 60 KiB per token), so a session of a thousand tokens is already past 64 MiB.
    The ASGI body limit (body_limit) answers 413 past the same number."""
    from django.conf import settings

    from pantheon_platform.runtime import get_runtime

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0
    for svc in get_runtime().services().values():
        # base64 of the KV, plus each token id twice (the blob's header and `tokens`)
        per_token = svc.kv.bytes_per_token() * 4 // 3 + 40
        limit = max(limit, svc.context_window_configured * per_token + RESTORE_SLACK_BYTES)
    for source in _restore_limit_sources:
        limit = max(limit, source())
    return limit


def body_class(path: str) -> str:
    """The route class a body limit belongs to, for messages: "large" or "management"."""
    return "large" if path in LARGE_BODY_PATHS or path == FILES_PATH else "management"
