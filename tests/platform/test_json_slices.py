"""Large answers encoded a slice at a time (pantheon_platform/json_slices.py): the same
bytes as the one-call encoding, and the GIL handed over between slices."""

from __future__ import annotations

import threading
import time

import numpy as np

from pantheon_platform.errors import json_response
from pantheon_platform.json_slices import dumps_in_slices, sliced_json_response

rng = np.random.default_rng(3)
BODIES = [
    {},
    {"tokens": []},
    {"tokens": list(range(20_000))},
    {"content": 'é ☃ \u2028 "quoted" \\ \x00 😀' * 50},
    {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(rng.standard_normal((37, 64), dtype=np.float32))
        ],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    },
    {"embeddings": rng.standard_normal((9, 5)).tolist(), "nested": [[1, [2, [3, {"a": None}]]]]},
    {"mixed": [1, "two", 3.5, True, None, {"k": [1, 2, 3, 4, 5, 6]}, [7, 8, 9, 10, 11, 12]]},
    {1: "int key", "floats": [1e300, -0.0, 1.5e-7, 123456789.125] * 2000},
]


def test_the_bytes_are_json_responses_bytes():
    for body in BODIES:
        one_call = json_response(body)
        sliced = sliced_json_response(body)
        assert sliced.content == one_call.content
        assert sliced["Content-Type"] == one_call["Content-Type"]
        assert sliced.status_code == one_call.status_code


def test_another_thread_runs_while_a_large_answer_is_encoded():
    ids = list(range(2_000_000))  # ~230 ms in one json.dumps call
    ticks: list[float] = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            time.sleep(0.001)  # each wake-up needs the GIL
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.05)
    started = time.perf_counter()
    dumps_in_slices({"tokens": ids})
    ended = time.perf_counter()
    done.set()
    thread.join()
    # One json.dumps call lets the ticker in about once (it cannot wake without the GIL);
    # sliced, it gets in every switch interval (5 ms): dozens of times, even on a busy host.
    during = sum(started < t < ended for t in ticks)
    assert during >= 10, (during, ended - started)


def test_an_int_array_is_written_as_the_list_of_its_ints():
    for ids in ([], [7], list(range(10_000)), [0, 49151, 2**31 - 1, -3]):
        for dtype in (np.int32, np.int64, np.uint32):
            if dtype is np.uint32 and min(ids, default=0) < 0:
                continue
            array = np.asarray(ids, dtype=dtype)
            assert (
                dumps_in_slices({"tokens": array})
                == json_response({"tokens": ids}).content.decode()
            )
