"""Load progress: the real loader reports each step (phase, tensors, bytes); the runtime
keeps the latest, GET /admin/models and GET / show it while the model loads, the console
draws a bar, and the log gets a line per phase, tenth or second.

A progress hook that waits on the test holds the (real) load at each step, so the test
reads every intermediate report through the routes without timing anything."""

from __future__ import annotations

import logging
import queue
import re
import threading
import time

import pytest

from engine.loading.progress import (
    CACHE_WRITE,
    DEQUANTISE,
    MAP,
    PARSE,
    LoadProgress,
    ProgressLog,
)
from engine.serving.service import ModelService
from engine.types import ModelConfig
from operators.models import ServedModel
from pantheon_platform.runtime import LoadSpec

CHANGELIST = "/console/operators/servedmodel/"
GATE_TIMEOUT_S = 120  # a held load goes on by itself after this (a test that never came back)


class Gate:
    """A progress hook that hands each report to the test and waits for its go."""

    def __init__(self):
        self.reports: queue.Queue[LoadProgress] = queue.Queue()
        self._go = threading.Semaphore(0)
        self._open = threading.Event()

    def __call__(self, name: str, progress: LoadProgress) -> None:
        self.reports.put(progress)
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not self._go.acquire(timeout=0.05):
            # The test failed (or was stopped by its timeout): let the load finish.
            if self._open.is_set() or time.monotonic() > deadline:
                return

    def open(self) -> None:
        self._open.set()

    def go(self) -> None:
        self._go.release()


def start_load(rt, spec: LoadSpec) -> tuple[threading.Thread, list]:
    errors: list = []

    def run():
        try:
            rt.load(spec)
        except Exception as exc:  # reported by the test's join
            errors.append(exc)

    # A daemon: a load left held by a test that was stopped never keeps pytest from exiting.
    thread = threading.Thread(target=run, name="test-load", daemon=True)
    thread.start()
    return thread, errors


def step_through(gate: Gate, thread: threading.Thread, check) -> list[LoadProgress]:
    """Every report of one load, `check(progress)` run while the load waits on it, until
    the loading thread has ended."""
    seen = []
    while True:
        try:
            progress = gate.reports.get(timeout=0.05)
        except queue.Empty:
            if not thread.is_alive():
                return seen
            continue
        seen.append(progress)
        try:
            check(progress)
        except BaseException:
            gate.open()
            thread.join(60)
            raise
        gate.go()


def test_admin_models_and_health_show_each_step_of_a_load(rt, model_dir, api):
    gate = Gate()
    rt.add_progress_hook(gate)
    thread, errors = start_load(rt, LoadSpec.of(name="tiny", path="tiny.gguf", max_sessions=2))

    def check(progress: LoadProgress) -> None:
        rows = {r["id"]: r for r in api.get("/admin/models").json()["data"]}
        row = rows["tiny"]
        assert row["status"] == "loading" and row["object"] == "model"
        assert row["path"] == str(model_dir / "tiny.gguf") and row["max_sessions"] == 2
        assert row["progress"] == progress.as_dict()
        health = api.get("/").json()
        assert health["models"]["tiny"] == "loading"
        assert health["progress"] == {"tiny": progress.as_dict()}

    seen = step_through(gate, thread, check)
    thread.join(60)
    assert not thread.is_alive() and not errors, errors

    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions), fractions  # never goes back
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert len({f for f in fractions}) > 5  # it moved step by step, not in one jump
    assert seen[0].phase == PARSE
    tensor_phases = {p.phase for p in seen if p.tensors_done}
    assert tensor_phases and tensor_phases <= {MAP, DEQUANTISE, CACHE_WRITE}
    done = [p.tensors_done for p in seen]
    assert done == sorted(done) and done[-1] == seen[-1].tensors_total > 10
    assert seen[-1].bytes_done == seen[-1].bytes_total > 0

    # Loaded: the row is the instance's, without progress; GET / drops the key.
    (row,) = api.get("/admin/models").json()["data"]
    assert row["status"] == "loaded" and "progress" not in row
    assert "progress" not in api.get("/").json()


def test_the_bytes_are_the_tensors_bytes_in_the_file(tmp_path, settings):
    """bytes_total is what the file's tensors take (its size less header and padding)."""
    from tests.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / "t.gguf", n_layer=3)
    seen: list[LoadProgress] = []
    svc = ModelService.load(ModelConfig(name="t", path=str(path)), on_progress=seen.append)
    svc.close()
    size = path.stat().st_size
    total = seen[-1].bytes_total
    assert 0.9 * size < total < size
    assert seen[-1].tensors_total == len(svc.gguf.tensors)


def test_a_first_load_dequantises_and_writes_the_cache_a_second_maps_it(tmp_path, model_dir):
    config = ModelConfig(
        name="tiny",
        path=str(model_dir / "tiny.gguf"),
        weight_cache_dir=str(tmp_path / "cache"),
        backend="numpy",  # every tensor becomes float32: the cache holds all of them
    )
    runs = []
    for _ in range(2):
        seen: list[LoadProgress] = []
        ModelService.load(config, on_progress=seen.append).close()
        fractions = [p.fraction for p in seen]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
        runs.append([p.phase for p in seen])
    first, second = runs
    assert first[0] == PARSE and DEQUANTISE in first and first[-1] == CACHE_WRITE
    assert MAP not in first
    assert second[0] == PARSE and set(second[1:]) == {PARSE, MAP} and CACHE_WRITE not in second


@pytest.mark.django_db(transaction=True)
def test_the_console_draws_a_progress_bar_while_a_model_loads(db_rt, model_dir, console_user):
    from django.test import Client

    client = Client()
    client.force_login(console_user)
    ServedModel.objects.create(name="tiny", path=str(model_dir / "tiny.gguf"))
    gate = Gate()
    db_rt.add_progress_hook(gate)
    thread, errors = start_load(db_rt, LoadSpec.of(name="tiny", path="tiny.gguf"))
    values = []

    def check(progress: LoadProgress) -> None:
        if not progress.tensors_done or progress.fraction == 1.0:
            return
        page = client.get(CHANGELIST).content.decode()
        (value,) = re.findall(r'<progress class="load-progress" max="100" value="(\d+)">', page)
        assert int(value) == round(100 * progress.fraction)
        values.append(int(value))

    step_through(gate, thread, check)
    thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert len(values) > 3 and values == sorted(values) and values[0] < values[-1]
    assert "load-progress" not in client.get(CHANGELIST).content.decode()


@pytest.fixture
def console_user(django_user_model):
    return django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")


class Lines(logging.Handler):
    """The messages of the loading log, however the test settings route it."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.logger = logging.getLogger("pantheon.engine.loading")

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self._level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)


def test_the_log_has_a_line_per_phase_tenth_or_second():
    now = [0.0]
    line = ProgressLog("m", clock=lambda: now[0])
    with Lines() as log:
        line(LoadProgress(PARSE))
        for done in range(1, 101):  # 100 equal tensors, 10 ms apart
            now[0] += 0.01
            line(LoadProgress(DEQUANTISE, done, 100, done * 1000, 100_000))
        now[0] += 5
        line(LoadProgress(CACHE_WRITE, 100, 100, 100_000, 100_000))
    lines = log.lines
    assert lines[0].startswith("loading m: parse")
    dequantise = [x for x in lines if " dequantise " in x]
    # One per tenth (the first tensor opens the phase), never one per tensor.
    assert 10 <= len(dequantise) <= 12, lines
    assert dequantise[-1].startswith("loading m: dequantise 100% (100/100 tensors")
    assert lines[-1].startswith("loading m: cache_write 100%")

    slow = ProgressLog("s", clock=lambda: now[0])
    with Lines() as log:
        for done in range(1, 6):  # 1% a step, 1.5 s apart: a line each second
            now[0] += 1.5
            slow(LoadProgress(MAP, done, 100, done, 100))
        now[0] += 0.5  # within the second and under a tenth: no line
        slow(LoadProgress(MAP, 6, 100, 6, 100))
    assert len(log.lines) == 5, log.lines
