"""The stages of a training step, each built once from its own part of the run's config or left out.

``SearchR1Runner.train_step`` is a short recipe over them::

    rollout source -> [teacher, reward, log-probs, values, advantages] -> update -> weight sync

The rollout source hands on finished GRPO groups in batches (``FinishedGroup``): the whole step at once in
``sync`` and ``overlap``, a mini-batch of groups at a time off the run's channel in ``stream`` and ``async``. Everything after
it sees only such batches, so every pipeline shares every pass. Who computes the old and reference
log-probs, and which groups receive the weights, is the run's ``LogprobPlan`` (``config.logprobs``), decided
once at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_search.config import RunConfig
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.distill.scorer import open_teacher
from rlinf_search.runners.group_calls import Groups
from rlinf_search.runners.rank_restarts import RankRestarts
from rlinf_search.runners.stages.passes import AdvantageStage, LogprobStage, RewardStage, ValueStage
from rlinf_search.runners.stages.prepare import BatchPreparation, PreparedBatch
from rlinf_search.runners.stages.async_rollout import AsyncRollout
from rlinf_search.runners.stages.rollout_source import (
    CollocatedRollout,
    StepRollout,
    StreamedRollout,
    engine_rollout,
)
from rlinf_search.runners.stages.update import Trained, UpdateStage, WeightSyncStage
from rlinf_search.scheduler import WeightSync

__all__ = ["AdvantageStage", "AsyncRollout", "BatchPreparation", "CollocatedRollout", "LogprobStage",
           "PreparedBatch", "RewardStage", "StepRollout", "StepStages", "StreamedRollout", "Trained", "UpdateStage",
           "ValueStage", "WeightSyncStage", "build_stages", "engine_rollout"]


@dataclass
class StepStages:
    """A run's stages, in the order a step runs them."""

    source: CollocatedRollout
    """Where the step's groups come from (``runner.pipeline``): a ``CollocatedRollout`` or one of its kin."""
    prepare: BatchPreparation
    """Teacher (``algorithm.distill``), reward, log-probs (``config.logprobs``), values (``critic``), advantages."""
    update: UpdateStage
    """The actor's (and critic's) update: the whole step, or each mini-batch as it is prepared (``stream``)."""
    weights: WeightSyncStage
    """The weights to ``config.logprobs.weight_receivers``: after the update, or held back (``overlap``)."""

    def close(self) -> None:
        self.source.close()
        if self.prepare.teacher is not None:
            self.prepare.teacher.close()


def build_stages(config: RunConfig, groups: Groups, prompts: PromptStream, weight_sync: WeightSync, *,
                 first_step: int, last_step: int, restored: list[list[Trajectory]] | None = None,
                 restarts: RankRestarts | None = None) -> StepStages:
    """The run's stages; ``prompts`` already at the run's data position; ``first_step``/``last_step``: the next
    step to run and the last; ``restored``: the rollouts a checkpoint kept for later steps (``async``, ``overlap``);
    ``restarts``: lost rollout ranks started again."""
    pipeline = config.runner.pipeline
    weights = WeightSyncStage(weight_sync, deferred=pipeline.ahead and not pipeline.partial_rollout,
                              background=pipeline.ahead and pipeline.partial_rollout)
    minibatch_groups = config.rollout_batch_size // config.actor.n_minibatches
    if pipeline.ahead:
        source = AsyncRollout(groups, prompts, config.group_size, settings=pipeline, weights=weights,
                              groups_per_batch=minibatch_groups if pipeline.per_minibatch else config.rollout_batch_size,
                              first_step=first_step, last_step=last_step, seed=config.seed, restored=restored,
                              restarts=restarts)
    elif pipeline.name == "stream":
        source = StreamedRollout(groups, prompts, config.group_size, groups_per_batch=minibatch_groups,
                                 restarts=restarts)
    else:
        # An engine on the actor's devices steps aside while the actor works (a no-op on CPU).
        shared = set(groups.engine_group.placement.devices) & set(groups.actor.placement.devices)
        source = CollocatedRollout(groups, prompts, config.group_size, offload=bool(shared), restarts=restarts)
    teacher = open_teacher(config.distill, student_model=config.rollout.model_path) if config.distill else None
    prepare = BatchPreparation(reward=RewardStage(groups.reward), logprobs=LogprobStage(config.logprobs, groups),
                               values=ValueStage.build(config, groups), advantages=AdvantageStage.build(config),
                               teacher=teacher, train_observations=not config.mask_observations)
    return StepStages(source=source, prepare=prepare, update=UpdateStage.build(config, groups), weights=weights)
