"""The function-calling agent loop (``agent.protocol: toolcall``): the search tool offered as an OpenAI tool
schema through the tokenizer's own chat template, the model's ``<tool_call>`` JSON parsed and run, and each
result handed back as a ``tool`` message rendered by the same template.

A turn ends where the model ends its message (its end token); there are no stop strings. A turn with calls
gets one observation: every call of the turn runs concurrently (each query of a ``query_list`` too) and the
tool messages, in the order the calls were written, are rendered as the template renders them after an
assistant turn, up to and including the next assistant header. A call that cannot run gets its reason as its
tool message and is counted (``Trajectory.tool_call_errors``). A turn without calls ends the trajectory; the
answer is graded from ``<answer>`` as in the Search-R1 protocol.

Token in, token out: the ids the engine sampled are the ids kept and trained on; observation ids are masked.
What re-rendering the whole conversation through the template would give instead is measured per trajectory
(``Trajectory.template_drift``), never used.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from rlinf_search.agents.searchr1.loop import AgentLoopConfig, SearchR1AgentLoop, _Rollout, _Turn
from rlinf_search.agents.searchr1.protocol import ANSWER_CLOSE, ANSWER_OPEN, strip_protocol_tags
from rlinf_search.agents.toolcall.parser import CallError, ParsedTurn, ToolCall, parse_tool_calls, without_thinking
from rlinf_search.agents.toolcall.search_function import ArgumentError, SearchFunction
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.tools.search.base import SearchTool
from rlinf_search.tools.search.observation import NO_RESULTS, failure_line, truncate_passage

# Two throw-away turns the tool messages are rendered after; only what the template adds past them is kept.
_PROBE_USER, _PROBE_ASSISTANT, _PROBE_RESULT = "probe question", "probe reply", "probe tool result"


class TemplateWithoutTools(ValueError):
    """The tokenizer's chat template ignores ``tools`` or ``tool`` messages: the model could not be told."""


@dataclass
class _ToolTurn:
    """What one model turn asked for, in the toolcall protocol."""

    kind: str
    """``call`` (at least one call to run), ``answer`` (no call, an ``<answer>`` element) or ``none``."""
    parsed: ParsedTurn
    """The turn's calls, valid or not."""
    text: str
    """The turn's text, for re-rendering it as an assistant message."""


class ToolCallAgentLoop(SearchR1AgentLoop):
    """Function-calling rollouts against a generation engine and the search tool."""

    stops = ()

    def __init__(self, engine, tool: SearchTool, tokenizer, config: AgentLoopConfig):
        super().__init__(engine, tool, tokenizer, config)
        self.function = SearchFunction.from_schema(config.tool_schema)
        self.prompts.tools = [self.function.schema]
        self._tools = {self.function.name: self.function.function}
        self._end = tokenizer.eos_token
        self._end_id = tokenizer.convert_tokens_to_ids(self._end) if self._end else None
        self._probe = self._render([{"role": "user", "content": _PROBE_USER},
                                    {"role": "assistant", "content": _PROBE_ASSISTANT}], generation_prompt=False)
        self._check_template()

    # ---- rendering through the chat template ------------------------------------------------------
    def _render(self, messages: list[dict], *, tools: list[dict] | None = None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _check_template(self) -> None:
        plain = [{"role": "user", "content": _PROBE_USER}]
        if self._render(plain, tools=[self.function.schema], generation_prompt=True) == self._render(
                plain, generation_prompt=True):
            raise TemplateWithoutTools("agent.protocol toolcall: the tokenizer's chat template does not render tools "
                                       "(tools=[...]); use a model whose template supports function calling, or "
                                       "rebuild the tiny model (toolkits/make_tiny_model.py)")
        if _PROBE_RESULT not in self._tool_turn_text([_PROBE_RESULT], ended=True):
            raise TemplateWithoutTools("agent.protocol toolcall: the tokenizer's chat template drops tool messages")

    def _tool_turn_text(self, contents: list[str], *, ended: bool) -> str:
        """The text the template puts after an assistant turn: the tool messages, then the next assistant
        header. ``ended``: the model's turn already ends with the end token (the engine stopped on it)."""
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        full = self._render(probe + [{"role": "tool", "content": c} for c in contents], generation_prompt=True)
        if not full.startswith(self._probe):
            raise TemplateWithoutTools("agent.protocol toolcall: the chat template renders an assistant turn "
                                       "differently when tool messages follow it; token-in/token-out needs a "
                                       "template whose earlier turns do not change")
        # What closes the probe assistant turn (e.g. "<|im_end|>\n") belongs to the observation, except the end
        # token the model itself sampled.
        closing = self._probe[self._probe.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
        if ended and self._end and closing.startswith(self._end):
            closing = closing[len(self._end):]
        return closing + full[len(self._probe):]

    # ---- the turn --------------------------------------------------------------------------------
    def _read_turn(self, rollout: _Rollout, turn: _Turn, search_allowed: bool) -> str | None:
        parsed = parse_tool_calls(turn.text, self._tools)
        visible = without_thinking(turn.text)
        if parsed.calls:
            rollout.action = _ToolTurn("call", parsed, turn.text)
            return None if search_allowed else "max_turns"
        answered = ANSWER_OPEN in visible and ANSWER_CLOSE in visible
        rollout.action = _ToolTurn("answer" if answered else "none", parsed, turn.text)
        if answered:
            return "answer"
        return "length" if turn.finish_reason == "length" else "eos"

    async def _observe_step(self, rollout: _Rollout) -> None:
        rollout.tool_turns += 1
        traj, action = rollout.traj, rollout.action
        contents = await asyncio.gather(*(self._answer_call(traj, call) for call in action.parsed.calls))
        traj.tool_call_errors += len(action.parsed.errors)
        rollout.messages.append(_assistant_message(action))
        rollout.messages.extend({"role": "tool", "content": c} for c in contents)
        ended = bool(traj.response_ids) and traj.response_ids[-1] == self._end_id
        ids = self._encode(self._tool_turn_text(self._fit(contents, ended=ended), ended=ended))
        room = self.config.max_response_tokens - len(traj.response_ids)
        self._append(traj, ids[:room], [0.0] * min(len(ids), room), kind="tool")

    def _fit(self, contents: list[str], *, ended: bool) -> list[str]:
        """``contents`` cut so the rendered observation stays within ``max_obs_tokens``: each tool message gets
        an equal share of what the template's own tokens leave."""
        if len(self._encode(self._tool_turn_text(contents, ended=ended))) <= self.config.max_obs_tokens:
            return contents
        frame = len(self._encode(self._tool_turn_text([""] * len(contents), ended=ended)))
        share = max(1, (self.config.max_obs_tokens - frame) // len(contents))
        return [truncate_passage(c, share, self.tokenizer) for c in contents]

    async def _answer_call(self, traj: Trajectory, call: ToolCall | CallError) -> str:
        """The tool message for one call: its results, or the reason it could not run."""
        if isinstance(call, CallError):
            return f"Error: {call.reason}"
        try:
            queries, topk = self.function.queries(call.arguments, self.config.topk)
        except ArgumentError as exc:
            traj.tool_call_errors += 1
            return f"Error: {exc}"
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(self.tool.search(q, topk) for q in queries))
        traj.tool_time_s += time.perf_counter() - started
        traj.num_searches += len(queries)
        traj.queries.extend(queries)
        traj.search_errors += sum(o.error is not None for o in outcomes)
        blocks = [self._results_text(o) for o in outcomes]
        if len(blocks) == 1:
            return blocks[0]
        return "\n\n".join(f"Results for {json.dumps(o.query, ensure_ascii=False)}:\n{b}"
                           for o, b in zip(outcomes, blocks))

    def _results_text(self, outcome) -> str:
        """One query's passages, Search-R1's layout without the ``<information>`` wrapper (the template's
        ``tool`` message is the wrapper); protocol tags taken out, so a page cannot answer for the model."""
        if outcome.error is not None:
            return failure_line(strip_protocol_tags(outcome.error))
        if not outcome.hits:
            return NO_RESULTS
        return "\n".join(
            f"Doc {n}(Title: {strip_protocol_tags(hit.title)}) "
            f"{truncate_passage(strip_protocol_tags(hit.text).strip(), self.config.max_passage_tokens, self.tokenizer)}"
            for n, hit in enumerate(outcome.hits, start=1))

    # ---- start and finish -------------------------------------------------------------------------
    def _start(self, record: QARecord) -> _Rollout:
        if isinstance(record.prompt, str):
            raise ValueError(f"agent.protocol toolcall: prompt {record.uid} is text, so the chat template cannot "
                             "render the tool schema into it; prepare the data as chat messages (without --text-prompt)")
        rollout = super()._start(record)
        rollout.messages = list(record.prompt)
        return rollout

    def _finish(self, rollout: _Rollout) -> Trajectory:
        traj = super()._finish(rollout)
        if self.config.apply_chat_template:
            traj.template_drift = self._rerendered(rollout) != traj.prompt_ids + traj.response_ids
        return traj

    def _rerendered(self, rollout: _Rollout) -> list[int]:
        """The conversation re-rendered from messages, as a text-level pipeline would train on it."""
        messages = list(rollout.messages)
        traj = rollout.traj
        tail = traj.response_ids[_last_tool_span_end(traj):]
        if tail:  # the last model turn, ended or cut
            messages.append({"role": "assistant", "content": self.tokenizer.decode(tail, skip_special_tokens=True)})
        text = self._render(messages, tools=[self.function.schema], generation_prompt=False)
        if tail and tail[-1] != self._end_id and self._end and text.endswith(self._end + "\n"):
            text = text[:-len(self._end) - 1]  # a cut last turn has no end token
        elif text.endswith("\n") and tail and tail[-1] == self._end_id:
            text = text[:-1]  # the trajectory stops at the end token the model sampled
        return self._encode(text)


def _assistant_message(action: _ToolTurn) -> dict:
    """The model's turn as a chat message with structured calls (what a text-level pipeline would keep)."""
    calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in action.parsed.valid]
    text = action.text
    cut = text.find("<tool_call>")
    content = (text[:cut] if cut >= 0 else text).strip()
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _last_tool_span_end(traj: Trajectory) -> int:
    ends = [span.end for span in traj.spans if span.kind == "tool"]
    return max(ends) if ends else 0
