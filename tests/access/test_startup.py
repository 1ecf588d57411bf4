"""access.startup: which addresses a Daphne command line binds, and the refusal to serve
unauthenticated on a non-loopback one."""

from __future__ import annotations

import pytest

from access import keys
from access.models import ApiKey
from access.startup import LOOPBACK, PUBLIC, UNKNOWN, check_bind, daphne_endpoints, endpoint_kind
from tests.access.helpers import console_key

APP = "pantheon_site.asgi:application"
DAPHNE = "/srv/pantheon/.venv/bin/daphne"
DASH_M = "/srv/pantheon/.venv/lib/python3.11/site-packages/daphne/__main__.py"


@pytest.mark.parametrize(
    "argv, endpoints",
    [
        ([DAPHNE, APP], ["tcp:port=8000:interface=127.0.0.1"]),
        ([DAPHNE, "-b", "0.0.0.0", "-p", "9000", APP], ["tcp:port=9000:interface=0.0.0.0"]),
        ([DAPHNE, "--bind=::", APP], [r"tcp:port=8000:interface=\:\:"]),
        ([DAPHNE, "-p", "9000", APP], ["tcp:port=9000:interface=127.0.0.1"]),
        ([DASH_M, "-b", "10.1.2.3", APP], ["tcp:port=8000:interface=10.1.2.3"]),
        ([DAPHNE, "-u", "/run/pantheon.sock", APP], ["unix:/run/pantheon.sock"]),
        ([DAPHNE, "--fd", "3", APP], ["fd:fileno=3"]),
        (
            [DAPHNE, "-e", "tcp:port=8000:interface=0.0.0.0", APP],
            ["tcp:port=8000:interface=0.0.0.0"],
        ),
        (
            [DAPHNE, "-e", "unix:/run/a.sock", "-b", "127.0.0.1", APP],
            ["unix:/run/a.sock", "tcp:port=8000:interface=127.0.0.1"],
        ),
        (["manage.py", "runserver"], ["tcp:port=8000:interface=127.0.0.1"]),
        (["manage.py", "runserver", "0.0.0.0:8000"], ["tcp:port=8000:interface=0.0.0.0"]),
        (["manage.py", "runserver", "[::1]:8000"], [r"tcp:port=8000:interface=\:\:1"]),
        (["/usr/bin/pytest", "tests"], None),
        (["manage.py", "migrate"], None),
        ([DAPHNE], None),  # no application: Daphne itself refuses the command line
    ],
)
def test_daphne_endpoints(argv, endpoints):
    assert daphne_endpoints(argv) == endpoints


@pytest.mark.parametrize(
    "endpoint, kind",
    [
        ("tcp:port=8000:interface=127.0.0.1", LOOPBACK),
        ("tcp:port=8000:interface=127.8.9.10", LOOPBACK),
        (r"tcp6:port=8000:interface=\:\:1", LOOPBACK),
        ("tcp:port=8000:interface=localhost", LOOPBACK),
        ("unix:/run/pantheon.sock", LOOPBACK),
        ("tcp:port=8000:interface=0.0.0.0", PUBLIC),
        (r"tcp:port=8000:interface=\:\:", PUBLIC),
        ("tcp:port=8000:interface=192.168.1.5", PUBLIC),
        ("tcp:port=8000:interface=pantheon.example", PUBLIC),
        ("tcp:8000", PUBLIC),  # no interface: every interface
        ("ssl:port=443:privateKey=k.pem", PUBLIC),
        ("fd:fileno=3", UNKNOWN),
        ("systemd:domain=INET:index=0", UNKNOWN),
    ],
)
def test_endpoint_kind(endpoint, kind):
    assert endpoint_kind(endpoint) == kind


@pytest.fixture
def no_keys(settings, db):
    settings.PANTHEON_API_KEY = ""
    settings.PANTHEON_ADMIN_API_KEY = ""
    settings.PANTHEON_ALLOW_UNAUTHENTICATED = False


PUBLIC_BIND = [DAPHNE, "-b", "0.0.0.0", APP]


def test_a_public_bind_without_a_key_refuses_to_start_and_says_why(no_keys, capsys):
    with pytest.raises(SystemExit) as exited:
        check_bind(PUBLIC_BIND)
    assert exited.value.code == 2
    message = capsys.readouterr().err
    assert "refusing to start" in message and "0.0.0.0" in message
    assert "PANTHEON_API_KEY" in message and "PANTHEON_ALLOW_UNAUTHENTICATED=1" in message


@pytest.mark.parametrize(
    "argv",
    [
        [DAPHNE, APP],
        [DAPHNE, "-b", "127.0.0.1", APP],
        [DAPHNE, "-u", "/run/p.sock", APP],
        [DAPHNE, "--fd", "3", APP],
        ["/usr/bin/pytest"],
    ],
)
def test_loopback_and_unknown_binds_start_without_a_key(no_keys, argv):
    check_bind(argv)


def test_a_public_bind_starts_with_a_key_or_when_told(no_keys, settings):
    settings.PANTHEON_API_KEY = "k"
    check_bind(PUBLIC_BIND)
    settings.PANTHEON_API_KEY = ""
    settings.PANTHEON_ADMIN_API_KEY = "a"
    check_bind(PUBLIC_BIND)
    settings.PANTHEON_ADMIN_API_KEY = ""
    settings.PANTHEON_ALLOW_UNAUTHENTICATED = True
    check_bind(PUBLIC_BIND)


def test_a_public_bind_starts_with_an_active_console_key(no_keys):
    console_key("ci", ["inference"])
    check_bind(PUBLIC_BIND)
    ApiKey.objects.update(revoked=True)
    keys.forget_cache()
    with pytest.raises(SystemExit):
        check_bind(PUBLIC_BIND)
