"""The pydantic base of a config section that is its own typed view (``tools.search``, ``monitors``, ...), and the one
formatter of a pydantic error as the config's one-line message.

A section model forbids unknown keys, is frozen, takes null as "the field's default" (as every key does) and reads
each field's docstring as its description (docs/config.md, the JSON Schema). It refuses what the YAML could carry by
mistake and pydantic's lax mode would take: ``true`` for a number, ``"false"`` for a flag, ``inf`` for a limit.
A quoted number (``"4096"``, as a command-line override may arrive) is taken, as before.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

S = TypeVar("S", bound=BaseModel)

_RANGE_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
"""Pydantic's range errors, worded as the config's (``runner.max_epochs must be >= 1, got 0``)."""


class ConfigSection(BaseModel):
    """A config section validated by its fields' types and ``Field`` ranges (subclass it, one field per key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True,
                              strict=False)
    config_path: ClassVar[str] = ""
    """Where the section sits in the config (``tools.search``): errors of a direct construction name it."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:  # one line naming the key, as a config error reads, not pydantic's block
            raise ValueError(error_line(exc, self.config_path, type(self))) from None

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes``, validated as a new section (``dataclasses.replace`` of a section model)."""
        return type(self)(**{**dict(self), **changes})

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _flags_and_numbers_apart(cls, value: Any, info) -> Any:
        # Lax mode reads true as 1 and "false" or 0 as a flag; either is a mistake in a YAML, not a value.
        kinds = _kinds(cls.model_fields[info.field_name].annotation) if info.field_name in cls.model_fields else set()
        if kinds == {bool} and not isinstance(value, bool):
            raise ValueError("expected true or false")
        if isinstance(value, bool) and kinds and kinds <= {int, float}:
            raise ValueError("expected a number, not true or false")
        return value


def _kinds(annotation: Any) -> set[type]:
    """The scalar types a field annotation takes (``int | None``: int), or an empty set for anything else."""
    args = getattr(annotation, "__args__", None)
    if args:
        inner = [_kinds(arg) for arg in args if arg is not type(None)]
        return set().union(*inner) if all(inner) else set()
    return {annotation} if annotation in (bool, int, float) else set()


def error_line(exc: ValidationError, path: str, model: type[BaseModel]) -> str:
    """The first error of ``exc`` (``model`` validating the section at config path ``path``) as one line naming the
    key: an unknown key with the keys its section takes and the nearest of them, a range as ``must be >= 1``, a rule
    between keys (a model validator's) as it words itself, anything else as pydantic words it; each with the value."""
    error = exc.errors()[0]
    loc = _key_path(model, error["loc"])
    where = ".".join(part for part in [path, *loc] if part)
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        section = ".".join(part for part in [path, *loc[:-1]] if part)
        names = sorted(_fields_at(model, loc[:-1]))
        near = difflib.get_close_matches(loc[-1], names, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        return f"{where}: unknown key; {section or 'the config'} takes {', '.join(names) or 'none'}{hint}"
    key = _key_at(model, loc)
    if error["type"] in _RANGE_WORDS:
        if key is not None and key.numeric and key.bounded:
            return f"{where} must be {key.range_words()}, got {value!r}"
        (limit,) = error["ctx"].values()
        return f"{where} must be {_RANGE_WORDS[error['type']]} {limit}, got {value!r}"
    if error["type"] == "literal_error" and key is not None and key.choices:
        return f"{where}: unknown {value!r}; choose one of {', '.join(map(str, key.choices))}"
    if error["type"] == "value_error" and (not loc or (path and message.startswith(path))):
        return message  # a model validator's rule between keys: its message names them
    return f"{where}{' ' if message.startswith('must be') else ': '}{message}, got {value!r}"


def _key_path(model: type[BaseModel], loc: tuple) -> list[str]:
    """The config keys of a pydantic error location: field names (an unknown one included) and list positions,
    without the union member tags pydantic adds inside a field (``server_addr.str``)."""
    path: list[str] = []
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            path.append(str(part))
        elif current is not None:
            path.append(part)
            inner = getattr(current.model_fields.get(part), "annotation", None)
            current = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
    return path


def _key_at(model: type[BaseModel], loc: list[str]):
    """The ``Key`` (type and range) of the field at ``loc``, or None."""
    from rlinf_search.key_declarations import key_of

    names = [part for part in loc if not part.isdigit()]
    if not names:
        return None
    owner = _model_at(model, names[:-1])
    info = owner.model_fields.get(names[-1]) if owner is not None else None
    return key_of(info) if info is not None else None


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    for name in loc:
        inner = getattr(model.model_fields.get(name), "annotation", None)
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    return model


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The keys of the (nested) section of ``model`` at ``loc``."""
    owner = _model_at(model, loc)
    return list(owner.model_fields) if owner is not None else []


def parse_section(model: type[S], section: Any, *, path: str) -> S:
    """``section`` (the config's ``path``; None: every default) validated by ``model``; ``ValueError`` in one line
    (``error_line``)."""
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"{path}: expected a section of keys, got {type(section).__name__}")
    try:
        return model.model_validate(section or {})
    except ValidationError as exc:
        raise ValueError(error_line(exc, path, model)) from None
