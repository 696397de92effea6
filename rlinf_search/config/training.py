"""The policy and value updates' typed views, from the parsed config (``config/model.py``): ``actor`` with the
``algorithm`` loss keys (``ActorConfig``), and ``critic`` (``CriticConfig``). Called by ``validate_cfg``; each raises
``ConfigError`` naming the key.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from rlinf_search.algorithms import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    MISMATCH_CORRECTIONS,
    POLICY_LOSSES,
)
from rlinf_search.config.model import AlgorithmSection, TrainConfigFile
from rlinf_search.config.model_update import ActorSection, MegatronSection
from rlinf_search.config.precision import training_dtype_name
from rlinf_search.config.readers import entry_settings
from rlinf_search.config.schema import ConfigError
from rlinf_search.data.turn_rows import TURN_LEVEL_AGGREGATIONS
from rlinf_search.section_model import parse_section
from rlinf_search.workers.actor.backends import TRAINING_BACKENDS
from rlinf_search.workers.actor.config import (
    ActorConfig,
    LrSchedSection,
    OptimConfig,
    OptimSection,
    PolicyLossConfig,
)
from rlinf_search.workers.actor.hf_model import ATTN_IMPLEMENTATIONS, PACKED_ROW_KERNELS
from rlinf_search.workers.actor.megatron.config import (
    MegatronBackendKeys,
    MegatronConfig,
    MegatronModelKeys,
)
from rlinf_search.workers.actor.packed_attention import PACKED_ATTENTION
from rlinf_search.workers.actor.shared_prompts import SHARED_PROMPT_KERNELS
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.offload import OffloadConfig

log = logging.getLogger(__name__)


def policy_loss(algorithm: AlgorithmSection, *, max_response_tokens: int, temperature: float) -> PolicyLossConfig:
    """The ``algorithm`` keys of the loss; ``ratio_clip_eps`` (verl's symmetric clip) fills the clip sides left unset;
    ``policy_loss_settings`` is validated by the loss's own settings model."""
    symmetric = algorithm.ratio_clip_eps
    low = algorithm.clip_ratio_low
    low = (PolicyLossConfig.clip_ratio_low if symmetric is None else symmetric) if low is None else low
    high = algorithm.clip_ratio_high
    high = (low if symmetric is None else symmetric) if high is None else high
    for key, registry in (("policy_loss", POLICY_LOSSES), ("loss_agg_func", LOSS_AGGREGATIONS),
                          ("kl_penalty_type", KL_ESTIMATORS), ("mismatch_correction", MISMATCH_CORRECTIONS)):
        name = getattr(algorithm, key)
        if name is not None:
            try:
                registry.resolve(name, key=f"algorithm.{key}")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    settings = entry_settings(algorithm.policy_loss_settings, POLICY_LOSSES.resolve(algorithm.policy_loss),
                              "algorithm.policy_loss_settings", name=f"policy_loss {algorithm.policy_loss}")
    return PolicyLossConfig(
        policy_loss=algorithm.policy_loss, policy_loss_settings=settings, clip_ratio_low=low, clip_ratio_high=high,
        clip_ratio_c=algorithm.clip_ratio_c, loss_agg_func=algorithm.loss_agg_func, kl_beta=algorithm.kl_beta,
        kl_penalty_type=algorithm.kl_penalty_type, entropy_bonus=algorithm.entropy_bonus, temperature=temperature,
        mismatch_correction=algorithm.mismatch_correction, max_token_lag=algorithm.max_token_lag,
        norm_constant=float(max_response_tokens), top_k_divergence=algorithm.distill.top_k_divergence)


def _optim(optim: OptimSection, lr_sched: LrSchedSection, *, total_steps: int) -> OptimConfig:
    """``<section>.optim`` and ``<section>.lr_sched`` over ``total_steps`` optimizer steps."""
    return OptimConfig(total_steps=total_steps, **optim.model_dump(), **lr_sched.model_dump())


def actor_config(cfg: TrainConfigFile, *, model_path: str, loss: PolicyLossConfig, run_steps: int) -> ActorConfig:
    """``actor`` and the ``algorithm`` keys of the policy update (``loss``: ``policy_loss``'s); the lr schedule spans
    ``run_steps`` steps of ``ppo_epochs x n_minibatches`` optimizer steps each."""
    section, algorithm = cfg.actor, cfg.algorithm
    backend = section.training_backend
    try:
        TRAINING_BACKENDS.resolve(backend, key="actor.training_backend")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    model = section.model
    try:
        dtype = training_dtype_name(model.precision)
    except ValueError as exc:
        raise ConfigError(f"actor.model.precision: {exc}") from None
    steps = run_steps * algorithm.ppo_epochs * algorithm.n_minibatches
    actor = ActorConfig(
        model_path=model_path, loss=loss, seed=cfg.data.seed, ppo_epochs=algorithm.ppo_epochs,
        n_minibatches=algorithm.n_minibatches, max_tokens_per_mbs=cfg.runner.max_tokens_per_mbs, dtype=dtype,
        gradient_checkpointing=model.enable_gradient_checkpointing, pack_sequences=model.use_remove_padding,
        pack_traj=section.pack_traj, attn_implementation=model.attn_implementation, share_prompts=model.share_prompts,
        compile_layers=model.compile_layers, logprob_chunk_tokens=model.logprob_chunk_size,
        fsdp_cpu_offload=section.fsdp_config.cpu_offload, shuffle_rollout=algorithm.shuffle_rollout,
        training_backend=backend, forward_micro_batch_size=algorithm.logprob_forward_micro_batch_size,
        offload=OffloadConfig(weights=section.offload_weight, grads=section.offload_grad,
                              optimizer=section.offload_optimizer),
        megatron=_megatron(section, backend, model_path),
        optim=_optim(section.optim, section.lr_sched, total_steps=steps))
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
    _check_shared_prompts(actor)
    return actor


def _check_shared_prompts(actor: ActorConfig) -> None:
    """``actor.model.share_prompts`` lays a prompt's rows out under a dense mask, which only padded rows through
    ``sdpa`` can take."""
    if not actor.share_prompts:
        return
    if actor.training_backend == "megatron":
        raise ConfigError("actor.model.share_prompts: read by the HF backends (fsdp, ddp) only; the megatron backend "
                          "packs rows instead")
    if actor.pack_sequences:
        raise ConfigError("actor.model.share_prompts: true needs padded rows; set actor.model.use_remove_padding: "
                          "false (packed rows already compute no padding)")
    if actor.attn_implementation not in (None, *SHARED_PROMPT_KERNELS):
        raise ConfigError(f"actor.model.share_prompts: true needs attention that reads a dense mask "
                          f"({', '.join(sorted(SHARED_PROMPT_KERNELS))} or null), got actor.model.attn_implementation "
                          f"{actor.attn_implementation}")


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


def critic_config(cfg: TrainConfigFile, actor: ActorConfig, *, total_steps: int) -> CriticConfig | None:
    """``critic`` when ``use_critic_model`` is true: it trains on the actor's batches, with its own optimizer."""
    critic = cfg.critic
    if not critic.use_critic_model:
        return None
    if not 0 <= critic.warmup_steps < total_steps:
        raise ConfigError(f"critic.warmup_steps must be in [0, {total_steps}) (the run's steps), got "
                          f"{critic.warmup_steps}: the actor trains only after it")
    try:
        dtype = training_dtype_name(critic.model.precision)
    except ValueError as exc:
        raise ConfigError(f"critic.model.precision: {exc}") from None
    return CriticConfig(
        model_path=critic.model.model_path or actor.model_path, value_clip=cfg.algorithm.value_clip,
        optim=_optim(critic.optim, critic.lr_sched, total_steps=actor.optim.total_steps),
        loss_agg_func=actor.loss.loss_agg_func, norm_constant=actor.loss.norm_constant, ppo_epochs=actor.ppo_epochs,
        n_minibatches=actor.n_minibatches, max_tokens_per_mbs=actor.max_tokens_per_mbs, dtype=dtype, seed=actor.seed,
        shuffle_rollout=actor.shuffle_rollout, whole_groups=actor.share_prompts, warmup_steps=critic.warmup_steps,
        group_name=critic.group_name,
        training_backend=actor.training_backend, gradient_checkpointing=actor.gradient_checkpointing,
        pack_sequences=actor.pack_sequences)


def _megatron(actor: ActorSection, backend: str, model_path: str) -> MegatronConfig | None:
    """``actor.megatron`` and the Megatron-only ``actor.model`` keys: read by that backend, an error elsewhere.

    Only the config is checked here, so a GPU recipe validates on any machine; whether megatron-core
    and GPUs are there is checked when the run starts (``require_training_backend``)."""
    if backend != "megatron":
        named = [f"actor.model.{key}" for key in MegatronModelKeys.model_fields if key in actor.model.model_fields_set]
        named += ["actor.megatron"] if actor.megatron is not None else []
        if named:
            raise ConfigError(f"{named[0]}: read by actor.training_backend: megatron only, and this run uses {backend}")
        return None
    try:
        return megatron_config(actor, default_hf_model_path=model_path)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def megatron_config(actor: ActorSection, *, default_hf_model_path: str) -> MegatronConfig:
    """``MegatronConfig`` from the ``actor`` section; ValueError naming the key for what only this backend refuses
    (the checkpoint converter's tensor and pipeline sizes default to the model's)."""
    megatron = actor.megatron or MegatronSection()
    if not megatron.use_hf_ckpt:
        raise ValueError("actor.megatron.use_hf_ckpt must be true: the Megatron actor starts from the HF "
                         "weights at rollout.model.model_path (convert a Megatron checkpoint with "
                         "toolkits/convert_megatron_to_hf.py first)")
    model = actor.model.model_dump(include=set(MegatronModelKeys.model_fields))
    converter = {"hf_model_path": default_hf_model_path,
                 "tensor_model_parallel_size": model["tensor_model_parallel_size"],
                 "pipeline_model_parallel_size": model["pipeline_model_parallel_size"],
                 **megatron.ckpt_convertor.model_dump(exclude_unset=True)}
    return parse_section(MegatronConfig, {**model, **megatron.model_dump(include=set(MegatronBackendKeys.model_fields)),
                                          "converter": converter}, path="actor")
