"""Train/inference mismatch correction: per-token importance weights between the rollout engine and the trainer.

The engine (vLLM, SGLang) and the trainer compute slightly different log-probs for the same tokens
(kernels, precision), so the samples are mildly off-policy for the policy being trained. The
correction weighs each token's loss by rho = exp(old - roll), where ``old`` is the trainer's
recomputed log-prob and ``roll`` the engine's:

- ``tis`` (truncated importance sampling): w = min(rho, cap), cap = 2 by default.
- ``mask`` (token-level MIS): w = 1 where low <= rho <= high, else 0 (the token is dropped from the loss).
- ``decoupled`` (AReaL's decoupled PPO objective): w = rho, untruncated. With the rollout ahead of the update
  ``old`` is the proximal policy (the policy at the start of the update, which the PPO clip is taken against) and
  ``roll`` the behaviour policy that sampled the token, so the clip bounds the update and the weight alone
  corrects the sampling; ``tis`` is this with the weight truncated.
- ``m2po`` (the second-moment trust region of M2PO, Zheng et al. 2025): the ``decoupled`` weight, but the tokens
  with the largest (log rho)^2 are dropped until the mean of (log rho)^2 over the kept ones is at most
  ``M2_THRESHOLD``. It bounds how far the sampled policy may be from the trained one in the batch as a whole, not
  per token, so a stale batch trains on the tokens where the two still agree.

The weights are constants (no gradient): multiply the token losses by them before aggregating.
Off by default: a reported pitfall is Search-R1 on a 3B model collapsing early with TIS on.
Model tokens whose rollout log-prob is NaN (re-tokenized ids the engine never scored, see
``Trajectory.rollout_logprobs``) cannot be corrected and get w = 1; ``missing_fraction`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf_search.algorithms.aggregation import masked_mean, zero_outside
from rlinf_search.registry import Registry

LOG_RATIO_CLAMP = 20.0
"""old - roll is clamped to +-20 before exp, so rho is finite."""


@dataclass
class ImportanceWeights:
    """Per-token weights and what to log about them; fractions are over model tokens."""

    weights: torch.Tensor
    """``[B, T]``, detached: multiply the token losses by these; 0 on mask-0 tokens."""
    truncated_fraction: torch.Tensor
    """Share of model tokens whose rho exceeded the cap (``tis``); 0 for ``mask``."""
    masked_fraction: torch.Tensor
    """Share of model tokens dropped for rho outside [low, high] (``mask``); 0 for ``tis``."""
    mean_weight: torch.Tensor
    """Mean weight over model tokens."""
    missing_fraction: torch.Tensor
    """Share of model tokens without a rollout log-prob (NaN), left at weight 1."""

    def metrics(self, prefix: str = "mismatch/") -> dict[str, float]:
        """The scalar metrics as floats, for a logger."""
        names = ("truncated_fraction", "masked_fraction", "mean_weight", "missing_fraction")
        return {f"{prefix}{name}": float(getattr(self, name)) for name in names}


def _rho(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho with NaN replaced by 1, where the rollout log-prob was NaN)."""
    missing = torch.isnan(rollout_logprob)
    log_rho = (old_logprob.detach() - rollout_logprob.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(missing, torch.ones_like(log_rho), torch.exp(log_rho)), missing


def importance_ratio(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` rho = exp(old - roll) per token, before any truncation or masking; 1 where the rollout log-prob is
    NaN (detached)."""
    return _rho(old_logprob, rollout_logprob)[0]


def _result(weights, mask, missing, *, truncated, dropped) -> ImportanceWeights:
    weights = zero_outside(weights, mask)
    as_float = weights.dtype
    return ImportanceWeights(
        weights=weights,
        truncated_fraction=masked_mean(truncated.to(as_float), mask),
        masked_fraction=masked_mean(dropped.to(as_float), mask),
        mean_weight=masked_mean(weights, mask),
        missing_fraction=masked_mean(missing.to(as_float), mask),
    )


@torch.no_grad()
def truncated_is_weights(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    cap: float = 2.0,
) -> ImportanceWeights:
    """TIS: w = min(exp(old - roll), cap) per model token, ``[B, T]`` each."""
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    rho, missing = _rho(old_logprob, rollout_logprob)
    truncated = rho > cap
    return _result(rho.clamp(max=cap), response_mask.bool(), missing, truncated=truncated,
                   dropped=torch.zeros_like(truncated))


@torch.no_grad()
def masked_is_weights(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    low: float = 0.5,
    high: float = 2.0,
) -> ImportanceWeights:
    """Masking: w = 1 where low <= exp(old - roll) <= high, else 0. The defaults are 1/2 and 2."""
    if not 0 <= low < 1 < high:
        raise ValueError(f"the mask band needs 0 <= low < 1 < high, got low={low}, high={high}")
    rho, missing = _rho(old_logprob, rollout_logprob)
    dropped = (rho < low) | (rho > high)
    return _result((~dropped).to(rho.dtype), response_mask.bool(), missing, truncated=torch.zeros_like(dropped),
                   dropped=dropped)


@torch.no_grad()
def decoupled_weights(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, *,
                      response_mask: torch.Tensor) -> ImportanceWeights:
    """AReaL's decoupled objective: w = exp(prox - behav) per model token, untruncated (``old_logprob``: the
    proximal policy's, ``rollout_logprob``: the behaviour policy's)."""
    rho, missing = _rho(old_logprob, rollout_logprob)
    none = torch.zeros_like(missing)
    return _result(rho, response_mask.bool(), missing, truncated=none, dropped=none)


M2_THRESHOLD = 0.04
"""``m2po``'s bound on the kept tokens' mean (log rho)^2, the value M2PO reports stable at hundreds of versions of
staleness."""


@torch.no_grad()
def second_moment_weights(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, *,
                          response_mask: torch.Tensor, threshold: float = M2_THRESHOLD) -> ImportanceWeights:
    """``m2po``: w = exp(old - roll) on the kept tokens, 0 on the dropped ones. The tokens are dropped in order of
    (old - roll)^2, largest first, until the rest's mean is at most ``threshold`` (taken over this call's tokens:
    a micro-batch's). Tokens without a rollout log-prob keep weight 1 and do not count toward the moment."""
    if threshold <= 0:
        raise ValueError(f"the second-moment threshold must be > 0, got {threshold}")
    rho, missing = _rho(old_logprob, rollout_logprob)
    mask = response_mask.bool()
    scored = mask & ~missing
    squared = torch.log(rho).square()
    values, order = squared[scored].sort()
    # The running mean of the ascending squares never falls, so the tokens kept are the smallest n whose mean
    # stays within the threshold; the cut is by rank, so equal squares on both sides of it are split.
    means = values.cumsum(0) / torch.arange(1, len(values) + 1, dtype=values.dtype)
    kept = int((means <= threshold).sum())
    dropped_scored = torch.zeros_like(values, dtype=torch.bool)
    dropped_scored[order[kept:]] = True
    dropped = torch.zeros_like(scored)
    dropped[scored] = dropped_scored
    weights = torch.where(dropped, torch.zeros_like(rho), rho)
    return _result(weights, mask, missing, truncated=torch.zeros_like(dropped), dropped=dropped)


MismatchCorrection = Callable[..., ImportanceWeights]
"""``fn(old_logprob, rollout_logprob, *, response_mask, cap, low) -> ImportanceWeights``: ``cap`` and ``low``
are ``algorithm.mismatch_cap`` and ``algorithm.mismatch_low``; a correction reads the ones it needs."""

MISMATCH_CORRECTIONS: Registry[MismatchCorrection] = Registry("mismatch correction")
"""Mismatch corrections by the name ``algorithm.mismatch_correction`` uses (or a dotted path to one)."""


@MISMATCH_CORRECTIONS.register("tis")
def _truncated(old_logprob, rollout_logprob, *, response_mask, cap, low) -> ImportanceWeights:
    return truncated_is_weights(old_logprob, rollout_logprob, response_mask=response_mask, cap=cap)


@MISMATCH_CORRECTIONS.register("mask")
def _masked(old_logprob, rollout_logprob, *, response_mask, cap, low) -> ImportanceWeights:
    return masked_is_weights(old_logprob, rollout_logprob, response_mask=response_mask, low=low, high=cap)


@MISMATCH_CORRECTIONS.register("decoupled")
def _decoupled(old_logprob, rollout_logprob, *, response_mask, cap, low) -> ImportanceWeights:
    return decoupled_weights(old_logprob, rollout_logprob, response_mask=response_mask)


@MISMATCH_CORRECTIONS.register("m2po")
def _second_moment(old_logprob, rollout_logprob, *, response_mask, cap, low) -> ImportanceWeights:
    return second_moment_weights(old_logprob, rollout_logprob, response_mask=response_mask)
