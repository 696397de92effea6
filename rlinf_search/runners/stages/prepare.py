"""``BatchPreparation``: a batch of finished groups made ready for the update, by the passes in their order.

The teacher is asked first so that it answers while rewards and log-probs are computed; its term is applied
last, once advantages exist. The same preparation serves the whole step (``sync``, ``overlap``) and each
mini-batch of groups (``stream``): whole groups are what every pass needs (GRPO's baselines are per group).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_search.data.batch import RolloutBatch, collate_trajectories
from rlinf_search.data.io_struct import FinishedGroup, QARecord, RewardScore
from rlinf_search.distill.scorer import TeacherScorer
from rlinf_search.runners.stages.passes import AdvantageStage, LogprobStage, RewardStage, ValueStage
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.workers.critic.value_trainer import batch_value_metrics


@dataclass
class PreparedBatch:
    """Groups ready for the update, with what the passes found on the way."""

    groups: list[FinishedGroup]
    """The groups, in the order their rows appear in ``batch``."""
    batch: RolloutBatch
    """Their trajectories collated, with rewards, old (and reference) log-probs and advantages."""
    scores: list[RewardScore]
    """The reward of each row of ``batch``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The teacher's (``distill/*``) and the critic's (``critic/*`` value statistics) on this batch."""


class BatchPreparation:
    """Teacher (optional), reward, log-probs, values (optional) and advantages, over one batch of groups."""

    def __init__(self, *, reward: RewardStage, logprobs: LogprobStage, advantages: AdvantageStage,
                 values: ValueStage | None = None, teacher: TeacherScorer | None = None,
                 train_observations: bool = False):
        self.reward, self.logprobs, self.advantages = reward, logprobs, advantages
        self.values, self.teacher = values, teacher
        self.train_observations = train_observations
        """``algorithm.mask_observations: false``: observation tokens are trained too."""

    def __call__(self, records: list[QARecord], groups: list[FinishedGroup], timer: StepTimer, *,
                 ends_step: bool, trained_version: int | None = None) -> PreparedBatch:
        """``records``: the step's prompts (group ``g`` answers ``records[g.index]``); ``trained_version``: the
        policy version the update starts from (the batch's token lags count from it); ``timer`` gets the phases
        ``reward``, ``inference``, ``advantages`` (with a critic, mostly its forward pass) and ``teacher`` (only
        the wait for answers still in flight); ``ends_step``: the step's last batch (the teacher's failure
        window counts steps)."""
        trajectories = [t for g in groups for t in g.trajectories]
        teacher = None
        if self.teacher is not None:
            teacher = self.teacher.start([records[g.index] for g in groups], trajectories)
        with timer.phase("reward"):
            scores = self.reward(trajectories)
        batch = collate_trajectories(trajectories, [s.reward for s in scores], pad_id=0,
                                     train_observations=self.train_observations)
        batch.trained_version = trained_version
        with timer.phase("inference"):
            self.logprobs(batch)
        with timer.phase("advantages"):
            if self.values is not None:
                self.values(batch)
            self.advantages(batch)
        metrics = batch_value_metrics(batch) if self.values is not None else {}
        if teacher is not None:
            with timer.phase("teacher"):
                metrics.update(self.teacher.apply(batch, teacher, ends_step=ends_step))
        return PreparedBatch(groups=groups, batch=batch, scores=scores, metrics=metrics)
