"""The accepted keys of the training config (``SCHEMA``), renamed and removed keys, and the key and value checks.

``SCHEMA`` declares each key with the type and range of its value (``key_declarations.py``). Most keys are declared on
the field of the view they fill, with their default (``VIEW_SECTIONS``; ``section_tree`` makes their part of the tree);
the rest are written here, and their defaults are the field defaults of the views their readers fill
(``config/training.py``, ``config/sections.py`` say which).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.config.run_config import RunConfig
from rlinf_search.config.runner import RunnerConfig
from rlinf_search.data.prompt_tokens import PromptLimit
from rlinf_search.distill.config import DistillConfig, TeacherConfig
from rlinf_search.key_declarations import (
    BOOL,
    PRECISION,
    STR,
    STRS,
    Choice,
    Float,
    Int,
    Key,
    ValueOutOfRange,
    field_keys,
    leaves,
    merged,
    section_tree,
)
from rlinf_search.key_declarations import check_values as _check_values
from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.actor.config import LR_SCHED_KEYS, ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.megatron.config import MODEL_KEYS as MEGATRON_MODEL_KEYS
from rlinf_search.workers.actor.megatron.config import CheckpointConverterConfig, MegatronConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.config import RolloutConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value or combination that cannot run; the message starts with the key's path."""


def check_values(raw: dict, schema: dict) -> None:
    """``ConfigError`` (one line: the key, the value, its type or range) for the first declared value that does not
    fit its ``Key``."""
    try:
        _check_values(raw, schema)
    except ValueOutOfRange as exc:
        raise ConfigError(str(exc)) from None


# Every key the code reads, each declared once with what its value may be (``key_declarations.py``); a key outside this
# tree is a typo or a dead setting, and an error. A "*" section is checked by the reader named beside it.
_OPTIM = {name: key for name, key in field_keys(OptimConfig) if name not in LR_SCHED_KEYS}
_LR_SCHED = {name: key for name, key in field_keys(OptimConfig) if name in LR_SCHED_KEYS}
TASK_TYPES = ("searchr1",)
"""``runner.task_type``: the one task this trainer runs."""
PIPELINES = ("sync", "overlap", "stream", "async")
"""``runner.pipeline``: how a step's rollout and update overlap (``config/pipeline.py``)."""
REWARD_TYPES = ("searchr1",)
"""``reward.reward_type``: the one reward family (``reward.score`` picks the variant)."""
SCHEMA: dict[str, Any] = merged(section_tree(ActorConfig), section_tree(RunConfig), {
    "hydra": "*",
    "cluster": "*",  # checked by ClusterConfig.from_dict
    "runner": section_tree(RunnerConfig, also={
        "task_type": Choice(*TASK_TYPES), "pipeline": Choice(*PIPELINES), "max_staleness": Int(ge=1),
        "partial_rollout": BOOL, "logger.experiment_name": STR}),
    # PolicyLossConfig's fields; ActorConfig declares ppo_epochs, n_minibatches, shuffle_rollout and the forward rows
    "algorithm": section_tree(PolicyLossConfig, also={
        "ratio_clip_eps": Float(gt=0, lt=1), "value_clip": Float(gt=0),
        "policy_loss_settings": "*",  # checked by the loss's own settings model (plugin_settings.read_settings)
        "adv_settings": "*",  # checked by the advantage estimator's own settings model
        "sampling_params": {"do_sample": BOOL, "temperature": Float(ge=0, relation="> 0 when do_sample"),
                            "top_k": Int(ge=0, also=((-1, "off, as vLLM writes it"),)), "top_p": Float(gt=0, le=1),
                            "max_new_tokens": Int(ge=1)},
        # DistillConfig's declared fields; the teacher is checked by TeacherConfig.from_dict
        "distill.enable": BOOL, **{f"distill.{name}": key for name, key in field_keys(DistillConfig)},
        "distill.teacher": "*"}),
    "agentloop": section_tree(AgentLoopConfig),
    "agent": {"protocol": STR, "protocol_settings": "*"},  # checked by the protocol's own settings model
    # search: checked by SearchToolConfig.from_dict (tool_config: config/sections.py); others: config/tools.py
    "tools": "*",
    "rollout": section_tree(RolloutConfig, also={"engine_settings": "*"}),  # checked by the engine's own model
    "inference": {"group_name": STR, "load_from_actor": BOOL},
    "data": section_tree(PromptLimit, also={"train_data_paths": STRS, "val_data_paths": STRS}),
    # the keys ActorConfig's fields do not declare (they declare theirs from the top: section_tree(ActorConfig) below)
    "actor": {
        # read by the megatron backend only: MegatronConfig's fields named in its MODEL_KEYS
        "model": {name: key for name, key in field_keys(MegatronConfig) if name in MEGATRON_MODEL_KEYS},
        "megatron": {"use_hf_ckpt": BOOL,
                     **{name: key for name, key in field_keys(MegatronConfig) if name not in MEGATRON_MODEL_KEYS},
                     "ckpt_convertor": dict(field_keys(CheckpointConverterConfig))},
        "offload_weight": BOOL, "offload_grad": BOOL, "offload_optimizer": BOOL,
        "optim": dict(_OPTIM), "lr_sched": dict(_LR_SCHED)},
    "reward": section_tree(RewardConfig, also={"reward_type": Choice(*REWARD_TYPES),
                                               "score_settings": "*"}),  # checked by the score's own settings model
    "monitors": section_tree(MonitorsConfig),
    "critic": {"use_critic_model": BOOL, "group_name": STR, "warmup_steps": Int(ge=0, relation="< the run's steps"),
               "model": {"model_path": STR, "precision": PRECISION},
               "optim": dict(_OPTIM), "lr_sched": dict(_LR_SCHED)},
})
VIEW_SECTIONS = (("", ActorConfig), ("", RunConfig), ("algorithm", PolicyLossConfig), ("runner", RunnerConfig),
                 ("rollout", RolloutConfig), ("reward", RewardConfig), ("agentloop", AgentLoopConfig),
                 ("data", PromptLimit), ("monitors", MonitorsConfig))
"""(section, view) of every view read by ``from_section``: each field declares the key it reads (relative to the
section; "" is the config's top), its default and its range, and ``SCHEMA`` takes them from there."""
DATACLASS_SECTIONS = {"cluster": ClusterConfig, "tools.search": SearchToolConfig,
                      "algorithm.distill.teacher": TeacherConfig}
"""The open sections of ``SCHEMA`` read into dataclasses whose fields declare their ``Key`` (``declared``)."""


def declarations() -> dict[str, Key]:
    """Every declared key by dotted path: ``SCHEMA``'s leaves and the dataclass sections' fields."""
    out = dict(leaves(SCHEMA))
    for path, cls in DATACLASS_SECTIONS.items():
        out.update((f"{path}.{name}", key) for name, key in field_keys(cls))
    return out


# Old spelling -> new; RLinf itself writes the turn limit both ways.
DEPRECATED_KEYS = {"agentloop.maxturn": "agentloop.max_turns"}
# RLinf keys that name something this trainer does not have: dropped with a one-line warning, so an
# RLinf config loads, and the message says why the key does nothing.
REMOVED_KEYS = {"agentloop.group_name": "the agent loop runs inside the rollout group (rollout.group_name), or, "
                                        "with agentloop.num_workers >= 1, in the group named AgentLoopGroup"}


def check_keys(node: Any, schema: Any, path: str) -> None:
    """Raise on the first key of ``node`` that ``schema`` does not name."""
    problems = key_problems(node, schema, path)
    if problems:
        raise ConfigError(problems[0])


def key_problems(node: Any, schema: Any, path: str) -> list[str]:
    """One line for every key of ``node`` that ``schema`` does not name (with the nearest names it does), and for
    every section given a value."""
    if schema == "*" or schema is None or isinstance(schema, Key):
        return []
    if not isinstance(node, dict):
        return [f"{path}: expected a section of keys, got {type(node).__name__}"]
    problems = []
    for key, value in node.items():
        where = f"{path}.{key}" if path else key
        if key not in schema:
            near = difflib.get_close_matches(str(key), [str(name) for name in schema], n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            problems.append(f"{where}: unknown key; {path or 'the config'} takes {', '.join(sorted(schema))}{hint}")
            continue
        problems += key_problems(value, schema[key], where)
    return problems


def apply_deprecations(raw: dict) -> None:
    """Rename deprecated keys in place (warning once each) and drop removed ones."""
    for old, new in DEPRECATED_KEYS.items():
        section, old_key = old.split(".")
        _, new_key = new.split(".")
        body = raw.get(section) or {}
        if old_key in body:
            log.warning("%s is deprecated; write %s", old, new)
            if new_key in body and body[new_key] != body[old_key]:
                raise ConfigError(f"{old} and {new} disagree ({body[old_key]} vs {body[new_key]}); keep {new}")
            body[new_key] = body.pop(old_key)
    for dotted, reason in REMOVED_KEYS.items():
        section, key = dotted.split(".")
        body = raw.get(section) or {}
        if key in body:
            log.warning("%s is ignored: %s; remove this key", dotted, reason)
            del body[key]
