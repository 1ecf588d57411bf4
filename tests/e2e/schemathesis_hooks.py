"""Schemathesis hooks for tests/e2e/test_schemathesis.py (loaded with SCHEMATHESIS_HOOKS).

- Fuzzed completions must stay short on a CI machine's CPU: every well-typed `max_tokens`
  (or an absent one, whose default is 1024) is bounded to MAX_TOKENS. Everything else in
  the body, wrong types included, goes to the server as generated.
- Each response's status is tallied (one `METHOD PATH STATUS` line per call) into the file
  PANTHEON_FUZZ_TALLY names, so the test can say how many cases each route got.
"""

from __future__ import annotations

import os

import schemathesis

CHAT_PATH = "/v1/chat/completions"
MAX_TOKENS = 4


# The routes that generate, and the field that bounds their answer.
MAX_TOKENS_FIELD = {
    CHAT_PATH: "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/v1/messages": "max_tokens",
    "/v1/completions": "max_tokens",
    "/completion": "n_predict",  # llama-server's (absent or -1: up to the clamp)
    "/infill": "n_predict",
}


# Ollama's routes bound their answer with options.num_predict (absent: 1024).
OLLAMA_PATHS = ("/api/chat", "/api/generate")


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.path in OLLAMA_PATHS and isinstance(case.body, dict):
        options = case.body.get("options")
        if options is None:
            options = case.body["options"] = {}
        if isinstance(options, dict):
            value = options.get("num_predict")
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                options["num_predict"] = (
                    MAX_TOKENS if not value or value < 1 else min(MAX_TOKENS, value)
                )
        return
    field = MAX_TOKENS_FIELD.get(case.operation.path)
    if field is None or not isinstance(case.body, dict):
        return
    value = case.body.get(field)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        case.body[field] = max(1, min(MAX_TOKENS, value or MAX_TOKENS))


@schemathesis.hook
def after_call(context, case, response):
    tally = os.environ.get("PANTHEON_FUZZ_TALLY")
    if tally:
        with open(tally, "a") as f:
            # The coverage phase also sends methods the path does not list (expecting 405):
            # those are tallied apart, as "other".
            sent = response.request.method
            method = sent if sent == case.operation.method.upper() else "other"
            f.write(f"{method} {case.operation.path} {response.status_code}\n")
