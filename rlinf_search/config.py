"""Config: the YAML RLinf users know, checked once at start-up and handed out as typed views.

``validate_cfg(cfg)`` rejects unknown keys and every broken cross-field rule with the key's path,
before any worker starts; renamed keys are accepted with a one-line deprecation message. Workers
get dataclasses (``RunConfig`` and its parts), never the raw config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlinf_search.agents.searchr1.loop import AgentLoopConfig
from rlinf_search.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS
from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.rewards import REWARDS
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Placement, Topology, validate_placement
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.actor.backends import TRAINING_BACKENDS
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.megatron.config import CONVERTER_KEYS as MEGATRON_CONVERTER_KEYS
from rlinf_search.workers.actor.megatron.config import MODEL_KEYS as MEGATRON_MODEL_KEYS
from rlinf_search.workers.actor.megatron.config import MegatronConfig, megatron_config_from_actor
from rlinf_search.workers.inference.config import InferenceConfig
from rlinf_search.workers.offload import OffloadConfig
from rlinf_search.workers.rollout.base import engine_factory
from rlinf_search.workers.rollout.config import VLLM_ONLY_KEYS, RolloutConfig
from rlinf_search.workers.critic.config import CRITIC_LR, CriticConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value or combination that cannot run; the message starts with the key's path."""


def register_resolvers() -> None:
    """Arithmetic in YAML, as RLinf configs write it: ``${subtract:${runner.seq_length},128}``."""
    resolvers = {"subtract": lambda a, b: a - b, "add": lambda a, b: a + b,
                 "multiply": lambda a, b: a * b, "int_div": lambda a, b: int(a) // int(b)}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


# Every key the code reads; a key outside this tree is a typo or a dead setting, and an error.
SCHEMA: dict[str, Any] = {
    "hydra": "*",
    "cluster": "*",  # checked by ClusterConfig.from_dict
    "runner": {"task_type": None, "experiment_name": None, "output_dir": None, "max_epochs": None,
               "max_steps": None, "val_check_interval": None, "save_interval": None, "seq_length": None,
               "max_tokens_per_mbs": None, "resume_dir": None,
               "logger": {"log_path": None, "project_name": None, "experiment_name": None, "logger_backends": None}},
    "algorithm": {"group_size": None, "n_minibatches": None, "ppo_epochs": None, "recompute_logprobs": None,
                  "shuffle_rollout": None, "loss_agg_func": None, "kl_beta": None, "kl_penalty_type": None,
                  "ratio_clip_eps": None, "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": None,
                  "entropy_bonus": None, "adv_type": None, "normalize_advantages": None, "gamma": None, "lam": None,
                  "mismatch_correction": None, "value_clip": None, "logprob_forward_micro_batch_size": None,
                  "sampling_params": {"do_sample": None, "temperature": None, "top_k": None, "top_p": None,
                                      "max_new_tokens": None}},
    "agentloop": {"group_name": None, "max_turns": None, "max_tool_response_length": None,
                  "max_passage_tokens": None, "retokenize": None},
    "tools": {"search": "*"},  # checked by SearchToolConfig
    "rollout": {"group_name": None, "rollout_backend": None, "max_running_requests": None,
                "gpu_memory_utilization": None, "tensor_parallel_size": None,
                "model": {"model_path": None, "precision": None}},
    "inference": {"group_name": None, "load_from_actor": None},
    "data": {"max_prompt_length": None, "rollout_batch_size": None, "apply_chat_template": None, "shuffle": None,
             "seed": None, "train_data_paths": None, "val_data_paths": None},
    "actor": {"group_name": None, "training_backend": None,
              "model": {"precision": None, **{key: None for key in MEGATRON_MODEL_KEYS}},
              "megatron": {"use_hf_ckpt": None, "distributed_timeout_minutes": None,
                           "ckpt_convertor": {key: None for key in MEGATRON_CONVERTER_KEYS}},
              "offload_weight": None, "offload_grad": None, "offload_optimizer": None,
              "optim": {"lr": None, "adam_beta1": None, "adam_beta2": None, "adam_eps": None, "weight_decay": None,
                        "clip_grad": None},
              "lr_sched": {"lr_warmup_fraction": None, "lr_decay_style": None, "min_lr": None}},
    "reward": {"group_name": None, "reward_type": None, "score": None, "reward_scale": None},
    "critic": {"use_critic_model": None, "group_name": None, "warmup_steps": None,
               "model": {"model_path": None, "precision": None},
               "optim": {"lr": None, "adam_beta1": None, "adam_beta2": None, "adam_eps": None, "weight_decay": None,
                         "clip_grad": None},
               "lr_sched": {"lr_warmup_fraction": None, "lr_decay_style": None, "min_lr": None}},
}
# Old spelling -> new; RLinf itself writes the turn limit both ways.
DEPRECATED_KEYS = {"agentloop.maxturn": "agentloop.max_turns"}
# Components a placement may name.
COMPONENTS = frozenset({"actor", "rollout", "reward", "inference", "agentloop"})
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}


def _check_keys(node: Any, schema: Any, path: str) -> None:
    if schema == "*" or schema is None:
        return
    if not isinstance(node, dict):
        raise ConfigError(f"{path}: expected a section of keys, got {type(node).__name__}")
    for key, value in node.items():
        if key not in schema:
            raise ConfigError(f"{path}.{key}: unknown key; {path} takes {', '.join(sorted(schema))}".lstrip("."))
        _check_keys(value, schema[key], f"{path}.{key}" if path else key)


def _apply_deprecations(raw: dict) -> None:
    for old, new in DEPRECATED_KEYS.items():
        section, old_key = old.split(".")
        _, new_key = new.split(".")
        body = raw.get(section) or {}
        if old_key in body:
            log.warning("%s is deprecated; write %s", old, new)
            if new_key in body and body[new_key] != body[old_key]:
                raise ConfigError(f"{old} and {new} disagree ({body[old_key]} vs {body[new_key]}); keep {new}")
            body[new_key] = body.pop(old_key)


@dataclass(frozen=True)
class RunnerConfig:
    """``runner``: how long to train, when to validate and save, where outputs go."""

    output_dir: str
    """Root of the run's outputs (checkpoints, logs, eval)."""
    experiment_name: str = "run"
    """Name of the run in logs."""
    max_steps: int = 100
    """Training steps (rollout + update) to run; the run stops at ``max_epochs`` first if that comes first."""
    max_epochs: int = 1
    """Passes over the training data."""
    val_check_interval: int = 0
    """Validate every N steps (0: never during training)."""
    save_interval: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    seq_length: int = 4096
    """Prompt + response token budget per trajectory."""
    max_tokens_per_mbs: int | None = None
    """Token budget of one micro-batch (forward/backward)."""
    resume_dir: str | None = None
    """A checkpoint folder to resume from, or ``auto`` for the newest one under ``output_dir``."""
    log_path: str = ""
    """Where metrics.jsonl and TensorBoard files go."""
    logger_backends: tuple[str, ...] = ("console", "jsonl")
    """Metric sinks."""
    project_name: str = "rlinf-search"
    """W&B project."""


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, validated."""

    cluster: ClusterConfig
    """``cluster``: nodes, CPU slots, Ray address."""
    placement: Placement
    """``cluster.component_placement`` resolved to devices and ranks."""
    runner: RunnerConfig
    """``runner``: steps, intervals, outputs, logging."""
    actor: ActorConfig
    """The policy update (``actor`` plus the ``algorithm`` loss keys)."""
    agent_loop: AgentLoopConfig
    """``agentloop`` plus sampling and token budgets."""
    search: SearchToolConfig
    """``tools.search``."""
    rollout: RolloutConfig
    """``rollout``: the engine (hf, vllm), the starting policy's path (also the reference), its memory."""
    train_data_paths: tuple[str, ...]
    """Prepared training jsonl files."""
    val_data_paths: tuple[str, ...]
    """Prepared validation jsonl files (may be empty)."""
    rollout_batch_size: int
    """Prompts per step."""
    group_size: int
    """Samples per prompt."""
    adv_type: str
    """Advantage estimator name."""
    recompute_logprobs: bool
    """Recompute old log-probs (actor or InferenceGroup) instead of using the engine's."""
    inference: InferenceConfig
    """``inference``: whether an InferenceGroup computes the log-probs apart from the actor, and how."""
    shuffle: bool
    """Shuffle the training prompts each epoch."""
    seed: int
    """Data order and engine sampling seed."""
    reward_score: str
    """Reward name (``em``, ``subem``, ``f1``, ``format_em``)."""
    reward_scale: float
    """Multiplier of the reward."""
    normalize_advantages: bool = True
    """``algorithm.normalize_advantages``."""
    gamma: float = 1.0
    """Discount (REINFORCE++, GAE)."""
    lam: float = 1.0
    """GAE lambda."""
    critic: CriticConfig | None = None
    """The value model for GAE (``critic`` with ``use_critic_model: true``); None without one."""


def _get(raw: dict, dotted: str, default: Any = None) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _precision(value: str, path: str) -> str:
    if value not in PRECISIONS:
        raise ConfigError(f"{path}: precision must be one of {sorted(PRECISIONS)}, got {value!r}")
    return PRECISIONS[value]


def _sampling(raw: dict) -> SamplingParams:
    params = _get(raw, "algorithm.sampling_params", {})
    greedy = not params.get("do_sample", True)
    temperature = float(params.get("temperature", 1.0))
    if not greedy and temperature <= 0:
        raise ConfigError("algorithm.sampling_params.temperature must be > 0 when do_sample is true")
    top_p = float(params.get("top_p", 1.0))
    if not 0 < top_p <= 1:
        raise ConfigError(f"algorithm.sampling_params.top_p must be in (0, 1], got {top_p}")
    return SamplingParams(max_new_tokens=int(params.get("max_new_tokens", 500)), temperature=temperature,
                          top_p=top_p, top_k=int(params.get("top_k", 0)), greedy=greedy)


def _policy_loss(raw: dict, max_response_tokens: int) -> PolicyLossConfig:
    algo = _get(raw, "algorithm", {})
    symmetric = algo.get("ratio_clip_eps")
    low = algo.get("clip_ratio_low", symmetric if symmetric is not None else 0.2)
    high = algo.get("clip_ratio_high", symmetric if symmetric is not None else low)
    names = {"algorithm.loss_agg_func": (algo.get("loss_agg_func", "token-mean"), LOSS_AGGREGATIONS),
             "algorithm.kl_penalty_type": (algo.get("kl_penalty_type", "low_var_kl"), KL_ESTIMATORS)}
    for path, (value, registry) in names.items():
        if value not in registry:
            raise ConfigError(f"{path}: unknown {value!r}; choose one of {sorted(registry)}")
    if float(algo.get("kl_beta", 0.0)) < 0:
        raise ConfigError("algorithm.kl_beta must be >= 0")
    clip_c = algo.get("clip_ratio_c", 3.0)
    if clip_c is not None and float(clip_c) <= 1:
        raise ConfigError(f"algorithm.clip_ratio_c must be > 1 (or null to turn dual clip off), got {clip_c}")
    correction = algo.get("mismatch_correction")
    if correction not in (None, "tis", "mask"):
        raise ConfigError(f"algorithm.mismatch_correction must be null, tis or mask, got {correction!r}")
    return PolicyLossConfig(
        clip_ratio_low=float(low), clip_ratio_high=float(high), clip_ratio_c=None if clip_c is None else float(clip_c),
        loss_agg_func=algo.get("loss_agg_func", "token-mean"), kl_beta=float(algo.get("kl_beta", 0.0)),
        kl_penalty_type=algo.get("kl_penalty_type", "low_var_kl"), entropy_bonus=float(algo.get("entropy_bonus", 0.0)),
        temperature=_sampling(raw).temperature, mismatch_correction=correction, norm_constant=float(max_response_tokens))


def _actor(raw: dict, model_path: str, max_response_tokens: int, total_steps: int) -> ActorConfig:
    backend = _get(raw, "actor.training_backend", "fsdp")
    megatron = _megatron(raw, backend, model_path)
    optim, sched = _get(raw, "actor.optim", {}), _get(raw, "actor.lr_sched", {})
    try:
        optim_config = OptimConfig(total_steps=total_steps, **optim, **sched)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"actor.optim / actor.lr_sched: {exc}") from None
    algo = _get(raw, "algorithm", {})
    return ActorConfig(model_path=model_path, training_backend=backend, megatron=megatron,
                       optim=optim_config, loss=_policy_loss(raw, max_response_tokens),
                       ppo_epochs=int(algo.get("ppo_epochs", 1)), n_minibatches=int(algo.get("n_minibatches", 1)),
                       max_tokens_per_mbs=_get(raw, "runner.max_tokens_per_mbs"),
                       dtype=_precision(_get(raw, "actor.model.precision", "fp32"), "actor.model.precision"),
                       seed=int(_get(raw, "data.seed", 0)), forward_micro_batch_size=_forward_rows(raw),
                       offload=OffloadConfig(weights=bool(_get(raw, "actor.offload_weight", False)),
                                             grads=bool(_get(raw, "actor.offload_grad", False)),
                                             optimizer=bool(_get(raw, "actor.offload_optimizer", False))))


def _forward_rows(raw: dict) -> int | None:
    rows = _get(raw, "algorithm.logprob_forward_micro_batch_size")
    if rows is not None and int(rows) < 1:
        raise ConfigError(f"algorithm.logprob_forward_micro_batch_size must be >= 1 (or null for the token budget), "
                          f"got {rows}")
    return None if rows is None else int(rows)


def _inference(raw: dict, placement: Placement, *, recompute: bool, kl_beta: float) -> InferenceConfig:
    try:
        return InferenceConfig.from_placement(
            placement, recompute=recompute, kl_beta=kl_beta, group_name=_get(raw, "inference.group_name", "InferenceGroup"),
            load_from_actor=bool(_get(raw, "inference.load_from_actor", True)), forward_micro_batch_size=_forward_rows(raw))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _critic(raw: dict, actor: ActorConfig, *, max_steps: int) -> CriticConfig | None:
    """``critic`` when ``use_critic_model`` is true: it trains on the actor's batches, with its own optimizer."""
    if not _get(raw, "critic.use_critic_model", False):
        return None
    optim, sched = _get(raw, "critic.optim", {}), _get(raw, "critic.lr_sched", {})
    try:
        optim_config = OptimConfig(total_steps=actor.optim.total_steps, **{"lr": CRITIC_LR, **optim}, **sched)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"critic.optim / critic.lr_sched: {exc}") from None
    value_clip = float(_get(raw, "algorithm.value_clip", 0.5))
    if value_clip <= 0:
        raise ConfigError(f"algorithm.value_clip must be > 0, got {value_clip}")
    warmup = int(_get(raw, "critic.warmup_steps", 0))
    if not 0 <= warmup < max_steps:
        raise ConfigError(f"critic.warmup_steps must be in [0, runner.max_steps = {max_steps}), got {warmup}: "
                          "the actor trains only after it")
    return CriticConfig(
        model_path=_get(raw, "critic.model.model_path", actor.model_path), optim=optim_config, value_clip=value_clip,
        loss_agg_func=actor.loss.loss_agg_func, norm_constant=actor.loss.norm_constant, ppo_epochs=actor.ppo_epochs,
        n_minibatches=actor.n_minibatches, max_tokens_per_mbs=actor.max_tokens_per_mbs,
        dtype=_precision(_get(raw, "critic.model.precision", "fp32"), "critic.model.precision"), seed=actor.seed,
        warmup_steps=warmup, group_name=_get(raw, "critic.group_name", "CriticGroup"))


def _megatron(raw: dict, backend: str, model_path: str) -> MegatronConfig | None:
    """``actor.megatron`` and the Megatron-only ``actor.model`` keys: read by that backend, an error elsewhere.

    Only the config is checked here, so a GPU recipe validates on any machine; whether megatron-core
    and GPUs are there is checked when the run starts (``require_training_backend``)."""
    if backend not in TRAINING_BACKENDS:
        raise ConfigError(f"actor.training_backend: unknown {backend!r}; choose one of {sorted(TRAINING_BACKENDS)}")
    actor = _get(raw, "actor", {})
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


def _rollout(raw: dict, sampling: SamplingParams, *, recompute: bool) -> RolloutConfig:
    """``rollout``: which engine, from which weights, with how much memory. A key only another backend
    reads is an error, not a silent no-op."""
    section = _get(raw, "rollout", {})
    backend = section.get("rollout_backend", "hf")
    try:
        engine_factory(backend)
    except ValueError as exc:
        raise ConfigError(f"rollout.rollout_backend: {exc}") from None
    unread = [key for key in VLLM_ONLY_KEYS if key in section] if backend != "vllm" else []
    if unread:
        raise ConfigError(f"rollout.{unread[0]}: read by rollout_backend vllm only, and this run uses {backend}")
    if backend == "vllm" and not recompute and (sampling.top_k > 0 or sampling.top_p < 1):
        raise ConfigError("algorithm.recompute_logprobs: false needs top_k 0 and top_p 1 with rollout_backend vllm: "
                          "vLLM's log-probs are of the top-k/top-p filtered distribution, the trainer's are not")
    model = section.get("model") or {}
    precision = model.get("precision")
    try:
        return RolloutConfig(
            backend=backend, model_path=model.get("model_path") or "",
            dtype="auto" if precision is None else _precision(precision, "rollout.model.precision"),
            max_running_requests=int(section.get("max_running_requests", 64)),
            gpu_memory_utilization=float(section.get("gpu_memory_utilization", 0.5)),
            tensor_parallel_size=int(section.get("tensor_parallel_size", 1)))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _agent_loop(raw: dict, sampling: SamplingParams, *, max_response: int,
                retokenize: bool) -> tuple[SearchToolConfig, AgentLoopConfig]:
    """``tools.search`` and ``agentloop`` (with the sampling and token budgets every turn uses)."""
    try:
        search = SearchToolConfig(**_get(raw, "tools.search", {}))
        return search, AgentLoopConfig(
            max_turns=int(_get(raw, "agentloop.max_turns", 2)), max_tokens_per_turn=sampling.max_new_tokens,
            max_obs_tokens=int(_get(raw, "agentloop.max_tool_response_length", 500)),
            max_passage_tokens=int(_get(raw, "agentloop.max_passage_tokens", 150)), max_response_tokens=max_response,
            topk=search.topk, retokenize=retokenize, sampling=sampling)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _cluster(raw: dict, rollout_backend: str) -> tuple[ClusterConfig, Placement]:
    """``cluster`` and its placement, on the GPUs it declares (``num_gpus_per_node``) or its CPU slots."""
    try:
        cluster = ClusterConfig.from_dict(_get(raw, "cluster", {}))
        return cluster, validate_placement(cluster.component_placement, backends={"rollout": rollout_backend},
                                           topology=Topology.from_config(cluster), known_components=COMPONENTS)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _runner(raw: dict) -> RunnerConfig:
    runner = _get(raw, "runner", {})
    output_dir = runner.get("output_dir")
    if not output_dir:
        raise ConfigError("runner.output_dir is required")
    logger = runner.get("logger") or {}
    return RunnerConfig(
        output_dir=output_dir, experiment_name=runner.get("experiment_name", "run"),
        max_steps=int(runner.get("max_steps", 100)), max_epochs=int(runner.get("max_epochs", 1)),
        val_check_interval=int(runner.get("val_check_interval", 0)), save_interval=int(runner.get("save_interval", 0)),
        seq_length=int(runner.get("seq_length", 4096)), max_tokens_per_mbs=runner.get("max_tokens_per_mbs"),
        resume_dir=runner.get("resume_dir"), log_path=logger.get("log_path") or str(Path(output_dir) / "logs"),
        logger_backends=tuple(logger.get("logger_backends", ("console", "jsonl"))),
        project_name=logger.get("project_name", "rlinf-search"))


def _check_paths(paths: tuple[str, ...], key: str, *, required: bool) -> None:
    if required and not paths:
        raise ConfigError(f"{key}: give at least one prepared jsonl (python -m rlinf_search.data.prepare)")
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"{key}: file not found: {path}")


def validate_cfg(cfg: DictConfig | dict) -> RunConfig:
    """Check the whole config once; return its typed view. Raises ``ConfigError`` naming the key."""
    register_resolvers()
    raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    _apply_deprecations(raw)
    _check_keys(raw, SCHEMA, "")
    runner = _runner(raw)
    max_prompt = int(_get(raw, "data.max_prompt_length", 1024))
    if max_prompt >= runner.seq_length:
        raise ConfigError(f"data.max_prompt_length ({max_prompt}) must be < runner.seq_length ({runner.seq_length})")
    max_response = runner.seq_length - max_prompt
    model_path = _get(raw, "rollout.model.model_path")
    if not model_path:
        raise ConfigError("rollout.model.model_path is required")
    algo = _get(raw, "algorithm", {})
    group_size, batch = int(algo.get("group_size", 1)), int(_get(raw, "data.rollout_batch_size", 1))
    adv_type, minibatches = algo.get("adv_type", "grpo"), int(algo.get("n_minibatches", 1))
    if adv_type not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"algorithm.adv_type: unknown {adv_type!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}")
    if adv_type in ("grpo", "grpo_no_std", "rloo", "reinforce_plus_plus_baseline") and group_size < 2:
        raise ConfigError(f"algorithm.group_size must be >= 2 for {adv_type}: a group of one has advantage 0")
    use_critic = bool(_get(raw, "critic.use_critic_model", False))
    if adv_type == "gae" and not use_critic:
        raise ConfigError("algorithm.adv_type: gae needs critic.use_critic_model: true (GAE bootstraps from its values)")
    if use_critic and adv_type != "gae":
        raise ConfigError(f"critic.use_critic_model: true needs algorithm.adv_type: gae ({adv_type} never reads "
                          "the critic's values)")
    if (batch * group_size) % minibatches:
        raise ConfigError(f"data.rollout_batch_size * algorithm.group_size ({batch * group_size}) must divide "
                          f"into algorithm.n_minibatches ({minibatches})")
    retokenize = bool(_get(raw, "agentloop.retokenize", False))
    recompute = bool(algo.get("recompute_logprobs", True))
    if retokenize and not recompute:
        raise ConfigError("agentloop.retokenize: true needs algorithm.recompute_logprobs: true: re-tokenized ids "
                          "were never scored by the engine, so their old log-probs must be recomputed")
    score = _get(raw, "reward.score", "em")
    if score not in REWARDS:
        raise ConfigError(f"reward.score: unknown {score!r}; choose one of {sorted(REWARDS)}")
    sampling = _sampling(raw)
    rollout = _rollout(raw, sampling, recompute=recompute)
    search, agent_loop = _agent_loop(raw, sampling, max_response=max_response, retokenize=retokenize)
    cluster, placement = _cluster(raw, rollout.backend)
    train_paths = tuple(_get(raw, "data.train_data_paths", ()))
    val_paths = tuple(_get(raw, "data.val_data_paths", ()))
    _check_paths(train_paths, "data.train_data_paths", required=True)
    _check_paths(val_paths, "data.val_data_paths", required=False)
    steps_per_update = int(algo.get("ppo_epochs", 1)) * minibatches
    actor = _actor(raw, model_path, max_response, runner.max_steps * steps_per_update)
    return RunConfig(
        cluster=cluster, placement=placement, runner=runner, actor=actor,
        agent_loop=agent_loop, search=search, rollout=rollout, train_data_paths=train_paths,
        val_data_paths=val_paths, rollout_batch_size=batch, group_size=group_size, adv_type=adv_type,
        recompute_logprobs=recompute, shuffle=bool(_get(raw, "data.shuffle", True)),
        inference=_inference(raw, placement, recompute=recompute, kl_beta=actor.loss.kl_beta),
        seed=int(_get(raw, "data.seed", 0)), reward_score=score, reward_scale=float(_get(raw, "reward.reward_scale", 1.0)),
        normalize_advantages=bool(algo.get("normalize_advantages", True)), gamma=float(algo.get("gamma", 1.0)),
        lam=float(algo.get("lam", 1.0)), critic=_critic(raw, actor, max_steps=runner.max_steps))

