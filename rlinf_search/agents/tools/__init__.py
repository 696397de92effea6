"""Tools an agent loop can call, by name.

``search`` is always there (the retrieval client behind a function schema, ``search.py``). Every other tool is a
class registered here under the name that ``tools.<name>`` configures it by (or, for a user's tool, named by a
dotted path in ``tools.<name>.class``), with a class attribute ``schema``, a settings model declared with
``plugin_settings.with_settings`` (validated at start-up) and a constructor ``(settings, *, tokenizer)`` that gets
the validated model; the rollout ranks build one per rollout call. Adding a tool takes its module, one line below,
and its test (docs/agents.md).
"""

from __future__ import annotations

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.tools.base import Tool, ToolResult
from rlinf_search.agents.tools.search import SearchFunctionTool, search_tool
from rlinf_search.plugin_settings import settings_model
from rlinf_search.registry import Lazy, Registry

__all__ = ["TOOLS", "SearchFunctionTool", "Tool", "ToolResult", "as_tools", "build_tools"]

TOOLS: Registry = Registry("tool")
"""Tool classes by name (or a dotted path to one)."""
TOOLS.register("access", Lazy("rlinf_search.agents.tools.access:AccessTool"))


def build_tools(config: AgentLoopConfig, tokenizer) -> dict[str, Tool]:
    """The tools ``config.tools`` names beside search, built in the calling event loop (close them after)."""
    tools = {}
    for spec in config.tools:
        tool = TOOLS.resolve(spec.factory, key=f"tools.{spec.name}")
        model = settings_model(tool)
        tools[spec.name] = tool(None if model is None else model.model_validate(spec.settings), tokenizer=tokenizer)
    return tools


def as_tools(tools, config: AgentLoopConfig, tokenizer) -> dict[str, Tool]:
    """``tools`` as a loop keeps them, by name: a dict of ``Tool``s as it is, or a lone search client (what the
    callers that only search hand over) wrapped as the search tool."""
    if isinstance(tools, dict):
        return dict(tools)
    tool = search_tool(tools, config, tokenizer)
    return {tool.name: tool}
