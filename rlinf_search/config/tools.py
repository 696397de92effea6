"""``tools.<name>``: the tools offered beside ``tools.search`` (``agent.protocol: toolcall``), checked at start-up.

A section names a registered tool by its key (``tools.access``) or a user's tool class by ``class`` (a dotted
path); every other key of the section is the tool's own setting, validated by the settings model the tool declares
(``plugin_settings.with_settings``). ``enable:
false`` keeps a section without offering its tool. A tool that reads a server (``access``) defaults its
``server_addr`` to ``tools.search.server_addr``.
"""

from __future__ import annotations

from rlinf_search.agents.config import ToolSpec
from rlinf_search.agents.toolcall.tool_config import ListedTool
from rlinf_search.agents.tools import TOOLS
from rlinf_search.agents.tools.base import TOOL_CLASS_MEMBERS, tool_name
from rlinf_search.config.schema import ConfigError
from rlinf_search.plugin_settings import read_settings

SEARCH_SECTION = "search"
"""The retrieval client's section (``tools.search``, read by ``SearchToolConfig``), not a tool of this list."""


def extra_tools(tools: dict | None, *, protocol: str, search_addr: str, listed: tuple[ListedTool, ...] = (),
                listed_in: str | None = None) -> tuple[ToolSpec, ...]:
    """The tools the ``tools`` section offers beside search, and those the tool config file ``listed_in`` lists
    (``listed``); ``ConfigError`` in one line for a section or a listed tool that cannot work."""
    section = dict(tools or {})
    for tool in listed:
        if tool.name in section or tool.name == SEARCH_SECTION:
            continue
        if tool.name not in TOOLS:
            raise ConfigError(f"tools.search.tool_config: {listed_in} lists {tool.source} (function {tool.name!r}), "
                              f"which no tool here serves; add a tools.{tool.name} section with class: a dotted path "
                              f"to your Tool, or take it out of the file")
        section[tool.name] = {}
    specs = []
    for name, settings in section.items():
        if name == SEARCH_SECTION:
            continue
        key = f"tools.{name}"
        if not isinstance(settings, dict):
            raise ConfigError(f"{key}: expected a section of keys, got {type(settings).__name__}")
        settings = dict(settings)
        if not settings.pop("enable", True):
            continue
        factory = str(settings.pop("class", name))
        try:
            tool = TOOLS.resolve(factory, key=key)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        missing = [member for member in TOOL_CLASS_MEMBERS if not hasattr(tool, member)]
        if missing:
            raise ConfigError(f"{key}: {factory} is not a tool class: it has no {' and no '.join(missing)} (a tool "
                              "class has a schema, an async call and a settings model: docs/agents.md, \"Add a "
                              "tool\")")
        if getattr(tool, "reads_server", False) and settings.get("server_addr") is None:
            settings["server_addr"] = search_addr
        try:
            model = read_settings(tool, settings, path=key, name=f"tool {name}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        settings = {} if model is None else model.model_dump(mode="json")
        if tool_name(tool.schema) != name:
            raise ConfigError(f"{key}: the tool calls itself {tool_name(tool.schema)!r}; name its section "
                              f"tools.{tool_name(tool.schema)}")
        specs.append(ToolSpec(name=name, factory=factory, settings=settings))
    if specs and protocol != "toolcall":
        raise ConfigError(f"tools.{specs[0].name}: only agent.protocol toolcall offers tools beside search (the "
                          f"{protocol} protocol's tags call search alone)")
    return tuple(specs)
