"""``tools.search.tool_config``: the search tool described by a file users already have.

- verl's ``search_tool_config.yaml``: a ``tools:`` list whose entries hold ``class_name``, ``config``
  (``retrieval_service_url``, ``num_workers``, ``rate_limit``, ``timeout``, ``topk``, ``type``) and
  ``tool_schema``. The search entry's schema is offered to the model; its service keys set the search client.
  Every other entry is a tool the run must offer too (``ToolConfigFile.listed``): the config layer serves it
  with the registered tool of that function name, or stops the run naming it.
- rllm's tool JSON: one OpenAI tool object (or its ``function`` part), or a list of them; only schemas, read
  the same way (one search function, the others listed).

The file is read once at start-up; what it sets is logged, and an entry that cannot work here (an MCP tool,
a URL that is not a ``/retrieve`` endpoint, no search function) stops the run in one line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from rlinf_search.agents.tools.search_function import SchemaError, SearchFunction

log = logging.getLogger(__name__)

# verl's per-tool config keys and the tools.search field each sets here. verl's num_workers (calls one
# execution actor runs at once) and rate_limit (calls in flight cluster-wide) are both caps on concurrent
# requests: the smaller one becomes the client's max_concurrency.
_SERVICE_KEYS = {"retrieval_service_url": "server_addr", "timeout": "timeout_s", "topk": "topk",
                 "num_workers": "max_concurrency", "rate_limit": "max_concurrency"}
_IGNORED_KEYS = {"type": "checked: only native tools are served",
                 "enable_global_rate_limit": "the concurrency cap applies to every rollout rank's client"}


class ToolConfigError(ValueError):
    """A tool config file that cannot configure the search tool; the message names the file."""


@dataclass(frozen=True)
class ToolConfigFile:
    """What a tool config file says about the search tool."""

    path: str
    """The file, as configured."""
    function: SearchFunction
    """The search function's schema, as the model will see it."""
    search_settings: dict[str, Any] = field(default_factory=dict)
    """``tools.search`` fields the file sets (``server_addr``, ``timeout_s``, ``topk``, ``max_concurrency``)."""
    listed: tuple[ListedTool, ...] = ()
    """The file's other tools, each to be offered beside search."""


@dataclass(frozen=True)
class ListedTool:
    """A tool other than search that a tool config file lists."""

    name: str
    """Its function name (what the model calls)."""
    source: str
    """How the file names it: verl's ``class_name``, or the function name for an rllm schema."""


def read_tool_config(path: str | Path) -> ToolConfigFile:
    """Read a verl tool config (YAML with ``tools:``) or an rllm tool schema (JSON); ``ToolConfigError`` otherwise."""
    file = Path(path)
    if not file.is_file():
        raise ToolConfigError(f"tools.search.tool_config: no file at {file}")
    text = file.read_text(encoding="utf-8")
    try:
        content = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ToolConfigError(f"tools.search.tool_config: {file} does not parse: {str(exc).splitlines()[0]}") from None
    if isinstance(content, dict) and "tools" in content:
        return _from_verl(str(path), content["tools"])
    schemas = content if isinstance(content, list) else [content]
    functions, listed = [], []
    for schema in schemas:
        if not isinstance(schema, dict):
            continue
        try:
            functions.append(SearchFunction.from_schema(schema, source=str(path)))
        except SchemaError:
            name = _function_name(str(path), schema)
            listed.append(ListedTool(name=name, source=name))
    if len(functions) != 1:
        raise ToolConfigError(f"tools.search.tool_config: {file} must describe one search tool (a schema taking "
                              f"query_list or query), found {len(functions)}")
    return ToolConfigFile(path=str(path), function=functions[0], listed=tuple(listed))


def _function_name(path: str, schema: Any) -> str:
    """The function name of a tool object or of its ``function`` part; ``ToolConfigError`` without one."""
    function = schema.get("function", schema) if isinstance(schema, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ToolConfigError(f"tools.search.tool_config: {path}: a tool schema without function.name")
    return name


def _from_verl(path: str, entries: Any) -> ToolConfigFile:
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"tools.search.tool_config: {path}: tools must be a non-empty list")
    found, listed = [], []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ToolConfigError(f"tools.search.tool_config: {path}: each tools entry must be a mapping")
        try:
            found.append((entry, SearchFunction.from_schema(entry.get("tool_schema"), source=path)))
        except SchemaError:
            name = _function_name(path, entry.get("tool_schema"))
            listed.append(ListedTool(name=name, source=str(entry.get("class_name") or name)))
    if len(found) != 1:
        raise ToolConfigError(f"tools.search.tool_config: {path} must list one search tool (a schema taking query_list "
                              f"or query), found {len(found)}")
    entry, function = found[0]
    config = entry.get("config") or {}
    if config.get("type", "native") != "native":
        raise ToolConfigError(f"tools.search.tool_config: {path}: the search tool's config.type is "
                              f"{config.get('type')!r}; only native tools are served (no MCP)")
    settings: dict[str, Any] = {}
    for key, value in config.items():
        if key in _IGNORED_KEYS:
            continue
        if key not in _SERVICE_KEYS:
            log.warning("tools.search.tool_config: %s: config.%s has no counterpart here and is ignored", path, key)
            continue
        target = _SERVICE_KEYS[key]
        if key == "retrieval_service_url":
            value = _server_addr(path, value)
        if target == "max_concurrency" and target in settings:
            value = min(settings[target], value)
        settings[target] = value
    if entry.get("class_name"):
        log.info("tools.search.tool_config: %s: %s is served by this project's search client (tools.search.backend)",
                 path, entry["class_name"])
    return ToolConfigFile(path=path, function=function, search_settings=settings, listed=tuple(listed))


def _server_addr(path: str, url: Any) -> str:
    """``host:port`` of a retrieval URL ending in ``/retrieve`` (the endpoint the local backend posts to)."""
    parsed = urlparse(str(url))
    if parsed.scheme != "http" or not parsed.hostname or parsed.path.rstrip("/") not in ("", "/retrieve"):
        raise ToolConfigError(f"tools.search.tool_config: {path}: retrieval_service_url {url!r} must be "
                              "http://host:port/retrieve (a Search-R1-compatible retrieval server)")
    return f"{parsed.hostname}:{parsed.port or 80}"
