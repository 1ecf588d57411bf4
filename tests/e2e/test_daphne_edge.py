"""The edges of a real Daphne server that the ASGI layers cannot reach
(pantheon_site/daphne_hooks.py), and the canonical routing (pantheon_platform/routes.py):

- a body that will be refused is refused once the headers are in, before it is sent
  (nothing spooled to disk): 413 over the route's limit, 401 without a valid key (an
  env key, or a console key looked up in the database), a chunked body cut at the limit;
- every malformed request gets the JSON error shape, not Twisted's bare 400 or Daphne's
  HTML page;
- no query string (`?api_key=...`) reaches any output of the server, at `-v 1` or `-v 2`;
- `//session/watch` and the other spellings of a route need that route's scope.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, Server, running_server

MODEL = "smollm2-135m-instruct"
CLIENT_KEY, ADMIN_KEY = "edge-client-key", "edge-admin-key"
SECRETS = ("QUERYSECRET123", "SESSIONSECRET456")

pytestmark = pytest.mark.timeout(300)


def _console_key(data_dir, scopes: list[str]) -> str:
    """A console key with `scopes`, written to the server's database as the console does."""
    code = f"from tests.access.helpers import console_key;print(console_key('edge', {scopes!r}))"
    env = {**os.environ, "PANTHEON_DATA_DIR": str(data_dir)}
    env["DJANGO_SETTINGS_MODULE"] = "pantheon_site.settings"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, smollm2_path):
    """A server with env keys (the client key has inference + sessions) and a console key
    that has the inference scope only."""
    data_dir = tmp_path_factory.mktemp("pantheon-edge")
    env = {"PANTHEON_API_KEY": CLIENT_KEY, "PANTHEON_ADMIN_API_KEY": ADMIN_KEY}
    with running_server(data_dir, {MODEL: smollm2_path}, **env) as srv:
        srv.inference_key = _console_key(data_dir, ["inference"])
        yield srv


# --- a raw client ---------------------------------------------------------------------------


class Answer:
    def __init__(self, raw: bytes, closed: bool):
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status_line = lines[0]
        self.status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.closed = closed
        self.raw = raw

    def error(self, status: int, type_: str) -> str:
        assert self.status == status, self.raw[:600]
        assert self.headers.get("content-type") == "application/json", self.raw[:600]
        body = json.loads(self.body)
        assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "code"}
        assert body["error"]["type"] == type_ and body["error"]["code"] is None, body
        return body["error"]["message"]


def send_raw(srv: Server, data: bytes, *, then: bytes = b"", timeout: float = 20) -> Answer:
    """Send `data`, read the answer until the server closes (or `timeout`), and only then
    try to send `then` (the rest of a body the server should not have waited for)."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks, closed = [], False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            chunks.append(chunk)
        if then and not closed:
            sock.sendall(then)
    return Answer(b"".join(chunks), closed)


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


CHAT = "/v1/chat/completions"
BIG = 300 * 1024 * 1024


# --- refused before the body is read ----------------------------------------------------


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(keyed):
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    answer = send_raw(keyed, head("POST", CHAT, {**headers, "Content-Length": str(BIG)}))
    assert "64 MiB" in answer.error(413, "request_too_large")
    assert answer.closed and answer.headers["connection"] == "close"


@pytest.mark.parametrize(
    "key",
    [None, "wrong-key", "pn_not-a-console-key"],  # no key; env keys decide; the database does
)
def test_a_large_body_without_a_valid_key_is_401_before_it_is_sent(keyed, key):
    headers = {"Content-Type": "application/json", "Content-Length": str(200 * 1024 * 1024)}
    if key:
        headers["x-api-key"] = key
    answer = send_raw(keyed, head("POST", CHAT, headers))
    answer.error(401, "invalid_api_key")
    assert answer.closed and answer.headers["www-authenticate"] == "Bearer"


def test_a_management_body_over_4_mib_is_413_even_for_an_admin(keyed):
    headers = {"x-api-key": ADMIN_KEY, "Content-Length": str(5 * 1024 * 1024)}
    answer = send_raw(keyed, head("POST", "/admin/models/load", headers))
    assert "4 MiB" in answer.error(413, "request_too_large")


def test_expect_100_continue_over_the_limit_gets_the_413_and_no_100(keyed):
    headers = {"x-api-key": ADMIN_KEY, "Content-Length": str(BIG), "Expect": "100-continue"}
    answer = send_raw(keyed, head("POST", CHAT, headers))
    answer.error(413, "request_too_large")
    assert b"100 Continue" not in answer.raw


def test_a_chunked_body_is_cut_at_the_limit(keyed):
    """5 MiB of chunks to a 4 MiB route and no final chunk: answered 413 without waiting
    for the end of the body."""
    headers = {"x-api-key": ADMIN_KEY, "Transfer-Encoding": "chunked"}
    chunk = b"x" * (1024 * 1024)
    body = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 5
    answer = send_raw(keyed, head("POST", "/session/release", headers) + body)
    answer.error(413, "request_too_large")


def test_a_console_key_with_a_large_body_is_served(keyed):
    """The database path lets a good key through: the paused body is then read whole."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})
    body = body[:-1] + " " * 150_000 + ', "max_tokens": 2}'
    response = httpx.post(
        keyed.url + CHAT,
        content=body.encode(),
        headers={"x-api-key": keyed.inference_key, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 2


# --- canonical routing ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["//session/watch", "/session//watch", "/v1/../session/watch", "/./session/watch",
     "/session%2Fwatch", "/%73ession/watch"],
)  # fmt: skip
def test_every_spelling_of_session_watch_needs_the_sessions_scope(keyed, path):
    url = path + "?session_id=probe&model=" + MODEL
    # Connection: close, so that the read ends with the answer (not send_raw's timeout).
    headers = {"x-api-key": keyed.inference_key, "Connection": "close"}
    answer = send_raw(keyed, head("GET", url, headers))
    assert "'sessions' scope" in answer.error(403, "insufficient_scope")


def test_a_root_path_header_does_not_reach_around_the_scope(keyed):
    headers = {"x-api-key": keyed.inference_key, "Daphne-Root-Path": "/x", "Connection": "close"}
    answer = send_raw(keyed, head("GET", "/x/session/watch?session_id=probe", headers))
    assert answer.status in (403, 404), answer.raw[:300]
    assert b"watch established" not in answer.raw


def test_a_double_slash_still_reaches_the_route(keyed):
    response = httpx.get(keyed.url + "//v1//models", headers={"x-api-key": CLIENT_KEY})
    assert response.status_code == 200 and response.json()["data"][0]["id"] == MODEL


# --- malformed requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n",  # bad request line
        b"GET /\x01 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # control byte in the target
        b"GET / HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",  # unknown version
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",  # bad header line
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n",  # bad header name
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        b"Content-Length: 2\r\n\r\n{}",  # repeated Content-Length
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: "
        + ADMIN_KEY.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # non-ASCII path (Daphne)
        b"GET /?q=\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # non-ASCII query (Daphne)
    ],
    ids=[
        "request-line", "control-byte", "version", "header-line", "header-name",
        "content-length", "two-lengths", "chunk-size", "huge-header", "path", "query",
    ],
)  # fmt: skip
def test_a_malformed_request_gets_the_json_error_shape(keyed, raw):
    answer = send_raw(keyed, raw)
    answer.error(400, "invalid_request_error")
    assert answer.headers["access-control-allow-origin"] == "*"


def test_the_server_still_answers_after_the_malformed_requests(keyed):
    assert httpx.get(keyed.url + "/", timeout=10).status_code == 200


# --- no query string in any output --------------------------------------------------------


def _probe_secrets(srv: Server) -> None:
    query = f"?api_key={SECRETS[0]}&session_id={SECRETS[1]}"
    httpx.get(srv.url + "/v1/models" + query, headers={"x-api-key": CLIENT_KEY}, timeout=10)
    httpx.get(srv.url + "/v1/models" + query, timeout=10)  # refused: 401
    httpx.get(srv.url + "/no/such/route" + query, timeout=10)
    send_raw(srv, head("POST", CHAT + query, {"Content-Length": str(BIG)}))
    send_raw(srv, b"GET /x" + query.encode() + b" HTTP/1.1 junk\r\n\r\n")


def _wait_for_access_lines(srv: Server, count: int) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = srv.log.read_text(errors="replace")
        if text.count('"route":') >= count:
            return text
        time.sleep(0.2)
    return srv.log.read_text(errors="replace")


def test_no_query_string_in_the_output_at_the_default_verbosity(keyed):
    _probe_secrets(keyed)
    text = _wait_for_access_lines(keyed, 5)
    assert '"route":"/v1/models"' in text  # our access log is there
    for secret in SECRETS:
        assert secret not in text, text[-3000:]


@pytest.mark.parametrize("verbosity", ["0", "2"])
def test_no_query_string_in_the_output_at_other_verbosities(tmp_path, smollm2_path, verbosity):
    env = {"PANTHEON_API_KEY": CLIENT_KEY}
    with running_server(
        tmp_path, {MODEL: smollm2_path}, daphne_args=["-v", verbosity], **env
    ) as srv:
        _probe_secrets(srv)
        text = _wait_for_access_lines(srv, 5)
    for secret in SECRETS:
        assert secret not in text, text[-3000:]
