"""Where spilled sessions live on disk and what their files are called: the names both
the writer (sessions.persistence) and the records (sessions.records, the console) use."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from engine import OPEN, SessionKey

SUFFIX = ".pnkv"
TEMP_MARK = ".tmp-"  # in the name of a file being written: ".<final name>.tmp-<random>"
REJECTED_DIR = "rejected"
REASON_SUFFIX = ".reason.txt"


def sessions_root() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "sessions"


def model_folder(root: Path, model_name: str) -> Path:
    """The spill folder of a served name: readable, and unique per exact name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name).strip("._")[:64] or "model"
    digest = hashlib.sha256(model_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return root / f"{safe}-{digest}"


def file_stem(session_id: str) -> str:
    """What a session's spill files are named after (the id itself may be private): a
    hash of its key. A plain str is an id in the open namespace, whose stem is the hash
    of the id alone (the names an open server always gave its files)."""
    key = SessionKey.of(session_id)
    text = key.id if key.namespace == OPEN else json.dumps([key.namespace, key.id])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]
