"""Agent protocols: how the model acts in a rollout, one agent-loop class per protocol, chosen by ``agent.protocol``.

- ``searchr1``: Search-R1's tags (``<search>`` query ``</search>``, ``<answer>``), observations between
  ``<information>`` tags (``agents/searchr1``);
- ``toolcall``: function calling, the search tool as an OpenAI tool schema rendered by the model's own chat
  template, ``<tool_call>`` JSON parsed, results as ``tool`` messages (``agents/toolcall``);
- or a dotted path to a subclass of ``AgentLoop`` (``agents/base.py``; user code).
"""

from __future__ import annotations

from rlinf_search.registry import Lazy, Registry

AGENT_PROTOCOLS: Registry[type] = Registry("agent protocol")
"""Agent-loop classes by protocol name; built with ``(engine, tools, tokenizer, AgentLoopConfig)``."""
AGENT_PROTOCOLS.register("searchr1", Lazy("rlinf_search.agents.searchr1.loop:SearchR1AgentLoop"))
AGENT_PROTOCOLS.register("toolcall", Lazy("rlinf_search.agents.toolcall.loop:ToolCallAgentLoop"))


def build_agent_loop(engine, tools, tokenizer, config):
    """The agent loop of ``config.protocol`` (an ``AgentLoopConfig``) over ``engine`` and ``tools`` (tools by name,
    or a lone search client); it builds the tools ``config.tools`` names beside search (close it: ``aclose``)."""
    return AGENT_PROTOCOLS.resolve(config.protocol, key="agent.protocol")(engine, tools, tokenizer, config)
