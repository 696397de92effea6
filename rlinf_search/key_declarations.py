"""What a value of each config key may be: its type and, for a number, its range (or, for a string, its choices),
declared once per key.

- ``SCHEMA``'s leaves are ``Key`` declarations (``config/schema.py``), so the tree that lists the accepted keys also
  says what each one takes.
- A section read into a dataclass declares each field's ``Key`` beside its default (``declared``), and ``SCHEMA``
  takes those (``field_keys``) rather than writing them again: ``algorithm.distill``, the optimizer sections, the
  Megatron keys. The open sections (``cluster``, ``tools.search``, the distillation teacher) are checked when their
  dataclass is built (``check_fields``).
- ``check_values`` walks the raw config against ``SCHEMA`` once at start-up, before any section is read: a value of
  the wrong type or outside its range stops the run in one line that names the key, what it must be and the value.
  The section readers then only convert and combine keys (a limit below another, a name a registry resolves).

``tests/test_config_fuzz.py`` walks every declaration with values generated from it. A number with no range is
declared with the reason it needs none (``unbounded``); none does today.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from types import UnionType
from typing import Any, Callable, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

T = TypeVar("T")


class ValueOutOfRange(ValueError):
    """A value of the wrong type or outside its declared range (one line: the key, what it must be, the value)."""


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

    def check(self, path: str, value: Any) -> None:
        """Raise ``ValueOutOfRange`` (one line: the key, what it must be, the value) unless ``value`` fits; null
        always fits (it means the key's default)."""
        if value is None:
            return
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueOutOfRange(f"{path}: expected true or false, got {value!r}")
            return
        if self.kind == "str":
            if not isinstance(value, str):
                raise ValueOutOfRange(f"{path}: expected a string, got {value!r}")
            if self.choices and value not in self.choices:
                raise ValueOutOfRange(f"{path}: unknown {value!r}; choose one of {', '.join(self.choices)}")
            return
        if self.kind == "list":
            # A lone string is refused, not taken as a list of one: readers would iterate its characters.
            if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
                raise ValueOutOfRange(f"{path}: expected a list of strings, got {value!r}")
            return
        number = _as_number(path, value, integer=self.kind == "int")
        if not self.inside(number):
            raise ValueOutOfRange(f"{path} must be {self.range_words()}, got {value!r}")


def _as_number(path: str, value: Any, *, integer: bool) -> float:
    if isinstance(value, str):  # a command-line override may arrive quoted ("4096"); the reader converts it alike
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueOutOfRange(f"{path}: expected {'an integer' if integer else 'a number'}, got {value!r}")
    if integer and isinstance(value, float) and not value.is_integer():
        raise ValueOutOfRange(f"{path}: expected an integer, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueOutOfRange(f"{path}: expected a finite number, got {value!r}")
    return value


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def Int(*, ge: float | None = None, le: float | None = None, gt: float | None = None, lt: float | None = None,
        also: tuple[tuple[float, str], ...] = (), unbounded: str | None = None, relation: str = "") -> Key:
    """An integer key in a range: ``Int(ge=1)``, ``Int(ge=0, le=20)``."""
    return _ranged("int", ge, le, gt, lt, also, unbounded, relation)


def Float(*, ge: float | None = None, le: float | None = None, gt: float | None = None, lt: float | None = None,
          also: tuple[tuple[float, str], ...] = (), unbounded: str | None = None, relation: str = "") -> Key:
    """A number key in a range: ``Float(gt=0)``, ``Float(ge=0, le=1)``."""
    return _ranged("float", ge, le, gt, lt, also, unbounded, relation)


def _ranged(kind, ge, le, gt, lt, also, unbounded, relation) -> Key:
    if ge is not None and gt is not None or le is not None and lt is not None:
        raise ValueError("give one lower bound (ge or gt) and one upper bound (le or lt)")
    low, high = (gt if ge is None else ge), (lt if le is None else le)
    if low is None and high is None and not unbounded:
        raise ValueError(f"a {kind} key declares its range, or why it has none (unbounded=...)")
    return Key(kind, low=low, high=high, low_open=gt is not None, high_open=lt is not None, also=also,
               unbounded=unbounded, relation=relation)


def Choice(*options: str) -> Key:
    """A string key with a fixed set of meanings: ``Choice("sync", "overlap")``."""
    return Key("str", choices=tuple(options))


PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "float32": "float32",
              "bfloat16": "bfloat16", "float16": "float16"}
"""Precision spellings to torch dtype names."""


def dtype_name(precision: str) -> str:
    """A precision spelling (``bf16``) as its torch dtype name (``bfloat16``)."""
    return PRECISIONS[precision]


def training_dtype_name(precision: str) -> str:
    """``dtype_name`` of a model that trains, where fp16 is refused: fp16 gradients need loss scaling, which this
    trainer does not do (bf16 has fp32's range and needs none)."""
    if PRECISIONS[precision] == "float16":
        raise ValueError("fp16 training needs loss scaling, which this trainer does not do; use bf16 (bf16 compute "
                         "over fp32 master weights) or fp32")
    return PRECISIONS[precision]


BOOL = Key("bool")
STR = Key("str")
STRS = Key("list")
PRECISION = Choice(*PRECISIONS)


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


def check_values(raw: dict, schema: dict, path: str = "") -> None:
    """Check every value of ``raw`` that ``schema`` declares against its ``Key``; raise ``ValueOutOfRange`` on the
    first that does not fit. Keys ``schema`` does not know are ``check_keys``' to refuse."""
    for name, value in raw.items():
        node = schema.get(name) if isinstance(schema, dict) else None
        where = f"{path}.{name}" if path else name
        if isinstance(node, Key):
            node.check(where, value)
        elif isinstance(node, dict) and isinstance(value, dict):
            check_values(value, node, where)


def declared(default: Any, key: Key, *, at: str | None = None, convert: Callable[[Any], Any] | None = None,
             registry: Any = None, default_words: str | None = None) -> Any:
    """A dataclass field with ``default`` (``dataclasses.MISSING``: required) whose value ``key`` declares:
    ``topk: int = declared(3, Int(ge=1))``. ``at``: the config key it reads, relative to its section, where that is
    not the field's name (``at="model.precision"``); ``convert``: turns the key's value into the field's
    (a precision spelling into a torch dtype name); ``registry``: the extension point that must resolve the name
    (``from_section`` asks it, so a bad name stops the run at start-up); ``default_words``: the default cell of docs/config.md, where
    the field's default is computed from other keys (``"`<output_dir>/logs`"``)."""
    return field(default=default, metadata={"key": key, "at": at, "convert": convert, "registry": registry,
                                            "default_words": default_words})


def field_keys(cls) -> list[tuple[str, Key]]:
    """(config key, ``Key``) of every declared field of the dataclass ``cls``: the field's ``at``, else its name; of
    a pydantic section model (``section_model.ConfigSection``), every scalar field, described by ``key_of``."""
    if _is_model(cls):
        return [(name, key) for name, info in cls.model_fields.items() if (key := key_of(info)) is not None]
    return [(_config_key(f), f.metadata["key"]) for f in fields(cls) if "key" in f.metadata]


def field_defaults(cls) -> list[tuple[str, Any, str | None]]:
    """(config key, default, ``default_words``) of every field ``field_keys`` lists: ``MISSING`` for a required
    one; ``default_words`` where the docs state a default computed from other keys."""
    if _is_model(cls):
        out = []
        for name, info in cls.model_fields.items():
            if key_of(info) is None:
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            out.append((name, MISSING if info.is_required() else info.default, extra.get("default_words")))
        return out
    return [(_config_key(f), f.default, f.metadata.get("default_words")) for f in fields(cls) if "key" in f.metadata]


def _is_model(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, BaseModel)


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


def _joined(path: str, key: str) -> str:
    """``key`` under the section at ``path`` ("" for the config's top)."""
    return f"{path}.{key}" if path else key


def _config_key(f) -> str:
    """The config key a declared field reads, relative to its section: its ``at``, else its name."""
    return f.metadata.get("at") or f.name


def section_tree(cls, also: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cls``'s declared fields as a ``SCHEMA`` section: ``at`` paths (``model.precision``) become nested sections.
    ``also``: the section's keys that no field of ``cls`` reads (dotted, relative to the section), with their
    declarations."""
    tree: dict[str, Any] = {}
    for path, key in [*field_keys(cls), *(also or {}).items()]:
        *parents, name = path.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = key
    return tree


def merged(*trees: dict[str, Any]) -> dict[str, Any]:
    """``SCHEMA`` trees joined into one (a view reading keys of several sections gives a tree from the top); a key
    declared by two of them is a ``ValueError``."""
    out: dict[str, Any] = {}
    for tree in trees:
        for name, node in tree.items():
            if isinstance(node, dict) and isinstance(out.get(name), dict):
                out[name] = merged(out[name], node)
            elif name in out:
                raise ValueError(f"{name}: declared twice")
            else:
                out[name] = node
    return out


def from_section(cls: type[T], section: dict | None, *, path: str, **given: Any) -> T:
    """``cls`` built from the config ``section`` at ``path`` that its declared fields read (values checked by
    ``check_values`` before this runs; null or absent: the field's default, and a ``ValueError`` naming the key for a
    required one), with ``given`` for the fields computed from other keys. A pydantic section model validates the
    section itself (``section_model.parse_section``)."""
    if _is_model(cls):
        from rlinf_search.section_model import parse_section

        return parse_section(cls, {**(section or {}), **given}, path=path)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if "key" not in f.metadata or f.name in given:
            continue
        value: Any = section or {}
        for part in _config_key(f).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{_joined(path, _config_key(f))} is required")
            continue
        kind, convert, registry = f.metadata["key"].kind, f.metadata.get("convert"), f.metadata.get("registry")
        value = int(value) if kind == "int" else float(value) if kind == "float" else value
        where = _joined(path, _config_key(f))
        if registry is not None:
            registry.resolve(value, key=where)
        try:
            values[f.name] = convert(value) if convert else value
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return cls(**values, **given)


def check_fields(obj: Any, path: str) -> None:
    """Check every declared field of the dataclass instance ``obj`` (the section at config path ``path``); raise
    ``ValueOutOfRange`` naming ``path.field`` for the first that does not fit. A field with ``convert`` holds a
    converted value, which its key does not describe: it is checked in the config, not here."""
    for f in fields(type(obj)):
        if "key" in f.metadata and f.metadata.get("convert") is None:
            f.metadata["key"].check(_joined(path, _config_key(f)), getattr(obj, f.name))
