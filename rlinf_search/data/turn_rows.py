"""Turn-level training rows (``actor.pack_traj: false``): each model turn of a trajectory its own sequence.

A multi-turn trajectory is one row by default: its model turns and the tool observations between them in one
sequence, the observations masked. Cut into turns, turn ``k`` becomes a row whose prompt is everything before it
(the prompt, the earlier turns and observations) and whose response is that turn's model tokens alone; every
per-token tensor (advantages, old, reference and engine log-probs, values, the teacher's top-k) is cut the same
way. Because the agent loop is token-in/token-out, a turn's context is exactly the trajectory's prefix, so a
causal model scores each turn token the same in either layout, up to the rounding of a different sequence shape.

The loss must still mean what ``algorithm.loss_agg_func`` says over trajectories, as RLinf's three loss scales
(``group_level``, ``agent_level``, ``turn_level``) make it: sums over tokens (``token-mean``,
``seq-mean-token-sum``, ``seq-mean-token-sum-norm``) are unchanged by the cut, and the trajectory count stays the
count of trajectories; ``seq-mean-token-mean`` takes each turn's token mean weighted by the turn's share of its
trajectory's model tokens (``RolloutBatch.loss_scale``), so a trajectory's turns add up to its token mean.
A one-turn trajectory is one row either way, the same row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from rlinf_search.data.batch import RolloutBatch

TURN_LEVEL_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""The loss aggregations turn rows can be weighted back to (a dotted-path aggregation's meaning is unknown)."""

# Response-aligned tensors whose padding is not 0 (see RolloutBatch).
_PAD = {"teacher_top_logprobs": float("-inf"), "token_versions": -1}


@dataclass
class TurnRows:
    """A batch of trajectories cut into one row per model turn."""

    batch: RolloutBatch
    """One row per model turn, in trajectory order then turn order."""
    trajectory_of_row: list[int]
    """The trajectory (row of the batch that was cut) each turn row comes from."""

    @property
    def trajectories(self) -> int:
        """Trajectories with at least one model token (a whole batch without any counts its rows)."""
        return len(set(self.trajectory_of_row))


def model_turns(mask: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in a 1-D response mask: the model turns."""
    spans, start = [], None
    for position, value in enumerate(mask.tolist()):
        if value and start is None:
            start = position
        elif not value and start is not None:
            spans.append((start, position))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def split_turns(batch: RolloutBatch, loss_agg_func: str) -> TurnRows:
    """``batch`` cut into turn rows weighted for ``loss_agg_func`` (one of ``TURN_LEVEL_AGGREGATIONS``).
    A batch without any model token comes back whole: it trains on nothing either way."""
    if loss_agg_func not in TURN_LEVEL_AGGREGATIONS:
        raise ValueError(f"actor.pack_traj false weights turn rows for {', '.join(TURN_LEVEL_AGGREGATIONS)}; "
                         f"algorithm.loss_agg_func is {loss_agg_func!r}")
    width = batch.prompt_length
    cuts: list[tuple[int, int, int]] = []  # (trajectory row, turn start, turn end) in response positions
    for row in range(len(batch)):
        cuts += [(row, start, end) for start, end in model_turns(batch.response_mask[row])]
    if not cuts:
        return TurnRows(batch, list(range(len(batch))))
    real = batch.attention_mask.bool()
    prompts = [batch.input_ids[row, :width][real[row, :width]] for row, _, _ in cuts]
    contexts = [torch.cat([prompt, batch.input_ids[row, width: width + start]])
                for prompt, (row, start, _) in zip(prompts, cuts)]
    context_width = max(len(c) for c in contexts)
    turn_width = max(end - start for _, start, end in cuts)
    rows = len(cuts)
    pad_id = int(batch.input_ids[~real].flatten()[0]) if (~real).any() else 0
    input_ids = torch.full((rows, context_width + turn_width), pad_id, dtype=batch.input_ids.dtype)
    attention = torch.zeros_like(input_ids, dtype=batch.attention_mask.dtype)
    for i, (context, (row, start, end)) in enumerate(zip(contexts, cuts)):
        input_ids[i, context_width - len(context): context_width] = context
        input_ids[i, context_width: context_width + end - start] = batch.input_ids[row, width + start: width + end]
        attention[i, context_width - len(context): context_width + end - start] = 1

    def cut(name: str, value):
        if not isinstance(value, torch.Tensor):
            return value
        if value.dim() == 1:  # per trajectory: rewards
            return value[[row for row, _, _ in cuts]]
        out = torch.full((rows, turn_width, *value.shape[2:]), _PAD.get(name, 0), dtype=value.dtype)
        for i, (row, start, end) in enumerate(cuts):
            out[i, : end - start] = value[row, start:end]
        return out

    skip = {"input_ids", "attention_mask", "prompt_length", "uids", "extra", "loss_scale"}
    changes = {f.name: cut(f.name, getattr(batch, f.name)) for f in fields(batch) if f.name not in skip}
    of_row = [row for row, _, _ in cuts]
    model_tokens = batch.response_mask.sum(dim=1)
    turn_tokens = torch.tensor([end - start for _, start, end in cuts], dtype=torch.float32)
    scale = turn_tokens / model_tokens[of_row].to(torch.float32)
    if loss_agg_func != "seq-mean-token-mean":
        scale = torch.ones_like(scale)  # the other modes sum tokens: the cut does not change them
    if batch.loss_scale is not None:
        scale = scale * batch.loss_scale[of_row]
    turned = replace(batch, input_ids=input_ids, attention_mask=attention, prompt_length=context_width,
                     uids=[batch.uids[row] for row in of_row],
                     extra={key: [values[row] for row in of_row] for key, values in batch.extra.items()},
                     loss_scale=scale, **changes)
    return TurnRows(turned, of_row)
