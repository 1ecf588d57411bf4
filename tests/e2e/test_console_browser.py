"""An operator logs into the console (/console/) in headless Chromium, loads a model file
picked from the available list, and clients see it in /v1/models. The real server,
Playwright driving Debian's chromium (never a downloaded browser).

Skipped without /usr/bin/chromium or the playwright package, unless
PANTHEON_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, running_server
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.timeout(300)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
USER, PASSWORD = "operator", "a-test-password-0123"


def require_browser() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not missing:
        return
    reason = "browser test needs " + " and ".join(missing)
    if os.environ.get("PANTHEON_REQUIRE_BROWSER") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def create_operator(data_dir: Path) -> None:
    """The documented way to make the first operator account (no default password)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
        "PANTHEON_DATA_DIR": str(data_dir),
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
    }
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput"]
        + ["--username", USER, "--email", "operator@example.com"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )


def test_an_operator_loads_a_model_from_the_console(tmp_path):
    require_browser()
    from playwright.sync_api import sync_playwright

    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    write_tiny_llama(models / "other.gguf", seed=1)  # available, not loaded
    data = tmp_path / "data"
    data.mkdir()

    with running_server(data, {"tiny": models / "tiny.gguf"}) as srv:
        create_operator(data)
        # The console is styled: the admin's static files are served too.
        assert httpx.get(srv.url + "/static/admin/css/base.css").status_code == 200

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(srv.url + "/console/")
                assert "/console/login/" in page.url
                page.fill("#id_username", USER)
                page.fill("#id_password", PASSWORD)
                page.click("input[type=submit]")
                page.wait_for_selector("#site-name")
                assert "Model configs" in page.content()

                page.click("text=Model configs")
                page.click("text=Load a model file")
                options = page.locator("#id_file option").all_text_contents()
                other = str(models.resolve() / "other.gguf")
                assert any(o.startswith(other) for o in options), options
                page.select_option("#id_file", value=other)
                page.fill("#id_name", "from-console")
                page.click("#load-file-form input[type=submit]")
                page.wait_for_selector("text=Loaded from-console.")
                assert page.url.endswith("/console/operators/servedmodel/")
                row = page.locator("tr", has_text="from-console").inner_text()
                assert "loaded" in row
            finally:
                browser.close()

        listed = httpx.get(srv.url + "/v1/models").json()["data"]
        assert sorted(m["id"] for m in listed) == ["from-console", "tiny"]
