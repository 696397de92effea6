"""A policy loss of your own with a key of its own, named in the config by dotted path: one file, no package edit.

    algorithm:
      policy_loss: examples.plugins.cispo_loss:cispo
      policy_loss_settings: {truncation: 3.0}

CISPO (MiniMax-M1, 2025): every token keeps its gradient, weighted by its importance ratio with the ratio cut at
``truncation`` and no gradient through the weight, instead of PPO's clip, which drops the gradient of tokens
outside the band. ``truncation`` is this loss's own key: start-up validates it with ``CispoSettings`` (a value
<= 1 or an unknown key stops the run in one line naming ``algorithm.policy_loss_settings.<key>``), and the actor
hands the validated settings to every call (docs/architecture.md, "Extension points"; ``tests/test_loss_plugin.py``).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field

from rlinf_search.algorithms.aggregation import masked_mean, zero_outside
from rlinf_search.algorithms.losses import LOG_RATIO_CLAMP, PolicyLossOutput
from rlinf_search.plugin_settings import with_settings


class CispoSettings(BaseModel):
    """``algorithm.policy_loss_settings`` of ``cispo``."""

    truncation: float = Field(4.0, gt=1)
    """The largest weight a token's ratio gives it (the ratio is not cut from below)."""


@with_settings(CispoSettings)
def cispo(logprob, old_logprob, advantages, *, response_mask, settings: CispoSettings,
          **_clip_keys) -> PolicyLossOutput:
    """-sg(min(ratio, truncation)) * A * logprob per model token; ``clip_fraction`` reports the share truncated."""
    mask = response_mask.bool()
    log_ratio = (logprob - old_logprob.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.detach().clamp(max=settings.truncation)
    token_losses = zero_outside(-weight * advantages.detach() * logprob, mask)
    with torch.no_grad():
        truncated = (ratio > settings.truncation) & mask
        return PolicyLossOutput(
            token_losses=token_losses, clip_fraction=masked_mean(truncated.to(ratio.dtype), mask),
            dual_clip_fraction=ratio.new_zeros(()), approx_kl=masked_mean(-log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
            ratio_max=zero_outside(ratio, mask).max() if mask.any() else ratio.new_zeros(()), clipped=truncated)
