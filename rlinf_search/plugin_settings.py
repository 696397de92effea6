"""Settings a plugin brings: a registry entry (a policy loss, an advantage estimator, a reward score, a tool, an agent
protocol, a rollout engine) may declare a pydantic model of keys of its own, which start-up validates from the
config with the same one-line errors as every other key, and hands to the entry (a loss and a score with each call,
an estimator in its inputs, a tool when a rollout rank builds it, a protocol and an engine in their config). A
user's plugin named by dotted path declares its model the same way, in its own file:

    class ClipSettings(pydantic.BaseModel):
        truncation: float = pydantic.Field(4.0, gt=1)

    @with_settings(ClipSettings)
    def my_loss(logprob, old_logprob, advantages, *, response_mask, settings: ClipSettings, **_): ...

and the config sets them beside the name (``algorithm.policy_loss_settings: {truncation: 3}``;
``algorithm.adv_settings``, ``reward.score_settings``, ``agent.protocol_settings``, ``rollout.engine_settings``; a
tool's in its own section, ``tools.<name>``). An entry that
declares no model takes no settings: a section written for it is refused.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from rlinf_search.section_model import error_line

T = TypeVar("T")

SETTINGS_ATTRIBUTE = "settings_model"
"""The attribute of an entry its settings model is kept in (set by ``with_settings``)."""


def with_settings(model: type[BaseModel]) -> Callable[[T], T]:
    """Decorator declaring the pydantic model of an entry's own keys."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"with_settings takes a pydantic BaseModel subclass, got {model!r}")

    def declare(entry: T) -> T:
        setattr(entry, SETTINGS_ATTRIBUTE, model)
        return entry

    return declare


def settings_model(entry: Any) -> type[BaseModel] | None:
    """The settings model ``entry`` declared, or None."""
    return getattr(entry, SETTINGS_ATTRIBUTE, None)


def read_settings(entry: Any, section: Any, *, path: str, name: str) -> BaseModel | None:
    """``section`` (the config's ``path``) validated by ``entry``'s settings model; None when it declares none and
    the section is empty. ``ValueError`` in one line naming the key: an unknown key (with the nearest names), a value
    the model refuses (its message and the value), settings for an entry (``name``) that takes none."""
    model = settings_model(entry)
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"{path}: expected a section of keys, got {type(section).__name__}")
    values = {key: value for key, value in (section or {}).items() if value is not None}  # null: the default
    if model is None:
        if values:
            raise ValueError(f"{path}: {name} takes no settings (it declares no settings model); remove {path}")
        return None
    known = sorted(model.model_fields)
    for key in values:
        if key not in model.model_fields:
            near = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise ValueError(f"{path}.{key}: unknown key; {name} takes {', '.join(known) or 'none'}{hint}")
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(error_line(exc, path, model)) from None
