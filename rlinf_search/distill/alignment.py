"""The teacher's log-probs placed on the student's response tokens.

Shared tokenizer: the teacher scored the very ids the student sampled, so response token ``k`` takes
the teacher's value at ``len(prompt) + k``.

Different tokenizers: the teacher scored a text (its own rendering of the prompt, then the student's
response text as decoded). A student token covering characters ``[a, b)`` of the response gets the
sum of the log-probs of the teacher tokens that exactly tile ``[a, b)`` (the chain rule: the
probability of that string); when a teacher token crosses ``a`` or ``b`` the token gets no signal and
is counted as unaligned. Only model tokens (mask 1) are ever scored.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from rlinf_search.distill.teacher import TopK


@dataclass
class AlignedLogprobs:
    """Teacher log-probs on one trajectory's response tokens."""

    values: list[float]
    """Per response token: the teacher's log-prob where ``scored``, else 0.0."""
    scored: list[bool]
    """Whether the token got a teacher value (model tokens that aligned and had one)."""
    unaligned: int
    """Model tokens left without a value because the two tokenizations do not share their boundaries
    (or the server gave none)."""
    top: TopK | None = None
    """Per response token, the teacher's most likely tokens at its position where ``scored`` (padding
    elsewhere); None when ``algorithm.distill.top_k`` is 0. Shared tokenizer only."""


def from_shared_ids(teacher: list[float | None], *, prompt_length: int, response_mask: list[int],
                    top: TopK | None = None) -> AlignedLogprobs:
    """Response token ``k`` takes ``teacher[prompt_length + k]`` (the teacher scored the same ids), and
    ``top``'s row ``prompt_length + k`` when the teacher's most likely tokens were asked for."""
    values, scored, unaligned = [], [], 0
    has_top = (top.logprobs > -torch.inf).any(-1).tolist() if top is not None else None
    for k, mask in enumerate(response_mask):
        at = prompt_length + k
        value = teacher[at] if at < len(teacher) else None
        ok = bool(mask) and value is not None and (has_top is None or (at < len(has_top) and has_top[at]))
        unaligned += int(bool(mask) and not ok)
        values.append(float(value) if ok else 0.0)
        scored.append(ok)
    kept = None
    if top is not None:
        kept = TopK.empty(len(response_mask), top.ids.shape[1])
        rows = torch.tensor(scored, dtype=torch.bool)
        source = torch.arange(prompt_length, prompt_length + len(response_mask))[rows]
        kept.ids[rows], kept.logprobs[rows] = top.ids[source], top.logprobs[source]
    return AlignedLogprobs(values=values, scored=scored, unaligned=unaligned, top=kept)


def char_extents(decode, ids: list[int]) -> list[tuple[int, int] | None]:
    """``[start, end)`` of each token in ``decode(ids)``; None for a token that ends inside a character
    (its bytes decode as U+FFFD until a later token completes the character, which then spans it).
    ``decode``: the tokenizer's ``decode``.

    Linear in the tokens: each token is decoded with the tokens since the start of the token group before
    its own (a group is a run of tokens that ends on a character boundary), never with the whole prefix.
    That one group of context keeps decoders that treat the first token specially (SentencePiece drops a
    leading space) the same as decoding the whole text.
    """
    extents: list[tuple[int, int] | None] = []
    context, group, offset = 0, 0, 0  # token indices where the previous and the current group start
    for end in range(1, len(ids) + 1):
        text = decode(ids[context:end])
        if text.endswith("\ufffd"):
            extents.append(None)
            continue
        grown = len(text) - len(decode(ids[context:group])) if group > context else len(text)
        extents.append((offset, offset + grown))
        offset += grown
        context, group = group, end
    return extents


def from_text_offsets(teacher: list[float | None], offsets: list[int], *, text_length: int, response_start: int,
                      extents: list[tuple[int, int] | None], response_mask: list[int]) -> AlignedLogprobs:
    """Map teacher tokens (``offsets`` into a text of ``text_length`` characters whose response starts at
    ``response_start``) onto the student's response tokens (``extents`` within the response text)."""
    starts = list(offsets)
    boundaries = set(starts) | {text_length}
    values, scored, unaligned = [], [], 0
    for extent, mask in zip(extents, response_mask, strict=True):
        if not mask:
            values.append(0.0)
            scored.append(False)
            continue
        total = _tiling_sum(teacher, starts, boundaries, extent, response_start)
        unaligned += int(total is None)
        values.append(0.0 if total is None else total)
        scored.append(total is not None)
    return AlignedLogprobs(values=values, scored=scored, unaligned=unaligned)


def _tiling_sum(teacher: list[float | None], starts: list[int], boundaries: set[int],
                extent: tuple[int, int] | None, response_start: int) -> float | None:
    """Sum of the teacher log-probs of the tokens that exactly tile ``extent``, or None."""
    if extent is None or extent[0] == extent[1]:
        return None
    begin, end = response_start + extent[0], response_start + extent[1]
    if begin not in boundaries or end not in boundaries:
        return None
    first = bisect.bisect_left(starts, begin)
    last = bisect.bisect_left(starts, end)
    inside = teacher[first:last]
    if not inside or any(value is None for value in inside):
        return None
    return float(sum(inside))
