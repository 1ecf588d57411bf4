"""A session id in its namespace (the API key that owns it): the table's key.

See engine.serving.sessions for what namespaces mean; the one place a client's id
becomes a SessionKey is pantheon_platform.tenancy.session_key.
"""

from __future__ import annotations

OPEN = "open"  # the namespace of a server with no API key, and of a plain str id


class SessionKey(str):
    """A session id (the str itself: what logs, file headers and replies show) in its
    namespace. Equal only to a key of the same id and namespace; a plain str is the same
    id in the OPEN namespace (equal to, and hashing like, SessionKey(id, OPEN))."""

    namespace: str

    def __new__(cls, session_id: str, namespace: str = OPEN) -> SessionKey:
        key = super().__new__(cls, session_id)
        key.namespace = namespace
        return key

    @classmethod
    def of(cls, value: str) -> SessionKey:
        """`value` as a key: a SessionKey as it is, a plain str in the OPEN namespace."""
        return value if isinstance(value, SessionKey) else cls(value)

    @property
    def id(self) -> str:
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionKey):
            return self.namespace == other.namespace and str.__eq__(self, other)
        if isinstance(other, str):
            return self.namespace == OPEN and str.__eq__(self, other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        if self.namespace == OPEN:
            return str.__hash__(self)
        return hash((self.namespace, str.__str__(self)))

    def __repr__(self) -> str:
        return f"SessionKey({str.__repr__(self)}, {self.namespace!r})"

    def __reduce__(self):
        return (SessionKey, (str.__str__(self), self.namespace))
