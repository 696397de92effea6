"""A pass's rows of one GRPO group laid in one sequence, their shared prompt computed once.

A group's ``group_size`` rows start with the same prompt, and in the padded layout every row computes it again: on
the embedded default a prompt is about 67 tokens beside 20-65 response tokens, so more than half of a forward pass
is the same prompt four times. Here the rows of a pass that share a prompt become one sequence:

    prompt | response 1 | response 2 | ... | padding

with an attention mask (``[groups, 1, W, W]``, True where a query may attend) under which each response sees the
prompt and its own earlier tokens, never another response, and position ids that restart each response right after
the prompt. Every response token then has exactly the keys, values and positions it has in its own padded row, so
its log-prob is the padded layout's (to float rounding); a response's first token is predicted by the prompt's last
position, which all the group's responses share. Gradients through the shared prompt positions add up over the
responses, as the padded rows' separate copies would.

Only a kernel that takes a dense boolean mask can run it (``sdpa``); the mask grows with the square of a group's
total length, so this pays where responses are short beside the prompt times the group size (CPU-tested on the
embedded default; untested on GPU).
"""

from __future__ import annotations

import torch

from rlinf_search.data.batch import RolloutBatch, prompt_units

SHARED_PROMPT_KERNELS = frozenset({"sdpa"})
"""The attention kernels that read a dense 4D boolean mask as given (transformers passes such a mask through)."""


def shared_prompt_layout(batch: RolloutBatch, real_response: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
    """(input_ids [G, W], position_ids [G, W], attention mask [G, 1, W, W], predictors [K]) for ``batch``'s rows
    laid out by prompt group; ``real_response`` [B, T] marks each row's real response tokens (a prefix of its
    response), ``rows``/``cols`` the K targets (response positions) whose predicting positions are wanted."""
    p = batch.prompt_length
    lengths = real_response.sum(dim=1).tolist()
    prompt_real = batch.attention_mask[:, :p].bool()
    groups = prompt_units(batch, list(range(len(batch))))
    widths = [int(prompt_real[g[0]].sum()) + sum(lengths[r] for r in g) for g in groups]
    width = max(widths)
    ids = torch.zeros((len(groups), width), dtype=batch.input_ids.dtype)
    positions = torch.zeros((len(groups), width), dtype=torch.long)
    mask = torch.zeros((len(groups), 1, width, width), dtype=torch.bool)
    # Per row: its group's sequence, where its response starts there, and its prompt's length.
    sequence_of = torch.zeros(len(batch), dtype=torch.long)
    start_of = torch.zeros(len(batch), dtype=torch.long)
    prompt_of = torch.zeros(len(batch), dtype=torch.long)
    for index, group in enumerate(groups):
        prompt = batch.input_ids[group[0], :p][prompt_real[group[0]]]
        n = len(prompt)
        ids[index, :n] = prompt
        positions[index, :n] = torch.arange(n)
        mask[index, 0, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        at = n
        for row in group:
            length = lengths[row]
            ids[index, at: at + length] = batch.input_ids[row, p: p + length]
            positions[index, at: at + length] = torch.arange(n, n + length)
            mask[index, 0, at: at + length, :n] = True
            mask[index, 0, at: at + length, at: at + length] = torch.ones(length, length, dtype=torch.bool).tril()
            sequence_of[row], start_of[row], prompt_of[row] = index, at, n
            at += length
        # Padding attends to itself alone: a query with no key to attend to would give NaN, even unused.
        pad = torch.arange(at, width)
        mask[index, 0, pad, pad] = True
    # A response's first token is predicted by the prompt's last position; every later one by the token before it.
    within = torch.where(cols > 0, start_of[rows] + cols - 1, prompt_of[rows] - 1)
    return ids, positions, mask, sequence_of[rows] * width + within
