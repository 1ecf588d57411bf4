"""sessions.persistence: sessions spilled to disk are restored whole into a model (same
tokens, and the next turn resumes from the restored KV), files that fail validation are
moved aside with a reason and never half-loaded, writes are atomic. Plus the hooks that
drive it: the runtime's load hook and the shutdown's before-exit hook.

The real SmolLM2 service is shared by the whole test session: every session a test
creates is released afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from pathlib import Path

import pytest

from engine.serving import session_blob, session_blob_read
from engine.types import GenerationRequest, SamplingParams, TokenEvent
from pantheon_platform import shutdown
from pantheon_platform.runtime import LoadSpec
from sessions import persistence, records
from sessions.models import SessionRecord
from sessions.persistence import REJECTED_DIR, SUFFIX, file_stem, restore, spill

PIRATE = [
    {"role": "system", "content": "You are a pirate."},
    {"role": "user", "content": "Where is the treasure buried?"},
]
CHEF = [
    {"role": "system", "content": "You are a chef who loves soup."},
    {"role": "user", "content": "What should I cook tonight?"},
]
_ids = itertools.count()


def turn(svc, prompt, session_id=None, max_tokens=4):
    """One greedy generation: (sampled ids, usage)."""

    async def run():
        ids, usage = [], None
        request = GenerationRequest(
            f"persist-{next(_ids)}",
            tuple(prompt),
            SamplingParams(temperature=0, max_tokens=max_tokens),
            session_id=session_id,
        )
        async for event in svc.generate(request):
            if isinstance(event, TokenEvent):
                ids.extend(event.token_ids)
            else:
                usage = event.usage
        return ids, usage

    return asyncio.run(run())


def held(svc) -> dict[str, list[tuple[int, ...]]]:
    """{session id: its conversations' tokens, least recently used first}."""
    out: dict[str, list] = {}
    for session_id, conv, _, _ in svc.sessions.conversations():
        out.setdefault(session_id, []).append(conv.tokens)
    return out


def release_all(svc) -> None:
    for info in svc.session_info():
        svc.release_session(info.session_id)


@pytest.fixture
def svc(smollm2_service):
    yield smollm2_service
    release_all(smollm2_service)


@pytest.fixture
def sibling(smollm2_service):
    """Another instance over the same weights: the model after a restart."""

    made = []

    def make(**options):
        config = dataclasses.replace(smollm2_service.config, name="restored", **options)
        made.append(smollm2_service.sibling(config))
        return made[-1]

    yield make
    for s in made:
        s.close()


def spill_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*" + SUFFIX))


def test_spilled_sessions_restore_whole_and_the_next_turn_resumes_from_them(svc, sibling, tmp_path):
    turn(svc, svc.encode_chat(PIRATE), "persist-a")
    turn(svc, svc.encode_chat(CHEF), "persist-a")  # a second conversation of the id
    turn(svc, svc.encode_chat(CHEF), "persist-b")
    before = held(svc)
    assert len(before["persist-a"]) == 2 and len(before["persist-b"]) == 1

    folder = tmp_path / "spill"
    assert spill(svc, folder) == {"persist-a": 2, "persist-b": 1}
    names = os.listdir(folder)
    assert spill_files(folder) == sorted(names)  # no temp file left
    assert sorted(names) == sorted(
        [f"{file_stem('persist-a')}-0{SUFFIX}", f"{file_stem('persist-a')}-1{SUFFIX}"]
        + [f"{file_stem('persist-b')}-0{SUFFIX}"]
    )
    assert not any("persist" in name for name in names)  # the name never shows the id
    header = session_blob_read.read_header((folder / names[0]).read_bytes())
    assert header["session_id"] in {"persist-a", "persist-b"}

    restored = sibling()
    report = restore(restored, folder, "restored")
    assert report.rejected == [] and report.restored == {"persist-a": 2, "persist-b": 1}
    assert held(restored) == before  # same tokens, same order
    assert spill_files(folder) == sorted(names)  # kept: a kill now still finds them

    # Continue a restored conversation: every held token comes from the restored KV, and
    # the answer is the one a cold run of the same prompt gives.
    (history,) = before["persist-b"]
    prompt = [*history, *svc.tokenizer.encode(" Then")]
    resumed, usage = turn(restored, prompt, "persist-b")
    assert usage.cached_tokens == len(history)
    restored.clear_prefix_cache().result(30)  # that turn's KV, kept in its slot
    cold, cold_usage = turn(restored, prompt)
    assert cold_usage.cached_tokens == 0 and resumed == cold


def test_files_that_fail_validation_are_moved_aside_and_the_good_ones_restored(
    svc, sibling, tmp_path, caplog
):
    turn(svc, svc.encode_chat(PIRATE), "good")
    turn(svc, svc.encode_chat(CHEF), "source")
    folder = tmp_path / "spill"
    spill(svc, folder)
    (folder / f"{file_stem('source')}-0{SUFFIX}").unlink()

    blob = svc.export_session("source").blob
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2] ^= 0xFF
    conv = svc.sessions.latest("source")
    other_layout = dataclasses.replace(svc.kv_layout, weights_version="0" * 16)
    other_weights = session_blob.encode(
        session_blob.SessionSnapshot(other_layout, conv.tokens, conv.k, conv.v, "other")
    )
    bad = {
        f"{file_stem('corrupt')}-0{SUFFIX}": (bytes(corrupt), "checksum does not match"),
        f"{file_stem('truncated')}-0{SUFFIX}": (blob[:-100], "truncated"),
        f"{file_stem('other')}-0{SUFFIX}": (other_weights, "WeightsVersionMismatch"),
        f"{'0' * 24}-0{SUFFIX}": (b"not a session blob", "not a session blob"),
    }
    for name, (data, _) in bad.items():
        (folder / name).write_bytes(data)

    restored = sibling()
    with caplog.at_level(logging.WARNING, logger="pantheon.sessions"):
        report = restore(restored, folder, "restored")

    assert report.restored == {"good": 1}
    assert set(held(restored)) == {"good"}  # nothing of the bad files was installed
    assert spill_files(folder) == [f"{file_stem('good')}-0{SUFFIX}"]
    rejected = folder / REJECTED_DIR
    assert sorted(p.name for p in rejected.glob("*" + SUFFIX)) == sorted(bad)
    for name, (_, why) in bad.items():
        reason = (rejected / (name + ".reason.txt")).read_text()
        assert why in reason and "model: restored" in reason, reason
        logged = [r.getMessage() for r in caplog.records if name in r.getMessage()]
        assert len(logged) == 1 and "restored" in logged[0] and why in logged[0]
    assert {r.session_id for r in report.rejected} == {None, "other"}  # readable headers


def test_sessions_past_the_model_s_capacity_are_rejected_least_recent_first(svc, sibling, tmp_path):
    turn(svc, svc.encode_chat(PIRATE), "older")
    turn(svc, svc.encode_chat(CHEF), "newer")
    folder = tmp_path / "spill"
    spill(svc, folder)

    restored = sibling(max_sessions=1)
    report = restore(restored, folder, "restored")
    assert set(report.restored) == {"newer"}
    (refused,) = report.rejected
    assert refused.session_id == "older" and "SessionCapacity" in refused.reason
    assert refused.file.parent.name == REJECTED_DIR


def test_writes_are_atomic_and_stray_temp_files_are_removed(svc, sibling, tmp_path, monkeypatch):
    folder = tmp_path / "spill"
    folder.mkdir()
    target = folder / "file.pnkv"
    persistence.write_atomic(target, b"old")
    assert os.listdir(folder) == ["file.pnkv"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(persistence.os, "replace", broken_replace)
        with pytest.raises(OSError):
            persistence.write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(folder) == ["file.pnkv"]

    # A crash mid-write leaves a temp file; a start removes it. A spill replaces what the
    # folder held with exactly the sessions it writes.
    stale = folder / f".{file_stem('x')}-0{SUFFIX}.tmp-abc123"
    stale.write_bytes(b"half a blob")
    turn(svc, svc.encode_chat(PIRATE), "kept")
    spill(svc, folder)
    assert os.listdir(folder) == [f"{file_stem('kept')}-0{SUFFIX}"]

    stale.write_bytes(b"half a blob")
    report = restore(sibling(), folder, "restored")
    assert report.restored == {"kept": 1} and report.rejected == []
    assert os.listdir(folder) == [f"{file_stem('kept')}-0{SUFFIX}"]  # the temp file went


# --- the hooks ----------------------------------------------------------------------------


def test_a_load_hook_runs_after_the_load_before_the_model_is_routable(rt, model_dir, caplog):
    calls = []

    def hook(name, svc):
        calls.append((name, svc, name in rt.services()))

    def broken(name, svc):
        raise RuntimeError("hook trouble")

    rt.add_load_hook(broken)
    rt.add_load_hook(hook)
    with caplog.at_level(logging.ERROR, logger="pantheon.runtime"):
        info = rt.load(LoadSpec.of(name="chat", path="tiny.gguf"))
    assert calls == [("chat", info.svc, False)]
    assert set(rt.services()) == {"chat"}  # a failing hook does not fail the load
    assert "hook trouble" in caplog.text


def test_before_exit_hooks_run_after_the_drain_before_the_reactor_stops(rt, monkeypatch, settings):
    settings.PANTHEON_DRAIN_TIMEOUT = 1
    monkeypatch.setattr(shutdown, "_before_exit", [])
    monkeypatch.setattr(shutdown, "FLUSH_GRACE_S", 0)
    events = []

    class Reactor:
        def stop(self):
            events.append("stop")

        def callFromThread(self, fn):  # noqa: N802 (Twisted's name)
            fn()

    def broken():
        raise RuntimeError("spill trouble")

    shutdown.add_before_exit(broken)
    shutdown.add_before_exit(lambda: events.append(("hook", shutdown.draining())))
    try:
        shutdown._drain_then_stop(Reactor())
    finally:
        shutdown._draining.clear()
    assert events == [("hook", True), "stop"]


def test_sessions_survive_an_unload_and_reload_through_the_hooks(
    rt, model_dir, db, settings, tmp_path
):
    """The whole cycle on a tiny model, in-process: spill at exit marks the rows
    "spilled", the next load restores the files and the rows are live again."""
    settings.DATA_DIR = tmp_path / "data"
    rt.add_load_hook(persistence.restore_on_load)
    svc = rt.load(LoadSpec.of(name="chat", path="tiny.gguf")).svc
    turn(svc, [1, 2, 3, 4, 5], "tiny-session", max_tokens=3)
    (history,) = held(svc)["tiny-session"]
    assert records.sync_now()
    assert SessionRecord.objects.get(session_id="tiny-session").state == "live"

    try:
        persistence.spill_on_exit()
    finally:
        records.thaw()
    row = SessionRecord.objects.get(model_name="chat", session_id="tiny-session")
    assert row.state == "spilled" and row.tokens == len(history)
    folder = persistence.model_folder(persistence.sessions_root(), "chat")
    assert spill_files(folder) == [f"{file_stem('tiny-session')}-0{SUFFIX}"]

    rt.unload("chat")
    assert records.sync_now()  # the model is gone: its spilled row waits for it
    assert SessionRecord.objects.get(session_id="tiny-session").state == "spilled"

    svc = rt.load(LoadSpec.of(name="chat", path="tiny.gguf")).svc
    assert held(svc) == {"tiny-session": [history]}
    assert spill_files(folder) == [f"{file_stem('tiny-session')}-0{SUFFIX}"]
    _, usage = turn(svc, [*history, 7], "tiny-session", max_tokens=1)
    assert usage.cached_tokens == len(history)
    assert records.sync_now()
    assert SessionRecord.objects.get(session_id="tiny-session").state == "live"


def test_a_rejected_spill_file_marks_its_row_rejected(rt, model_dir, db, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    rt.add_load_hook(persistence.restore_on_load)
    svc = rt.load(LoadSpec.of(name="chat", path="tiny.gguf")).svc
    turn(svc, [1, 2, 3, 4, 5], "doomed", max_tokens=3)
    try:
        persistence.spill_on_exit()
    finally:
        records.thaw()
    rt.unload("chat")
    folder = persistence.model_folder(persistence.sessions_root(), "chat")
    (path,) = folder.glob("*" + SUFFIX)
    path.write_bytes(path.read_bytes()[:-1])  # truncated

    rt.load(LoadSpec.of(name="chat", path="tiny.gguf"))
    assert (folder / REJECTED_DIR / path.name).is_file()
    assert records.sync_now()
    row = SessionRecord.objects.get(session_id="doomed")
    assert row.state == "rejected" and "truncated" in row.detail


def test_an_unloaded_model_s_sessions_come_back_with_its_next_load(
    rt, model_dir, db, settings, tmp_path
):
    """Unload (or an LRU eviction) spills through the unload hook: nothing to lose."""
    settings.DATA_DIR = tmp_path / "data"
    rt.add_load_hook(persistence.restore_on_load)
    rt.add_unload_hook(persistence.spill_on_unload)
    svc = rt.load(LoadSpec.of(name="chat", path="tiny.gguf")).svc
    turn(svc, [1, 2, 3, 4, 5], "kept", max_tokens=3)
    (history,) = held(svc)["kept"]
    rt.unload("chat")
    assert SessionRecord.objects.get(session_id="kept").state == "spilled"
    svc = rt.load(LoadSpec.of(name="chat", path="tiny.gguf")).svc
    assert held(svc) == {"kept": [history]}
    _, usage = turn(svc, [*history, 7], "kept", max_tokens=1)
    assert usage.cached_tokens == len(history)


def test_the_background_write_waits_for_the_next_turn_then_writes_the_newest(svc, tmp_path):
    """A parked session is not written while its client's next turn may be on the way
    (WRITE_AFTER_S), so that turn's prefill never shares the CPU with the write; the turn
    that comes re-notes the session and one write holds its newest conversation."""
    writer = persistence.DurableWriter()
    folder = tmp_path / "model"
    writer.attach(svc, folder)
    try:
        prompt = svc.encode_chat(PIRATE)
        first, _ = turn(svc, prompt, session_id="sea")
        assert not folder.exists() or spill_files(folder) == []  # not yet: within the delay
        turn(svc, [*prompt, *first, *svc.encode_chat(CHEF)[1:]], session_id="sea")
        deadline = time.monotonic() + persistence.WRITE_WITHIN_S + 30
        while spill_files(folder) != [f"{file_stem('sea')}-0{SUFFIX}"]:
            assert time.monotonic() < deadline, spill_files(folder) if folder.exists() else None
            time.sleep(0.02)
        header = session_blob_read.read_header((folder / spill_files(folder)[0]).read_bytes())
        assert tuple(header["tokens"]) == held(svc)["sea"][-1]
    finally:
        writer.detach(svc)
        writer.stop()


def test_flush_writes_at_once_whatever_the_delay(svc, tmp_path):
    writer = persistence.DurableWriter()
    folder = tmp_path / "model"
    writer.attach(svc, folder)
    try:
        turn(svc, svc.encode_chat(CHEF), session_id="soup")
        started = time.monotonic()
        assert writer.flush(timeout=30)
        assert time.monotonic() - started < persistence.WRITE_AFTER_S + 5
        assert len(spill_files(folder)) == 1
    finally:
        writer.detach(svc)
        writer.stop()
