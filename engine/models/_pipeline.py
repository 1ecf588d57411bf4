"""A model placed on dies: its layers split into stages, one stage per die, each stage's
work run on that die's engine thread (kernels.devices.dies).

`PipelineModel` has the interface the serving layer asks of a DecoderModel (forward,
forward_decode, hidden_states, make_kv_cache, hp, backend, weight_bytes), so the service,
the scheduler and the HTTP side are unchanged by where the layers are. A pass runs stage
by stage: the first embeds the tokens, each hands its hidden states (rows, D) to the
next, which copies them onto its own die, and the last computes logits. Each stage's KV
cache holds its own layers and lives on its die; kernels.devices.dies.SplitKV puts them together
behind the KV cache interface (sessions park and restore all layers at once).

On one die this is one stage: every pass is handed to that die's thread (the CUDA device
and stream are that thread's). A step's stages run one after another: a sequence's token
needs every layer in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernels.devices.dies import SplitKV
from kernels.devices.graphs import GraphSlots

from ..loading.gguf_file import GGUFFile
from ..loading.tensors import TensorSource
from ._block import ArchSpec, DecoderModel


def split_layers(n_layer: int, n_stages: int) -> list[range]:
    """Consecutive layer ranges, as even as can be (the first stages take one more)."""
    if not 1 <= n_stages <= n_layer:
        raise ValueError(f"cannot split {n_layer} layers into {n_stages} stages")
    base, extra = divmod(n_layer, n_stages)
    ranges, start = [], 0
    for i in range(n_stages):
        stop = start + base + (1 if i < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


@dataclass
class Stage:
    die: object  # kernels.devices.dies.Die
    model: DecoderModel  # only this stage's layers

    def run(self, fn, *args):
        return self.die.run(fn, *args)


class PipelineModel:
    """A model whose layers are split across dies (one or more), a stage per die."""

    def __init__(self, stages: list[Stage]):
        self.stages = stages
        first = stages[0].model
        self.hp, self.spec = first.hp, first.spec
        self.backend = first.backend  # what the service reports (name, on_accelerator)
        self.rope_tables = first.rope_tables
        self._kv_holders: set[int] = set()  # the KV caches of the services serving it
        self.reached = False  # a forward pass has gone through the layers (attention)
        # CUDA graphs of each stage's decode step, per batch-size bucket, where every
        # stage's backend can capture one (the cuda backend); None: direct kernels only.
        # Not with mixture-of-experts layers: their routing is read on the host each step.
        can_capture = all(
            s.model.backend.captures_graphs and s.model.spec.moe is None for s in stages
        )
        self.graphs = GraphSlots() if can_capture else None
        self.fallback_types = {}
        for stage in stages:
            self.fallback_types.update(stage.model.fallback_types)

    @property
    def dies(self) -> list:
        return [s.die for s in self.stages]

    @property
    def weight_bytes(self) -> int:
        return sum(s.model.weight_bytes for s in self.stages)

    def hold(self, name: str, kv: SplitKV) -> None:
        """Record on each die what serving `kv` holds there: this model's weights (once,
        whoever serves it) and that KV cache (/admin/dies' vram_used, die admission)."""
        for stage, (die, part) in zip(self.stages, kv.parts, strict=True):
            die.hold(f"weights:{id(self)}", name, stage.model.weight_bytes)
            die.hold(f"kv:{id(kv)}", name, part.nbytes)
        self._kv_holders.add(id(kv))

    def release(self, kv: SplitKV) -> None:
        """Forget `kv` on its dies and its captured graphs; with the last KV cache served,
        the weights and every graph too (the model is unloading)."""
        if self.graphs is not None:
            self.graphs.drop_cache(kv.serial)
        if id(kv) not in self._kv_holders:
            return
        self._kv_holders.discard(id(kv))
        for die in self.dies:
            die.drop(f"kv:{id(kv)}")
            if not self._kv_holders:
                die.drop(f"weights:{id(self)}")
        if not self._kv_holders and self.graphs is not None:
            self.graphs.drop()

    @property
    def kv_dtype(self) -> str:
        return self.stages[0].model.kv_dtype

    def use_kv_dtype(self, kv_dtype: str) -> None:
        """Every stage's KV cache as `kv_dtype` (DecoderModel.use_kv_dtype)."""
        for stage in self.stages:
            stage.model.use_kv_dtype(kv_dtype)

    def make_kv_cache(self, n_slots: int, n_ctx: int, kv_dtype: str | None = None) -> SplitKV:
        return SplitKV(
            [(s.die, s.run(s.model.make_kv_cache, n_slots, n_ctx, kv_dtype)) for s in self.stages]
        )

    def _through(self, method: str, x, kv: SplitKV, args):
        """x (tokens, then hidden states) through every stage's `method`, in order;
        args(part) gives the rest of its arguments, with that stage's KV part."""
        for stage, (_, part) in zip(self.stages, kv.parts, strict=True):
            x = stage.run(getattr(stage.model, method), x, *args(part))
        self.reached = True
        return x

    def attention_residency(self) -> dict | None:
        """Where each layer's attention runs: the contract's `attention` object (operator
        form), None until a pass has reached the layers. A stage whose backend attends in
        its die's memory counts its layers `ondie`; any other (none today) `host`, with
        its reason."""
        if not self.reached:
            return None
        ondie = host = 0
        reasons: dict[str, int] = {}
        for stage in self.stages:
            n = len(stage.model.layers)
            why = getattr(stage.model.backend, "host_attention_reason", "no_flash_kernels")
            if why is None:
                ondie += n
            else:
                host += n
                reasons[why] = reasons.get(why, 0) + n
        row = {
            "ondie": ondie,
            "host": host,
            "total": ondie + host,
            "gave_up": 0,
            "impossible": 0,
            "host_engagements": 0,
            "ring_alloc_failures": 0,
        }
        if host:
            row["reasons"] = reasons
        return row

    def forward(self, tokens, start: int, kv: SplitKV, slot: int, all_logits: bool = False):
        return self._through("forward", tokens, kv, lambda part: (start, part, slot, all_logits))

    def hidden_states(self, tokens, start: int, kv: SplitKV, slot: int) -> np.ndarray:
        return self._through("hidden_states", tokens, kv, lambda part: (start, part, slot))

    def forward_decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        kv,
        keep_on_device: bool = False,
        argmax=None,  # full logits answer it too (DecoderModel.forward_decode)
    ) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        self.stages[0].model.check_positions(pos, kv)
        x = tokens
        for i, (stage, (_, part)) in enumerate(zip(self.stages, kv.parts, strict=True)):
            x = stage.run(self._decode_stage, (i, kv.serial), stage.model, x, pos, slots, part)
        self.reached = True
        if keep_on_device:
            return x
        return self.stages[-1].run(self.stages[-1].model.backend.to_host, x)

    def _decode_stage(self, key: tuple, model: DecoderModel, x, positions, slots, kv):
        """A stage's decode rows, on its die's thread: through its CUDA-graph slot for this
        many rows on this KV cache (key: (stage, SplitKV.serial)) where the stages capture
        graphs (replayed, captured, or direct: kernels/devices/graphs.py), else direct."""

        def step(inputs, pos, rows_slots):
            return model.decode_rows(inputs, pos, rows_slots, kv, keep_on_device=True)

        if not model.embeds:  # the previous stage's hidden states, onto this die
            x = model.backend.adopt(x)
        if self.graphs is None:
            return step(x, positions, slots)

        def capture(bucket: int):
            width = None if model.embeds else model.hp.d_model
            return model.backend.capture_step(step, bucket, width, kv.scratch_slot)

        return self.graphs.run(key, len(positions), step, capture, x, positions, slots)

    def graphs_report(self, operator: bool = False) -> dict | None:
        """The contract's `graphs` object; None without graph slots (no stage can capture,
        or no step exercised one yet)."""
        return None if self.graphs is None else self.graphs.report(operator)

    def on_last_die(self, fn, *args):
        """fn(*args) on the last stage's die thread: where logits kept on the device are
        (the sampler reads them there)."""
        return self.stages[-1].run(fn, *args)


def load_pipeline(
    gf: GGUFFile,
    spec: ArchSpec,
    dies: list,
    backend_of,
    progress=None,
    cache=None,
) -> PipelineModel:
    """`gf` split by layers across `dies` (kernels.devices.dies.Die); backend_of(die) is the
    backend that computes on a die. Each stage's weights are uploaded from its die's
    thread (on CUDA: into that device's memory)."""
    from ._block import HParams

    n_layer = HParams.from_gguf(gf, spec).n_layer
    stages = []
    for die, layers in zip(dies, split_layers(n_layer, len(dies)), strict=True):
        backend = backend_of(die)

        def build(backend=backend, layers=layers) -> DecoderModel:
            return DecoderModel(gf, spec, TensorSource(gf, backend, progress, cache), layers)

        stages.append(Stage(die, die.run(build)))
    return PipelineModel(stages)
