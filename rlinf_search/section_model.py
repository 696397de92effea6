"""The pydantic base of a config section that is its own typed view (``tools.search``, ``monitors``, ...), and the one
formatter of a pydantic error as the config's one-line message.

A section model forbids unknown keys, is frozen, takes null as "the field's default" (as every key does) and reads
each field's docstring as its description (docs/config.md, the JSON Schema). It refuses what the YAML could carry by
mistake and pydantic's lax mode would take: ``true`` for a number, ``"false"`` for a flag, ``inf`` for a limit.
A quoted number (``"4096"``, as a command-line override may arrive) is taken, as before.
"""

from __future__ import annotations

import difflib
from types import UnionType
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

S = TypeVar("S", bound=BaseModel)

_RANGE_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
"""Pydantic's range errors, worded as the config's (``runner.max_epochs must be >= 1, got 0``)."""
_TYPE_WORDS = {"int_parsing": "an integer", "int_from_float": "an integer", "int_type": "an integer",
               "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number",
               "string_type": "a string", "bool_type": "true or false", "bool_parsing": "true or false",
               "tuple_type": "a list of strings", "list_type": "a list of strings", "dict_type": "a section of keys",
               "model_type": "a section of keys", "model_attributes_type": "a section of keys"}
"""Pydantic's type errors, worded as the config's (``expected an integer``)."""


class ConfigSection(BaseModel):
    """A config section validated by its fields' types and ``Field`` ranges (subclass it, one field per key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True,
                              strict=False)
    config_path: ClassVar[str] = ""
    """Where the section sits in the config (``tools.search``): the errors of ``replace`` name it."""
    null_kept: ClassVar[frozenset[str]] = frozenset()
    """Keys whose null is a value of its own, not the default (``algorithm.clip_ratio_c: null``: no dual clip)."""

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes``, validated as a new section (``dataclasses.replace`` of a section model);
        ``ValueError`` in one line naming the key."""
        try:
            return type(self).model_validate({**dict(self), **changes})
        except ValidationError as exc:
            raise ValueError(error_line(exc, self.config_path, type(self))) from None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None or key in cls.null_kept}
        return data

    @field_validator("*", mode="wrap")
    @classmethod
    def _also_allowed(cls, value: Any, handler, info) -> Any:
        # A value allowed outside the range (``json_schema_extra={"also": [(-1, meaning)]}``) passes as it is.
        field = cls.model_fields.get(info.field_name)
        extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
        if not isinstance(value, bool) and any(value == allowed for allowed, _ in extra.get("also", ())):
            return value
        return handler(value)

    @field_validator("*", mode="before")
    @classmethod
    def _flags_and_numbers_apart(cls, value: Any, info) -> Any:
        # Lax mode reads true as 1 and "false" or 0 as a flag; either is a mistake in a YAML, not a value.
        annotation = cls.model_fields[info.field_name].annotation if info.field_name in cls.model_fields else None
        kinds = _kinds(annotation)
        if annotation in _STRINGS and isinstance(value, (list, tuple)) and not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of strings")  # named with the list, not one item of it
        if kinds == {bool} and not isinstance(value, bool):
            raise ValueError("expected true or false")
        if isinstance(value, bool) and kinds and kinds <= {int, float}:
            raise ValueError("expected a number, not true or false")
        return value


_STRINGS = (tuple[str, ...], tuple[str, ...] | None)


def section_model_of(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (``X`` or ``X | None``), or None."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    found = [option for option in options if isinstance(option, type) and issubclass(option, BaseModel)]
    return found[0] if found else None


def _kinds(annotation: Any) -> set[type]:
    """The scalar types a field annotation takes (``int | None``: int), or an empty set for anything else."""
    args = getattr(annotation, "__args__", None)
    if args:
        inner = [_kinds(arg) for arg in args if arg is not type(None)]
        return set().union(*inner) if all(inner) else set()
    return {annotation} if annotation in (bool, int, float) else set()


def error_line(exc: ValidationError, path: str, model: type[BaseModel]) -> str:
    """The first error of ``exc`` (``model`` validating the section at config path ``path``) as one line
    (``error_lines``)."""
    return error_lines(exc, path, model)[0]


def error_lines(exc: ValidationError, path: str, model: type[BaseModel]) -> list[str]:
    """Every error of ``exc`` as one line naming the key (``model`` validated the section at config path
    ``path``)."""
    return [_line(error, path, model) for error in exc.errors()]


def _line(error: dict, path: str, model: type[BaseModel]) -> str:
    """One error as one line naming the key: an unknown key with the keys its section takes and the nearest of
    them, a range as ``must be >= 1``, a choice with the choices, a rule between keys (a model validator's) as it
    words itself, anything else as pydantic words it; each with the value."""
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
    if error["type"] in _TYPE_WORDS:
        return f"{where}: expected {_TYPE_WORDS[error['type']]}, got {value!r}"
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
            field = current.model_fields.get(part)
            current = section_model_of(field.annotation) if field is not None else None
    return path


def _key_at(model: type[BaseModel], loc: list[str]):
    """The ``Key`` (type and range) of the field at ``loc``, or None."""
    from rlinf_search.key_ranges import key_of

    names = [part for part in loc if not part.isdigit()]
    if not names:
        return None
    owner = _model_at(model, names[:-1])
    info = owner.model_fields.get(names[-1]) if owner is not None else None
    return key_of(info) if info is not None else None


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    for name in loc:
        field = model.model_fields.get(name)
        inner = section_model_of(field.annotation) if field is not None else None
        if inner is None:
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
