"""The interface through which the registry keeps what must outlive the process
(operators.store.DatabaseStore in the server)."""

from __future__ import annotations

from pantheon_platform.runtime.load_spec import LoadSpec


class Store:
    """Where the registry keeps what must outlive the process. This default remembers
    nothing: every start loads settings.PANTHEON_MODELS. Each call is one transaction."""

    def startup(self, seed: list[LoadSpec]) -> tuple[list[LoadSpec], dict[str, str]]:
        """The models to load at start (in order) and the aliases; `seed` fills an empty store."""
        return seed, {}

    def loaded(self, spec: LoadSpec) -> None:
        pass

    def unloaded(self, name: str) -> None:
        pass

    def failed(self, spec: LoadSpec, error: str) -> None:
        pass

    def pinned(self, name: str, pinned: bool) -> None:
        pass

    def alias_set(self, alias: str, target: str) -> None:
        pass

    def alias_deleted(self, alias: str) -> None:
        pass
