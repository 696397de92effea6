"""How stale each trained token is, and what the correction did at each staleness.

In an asynchronous run (``runner.pipeline: async``) a token's lag is the number of weight syncs between the policy
that sampled it (``Trajectory.token_versions``) and the policy the step trains from. A trajectory the engines
continued across a swap holds several lags, so everything here is per token:

- ``token_lags``: the lag of every response token (-1 where the version is unknown);
- ``algorithm.max_token_lag``: tokens older than this many versions are dropped from the loss (weight 0) and
  counted, whatever the admission bound let in;
- ``LagStats``: per lag, the importance weight's mean and max, the share of tokens the PPO clip bound, and the
  KL from the behaviour policy to the proximal one; it adds up over the micro-batches of an optimizer step.
"""

from __future__ import annotations

import torch

UNKNOWN = -1
"""The version (and lag) of an observation token, or of a token whose engine did not count versions."""


def token_lags(token_versions: torch.Tensor | None, trained_version: int | None) -> torch.Tensor | None:
    """``[B, T]``: ``trained_version`` minus each token's version; ``UNKNOWN`` where the version is. None when the
    batch carries no versions or no trained version."""
    if token_versions is None or trained_version is None:
        return None
    known = token_versions >= 0
    return torch.where(known, trained_version - token_versions, torch.full_like(token_versions, UNKNOWN))


def too_stale(lags: torch.Tensor | None, response_mask: torch.Tensor, max_lag: int | None) -> torch.Tensor | None:
    """``[B, T]`` bool: the model tokens more than ``max_lag`` versions old (None: no bound, or no lags)."""
    if lags is None or max_lag is None:
        return None
    return response_mask.bool() & (lags > max_lag)


class LagStats:
    """Sums per lag over the micro-batches of one optimizer step; ``metrics`` reads them out."""

    def __init__(self):
        self._sums: dict[int, dict[str, float]] = {}

    @torch.no_grad()
    def add(self, lags: torch.Tensor, response_mask: torch.Tensor, *, rho: torch.Tensor,
            clipped: torch.Tensor | None) -> None:
        """One micro-batch: ``rho`` = exp(proximal - behaviour) per token (1 where the behaviour log-prob is
        unknown), ``clipped``: where the PPO clip bound (None: a loss that does not say)."""
        model = response_mask.bool() & (lags >= 0)
        at = lags[model]
        if at.numel() == 0:
            return
        rho = rho.detach().float()[model]
        # KL(behaviour || proximal) from samples of the behaviour policy, k3 (unbiased, never negative).
        kl = rho - 1.0 - torch.log(rho.clamp(min=1e-30))
        hit = clipped[model].float() if clipped is not None else torch.zeros_like(rho)
        width = int(at.max()) + 1
        largest = torch.zeros(width, device=rho.device).scatter_reduce(0, at, rho, "amax", include_self=False)
        # Every sum of every lag in one tensor, brought to the host once (this runs on each micro-batch).
        table = torch.stack([torch.bincount(at, minlength=width).float(), torch.bincount(at, rho, minlength=width),
                             largest, torch.bincount(at, hit, minlength=width),
                             torch.bincount(at, kl, minlength=width)]).tolist()
        for lag, (tokens, weight, weight_max, clip, kl_sum) in enumerate(zip(*table)):
            if not tokens:
                continue
            sums = self._sums.setdefault(lag, {"tokens": 0.0, "weight": 0.0, "weight_max": 0.0, "clipped": 0.0,
                                               "kl": 0.0})
            sums["tokens"] += tokens
            sums["weight"] += weight
            sums["weight_max"] = max(sums["weight_max"], weight_max)
            sums["clipped"] += clip
            sums["kl"] += kl_sum

    def metrics(self, prefix: str = "actor/") -> dict[str, float]:
        """``<prefix>lag_<n>/is_weight_mean``, ``is_weight_max``, ``clip_fraction``, ``kl_behaviour_proximal`` and
        ``token_share`` (of the optimizer step's model tokens with a known lag) for each lag seen. These are one
        optimizer step's; a training step's metrics average them over its optimizer steps and the actor's ranks,
        unweighted (so ``is_weight_max`` is a mean of each optimizer step's largest weight)."""
        out = {}
        total = max(sum(sums["tokens"] for sums in self._sums.values()), 1.0)
        for lag, sums in sorted(self._sums.items()):
            tokens = max(sums["tokens"], 1.0)
            key = f"{prefix}lag_{lag}/"
            out[key + "token_share"] = sums["tokens"] / total
            out[key + "is_weight_mean"] = sums["weight"] / tokens
            out[key + "is_weight_max"] = sums["weight_max"]
            out[key + "clip_fraction"] = sums["clipped"] / tokens
            out[key + "kl_behaviour_proximal"] = sums["kl"] / tokens
        return out
