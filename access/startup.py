"""Refuse to serve, unauthenticated, on a non-loopback address.

pantheon_site.asgi calls check_bind() right after django.setup(), before any model loads.
When the process is Daphne (`daphne ...`, `python -m daphne ...`, or Daphne's
`manage.py runserver`) and it binds an address other than loopback while no key is
configured, it says why on stderr and exits with status 2, unless
PANTHEON_ALLOW_UNAUTHENTICATED=1. A unix socket is local; an inherited file descriptor
(--fd) or an endpoint it cannot read is not refused (its address is unknown).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LOOPBACK, PUBLIC, UNKNOWN = "loopback", "public", "unknown"


def daphne_endpoints(argv: list[str]) -> list[str] | None:
    """The Twisted endpoint strings Daphne binds for this command line, or None when the
    process is not Daphne (or its arguments cannot be read)."""
    program = Path(argv[0]).name if argv else ""
    if program == "manage.py" or program.endswith("manage.py"):
        return _runserver_endpoints(argv[1:])
    is_daphne = program == "daphne" or (
        program == "__main__.py" and Path(argv[0]).parent.name == "daphne"
    )
    if not is_daphne:
        return None
    from daphne.cli import DEFAULT_HOST, DEFAULT_PORT, CommandLineInterface
    from daphne.endpoints import build_endpoint_description_strings

    parser = CommandLineInterface().parser

    def unreadable(message):
        raise ValueError(message)

    parser.error = unreadable  # Daphne itself says what is wrong with its arguments
    try:
        args, _ = parser.parse_known_args(argv[1:])
    except (ValueError, SystemExit):
        return None
    host, port = args.host, args.port
    # Daphne's own defaults (daphne.cli.CommandLineInterface.run).
    if not any([host, port is not None, args.unix_socket, args.file_descriptor is not None]):
        if not args.socket_strings:
            host, port = DEFAULT_HOST, DEFAULT_PORT
    elif host and port is None:
        port = DEFAULT_PORT
    elif port is not None and not host:
        host = DEFAULT_HOST
    return list(args.socket_strings) + build_endpoint_description_strings(
        host=host, port=port, unix_socket=args.unix_socket, file_descriptor=args.file_descriptor
    )


def _runserver_endpoints(args: list[str]) -> list[str] | None:
    """`manage.py runserver [addrport]` (Daphne's, as "daphne" is an installed app)."""
    if not args or args[0] != "runserver":
        return None
    ipv6 = any(a in ("-6", "--ipv6") for a in args[1:])
    positional = [a for a in args[1:] if not a.startswith("-")]
    host = "::1" if ipv6 else "127.0.0.1"
    if positional:
        addrport = positional[0]
        match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]+)):(?P<port>\d+)", addrport)
        if match:
            host = match.group("v6") or match.group("host")
        elif not addrport.isdigit():
            return None
    return [f"tcp:port=8000:interface={_escape(host)}"]


def _escape(value: str) -> str:
    return value.replace(":", r"\:")


def _endpoint_fields(endpoint: str) -> list[str]:
    """Split a Twisted endpoint string on unescaped colons, unescaping the parts."""
    parts = re.split(r"(?<!\\):", endpoint)
    return [p.replace("\\:", ":").replace("\\\\", "\\") for p in parts]


def endpoint_kind(endpoint: str) -> str:
    """LOOPBACK, PUBLIC (any non-loopback interface, or all of them) or UNKNOWN."""
    from access.guard import is_loopback

    fields = _endpoint_fields(endpoint)
    kind = fields[0].lower()
    if kind == "unix":
        return LOOPBACK  # a local socket file
    if kind not in ("tcp", "tcp6", "ssl"):
        return UNKNOWN  # fd:, systemd:, ...: the address is not ours to read
    interface = ""
    for field in fields[1:]:
        name, sep, value = field.partition("=")
        if sep and name == "interface":
            interface = value
    if not interface:
        return PUBLIC  # Twisted binds every interface
    return LOOPBACK if is_loopback(interface) else PUBLIC


def refusal(argv: list[str]) -> str | None:
    """The message explaining why this process may not start, or None."""
    endpoints = daphne_endpoints(argv)
    if not endpoints:
        return None
    public = [e for e in endpoints if endpoint_kind(e) == PUBLIC]
    if not public:
        return None
    from django.conf import settings

    if settings.PANTHEON_ALLOW_UNAUTHENTICATED:
        return None
    if _any_key_configured():
        return None
    return (
        f"pantheon: refusing to start: bound to a non-loopback address ({', '.join(public)}) "
        "with no API key configured, every route (operator routes and session export "
        "included) would be open to the network.\n"
        "Either set PANTHEON_API_KEY (client routes) and/or PANTHEON_ADMIN_API_KEY (every "
        "route), or create a key in the console (/console/), or set "
        "PANTHEON_ALLOW_UNAUTHENTICATED=1 to serve without a key on purpose. Binding "
        "127.0.0.1 (the default) needs neither.\n"
    )


def _any_key_configured() -> bool:
    from django.db import DatabaseError

    from access import keys

    try:
        return keys.any_key_configured()
    except DatabaseError:  # not migrated yet: no console keys
        return bool(keys.env_principals())


def check_bind(argv: list[str] | None = None) -> None:
    """Exit with status 2, saying why, when this process may not serve (see the module)."""
    message = refusal(sys.argv if argv is None else argv)
    if message:
        sys.stderr.write(message)
        sys.stderr.flush()
        raise SystemExit(2)
