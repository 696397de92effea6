"""Trajectories as padded tensors for training, and their split into micro-batches by a token budget.

Layout (as in verl): prompts left-padded to the batch's longest prompt ``P``, responses
right-padded to its longest response ``T``; ``input_ids`` is ``[B, P + T]``. The logits at positions
``P - 1 .. P + T - 2`` predict the response tokens, so every per-token tensor is ``[B, T]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from rlinf_search.data.io_struct import Trajectory


@dataclass
class RolloutBatch:
    """A batch of trajectories as tensors. ``[B, T]`` tensors are aligned with the response tokens."""

    input_ids: torch.Tensor
    """[B, P + T] prompt (left-padded) then response (right-padded) token ids."""
    attention_mask: torch.Tensor
    """[B, P + T] 1 on real tokens, 0 on padding."""
    response_mask: torch.Tensor
    """[B, T] 1 on model-generated tokens (trained on), 0 on observation tokens and padding."""
    rollout_logprobs: torch.Tensor
    """[B, T] the engine's log-prob of each response token (0 on observations, NaN where unknown)."""
    rewards: torch.Tensor
    """[B] the trajectory reward."""
    uids: list[str]
    """Prompt uid per row (GRPO groups rows by it)."""
    prompt_length: int
    """P: width of the left-padded prompt block."""
    token_versions: torch.Tensor | None = None
    """[B, T] the policy version that sampled each response token (``Trajectory.token_versions``); -1 on
    observations, padding and tokens of engines that do not count versions."""
    trained_version: int | None = None
    """The policy version the update starts from (the step's weights before it trains): a token's lag is this
    minus its version. None: not set (lags unknown)."""
    old_logprobs: torch.Tensor | None = None
    """[B, T] log-probs under the policy before this step's updates (recomputed or the engine's)."""
    ref_logprobs: torch.Tensor | None = None
    """[B, T] log-probs under the frozen reference model (for the KL term)."""
    advantages: torch.Tensor | None = None
    """[B, T] advantage per token (0 on observation tokens)."""
    values: torch.Tensor | None = None
    """[B, T] the critic's value of the state before each response token, before this step's update
    (GAE's baseline and the anchor of the clipped value loss); read only on model tokens."""
    returns: torch.Tensor | None = None
    """[B, T] the critic's regression target (GAE: advantages before whitening + values; 0 on observation tokens)."""
    teacher_top_ids: torch.Tensor | None = None
    """[B, T, k] the distillation teacher's ``k`` most likely tokens at each response position
    (``algorithm.distill.top_k``; 0-padded)."""
    teacher_top_logprobs: torch.Tensor | None = None
    """[B, T, k] the teacher's log-probs of ``teacher_top_ids`` at the rollout temperature (-inf on padding)."""
    teacher_top_weight: torch.Tensor | None = None
    """[B, T] weight of the actor's KL to the teacher's top-k on each token (``top_k_coef`` where the teacher
    scored a model token, 0 elsewhere)."""
    loss_scale: torch.Tensor | None = None
    """[B] multiplier of each row's token losses; None: 1. Turn rows (``actor.pack_traj: false``,
    ``data/turn_rows.py``) carry their share of their trajectory's model tokens here."""
    extra: dict = field(default_factory=dict)
    """Per-row values that are not tensors the trainer needs (data sources, searches), for metrics."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.response_mask.shape[1])

    def token_counts(self) -> torch.Tensor:
        """[B] real (non-padding) tokens per row: the cost of a row in a micro-batch."""
        return self.attention_mask.sum(dim=1)

    def select(self, rows: list[int]) -> "RolloutBatch":
        """The given rows, with padding columns that no selected row uses trimmed away."""
        index = torch.tensor(rows, dtype=torch.long)
        attention = self.attention_mask[index]
        prompt_used = attention[:, : self.prompt_length].any(dim=0).nonzero()
        start = int(prompt_used[0]) if prompt_used.numel() else self.prompt_length
        response_used = attention[:, self.prompt_length:].any(dim=0).nonzero()
        width = int(response_used[-1]) + 1 if response_used.numel() else 0
        stop = self.prompt_length + width

        def take(value):
            if isinstance(value, torch.Tensor):
                if value.dim() == 2 and value.shape[1] == self.input_ids.shape[1]:
                    return value[index, start:stop]
                if value.dim() in (2, 3):
                    return value[index, :width]
                return value[index]
            if isinstance(value, list):
                return [value[i] for i in rows]
            return value

        changes = {f.name: take(getattr(self, f.name)) for f in fields(self) if f.name not in ("prompt_length", "extra")}
        changes["extra"] = {k: [v[i] for i in rows] for k, v in self.extra.items()}
        return replace(self, prompt_length=self.prompt_length - start, **changes)


def collate_trajectories(trajectories: list[Trajectory], rewards: list[float], pad_id: int, *,
                         train_observations: bool = False) -> RolloutBatch:
    """Pad trajectories into a ``RolloutBatch``. ``train_observations``: every response token gets mask 1, the
    observations too (``algorithm.mask_observations: false``)."""
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    prompt_width = max(len(t.prompt_ids) for t in trajectories)
    response_width = max(max(len(t.response_ids) for t in trajectories), 1)
    rows = len(trajectories)
    input_ids = torch.full((rows, prompt_width + response_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_mask = torch.zeros((rows, response_width), dtype=torch.long)
    rollout_logprobs = torch.zeros((rows, response_width), dtype=torch.float32)
    token_versions = torch.full((rows, response_width), -1, dtype=torch.long)
    for row, traj in enumerate(trajectories):
        p, r = len(traj.prompt_ids), len(traj.response_ids)
        input_ids[row, prompt_width - p: prompt_width] = torch.tensor(traj.prompt_ids, dtype=torch.long)
        input_ids[row, prompt_width: prompt_width + r] = torch.tensor(traj.response_ids, dtype=torch.long)
        attention[row, prompt_width - p: prompt_width + r] = 1
        response_mask[row, :r] = 1 if train_observations else torch.tensor(traj.response_mask, dtype=torch.long)
        rollout_logprobs[row, :r] = torch.tensor(traj.rollout_logprobs, dtype=torch.float32)
        if traj.token_versions:
            token_versions[row, :r] = torch.tensor(traj.token_versions, dtype=torch.long)
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=response_mask,
        rollout_logprobs=rollout_logprobs, token_versions=token_versions,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        uids=[t.uid for t in trajectories], prompt_length=prompt_width,
        extra={"data_source": [t.data_source for t in trajectories],
               "num_searches": [t.num_searches for t in trajectories]},
    )


def prompt_units(batch: RolloutBatch, rows: list[int]) -> list[list[int]]:
    """``rows`` grouped by identical prompt tokens (a GRPO group's rows), each group in row order, groups in order of
    their first row: what the shared-prompt layout computes once, and what its passes and mini-batches keep whole."""
    p = batch.prompt_length
    real = batch.attention_mask[:, :p].bool()
    units: dict[tuple[int, ...], list[int]] = {}
    for row in rows:
        units.setdefault(tuple(batch.input_ids[row, :p][real[row]].tolist()), []).append(row)
    return list(units.values())


def split_by_token_budget(batch: RolloutBatch, max_tokens: int | None) -> list[list[int]]:
    """Row groups of the whole batch whose real tokens fit ``max_tokens`` each (see ``pack_rows_by_budget``)."""
    return pack_rows_by_budget(list(range(len(batch))), batch.token_counts().tolist(), max_tokens)


# The padded layout's cost model, in units of one token's forward at short widths, fitted on the demo's tiny Qwen2
# with one CPU thread (forward, and forward + backward, of 1-64 rows at widths 70 and 200; docs/benchmarks.md, "The
# embedded default beside TRL"): a pass costs about rows x width x (1 + width / 160) plus 170 for the pass itself.
PADDED_WIDTH_SCALE = 160
PADDED_PASS_COST = 170


def padded_pass_cost(rows: int, width: int) -> float:
    """What a pass over ``rows`` rows padded to ``width`` tokens costs in the model above."""
    return rows * width * (1 + width / PADDED_WIDTH_SCALE) + PADDED_PASS_COST


def cut_padded_rows(rows: list[int], tokens: list[int], max_tokens: int | None) -> list[list[int]]:
    """``rows`` in passes of similar length for the padded layout, where every row of a pass costs as much as
    its longest: rows sorted longest first and cut into runs that minimise the summed ``padded_pass_cost``
    (a short row among long ones costs a long one's work, and each pass its fixed cost), each run's padded
    tokens within ``max_tokens`` (a row longer than that goes alone). On a batch where a third of the
    trajectories search and the rest answer at once, this halves the padded tokens for one pass more. Used for
    forward-only passes (old, reference and value scores); a training pass also pays its collectives."""
    if not rows:
        return []
    order = sorted(rows, key=lambda r: (-tokens[r], r))
    lengths = [tokens[r] for r in order]
    best = [0.0] + [float("inf")] * len(order)  # best[j]: the cheapest cut of the first j rows
    cut_at = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j - 1, -1, -1):  # the run order[i:j], padded to its first (longest) row
            if max_tokens is not None and j - i > 1 and (j - i) * lengths[i] > max_tokens:
                break
            cost = best[i] + padded_pass_cost(j - i, lengths[i])
            if cost < best[j]:
                best[j], cut_at[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(sorted(order[cut_at[j]:j]))
        j = cut_at[j]
    return groups[::-1]


def pack_rows_by_budget(rows: list[int], tokens: list[int], max_tokens: int | None) -> list[list[int]]:
    """``rows`` in groups whose ``tokens`` fit ``max_tokens`` each (a row longer than the budget goes alone).

    Rows are packed longest first (first-fit decreasing), so groups are few and similar in length;
    ``None`` keeps all rows together.
    """
    if max_tokens is None:
        return [sorted(rows)] if rows else []
    groups: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(rows, key=lambda i: (-tokens[i], i)):
        for g, load in enumerate(loads):
            if load + tokens[row] <= max_tokens:
                groups[g].append(row)
                loads[g] += tokens[row]
                break
        else:
            groups.append([row])
            loads.append(tokens[row])
    return [sorted(g) for g in groups]
