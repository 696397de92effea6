"""A rank of the CriticGroup: the value model, its updates and its part of each checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from rlinf_search.checkpoint import CRITIC_SUBDIR
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.scheduler import Worker
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.critic.value_trainer import ValueTrainer
from rlinf_search.workers.offload import CATEGORIES, OffloadConfig, Offloader


class CriticWorker(Worker):
    """Data-parallel value training: every rank gets the whole batch and works on its share of the rows.

    ``offload`` is the actor's (``actor.offload_*``): the critic shares the actor's devices, so it steps
    aside when the actor does. ``resume_from`` is a checkpoint folder; the critic's weights and
    optimizer come from its ``critic/``.
    """

    def __init__(self, config: CriticConfig, offload: OffloadConfig, resume_from: str | None = None):
        if self.world_size > 1:
            self.init_process_group()
        if resume_from:
            self.trainer = ValueTrainer.from_checkpoint(config, Path(resume_from) / CRITIC_SUBDIR)
        else:
            self.trainer = ValueTrainer(config)
        self.offloader = Offloader.for_modules(offload, [self.trainer.model], self.trainer.optimizer,
                                               device=self.trainer.device)
        self.offloader.offload()  # the first rollout comes before any update

    def compute_values(self, batch: RolloutBatch) -> tuple[list[int], torch.Tensor]:
        """This rank's share of ``batch`` (the whole batch): its rows and their values under the current
        weights (before this step's update)."""
        self.offloader.onload()
        return self.trainer.compute_values(batch)

    def train(self, batch: RolloutBatch) -> dict[str, float]:
        self.offloader.onload()
        metrics = self.trainer.train_on_batch(batch)
        self.offloader.offload()  # a checkpoint brings back what it reads
        return metrics

    def save(self, folder: str) -> None:
        """The critic into ``folder`` (the ``critic/`` of a checkpoint being staged); every rank joins the
        gather, rank 0 writes."""
        with self.offloader.on_device(*CATEGORIES):
            self.trainer.save(Path(folder))
