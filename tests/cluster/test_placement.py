"""The router's decisions without processes: where a request goes (cluster/placement.py),
the /v1/models aggregate (cluster/views.model_rows), what a report must hold
(cluster/reports.py), that every client route of a serve instance is forwarded, and the
route a router's access log names for a forwarded request."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from cluster import placement
from cluster.asgi import is_instance_only
from cluster.dispatch import is_forwarded
from cluster.registry import Instance, ModelReport
from cluster.reports import parse_report
from cluster.views import model_rows
from pantheon_platform import routes
from pantheon_platform.errors import ApiError
from pantheon_site.access_log import route_of

# Answered by the router itself (cluster/urls.py); the operator routes (/admin/...) are
# reached on each instance.
ROUTER_OWN = re.compile(r"^/(|health|v1/models(/.*)?|models(/.*)?|openapi\.json)$")


def inst(name, free=4, slots=4, queued=0, capacity=4, window=8192, model="m", **kw):
    report = ModelReport(model, slots, free, queued, capacity, 0, "w1", window)
    return Instance(name, f"http://{name}", 1.0, 1.0, (report,), **kw)


def test_a_new_request_goes_to_the_replica_with_the_most_free_slots():
    a, b = inst("a", free=1), inst("b", free=3)
    assert placement.choose([a, b], "m", {}).id == "b"
    # What this router already sent there counts before the next heartbeat says so.
    assert placement.choose([a, b], "m", {"b": 4}).id == "a"


def test_requests_sent_at_once_alternate_over_equal_replicas():
    replicas, in_flight = [inst("a"), inst("b")], {}
    for _ in range(8):
        chosen = placement.choose(replicas, "m", in_flight).id
        in_flight[chosen] = in_flight.get(chosen, 0) + 1
    assert in_flight == {"a": 4, "b": 4}


def test_429_only_when_every_replica_is_full():
    full = inst("a", free=0, queued=4)
    assert placement.choose([full, inst("b", free=0, queued=3)], "m", {}).id == "b"
    with pytest.raises(ApiError) as refused:
        placement.choose([full, inst("b", free=0, queued=4)], "m", {})
    assert refused.value.status == 429 and refused.value.headers["Retry-After"]


def test_503_no_live_instance_when_none_routable_serves_the_model():
    for instances in ([], [inst("a", model="other")], [inst("a", draining=True)]):
        with pytest.raises(ApiError) as refused:
            placement.choose(instances, "m", {})
        assert (refused.value.status, refused.value.type) == (503, "no_live_instance")


def test_affinity_holds_only_while_its_instance_is_routable_and_serves_the_model():
    a = inst("a")
    assert placement.pinned([a], "a", "m") is a
    assert placement.pinned([a], "a", "other") is None
    assert placement.pinned([inst("a", stopping=True)], "a", "m") is None
    assert placement.pinned([a], "gone", "m") is None


def test_models_aggregate_live_free_slots_and_the_smallest_window():
    rows = model_rows([inst("a", free=1, window=4096), inst("b", free=2), inst("c", draining=True)])
    assert rows == [
        {
            "id": "m",
            "object": "model",
            "created": 0,
            "owned_by": "pantheon",
            "live": 2,
            "free_slots": 3,
            "context_window": 4096,
        }
    ]
    (row,) = model_rows([inst("a"), inst("b", window=None)])
    assert "context_window" not in row and row["live"] == 2


@pytest.mark.parametrize(
    "change, field",
    [
        ({"url": "ftp://x"}, "url"),
        ({"started_at": "now"}, "started_at"),
        ({"models": [{"id": "m", "free_slots": -1}]}, "free_slots"),
        ({"models": [{"id": "m", "context_window": 0}]}, "context_window"),
        ({"models": [{"id": ""}]}, "id"),
        ({"sessions": [{"session_id": "s", "namespace": "open"}]}, "model"),
        ({"id": "x" * 300}, "id"),
    ],
)
def test_a_malformed_report_is_a_400_naming_the_field(change, field):
    good = {"id": "a", "url": "http://a", "started_at": 1.0, "models": []}
    assert parse_report(good)["id"] == "a"
    with pytest.raises(ApiError) as refused:
        parse_report({**good, **change})
    assert refused.value.status == 400 and field in refused.value.message


def _paths(resolver, prefix=""):
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _paths(entry, route)
        elif isinstance(entry, URLPattern):
            yield "/" + re.sub(r"<[^>]+>", "x", route)


def test_every_client_route_of_a_serve_instance_is_forwarded():
    client_routes = [
        p
        for p in _paths(get_resolver())
        if "^" not in p and routes.scope_for(p) in (routes.INFERENCE, routes.SESSIONS)
    ]
    assert "/v1/chat/completions" in client_routes and "/api/chat" in client_routes
    missing = [
        p
        for p in client_routes
        if not ROUTER_OWN.match(p) and not is_forwarded(p) and not is_instance_only(p)
    ]
    assert missing == []
    assert is_instance_only("/v1/files/x") and is_instance_only("/v1/batches")
    assert is_forwarded("/session/watch")  # a Channels consumer, not in the URL table


def test_a_routers_access_log_names_a_forwarded_route_as_the_instances_do(settings):
    settings.PANTHEON_ROLE = "router"
    assert route_of("/v1/chat/completions") == "forwarded:/v1/chat/completions"
    assert route_of("/api/chat") == "forwarded:/api/chat"
    assert route_of("/session/watch") == "forwarded:/session/watch"
    items = route_of("/v1/responses/resp_1/input_items")
    assert items == "forwarded:/v1/responses/<str:response_id>/input_items"
    assert route_of("/api/anything-a-client-writes") == "forwarded:unmatched"  # never echoed
    settings.PANTHEON_ROLE = "serve"
    assert route_of("/v1/chat/completions") == "/v1/chat/completions"
