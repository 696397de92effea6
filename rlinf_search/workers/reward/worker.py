"""A rank of the RewardGroup: scores trajectories with the configured reward."""

from __future__ import annotations

from rlinf_search.data.io_struct import RewardScore, Trajectory
from rlinf_search.rewards import compute_score
from rlinf_search.scheduler import Worker
from rlinf_search.workers.reward.config import RewardConfig


class RewardWorker(Worker):
    def __init__(self, config: RewardConfig):
        self.config = config

    def score(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        """One score per trajectory, both of ``graded_text``: what the model wrote, never an
        observation's text."""
        own = {} if self.config.score_settings is None else {"settings": self.config.score_settings}
        return [RewardScore(reward=self.config.scale * compute_score(self.config.score, traj.graded_text,
                                                                     traj.golden_answers, **own),
                            em=compute_score("em", traj.graded_text, traj.golden_answers))
                for traj in trajectories]
