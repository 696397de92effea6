"""The policy update: PPO epochs and mini-batches over a rollout batch, with gradient accumulation.

Runs in one process, or in each rank of a data-parallel group (DDP over gloo on CPU, nccl on GPU)
when ``torch.distributed`` is initialised: each rank holds its share of the batch, token counts are
all-reduced so the loss is the token-mean of the whole mini-batch, not of each rank's share.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlinf_search.algorithms import (
    aggregate_loss,
    entropy_bonus_loss,
    kl_penalty,
    masked_is_weights,
    masked_mean,
    ppo_policy_loss,
    truncated_is_weights,
)
from rlinf_search.data.batch import RolloutBatch, run_minibatches, split_by_token_budget
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.logprobs import batched_response_logprobs, forward_groups, response_logprobs


def lr_lambda(config: OptimConfig):
    """Multiplier of the peak lr at optimizer step ``s``: linear warm-up, then constant or cosine."""
    warmup = int(round(config.lr_warmup_fraction * config.total_steps))
    floor = config.min_lr / config.lr if config.lr > 0 else 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.lr_decay_style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, config.total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce_sum(value: float, *, group=None, device: torch.device | str = "cpu") -> float:
    """Sum over ``group`` (None: every rank); on the rank's device, since nccl reduces GPU tensors only."""
    if _world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return float(tensor)


@dataclass
class _MinibatchTotals:
    tokens: float
    sequences: float


class PolicyTrainer:
    """Owns the policy model, its optimizer and schedule, and runs PPO updates.

    The FSDP backend (``actor.training_backend: fsdp``): a HF model, data parallel over every rank.
    Other backends override ``_build_model``, ``_data_parallel_world`` and ``_clip_gradients``.
    """

    def __init__(self, config: ActorConfig):
        self.config = config
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        self.model = self._build_model(dtype)
        self.model.train()
        self.rank, self.world_size, self.dp_group = self._data_parallel_world()
        # DDP averages gradients over ranks; the loss below already divides by every rank's tokens.
        self.module = (torch.nn.parallel.DistributedDataParallel(self.model, process_group=self.dp_group)
                       if self.world_size > 1 else self.model)
        o = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                                           eps=o.adam_eps, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o))
        self.global_step = 0
        self._rng = random.Random(config.seed)

    def _build_model(self, dtype: torch.dtype) -> torch.nn.Module:
        """The trainable policy, on ``self.device``, called like a HF causal LM."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.config.model_path, dtype=dtype).to(self.device)

    def _data_parallel_world(self) -> tuple[int, int, object]:
        """(this rank's data-parallel rank, data-parallel size, its process group; None = every rank)."""
        rank, size = _world()
        return rank, size, None

    def _clip_gradients(self) -> torch.Tensor:
        """Clip the global gradient norm to ``optim.clip_grad``; return the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.clip_grad)

    # ---- scoring ----------------------------------------------------------------------------
    def compute_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` log-probs of the batch's responses under the current weights (no gradient)."""
        groups = forward_groups(batch, rows_per_pass=self.config.forward_micro_batch_size,
                                max_tokens=self.config.max_tokens_per_mbs)
        return batched_response_logprobs(self.model, batch, groups, temperature=self.config.loss.temperature)

    # ---- training ---------------------------------------------------------------------------
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO epochs over ``batch`` (advantages and old log-probs set); returns mean metrics."""
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("train_on_batch needs batch.advantages and batch.old_logprobs")
        if self.config.loss.kl_beta > 0 and batch.ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs batch.ref_logprobs")
        return run_minibatches(batch, self._optimizer_step, epochs=self.config.ppo_epochs,
                               n_minibatches=self.config.n_minibatches,
                               rng=self._rng if self.config.shuffle_rollout else None)

    def _optimizer_step(self, minibatch: RolloutBatch) -> dict[str, float]:
        reduce = {"group": self.dp_group, "device": self.device}
        totals = _MinibatchTotals(tokens=_all_reduce_sum(float(minibatch.response_mask.sum()), **reduce),
                                  sequences=_all_reduce_sum(float(len(minibatch)), **reduce))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for rows in split_by_token_budget(minibatch, self.config.max_tokens_per_mbs):
            micro = minibatch.select(rows)
            metrics = self._accumulate(micro, totals)
            weight = float(micro.response_mask.sum()) / max(totals.tokens / self.world_size, 1.0)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * weight
        grad_norm = self._clip_gradients()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        sums.update({"actor/grad_norm": float(grad_norm), "actor/lr": self.scheduler.get_last_lr()[0]})
        return sums

    def _accumulate(self, micro: RolloutBatch, totals: _MinibatchTotals) -> dict[str, float]:
        """Forward and backward one micro-batch; its loss is scaled to the whole mini-batch's counts."""
        cfg: PolicyLossConfig = self.config.loss
        mask = micro.response_mask.to(self.device)
        # Entropy is always measured (a collapsing entropy is the first sign of a dying run).
        logprobs, entropy = response_logprobs(self.module, micro, temperature=cfg.temperature, with_entropy=True)
        old = micro.old_logprobs.to(self.device)
        policy = ppo_policy_loss(logprobs, old, micro.advantages.to(self.device), response_mask=mask,
                                 clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                                 clip_ratio_c=cfg.clip_ratio_c)
        token_losses = policy.token_losses
        metrics = policy.metrics()
        if cfg.mismatch_correction:
            correction = self._mismatch_weights(old, micro.rollout_logprobs.to(self.device), mask)
            token_losses = token_losses * correction.weights
            metrics["actor/is_weight_mean"] = float(correction.mean_weight)
        if cfg.kl_beta > 0:
            kl = kl_penalty(logprobs, micro.ref_logprobs.to(self.device), cfg.kl_penalty_type, mask=mask)
            token_losses = token_losses + cfg.kl_beta * kl
            metrics["actor/kl"] = float(masked_mean(kl.detach(), mask))
        metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
        if cfg.entropy_bonus > 0:
            token_losses = token_losses + entropy_bonus_loss(entropy, cfg.entropy_bonus, response_mask=mask)
        loss = aggregate_loss(token_losses, mask, cfg.loss_agg_func, global_token_count=totals.tokens,
                              num_sequences=totals.sequences, norm_constant=cfg.norm_constant)
        (loss * self.world_size).backward()
        metrics["actor/pg_loss"] = loss.item() * self.world_size
        return metrics

    def _mismatch_weights(self, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor):
        cfg = self.config.loss
        if cfg.mismatch_correction == "tis":
            return truncated_is_weights(old, rollout, response_mask=mask, cap=cfg.mismatch_cap)
        if cfg.mismatch_correction == "mask":
            return masked_is_weights(old, rollout, response_mask=mask, low=cfg.mismatch_low, high=cfg.mismatch_cap)
        raise ValueError(f"algorithm mismatch correction must be tis or mask, got {cfg.mismatch_correction!r}")

    # ---- weights and state ------------------------------------------------------------------
    @property
    def checkpoint_model(self):
        """What a checkpoint's ``hf_model/`` is written from (anything with ``save_pretrained``)."""
        return self.model

    def rollout_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights for the rollout engine, detached on CPU, names as in the HF model."""
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in self.model.state_dict().items()}

    def training_state(self) -> dict:
        """Optimizer, schedule, step and RNG: everything beyond the weights that a resume needs."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "global_step": self.global_step, "rng": self._rng.getstate()}

    def load_training_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = state["global_step"]
        self._rng.setstate(state["rng"])
