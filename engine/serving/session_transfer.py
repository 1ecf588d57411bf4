"""A model instance's sessions as portable blobs (session_blob.py): exported, snapshotted
for the disk writer, and restored (checked whole before the session table is touched)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..types import BadSessionBlob
from .conversation import Conversation
from .session_blob import KVLayout, SessionSnapshot
from .session_blob import encode as encode_blob
from .session_blob_read import decode as decode_blob
from .session_key import SessionKey
from .sessions import SessionTable


@dataclass(frozen=True)
class ExportedSession:
    session_id: str
    weights_version: str
    tokens: tuple[int, ...]
    blob: bytes
    namespace: str = "open"  # whose session it is (serving/sessions.py)

    @property
    def n_tok(self) -> int:
        return len(self.tokens)


class SessionTransfer:
    def __init__(
        self,
        sessions: SessionTable,
        kv,
        architecture: str,
        weights_version: str,
        vocab_size: int,
        context_window: int,
    ):
        self.sessions = sessions
        self.kv = kv
        self.architecture = architecture
        self.weights_version = weights_version
        self.vocab_size = vocab_size
        self.context_window = context_window  # the configured one: a blob must fit it

    @property
    def kv_layout(self) -> KVLayout:
        n_layer, n_kv_head, head_dim = self.kv.layout
        kv_dtype = getattr(self.kv, "kv_dtype", "f32")
        return KVLayout(
            self.architecture, self.weights_version, n_layer, n_kv_head, head_dim, kv_dtype
        )

    def snapshot(self, key: SessionKey, conv: Conversation) -> SessionSnapshot:
        """One parked conversation as a blob's contents (export and the disk writer): a
        conversation still in its slot is copied for the blob only (conversation.py)."""
        k, v = conv.arrays()
        return SessionSnapshot(
            self.kv_layout,
            conv.tokens,
            k,
            v,
            key.id,
            created=time.time(),
            namespace=key.namespace,
        )

    def export(self, session_id: str) -> ExportedSession:
        """The id's most recently used conversation as a portable blob (session_blob.py)
        that records the session's namespace. Raises SessionNotFound, SessionBusy (a turn
        in flight)."""
        key = SessionKey.of(session_id)
        conv = self.sessions.latest(key)
        blob = encode_blob(self.snapshot(key, conv))
        return ExportedSession(key.id, self.weights_version, conv.tokens, blob, key.namespace)

    def restore(self, session_id: str, blob: bytes, tokens: list[int] | None) -> int:
        """Install an exported conversation under `session_id` (a SessionKey: in its
        namespace, whatever namespace the blob records); returns its token count.

        Everything is checked before the table is touched: the blob itself (BadSessionBlob),
        the weights (WeightsVersionMismatch), the tokens sent with it, the window; then
        the table refuses a new id when full (SessionCapacity) or a busy one (SessionBusy).
        `tokens` None: take the blob's own (a spill file restored at start)."""
        snap = decode_blob(blob, self.kv_layout)
        if tokens is not None and tuple(tokens) != snap.tokens:
            raise BadSessionBlob(
                f"`tokens` ({len(tokens)}) are not the history the blob covers "
                f"({snap.n_tok} tokens): send back the tokens the export returned"
            )
        too_big = [t for t in snap.tokens if t >= self.vocab_size]
        if too_big:
            raise BadSessionBlob(
                f"the blob's tokens include id {too_big[0]}, outside this model's "
                f"{self.vocab_size}-token vocabulary"
            )
        if snap.n_tok > self.context_window:
            raise BadSessionBlob(
                f"the blob holds {snap.n_tok} tokens; this model's context window is "
                f"{self.context_window}"
            )
        self.sessions.install(session_id, Conversation(snap.tokens, snap.k, snap.v))
        return snap.n_tok
