"""Readers of the raw config dict: a section read into its view by the fields' declarations (``read_view``), and one
typed value per dotted key where a reader combines keys, with the key's path in every error.

Every reader treats an explicit ``null`` as "use the default" (``algorithm.kl_beta: null`` is 0.0). Types and ranges
are the keys' declarations' (``key_declarations.py``), checked once before any reader runs, so a value of the wrong
type is a ``ConfigError`` naming the key, never a ``TypeError`` from deep inside.
The default a reader is handed is the typed view's field default (``RunnerConfig.max_steps``), never a
second literal: ``tests/test_config_defaults.py`` checks every call.
"""

from __future__ import annotations

from typing import Any

from rlinf_search.config.schema import ConfigError
from rlinf_search.key_declarations import T, from_section
from rlinf_search.plugin_settings import read_settings


def get(raw: dict, dotted: str, default: Any = None) -> Any:
    """The value at ``dotted``; ``default`` when a key on the way is absent or the value is null."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def get_int(raw: dict, dotted: str, default: int | None) -> int | None:
    """An integer key (null: ``default``): its declaration's type and range were checked before any reader runs
    (``check_values``; a test holds every ``get_int`` to a key declared ``int``)."""
    value = get(raw, dotted, default)
    return None if value is None else int(value)


def get_float(raw: dict, dotted: str, default: float | None) -> float | None:
    """A number key (null: ``default``), declared ``float`` or ``int``."""
    value = get(raw, dotted, default)
    return None if value is None else float(value)


def get_bool(raw: dict, dotted: str, default: bool) -> bool:
    """A true/false key (null: ``default``), declared ``bool``: a string such as ``"false"`` never reaches here."""
    return get(raw, dotted, default)


def get_section(raw: dict, dotted: str) -> dict:
    """A section's keys without its null values (null means the field's default)."""
    body = get(raw, dotted, {})
    if not isinstance(body, dict):
        raise ConfigError(f"{dotted}: expected a section of keys, got {type(body).__name__}")
    return {key: value for key, value in body.items() if value is not None}


def read_view(raw: dict, cls: type[T], dotted: str, **given: Any) -> T:
    """The section at ``dotted`` ("": the whole config) read into ``cls`` by its fields' declarations (``from_section``), with ``given``
    for the fields computed from other keys; a required key missing or a name its registry cannot resolve is a
    ``ConfigError`` naming the key."""
    try:
        return from_section(cls, get(raw, dotted, {}) if dotted else raw, path=dotted, **given)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def entry_settings(raw: dict, entry: Any, dotted: str, *, name: str) -> Any:
    """The section at ``dotted`` validated by the settings model the registry entry ``entry`` declares
    (``plugin_settings.read_settings``; ``name``: the entry as the config names it, for messages), or None for an
    entry that declares none and no section; ``ConfigError`` in one line naming the key."""
    try:
        return read_settings(entry, get(raw, dotted), path=dotted, name=name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
