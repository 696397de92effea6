"""Typed settings of the critic (value model) backend."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_search.workers.actor.config import OptimConfig

CRITIC_LR = 1e-5
"""Default peak lr of the critic: Search-R1's PPO runs used 1e-5 (ten times the actor's 1e-6)."""


@dataclass(frozen=True)
class CriticConfig:
    """``critic`` (with ``critic.use_critic_model: true``) plus the ``algorithm`` keys the value update reads."""

    model_path: str
    """``critic.model.model_path``: a Hugging Face causal LM whose backbone the critic starts from (default:
    the policy's ``rollout.model.model_path``), or a saved critic (a folder with ``value_head.pt``)."""
    optim: OptimConfig = OptimConfig(lr=CRITIC_LR)
    """``critic.optim`` and ``critic.lr_sched``: the critic's own AdamW and schedule."""
    value_clip: float = 0.5
    """``algorithm.value_clip`` (verl's ``cliprange_value``): how far a prediction may move from its
    rollout-time value before its loss stops improving; keeps one noisy batch from dragging the critic."""
    loss_agg_func: str = "token-mean"
    """``algorithm.loss_agg_func``: the value loss is reduced over model tokens the same way as the policy's."""
    norm_constant: float | None = None
    """The constant length of ``seq-mean-token-sum-norm`` (the response token budget)."""
    ppo_epochs: int = 1
    """``algorithm.ppo_epochs``: passes over each rollout batch (as the actor)."""
    n_minibatches: int = 1
    """``algorithm.n_minibatches``: optimizer steps per epoch (as the actor)."""
    max_tokens_per_mbs: int | None = None
    """``runner.max_tokens_per_mbs``: token budget of a micro-batch; None = one micro-batch per mini-batch."""
    dtype: str = "float32"
    """``critic.model.precision``: compute precision, ``float32`` or ``bfloat16`` (parameters and optimizer
    state stay fp32)."""
    training_backend: str = "fsdp"
    """The actor's ``actor.training_backend``: ``fsdp`` shards the critic with FSDP2, ``ddp`` replicates it."""
    gradient_checkpointing: bool = False
    """The actor's ``actor.model.enable_gradient_checkpointing``."""
    pack_sequences: bool = True
    """The actor's ``actor.model.use_remove_padding``."""
    seed: int = 0
    """``data.seed``: value-head initialisation and mini-batch shuffling."""
    shuffle_rollout: bool = True
    """``algorithm.shuffle_rollout``: shuffle the rows before cutting mini-batches (as the actor)."""
    whole_groups: bool = False
    """Mini-batches hold whole prompt groups, shuffled as groups: the actor's with ``actor.model.share_prompts``, so
    both update on the same mini-batches."""
    warmup_steps: int = 0
    """``critic.warmup_steps`` (verl's ``trainer.critic_warmup``): the first N steps train only the critic,
    so the actor's first updates use values that have already regressed on some returns."""
    group_name: str = "CriticGroup"
    """``critic.group_name``: name of the worker group (in errors and logs)."""
