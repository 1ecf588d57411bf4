"""LoadSpec: what an operator asked for when loading a model (the engine's ModelConfig as
sent, and the pin), the engine config a load gets from it, and the `chat_template` option."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from engine import ModelConfig
from pantheon_platform.model_files import allowed_model_path, is_file
from pantheon_platform.runtime.django_settings import configured_models, queue_limits, setting
from pantheon_platform.runtime.errors import InvalidOption, NotFound, PathNotAllowed

MAX_CHAT_TEMPLATE_BYTES = 1 << 20  # a `chat_template` load option, inline or a file


@dataclass(frozen=True)
class LoadSpec:
    """Everything an operator asked for when loading a model: the engine's config holding
    the per-model options as sent (zero = engine default; `chat_template` a template's text
    or a file in a model folder, read again at each load), and whether it is pinned."""

    config: ModelConfig
    pinned: bool = False

    @classmethod
    def of(cls, name: str, path: str, *, pinned: bool = False, **options) -> LoadSpec:
        """A spec from ModelConfig's keyword arguments (ctx_cap, dies, quantize, ...)."""
        return cls(ModelConfig(name=name, path=path, **options), pinned)

    @property
    def name(self) -> str:
        """The served name: the registry's key."""
        return self.config.name

    def engine_config(self) -> ModelConfig:
        """The engine's config: these options plus settings.PANTHEON_ENGINE_OPTIONS (the
        ones every model shares; the queue's from the runtime config), keeping only what
        this engine's ModelConfig knows, and the chat template as text."""
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        shared = {k: v for k, v in setting("PANTHEON_ENGINE_OPTIONS", {}).items() if k in known}
        shared.update(queue_limits())
        return replace(
            self.config, chat_template=resolve_chat_template(self.config.chat_template), **shared
        )


def configured_specs() -> list[LoadSpec]:
    """settings.PANTHEON_MODELS as load specs: what seeds an empty model store."""
    return [LoadSpec(cfg) for cfg in configured_models()]


def resolve_chat_template(value: str) -> str:
    """The text of a `chat_template` load option: the option itself when it is a template
    ("{%" or "{{" in it), else the file it names inside the model folders. "" stays "".
    Raises PathNotAllowed, NotFound, or InvalidOption (unreadable, too big, or a template
    that does not compile)."""
    from engine import ChatTemplate, ChatTemplateError

    if not value:
        return ""
    if "{%" in value or "{{" in value:
        text = value
        if len(text.encode("utf-8", "replace")) > MAX_CHAT_TEMPLATE_BYTES:
            raise InvalidOption(f"chat_template: over {MAX_CHAT_TEMPLATE_BYTES} bytes")
    else:
        try:
            path = allowed_model_path(value)
        except PermissionError as exc:
            raise PathNotAllowed(f"chat_template: {exc}") from None
        if not is_file(path):
            raise NotFound(f"chat_template: no such file: {value}")
        if path.stat().st_size > MAX_CHAT_TEMPLATE_BYTES:
            raise InvalidOption(
                f"chat_template: {value} is over {MAX_CHAT_TEMPLATE_BYTES} bytes; "
                "a chat template is a small text file"
            )
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidOption(f"chat_template: {value} is not UTF-8 text") from None
        except OSError as exc:
            raise InvalidOption(f"chat_template: cannot read {value}: {exc}") from None
    try:
        ChatTemplate(text)
    except ChatTemplateError as exc:
        raise InvalidOption(f"chat_template: {exc}") from None
    return text
