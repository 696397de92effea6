"""What a tool is to an agent loop: a name, an OpenAI function schema, and an async call from arguments to the text
the model reads. A tool never raises on what the model wrote: arguments it cannot use and services that fail come
back as a ``ToolResult`` whose ``error`` names the kind (the loop counts them per tool) and whose ``text`` is the
one-line reason the model reads. A failure that is the service's, not the model's, also sets ``infra_error``: the
trajectory is then not trained on (its group is rolled out again or dropped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol


@dataclass
class ToolResult:
    """What one call returns to the agent loop."""

    text: str
    """What the model reads as the answer: results, or the one-line reason the call failed."""
    error: str | None = None
    """The kind of failure, one of the tool's ``error_kinds`` (``arguments``: the call itself was wrong;
    ``backend``: the service failed); None when the call worked."""
    searches: list[str] = field(default_factory=list)
    """Queries run against the retriever (the Search-R1 metrics count them: ``num_searches``, ``queries``)."""
    failed_searches: int = 0
    """Of those, the ones whose backend failed."""
    infra_error: str | None = None
    """The one-line reason when the call failed for an infrastructure reason (the service unreachable, timed
    out, failing after its retries; see ``SearchOutcome.infra``), not for what the model asked: the agent loop
    then ends the trajectory and it is never trained."""
    seconds: float = 0.0
    """Wall time of the call."""


class Tool(Protocol):
    """What an agent loop needs from a tool."""

    name: str
    """The function name the model calls it by."""
    schema: dict
    """Its OpenAI tool object, ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    error_kinds: tuple[str, ...]
    """The ``ToolResult.error`` values it can return."""

    async def call(self, arguments: dict) -> ToolResult:
        """Run one call; never raises for bad arguments or a failing service."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class ToolClass(Protocol):
    """What the config loader (``config/tools.py``) and the rollout ranks call on a tool's class, registered in
    ``TOOLS`` or named by ``tools.<name>.class``. The tool's name is its schema's function name, written once there:
    its section is ``tools.<that name>``. Its settings are a pydantic model the class declares with
    ``plugin_settings.with_settings``: start-up validates the section with it (one line naming
    ``tools.<name>.<key>`` for an unknown key or a value it refuses), and the constructor gets the validated model.
    A class that declares none takes no keys and gets None."""

    schema: ClassVar[dict]
    """Its OpenAI tool object, ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    reads_server: ClassVar[bool]
    """Optional (default false): ``server_addr`` defaults to ``tools.search.server_addr``."""

    def __call__(self, settings, *, tokenizer) -> Tool:
        """The constructor: a tool from its validated settings (its settings model, or None), built per rollout call
        in that call's event loop."""
        ...


TOOL_CLASS_MEMBERS = ("schema", "call")
"""What a class must have for the loader to take it as a tool (``ToolClass``; the constructor comes with any
class, the settings model is optional)."""


def tool_name(schema: dict) -> str:
    """The name the model calls a tool by: its schema's function name."""
    return schema["function"]["name"]
