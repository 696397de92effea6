"""The policy and value updates' typed views, from the raw config: ``actor`` with the ``algorithm`` loss
keys (``ActorConfig``), and ``critic`` (``CriticConfig``). Called by ``validate_cfg``; each raises
``ConfigError`` naming the key. A key's default is the field default of the view it fills.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace

import torch

from rlinf_search.config.readers import (
    entry_settings,
    get,
    get_bool,
    get_float,
    get_int,
    get_section,
    read_view,
)
from rlinf_search.algorithms import POLICY_LOSSES
from rlinf_search.config.schema import ConfigError
from rlinf_search.data.turn_rows import TURN_LEVEL_AGGREGATIONS
from rlinf_search.key_declarations import training_dtype_name
from rlinf_search.workers.actor.backends import TRAINING_BACKENDS
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.hf_model import ATTN_IMPLEMENTATIONS, PACKED_ROW_KERNELS
from rlinf_search.workers.actor.megatron.config import MODEL_KEYS as MEGATRON_MODEL_KEYS
from rlinf_search.workers.actor.megatron.config import MegatronConfig, megatron_config_from_actor
from rlinf_search.workers.actor.packed_attention import PACKED_ATTENTION
from rlinf_search.workers.critic.config import CRITIC_LR, CriticConfig
from rlinf_search.workers.offload import OffloadConfig

log = logging.getLogger(__name__)

# ``critic.use_critic_model``: GRPO and its kin need no value model; only GAE does.
CRITIC_BY_DEFAULT = False


def policy_loss(raw: dict, *, max_response_tokens: int, temperature: float) -> PolicyLossConfig:
    """The ``algorithm`` keys of the loss; ``ratio_clip_eps`` (verl's symmetric clip) fills the clip sides left unset;
    ``policy_loss_settings`` is validated by the loss's own settings model."""
    symmetric = get_float(raw, "algorithm.ratio_clip_eps", None)
    low = get_float(raw, "algorithm.clip_ratio_low", PolicyLossConfig.clip_ratio_low if symmetric is None else symmetric)
    high = get_float(raw, "algorithm.clip_ratio_high", low if symmetric is None else symmetric)
    # The one key where null is not the default: RLinf writes clip_ratio_c: null to turn dual clip off.
    algorithm = get(raw, "algorithm", {})
    dual_clip_off = {"clip_ratio_c": None} if "clip_ratio_c" in algorithm and algorithm["clip_ratio_c"] is None else {}
    loss = read_view(raw, PolicyLossConfig, "algorithm", clip_ratio_low=low, clip_ratio_high=high,
                     temperature=temperature, norm_constant=float(max_response_tokens), **dual_clip_off)
    settings = entry_settings(raw, POLICY_LOSSES.resolve(loss.policy_loss), "algorithm.policy_loss_settings",
                              name=f"policy_loss {loss.policy_loss}")
    return replace(loss, policy_loss_settings=settings)


def _optim(optim: dict, lr_sched: dict, *, total_steps: int, lr: float | None = None) -> OptimConfig:
    """``<section>.optim`` and ``<section>.lr_sched`` (their keys are ``OptimConfig``'s fields, defaults
    included) over ``total_steps`` optimizer steps; ``lr``: the section's own default lr."""
    settings = {**({} if lr is None else {"lr": lr}), **optim, **lr_sched}
    return OptimConfig(total_steps=total_steps, **settings)


def actor_config(raw: dict, *, model_path: str, loss: PolicyLossConfig, run_steps: int, seed: int) -> ActorConfig:
    """``actor`` and the ``algorithm`` keys of the policy update (``loss``: ``policy_loss``'s); the lr schedule spans
    ``run_steps`` steps of ``ppo_epochs x n_minibatches`` optimizer steps each. ``seed``: ``data.seed``."""
    offload = OffloadConfig(weights=get_bool(raw, "actor.offload_weight", OffloadConfig.weights),
                            grads=get_bool(raw, "actor.offload_grad", OffloadConfig.grads),
                            optimizer=get_bool(raw, "actor.offload_optimizer", OffloadConfig.optimizer))
    actor = read_view(raw, ActorConfig, "", model_path=model_path, loss=loss, seed=seed, offload=offload,
                      max_tokens_per_mbs=get_int(raw, "runner.max_tokens_per_mbs", None))
    backend = actor.training_backend
    megatron = _megatron(raw, backend, model_path)
    if backend == "megatron" and actor.gradient_checkpointing:
        raise ConfigError("actor.model.enable_gradient_checkpointing: the megatron backend recomputes activations "
                          "by actor.model.recompute_granularity instead")
    if backend == "megatron" and actor.compile_layers:
        raise ConfigError("actor.model.compile_layers: read by the HF backends (fsdp, ddp) only; the megatron backend "
                          "does not compile its layers")
    if not actor.pack_traj and loss.loss_agg_func not in TURN_LEVEL_AGGREGATIONS:
        raise ConfigError(f"actor.pack_traj: false weights each turn back to its trajectory for "
                          f"{', '.join(TURN_LEVEL_AGGREGATIONS)}; algorithm.loss_agg_func is {loss.loss_agg_func!r}")
    if actor.fsdp_cpu_offload and backend != "fsdp":
        raise ConfigError(f"actor.fsdp_config.cpu_offload: read by actor.training_backend: fsdp only, and this run "
                          f"uses {backend}")
    _check_attn_implementation(actor)
    steps = run_steps * actor.ppo_epochs * actor.n_minibatches
    return replace(actor, megatron=megatron, optim=_optim(
        get_section(raw, "actor.optim"), get_section(raw, "actor.lr_sched"), total_steps=steps))


def _check_attn_implementation(actor: ActorConfig) -> None:
    """``actor.model.attn_implementation``: the HF attention kernel; megatron-core brings its own attention. A choice
    that cannot take effect on this machine (no packed-row kernel, a kernel whose package or device is missing) says
    so here, in one line, before any worker starts."""
    name, backend, packing = actor.attn_implementation, actor.training_backend, actor.pack_sequences
    if name is None:
        return
    if backend == "megatron":
        raise ConfigError("actor.model.attn_implementation: read by the HF backends (fsdp, ddp) only; megatron-core's "
                          "layer spec sets the attention of actor.training_backend: megatron")
    if name not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(f"actor.model.attn_implementation: unknown '{name}'; use one of "
                          f"{', '.join(ATTN_IMPLEMENTATIONS)}, or null for transformers' default")
    if packing and name not in PACKED_ROW_KERNELS:
        log.warning("actor.model.use_remove_padding: no effect with attn_implementation %s (no packed-row kernel), "
                    "rows stay padded; use %s (or null) to pack", name, PACKED_ATTENTION)
    if name.startswith("flash_attention") and importlib.util.find_spec("flash_attn") is None:
        log.warning("actor.model.attn_implementation: %s needs the flash_attn package, which this machine lacks, so "
                    "the actor's models will not load here; %s packs rows without it", name, PACKED_ATTENTION)
    if name == "flex_attention" and not torch.cuda.is_available():
        log.warning("actor.model.attn_implementation: flex_attention has no backward pass on CPU in torch, so the "
                    "actor cannot train on this machine; %s trains everywhere", PACKED_ATTENTION)
    return name


def critic_config(raw: dict, actor: ActorConfig, *, total_steps: int, group_name: str) -> CriticConfig | None:
    """``critic`` when ``use_critic_model`` is true: it trains on the actor's batches, with its own optimizer."""
    if not get_bool(raw, "critic.use_critic_model", CRITIC_BY_DEFAULT):
        return None
    value_clip = get_float(raw, "algorithm.value_clip", CriticConfig.value_clip)
    warmup = get_int(raw, "critic.warmup_steps", CriticConfig.warmup_steps)
    if not 0 <= warmup < total_steps:
        raise ConfigError(f"critic.warmup_steps must be in [0, {total_steps}) (the run's steps), got {warmup}: "
                          "the actor trains only after it")
    return CriticConfig(
        model_path=get(raw, "critic.model.model_path", actor.model_path), value_clip=value_clip,
        optim=_optim(get_section(raw, "critic.optim"), get_section(raw, "critic.lr_sched"),
                     total_steps=actor.optim.total_steps, lr=CRITIC_LR),
        loss_agg_func=actor.loss.loss_agg_func, norm_constant=actor.loss.norm_constant, ppo_epochs=actor.ppo_epochs,
        n_minibatches=actor.n_minibatches, max_tokens_per_mbs=actor.max_tokens_per_mbs,
        dtype=_training_dtype(get(raw, "critic.model.precision", CriticConfig.dtype)), seed=actor.seed,
        shuffle_rollout=actor.shuffle_rollout, warmup_steps=warmup, group_name=group_name,
        training_backend=actor.training_backend, gradient_checkpointing=actor.gradient_checkpointing,
        pack_sequences=actor.pack_sequences)


def _training_dtype(precision: str) -> str:
    """``critic.model.precision`` as a torch dtype name; fp16 refused (``training_dtype_name``)."""
    try:
        return training_dtype_name(precision)
    except ValueError as exc:
        raise ConfigError(f"critic.model.precision: {exc}") from None


def _megatron(raw: dict, backend: str, model_path: str) -> MegatronConfig | None:
    """``actor.megatron`` and the Megatron-only ``actor.model`` keys: read by that backend, an error elsewhere.

    Only the config is checked here, so a GPU recipe validates on any machine; whether megatron-core
    and GPUs are there is checked when the run starts (``require_training_backend``)."""
    try:
        TRAINING_BACKENDS.resolve(backend, key="actor.training_backend")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    actor = get(raw, "actor", {})
    if backend != "megatron":
        named = [f"actor.model.{key}" for key in MEGATRON_MODEL_KEYS if key in (actor.get("model") or {})]
        named += ["actor.megatron"] if "megatron" in actor else []
        if named:
            raise ConfigError(f"{named[0]}: read by actor.training_backend: megatron only, and this run uses {backend}")
        return None
    try:
        return megatron_config_from_actor(actor, default_hf_model_path=model_path)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
