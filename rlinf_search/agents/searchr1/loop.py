"""The Search-R1 agent loop: one asyncio task per trajectory, many in flight, token ids throughout.

Each turn generates until ``</search>``, ``</answer>`` or an end token. A search calls the tool and
appends the ``<information>`` observation; an answer ends the rollout; anything else gets a short
corrective observation. ``max_turns`` bounds the tool turns (searches and corrections, as the
reference counts them); after that, one last generation without search: it still stops at
``</search>``, and a search there ends the trajectory (``max_turns``) with no answer. Observation
tokens are appended with ``response_mask`` 0, so they are never trained on, and no observation text
carries a protocol tag, so none can be read as an action; rewards read ``Trajectory.graded_text``.
"""

from __future__ import annotations

from rlinf_search.agents.base import AgentLoop, ModelTurn, RolloutState
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.protocol import (
    INVALID_ACTION_OBSERVATION,
    STOPS,
    parse_action,
    strip_protocol_tags,
)
from rlinf_search.agents.tools.search_function import SearchFunction
from rlinf_search.data.io_struct import ResponseSpan, Trajectory

__all__ = ["INFORMATION_TAIL", "SearchR1AgentLoop", "fit_observation", "graded_text"]

INFORMATION_TAIL = "</information>\n\n"
"""How an ``<information>`` block ends: ``fit_observation`` keeps it when it cuts one."""


def fit_observation(ids: list[int], tail: list[int], max_tokens: int) -> list[int]:
    """An observation's ``ids`` cut to ``max_tokens``, ending with ``tail`` (an ``<information>`` block's closing
    tag, or none) when cut, so the model still sees a well-formed block."""
    if len(ids) <= max_tokens:
        return ids
    return (ids[: max(max_tokens - len(tail), 0)] + tail)[:max_tokens]


def _finish_reason(action_kind: str, engine_finish: str, search_allowed: bool) -> str | None:
    """Why the rollout ends after this turn, or None to continue."""
    if action_kind == "answer":
        return "answer"
    if engine_finish == "eos":
        return "eos"
    if not search_allowed:
        return "max_turns"  # the last generation gave no answer (a search there is not run)
    return None


class SearchR1AgentLoop(AgentLoop):
    """Runs Search-R1 rollouts against a generation engine and the search tool."""

    stops: tuple[str, ...] = STOPS

    def __init__(self, engine, tools, tokenizer, config: AgentLoopConfig):
        super().__init__(engine, tools, tokenizer, config)
        if len(self.tools) != 1:
            raise ValueError(f"agent.protocol searchr1: its <search> tags call the search tool and no other; the tools "
                             f"offered are {', '.join(self.tools) or 'none'} (other tools need agent.protocol toolcall)")
        (self._search_name,) = self.tools  # "search", or the name a tool config gave the search function
        # A <search> tag's query becomes arguments in the tool's own schema, read through the Tool interface only.
        self._search_function = SearchFunction.from_schema(self.tools[self._search_name].schema,
                                                           source=f"tool {self._search_name!r}")
        self._information_tail_ids = self._encode(INFORMATION_TAIL)

    def read_turn(self, rollout: RolloutState, turn: ModelTurn, tools_allowed: bool) -> str | None:
        rollout.action = parse_action(turn.text)
        return _finish_reason(rollout.action.kind, turn.finish_reason, tools_allowed)

    async def observe_step(self, rollout: RolloutState) -> None:
        """Run the pending action's search (or the correction) and append the observation."""
        rollout.tool_turns += 1
        action = rollout.action
        if action.kind == "search":
            arguments = self._search_function.arguments_for(action.content)
            result = await self.call_tool(rollout.traj, self._search_name, arguments)
            self._append_observation(rollout.traj, f"\n\n<information>{result.text}</information>\n\n",
                                     kind="information")
        else:
            self._append_observation(rollout.traj, INVALID_ACTION_OBSERVATION, kind="correction")

    def _append_observation(self, traj: Trajectory, observation: str, *, kind: str) -> None:
        """Append an observation of at most ``max_obs_tokens``, an ``<information>`` block keeping its closing tag."""
        tail = self._information_tail_ids if observation.endswith(INFORMATION_TAIL) else []
        self.append_observation(traj, fit_observation(self._encode(observation), tail, self.config.max_obs_tokens),
                                kind=kind)

    def graded_text(self, traj: Trajectory) -> str:
        return graded_text(traj.spans)


def graded_text(spans: list[ResponseSpan]) -> str:
    """The response as rewards read it: the model's spans as it wrote them; each observation with any
    protocol tag taken out of its text (a search result keeps its ``<information>`` wrapper, which the
    format check reads), so only the model's own tags can count as an action or an answer."""
    parts = []
    for span in spans:
        if span.kind == "model":
            parts.append(span.text)
        elif span.kind == "information":
            parts.append(f"\n\n<information>{strip_protocol_tags(span.text).strip()}</information>\n\n")
        else:
            parts.append(strip_protocol_tags(span.text))
    return "".join(parts)
