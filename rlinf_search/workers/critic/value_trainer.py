"""The critic update: PPO epochs and mini-batches of the clipped value loss, with gradient accumulation.

Same batching and parallelism as the policy update (``PolicyTrainer``): every rank gets the whole batch
and trains on its token-balanced share of each mini-batch in as many passes as the busiest rank
(``data.rank_plan``), the loss of each micro-batch divided by the whole mini-batch's token (or sequence)
count; the actor's backend decides how the model is spread (``fsdp``: FSDP2, else DDP); fp32 parameters
and optimizer state, compute in ``critic.model.precision``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import torch

from rlinf_search.algorithms import aggregate_loss, clipped_value_loss, masked_mean
from rlinf_search.checkpoint import HF_SUBDIR, TRAINING_STATE, TrainingState
from rlinf_search.data.batch import RolloutBatch, prompt_units
from rlinf_search.data.rank_plan import (
    RankWork,
    padding_row,
    plan_passes,
    run_minibatches,
)
from rlinf_search.workers.actor.parallel import (
    FullySharded,
    Replicated,
    init_single_process_group,
    world,
)
from rlinf_search.workers.actor.policy_trainer import (
    enable_gradient_checkpointing,
    lr_lambda,
)
from rlinf_search.workers.actor.token_scoring import packs_rows
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.critic.value_model import (
    VALUE_HEAD,
    ValueModel,
    response_values,
)

EXPLAINED_VAR_EPS = 1e-5
"""Added to Var(returns) in the explained variance, as verl does, so the number compares with verl's."""


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / (Var(returns) + 1e-5)`` over model tokens (verl's ``vf_explained_var``).

    1 is a perfect critic, 0 one no better than the mean return; it is a large negative number when the
    returns barely vary (a batch where every reward is the same), as in verl.
    """
    keep = mask.bool()
    if keep.sum() < 2:
        return 0.0
    target, error = returns[keep].double(), (returns - values)[keep].double()
    return float(1.0 - error.var() / (target.var() + EXPLAINED_VAR_EPS))


def batch_value_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The whole batch's values (before the update) against its GAE returns, over model tokens."""
    mask = batch.response_mask
    return {"critic/values_mean": float(masked_mean(batch.values, mask)),
            "critic/returns_mean": float(masked_mean(batch.returns, mask)),
            "critic/explained_var": explained_variance(batch.values, batch.returns, mask)}


class ValueTrainer:
    """Owns the value model, its optimizer and schedule; scores states and runs value updates."""

    def __init__(self, config: CriticConfig):
        self.config = config
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = ValueModel.from_pretrained(config.model_path, dtype=torch.float32, seed=config.seed).to(self.device)
        self.packed = packs_rows(self.model.backbone, config.pack_sequences)
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(self.model.backbone)
        self.model.train()
        if config.training_backend == "fsdp":
            init_single_process_group()
            self.parallel: Replicated = FullySharded(compute_dtype=config.dtype)
        else:
            self.parallel = Replicated(compute_dtype=config.dtype)
        self.rank, self.world_size = world()
        self.module = self.parallel.wrap(self.model)
        o = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                                           eps=o.adam_eps, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o))
        self.global_step = 0
        # Its own stream, so the critic's mini-batches do not shift the actor's shuffling.
        self._rng = random.Random(config.seed + 1)

    @classmethod
    def from_checkpoint(cls, config: CriticConfig, folder: Path) -> ValueTrainer:
        """The critic as ``save(folder)`` left it: weights, optimizer, schedule, step and RNG."""
        if not (folder / HF_SUBDIR / VALUE_HEAD).is_file():
            raise FileNotFoundError(f"{folder}: no saved critic (the checkpoint was written by a run without "
                                    "critic.use_critic_model); resume from a PPO checkpoint or start a fresh run")
        trainer = cls(replace(config, model_path=str(folder / HF_SUBDIR)))
        trainer.load_training_state(TrainingState.load(folder / TRAINING_STATE), folder)
        return trainer

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> tuple[list[int], torch.Tensor]:
        """This rank's share of the rows and their ``[rows, T]`` values under the current weights."""
        work = plan_passes(batch, list(range(len(batch))), rank=self.rank, world_size=self.world_size,
                           max_tokens=self.config.max_tokens_per_mbs, padded=not self.packed)
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        self.module.eval()
        for group in work.passes:
            part = batch.select(group) if group else padding_row(batch)
            values = response_values(self.module, part, packed=self.packed,
                                     autocast=self.parallel.autocast(self.device)).cpu()
            if group:
                out[torch.tensor(group), : part.response_length] = values
        self.module.train()
        rows = work.rows
        return rows, out[torch.tensor(rows, dtype=torch.long)] if rows else out[:0]

    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """Epochs x mini-batches of the clipped value loss over the whole batch; needs ``batch.values``
        (rollout-time) and ``returns``."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic update needs batch.values (at rollout time) and batch.returns (from GAE)")
        return run_minibatches(len(batch), lambda rows: self._optimizer_step(batch, rows),
                               epochs=self.config.ppo_epochs, n_minibatches=self.config.n_minibatches,
                               rng=self._rng if self.config.shuffle_rollout else None,
                               units=prompt_units(batch, list(range(len(batch)))) if self.config.whole_groups else None)

    def _optimizer_step(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        work = plan_passes(batch, rows, rank=self.rank, world_size=self.world_size,
                           max_tokens=self.config.max_tokens_per_mbs)
        local_tokens = max(int(batch.response_mask[work.rows].sum()), 1) if work.rows else 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"critic/value_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for group in work.passes:
            micro = batch.select(group) if group else padding_row(batch)
            self._accumulate(micro, work, metrics, share=float(micro.response_mask.sum()) / local_tokens,
                             record=bool(group))
        grad_norm = self.parallel.clip_gradients(self.model.parameters(), self.config.optim.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        metrics.update({"critic/grad_norm": float(grad_norm), "critic/lr": self.scheduler.get_last_lr()[0]})
        return metrics

    def _accumulate(self, micro: RolloutBatch, work: RankWork, metrics: dict[str, float], *, share: float,
                    record: bool) -> None:
        mask = micro.response_mask.to(self.device)
        predicted = response_values(self.module, micro, packed=self.packed,
                                    autocast=self.parallel.autocast(self.device))
        out = clipped_value_loss(predicted, micro.values.to(self.device), micro.returns.to(self.device),
                                 response_mask=mask, cliprange_value=self.config.value_clip)
        loss = aggregate_loss(out.token_losses, mask, self.config.loss_agg_func, global_token_count=max(work.tokens, 1),
                              num_sequences=max(work.sequences, 1), norm_constant=self.config.norm_constant)
        (loss * self.world_size).backward()
        if not record:
            return  # a padding pass: it only keeps the collectives in step
        # The loss adds up over micro-batches (each divides by the whole mini-batch's count); the
        # per-token means are weighted by the micro-batch's share of this rank's tokens.
        metrics["critic/value_loss"] += loss.item() * self.world_size
        metrics["critic/vf_clipfrac"] += float(out.clip_fraction) * share
        metrics["critic/vpred_mean"] += float(masked_mean(predicted.detach(), mask)) * share

    # ---- state ------------------------------------------------------------------------------
    def training_state(self, folder: Path) -> TrainingState:
        """Optimizer, schedule, step and RNG: everything beyond the weights that a resume needs (with
        ``fsdp`` every rank calls it and writes its optimizer shard into ``folder``)."""
        optimizer = self.parallel.optimizer_state(self.model, self.optimizer, folder)
        return TrainingState(scheduler=self.scheduler.state_dict(), global_step=self.global_step,
                             rng=self._rng.getstate(), **optimizer)

    def load_training_state(self, state: TrainingState, folder: Path) -> None:
        self.parallel.load_optimizer_state(self.model, self.optimizer, state, folder)
        self.scheduler.load_state_dict(state.scheduler)
        self.global_step = state.global_step
        self._rng.setstate(state.rng)

    def save(self, folder: Path) -> None:
        """``folder/hf_model`` (backbone + ``value_head.pt``) and ``folder/training_state.pt``. Every rank
        calls it (the weights are gathered, with ``fsdp`` the optimizer shards written); rank 0 writes."""
        folder.mkdir(parents=True, exist_ok=True)
        weights = self.parallel.full_state_dict(self.model)
        state = self.training_state(folder)
        if self.rank != 0:
            return
        self.model.backbone.save_pretrained(folder / HF_SUBDIR, state_dict={
            name.removeprefix("backbone."): tensor for name, tensor in weights.items() if name.startswith("backbone.")})
        torch.save({name.removeprefix("head."): tensor for name, tensor in weights.items() if name.startswith("head.")},
                   folder / HF_SUBDIR / VALUE_HEAD)
        state.save(folder / TRAINING_STATE)
