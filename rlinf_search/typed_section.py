"""One config section (a mapping of keys) to the dataclass that is its typed view."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def section_to(cls: type[T], section: Mapping[str, Any], *, key: str) -> T:
    """``cls`` built from ``section`` (at config path ``key``): an unknown key is a ``ValueError`` naming it
    and the keys the section takes; a null value means the field's default."""
    known = sorted(f.name for f in fields(cls))
    unknown = sorted(set(section) - set(known))
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown key; {key} takes {', '.join(known)}")
    return cls(**{name: value for name, value in section.items() if value is not None})
