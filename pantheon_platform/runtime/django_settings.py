"""What the runtime reads from the Django settings and the live settings: the models
configured at start, the options a load defaults to, the queue limits every model shares
(pushed into the loaded models when an operator changes them), and a test hook."""

from __future__ import annotations

import logging
import time

from engine import ModelConfig
from pantheon_platform import live_settings

log = logging.getLogger("pantheon.runtime")


def setting(name: str, default):
    from django.conf import settings

    return getattr(settings, name, default)


def configured_models() -> list[ModelConfig]:
    """settings.PANTHEON_MODELS as engine configs."""
    from django.conf import settings

    return [ModelConfig(**spec) for spec in settings.PANTHEON_MODELS]


def default_options() -> dict[str, int]:
    """The per-model options a load gets when the request leaves them at 0 / out."""
    defaults = dict(
        setting(
            "PANTHEON_MODEL_DEFAULTS",
            {"ctx_cap": 0, "max_sessions": 4, "max_concurrent": 0, "reasoning_budget": 0},
        )
    )
    defaults["reasoning_budget"] = live_settings.value("reasoning_budget")
    return defaults


def queue_limits() -> dict:
    """The queue's depth and timeout now (the runtime config, else the environment)."""
    return {
        "queue_depth": live_settings.value("queue_depth"),
        "queue_timeout_s": live_settings.value("queue_timeout_s"),
    }


def push_queue_limits(changed: set[str], instances) -> None:
    """A changed queue depth or timeout reaches every loaded model at once: the next
    request is admitted (or refused) by it. (Registered by the package, which owns the
    registry: see pantheon_platform/runtime/__init__.py.)"""
    if not changed & {"queue_depth", "queue_timeout_s"}:
        return
    limits = queue_limits()
    for info in instances:
        set_limits = getattr(info.svc, "set_queue_limits", None)  # tests' stand-ins lack it
        if set_limits is not None:
            set_limits(limits["queue_depth"], limits["queue_timeout_s"])


def hold_load_for_test(name: str) -> None:
    """Test hook (PANTHEON_TEST_LOAD_DELAY_MS, default 0: no effect): hold a load between
    its weights being in memory and its record, so a test can kill the server mid-load."""
    delay_ms = setting("PANTHEON_TEST_LOAD_DELAY_MS", 0)
    if delay_ms > 0:
        log.warning("test hook: holding the load of %s for %d ms", name, delay_ms)
        time.sleep(delay_ms / 1000)
