"""A prepared prompt as token ids, held to ``data.max_prompt_length``: one code path for the agent loop
and the start-up check, so the check measures exactly what the engine will be given.

``data.truncation`` (verl's key) says what an overlong prompt gets: ``error`` refuses it with its uid,
``left`` keeps its end (the question, which sits last in Search-R1's template) and ``right`` keeps its
start. ``data.filter_overlong_prompts`` drops such prompts at start-up instead (``rlinf_search.runners.prompt_sets``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_search.data.io_struct import QARecord

TRUNCATIONS = ("error", "left", "right")


@dataclass(frozen=True)
class PromptLimit:
    """How the run treats prompts over ``data.max_prompt_length``."""

    max_prompt_tokens: int = 1024
    """``data.max_prompt_length``."""
    filter_overlong: bool = False
    """``data.filter_overlong_prompts``: drop overlong prompts at start-up (the count is logged)."""
    truncation: str = "error"
    """``data.truncation``: what the agent loop does with an overlong prompt that was not dropped."""
    apply_chat_template: bool = True
    """``data.apply_chat_template``: how chat prompts are tokenized (as the agent loop does)."""
    tools: tuple[dict, ...] | None = None
    """Tool schemas the chat template renders into every prompt (``agent.protocol: toolcall``), so the limit
    measures what the engine is given; None: no tools."""


class PromptTooLong(ValueError):
    """A prompt over ``data.max_prompt_length`` with ``data.truncation: error``; the message names its uid."""


class PromptTokenizer:
    """Templates a record's prompt and applies the prompt limit."""

    def __init__(self, tokenizer, *, apply_chat_template: bool = True, max_prompt_tokens: int | None = None,
                 truncation: str = "error", tools: list[dict] | None = None):
        """``tools``: OpenAI tool schemas the chat template renders into the prompt (function calling)."""
        self.check_truncation(truncation)
        self.tokenizer = tokenizer
        self.tools = tools
        self.apply_chat_template = apply_chat_template
        self.max_prompt_tokens = max_prompt_tokens
        self.truncation = truncation

    @staticmethod
    def check_truncation(truncation: str) -> None:
        if truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")

    def ids(self, record: QARecord) -> list[int]:
        """Chat messages through the tokenizer's chat template (or joined by blank lines when
        ``apply_chat_template`` is off); text prompts are tokenized as they are."""
        if isinstance(record.prompt, str):
            return self.tokenizer.encode(record.prompt, add_special_tokens=False)
        if not self.apply_chat_template:
            text = "\n\n".join(message["content"] for message in record.prompt)
            return self.tokenizer.encode(text, add_special_tokens=False)
        tools = {"tools": self.tools} if self.tools else {}  # only function-calling runs ask the template for it
        encoded = self.tokenizer.apply_chat_template(record.prompt, add_generation_prompt=True, tokenize=True, **tools)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def limited_ids(self, record: QARecord) -> list[int]:
        """``ids(record)`` held to ``max_prompt_tokens``; ``PromptTooLong`` when ``truncation`` is error."""
        ids = self.ids(record)
        limit = self.max_prompt_tokens
        if limit is None or len(ids) <= limit:
            return ids
        if self.truncation == "error":
            raise PromptTooLong(too_long_message(record.uid, len(ids), limit))
        return ids[-limit:] if self.truncation == "left" else ids[:limit]


def too_long_message(uid: str, length: int, limit: int, *, source: str = "") -> str:
    """One line naming the prompt, where it came from (``source``: a config key) and the ways out."""
    where = f" (in {source})" if source else ""
    return (f"data.max_prompt_length: prompt {uid}{where} has {length} tokens, over the limit of {limit}; raise "
            "the limit, set data.filter_overlong_prompts: true to drop such prompts, or data.truncation: left|right")
