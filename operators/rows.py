"""JSON rows for the operator routes and the console: live instances and loading ones."""

from __future__ import annotations

from pantheon_platform.runtime import InstanceInfo, LoadingInfo, Runtime


def model_row(info: InstanceInfo) -> dict:
    """The /admin/models row (also the load response). `max_concurrent` and
    `context_window` are what the engine serves; the *_configured twins what was asked."""
    svc, spec = info.svc, info.spec
    memory = svc.memory_bytes
    row = {
        "id": info.name,
        "object": "model",
        "status": "unloading" if info.draining else "loaded",
        "path": svc.path,
        "architecture": svc.architecture,
        "quantization": svc.quantization,
        "weights_version": svc.weights_version,
        "created": svc.created,
        "loaded_at": int(info.loaded_at),
        "dies": list(svc.dies),  # where its layers are, in order (as named, or die 0)
        # Weights and KV: device memory on a GPU's dies, host memory otherwise.
        "vram_bytes": memory if svc.on_accelerator else 0,
        "host_bytes": 0 if svc.on_accelerator else memory,
        "max_sessions": svc.max_sessions,
        "max_concurrent": svc.max_concurrent,
        "max_concurrent_configured": svc.max_concurrent_configured,
        "reasoning_budget": spec.config.reasoning_budget,
        "chat_template": "custom" if spec.config.chat_template else "gguf",
        "quantize": spec.config.quantize,
        "pooling": svc.pooling,  # how /v1/embeddings pools (the option, else the default)
        # The KV cache's type and what one position costs in it (bytes, K and V of every
        # layer): the memory the kv_dtype option saves.
        "kv_dtype": svc.kv_dtype,
        "kv_bytes_per_token": svc.kv_bytes_per_token,
        "pinned": info.pinned,
        "in_flight": svc.in_flight,
        "aliases": list(info.aliases),
        # How the last load went: seconds, and whether the weight cache served it.
        "load_seconds": svc.load_seconds,
        "weight_cache_used": svc.weight_cache_used,
        # What the weights compute with: "cpu" (compiled kernels on the GGUF blocks) or
        # "numpy" (float32 reference); types without a kernel, dequantised at load.
        "kernel": svc.kernel,
        "speculation": speculation_json(svc),
    }
    if svc.kernel_isa:
        row["kernel_isa"] = svc.kernel_isa
    if svc.kernel_activations:
        row["kernel_activations"] = svc.kernel_activations
    if svc.kernel_fallback:
        row["kernel_fallback"] = svc.kernel_fallback
    if svc.context_window:  # omitted when unknown, never 0 (the contract)
        row["context_window"] = svc.context_window
        row["context_window_configured"] = info.context_window_configured
    graphs = svc.graphs
    if graphs:  # decode steps through CUDA-graph slots, once one was exercised
        row["graphs"] = graphs
    attention = svc.attention
    if attention:  # a model on dies, once a pass has reached its layers
        row["attention"] = attention
    return row


def speculation_json(svc) -> dict:
    """Exact speculative decoding on this instance: its mode (PANTHEON_SPECULATION), the
    tokens drafted and accepted since it loaded (the pantheon_speculative_* counters), and
    the acceptance rate (accepted / drafted; null before anything was drafted)."""
    stats = svc.stats
    drafted, accepted = stats.drafted_tokens, stats.accepted_draft_tokens
    out = {
        "mode": svc.config.speculation,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "draft_model": None,
    }
    if svc.draft is not None:  # of those, what the draft model drafted (its own rate)
        drafted, accepted = stats.model_drafted_tokens, stats.model_accepted_tokens
        out["draft_model"] = {
            "path": svc.draft.path,
            "architecture": svc.draft.architecture,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        }
    return out


def loading_row(info: LoadingInfo) -> dict:
    """The /admin/models row of a model still loading: what was asked (nothing is served
    yet: max_concurrent 0) and, once its load has started, `progress`."""
    spec = info.spec
    config = spec.config
    row = {
        "id": info.name,
        "object": "model",
        "status": "loading",
        "path": config.path,
        "dies": list(config.dies),
        "vram_bytes": 0,
        "max_sessions": config.max_sessions,
        "max_concurrent": 0,
        "max_concurrent_configured": config.max_concurrent or config.max_sessions,
        "pinned": spec.pinned,
    }
    if info.progress is not None:
        row["progress"] = info.progress.as_dict()
    return row


def model_rows(rt: Runtime) -> list[dict]:
    """GET /admin/models: every live instance by name, then the models loading."""
    return [model_row(i) for i in rt.instances()] + [loading_row(i) for i in rt.loading()]
