"""The passes that make rolled-out groups trainable: reward, log-probs, values, advantages.

Each is built once from its own part of the run's config (or is None when the run has no use for it) and is
then called on every batch of groups the step hands on: the whole step's groups in ``sync`` and ``overlap``,
a mini-batch of them at a time in ``stream``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf_search.algorithms import compute_advantages
from rlinf_search.config import RunConfig
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.data.io_struct import RewardScore, Trajectory
from rlinf_search.runners.group_calls import Groups, score_shards
from rlinf_search.scheduler import WorkerGroup
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.worker import CriticWorker
from rlinf_search.workers.inference.plan import LogprobPlan
from rlinf_search.workers.inference.worker import InferenceWorker


class RewardStage:
    """Rewards from the RewardGroup, each rank scoring its own contiguous share of the trajectories."""

    def __init__(self, reward: WorkerGroup):
        self.group = reward

    def __call__(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        """The rewards of ``trajectories``, in their order."""
        return score_shards(self.group, trajectories)


class LogprobStage:
    """Old and reference log-probs where the run's ``LogprobPlan`` puts them; the engine's own log-probs are
    the old ones when the plan does not recompute them."""

    def __init__(self, plan: LogprobPlan, groups: Groups):
        self.plan = plan
        self.group, self.method = None, None
        if plan.scorer == "inference":
            self.group, self.method = groups.inference, InferenceWorker.compute_logprobs
        elif plan.scorer == "actor":
            self.group, self.method = groups.actor, ActorWorker.compute_logprobs

    def __call__(self, batch: RolloutBatch) -> None:
        recompute, kl = self.plan.recompute, self.plan.kl
        if self.group is not None:
            results = self.group.call(self.method, batch, old=recompute, ref=kl).wait()  # each rank: its rows
            shape = tuple(batch.response_mask.shape)
            batch.old_logprobs = place_rows(shape, [(r.rows, r.old) for r in results]) if recompute else None
            batch.ref_logprobs = place_rows(shape, [(r.rows, r.ref) for r in results]) if kl else None
        if not recompute:
            batch.old_logprobs = batch.rollout_logprobs.clone()


class ValueStage:
    """The critic's values before this step's update (``critic.use_critic_model``; GAE only)."""

    def __init__(self, critic: WorkerGroup):
        self.group = critic

    @classmethod
    def build(cls, config: RunConfig, groups: Groups) -> ValueStage | None:
        return cls(groups.critic) if config.critic is not None else None

    def __call__(self, batch: RolloutBatch) -> None:
        """``batch.values``: ``[B, T]``, computed on every model, observation and padding position; GAE reads
        them on model tokens only (see ``algorithms.advantages.gae``). Every critic rank gets the whole batch
        and returns its token-balanced share of the rows."""
        shares = self.group.call(CriticWorker.compute_values, batch).wait()
        batch.values = place_rows(tuple(batch.response_mask.shape), shares)


class AdvantageStage:
    """Advantages (and, with values, returns) by the run's estimator (``algorithm.adv_type``).

    GAE runs over model tokens only: an observation token is the environment's move, not a time step, so a
    turn's last token bootstraps from the value of the next turn's first token, whose state already contains
    the observation. The outcome reward sits on the last model token; KL stays a loss term, not a reward.
    """

    def __init__(self, adv_type: str, *, gamma: float, lam: float, normalize: bool, settings: Any = None):
        self.adv_type, self.gamma, self.lam, self.normalize = adv_type, gamma, lam, normalize
        self.settings = settings  # the estimator's own (algorithm.adv_settings), validated at start-up

    @classmethod
    def build(cls, config: RunConfig) -> AdvantageStage:
        return cls(config.adv_type, gamma=config.gamma, lam=config.lam, normalize=config.normalize_advantages,
                   settings=config.adv_settings)

    def __call__(self, batch: RolloutBatch) -> None:
        values: torch.Tensor | None = batch.values
        out = compute_advantages(self.adv_type, rewards=batch.rewards, response_mask=batch.response_mask,
                                 uids=batch.uids, values=values, gamma=self.gamma, lam=self.lam,
                                 normalize_advantages=self.normalize, settings=self.settings)
        batch.advantages, batch.returns = out.advantages, out.returns
