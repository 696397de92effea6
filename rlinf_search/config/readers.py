"""From the resolved config dict to its model (``config/model.py``), and a plugin's own section to the settings
model its registry entry declares; both refuse in one line naming the key (``ConfigError``)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rlinf_search.config.schema import ConfigError
from rlinf_search.plugin_settings import read_settings
from rlinf_search.section_model import error_lines, parse_section

M = TypeVar("M", bound=BaseModel)


def parse_config(model: type[M], raw: dict) -> M:
    """``raw`` validated by ``model`` (``TrainConfigFile``, ``EvalConfigFile``); ``ConfigError`` naming the first
    key that is unknown, of the wrong type or out of its range."""
    try:
        return parse_section(model, raw, path="")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def config_problems(model: type[BaseModel], raw: dict) -> list[str]:
    """One line for every key of ``raw`` that ``model`` refuses (``rlinf-search check`` lists them all)."""
    try:
        model.model_validate(raw)
    except ValidationError as exc:
        return error_lines(exc, "", model)
    return []


def entry_settings(section: dict | None, entry: Any, dotted: str, *, name: str) -> Any:
    """``section`` (the config's ``dotted``) validated by the settings model the registry entry ``entry`` declares
    (``plugin_settings.read_settings``; ``name``: the entry as the config names it, for messages), or None for an
    entry that declares none and no section; ``ConfigError`` in one line naming the key."""
    try:
        return read_settings(entry, section, path=dotted, name=name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
