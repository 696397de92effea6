"""Masked reductions shared by every estimator and loss, and the loss aggregation modes.

All tensors are batch-first ``[B, T]`` over response tokens; ``mask`` is the response mask
(1 = model token, 0 = observation or padding). Nothing here ever reads a value where mask is 0,
so garbage (even NaN) on observation tokens cannot leak into a result.

Aggregating across micro-batches and ranks (the classic bug): a mini-batch is usually split into
micro-batches (gradient accumulation) and across data-parallel ranks. Dividing each micro-batch's
token sum by its own token count weights a token of a short micro-batch more than one of a long
micro-batch. To get the token-mean of the whole mini-batch, the caller:

1. counts the model tokens of the whole mini-batch before the micro-batch loop
   (``mask.sum()`` over every micro-batch, then ``all_reduce(SUM)`` over the data-parallel group);
2. passes that number as ``global_token_count`` to every micro-batch's ``aggregate_loss`` call and
   calls ``backward`` on each result as is (no further division by the number of micro-batches);
3. multiplies by the data-parallel world size when the backend *averages* gradients over ranks
   (DDP and FSDP do), since the global count already divides by every rank's tokens.

The seq-mean modes work the same way with ``num_sequences`` (trajectories in the whole mini-batch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlinf_search.registry import Registry

WHITEN_EPS = 1e-8
"""Added to the variance before the square root when whitening (verl's ``masked_whiten``)."""


def zero_outside(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is 1, else 0 (``where``, not a product: NaN * 0 would stay NaN)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1; values under mask 0 are ignored, even NaN or inf."""
    kept = zero_outside(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over mask-1 entries (over everything, or along ``dim``); 0 where none is kept."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over mask-1 entries; 0 elsewhere.

    Matches verl's ``masked_whiten`` (Bessel-corrected masked variance). With a single kept entry
    the variance is taken as 0 (verl raises instead), which whitens that entry to 0.
    """
    mean = masked_mean(values, mask)
    count = mask.sum().to(values.dtype)
    centered = zero_outside(values - mean, mask)
    var = centered.pow(2).sum() / (count - 1).clamp(min=1)
    return centered * torch.rsqrt(var + WHITEN_EPS)


def _count(given: float | int | torch.Tensor | None, fallback: torch.Tensor, what: str) -> torch.Tensor:
    count = fallback if given is None else torch.as_tensor(given, dtype=fallback.dtype, device=fallback.device)
    if given is not None and float(count) <= 0:
        raise ValueError(f"{what} must be positive, got {given}")
    return count.clamp(min=1)


def _num_sequences(mask: torch.Tensor, num_sequences) -> torch.Tensor:
    # A trajectory counts when it has at least one model token; pass num_sequences to aggregate
    # over more than this call's rows (micro-batches, ranks).
    local = (mask.sum(dim=-1) > 0).sum().to(torch.float32)
    return _count(num_sequences, local, "num_sequences")


def token_mean(token_losses, mask, *, global_token_count=None, num_sequences=None, norm_constant=None):
    """Sum over every model token / number of model tokens (``global_token_count`` when given)."""
    count = _count(global_token_count, mask.sum().to(token_losses.dtype), "global_token_count")
    return masked_sum(token_losses, mask) / count


def seq_mean_token_sum(token_losses, mask, *, global_token_count=None, num_sequences=None, norm_constant=None):
    """Mean over trajectories of each trajectory's token sum."""
    per_seq = masked_sum(token_losses, mask, dim=-1)
    return per_seq.sum() / _num_sequences(mask, num_sequences).to(token_losses.dtype)


def seq_mean_token_mean(token_losses, mask, *, global_token_count=None, num_sequences=None, norm_constant=None):
    """Mean over trajectories of each trajectory's token mean."""
    per_seq = masked_mean(token_losses, mask, dim=-1)
    return per_seq.sum() / _num_sequences(mask, num_sequences).to(token_losses.dtype)


def seq_mean_token_sum_norm(token_losses, mask, *, global_token_count=None, num_sequences=None, norm_constant=None):
    """Sum over every model token / (number of trajectories * ``norm_constant``), Dr. GRPO's reduction.

    ``norm_constant`` is required: a fixed length such as the response budget. Defaulting to the
    padded width would change from micro-batch to micro-batch, which is the bug this mode avoids.
    """
    if norm_constant is None or norm_constant <= 0:
        raise ValueError(f"seq-mean-token-sum-norm needs a positive norm_constant (e.g. the response budget), "
                         f"got {norm_constant}")
    denom = _num_sequences(mask, num_sequences).to(token_losses.dtype) * norm_constant
    return masked_sum(token_losses, mask) / denom


LossAggregation = Callable[..., torch.Tensor]
"""``fn(token_losses [B, T], mask [B, T], *, global_token_count, num_sequences, norm_constant) -> scalar``."""

LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation")
"""Aggregation modes by the name ``algorithm.loss_agg_func`` uses (or a dotted path to one)."""
LOSS_AGGREGATIONS.register("token-mean", token_mean)
LOSS_AGGREGATIONS.register("seq-mean-token-sum", seq_mean_token_sum)
LOSS_AGGREGATIONS.register("seq-mean-token-mean", seq_mean_token_mean)
LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm", seq_mean_token_sum_norm)


def aggregate_loss(
    token_losses: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_token_count: float | int | torch.Tensor | None = None,
    num_sequences: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``[B, T]`` to the scalar to backpropagate, over mask-1 tokens only.

    Args:
        token_losses: loss per token, ``[B, T]``.
        mask: response mask, ``[B, T]`` (1 = model token).
        mode: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``,
            a registered name or a dotted path.
        global_token_count: model tokens in the whole mini-batch (all micro-batches, all ranks); see the
            module docstring. Defaults to this call's own count. Used by ``token-mean``.
        num_sequences: trajectories in the whole mini-batch; defaults to this call's rows that hold a
            model token. Used by the ``seq-mean-*`` modes.
        norm_constant: the constant length of ``seq-mean-token-sum-norm``.
    """
    if token_losses.shape != mask.shape:
        raise ValueError(f"token_losses {tuple(token_losses.shape)} and mask {tuple(mask.shape)} differ in shape")
    return LOSS_AGGREGATIONS.resolve(mode)(token_losses, mask, global_token_count=global_token_count, num_sequences=num_sequences,
              norm_constant=norm_constant)
