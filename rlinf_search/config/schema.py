"""The accepted keys of the training config (``SCHEMA``), renamed and removed keys, and the key check.

``SCHEMA`` names keys only; each key's default is the field default of the typed view it fills
(``config/run.py``, ``config/training.py``, ``config/sections.py`` say which).
"""

from __future__ import annotations

import logging
from typing import Any

from rlinf_search.workers.actor.megatron.config import CONVERTER_KEYS as MEGATRON_CONVERTER_KEYS
from rlinf_search.workers.actor.megatron.config import MODEL_KEYS as MEGATRON_MODEL_KEYS

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value or combination that cannot run; the message starts with the key's path."""


# Every key the code reads; a key outside this tree is a typo or a dead setting, and an error.
SCHEMA: dict[str, Any] = {
    "hydra": "*",
    "cluster": "*",  # checked by ClusterConfig.from_dict
    "runner": {"task_type": None, "experiment_name": None, "output_dir": None, "max_epochs": None,
               "max_steps": None, "val_check_interval": None, "save_interval": None, "seq_length": None,
               "max_tokens_per_mbs": None, "resume_dir": None, "rollout_dump": None, "pipeline": None,
               "max_staleness": None, "partial_rollout": None,
               "logger": {"log_path": None, "project_name": None, "experiment_name": None, "logger_backends": None}},
    "algorithm": {"policy_loss": None, "group_size": None, "n_minibatches": None, "ppo_epochs": None,
                  "recompute_logprobs": None, "shuffle_rollout": None, "loss_agg_func": None, "kl_beta": None, "kl_penalty_type": None,
                  "ratio_clip_eps": None, "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": None,
                  "entropy_bonus": None, "adv_type": None, "normalize_advantages": None, "gamma": None, "lam": None,
                  "mismatch_correction": None, "value_clip": None, "logprob_forward_micro_batch_size": None,
                  "sampling_params": {"do_sample": None, "temperature": None, "top_k": None, "top_p": None,
                                      "max_new_tokens": None},
                  "distill": {"enable": None, "mode": None, "coef": None, "center": None, "discount": None, "clip": None,
                              "top_k": None, "top_k_coef": None, "top_k_divergence": None, "max_failed_fraction": None, "failure_window_steps": None,
                              "teacher": "*"}},  # checked by TeacherConfig.from_dict
    "agentloop": {"max_turns": None, "max_tool_response_length": None, "max_passage_tokens": None,
                  "retokenize": None, "num_workers": None},
    "agent": {"protocol": None},
    "tools": "*",  # search: checked by SearchToolConfig.from_dict (tool_config: config/sections.py); others: config/tools.py
    "rollout": {"group_name": None, "rollout_backend": None, "max_running_requests": None,
                "gpu_memory_utilization": None, "tensor_parallel_size": None, "seeded": None,
                "model": {"model_path": None, "precision": None}},
    "inference": {"group_name": None, "load_from_actor": None},
    "data": {"max_prompt_length": None, "filter_overlong_prompts": None, "truncation": None,
             "rollout_batch_size": None, "apply_chat_template": None, "shuffle": None,
             "seed": None, "train_data_paths": None, "val_data_paths": None},
    "actor": {"group_name": None, "training_backend": None,
              "model": {"precision": None, "enable_gradient_checkpointing": None, "use_remove_padding": None,
                        "logprob_chunk_size": None, "attn_implementation": None, "compile_layers": None,
                        **{key: None for key in MEGATRON_MODEL_KEYS}},
              "fsdp_config": {"cpu_offload": None},
              "megatron": {"use_hf_ckpt": None, "distributed_timeout_minutes": None, "core_attention": None,
                           "ckpt_convertor": {key: None for key in MEGATRON_CONVERTER_KEYS}},
              "offload_weight": None, "offload_grad": None, "offload_optimizer": None, "pack_traj": None,
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
# RLinf keys that name something this trainer does not have: dropped with a one-line warning, so an
# RLinf config loads, and the message says why the key does nothing.
REMOVED_KEYS = {"agentloop.group_name": "the agent loop runs inside the rollout group (rollout.group_name), or, "
                                        "with agentloop.num_workers >= 1, in the group named AgentLoopGroup"}


def check_keys(node: Any, schema: Any, path: str) -> None:
    """Raise on the first key of ``node`` that ``schema`` does not name."""
    if schema == "*" or schema is None:
        return
    if not isinstance(node, dict):
        raise ConfigError(f"{path}: expected a section of keys, got {type(node).__name__}")
    for key, value in node.items():
        if key not in schema:
            raise ConfigError(f"{path}.{key}: unknown key; {path} takes {', '.join(sorted(schema))}".lstrip("."))
        check_keys(value, schema[key], f"{path}.{key}" if path else key)


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
