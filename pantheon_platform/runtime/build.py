"""The build id GET / and /v1/models report: the commit this server runs from."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path


@functools.cache
def build_id() -> str:
    """Short commit of the checkout this server runs from, "-dirty" when tracked files
    changed, or "unknown" (no git, not a checkout, no commit yet). Computed once."""
    from django.conf import settings

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(Path(settings.BASE_DIR)), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")
