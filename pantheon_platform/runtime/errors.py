"""The runtime's exceptions: what a request meets when nothing can serve it, and the
operator refusals, which the operator routes map onto status codes."""

from __future__ import annotations


class NoModelsLoaded(Exception):
    """Nothing can serve a completion yet (still loading, load failed, or none configured)."""


class ModelNotFound(Exception):
    """Several models are loaded and the request's `model` names none of them."""


# Operator refusals. The operator routes map each class onto a status code.
class OperatorError(Exception):
    pass


class InvalidOption(OperatorError):
    """The request cannot be honoured by this server (400)."""


class PathNotAllowed(OperatorError):
    """The file is outside PANTHEON_MODEL_DIRS (403)."""


class NotFound(OperatorError):
    """No such file, loaded model or alias (404)."""


class Conflict(OperatorError):
    """Already loaded / loading / unloading, nothing evictable, alias clash (409)."""


class InsufficientMemory(OperatorError):
    """Admission: the estimate does not fit in the free memory (507)."""


class OperationFailed(OperatorError):
    """Anything else went wrong (500)."""


def describe(exc: Exception) -> str:
    """An operator-facing reason: refusals speak for themselves, anything else names its type."""
    return str(exc) if isinstance(exc, OperatorError) else f"{type(exc).__name__}: {exc}"
