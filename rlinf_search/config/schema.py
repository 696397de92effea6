"""``ConfigError``, the accepted keys as a tree (``SCHEMA``, ``EVAL_SCHEMA``: made from the config models of
``config/model.py``, for what walks keys by path: RLinf's key mapping, the docs, the JSON Schema, the fuzz test),
and renamed and removed keys.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from rlinf_search.config.model import EvalConfigFile, TrainConfigFile
from rlinf_search.distill.config import TeacherConfig
from rlinf_search.key_ranges import Key, field_keys, key_of, leaves
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.section_model import section_model_of
from rlinf_search.tools.search.config import SearchToolConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value or combination that cannot run; the message starts with the key's path."""


def schema_tree(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s keys as a tree: a section a dict, a key its ``Key`` (type and range), an open section ``"*"``."""
    tree: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        section = section_model_of(info.annotation)
        tree[name] = schema_tree(section) if section is not None else key_of(info) or "*"
    return tree


def section_models(model: type[BaseModel], path: str = "") -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, section model) of ``model`` and every section under it ("" for the top)."""
    out = [(path, model)]
    for name, info in model.model_fields.items():
        section = section_model_of(info.annotation)
        if section is not None:
            out += section_models(section, f"{path}.{name}" if path else name)
    return out


SCHEMA: dict[str, Any] = schema_tree(TrainConfigFile)
"""Every key a training run accepts."""
EVAL_SCHEMA: dict[str, Any] = schema_tree(EvalConfigFile)
"""Every key an eval accepts."""
DATACLASS_SECTIONS = {"cluster": ClusterConfig, "tools.search": SearchToolConfig,
                      "algorithm.distill.teacher": TeacherConfig}
"""The open sections of ``SCHEMA`` read into section models of their own (``ConfigSection``)."""


def declarations() -> dict[str, Key]:
    """Every key by dotted path with its type and range: ``SCHEMA``'s leaves and the open sections' fields."""
    out = dict(leaves(SCHEMA))
    for path, cls in DATACLASS_SECTIONS.items():
        out.update((f"{path}.{name}", key) for name, key in field_keys(cls))
    return out


# Old spelling -> new; RLinf itself writes the turn limit both ways.
DEPRECATED_KEYS = {"agentloop.maxturn": "agentloop.max_turns"}
# RLinf keys that name something this trainer does not have: dropped with a one-line warning, so an
# RLinf config loads, and the message says why the key does nothing.
REMOVED_KEYS = {"agentloop.group_name": "the agent loop runs inside the rollout group (rollout.group_name), or, "
                                        "with agentloop.num_workers >= 1, in the group named AgentLoopGroup"}


def apply_deprecations(raw: dict) -> None:
    """Rename deprecated keys in place (warning once each) and drop removed ones."""
    for old, new in DEPRECATED_KEYS.items():
        section, old_key = old.split(".")
        _, new_key = new.split(".")
        body = raw.get(section) or {}
        if old_key in body:
            log.warning("%s is deprecated; write %s", old, new)
            if new_key in body and body[new_key] != body[old_key]:
                raise ConfigError(f"{old} and {new} disagree ({body[old_key]} vs {body[new_key]}); keep {new}")
            body[new_key] = body.pop(old_key)
    for dotted, reason in REMOVED_KEYS.items():
        section, key = dotted.split(".")
        body = raw.get(section) or {}
        if key in body:
            log.warning("%s is ignored: %s; remove this key", dotted, reason)
            del body[key]
