"""Reading the tool calls a model wrote in one turn, in the Hermes / Qwen2.5 / Qwen3 layout::

    <tool_call>
    {"name": "search", "arguments": {"query_list": ["who wrote X"]}}
    </tool_call>

A turn may hold several calls; they run concurrently. A call the turn wrote but that cannot run (JSON that
does not parse, no ``name``, arguments that are not an object, a tool nobody registered, arguments the tool
refuses) becomes a ``CallError``: the model reads its one-line reason as that call's tool response, and the
trajectory counts it. Nothing here raises on model text. Text inside ``<think> ... </think>`` is reasoning, not
an action: a call written there is not run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# A think block, or one left open at the end of the turn (the turn was cut inside it).
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_UNCLOSED_CALL = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    name: str
    """The function name it wrote."""
    arguments: dict
    """Its arguments, a JSON object."""


@dataclass(frozen=True)
class CallError:
    """A call the model wrote that cannot run."""

    reason: str
    """One line for the model: what was wrong and what a call looks like."""
    text: str
    """What stood between the tags (cut to 200 characters), for logs and dumps."""


@dataclass
class ParsedTurn:
    """The calls of one turn, in the order written."""

    calls: list[ToolCall | CallError] = field(default_factory=list)
    """Each call, or the error that stands in for it; answered in this order."""

    @property
    def valid(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    @property
    def errors(self) -> list[CallError]:
        return [c for c in self.calls if isinstance(c, CallError)]


def without_thinking(text: str) -> str:
    """``text`` with every ``<think>`` block removed (an unclosed one runs to the end)."""
    return _THINK.sub(" ", text)


def first_call_outside_thinking(text: str) -> int:
    """Where the first ``<tool_call>`` outside every ``<think>`` block starts in ``text``; -1 if none does."""
    thinking = [match.span() for match in _THINK.finditer(text)]
    start = text.find(CALL_OPEN)
    while start >= 0 and any(lo <= start < hi for lo, hi in thinking):
        start = text.find(CALL_OPEN, start + 1)
    return start


def parse_tool_calls(turn_text: str, tools: dict[str, dict]) -> ParsedTurn:
    """The calls in ``turn_text`` outside ``<think>``; ``tools``: the offered functions by name, each its
    OpenAI ``function`` object (``name``, ``description``, ``parameters``), whose required arguments are
    checked. A ``<tool_call>`` that never closes is an error too: the model meant to call."""
    text = without_thinking(turn_text)
    parsed = ParsedTurn()
    for match in _CALL.finditer(text):
        parsed.calls.append(_read_call(match.group(1), tools))
    if _UNCLOSED_CALL.search(text):
        tail = text[text.rindex(CALL_OPEN) + len(CALL_OPEN):]
        parsed.calls.append(CallError(f"the {CALL_OPEN} was never closed with {CALL_CLOSE}", tail.strip()[:200]))
    return parsed


def _read_call(body: str, tools: dict[str, dict]) -> ToolCall | CallError:
    text = body.strip()
    shown = text[:200]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return CallError(f"the call is not valid JSON ({exc.msg} at character {exc.pos}); write "
                         '{"name": ..., "arguments": {...}} between the tool_call tags', shown)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return CallError('the call needs a "name" (a string) and "arguments" (an object)', shown)
    name, arguments = value["name"], value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI's API returns them
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return CallError(f'the "arguments" of {name!r} must be a JSON object', shown)
    if name not in tools:
        offered = ", ".join(sorted(tools)) or "none"
        return CallError(f"there is no tool named {name!r}; the tools are: {offered}", shown)
    required = tools[name].get("parameters", {}).get("required", [])
    missing = [key for key in required if key not in arguments]
    if missing:
        return CallError(f"{name} needs the argument(s) {', '.join(missing)}", shown)
    return ToolCall(name=name, arguments=arguments)
