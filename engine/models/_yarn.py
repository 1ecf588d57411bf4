"""YaRN RoPE scaling (`rope.scaling.type` yarn) as per-frequency divisors and a cos/sin
scale: the form the RoPE tables already take for LongRoPE (`ArchSpec.rope_factors_short`,
`rope_attn_factor`), so no kernel changes.

YaRN keeps the fast-rotating frequencies (extrapolation), divides the slow ones by the
scaling factor (interpolation) and ramps linearly between, over the dimensions where a
frequency completes between `beta_fast` and `beta_slow` turns in the original context;
cos and sin are scaled by 0.1 ln(factor) + 1. `truncate` rounds the ramp's ends to whole
dimensions (llama.cpp and transformers' default; gpt-oss's config turns it off).
"""

from __future__ import annotations

import math

from ..types import ModelLoadError


def yarn_factors(
    dim: int,
    base: float,
    factor: float,
    orig_ctx: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[tuple[float, ...], float]:
    """(divisors of the dim // 2 frequencies, scale of cos and sin), as transformers'
    `_compute_yarn_parameters` computes the frequencies and attention factor."""

    def turns_dim(turns: float) -> float:  # the dimension rotating `turns` times in orig_ctx
        return dim * math.log(orig_ctx / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = turns_dim(beta_fast), turns_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    divisors = []
    for i in range(dim // 2):
        keep = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)  # the unscaled share
        divisors.append(1.0 / ((1.0 - keep) / factor + keep))  # inv_freq times 1 / this
    attn = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return tuple(divisors), attn


def read_yarn(gf, truncate: bool = True) -> dict:
    """The ArchSpec fields (`rope_factors_short`, `rope_attn_factor`) for a file whose
    `rope.scaling.type` is yarn; {} for a file without RoPE scaling."""
    kind = gf.arch_value("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind != "yarn":
        raise ModelLoadError(f"{gf.architecture}: rope scaling {kind!r} is not supported")
    factor = float(gf.arch_value("rope.scaling.factor", 1.0) or 1.0)
    orig_ctx = int(gf.arch_value("rope.scaling.original_context_length", 0) or 0)
    if factor <= 1.0 or orig_ctx <= 0:
        return {}
    d_model = int(gf.arch_value("embedding_length"))
    head_dim = int(
        gf.arch_value("attention.key_length", d_model // int(gf.arch_value("attention.head_count")))
    )
    dim = int(gf.arch_value("rope.dimension_count", head_dim))
    factors, attn = yarn_factors(
        dim,
        float(gf.arch_value("rope.freq_base", 10000.0)),
        factor,
        orig_ctx,
        float(gf.arch_value("rope.scaling.yarn_beta_fast", 32.0) or 32.0),
        float(gf.arch_value("rope.scaling.yarn_beta_slow", 1.0) or 1.0),
        truncate,
    )
    return {"rope_factors_short": factors, "rope_attn_factor": attn}
