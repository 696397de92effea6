"""A config key's type and range as the docs, the fuzz test and the JSON Schema word them (``Key``), read from its
pydantic field (``key_of``): the model of ``config/model.py`` declares each key once, and this describes it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Key:
    """One leaf of the config tree."""

    kind: str
    """``int``, ``float``, ``bool``, ``str`` or ``list`` (of strings)."""
    low: float | None = None
    """The smallest value allowed (None: no lower bound)."""
    high: float | None = None
    """The largest value allowed (None: no upper bound)."""
    low_open: bool = False
    """``low`` itself is outside the range."""
    high_open: bool = False
    """``high`` itself is outside the range."""
    also: tuple[tuple[float, str], ...] = ()
    """Values allowed outside the range, each with its meaning (``runner.max_steps: -1``: no step limit)."""
    unbounded: str | None = None
    """Why a number takes any value; a number without a range must say it."""
    choices: tuple[str, ...] = ()
    """For a ``str`` key with a fixed set of meanings (not an extension point, which its registry resolves): them."""
    relation: str = ""
    """A bound set by another key, in words (``< runner.seq_length``): its reader checks it, the docs show it."""

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def bounded(self) -> bool:
        return self.low is not None or self.high is not None

    def range_words(self) -> str:
        """The range in words: ``>= 1``, ``in (0, 1]``, ``> 0, or -1``."""
        if self.low is not None and self.high is not None:
            opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
            words = f"in {opening}{_number(self.low)}, {_number(self.high)}{closing}"
        elif self.low is not None:
            words = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        elif self.high is not None:
            words = f"{'<' if self.high_open else '<='} {_number(self.high)}"
        else:
            words = "any number"
        return words + "".join(f", or {_number(value)} ({meaning})" for value, meaning in self.also)

    def inside(self, value: float) -> bool:
        if any(value == allowed for allowed, _ in self.also):
            return True
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return True


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def leaves(schema: Any, prefix: str = ""):
    """(dotted path, ``Key``) of every declared leaf of ``schema``, in order (open ``"*"`` sections have none)."""
    if not isinstance(schema, dict):
        return
    for name, node in schema.items():
        path = f"{prefix}{name}"
        if isinstance(node, Key):
            yield path, node
        else:
            yield from leaves(node, f"{path}.")


def field_keys(model: type[BaseModel]) -> list[tuple[str, Key]]:
    """(key, ``Key``) of every scalar field of the section model ``model`` (``key_of``)."""
    return [(name, key) for name, info in model.model_fields.items() if (key := key_of(info)) is not None]


def field_defaults(model: type[BaseModel]) -> list[tuple[str, Any, str | None]]:
    """(key, default, ``default_words``) of every field ``field_keys`` lists: ``MISSING`` for a required one;
    ``default_words`` where the docs state a default computed from other keys
    (``json_schema_extra={"default_words": ...}``)."""
    out = []
    for name, info in model.model_fields.items():
        if key_of(info) is not None:
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            out.append((name, MISSING if info.is_required() else info.default, extra.get("default_words")))
    return out


def key_of(info: FieldInfo) -> Key | None:
    """A pydantic field's type and range as a ``Key`` (what the docs, the fuzz test and the JSON Schema read), or
    None for a field that is not a scalar, a list of strings or a choice (a nested section, a free mapping) and for
    one computed from another key (``json_schema_extra={"set_from": <key>}``)."""
    union = get_origin(info.annotation) in (Union, UnionType)
    kinds = [arg for arg in (get_args(info.annotation) if union else (info.annotation,)) if arg is not type(None)]
    if len(kinds) != 1:
        return None
    kind, extra = kinds[0], info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "set_from" in extra:  # computed from another key at start-up, not a key of this section
        return None
    if get_origin(kind) is Literal:
        return Key("str", choices=tuple(get_args(kind)))
    if get_origin(kind) is tuple and get_args(kind)[:1] == (str,):
        return Key("list")
    if kind not in (bool, int, float, str):
        return None
    bounds = {type(item).__name__: item for item in info.metadata}
    low, high = bounds.get("Gt") or bounds.get("Ge"), bounds.get("Lt") or bounds.get("Le")
    return Key(kind.__name__, low=getattr(low, "gt", getattr(low, "ge", None)),
               high=getattr(high, "lt", getattr(high, "le", None)), low_open="Gt" in bounds, high_open="Lt" in bounds,
               unbounded=extra.get("unbounded"), relation=extra.get("relation", ""),
               also=tuple(tuple(pair) for pair in extra.get("also", ())))
