"""The critic update: PPO epochs and mini-batches of the clipped value loss, with gradient accumulation.

Same batching as the policy update (``PolicyTrainer``): mini-batches over shuffled rows, micro-batches
packed by a token budget, the loss of each micro-batch divided by the whole mini-batch's token (or
sequence) count across data-parallel ranks, DDP over the group's process group when it has several.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import torch

from rlinf_search.algorithms import aggregate_loss, clipped_value_loss, masked_mean
from rlinf_search.data.batch import RolloutBatch, run_minibatches, split_by_token_budget
from rlinf_search.runners.checkpoint import HF_SUBDIR, TRAINING_STATE
from rlinf_search.workers.actor.policy_trainer import _all_reduce_sum, _world, lr_lambda
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.critic.value_model import VALUE_HEAD, ValueModel, response_values

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
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        self.model = ValueModel.from_pretrained(config.model_path, dtype=dtype, seed=config.seed).to(self.device)
        self.model.train()
        self.rank, self.world_size = _world()
        # DDP averages gradients over ranks; the loss below already divides by every rank's tokens.
        self.module = (torch.nn.parallel.DistributedDataParallel(self.model) if self.world_size > 1
                       else self.model)
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
        trainer.load_training_state(torch.load(folder / TRAINING_STATE, map_location="cpu", weights_only=False))
        return trainer

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` values of the batch under the current weights, micro-batch by micro-batch."""
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        self.model.eval()
        for rows in split_by_token_budget(batch, self.config.max_tokens_per_mbs):
            part = batch.select(rows)
            out[torch.tensor(rows), : part.response_length] = response_values(self.model, part).cpu()
        self.model.train()
        return out

    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """Epochs x mini-batches of the clipped value loss; needs ``batch.values`` (rollout-time) and ``returns``."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic update needs batch.values (at rollout time) and batch.returns (from GAE)")
        return run_minibatches(batch, self._optimizer_step, epochs=self.config.ppo_epochs,
                               n_minibatches=self.config.n_minibatches,
                               rng=self._rng if self.config.shuffle_rollout else None)

    def _optimizer_step(self, minibatch: RolloutBatch) -> dict[str, float]:
        tokens = _all_reduce_sum(float(minibatch.response_mask.sum()), device=self.device)
        sequences = _all_reduce_sum(float(len(minibatch)), device=self.device)
        local_tokens = max(float(minibatch.response_mask.sum()), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"critic/value_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for rows in split_by_token_budget(minibatch, self.config.max_tokens_per_mbs):
            micro = minibatch.select(rows)
            mask = micro.response_mask.to(self.device)
            predicted = response_values(self.module, micro)
            out = clipped_value_loss(predicted, micro.values.to(self.device), micro.returns.to(self.device),
                                     response_mask=mask, cliprange_value=self.config.value_clip)
            loss = aggregate_loss(out.token_losses, mask, self.config.loss_agg_func, global_token_count=tokens,
                                  num_sequences=sequences, norm_constant=self.config.norm_constant)
            (loss * self.world_size).backward()
            # The loss adds up over micro-batches (each divides by the whole mini-batch's count); the
            # per-token means are weighted by the micro-batch's share of this rank's tokens.
            share = float(mask.sum()) / local_tokens
            metrics["critic/value_loss"] += loss.item() * self.world_size
            metrics["critic/vf_clipfrac"] += float(out.clip_fraction) * share
            metrics["critic/vpred_mean"] += float(masked_mean(predicted.detach(), mask)) * share
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        metrics.update({"critic/grad_norm": float(grad_norm), "critic/lr": self.scheduler.get_last_lr()[0]})
        return metrics

    # ---- state ------------------------------------------------------------------------------
    def training_state(self) -> dict:
        """Optimizer, schedule, step and RNG: everything beyond the weights that a resume needs."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "global_step": self.global_step, "rng": self._rng.getstate()}

    def load_training_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = state["global_step"]
        self._rng.setstate(state["rng"])

    def save(self, folder: Path) -> None:
        """``folder/hf_model`` (backbone + ``value_head.pt``) and ``folder/training_state.pt``."""
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder / HF_SUBDIR)
        torch.save(self.training_state(), folder / TRAINING_STATE)
