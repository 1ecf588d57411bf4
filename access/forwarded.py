"""Tenancy through a router (cluster/dispatch.py): whose namespace a forwarded request is
in, and how an instance knows the router, not a client, named it.

A router's caller's namespace ("key:3", "env:client") names a key of the router's own
database, and an instance's own key #3 is "key:3" too. So the router forwards a namespace
of its own kind, `cluster:` and an HMAC of the caller's namespace under the cluster's
shared secret (PANTHEON_CLUSTER_SECRET): unique to the deployment, never equal to an
instance-local one. The open namespace (no key anywhere) stays open. The router proves it
named the namespace with a second HMAC (X-Pantheon-Namespace-Proof); an instance honours
X-Pantheon-Namespace only with that proof, made with its own copy of the secret, so no
client (any key, or none) can step into another tenant's namespace.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from engine import OPEN

NAMESPACE_HEADER = b"x-pantheon-namespace"
PROOF_HEADER = b"x-pantheon-namespace-proof"
NAMESPACE_MAX = 256
CLUSTER_PREFIX = "cluster:"


def _mac(purpose: str, text: str, secret: str | None = None) -> str:
    key = (settings.PANTHEON_CLUSTER_SECRET if secret is None else secret).encode()
    return hmac.new(key, f"{purpose}\n{text}".encode(), hashlib.sha256).hexdigest()


def cluster_namespace(local: str, secret: str | None = None) -> str:
    """The namespace a router's caller has on the instances (`secret`: the settings')."""
    if local == OPEN:
        return OPEN
    return CLUSTER_PREFIX + _mac("namespace", local, secret)[:32]


def proof(namespace: str, secret: str | None = None) -> str:
    """What a router sends with X-Pantheon-Namespace: only a holder of the secret makes it."""
    return _mac("forwarded", namespace, secret)


def forwarded_namespace(headers: dict[bytes, str]) -> str | None:
    """The namespace a router named, when it proved it did (else None: the header is a
    client's and is ignored). `headers`: lower-case names to values."""
    named = headers.get(NAMESPACE_HEADER)
    sent = headers.get(PROOF_HEADER)
    if not named or not sent or len(named) > NAMESPACE_MAX:
        return None
    if not settings.PANTHEON_CLUSTER_SECRET:  # not in a cluster: no router to trust
        return None
    if not hmac.compare_digest(sent.encode(), proof(named).encode()):
        return None
    return named
