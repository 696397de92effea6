"""Section readers that a training run and an eval both use: sampling, the rollout engine, prompt limits,
the agent loop and its search tool, the cluster and its placement, the reward, data paths.

Each reads a parsed section (``config/model.py``, where every key's type, range and default are declared), returns
the typed view a worker is handed and raises ``ConfigError`` naming the key for a rule between keys.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from rlinf_search.agents import AGENT_PROTOCOLS
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.toolcall.tool_config import (
    ListedTool,
    ToolConfigError,
    read_tool_config,
)
from rlinf_search.agents.tools import TOOLS
from rlinf_search.agents.tools.search_function import SearchFunction
from rlinf_search.config.file_checks import FileChecks
from rlinf_search.config.model import (
    EvalConfigFile,
    EvalDataSection,
    RewardSection,
    RolloutSection,
    SamplingSection,
)
from rlinf_search.config.precision import dtype_name
from rlinf_search.config.readers import entry_settings
from rlinf_search.config.schema import ConfigError
from rlinf_search.config.tools import extra_tools
from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.data.prompt_tokens import PromptLimit
from rlinf_search.rewards import REWARDS
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import (
    Backend,
    Placement,
    Topology,
    validate_placement,
)
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.base import ROLLOUT_ENGINES, engine_factory, traits_of
from rlinf_search.workers.rollout.config import RolloutConfig

# Components a placement may name (the agent loop runs inside the rollout group, so it is not one).
COMPONENTS = frozenset({"actor", "rollout", "reward", "inference"})

log = logging.getLogger(__name__)


def sampling_params(section: SamplingSection) -> SamplingParams:
    """``algorithm.sampling_params``: how every turn samples."""
    if section.do_sample and section.temperature <= 0:
        raise ConfigError("algorithm.sampling_params.temperature must be > 0 when do_sample is true")
    return SamplingParams(max_new_tokens=section.max_new_tokens, temperature=section.temperature, top_p=section.top_p,
                          greedy=not section.do_sample, top_k=section.top_k)


def rollout_config(section: RolloutSection, sampling: SamplingParams, *, recompute: bool) -> RolloutConfig:
    """``rollout``: which engine, from which weights, with how much memory. A key only another backend
    reads is an error, not a silent no-op. ``recompute``: whether the trainer recomputes old log-probs
    (else it trains on the engine's, which vLLM filters by top-k/top-p)."""
    backend = section.rollout_backend
    try:
        traits = traits_of(backend)
    except ValueError as exc:
        raise ConfigError(f"rollout.rollout_backend: {exc}") from None
    owners: dict[str, list[str]] = {}  # a registered engine's own key -> the engines that read it
    for name in ROLLOUT_ENGINES.names():
        for key in traits_of(name).own_keys:
            owners.setdefault(key, []).append(name)
    unread = [key for key in owners if key not in traits.own_keys and key in section.model_fields_set]
    if unread:
        raise ConfigError(f"rollout.{unread[0]}: read by rollout_backend {' or '.join(owners[unread[0]])} only, and "
                          f"this run uses {backend}")
    if traits.filtered_logprobs and not recompute and (sampling.top_k > 0 or sampling.top_p < 1):
        raise ConfigError(f"algorithm.recompute_logprobs: false needs top_k 0 and top_p 1 with rollout_backend "
                          f"{backend}: its log-probs are of the top-k/top-p filtered distribution, the trainer's are "
                          "not")
    settings = entry_settings(section.engine_settings, engine_factory(backend), "rollout.engine_settings",
                              name=f"rollout_backend {backend}")
    if section.tensor_parallel_size != 1:
        # A rank sees only its own device (CUDA_VISIBLE_DEVICES), so an engine cannot span several;
        # Qwen2.5-3B fits one GPU, and 8 GPUs run 8 data-parallel engines instead.
        raise ConfigError(f"rollout.tensor_parallel_size: only 1 is supported (one engine per device), "
                          f"got {section.tensor_parallel_size}")
    precision = section.model.precision
    return RolloutConfig(
        backend=backend, model_path=section.model.model_path, dtype=dtype_name(precision) if precision else "auto",
        max_running_requests=section.max_running_requests, gpu_memory_utilization=section.gpu_memory_utilization,
        tensor_parallel_size=section.tensor_parallel_size,
        update_weights_bucket_megabytes=section.update_weights_bucket_megabytes, seeded=section.seeded,
        engine_settings=settings)


def prompt_limit(data: EvalDataSection, *, seq_length: int) -> PromptLimit:
    """``data.max_prompt_length`` (below ``runner.seq_length``), ``data.filter_overlong_prompts`` and
    ``data.truncation``: verl's keys, with the same meaning."""
    if data.max_prompt_length >= seq_length:
        raise ConfigError(f"data.max_prompt_length ({data.max_prompt_length}) must be < runner.seq_length "
                          f"({seq_length})")
    return PromptLimit(max_prompt_tokens=data.max_prompt_length, filter_overlong=data.filter_overlong_prompts,
                       truncation=data.truncation, apply_chat_template=data.apply_chat_template)


def agent_loop(cfg: EvalConfigFile, sampling: SamplingParams, *, limit: PromptLimit, seq_length: int,
               files: FileChecks | None = None) -> tuple[SearchToolConfig, AgentLoopConfig]:
    """``tools.search`` and ``agentloop`` (with the sampling, the token budgets every turn uses, and
    ``data.apply_chat_template``, which decides how the prompt is tokenized). ``files``: whether the tool config
    file is read (default: yes)."""
    section = (cfg.tools or {}).get("search") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"tools.search: expected a section of keys, got {type(section).__name__}")
    section, tool_schema, listed = _with_tool_config(section, files or FileChecks())
    try:
        search = SearchToolConfig.from_dict(section)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    protocol = cfg.agent.protocol
    try:
        loop_class = AGENT_PROTOCOLS.resolve(protocol, key="agent.protocol")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    protocol_settings = entry_settings(cfg.agent.protocol_settings, loop_class, "agent.protocol_settings",
                                       name=f"protocol {protocol}")
    if protocol == "toolcall" and not limit.apply_chat_template:
        raise ConfigError("agent.protocol: toolcall renders the tool schema through the chat template; it needs "
                          "data.apply_chat_template: true")
    loop = cfg.agentloop
    return search, AgentLoopConfig(
        max_turns=loop.max_turns, max_obs_tokens=loop.max_tool_response_length,
        max_passage_tokens=loop.max_passage_tokens, infra_reruns=loop.infra_reruns,
        infra_rerun_wait_s=loop.infra_rerun_wait_s, retokenize=loop.retokenize,
        max_tokens_per_turn=sampling.max_new_tokens, max_response_tokens=seq_length - limit.max_prompt_tokens,
        topk=search.topk, apply_chat_template=limit.apply_chat_template, max_prompt_tokens=limit.max_prompt_tokens,
        truncation=limit.truncation, sampling=sampling, protocol=protocol, protocol_settings=protocol_settings,
        tool_schema=tool_schema,
        tools=extra_tools(cfg.tools, protocol=protocol, search_addr=search.server_addrs[0], listed=listed,
                          listed_in=section.get("tool_config")))


def with_offered_tools(limit: PromptLimit, loop: AgentLoopConfig) -> PromptLimit:
    """``limit`` measuring prompts with the tool schema the ``toolcall`` loop renders into them."""
    if loop.protocol != "toolcall":
        return limit
    extra = tuple(TOOLS.resolve(spec.factory).schema for spec in loop.tools)
    return replace(limit, tools=(SearchFunction.from_schema(loop.tool_schema).schema, *extra))


def _with_tool_config(section: dict, files: FileChecks) -> tuple[dict, dict | None, tuple[ListedTool, ...]]:
    """``tools.search`` with what ``tools.search.tool_config`` (a verl tool config or an rllm schema file) sets
    applied over it, the search function's schema from that file (None without one), and the file's other
    tools. The file wins: it is what the run was pointed at; each key it changes is logged."""
    section = dict(section)
    path = section.get("tool_config")
    if not path:
        return section, None, ()
    if not isinstance(path, str):  # read before the section's own declarations are checked
        raise ConfigError(f"tools.search.tool_config: expected a string, got {path!r}")
    if not files.enabled:
        files.skip("tools.search.tool_config", f"{path} not read (the settings and tool schema it sets)")
        section.pop("tool_config")
        return section, None, ()
    try:
        found = read_tool_config(path)
    except ToolConfigError as exc:
        raise ConfigError(str(exc)) from None
    for key, value in found.search_settings.items():
        if section.get(key) not in (None, value):
            log.info("tools.search.%s: %r from %s replaces %r", key, value, path, section[key])
        section[key] = value
    return section, found.function.schema, found.listed


def cluster_placement(section: dict | None, rollout_backend: str) -> tuple[ClusterConfig, Placement]:
    """``cluster`` and its placement, on the GPUs it declares (``num_gpus_per_node``) or its CPU slots."""
    try:
        cluster = ClusterConfig.from_dict(section or {})
        rollout = Backend(rollout_backend, traits_of(rollout_backend).offloads_on)
        return cluster, validate_placement(cluster.component_placement, backends={"rollout": rollout},
                                           topology=Topology.from_config(cluster), known_components=COMPONENTS)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def require_placed(placement: Placement, components: tuple[str, ...], *, run: str) -> None:
    """Every one of ``components`` has devices in ``cluster.component_placement``, or a ConfigError."""
    for component in components:
        if component not in placement.components:
            raise ConfigError(f"cluster.component_placement: {run} places {', '.join(components)} (e.g. "
                              f"'{','.join(components)}: all'); {component} is missing")


def data_paths(paths: tuple[str, ...], key: str, *, required: bool,
               files: FileChecks | None = None) -> tuple[str, ...]:
    """The prepared jsonl files ``paths`` of ``key`` (``data.train_data_paths``, ``data.val_data_paths``), each
    one checked to exist unless ``files`` says not to."""
    if required and not paths:
        raise ConfigError(f"{key}: give at least one prepared jsonl (python -m rlinf_search.data.prepare)")
    if files is not None and not files.enabled:
        if paths:
            read = "that each exists; the training set's size" if key == "data.train_data_paths" else "that each exists"
            files.skip(key, f"{', '.join(paths)} not opened ({read})")
        return paths
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"{key}: file not found: {path}")
    return paths


def reward_config(section: RewardSection) -> RewardConfig:
    """``reward``: the score, checked to resolve, its own settings (``reward.score_settings``) and its scale
    (``reward.reward_type``, the one reward family, is declared)."""
    try:
        score = REWARDS.resolve(section.score, key="reward.score")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RewardConfig(score=section.score, scale=section.reward_scale, score_settings=entry_settings(
        section.score_settings, score, "reward.score_settings", name=f"score {section.score}"))
