"""Small typed readers for the environment, and the PANTHEON_MODELS spec parser.

Settings are the only place that reads os.environ; the engine gets explicit config objects.
An unset or empty variable means "use the default".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EnvError(ValueError):
    """A variable is set to something its type cannot hold; fail at start-up, not later."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def env_int(name: str, default: int) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not an integer") from None


def env_bool(name: str, default: bool = False) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_list(name: str, default: list[str] | None = None, *, sep: str = ",") -> list[str]:
    """Items split on any character of `sep`, stripped, empties dropped."""
    value = _raw(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in re.split(f"[{re.escape(sep)}]", value) if item.strip()]


def env_path(name: str, default: Path) -> Path:
    """A path; relative values are taken from the working directory, like any CLI path."""
    value = _raw(name)
    path = default if value is None else Path(value)
    return path.expanduser().resolve()


def parse_model_specs(spec: list[str], model_dirs: list[Path]) -> list[tuple[str, str]]:
    """Turn `name=path` / bare `path` items into (served name, file path) pairs.

    A bare path serves under its file stem. A relative path is looked up in the working
    directory first, then in each model dir; if it is found nowhere it is kept as given so
    the load fails with a clear "file not found" for that name instead of at start-up.
    """
    models: list[tuple[str, str]] = []
    for item in spec:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "", item
        name, path = name.strip(), path.strip()
        if not path:
            raise EnvError(f"PANTHEON_MODELS item {item!r} has no path")
        resolved = _find_model_file(Path(path).expanduser(), model_dirs)
        models.append((name or resolved.stem, str(resolved)))
    names = [name for name, _ in models]
    if len(set(names)) != len(names):
        raise EnvError(f"PANTHEON_MODELS serves one name twice: {names}")
    return models


def _find_model_file(path: Path, model_dirs: list[Path]) -> Path:
    if path.is_absolute():
        return path
    for base in [Path.cwd(), *model_dirs]:
        if (base / path).is_file():
            return (base / path).resolve()
    return path
