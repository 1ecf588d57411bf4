"""Throttling of failed console logins (the Django admin at /console/login/).

A password guesser gets PANTHEON_CONSOLE_LOGIN_MAX_FAILURES failed logins (default 5)
per WINDOW_S seconds, counted both per remote address and per username, so neither many
names from one address nor one name from many addresses gets further. Past it, the
login form answers 429 with Retry-After and a form error saying how long to wait, and
checks no password at all (a right one included: it must not tell the guesser anything).
A successful login clears its address's and its username's failures. 0 turns the
throttle off.

The counts live in this process (a bounded table, oldest entries dropped first): the
server is one Daphne process, and a restart forgetting them is harmless.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

WINDOW_S = 60.0
DEFAULT_MAX_FAILURES = 5
MAX_TRACKED = 4096  # addresses and usernames remembered at once
THROTTLED_ATTR = "pantheon_login_wait_s"  # set on the request for the view's 429


class FailedLogins:
    """Recent failure times per key ("addr:<ip>", "user:<name>"), thread safe."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, keys: list[str], limit: int) -> float:
        """Seconds until every key is under `limit` failures in the window (0: now)."""
        now = self.clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                times = self._recent_locked(key, now)
                if len(times) >= limit:
                    wait = max(wait, times[-limit] + WINDOW_S - now)
        return wait

    def fail(self, keys: list[str]) -> None:
        now = self.clock()
        with self._lock:
            for key in keys:
                times = self._recent_locked(key, now)
                times.append(now)
                self._failures[key] = times
                self._failures.move_to_end(key)
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)

    def clear(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)

    def forget(self) -> None:
        """Drop every count (tests)."""
        with self._lock:
            self._failures.clear()

    def _recent_locked(self, key: str, now: float) -> deque[float]:
        times = self._failures.get(key, deque())
        while times and times[0] <= now - WINDOW_S:
            times.popleft()
        if not times:
            self._failures.pop(key, None)
        return times


FAILED = FailedLogins()


def max_failures() -> int:
    return int(getattr(settings, "PANTHEON_CONSOLE_LOGIN_MAX_FAILURES", DEFAULT_MAX_FAILURES))


def _keys(request, username: str | None) -> list[str]:
    keys = [f"addr:{request.META.get('REMOTE_ADDR') or 'unknown'}"] if request else []
    if username:
        keys.append(f"user:{username.strip().lower()[:150]}")
    return keys


class ThrottledLoginForm(AdminAuthenticationForm):
    """The console's login form, refusing while the address or the username is over its
    failures, and counting each failure."""

    def clean(self):
        limit = max_failures()
        if limit <= 0:
            return super().clean()
        keys = _keys(self.request, self.cleaned_data.get("username"))
        wait = FAILED.wait_s(keys, limit)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            if self.request is not None:
                setattr(self.request, THROTTLED_ATTR, seconds)
            raise ValidationError(
                f"Too many failed logins from this address or for this username: wait "
                f"{seconds} s and try again.",
                code="throttled",
            )
        try:
            cleaned = super().clean()
        except ValidationError:
            FAILED.fail(keys)
            raise
        FAILED.clear(keys)
        return cleaned


def throttled(login_view):
    """Wrap the admin site's login view: a throttled attempt answers 429 with
    Retry-After (the page still shows the form and its error)."""

    def view(request, *args, **kwargs):
        response = login_view(request, *args, **kwargs)
        wait = getattr(request, THROTTLED_ATTR, None)
        if wait is not None:
            response.status_code = 429
            response["Retry-After"] = str(wait)
        return response

    return view
