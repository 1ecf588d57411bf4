"""What crosses between the scheduler, the runner and the engine loop: one step's work
(a Batch of prefill chunks and decode rows) and the events a step produces (a token
sampled, a sequence finished, a queued request refused). Frozen values, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISH_STOP, FINISH_LENGTH = "stop", "length"
REFUSED_QUEUE_TIMEOUT, REFUSED_MEMORY = "queue_timeout", "memory"


# --- what crosses to the runner ---------------------------------------------------------


@dataclass(frozen=True)
class PrefillChunk:
    seq_id: int
    slot: int
    start: int  # position of token_ids[0]
    token_ids: tuple[int, ...]
    # Only on a prompt's last chunk: slots that get a copy of the prompt's KV (the other
    # choices of an n > 1 request), then the sequences that sample their first token from
    # this chunk's last logits.
    copy_to_slots: tuple[int, ...] = ()
    sample_seq_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecodeRow:
    seq_id: int
    slot: int
    position: int  # where token_id's KV is written
    token_id: int


@dataclass(frozen=True)
class Started:
    """A group that left the queue this step: its choices' sequences, choice i at [i].
    The first len(slots) have a slot now; the others get one as the group's slots free."""

    group_id: int
    seq_ids: tuple[int, ...]
    slots: tuple[int, ...] = ()  # seq_ids[i] decodes in slots[i]


@dataclass(frozen=True)
class Batch:
    prefill: tuple[PrefillChunk, ...] = ()
    decode: tuple[DecodeRow, ...] = ()
    started: tuple[Started, ...] = ()  # groups admitted this step (Scheduler.admit)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    def sampling_seq_ids(self) -> tuple[int, ...]:
        """The sequences this batch samples a token for, in the order update() takes them."""
        ids = [s for chunk in self.prefill for s in chunk.sample_seq_ids]
        return (*ids, *(row.seq_id for row in self.decode))


# --- what crosses back to the service --------------------------------------------------


@dataclass(frozen=True)
class Sampled:
    group_id: int
    seq_id: int
    index: int
    token_id: int


@dataclass(frozen=True)
class Finished:
    group_id: int
    seq_id: int
    index: int
    reason: str  # FINISH_STOP | FINISH_LENGTH
    prompt_tokens: int
    completion_tokens: int
    kv_used: int
    kv_cap: int
    choices: int
    group_done: bool  # the group's last sequence: the request is over
    cached_tokens: int = 0  # prompt tokens resumed from a cache rather than computed
    # Positions of the sequence's slot whose KV is written (the prompt and every output
    # token fed back; not the last sampled one unless it was the end of turn).
    kv_written: int = 0
    # The slot it decoded in (-1: it never held one), free now or handed to a waiting
    # choice of its group; its KV is intact until the next step runs.
    slot: int = -1


@dataclass(frozen=True)
class Refused:
    """A group that was admitted to the queue and is now turned away."""

    group_id: int
    reason: str  # REFUSED_QUEUE_TIMEOUT | REFUSED_MEMORY
    message: str


class QueueFull(Exception):
    """Every served slot is taken and `queue_depth` requests already wait."""
