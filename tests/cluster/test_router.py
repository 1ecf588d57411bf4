"""The router end to end: real Redis, real serve instances (SmolLM2), a real router, all on
loopback (tests/cluster/conftest.py). The tests run in file order on one cluster: the
later ones drain, kill and restart its processes."""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from access import forwarded
from pantheon_platform.errors import ERROR_TYPE_HEADER
from tests.cluster.conftest import ADMIN_KEY, CLIENT_KEY, CLUSTER_SECRET, HEARTBEAT_TIMEOUT_MS
from tests.conftest import SMOLLM2_NAME
from tests.e2e.daphne_server import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "Name three colours."}]
FOLLOW_UP = {"role": "user", "content": "And one more?"}


def chat(cluster, messages, *, session_id=None, max_tokens=8, via=None, **extra):
    """A greedy chat turn through the router (or straight to `via`, an instance URL)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    if session_id:
        body["session_id"] = session_id
    url = (via or cluster.router_url) + "/v1/chat/completions"
    reply = httpx.post(url, json=body, headers=cluster.headers(CLIENT_KEY), timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def answer(reply) -> str:
    return reply.json()["choices"][0]["message"]["content"]


def cached(reply) -> int:
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def two_turns(cluster, session_id, via=None):
    """Turn 1 and turn 2 of one conversation: (reply 1, reply 2)."""
    first = chat(cluster, QUESTION, session_id=session_id, via=via)
    history = [*QUESTION, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    return first, chat(cluster, history, session_id=session_id, via=via)


def turn_two(cluster, first, session_id, via=None):
    history = [*QUESTION, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    return chat(cluster, history, session_id=session_id, via=via)


def report(inst_id: str, url: str, **model) -> dict:
    """A registration as an instance sends it (cluster/reports.py)."""
    row = {
        "id": SMOLLM2_NAME,
        "max_concurrent": 2,
        "free_slots": 2,
        "queue_depth": 0,
        "queue_capacity": 4,
        "sessions": 0,
        **model,
    }
    return {"id": inst_id, "url": url, "started_at": time.time(), "models": [row]}


# ---- the registry and /v1/models ----------------------------------------------------------


def test_models_aggregate_the_live_replicas_as_the_contract_says(cluster):
    rows = cluster.models()
    assert set(rows) == {SMOLLM2_NAME}
    row = rows[SMOLLM2_NAME]
    assert row["live"] == 2
    assert row["free_slots"] == 8  # 4 idle slots on each
    assert row["context_window"] == 8192

    # A replica that has not reported a window: the aggregate omits it; a smaller one wins.
    fake = report("fake:1", "http://127.0.0.1:9", free_slots=1)
    assert cluster.registry_post("register", fake).status_code == 200
    try:
        row = cluster.models()[SMOLLM2_NAME]
        assert row["live"] == 3 and row["free_slots"] == 9
        assert "context_window" not in row
        fake["models"][0]["context_window"] = 512
        assert cluster.registry_post("heartbeat", fake).status_code == 200
        assert cluster.models()[SMOLLM2_NAME]["context_window"] == 512
    finally:
        cluster.registry_post("deregister", fake)
    assert cluster.models()[SMOLLM2_NAME] == {
        **row,
        "live": 2,
        "free_slots": 8,
        "context_window": 8192,
    }


def test_registry_refuses_bad_reports_and_unknown_heartbeats(cluster):
    bad = report("fake:2", "ftp://nowhere")
    reply = cluster.registry_post("register", bad)
    assert reply.status_code == 400 and "url" in reply.json()["error"]["message"]
    bad = report("fake:2", "http://127.0.0.1:9", context_window=0)
    assert cluster.registry_post("register", bad).status_code == 400
    reply = cluster.registry_post("heartbeat", report("never:1", "http://x"))
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "unknown_instance"
    # Registering is an operator's act: the client key may not.
    reply = cluster.post("/registry/register", report("fake:3", "http://x"), key=CLIENT_KEY)
    assert reply.status_code == 403


def test_only_holders_of_the_secret_register_and_no_one_takes_a_live_id(cluster):
    live_id = next(iter(cluster.instances))
    rogue = report("rogue:1", "http://127.0.0.1:9")
    for secret in (None, "not-the-cluster-secret"):  # no token, a token of another secret
        if secret is None:
            reply = cluster.post("/registry/register", rogue, key=ADMIN_KEY)
        else:
            reply = cluster.registry_post("register", rogue, secret=secret)
        assert reply.status_code == 403, reply.text
        assert reply.json()["error"]["type"] == "cluster_secret_required"
    assert "rogue:1" not in cluster.live_ids()
    # Even with the secret, a live instance's id is not taken over by another process:
    # not by registering, heartbeating or deregistering under it.
    impostor = report(live_id, "http://127.0.0.1:9")
    for route in ("register", "heartbeat", "deregister"):
        reply = cluster.registry_post(route, impostor)
        assert reply.status_code == 409, reply.text
        assert reply.json()["error"]["type"] == "instance_id_taken"
    rows = {row["id"]: row for row in cluster.get("/admin/instances").json()["data"]}
    assert rows[live_id]["url"] == cluster.instances[live_id].url


def test_a_restart_at_the_same_address_replaces_its_predecessor_at_once(cluster):
    """A killed instance restarted under its id and URL registers at once (its predecessor
    cannot hold the address any more): no waiting out the old heartbeats while requests go
    to an address where the new process is still loading. Nothing else takes over."""
    old = report("fake:restart", "http://127.0.0.1:9")
    assert cluster.registry_post("register", old).status_code == 200
    new = {**old, "started_at": old["started_at"] + 1, "models": []}  # still loading
    try:
        assert cluster.registry_post("register", new).status_code == 200, "the restart"
        rows = {row["id"]: row for row in cluster.get("/admin/instances").json()["data"]}
        assert rows["fake:restart"]["started_at"] == new["started_at"]
        assert rows["fake:restart"]["models"] == []  # so nothing is placed there yet
        refused = [
            old,  # the predecessor's late heartbeat
            {**old, "started_at": old["started_at"] - 1},  # an older process
            {**new, "started_at": new["started_at"] + 1, "url": "http://127.0.0.1:10"},
        ]
        for doc in refused:
            route = "heartbeat" if doc is old else "register"
            reply = cluster.registry_post(route, doc)
            assert reply.status_code == 409, reply.text
    finally:
        cluster.registry_post("deregister", new)


class NotReady(http.server.BaseHTTPRequestHandler):
    """An instance whose model is still loading: every POST is its 503."""

    hits = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).hits += 1
        body = b'{"error": {"message": "still loading", "type": "no_models_loaded", "code": null}}'
        self.send_response(503)
        self.send_header(ERROR_TYPE_HEADER, "no_models_loaded")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_replica_that_is_not_ready_gets_nothing_that_a_live_one_can_take(cluster):
    """A replica answering "still loading" (a restart behind its predecessor's report) ran
    nothing: the router sends the request on to a live replica, in every format, and the
    client never sees that 503."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # The most free slots by far: placement picks it first every time.
    fake = report(
        "fake:loading", f"http://127.0.0.1:{server.server_port}", max_concurrent=64, free_slots=64
    )
    assert cluster.registry_post("register", fake).status_code == 200
    bodies = {
        "/v1/chat/completions": {"messages": QUESTION, "max_tokens": 2},
        "/v1/messages": {"model": SMOLLM2_NAME, "messages": QUESTION, "max_tokens": 2},
        "/api/chat": {
            "model": SMOLLM2_NAME,
            "messages": QUESTION,
            "stream": False,
            "options": {"num_predict": 2},
        },
        "/v1/responses": {"model": SMOLLM2_NAME, "input": "Hi", "max_output_tokens": 2},
    }
    try:
        for path, body in bodies.items():
            reply = cluster.post(path, body)
            assert reply.status_code == 200, (path, reply.text)
            assert reply.headers["x-pantheon-instance"] != "fake:loading"
        assert NotReady.hits >= len(bodies)
    finally:
        cluster.registry_post("deregister", fake)
        server.shutdown()


def test_keys_are_checked_at_the_router(cluster):
    body = {"messages": QUESTION, "max_tokens": 1}
    no_key = httpx.post(cluster.router_url + "/v1/chat/completions", json=body, timeout=30)
    assert no_key.status_code == 401
    assert cluster.get("/admin/instances", key=CLIENT_KEY).status_code == 403
    assert cluster.post("/v1/chat/completions", body).status_code == 200


def test_no_live_instance_is_503_and_all_full_is_429(cluster):
    reply = cluster.post("/v1/chat/completions", {"model": "nope", "messages": QUESTION})
    assert reply.status_code == 503
    assert reply.json()["error"]["type"] == "no_live_instance"
    full = report("fake:full", "http://127.0.0.1:9", free_slots=0, queue_depth=4)
    full["models"][0]["id"] = "full-model"
    assert cluster.registry_post("register", full).status_code == 200
    try:
        reply = cluster.post("/v1/chat/completions", {"model": "full-model", "messages": QUESTION})
        assert reply.status_code == 429, reply.text
        assert reply.json()["error"]["type"] == "server_busy"
        assert int(reply.headers["Retry-After"]) >= 1
        # Anthropic's route answers in Anthropic's shape.
        reply = cluster.post(
            "/v1/messages", {"model": "nope", "max_tokens": 1, "messages": QUESTION}
        )
        assert reply.status_code == 503 and reply.json()["type"] == "error"
    finally:
        cluster.registry_post("deregister", full)


# ---- dispatch -----------------------------------------------------------------------------


def test_every_wire_format_is_forwarded(cluster):
    prompt = {"model": SMOLLM2_NAME, "max_tokens": 2, "temperature": 0}
    assert cluster.post("/v1/completions", {**prompt, "prompt": "Hi"}).status_code == 200
    assert cluster.post("/v1/messages", {**prompt, "messages": QUESTION}).status_code == 200
    count = cluster.post("/v1/messages/count_tokens", {"model": SMOLLM2_NAME, "messages": QUESTION})
    assert count.json()["input_tokens"] > 0
    assert cluster.post("/v1/embeddings", {"model": SMOLLM2_NAME, "input": "hi"}).status_code == 200
    tokens = cluster.post("/tokenize", {"content": "hello"}).json()["tokens"]
    assert cluster.post("/detokenize", {"tokens": tokens}).json()["content"].strip() == "hello"
    ollama = cluster.post(
        "/api/chat",
        {
            "model": SMOLLM2_NAME,
            "messages": QUESTION,
            "stream": False,
            "options": {"num_predict": 2},
        },
    )
    assert ollama.status_code == 200 and ollama.json()["done"] is True
    assert cluster.get("/api/tags", key=CLIENT_KEY).status_code == 200

    # A stored response is found again on the instance that made it, whichever is asked.
    respond = {"model": SMOLLM2_NAME, "temperature": 0, "max_output_tokens": 16}
    made = cluster.post("/v1/responses", {**respond, "input": "Hi"})
    assert made.status_code == 200, made.text
    rid, where = made.json()["id"], made.headers["x-pantheon-instance"]
    for _ in range(4):
        got = cluster.get(f"/v1/responses/{rid}", key=CLIENT_KEY)
        assert got.status_code == 200 and got.headers["x-pantheon-instance"] == where
    follow = cluster.post(
        "/v1/responses",
        {**respond, "input": "More", "previous_response_id": rid},
    )
    assert follow.status_code == 200 and follow.headers["x-pantheon-instance"] == where


def test_an_instance_local_key_reads_nothing_stored_through_the_router(cluster):
    """The router's client key and the instance's own client key are the same env key
    here, yet not the same tenant: the router forwards a namespace unique to the cluster,
    proved with its secret; a namespace header without that proof is ignored."""
    made = cluster.post(
        "/v1/responses", {"model": SMOLLM2_NAME, "input": "Hi", "max_output_tokens": 2}
    )
    rid, where = made.json()["id"], cluster.instances[made.headers["x-pantheon-instance"]]
    assert cluster.get(f"/v1/responses/{rid}", key=CLIENT_KEY).status_code == 200
    direct = where.url + f"/v1/responses/{rid}"
    assert httpx.get(direct, headers=cluster.headers(CLIENT_KEY)).status_code == 404
    namespace = forwarded.cluster_namespace("env:client", CLUSTER_SECRET)  # the router's name
    for proof in (None, "0" * 64):
        headers = {**cluster.headers(ADMIN_KEY), "X-Pantheon-Namespace": namespace}
        if proof:
            headers["X-Pantheon-Namespace-Proof"] = proof
        assert httpx.get(direct, headers=headers).status_code == 404
    # With the router's proof (made with the secret), it is the router's caller.
    headers["X-Pantheon-Namespace-Proof"] = forwarded.proof(namespace, CLUSTER_SECRET)
    assert httpx.get(direct, headers=headers).status_code == 200


def test_a_restore_an_instance_takes_is_not_refused_by_the_router(cluster):
    """The router's /session/restore body limit is the largest one its instances report
    (a whole context window's blob: hundreds of MB), not its own 64 MiB; and it routes
    the body without parsing the blob. A 70 MB blob of zeros reaches an instance, which
    decodes it as it streams and refuses it as a blob (400), not as too large (413)."""
    blob = "A" * (70 << 20)
    body = f'{{"session_id": "big-restore", "tokens": [1], "blob": "{blob}"}}'.encode()
    reply = httpx.post(
        cluster.router_url + "/session/restore",
        content=body,
        headers={**cluster.headers(CLIENT_KEY), "Content-Type": "application/json"},
        timeout=120,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "bad_session_blob"


def test_sixteen_concurrent_streams_spread_over_both_instances(cluster):
    def stream(i):
        body = {
            "messages": [{"role": "user", "content": f"Count to {i}."}],
            "max_tokens": 4,
            "stream": True,
        }
        with httpx.stream(
            "POST",
            cluster.router_url + "/v1/chat/completions",
            json=body,
            headers=cluster.headers(),
            timeout=120,
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            return r.status_code, r.headers["x-pantheon-instance"], lines

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(stream, range(16)))
    assert all(status == 200 and lines[-1] == "data: [DONE]" for status, _, lines in results)
    where = [inst for _, inst, _ in results]
    assert set(where) == set(cluster.instances)
    assert min(where.count(i) for i in cluster.instances) >= 4, where


def test_a_stream_is_passed_on_as_it_is_generated_and_a_hang_up_reaches_the_instance(cluster):
    never_end = cluster.never_end
    body = {
        "messages": QUESTION,
        "max_tokens": 400,
        "stream": True,
        "temperature": 0,
        "logit_bias": never_end,
    }
    with httpx.stream(
        "POST",
        cluster.router_url + "/v1/chat/completions",
        json=body,
        headers=cluster.headers(),
        timeout=120,
    ) as r:
        where = cluster.instances[r.headers["x-pantheon-instance"]]
        lines = r.iter_lines()  # kept: closing this iterator would hang up
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "chat.completion.chunk"
        # The first chunk arrived while the instance is still generating: not buffered.
        assert in_flight(cluster, where) == 1
    # The client hung up: the router closed its request, and the instance stopped.
    cluster.wait_for(lambda: in_flight(cluster, where) == 0, "the generation to stop", 30)


def in_flight(cluster, srv) -> int:
    rows = httpx.get(srv.url + "/admin/models", headers=cluster.headers(ADMIN_KEY)).json()
    return sum(row.get("in_flight", 0) for row in rows["data"])


# ---- affinity -----------------------------------------------------------------------------


def test_a_sessions_turns_stick_to_one_instance_with_the_direct_cache(cluster):
    first, second = two_turns(cluster, "affinity-1")
    assert first.headers["x-pantheon-instance"] == second.headers["x-pantheon-instance"]
    direct = next(iter(cluster.instances.values())).url
    d_first, d_second = two_turns(cluster, "affinity-direct", via=direct)
    assert answer(d_first) == answer(first)
    assert cached(second) == cached(d_second) > 0
    assert answer(second) == answer(d_second)


def test_restarting_the_router_loses_no_affinity(cluster):
    first = chat(cluster, QUESTION, session_id="restart-1")
    cluster.stop_router()
    cluster.start_router()  # same Redis, same port: the instances heartbeat to it again
    cluster.wait_for(lambda: len(cluster.live_ids()) == 2, "both instances", 30)
    second = turn_two(cluster, first, "restart-1")
    assert second.headers["x-pantheon-instance"] == first.headers["x-pantheon-instance"]
    assert cached(second) > 0


def test_a_redis_restart_loses_no_stored_response_and_no_affinity(cluster):
    respond = {"model": SMOLLM2_NAME, "temperature": 0, "max_output_tokens": 4}
    made = cluster.post("/v1/responses", {**respond, "input": "Hi"})
    rid, where = made.json()["id"], made.headers["x-pantheon-instance"]
    first = chat(cluster, QUESTION, session_id="redis-restart-1")
    cluster.restart_redis()
    cluster.wait_for(lambda: len(cluster.live_ids()) == 2, "both instances", 30)
    got = cluster.get(f"/v1/responses/{rid}", key=CLIENT_KEY)
    assert got.status_code == 200 and got.headers["x-pantheon-instance"] == where
    second = turn_two(cluster, first, "redis-restart-1")
    assert second.headers["x-pantheon-instance"] == first.headers["x-pantheon-instance"]
    assert cached(second) > 0


def test_the_console_lists_the_instances(cluster):
    env = {**cluster.router_env(), "DJANGO_SUPERUSER_PASSWORD": "console-pass-1"}
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "op",
            "--email",
            "op@example.com",
        ],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=60,
    )
    with httpx.Client(base_url=cluster.router_url, timeout=30) as browser:
        assert browser.get("/console/instances/").status_code == 302  # the login first
        browser.get("/console/login/")
        form = {
            "username": "op",
            "password": "console-pass-1",
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            "next": "/console/instances/",
        }
        page = browser.post("/console/login/", data=form, follow_redirects=True)
    assert page.status_code == 200 and "Serve instances" in page.text
    for inst_id in cluster.instances:
        assert inst_id in page.text
    assert SMOLLM2_NAME in page.text


# ---- drain and failure --------------------------------------------------------------------


def test_draining_moves_sessions_and_the_next_turn_resumes_from_the_cache(cluster):
    # A conversation no other test has: whatever else the target's slots hold shares no
    # more than the template's first tokens with it.
    question = [{"role": "user", "content": "Name three rivers of Europe."}]
    first = chat(cluster, question, session_id="drain-1")
    source = first.headers["x-pantheon-instance"]
    (other,) = set(cluster.instances) - {source}
    history = [*question, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    # Turn 2 computed from nothing, on the instance about to go (no session: not moved).
    reference = chat(cluster, history, via=cluster.instances[source].url)

    reply = cluster.post(f"/admin/instances/{source}/drain", {}, key=ADMIN_KEY)
    assert reply.status_code == 200, reply.text
    drained = reply.json()
    moved = {m["session_id"]: m for m in drained["moved"]}
    assert drained["failed"] == []
    assert moved["drain-1"]["to"] == other
    assert source not in routable_ids(cluster)
    assert cluster.models()[SMOLLM2_NAME]["live"] == 1

    second = chat(cluster, history, session_id="drain-1")
    assert second.headers["x-pantheon-instance"] == other
    assert cached(second) == moved["drain-1"]["tokens"] > 0
    assert answer(second) == answer(reference)


def routable_ids(cluster) -> set[str]:
    rows = cluster.get("/admin/instances").json()["data"]
    return {row["id"] for row in rows if row["state"] == "live"}


def test_a_killed_instance_is_dropped_and_its_sessions_re_prefill_elsewhere(cluster):
    (survivor,) = routable_ids(cluster)
    first = chat(cluster, QUESTION, session_id="kill-1")
    assert first.headers["x-pantheon-instance"] == survivor
    other = chat(cluster, QUESTION, session_id="kill-2")
    chat(cluster, QUESTION, session_id="kill-json")  # a plain JSON answer the death cuts
    # Streams pinned to the survivor (their session ids are recorded there) that its death
    # cuts: each must end in its own format's error event.
    for path in CUT_STREAMS:
        reply = httpx.post(
            cluster.router_url + path,
            json=PINS[path],
            headers={**cluster.headers(), "X-Session-Id": f"kill{path}"},
            timeout=120,
        )
        assert reply.headers["x-pantheon-instance"] == survivor, reply.text
    # Room for two sessions: the JSON request's (sent again there) and kill-1's; the last
    # of the dead instance's sessions (kill-2) finds none.
    replacement = cluster.start_instance("instance-c", PANTHEON_MAX_SESSIONS="2")
    pool = concurrent.futures.ThreadPoolExecutor(len(CUT_STREAMS) + 1)
    started = {path: threading.Event() for path in CUT_STREAMS}
    cut = {path: pool.submit(cut_stream, cluster, path, started[path]) for path in CUT_STREAMS}
    unanswered = pool.submit(
        cluster.post,
        "/v1/chat/completions",
        {
            "model": SMOLLM2_NAME,
            "session_id": "kill-json",
            "logit_bias": cluster.never_end,
            **RESENT_JSON,
        },
    )
    for path, event in started.items():
        assert event.wait(60), f"{path} did not start"
    # The two streams and the JSON request all run on the survivor, as it reports.
    cluster.wait_for(lambda: cluster.running(survivor) >= 3, "the JSON request to run", 60)

    cluster.sigkill(survivor)
    # Killed before its status line: nothing had reached the client, so the router sent it
    # again to the live replica, which answered it whole.
    reply = unanswered.result(180)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-pantheon-instance"] == replacement
    assert_whole_chat_completion(reply.json(), RESENT_JSON["max_tokens"])
    anthropic = cut["/v1/messages"].result(30)
    assert anthropic[-2] == "event: error", anthropic[-3:]
    assert json.loads(anthropic[-1].removeprefix("data: "))["error"]["type"] == "api_error"
    ollama = cut["/api/chat"].result(30)
    assert "failed mid-answer" in json.loads(ollama[-1])["error"]
    pool.shutdown()
    # Before its heartbeats lapse, the router already goes elsewhere (it cannot connect).
    second = turn_two(cluster, first, "kill-1")
    assert second.headers["x-pantheon-instance"] == replacement
    assert cached(second) == 0  # honest: the KV died with the instance
    reference = turn_two(cluster, first, None, via=cluster.instances[replacement].url)
    assert answer(second) == answer(reference)
    # No session slot left there: the turn re-prefills without one (not a 429).
    third = turn_two(cluster, other, "kill-2")
    assert third.headers["x-pantheon-instance"] == replacement
    assert cached(third) == 0 and answer(third) == answer(reference)

    took = cluster.wait_for(lambda: survivor not in cluster.live_ids(), "the drop", 30)
    assert took <= HEARTBEAT_TIMEOUT_MS / 1000 + 1.0
    assert cluster.models()[SMOLLM2_NAME]["live"] == len(routable_ids(cluster))


COUNTING = [{"role": "user", "content": "Count from 1 to 2000, one number per line."}]
CUT_STREAMS = {  # greedy counting: still streaming when the instance is killed
    "/v1/messages": {
        "model": SMOLLM2_NAME,
        "max_tokens": 4000,
        "temperature": 0,
        "messages": COUNTING,
    },
    "/api/chat": {
        "model": SMOLLM2_NAME,
        "messages": COUNTING,
        "options": {"num_predict": 4000, "temperature": 0},
    },
}

# Long enough to be still running when the instance is killed, short enough to be
# answered again elsewhere within the test's patience.
RESENT_JSON = {"messages": COUNTING, "max_tokens": 400, "temperature": 0}

PINS = {  # one token each, to record the streams' session ids on the survivor
    "/v1/messages": {**CUT_STREAMS["/v1/messages"], "max_tokens": 1},
    "/api/chat": {**CUT_STREAMS["/api/chat"], "stream": False, "options": {"num_predict": 1}},
}


def assert_whole_chat_completion(body: dict, max_tokens: int) -> None:
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"]
    assert body["usage"]["completion_tokens"] == max_tokens


def cut_stream(cluster, path, started) -> list[str]:
    """A long stream's non-empty lines until it ends (`started` is set at the first)."""
    headers = {**cluster.headers(), "X-Session-Id": f"kill{path}"}
    body = {**CUT_STREAMS[path], "stream": True}
    lines = []
    with httpx.stream(
        "POST", cluster.router_url + path, json=body, headers=headers, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                started.set()
    return lines
