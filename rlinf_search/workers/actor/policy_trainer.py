"""The policy update: PPO epochs and mini-batches over a rollout batch, with gradient accumulation.

Every data-parallel rank gets the whole batch and trains on its token-balanced share of each mini-batch
(``data.rank_plan``): all ranks run the same number of passes and optimizer steps, so their collectives
line up. The loss of each micro-batch is divided by the whole mini-batch's token count (every rank's),
so the update is the token-mean of the mini-batch whatever the split. Parameters and Adam state are fp32;
compute is ``actor.model.precision`` (see ``parallel.py``). Backends: ``ddp`` (this class, ``Replicated``),
``fsdp`` (``FSDPPolicyTrainer``, FSDP2), ``megatron`` (a subclass on megatron-core).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from pathlib import Path

import torch

from rlinf_search.algorithms import (
    MISMATCH_CORRECTIONS,
    POLICY_LOSSES,
    aggregate_loss,
    entropy_bonus_loss,
    kl_penalty,
    masked_mean,
    top_k_kl,
)
from rlinf_search.algorithms.importance import importance_ratio
from rlinf_search.algorithms.staleness import LagStats, token_lags, too_stale
from rlinf_search.checkpoint import TrainingState
from rlinf_search.data.batch import RolloutBatch, prompt_units
from rlinf_search.data.rank_plan import (
    RankWork,
    padding_row,
    plan_passes,
    run_minibatches,
)
from rlinf_search.data.turn_rows import split_turns
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.hf_model import compile_decoder_layers, load_causal_lm
from rlinf_search.workers.actor.logprobs import score_rows
from rlinf_search.workers.actor.parallel import (
    COMPUTE_DTYPES,
    FullySharded,
    Replicated,
    init_single_process_group,
    world,
)
from rlinf_search.workers.actor.token_scoring import (
    TokenScorer,
    layout_batch,
    packs_rows,
    to_device,
)
from rlinf_search.workers.offload import OffloadTensors, module_tensors


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


def set_adam_kernel(adam: torch.optim.Optimizer, fused: bool) -> None:
    """Put a torch Adam(W) on its fused kernel, or (``fused=False``) back on the default ``foreach`` path. torch reads
    the choice from each param group at every step and makes its step counters where the fused kernel wants them
    when it first steps, so this must run before the first step. The fused kernel runs on CUDA and on CPU."""
    if adam.state:
        raise RuntimeError("set_adam_kernel: the optimizer has stepped already; switch before the first step")
    for group in adam.param_groups:
        group["fused"], group["foreach"] = (True, False) if fused else (None, None)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them (HF models)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class PolicyTrainer:
    """Owns the policy model, its optimizer and schedule, and runs PPO updates (``ddp`` backend).

    Subclasses override ``_build_model`` (the trainable LM, fp32, on ``self.device``),
    ``_data_parallel_world``, ``_parallel`` and ``_clip_gradients``; a backend with an optimizer of its own
    (Megatron's) also ``_build_optimizer``, ``_zero_grad``, ``_pass_context`` and ``_apply_gradients``.
    """

    packs_sequences = True
    """Whether this backend's model takes packed rows (``actor.model.use_remove_padding``)."""
    serves_weights_from_host = False
    """Whether ``rollout_state_dict`` reads a host copy made at the last update, not the device weights
    (so a weight sync needs no offloaded weights brought back)."""

    def __init__(self, config: ActorConfig):
        self.config = config
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._lag_stats = LagStats()  # per-lag sums of the optimizer step running
        self.model = self._build_model()
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        if config.compile_layers:
            compile_decoder_layers(self.model)
        self.model.train()
        self.rank, self.world_size, group = self._data_parallel_world()
        self.parallel = self._parallel(group)
        self.scorer = TokenScorer(self.model, chunk_tokens=config.logprob_chunk_tokens)
        self.module = self.parallel.wrap(self.scorer)
        self.packed = self.packs_sequences and packs_rows(self.model, config.pack_sequences)
        self.shares_prompts = config.share_prompts and not self.packed
        self.policy_loss = POLICY_LOSSES.resolve(config.loss.policy_loss)
        self.optimizer, self.scheduler = self._build_optimizer()
        self.global_step = 0
        # Seeded alike on every rank: all ranks must cut the same mini-batches.
        self._rng = random.Random(config.seed)

    def _build_model(self) -> torch.nn.Module:
        """The trainable policy in fp32 (the master weights), on ``self.device``."""
        return load_causal_lm(self.config.model_path, dtype=torch.float32,
                              attn_implementation=self.config.model_attention).to(self.device)

    def _build_optimizer(self):
        """AdamW over the trainable parameters and its lr schedule (``LambdaLR`` of ``lr_lambda``)."""
        o = self.config.optim
        # After wrapping: FSDP replaces the parameters with their shards, which the optimizer must hold.
        # Fused on CUDA: one kernel per step, and no full-size fp32 temporaries as the foreach path makes.
        optimizer = torch.optim.AdamW(self.scorer.parameters(), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                                      eps=o.adam_eps, weight_decay=o.weight_decay,
                                      fused=True if self.device.type == "cuda" else None)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o))

    def _data_parallel_world(self) -> tuple[int, int, object]:
        """(this rank's data-parallel rank, data-parallel size, its process group; None = every rank)."""
        rank, size = world()
        return rank, size, None

    def _parallel(self, group) -> Replicated:
        return Replicated(compute_dtype=self.config.dtype, group=group)

    def _clip_gradients(self) -> torch.Tensor:
        """Clip the global gradient norm to ``optim.clip_grad``; return the norm before clipping."""
        return self.parallel.clip_gradients(self.scorer.parameters(), self.config.optim.clip_grad)

    def offload_tensors(self) -> OffloadTensors:
        """What ``actor.offload_*`` may move off the device between phases (the worker adds the reference)."""
        return module_tensors([self.model], self.optimizer)

    @property
    def gathers_weights_collectively(self) -> bool:
        """Reading the full weights (weight sync, checkpoints) is a collective every rank must join."""
        return self.parallel.gathers_collectively

    # ---- scoring ----------------------------------------------------------------------------
    def compute_logprobs(self, batch: RolloutBatch) -> tuple[list[int], torch.Tensor]:
        """This rank's share of the batch's rows, and their ``[rows, T]`` log-probs under the current
        weights (no gradient). Every rank runs the same number of passes."""
        return score_rows(self.module, batch, rank=self.rank, world_size=self.world_size, packed=self.packed,
                          temperature=self.config.loss.temperature, max_tokens=self.config.max_tokens_per_mbs,
                          rows_per_pass=self.config.forward_micro_batch_size, device=self.device,
                          autocast=self.parallel.autocast(self.device), share_prompts=self.shares_prompts)

    # ---- training ---------------------------------------------------------------------------
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO epochs over ``batch`` (the whole batch; advantages and old log-probs set); mean metrics."""
        self._check_ready(batch)
        return run_minibatches(len(batch), lambda rows: self._optimizer_step(batch, rows),
                               epochs=self.config.ppo_epochs, n_minibatches=self.config.n_minibatches,
                               rng=self._rng if self.config.shuffle_rollout else None,
                               units=prompt_units(batch, list(range(len(batch)))) if self.shares_prompts else None)

    def train_on_minibatch(self, batch: RolloutBatch) -> dict[str, float]:
        """One optimizer step on all of ``batch``: a mini-batch a streamed step assembled from the groups that
        arrived first (``runner.pipeline: stream``; one PPO epoch). Every rank takes its share of the rows."""
        self._check_ready(batch)
        return self._optimizer_step(batch, list(range(len(batch))))

    def _check_ready(self, batch: RolloutBatch) -> None:
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("training needs batch.advantages and batch.old_logprobs")
        if self.config.loss.kl_beta > 0 and batch.ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs batch.ref_logprobs")

    def _optimizer_step(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        trajectories = len(rows)
        if not self.config.pack_traj:  # each model turn its own row; the loss still averages over trajectories
            batch = split_turns(batch.select(rows), self.config.loss.loss_agg_func).batch
            rows = list(range(len(batch)))
        # One pass per budget even with padded rows: a training pass pays the data-parallel collectives, and cut by
        # length the demo's update ran 1.08-1.23x slower (docs/benchmarks.md, "The embedded default beside TRL").
        work = plan_passes(batch, rows, rank=self.rank, world_size=self.world_size,
                           max_tokens=self.config.max_tokens_per_mbs, by_prompt=self.shares_prompts)
        work = dataclasses.replace(work, sequences=trajectories)
        own_tokens = max(int(batch.response_mask[work.rows].sum()), 1) if work.rows else 1
        self._zero_grad()
        self._lag_stats = LagStats()
        sums: dict[str, float] = {}
        for index, group in enumerate(work.passes):
            micro = batch.select(group) if group else padding_row(batch)
            with self._pass_context(last=index == len(work.passes) - 1):
                metrics = self._accumulate(micro, work)
            if not group:
                continue  # a padding pass: it only keeps the collectives in step
            weight = float(micro.response_mask.sum()) / own_tokens
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + (value if key == "actor/pg_loss" else value * weight)
        grad_norm = self._apply_gradients()
        self.scheduler.step()
        self.global_step += 1
        sums.update({"actor/grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0]})
        sums.update(self._lag_stats.metrics())
        return sums

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _pass_context(self, *, last: bool):
        """Around one micro-batch's forward and backward; ``last``: the mini-batch's final pass."""
        return contextlib.nullcontext()  # torch DDP and FSDP2 reduce every backward

    def _apply_gradients(self) -> float:
        """Clip, and step unless the norm is not finite (a skipped step keeps the weights); the norm before
        clipping."""
        grad_norm = self._clip_gradients()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        return float(grad_norm)

    def _accumulate(self, micro: RolloutBatch, work: RankWork) -> dict[str, float]:
        """Forward and backward one micro-batch; its loss is scaled to the whole mini-batch's counts."""
        cfg: PolicyLossConfig = self.config.loss
        mask = micro.response_mask.to(self.device)
        layout = to_device(layout_batch(micro, packed=self.packed, model_tokens_only=True,
                                        share_prompts=self.shares_prompts), self.device)
        with self.parallel.autocast(self.device):
            # Entropy is always measured (a collapsing entropy is the first sign of a dying run); it
            # carries a gradient only when it is part of the loss.
            scored = self.module(layout, temperature=cfg.temperature, entropy_grad=cfg.entropy_bonus > 0)
        logprobs, entropy = layout.to_rows(scored.logprobs), layout.to_rows(scored.entropy)
        old = micro.old_logprobs.to(self.device)
        # A loss with settings of its own (plugin_settings) gets them; the built-in ones declare none.
        own = {} if cfg.policy_loss_settings is None else {"settings": cfg.policy_loss_settings}
        policy = self.policy_loss(logprobs, old, micro.advantages.to(self.device), response_mask=mask,
                                  clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                                  clip_ratio_c=cfg.clip_ratio_c, **own)
        token_losses = policy.token_losses
        metrics = policy.metrics()
        rollout = micro.rollout_logprobs.to(self.device)
        if cfg.mismatch_correction:
            correction = self._mismatch_weights(old, rollout, mask)
            token_losses = token_losses * correction.weights
            metrics.update({"actor/is_weight_mean": float(correction.mean_weight),
                            "actor/is_truncated_fraction": float(correction.truncated_fraction),
                            "actor/is_masked_fraction": float(correction.masked_fraction),
                            "actor/is_missing_fraction": float(correction.missing_fraction)})
        lags = token_lags(micro.token_versions, micro.trained_version)
        if lags is not None:
            lags = lags.to(self.device)
            self._lag_stats.add(lags, mask, rho=importance_ratio(old, rollout), clipped=policy.clipped)
            stale = too_stale(lags, mask, cfg.max_token_lag)
            if stale is not None:
                token_losses = token_losses * (~stale).to(token_losses.dtype)
                metrics["actor/stale_fraction"] = float(masked_mean(stale.to(token_losses.dtype), mask))
        if cfg.kl_beta > 0:
            kl = kl_penalty(logprobs, micro.ref_logprobs.to(self.device), cfg.kl_penalty_type, mask=mask)
            token_losses = token_losses + cfg.kl_beta * kl
            metrics["actor/kl"] = float(masked_mean(kl.detach(), mask))
        metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
        if cfg.entropy_bonus > 0:
            token_losses = token_losses + entropy_bonus_loss(entropy, cfg.entropy_bonus, response_mask=mask)
        if scored.candidate_logprobs is not None:  # the distillation teacher's top-k (algorithm.distill.top_k)
            weight = micro.teacher_top_weight.to(self.device) * mask
            kl = top_k_kl(micro.teacher_top_logprobs.to(self.device), layout.to_rows(scored.candidate_logprobs),
                          weight > 0, cfg.top_k_divergence)
            token_losses = token_losses + weight * kl
            metrics["actor/teacher_top_k_kl"] = float(masked_mean(kl.detach(), weight > 0))
        if micro.loss_scale is not None:  # turn rows: each turn's share of its trajectory
            token_losses = token_losses * micro.loss_scale.to(self.device, token_losses.dtype)[:, None]
        loss = aggregate_loss(token_losses, mask, cfg.loss_agg_func, global_token_count=max(work.tokens, 1),
                              num_sequences=max(work.sequences, 1), norm_constant=cfg.norm_constant)
        # Data parallelism averages gradients over ranks; the loss already divides by every rank's tokens.
        (loss * self.world_size).backward()
        metrics["actor/pg_loss"] = loss.item() * self.world_size
        return metrics

    def _mismatch_weights(self, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor):
        cfg = self.config.loss
        correction = MISMATCH_CORRECTIONS.resolve(cfg.mismatch_correction)
        return correction(old, rollout, response_mask=mask, cap=cfg.mismatch_cap, low=cfg.mismatch_low)

    def build_reference(self, model_path: str) -> torch.nn.Module:
        """The frozen policy at ``model_path`` as a scorer in the compute precision (it never trains), placed
        like the policy (sharded under ``fsdp``)."""
        model = load_causal_lm(model_path, dtype=COMPUTE_DTYPES[self.config.dtype],
                               attn_implementation=self.config.model_attention)
        scorer = TokenScorer(model.to(self.device).eval(), chunk_tokens=self.config.logprob_chunk_tokens)
        scorer.requires_grad_(False)
        if isinstance(self.parallel, FullySharded):
            FullySharded(compute_dtype=self.config.dtype).wrap(scorer)
        return scorer

    # ---- weights and state ------------------------------------------------------------------
    def rollout_state_dict(self, dtype: torch.dtype | None = None, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The policy's full weights in HF names, on CPU (on the device with ``on_device``: a ``cuda_ipc`` sync),
        on rank 0 ({} elsewhere); floating-point ones in ``dtype`` when given (a weight sync's), else fp32 (a
        checkpoint's). With ``fsdp`` every rank must call it: the shards are gathered."""
        state = self.parallel.full_state_dict(self.scorer, dtype, on_device)
        if state is None:
            return {}
        return {name.removeprefix("lm."): tensor for name, tensor in state.items()}

    def export_hf(self, path: str | Path, state: dict[str, torch.Tensor]) -> None:
        """Write ``state`` (from ``rollout_state_dict``) as a HF model directory (rank 0)."""
        self.model.save_pretrained(path, state_dict=state)

    def training_state(self, folder: Path) -> TrainingState:
        """Optimizer, schedule, step and RNG: what a resume needs beyond the weights. With ``fsdp`` every
        rank calls it (each writes its optimizer shard into ``folder``); rank 0 saves the result."""
        optimizer = self.parallel.optimizer_state(self.scorer, self.optimizer, folder)
        return TrainingState(scheduler=self.scheduler.state_dict(), global_step=self.global_step,
                             rng=self._rng.getstate(), **optimizer)

    def load_training_state(self, state: TrainingState, folder: Path) -> None:
        self.parallel.load_optimizer_state(self.scorer, self.optimizer, state, folder)
        self.scheduler.load_state_dict(state.scheduler)
        self.global_step = state.global_step
        self._rng.setstate(state.rng)


class FSDPPolicyTrainer(PolicyTrainer):
    """The ``fsdp`` backend: FSDP2 over the actor's ranks (a one-rank group when it has one)."""

    def _parallel(self, group) -> FullySharded:
        init_single_process_group()
        return FullySharded(compute_dtype=self.config.dtype, cpu_offload=self.config.fsdp_cpu_offload)

    def _data_parallel_world(self) -> tuple[int, int, object]:
        init_single_process_group()
        return (*world(), None)
