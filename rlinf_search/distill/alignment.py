"""The teacher's log-probs placed on the student's response tokens.

Shared tokenizer: the teacher scored the very ids the student sampled, so response token ``k`` takes
the teacher's value at ``len(prompt) + k``.

Different tokenizers: the client tokenizes the student's response text with the teacher's own tokenizer
(with character offsets) and the teacher scores those ids. The two tokenizations are cut at the
character positions where both have a token boundary (a byte token that ends inside a character is
no boundary on either side). Each piece between two such cuts is one string both models scored: by the
chain rule its log-probability is the sum of its tokens' on each side, so the piece's KL is
``sum(student) - sum(teacher)``. A piece of one student token gives that token the teacher's sum; a piece
of several (a character split into byte tokens, or tokenizations that cross) is a *segment*: its KL is
shared equally by its tokens once the student's log-probs are known (``teacher_per_token``). A piece
holding an observation token, a special or control token (they decode to nothing, so the teacher never
sees them), or a teacher token without a value is not scored; its model tokens are counted as unaligned.
"""

from __future__ import annotations

import itertools
import math
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
    retokenized: int = 0
    """Scored tokens in pieces that are not one student token against one teacher token (different
    tokenizers): their KL compares two tokenizations of one string, so a sampled text that its
    tokenizer would not write adds to it even against an identical teacher."""
    segment: list[int] | None = None
    """Per response token, the piece it belongs to (tokens of one piece share an id; -1: not scored), when
    some piece spans several student tokens; their ``values`` then hold the piece's teacher sum. None:
    every scored token is a piece of its own."""


def from_shared_ids(teacher: list[float | None], *, prompt_length: int, response_mask: list[int],
                    top: TopK | None = None) -> AlignedLogprobs:
    """Response token ``k`` takes ``teacher[prompt_length + k]`` (the teacher scored the same ids), and
    ``top``'s row ``prompt_length + k`` when the teacher's most likely tokens were asked for."""
    n = len(response_mask)
    given = teacher[prompt_length:prompt_length + n]
    value = torch.tensor([math.nan if v is None else v for v in given] + [math.nan] * (n - len(given)),
                         dtype=torch.float64)
    ok = torch.tensor(response_mask, dtype=torch.bool) & ~value.isnan()
    kept = None
    if top is not None:
        rows = top.logprobs[prompt_length:prompt_length + n]
        has_top = torch.zeros(n, dtype=torch.bool)
        has_top[: len(rows)] = (rows > -math.inf).any(-1)
        ok &= has_top
        kept = TopK.empty(n, top.ids.shape[1])
        source = torch.arange(prompt_length, prompt_length + n)[ok]
        kept.ids[ok], kept.logprobs[ok] = top.ids[source], top.logprobs[source]
    unaligned = int(torch.tensor(response_mask, dtype=torch.bool).sum()) - int(ok.sum())
    return AlignedLogprobs(values=torch.where(ok, value, 0.0).tolist(), scored=ok.tolist(), unaligned=unaligned,
                           top=kept)


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


def from_teacher_tokens(teacher: list[float | None], spans: list[tuple[int, int]], *,
                        extents: list[tuple[int, int] | None], response_mask: list[int]) -> AlignedLogprobs:
    """Map the teacher's log-probs of its own tokens of the response text (``spans``: each token's
    ``[start, end)`` characters, as a fast tokenizer's offsets give them; a byte token inside a character
    spans the whole character) onto the student's tokens (``extents`` from ``char_extents``: None for a
    token that ends inside a character, an empty extent for a token that decodes to nothing)."""
    if len(teacher) != len(spans):
        raise ValueError(f"{len(teacher)} teacher log-probs for {len(spans)} teacher tokens")
    cuts = _teacher_cuts(spans) & _student_cuts(extents)
    n = len(extents)
    values, scored, segment = [0.0] * n, [False] * n, [-1] * n
    unaligned, pieces, multi, retokenized = 0, 0, False, 0
    i = j = 0  # next student token, next teacher token
    at_cut = True  # whether the text before student token i ends on a common cut
    while i < n:
        if _empty(extents[i]):  # decodes to nothing (special and control tokens): not in the text, never scored
            unaligned += int(bool(response_mask[i]))
            i += 1
            continue
        members = []
        while i < n and not _empty(extents[i]):  # the student tokens up to the next common cut
            members.append(i)
            i += 1
            if extents[i - 1] is not None and extents[i - 1][1] in cuts:
                break
        last = extents[members[-1]]
        end = last[1] if last is not None else None
        total, ok, first = 0.0, at_cut and end is not None and end in cuts, j
        while j < len(spans) and (end is None or spans[j][0] < end):
            ok = ok and teacher[j] is not None
            total += teacher[j] or 0.0
            j += 1
        at_cut = end is not None and end in cuts
        if not (ok and all(response_mask[m] for m in members)):
            unaligned += sum(1 for m in members if response_mask[m])
            continue
        multi = multi or len(members) > 1
        retokenized += len(members) if (len(members), j - first) != (1, 1) else 0
        for m in members:
            values[m], scored[m], segment[m] = total, True, pieces
        pieces += 1
    return AlignedLogprobs(values=values, scored=scored, unaligned=unaligned, retokenized=retokenized,
                           segment=segment if multi else None)


def _empty(extent: tuple[int, int] | None) -> bool:
    return extent is not None and extent[0] == extent[1]


def _teacher_cuts(spans: list[tuple[int, int]]) -> set[int]:
    """Character positions where one teacher token ends and the next starts (byte tokens of one character
    share its span, so no cut falls inside a character)."""
    cuts = {0}
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start >= end:
            cuts.add(end)
    if spans:
        cuts.add(spans[-1][1])
    return cuts


def _student_cuts(extents: list[tuple[int, int] | None]) -> set[int]:
    return {0} | {extent[1] for extent in extents if extent is not None}


def teacher_per_token(values: torch.Tensor, scored: torch.Tensor, segment: torch.Tensor,
                      student: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` teacher log-probs per student token: ``values`` as they are where a token is a piece of its
    own; on a piece of several tokens, ``student + (teacher sum - student sum) / tokens``, so that the
    piece's per-token KLs are equal and add up to its KL. ``segment``: ``[B, T]`` piece ids (-1 or a
    unique id per token where pieces are single)."""
    rows, width = values.shape
    flat = (torch.arange(rows).unsqueeze(1) * (width + 1) + segment.clamp(min=0))[scored]
    student_sum = torch.zeros(rows * (width + 1)).index_add_(0, flat, student[scored].float())
    count = torch.zeros(rows * (width + 1)).index_add_(0, flat, torch.ones_like(flat, dtype=torch.float32))
    out = values.clone().float()
    spread = student[scored].float() + (values[scored].float() - student_sum[flat]) / count[flat]
    out[scored] = torch.where(count[flat] > 1, spread, values[scored].float())
    return out
