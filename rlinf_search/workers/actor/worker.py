"""A rank of the ActorGroup: the policy trainer, the frozen reference model, checkpoints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from rlinf_search.config import RunConfig
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.runners.checkpoint import HF_SUBDIR, RunnerState, load_checkpoint, save_checkpoint
from rlinf_search.scheduler import Worker
from rlinf_search.workers.actor.backends import build_trainer
from rlinf_search.workers.actor.logprobs import ForwardLogprobs, batched_response_logprobs, forward_groups
from rlinf_search.workers.offload import Offloader


class ActorWorker(Worker):
    """Data-parallel policy training: every rank gets its share of the rows of a batch."""

    def __init__(self, config: RunConfig, resume_from: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.world_size > 1:
            self.init_process_group()
        actor_config = config.actor
        if resume_from:  # weights come from the checkpoint; optimizer state is loaded below
            actor_config = replace(actor_config, model_path=str(Path(resume_from) / HF_SUBDIR))
        self.config = config
        self.trainer = build_trainer(actor_config)  # actor.training_backend: fsdp or megatron
        self.tokenizer = AutoTokenizer.from_pretrained(actor_config.model_path)
        self.reference = None
        if config.actor.loss.kl_beta > 0:
            # The reference is the starting policy, even after a resume.
            self.reference = AutoModelForCausalLM.from_pretrained(config.actor.model_path)
            self.reference = self.reference.to(self.trainer.device).eval()
            self.reference.requires_grad_(False)
        if resume_from:
            _, training_state = load_checkpoint(Path(resume_from))
            self.trainer.load_training_state(training_state)
        # Between an update and the actor's next phase the engine may need the device (collocated).
        self.offloader = Offloader(config.actor.offload, optimizer=self.trainer.optimizer, device=self.trainer.device,
                                   modules=[self.trainer.model] + ([self.reference] if self.reference is not None else []))

    def compute_logprobs(self, batch: RolloutBatch) -> ForwardLogprobs:
        """Old-policy (current weights, before this step's update) and reference log-probs, when
        the placement puts no InferenceGroup apart from the actor."""
        self.offloader.onload()
        groups = forward_groups(batch, rows_per_pass=self.config.actor.forward_micro_batch_size,
                                max_tokens=self.config.actor.max_tokens_per_mbs)
        old = self.trainer.compute_logprobs(batch) if self.config.recompute_logprobs else None
        ref = (batched_response_logprobs(self.reference, batch, groups, temperature=self.config.actor.loss.temperature)
               if self.reference is not None else None)
        return ForwardLogprobs(old=old, ref=ref)

    def train(self, batch: RolloutBatch) -> dict[str, float]:
        self.offloader.onload()
        metrics = self.trainer.train_on_batch(batch)
        self.offloader.offload()  # weight sync and checkpoints read the weights wherever they are
        return metrics

    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.trainer.rollout_state_dict()

    def save(self, ckpt_dir: str, state: RunnerState, begun: bool = False) -> str | None:
        """Rank 0 writes and seals the checkpoint (DDP ranks hold the same weights); ``begun``: the
        driver staged it with ``begin_checkpoint`` and other groups' parts are already in it."""
        if self.rank != 0:
            return None
        return str(save_checkpoint(Path(ckpt_dir), state, model=self.trainer.checkpoint_model, tokenizer=self.tokenizer,
                                   training_state=self.trainer.training_state(), begun=begun))
