"""Capturing a stage's decode step into a CUDA graph on CuPy, and replaying it
(the bookkeeping of slots, retries and the `graphs` object: kernels/devices/graphs.py).

A captured step reads its inputs from static device buffers and writes its output into a
static device array, so a replay is: the step's token ids (or, after the first stage, its
hidden states), positions and slots copied into those buffers, one `graph.launch`, the
first B rows of the output. Rows past B are padding: token 0 at position 0 of the KV
cache's scratch slot (a slot no sequence is given), computed and ignored, changing no
other row (every row is computed alone).

What a capture needs of the step, which `DecoderModel.decode_rows` on the cuda backend
provides: no host reads (positions and slots stay device arrays: the kernels size their
grids by the KV window, not by the positions' values) and no host-to-device copies
inside. Memory: the step's intermediates come from a pool of the graph's own (so nothing
else reuses them between replays); one direct run fills that pool and compiles every
kernel before capture begins, so the capture allocates nothing new. Capture runs in
"relaxed" mode on the die's own (non-default) stream.

Run on an H200 (2026-12-04): tests/gpu/test_cuda_graphs_and_dies.py checks replay
against the direct step, bitwise. A graph reads and writes the KV cache it was captured
on, so kernels/devices/graphs.py keys its slots by cache.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def capture_decode(xp, step: Callable, bucket: int, width: int | None, scratch_slot: int):
    """Capture `step(inputs, positions, slots)` for `bucket` rows; returns
    replay(inputs, positions, slots) for up to `bucket` rows. `width`: None when the inputs
    are token ids, else D (hidden states from the previous stage).

    With xp = numpy there is no graph: a replay fills the same static buffers, padding
    included, and calls the step on all `bucket` rows (the suite checks everything but
    the graph itself this way: tests/engine/models/test_graphed_decode.py)."""
    index = xp.zeros((2, bucket), dtype=np.int64)  # positions, slots: one upload
    positions, slots = index[0], index[1]
    if width is None:
        inputs = xp.zeros(bucket, dtype=np.int64)
    else:
        inputs = xp.zeros((bucket, width), dtype=np.float32)
    slots[...] = scratch_slot
    if xp is np:
        launch, stream = (lambda: step(inputs, positions, slots)), None
        keep = None
    else:
        launch, stream, keep = _capture(xp, step, inputs, positions, slots)
    host_index = np.zeros((2, bucket), dtype=np.int64)
    host_ids = np.zeros(bucket, dtype=np.int64)

    def replay(step_inputs, step_positions, step_slots):
        rows = len(step_positions)
        host_index[0, :rows] = np.asarray(step_positions, dtype=np.int64)
        host_index[0, rows:] = 0
        host_index[1, :rows] = np.asarray(step_slots, dtype=np.int64)
        host_index[1, rows:] = scratch_slot
        _upload(xp, index, host_index, stream)
        if width is None:
            host_ids[:rows] = np.asarray(step_inputs, dtype=np.int64)
            host_ids[rows:] = 0
            _upload(xp, inputs, host_ids, stream)
        else:
            inputs[:rows] = step_inputs  # on this die already (the stage adopted them)
        return launch()[:rows]

    replay.keep = keep  # the graph and its memory live as long as the replay function
    return replay


def _upload(xp, device, host: np.ndarray, stream) -> None:
    if xp is np:
        device[...] = host
    else:
        device.set(host, stream=stream)


def _capture(cupy, step: Callable, inputs, positions, slots):
    """The step captured on the current (the die's) stream: (launch, stream, what must
    stay alive). Intermediates come from a pool of the graph's own; a direct run first
    compiles every kernel and fills that pool, so the capture allocates nothing new."""
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.get_current_stream()
    with cupy.cuda.using_allocator(pool.malloc):
        step(inputs, positions, slots)
        stream.synchronize()
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        try:
            output = step(inputs, positions, slots)
        finally:
            graph = stream.end_capture()

    def launch():
        graph.launch(stream)
        return output

    return launch, stream, (graph, pool, output)
