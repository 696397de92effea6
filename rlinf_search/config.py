"""Config: the YAML RLinf users know, checked once at start-up and handed out as typed views.

``validate_cfg(cfg)`` rejects unknown keys and every broken cross-field rule with the key's path,
before any worker starts; renamed keys are accepted with a one-line deprecation message. Workers
get dataclasses (``RunConfig`` and its parts), never the raw config. The accepted keys (``SCHEMA``)
and the readers of the raw dict are in ``config_schema.py``; the actor's and critic's views are built
in ``config_update.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlinf_search.agents.searchr1.loop import AgentLoopConfig
from rlinf_search.algorithms import ADVANTAGE_ESTIMATORS
from rlinf_search.config_schema import (
    DEPRECATED_KEYS,
    REMOVED_KEYS,
    SCHEMA,
    ConfigError,
    apply_deprecations,
    check_keys,
    get,
    get_bool,
    get_float,
    get_int,
    get_precision,
    get_registered,
)
from rlinf_search.config_rlinf import adapt_rlinf_config, is_rlinf_config
from rlinf_search.config_update import actor_config, critic_config, forward_rows
from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.data.prepare import count_records
from rlinf_search.data.prompt_tokens import TRUNCATIONS, PromptLimit
from rlinf_search.rewards import REWARDS
from rlinf_search.runners.metric_logger import check_backends
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Placement, Topology, validate_placement
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.inference.config import InferenceConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.base import engine_factory
from rlinf_search.workers.rollout.config import VLLM_ONLY_KEYS, RolloutConfig

log = logging.getLogger(__name__)

__all__ = ["ConfigError", "DEPRECATED_KEYS", "REMOVED_KEYS", "SCHEMA", "RunConfig", "RunnerConfig",
           "register_resolvers", "validate_cfg"]


def register_resolvers() -> None:
    """The resolvers RLinf configs use: arithmetic (``${subtract:${runner.seq_length},128}``) and ``not``
    (``return_logprobs: ${not:${algorithm.recompute_logprobs}}``)."""
    resolvers = {"subtract": lambda a, b: a - b, "add": lambda a, b: a + b,
                 "multiply": lambda a, b: a * b, "int_div": lambda a, b: int(a) // int(b),
                 "not": lambda value: not bool(value)}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def resolve_raw(cfg: DictConfig | dict, *, schema: dict) -> dict:
    """The config as a plain dict with every interpolation resolved, RLinf's keys mapped onto ours
    (``config_rlinf``) and deprecated keys renamed. An OmegaConf error (an unknown resolver, a missing
    key in ``${...}``) becomes a one-line ``ConfigError`` naming the key."""
    register_resolvers()
    try:
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{key}: {message}" if key else message) from None
    if is_rlinf_config(raw):
        adapt_rlinf_config(raw, schema=schema, training_schema=SCHEMA)
        _use_local_gpus(raw)
    apply_deprecations(raw)
    return raw


def _use_local_gpus(raw: dict) -> None:
    """RLinf places components on the GPUs Ray finds; so does an RLinf config here when it does not say
    ``cluster.num_gpus_per_node`` (on a machine without GPUs the placement stays on CPU slots)."""
    cluster = raw.setdefault("cluster", {})
    if cluster.get("num_gpus_per_node") is None:
        import torch

        if torch.cuda.is_available():
            cluster["num_gpus_per_node"] = torch.cuda.device_count()
            log.warning("cluster.num_gpus_per_node: %d (the GPUs of this node)", cluster["num_gpus_per_node"])


# Components a placement may name (the agent loop runs inside the rollout group, so it is not one).
COMPONENTS = frozenset({"actor", "rollout", "reward", "inference"})
# Components a training run must place.
TRAINING_COMPONENTS = ("actor", "rollout", "reward")
# The one task this trainer runs, and the one reward family (``reward.score`` picks the variant).
TASK_TYPES = ("searchr1",)
REWARD_TYPES = ("searchr1",)


@dataclass(frozen=True)
class RunnerConfig:
    """``runner``: how long to train, when to validate and save, where outputs go."""

    output_dir: str
    """Root of the run's outputs (checkpoints, logs, eval)."""
    experiment_name: str = "run"
    """The run's name in the metric sinks (the W&B run name): ``runner.logger.experiment_name``, else
    ``runner.experiment_name``."""
    max_steps: int | None = 100
    """Training steps (rollout + update) to run; the run stops at ``max_epochs`` first if that comes first.
    None (written ``-1``, as RLinf and verl do): no step limit, ``max_epochs`` decides."""
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
    """Metric sinks (names and their packages checked by ``validate_cfg``)."""
    project_name: str = "rlinf-search"
    """W&B project."""
    rollout_dump: int = 0
    """Trajectories of each step written to ``output_dir/rollouts/step_K.jsonl`` (and, when > 0, every
    validation trajectory to ``val_step_K.jsonl``); 0: none."""


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, validated."""

    cluster: ClusterConfig
    """``cluster``: nodes, CPU slots, Ray address."""
    placement: Placement
    """``cluster.component_placement`` resolved to devices and ranks (actor, rollout and reward are placed)."""
    runner: RunnerConfig
    """``runner``: steps, intervals, outputs, logging."""
    total_steps: int
    """Training steps the run lasts: ``runner.max_steps``, or fewer when ``runner.max_epochs`` passes over
    the training prompts end it first (an epoch is ``prompts // rollout_batch_size`` steps)."""
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
    prompt_limit: PromptLimit
    """``data.max_prompt_length`` and what overlong prompts get (dropped at start-up, refused or cut)."""
    reward: RewardConfig
    """``reward``: the RewardGroup's own section."""
    actor_group: str = "ActorGroup"
    """``actor.group_name``: the name the actor's worker group is launched under (logs, errors)."""
    rollout_group: str = "RolloutGroup"
    """``rollout.group_name``: the rollout workers' group, which also runs the agent loop."""
    reward_group: str = "RewardGroup"
    """``reward.group_name``: the reward workers' group."""
    normalize_advantages: bool = True
    """``algorithm.normalize_advantages``."""
    gamma: float = 1.0
    """Discount (REINFORCE++, GAE)."""
    lam: float = 1.0
    """GAE lambda."""
    critic: CriticConfig | None = None
    """The value model for GAE (``critic`` with ``use_critic_model: true``); None without one."""
    settings: dict = field(default_factory=dict)
    """The config as validated (interpolations resolved, RLinf keys mapped): the run's record, saved as
    ``output_dir/config.yaml`` and handed to W&B and TensorBoard. Workers never read it."""


def _sampling(raw: dict) -> SamplingParams:
    key = "algorithm.sampling_params."
    greedy = not get_bool(raw, key + "do_sample", True)
    temperature = get_float(raw, key + "temperature", 1.0)
    if not greedy and temperature <= 0:
        raise ConfigError("algorithm.sampling_params.temperature must be > 0 when do_sample is true")
    top_p = get_float(raw, key + "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ConfigError(f"algorithm.sampling_params.top_p must be in (0, 1], got {top_p}")
    return SamplingParams(max_new_tokens=get_int(raw, key + "max_new_tokens", 500, minimum=1),
                          temperature=temperature, top_p=top_p, top_k=get_int(raw, key + "top_k", 0), greedy=greedy)


def _inference(raw: dict, placement: Placement, *, recompute: bool, kl_beta: float, group_name: str) -> InferenceConfig:
    try:
        return InferenceConfig.from_placement(
            placement, recompute=recompute, kl_beta=kl_beta, group_name=group_name,
            load_from_actor=get_bool(raw, "inference.load_from_actor", True),
            forward_micro_batch_size=forward_rows(raw))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _rollout(raw: dict, sampling: SamplingParams, *, recompute: bool) -> RolloutConfig:
    """``rollout``: which engine, from which weights, with how much memory. A key only another backend
    reads is an error, not a silent no-op."""
    backend = get(raw, "rollout.rollout_backend", "hf")
    try:
        engine_factory(backend)
    except ValueError as exc:
        raise ConfigError(f"rollout.rollout_backend: {exc}") from None
    unread = [key for key in VLLM_ONLY_KEYS if get(raw, f"rollout.{key}") is not None] if backend != "vllm" else []
    if unread:
        raise ConfigError(f"rollout.{unread[0]}: read by rollout_backend vllm only, and this run uses {backend}")
    if backend == "vllm" and not recompute and (sampling.top_k > 0 or sampling.top_p < 1):
        raise ConfigError("algorithm.recompute_logprobs: false needs top_k 0 and top_p 1 with rollout_backend vllm: "
                          "vLLM's log-probs are of the top-k/top-p filtered distribution, the trainer's are not")
    try:
        return RolloutConfig(
            backend=backend, model_path=str(get(raw, "rollout.model.model_path", "")),
            dtype=get_precision(raw, "rollout.model.precision", None) or "auto",
            max_running_requests=get_int(raw, "rollout.max_running_requests", 64),
            gpu_memory_utilization=get_float(raw, "rollout.gpu_memory_utilization", 0.5),
            tensor_parallel_size=get_int(raw, "rollout.tensor_parallel_size", 1))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def prompt_limit(raw: dict, *, seq_length: int) -> PromptLimit:
    """``data.max_prompt_length`` (below ``runner.seq_length``), ``data.filter_overlong_prompts`` and
    ``data.truncation``: verl's keys, with the same meaning."""
    max_prompt = get_int(raw, "data.max_prompt_length", 1024, minimum=1)
    if max_prompt >= seq_length:
        raise ConfigError(f"data.max_prompt_length ({max_prompt}) must be < runner.seq_length ({seq_length})")
    truncation = get(raw, "data.truncation", "error")
    if truncation not in TRUNCATIONS:
        raise ConfigError(f"data.truncation: unknown {truncation!r}; choose one of {', '.join(TRUNCATIONS)}")
    return PromptLimit(max_prompt_tokens=max_prompt, truncation=truncation,
                       filter_overlong=get_bool(raw, "data.filter_overlong_prompts", False),
                       apply_chat_template=get_bool(raw, "data.apply_chat_template", True))


def _agent_loop(raw: dict, sampling: SamplingParams, *, limit: PromptLimit, seq_length: int,
                retokenize: bool) -> tuple[SearchToolConfig, AgentLoopConfig]:
    """``tools.search`` and ``agentloop`` (with the sampling, the token budgets every turn uses, and
    ``data.apply_chat_template``, which decides how the prompt is tokenized)."""
    section = get(raw, "tools.search", {})
    if not isinstance(section, dict):
        raise ConfigError(f"tools.search: expected a section of keys, got {type(section).__name__}")
    try:
        search = SearchToolConfig.from_dict(section)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        return search, AgentLoopConfig(
            max_turns=get_int(raw, "agentloop.max_turns", 2, minimum=0), max_tokens_per_turn=sampling.max_new_tokens,
            max_obs_tokens=get_int(raw, "agentloop.max_tool_response_length", 500, minimum=1),
            max_passage_tokens=get_int(raw, "agentloop.max_passage_tokens", 150, minimum=1),
            max_response_tokens=seq_length - limit.max_prompt_tokens, topk=search.topk, retokenize=retokenize,
            apply_chat_template=limit.apply_chat_template, max_prompt_tokens=limit.max_prompt_tokens,
            truncation=limit.truncation, sampling=sampling)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _cluster(raw: dict, rollout_backend: str) -> tuple[ClusterConfig, Placement]:
    """``cluster`` and its placement, on the GPUs it declares (``num_gpus_per_node``) or its CPU slots."""
    try:
        cluster = ClusterConfig.from_dict(get(raw, "cluster", {}))
        return cluster, validate_placement(cluster.component_placement, backends={"rollout": rollout_backend},
                                           topology=Topology.from_config(cluster), known_components=COMPONENTS)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def require_placed(placement: Placement, components: tuple[str, ...], *, run: str) -> None:
    """Every one of ``components`` has devices in ``cluster.component_placement``, or a ConfigError."""
    for component in components:
        if component not in placement.components:
            raise ConfigError(f"cluster.component_placement: {run} places {', '.join(components)} (e.g. "
                              f"'{','.join(components)}: all'); {component} is missing")


def _runner(raw: dict) -> RunnerConfig:
    output_dir = get(raw, "runner.output_dir")
    if not output_dir:
        raise ConfigError("runner.output_dir is required")
    task = get(raw, "runner.task_type", TASK_TYPES[0])
    if task not in TASK_TYPES:
        raise ConfigError(f"runner.task_type: unknown {task!r}; this trainer runs {', '.join(TASK_TYPES)} only")
    backends = get(raw, "runner.logger.logger_backends", ["console", "jsonl"])
    if not isinstance(backends, (list, tuple)):
        raise ConfigError(f"runner.logger.logger_backends: expected a list of sink names, got {backends!r}")
    try:
        check_backends(backends)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RunnerConfig(
        output_dir=str(output_dir),
        experiment_name=str(get(raw, "runner.logger.experiment_name", get(raw, "runner.experiment_name", "run"))),
        max_steps=_max_steps(raw),
        max_epochs=get_int(raw, "runner.max_epochs", 1, minimum=1),
        val_check_interval=get_int(raw, "runner.val_check_interval", 0, minimum=0),
        save_interval=get_int(raw, "runner.save_interval", 0, minimum=0),
        seq_length=get_int(raw, "runner.seq_length", 4096, minimum=2),
        max_tokens_per_mbs=get_int(raw, "runner.max_tokens_per_mbs", None, minimum=1),
        resume_dir=get(raw, "runner.resume_dir"),
        log_path=str(get(raw, "runner.logger.log_path", Path(output_dir) / "logs")), logger_backends=tuple(backends),
        project_name=str(get(raw, "runner.logger.project_name", "rlinf-search")),
        rollout_dump=get_int(raw, "runner.rollout_dump", 0, minimum=0))


def _max_steps(raw: dict) -> int | None:
    """``runner.max_steps``: a step count, or -1 for none (``max_epochs`` then ends the run)."""
    steps = get_int(raw, "runner.max_steps", 100)
    if steps == -1:
        return None
    if steps < 1:
        raise ConfigError(f"runner.max_steps must be >= 1, or -1 to let runner.max_epochs end the run; got {steps}")
    return steps


def _check_paths(paths: tuple[str, ...], key: str, *, required: bool) -> None:
    if required and not paths:
        raise ConfigError(f"{key}: give at least one prepared jsonl (python -m rlinf_search.data.prepare)")
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"{key}: file not found: {path}")


def _total_steps(runner: RunnerConfig, train_paths: tuple[str, ...], batch: int) -> int:
    """``runner.max_steps``, or fewer when ``max_epochs`` passes over the prompts come first. An epoch is
    ``prompts // batch`` steps, as the runner's ``PromptStream`` drops an incomplete last batch."""
    prompts = sum(count_records(path) for path in train_paths)
    if prompts < batch:
        raise ConfigError(f"data.rollout_batch_size ({batch}) is larger than the training set ({prompts} prompts "
                          "in data.train_data_paths)")
    epoch_steps = runner.max_epochs * (prompts // batch)
    return epoch_steps if runner.max_steps is None else min(runner.max_steps, epoch_steps)


def _group_names(raw: dict) -> dict[str, str]:
    """Each component's worker-group name (``<component>.group_name``); two groups may not share one."""
    defaults = {"actor": "ActorGroup", "rollout": "RolloutGroup", "reward": "RewardGroup",
                "inference": "InferenceGroup", "critic": "CriticGroup"}
    names, owner = {}, {}
    for component, default in defaults.items():
        name = names[component] = str(get(raw, f"{component}.group_name", default))
        if name in owner:
            raise ConfigError(f"{component}.group_name: {name!r} is {owner[name]}.group_name too; each worker "
                              "group needs its own name")
        owner[name] = component
    return names


def _batching(raw: dict) -> tuple[int, int, str]:
    """(``algorithm.group_size``, ``data.rollout_batch_size``, ``algorithm.adv_type``), checked together."""
    group_size = get_int(raw, "algorithm.group_size", 4, minimum=1)  # RLinf's Search-R1 recipe uses 4
    batch = get_int(raw, "data.rollout_batch_size", 1, minimum=1)
    minibatches = get_int(raw, "algorithm.n_minibatches", 1, minimum=1)
    adv_type = get_registered(raw, "algorithm.adv_type", "grpo", ADVANTAGE_ESTIMATORS)
    if adv_type in ("grpo", "grpo_no_std", "rloo", "reinforce_plus_plus_baseline") and group_size < 2:
        raise ConfigError(f"algorithm.group_size must be >= 2 for {adv_type}: a group of one has advantage 0")
    use_critic = get_bool(raw, "critic.use_critic_model", False)
    if adv_type == "gae" and not use_critic:
        raise ConfigError("algorithm.adv_type: gae needs critic.use_critic_model: true (GAE bootstraps from its "
                          "values)")
    if use_critic and adv_type != "gae":
        raise ConfigError(f"critic.use_critic_model: true needs algorithm.adv_type: gae ({adv_type} never reads "
                          "the critic's values)")
    if (batch * group_size) % minibatches:
        raise ConfigError(f"data.rollout_batch_size * algorithm.group_size ({batch * group_size}) must divide "
                          f"into algorithm.n_minibatches ({minibatches})")
    return group_size, batch, adv_type


def reward_settings(raw: dict) -> RewardConfig:
    """``reward.score`` and ``reward.reward_scale``; ``reward.reward_type`` names the one reward family."""
    reward_type = get(raw, "reward.reward_type", REWARD_TYPES[0])
    if reward_type not in REWARD_TYPES:
        raise ConfigError(f"reward.reward_type: unknown {reward_type!r}; choose {', '.join(REWARD_TYPES)} "
                          "(reward.score picks the variant)")
    return RewardConfig(score=get_registered(raw, "reward.score", RewardConfig.score, REWARDS),
                        scale=get_float(raw, "reward.reward_scale", RewardConfig.scale))


def validate_cfg(cfg: DictConfig | dict) -> RunConfig:
    """Check the whole config once; return its typed view. Raises ``ConfigError`` naming the key."""
    raw = resolve_raw(cfg, schema=SCHEMA)
    check_keys(raw, SCHEMA, "")
    runner = _runner(raw)
    limit = prompt_limit(raw, seq_length=runner.seq_length)
    max_prompt = limit.max_prompt_tokens
    model_path = get(raw, "rollout.model.model_path")
    if not model_path:
        raise ConfigError("rollout.model.model_path is required")
    group_size, batch, adv_type = _batching(raw)
    retokenize = get_bool(raw, "agentloop.retokenize", False)
    recompute = get_bool(raw, "algorithm.recompute_logprobs", True)
    if retokenize and not recompute:
        raise ConfigError("agentloop.retokenize: true needs algorithm.recompute_logprobs: true: re-tokenized ids "
                          "were never scored by the engine, so their old log-probs must be recomputed")
    groups = _group_names(raw)
    sampling = _sampling(raw)
    rollout = _rollout(raw, sampling, recompute=recompute)
    search, agent_loop = _agent_loop(raw, sampling, limit=limit, seq_length=runner.seq_length, retokenize=retokenize)
    cluster, placement = _cluster(raw, rollout.backend)
    require_placed(placement, TRAINING_COMPONENTS, run="a training run")
    train_paths = tuple(get(raw, "data.train_data_paths", ()))
    val_paths = tuple(get(raw, "data.val_data_paths", ()))
    _check_paths(train_paths, "data.train_data_paths", required=True)
    _check_paths(val_paths, "data.val_data_paths", required=False)
    total_steps = _total_steps(runner, train_paths, batch)
    actor = actor_config(raw, model_path=model_path, max_response_tokens=runner.seq_length - max_prompt,
                         temperature=sampling.temperature, run_steps=total_steps)
    return RunConfig(
        cluster=cluster, placement=placement, runner=runner, total_steps=total_steps, actor=actor,
        agent_loop=agent_loop, search=search, rollout=rollout, train_data_paths=train_paths,
        val_data_paths=val_paths, rollout_batch_size=batch, group_size=group_size, adv_type=adv_type,
        recompute_logprobs=recompute, shuffle=get_bool(raw, "data.shuffle", True),
        inference=_inference(raw, placement, recompute=recompute, kl_beta=actor.loss.kl_beta,
                             group_name=groups["inference"]),
        seed=get_int(raw, "data.seed", 0), prompt_limit=limit, reward=reward_settings(raw), actor_group=groups["actor"],
        rollout_group=groups["rollout"], reward_group=groups["reward"],
        normalize_advantages=get_bool(raw, "algorithm.normalize_advantages", True),
        gamma=get_float(raw, "algorithm.gamma", 1.0), lam=get_float(raw, "algorithm.lam", 1.0),
        critic=critic_config(raw, actor, total_steps=total_steps, group_name=groups["critic"]), settings=raw)
