"""Which instance a request goes to.

A session's turns go where the session is (its affinity), while that instance is live,
routable and serves the model; anything else goes to the routable replica of the model
with the most free slots. The slots an instance last reported are up to a heartbeat old,
so the requests this router has in flight there count too: 16 streams sent at once
spread over the replicas instead of all going to the one that reported the most. When
every replica is full (no free slot and a full queue) the answer is 429 with
Retry-After; when none serves the model, 503 no_live_instance.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from cluster.registry import Instance, ModelReport
from pantheon_platform.errors import ApiError

RETRY_AFTER_S = 1  # a slot frees within a decode step or two; heartbeats say so within 2 s


def no_live_instance(model: str | None, instances: list[Instance]) -> ApiError:
    served = sorted({m.id for i in instances if i.routable for m in i.models})
    what = f"model {model!r}" if model else "any model"
    return ApiError(
        503,
        f"no live instance serves {what} (live models: {', '.join(served) or 'none'}); "
        "instances register with this router and are dropped when their heartbeats stop",
        "no_live_instance",
    )


def replicas(
    instances: Iterable[Instance], model: str | None
) -> list[tuple[Instance, ModelReport]]:
    """The routable instances serving `model` (None: any, the instance picks its default)
    with their report of it."""
    found = []
    for inst in instances:
        if not inst.routable or not inst.models:
            continue
        report = inst.model(model) if model else max(inst.models, key=lambda m: m.free_slots)
        if report is not None:
            found.append((inst, report))
    return found


def load(report: ModelReport, in_flight: int) -> tuple[int, int]:
    """(free slots, queued) of a replica: its report, or what this router alone has sent
    there if that is more."""
    free = min(report.free_slots, report.max_concurrent - in_flight)
    queued = max(report.queue_depth, in_flight - report.max_concurrent)
    return free, queued


def choose(
    instances: list[Instance],
    model: str | None,
    in_flight: dict[str, int],
    *,
    exclude: frozenset[str] = frozenset(),
) -> Instance:
    """The replica of `model` with the most free slots (then the shortest queue; ties
    broken at random); raises the 503 or 429 ApiError."""
    found = [(i, r) for i, r in replicas(instances, model) if i.id not in exclude]
    if not found:
        raise no_live_instance(model, instances)
    scored = []
    for inst, report in found:
        free, queued = load(report, in_flight.get(inst.id, 0))
        if free > 0 or queued < report.queue_capacity:
            scored.append(((free, -queued, random.random()), inst))
    if not scored:
        raise ApiError(
            429,
            f"every live replica of {model or 'the model'} is full ({len(found)} instance(s): "
            "no free slot and a full queue); retry later",
            "server_busy",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return max(scored, key=lambda pair: pair[0])[1]


def pinned(
    instances: list[Instance], instance_id: str | None, model: str | None
) -> Instance | None:
    """The instance `instance_id` names if a request may still go there: live, routable,
    serving `model` (None: any)."""
    if instance_id is None:
        return None
    for inst, _ in replicas(instances, model):
        if inst.id == instance_id:
            return inst
    return None
