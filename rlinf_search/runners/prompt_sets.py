"""The run's prompts, read and held to the prompt limit once at start-up, before any worker starts.

Every prompt is tokenized as the agent loop will tokenize it (``PromptTokenizer``), so an overlong
prompt is refused with its uid (``data.truncation: error``, the default) or dropped
(``data.filter_overlong_prompts``) before a GPU is reserved, never in the middle of step 300.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlinf_search.data.io_struct import QARecord
from rlinf_search.data.prepare import load_records
from rlinf_search.data.prompt_tokens import PromptLimit, PromptTokenizer, PromptTooLong, too_long_message

log = logging.getLogger(__name__)


@dataclass
class PromptSet:
    """Prompts of one split after the limit."""

    records: list[QARecord]
    """The prompts kept, in file order."""
    dropped: list[str]
    """uids of the prompts dropped as overlong."""
    truncated: list[str]
    """uids of the prompts the agent loop will cut (``truncation: left|right``)."""


def limit_prompts(records: list[QARecord], tokenizer, limit: PromptLimit, *, split: str) -> PromptSet:
    """Apply ``limit`` to ``records``; raises ``PromptTooLong`` (naming the uid) on the first overlong
    prompt when it is neither dropped nor truncated."""
    prompts = PromptTokenizer(tokenizer, apply_chat_template=limit.apply_chat_template,
                              tools=list(limit.tools) if limit.tools else None)
    kept, dropped, truncated = [], [], []
    for record in records:
        length = len(prompts.ids(record))
        if length <= limit.max_prompt_tokens:
            kept.append(record)
        elif limit.filter_overlong:
            dropped.append(record.uid)
        elif limit.truncation == "error":
            raise PromptTooLong(too_long_message(record.uid, length, limit.max_prompt_tokens, source=split))
        else:
            kept.append(record)
            truncated.append(record.uid)
    if dropped:
        log.warning("data.filter_overlong_prompts: dropped %d of %d %s prompts over %d tokens (first: %s)",
                    len(dropped), len(records), split, limit.max_prompt_tokens, dropped[0])
    if truncated:
        log.warning("data.truncation %s: %d of %d %s prompts are over %d tokens and will be cut (first: %s)",
                    limit.truncation, len(truncated), len(records), split, limit.max_prompt_tokens, truncated[0])
    return PromptSet(records=kept, dropped=dropped, truncated=truncated)


def load_prompt_set(paths: tuple[str, ...], tokenizer, limit: PromptLimit, *, split: str) -> PromptSet:
    """Read the prepared jsonl files of one split and apply ``limit``."""
    records = [record for path in paths for record in load_records(path)]
    return limit_prompts(records, tokenizer, limit, split=split)


def rollout_tokenizer(model_path: str):
    """The tokenizer the engine will use (the rollout model's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@dataclass
class RunPrompts:
    """A run's training and validation prompts, after the limit."""

    train: PromptSet
    """``data.train_data_paths``."""
    val: PromptSet
    """``data.val_data_paths`` (may hold no records)."""


def load_run_prompts(*, train_paths: tuple[str, ...], val_paths: tuple[str, ...], model_path: str,
                     limit: PromptLimit) -> RunPrompts:
    """Both splits with ``limit`` applied, tokenized by the rollout model's tokenizer."""
    tokenizer = rollout_tokenizer(model_path)
    return RunPrompts(train=load_prompt_set(train_paths, tokenizer, limit, split="data.train_data_paths"),
                      val=load_prompt_set(val_paths, tokenizer, limit, split="data.val_data_paths"))
