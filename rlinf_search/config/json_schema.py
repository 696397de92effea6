"""The config's keys as a JSON Schema (draft 2020-12), for YAML editors: completion, and a mark on an unknown key or
a value out of its range before anything runs (``rlinf-search schema``; docs/config.md, "Editor support").

It is made from the model ``validate_cfg`` parses with (``SCHEMA``, its key tree, and the open sections' models),
so it takes every key a run takes and no other. What it cannot say, ``rlinf-search check`` does: the rules between
keys, names a registry resolves, files, placement. Every key is optional (a recipe file sets some, its defaults list
the rest; null means the default), and every value may be an OmegaConf interpolation (``${runner.seq_length}``).
RLinf's and verl's own keys, which a run maps before it validates, are not in it.
"""

from __future__ import annotations

from typing import Any

from rlinf_search.agents.tools import TOOLS
from rlinf_search.key_ranges import Key, field_keys
from rlinf_search.plugin_settings import settings_model

DRAFT = "https://json-schema.org/draft/2020-12/schema"
INTERPOLATION = {"type": "string", "pattern": r"^.*\$\{.+\}.*$"}
"""An OmegaConf interpolation, resolved before the run checks the value."""


def key_schema(key: Key) -> dict[str, Any]:
    """One leaf: its type and range (or choices), null, or an interpolation."""
    if key.kind == "bool":
        value: dict[str, Any] = {"type": "boolean"}
    elif key.kind == "list":
        value = {"type": "array", "items": {"type": "string"}}
    elif key.kind == "str":
        value = {"enum": list(key.choices)} if key.choices else {"type": "string"}
    else:
        value = {"type": "integer" if key.kind == "int" else "number"}
        for bound, is_open, closed_word, open_word in ((key.low, key.low_open, "minimum", "exclusiveMinimum"),
                                                       (key.high, key.high_open, "maximum", "exclusiveMaximum")):
            if bound is not None:
                value[open_word if is_open else closed_word] = bound
    choices = [value, *({"const": allowed, "description": meaning} for allowed, meaning in key.also),
               {"type": "null"}, INTERPOLATION]
    out: dict[str, Any] = {"anyOf": choices}
    if key.numeric and key.bounded:
        out["description"] = key.range_words() + (f" ({key.relation})" if key.relation else "")
    elif key.relation:
        out["description"] = key.relation
    return out


def _dataclass_section(cls) -> dict[str, Any]:
    """An open section read into the section model ``cls``: each field a key, the scalar ones with their ``Key``."""
    declared = dict(field_keys(cls))
    return _closed({name: key_schema(declared[name]) if name in declared else {} for name in cls.model_fields})


def _tool_section(name: str, open_section: dict[str, Any]) -> dict[str, Any] | None:
    """``tools.<name>`` of a registered tool: ``class``, ``enable`` and the keys of the settings model it declares,
    each with its type and range (None where the model's schema needs definitions of its own: the open section
    then stands)."""
    model = settings_model(TOOLS.resolve(name))
    own = model.model_json_schema() if model is not None else {"properties": {}}
    if "$defs" in own:
        return None
    keys = {key: {"anyOf": [value, {"type": "null"}, INTERPOLATION],
                  **({"description": value["description"]} if "description" in value else {})}
            for key, value in own["properties"].items()}
    return _closed({**open_section["properties"], **keys})


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": ["object", "null"], "properties": properties, "additionalProperties": False}


def _node(node: Any, path: str, open_sections: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, Key):
        return key_schema(node)
    if path in open_sections:
        return open_sections[path]
    if node == "*":
        return {"type": ["object", "null"]}
    return _closed({name: _node(child, f"{path}.{name}" if path else name, open_sections)
                    for name, child in node.items()})


def config_json_schema(schema: dict[str, Any], *, title: str) -> dict[str, Any]:
    """The JSON Schema of a config whose accepted keys are ``schema`` (training's ``SCHEMA`` or the eval's)."""
    from rlinf_search.config.schema import DATACLASS_SECTIONS

    open_sections = {path: _dataclass_section(cls) for path, cls in DATACLASS_SECTIONS.items()}
    tool = {"type": ["object", "null"], "properties": {"class": {"type": "string"}, "enable": {"type": "boolean"}},
            "description": "a tool beside search: class (a dotted path, else the registered tool of this name), "
                           "enable, and the tool's own settings"}
    registered = {name: _tool_section(name, tool) for name in TOOLS.names()}  # a dotted-path tool: the open one
    open_sections["tools"] = {"type": ["object", "null"], "additionalProperties": tool,
                              "properties": {"search": open_sections.pop("tools.search"),
                                             **{name: section for name, section in registered.items() if section}}}
    out = _node(schema, "", open_sections)
    out["properties"]["defaults"] = {"type": "array", "description": "Hydra's defaults list (config groups)"}
    return {"$schema": DRAFT, "title": title, **out, "type": "object"}
