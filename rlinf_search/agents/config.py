"""``AgentLoopConfig``: the limits and options every agent loop reads (``agentloop``, the sampling and token
budgets), whatever its protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.data.prompt_tokens import PromptTokenizer
from rlinf_search.tools.search.config import SearchToolConfig


@dataclass(frozen=True)
class ToolSpec:
    """A tool beside ``search`` (``tools.<name>``), as the rollout ranks build it."""

    name: str
    """The function name the model calls (``access``, a user's)."""
    factory: str
    """A name in ``agents.tools.TOOLS`` or a dotted path to a tool class (``agents/tools/__init__.py``)."""
    settings: dict = field(default_factory=dict)
    """The tool's own settings, validated at start-up by its settings model and kept as plain values (they cross to
    the rollout ranks, which validate them into the model again when they build the tool)."""


@dataclass(frozen=True)
class AgentLoopConfig:
    """Limits and options of an agent loop, whatever its protocol (``agentloop``, sampling and token budgets). The
    ``agentloop`` keys are declared in ``config/model.py``; the others are computed from other sections."""

    max_turns: int = 2
    """Tool turns (searches and corrective observations) before the final generation without search."""
    max_tokens_per_turn: int = 500
    """Most tokens generated in one turn."""
    max_obs_tokens: int = 500
    """Most tokens in one observation; longer ones are cut, keeping the closing tag."""
    max_passage_tokens: int = 150
    """Each retrieved passage is cut to this many tokens before formatting."""
    max_response_tokens: int = 2048
    """Most tokens after the prompt (model and observation tokens together)."""
    topk: int = SearchToolConfig.model_fields["topk"].default
    """Passages per search."""
    infra_reruns: int = 2
    """Times a GRPO group is rolled out again when a sample's tool call failed for an infrastructure reason
    (``Trajectory.infra_error``); a group still failing after them is dropped from the step, never trained."""
    infra_rerun_wait_s: float = 5.0
    """Wait before a group's first re-run; each later one waits twice as long (the service gets time to return)."""
    retokenize: bool = False
    """Reproduce the reference implementations: decode each turn, cut at the stop tag and re-encode
    it. The ids can then differ from the sampled ones and the engine's log-probs no longer apply."""
    apply_chat_template: bool = True
    """Chat-message prompts go through the tokenizer's chat template; false tokenizes their text as it
    is (the messages' contents joined by blank lines). Text prompts are tokenized as they are either way."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling for every turn (``max_new_tokens`` and ``stop`` are set per turn by the loop)."""
    max_concurrent_trajectories: int = 256
    """Trajectories in flight at once in ``run_batch``."""
    max_prompt_tokens: int | None = None
    """``data.max_prompt_length``: longer prompts are refused or cut as ``truncation`` says; None: no limit."""
    truncation: str = "error"
    """``data.truncation``: ``error`` (refuse an overlong prompt, naming its uid), ``left`` (keep its end)
    or ``right`` (keep its start)."""
    protocol: str = "searchr1"
    """``agent.protocol``: how the model acts, a name in ``rlinf_search.agents.AGENT_PROTOCOLS`` (``searchr1``:
    the ``<search>``/``<answer>`` tags; ``toolcall``: function calling through the chat template) or a dotted
    path to an agent-loop class."""
    tool_schema: dict | None = None
    """``toolcall``: the search tool's OpenAI schema (``tools.search.tool_config``); None: the built-in one."""
    tools: tuple[ToolSpec, ...] = ()
    """``toolcall``: the tools offered beside ``search`` (``tools.access``...)."""
    protocol_settings: Any = None
    """``agent.protocol_settings`` validated by the settings model the protocol's loop class declares
    (``@with_settings``), read by the loop as ``config.protocol_settings``; None for one that declares none."""

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_turn", "max_response_tokens", "topk", "max_concurrent_trajectories"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent loop: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"agent loop: max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        PromptTokenizer.check_truncation(self.truncation)
