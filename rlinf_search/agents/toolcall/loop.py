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
from dataclasses import dataclass

from rlinf_search.agents.base import AgentLoop, ModelTurn, RolloutState
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import graded_text
from rlinf_search.agents.searchr1.protocol import ANSWER_CLOSE, ANSWER_OPEN
from rlinf_search.agents.toolcall.parser import (
    CallError,
    ParsedTurn,
    ToolCall,
    first_call_outside_thinking,
    parse_tool_calls,
    without_thinking,
)
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.tools.search.observation import truncate_passage

# A throw-away conversation the tool messages are rendered after; only what the template adds past the model's turn
# is kept. The turn reasons first, as a thinking model does: templates that treat reasoning apart (Qwen3's drops an
# empty think block from turns followed by tool messages, and adds one to the last) render it as the model wrote it.
_PROBE_USER, _PROBE_THOUGHT, _PROBE_REPLY = "probe question", "probe thought", "probe reply"
_PROBE_TURN = f"<think>\n{_PROBE_THOUGHT}\n</think>\n\n{_PROBE_REPLY}"
_PROBE_RESULT = "probe tool result"


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


class ToolCallAgentLoop(AgentLoop):
    """Function-calling rollouts against a generation engine and its tools (each offered by its schema)."""

    stops = ()

    def __init__(self, engine, tools, tokenizer, config: AgentLoopConfig):
        super().__init__(engine, tools, tokenizer, config)
        self.schemas = [tool.schema for tool in self.tools.values()]
        """Every tool's OpenAI schema, rendered into the prompt by the chat template."""
        self.prompts.tools = self.schemas
        self._functions = {name: tool.schema["function"] for name, tool in self.tools.items()}
        self._end = tokenizer.eos_token
        self._end_id = tokenizer.convert_tokens_to_ids(self._end) if self._end else None
        self._prompt_probe = self._render([{"role": "user", "content": _PROBE_USER}], tools=self.schemas,
                                          generation_prompt=True)
        self.opens_thinking = _inside_thinking(self._prompt_probe)
        """The generation prompt opens a ``<think>`` block (Qwen3's thinking releases): every turn starts inside
        its reasoning, so text before the turn's first ``</think>`` is reasoning, never an action."""
        self._check_template()

    # ---- rendering through the chat template ------------------------------------------------------
    def _render(self, messages: list[dict], *, tools: list[dict] | None = None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _check_template(self) -> None:
        plain = [{"role": "user", "content": _PROBE_USER}]
        if self._render(plain, tools=self.schemas, generation_prompt=True) == self._render(
                plain, generation_prompt=True):
            raise TemplateWithoutTools("agent.protocol toolcall: the tokenizer's chat template does not render tools "
                                       "(tools=[...]); use a model whose template supports function calling, or "
                                       "rebuild the tiny model (toolkits/make_tiny_model.py)")
        if _PROBE_RESULT not in self._tool_turn_text([_PROBE_RESULT], ended=True):
            raise TemplateWithoutTools("agent.protocol toolcall: the tokenizer's chat template drops tool messages")

    def _tool_turn_text(self, contents: list[str], *, ended: bool) -> str:
        """The text the template puts after a model turn: what closes it, the tool messages, the next assistant
        header (and, for a template whose prompt opens reasoning, its ``<think>``). ``ended``: the model's turn
        already ends with the end token (the engine stopped on it).

        Token in, token out needs the conversation before the model's turn rendered the same with the turn and
        its tool messages after it as it was when the model generated: the generation prompt must be a prefix of
        the longer render, with the model's own text right after it. A template that rewrites the earlier text
        (an assistant header or a reasoning block it injects only in one of the two) is refused."""
        messages = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_TURN}]
        full = self._render(messages + [{"role": "tool", "content": c} for c in contents], tools=self.schemas,
                            generation_prompt=True)
        written = _PROBE_TURN[len("<think>\n"):] if self.opens_thinking else _PROBE_TURN
        if not full.startswith(self._prompt_probe + written):
            raise TemplateWithoutTools("agent.protocol toolcall: the chat template renders the conversation before a "
                                       "model turn differently once the turn and tool messages follow it; token-in/"
                                       "token-out needs a template that leaves what the model continued from as it was")
        closing = full[len(self._prompt_probe + written):]
        # What closes the turn (e.g. "<|im_end|>\n") belongs to the observation, except the end token the model
        # itself sampled.
        if ended and self._end and closing.startswith(self._end):
            closing = closing[len(self._end):]
        return closing

    def _fit(self, contents: list[str], *, ended: bool) -> list[str]:
        """``contents`` cut so the rendered observation stays within ``max_obs_tokens``: each tool message gets
        an equal share of what the template's own tokens leave, shrunk further while the tokens at the seams of
        the cut texts and the frame (``>\n`` and ``\n`` merging in a byte-level BPE) still overflow."""
        limit = self.config.max_obs_tokens

        def size(texts: list[str]) -> int:
            return len(self._encode(self._tool_turn_text(texts, ended=ended)))

        if size(contents) <= limit:
            return contents
        share = max(1, (limit - size([""] * len(contents))) // len(contents))
        while True:
            cut = [truncate_passage(c, share, self.tokenizer) for c in contents]
            over = size(cut) - limit
            if over <= 0 or share == 1:
                return cut
            share = max(1, share - -(-over // len(contents)))

    # ---- the turn --------------------------------------------------------------------------------
    def read_turn(self, rollout: RolloutState, turn: ModelTurn, tools_allowed: bool) -> str | None:
        text = self._as_written(turn.text)
        parsed = parse_tool_calls(text, self._functions)
        visible = without_thinking(text)
        if parsed.calls:
            rollout.action = _ToolTurn("call", parsed, text)
            return None if tools_allowed else "max_turns"
        answered = ANSWER_OPEN in visible and ANSWER_CLOSE in visible
        rollout.action = _ToolTurn("answer" if answered else "none", parsed, text)
        if answered:
            return "answer"
        return "length" if turn.finish_reason == "length" else "eos"

    def _as_written(self, turn_text: str) -> str:
        """The turn with the ``<think>`` its prompt opened (a template whose generation prompt opens reasoning),
        so its reasoning is read as reasoning: a call written there is not run."""
        return "<think>\n" + turn_text if self.opens_thinking else turn_text

    async def observe_step(self, rollout: RolloutState) -> None:
        rollout.tool_turns += 1
        traj, action = rollout.traj, rollout.action
        contents = await asyncio.gather(*(self._answer_call(traj, call) for call in action.parsed.calls))
        traj.tool_call_errors += len(action.parsed.errors)
        rollout.messages.append(_assistant_message(action))
        rollout.messages.extend({"role": "tool", "content": c} for c in contents)
        ended = bool(traj.response_ids) and traj.response_ids[-1] == self._end_id
        ids = self._encode(self._tool_turn_text(self._fit(contents, ended=ended), ended=ended))
        self.append_observation(traj, ids, kind="tool")

    async def _answer_call(self, traj: Trajectory, call: ToolCall | CallError) -> str:
        """The tool message for one call: its results, or the reason it could not run."""
        if isinstance(call, CallError):
            return f"Error: {call.reason}"
        result = await self.call_tool(traj, call.name, call.arguments)
        if result.error == "arguments":  # the model's call was wrong, as a malformed one is
            traj.tool_call_errors += 1
        return result.text

    # ---- start and finish -------------------------------------------------------------------------
    def start(self, record: QARecord) -> RolloutState:
        if isinstance(record.prompt, str):
            raise ValueError(f"agent.protocol toolcall: prompt {record.uid} is text, so the chat template cannot "
                             "render the tool schema into it; prepare the data as chat messages (without --text-prompt)")
        rollout = super().start(record)
        rollout.messages = list(record.prompt)
        return rollout

    def graded_text(self, traj: Trajectory) -> str:
        return graded_text(traj.spans)  # the answer is graded from <answer>, as in the Search-R1 protocol

    def finish(self, rollout: RolloutState) -> Trajectory:
        traj = super().finish(rollout)
        if self.config.apply_chat_template:
            traj.template_drift = self._rerendered(rollout) != traj.prompt_ids + traj.response_ids
        return traj

    def _rerendered(self, rollout: RolloutState) -> list[int]:
        """The conversation re-rendered from messages, as a text-level pipeline would train on it."""
        messages = list(rollout.messages)
        traj = rollout.traj
        tail = traj.response_ids[_last_tool_span_end(traj):]
        if tail:  # the last model turn, ended or cut
            last = self._as_written(self.tokenizer.decode(tail, skip_special_tokens=True))
            messages.append({"role": "assistant", "content": last})
        text = self._render(messages, tools=self.schemas, generation_prompt=False)
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
    cut = first_call_outside_thinking(text)  # a call written inside the reasoning is the reasoning's text
    content = (text[:cut] if cut >= 0 else text).strip()
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _inside_thinking(text: str) -> bool:
    """``text`` ends inside a ``<think>`` block it opened (no ``</think>`` after its last ``<think>``)."""
    return text.rfind("<think>") > text.rfind("</think>")


def _last_tool_span_end(traj: Trajectory) -> int:
    ends = [span.end for span in traj.spans if span.kind == "tool"]
    return max(ends) if ends else 0
