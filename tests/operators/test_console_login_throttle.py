"""Failed console logins are throttled per remote address and per username (issue 36 item
9: 30 wrong passwords in 15 s went through): past PANTHEON_CONSOLE_LOGIN_MAX_FAILURES a
minute, /console/login/ answers 429 with Retry-After and a form error, checking no
password meanwhile; a successful login clears the counts."""

from __future__ import annotations

import pytest
from django.test import Client

from access import console_login

LOGIN = "/console/login/"
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_counts(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    console_login.FAILED.forget()
    yield
    console_login.FAILED.forget()


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("op", "op@example.com", "right-pw")


def attempt(password: str, *, username: str = "op", address: str = "10.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    return client.post(LOGIN, {"username": username, "password": password, "next": "/console/"})


def test_a_sixth_wrong_password_in_a_minute_is_429_and_checks_nothing(operator):
    for _ in range(5):
        wrong = attempt("wrong")
        assert wrong.status_code == 200  # the form again, with Django's own error
        assert b"Please enter the correct username and password" in wrong.content
    refused = attempt("wrong")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert b"Too many failed logins" in refused.content
    right = attempt("right-pw")  # even the right password: the guesser learns nothing
    assert right.status_code == 429


def test_counted_per_username_across_addresses(operator):
    for i in range(5):
        attempt("wrong", address=f"10.0.1.{i}")
    assert attempt("right-pw", address="10.0.2.1").status_code == 429


def test_counted_per_address_across_usernames(operator):
    for i in range(5):
        attempt("wrong", username=f"guess{i}")
    assert attempt("right-pw").status_code == 429
    assert attempt("right-pw", address="10.0.0.2").status_code == 302  # another address


def test_a_success_clears_the_counts_and_the_window_ends(operator, monkeypatch):
    for _ in range(4):
        attempt("wrong")
    ok = attempt("right-pw")
    assert ok.status_code == 302 and ok["Location"] == "/console/"
    for _ in range(4):
        assert attempt("wrong").status_code == 200  # counted from zero again

    now = [1000.0]
    monkeypatch.setattr(console_login.FAILED, "clock", lambda: now[0])
    console_login.FAILED.forget()
    for _ in range(5):
        attempt("wrong")
    assert attempt("wrong").status_code == 429
    now[0] += console_login.WINDOW_S + 1
    assert attempt("right-pw").status_code == 302


def test_zero_turns_the_throttle_off(operator, settings):
    settings.PANTHEON_CONSOLE_LOGIN_MAX_FAILURES = 0
    for _ in range(8):
        assert attempt("wrong").status_code == 200
    assert attempt("right-pw").status_code == 302
