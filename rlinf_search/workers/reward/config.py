"""``RewardConfig``: the ``reward`` section, all a RewardWorker is handed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any



@dataclass(frozen=True)
class RewardConfig:
    """What the RewardGroup grades trajectories with."""

    score: str = "em"
    """``reward.score``: a registered reward (``em``, ``subem``, ``f1``, ``format_em``) or a dotted path
    to ``fn(solution_str, golden_answers, **kwargs) -> float``."""
    scale: float = 1.0
    """``reward.reward_scale``: multiplier of the score."""
    score_settings: Any = None
    """``reward.score_settings`` validated by the settings model the score declares (``@with_settings``), passed
    to it as ``settings=``; None for a score that declares none (it is then called without)."""
