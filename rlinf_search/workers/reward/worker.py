"""A rank of the RewardGroup: scores trajectories with the configured reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlinf_search.config import RunConfig
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.rewards import compute_score
from rlinf_search.scheduler import Worker

if TYPE_CHECKING:
    from rlinf_search.runners.eval_config import EvalConfig


class RewardWorker(Worker):
    def __init__(self, config: RunConfig | EvalConfig):  # an eval reads the same fields
        self.score_name = config.reward_score
        self.scale = config.reward_scale

    def score(self, trajectories: list[Trajectory]) -> list[dict[str, float]]:
        """Per trajectory: ``reward`` (the configured score, scaled) and ``em`` (always, for metrics), both
        of ``graded_text``: what the model wrote, never an observation's text."""
        out = []
        for traj in trajectories:
            reward = self.scale * compute_score(self.score_name, traj.graded_text, traj.golden_answers)
            em = compute_score("em", traj.graded_text, traj.golden_answers)
            out.append({"reward": reward, "em": em})
        return out
