"""Fast reload: a second load of the same bytes comes from the weight cache and serves
exactly the same model; a damaged cache is rebuilt, never trusted."""

from __future__ import annotations

import asyncio
import json

from engine.serving.service import ModelService
from engine.types import GenerationRequest, ModelConfig, SamplingParams, TokenEvent
from tests.tiny_gguf import write_tiny_llama


def answer(svc: ModelService) -> str:
    prompt = tuple(svc.encode_chat([{"role": "user", "content": "hi"}]))

    async def run():
        params = SamplingParams(temperature=0, max_tokens=8)
        parts = []
        async for ev in svc.generate(GenerationRequest("t", prompt, params)):
            if isinstance(ev, TokenEvent):
                parts.append(ev.text)
        return "".join(parts)

    return asyncio.run(run())


def load(path, cache_dir) -> ModelService:
    return ModelService.load(
        ModelConfig(name="tiny", path=str(path), weight_cache_dir=str(cache_dir))
    )


def test_the_second_load_comes_from_the_cache_and_answers_the_same(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    first = load(path, cache_dir)
    try:
        assert not first.weight_cache_used and first.load_seconds > 0
        expected = answer(first)
    finally:
        first.close()
    second = load(path, cache_dir)
    try:
        assert second.weight_cache_used
        assert answer(second) == expected
    finally:
        second.close()


def test_a_damaged_cache_file_is_rebuilt(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    svc = load(path, cache_dir)
    expected = answer(svc)
    svc.close()
    (folder,) = [p for p in cache_dir.iterdir() if p.is_dir()]
    manifest = json.loads((folder / "manifest.json").read_text())
    # Whatever the backend cached (float32 values: vectors, and on the numpy backend every
    # matrix; the compiled kernels map matrices from the GGUF itself).
    entry = (
        manifest["tensors"].get("token_embd.weight") or manifest["tensors"]["output_norm.weight"]
    )
    victim = folder / entry["file"]
    raw = bytearray(victim.read_bytes())
    raw[-4:] = b"\x00\x00\xc0\x7f"  # a NaN where a weight was
    victim.write_bytes(bytes(raw))
    svc = load(path, cache_dir)
    try:
        assert not svc.weight_cache_used  # one tensor was rebuilt from the GGUF
        assert answer(svc) == expected
    finally:
        svc.close()


def test_other_bytes_get_their_own_cache_entry(tmp_path):
    cache_dir = tmp_path / "cache"
    for seed in (1, 2):
        svc = load(write_tiny_llama(tmp_path / f"m{seed}.gguf", seed=seed), cache_dir)
        assert not svc.weight_cache_used
        svc.close()
    assert len([p for p in cache_dir.iterdir() if p.is_dir()]) == 2


def test_peeking_at_a_loaded_file_uses_the_cached_header(tmp_path, monkeypatch):
    from engine.loading import gguf_file
    from engine.loading.gguf_open import peek_gguf

    path = write_tiny_llama(tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    load(path, cache_dir).close()
    parsed = []
    real_read = gguf_file.read_header
    monkeypatch.setattr(gguf_file, "read_header", lambda *a: parsed.append(a) or real_read(*a))
    peeked = peek_gguf(str(path), str(cache_dir))
    assert parsed == []  # no parse: the header came from the cache
    assert peeked.architecture == "llama" and peeked.quantization == "F32"
    assert peek_gguf(str(path), "").n_params == peeked.n_params
    assert len(parsed) == 1  # without a cache it parses
