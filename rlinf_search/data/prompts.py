"""Prompt templates for prepared questions: a registry by name, or a template read from a text file.

A template is plain text with one ``{question}`` placeholder. The placeholder is substituted with
``str.replace``, not ``str.format``, so braces elsewhere in a template (a JSON example) or in a
question (``{x | x > 0}``) need no escaping.

The result is a chat message list; the model's chat template is applied later from its tokenizer,
or now with :func:`apply_chat_template` when text prompts are asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlinf_search.registry import Registry

PLACEHOLDER = "{question}"

# Our own wording of the Search-R1 protocol: the tags and the stop points must match what the agent
# loop parses (`</search>` and `</answer>` end a turn), so the example uses exactly those tags.
SEARCHR1_TEMPLATE = (
    "Answer the question below. Whenever you receive new information, first think it through "
    "inside <think> and </think>. If a fact you need is missing, look it up by writing "
    "<search> your query </search>; the search results will be given back to you between "
    "<information> and </information>. You may search as often as you need. Once you know "
    "enough, write only the final answer between <answer> and </answer>, with no explanation, "
    "for example <answer> Beijing </answer>.\n\n"
    "Question: {question}\n"
)

# The same protocol in a third of the tokens, for tiny models on a CPU budget (the embedded demo):
# prompt tokens are most of a short trajectory's compute, and a 2 M-parameter model gains nothing
# from the longer wording.
BRIEF_TEMPLATE = (
    "Answer the question. To look a fact up, write <search> query </search>; the results come back "
    "between <information> and </information>. Write the final answer as <answer> ... </answer>.\n\n"
    "Question: {question}\n"
)

# For agent.protocol toolcall: the search tool itself is described by its schema, which the chat template
# renders into the prompt; the instruction only names the tool and the answer format the reward reads.
TOOLCALL_TEMPLATE = (
    "Answer the question. Whenever a fact you need is missing, call the search tool to look it up; its results "
    "are given back to you. Once you know enough, write only the final answer between <answer> and </answer>, "
    "for example <answer> Beijing </answer>.\n\n"
    "Question: {question}\n"
)

DEFAULT_TEMPLATE = "searchr1"


class TemplateError(ValueError):
    """A template name or file that cannot be used; the message names it."""


def _check_placeholder(text: str, what: str) -> None:
    if PLACEHOLDER not in text:
        raise TemplateError(f"{what} has no {PLACEHOLDER} placeholder")


def _template_file(name_or_path: str) -> str:
    """A name no template is registered under is a path to a UTF-8 text file (instead of a dotted path)."""
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(TEMPLATES.names())
        raise TemplateError(f"template {name_or_path!r} is neither a registered name ({known}) nor a file")
    text = path.read_text(encoding="utf-8")
    _check_placeholder(text, f"template file {path}")
    return text


TEMPLATES: Registry[str] = Registry("prompt template", fallback=_template_file, error=TemplateError,
                                    check=lambda name, text: _check_placeholder(text, f"template {name!r}"))
"""Templates by name (``searchr1``, ``brief``, ``toolcall``, ``plain``); :func:`register_template` adds more, and any other
name is read as a path to a template file."""

for _name, _text in (("searchr1", SEARCHR1_TEMPLATE), ("brief", BRIEF_TEMPLATE), ("toolcall", TOOLCALL_TEMPLATE),
                     ("plain", PLACEHOLDER)):
    TEMPLATES.register(_name, _text)


def register_template(name: str, text: str, *, overwrite: bool = False) -> None:
    """Add a template under ``name`` (it must contain ``{question}``)."""
    TEMPLATES.register(name, text, overwrite=overwrite)


def resolve_template(name_or_path: str) -> str:
    """The template text for a registry name, else for a path to a UTF-8 text file."""
    return TEMPLATES.resolve(name_or_path)


def render(template: str, question: str) -> str:
    """The template with its ``{question}`` placeholder(s) replaced by ``question``."""
    return template.replace(PLACEHOLDER, question)


def build_messages(template: str, question: str) -> list[dict[str, str]]:
    """A one-turn chat: the rendered template as the user message."""
    return [{"role": "user", "content": render(template, question)}]


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Load a Hugging Face tokenizer from a local directory, checking it has a chat template."""
    # Imported here so preparing chat-message data never pays for importing transformers.
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        if not Path(path).exists():
            raise TemplateError(f"{path}: no such tokenizer directory") from exc
        raise TemplateError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(f"the tokenizer at {path} has no chat template; text prompts need one")
    return tokenizer


def apply_chat_template(messages: list[dict[str, str]], tokenizer: Any) -> str:
    """The messages as the model will see them, ending with the assistant's generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

