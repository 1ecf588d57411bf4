"""Loading a model's files: the GGUF opened (its header through the weight cache), the
tokenizer and chat template read from its metadata, the weights prepared for a backend
or split by layers across dies. Blocking; raises ModelLoadError. Serving starts on what
it returns (serving/service.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from kernels import die_backend, get_backend
from kernels.devices import dies

from ..models import architecture_module
from ..models._pipeline import load_pipeline
from ..text.chat_template import ChatTemplate, ChatTemplateError
from ..text.tokenizer import Tokenizer, spm_merges_of
from ..types import ModelConfig, ModelLoadError
from .gguf_file import GGUFFile
from .gguf_open import open_gguf
from .progress import CACHE_WRITE, PARSE, LoadReporter, ProgressCallback, ProgressLog


@dataclass(frozen=True)
class LoadedModel:
    gguf: GGUFFile
    model: object
    tokenizer: Tokenizer
    template: ChatTemplate
    weight_cache_used: bool  # something came from the weight cache


def dies_for(config: ModelConfig) -> list:
    """The dies `config` places its layers on (kernels.devices.dies), or [] for host memory."""
    try:
        return dies.placement(config.dies, config.backend)
    except ValueError as exc:
        raise ModelLoadError(f"{config.name}: {exc}") from None


def load_model(config: ModelConfig, on_progress: ProgressCallback | None = None) -> LoadedModel:
    """Open and dequantise a GGUF: the weights, tokenizer and chat template to serve.

    With `config.weight_cache_dir`, everything derived from the file (its parsed
    header, tokenizer merges, the prepared float32 tensors) comes from the weight cache
    when a valid entry for these bytes exists, and is stored there when not.
    `on_progress` is called on the loading thread after each step (progress.py); the
    log gets a progress line every tenth or second."""
    progress = LoadReporter([ProgressLog(config.name), on_progress])
    progress.phase(PARSE)
    gf, cache = open_gguf(config)
    progress.begin(len(gf.tensors), sum(gf.stored_bytes(n) for n in gf.tensors))
    with cache if cache is not None else contextlib.nullcontext():
        arch = architecture_module(gf.architecture)
        try:
            merges = (
                cache.get_json("spm-merges", lambda: spm_merges_of(gf.metadata))
                if cache is not None
                else None
            )
            tokenizer = Tokenizer.from_gguf(gf.metadata, spm_merges=merges)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise ModelLoadError(f"{gf.path.name}: unusable tokenizer metadata: {exc}") from exc
        template = ChatTemplate.from_gguf(gf.metadata)
        if config.chat_template:  # the operator's template, with the GGUF's bos/eos texts
            try:
                template = ChatTemplate(
                    config.chat_template,
                    bos_token=template.bos_token,
                    eos_token=template.eos_token,
                )
            except ChatTemplateError as exc:
                raise ModelLoadError(f"{config.name}: chat_template: {exc}") from exc
        placed = dies_for(config)
        if placed:  # split by layers across dies, each stage on its die's thread
            model = load_pipeline(gf, arch.SPEC, placed, die_backend, progress, cache)
        else:
            try:
                backend = get_backend(config.backend)
            except ValueError as exc:
                raise ModelLoadError(f"{config.name}: {exc}") from None
            model = arch.load(gf, progress, cache, backend=backend, quantize=config.quantize)
        try:
            model.use_kv_dtype(config.kv_dtype)
        except ValueError as exc:
            raise ModelLoadError(f"{config.name}: {exc}") from None
        if cache is not None and cache.misses:
            progress.phase(CACHE_WRITE)  # published as the block exits
    progress.finish()
    return LoadedModel(gf, model, tokenizer, template, cache is not None and cache.used)
