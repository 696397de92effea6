"""RLinf's own Search-R1 configs, read as they are: every RLinf key is mapped onto ours or listed once
at start-up as "accepted, no effect here: KEY (why)".

A config is RLinf's when ``runner.task_type`` is RLinf's (``reasoning`` or ``reasoning_eval``); ours say
``searchr1`` (or nothing) and stay strict: a key in them that nothing reads is an error. An RLinf key
whose value this trainer cannot honour (``reward.use_reward_model: true``, ``actor.model.is_lora:
true``) is a one-line ``ConfigError``, never a silent no-op. The key sets are those of RLinf's
``examples/agent/searchr1/config`` (copies in ``tests/data/rlinf_configs``).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from typing import Any

from rlinf_search.config.schema import ConfigError
from rlinf_search.key_ranges import Key

log = logging.getLogger(__name__)

RLINF_TASK_TYPES = ("reasoning", "reasoning_eval")


@dataclass(frozen=True)
class NoEffect:
    """Accepted and ignored: nothing here reads it (``reason`` says why)."""

    reason: str
    """Shown at start-up after the key."""
    allowed: tuple[Any, ...] | None = None
    """Values that are harmless to ignore; any other is a ConfigError. None: every value."""


@dataclass(frozen=True)
class Moved:
    """Read under our name(s): the value moves to each of ``to``."""

    to: tuple[str, ...]
    """Our dotted keys."""


@dataclass(frozen=True)
class Translated:
    """A value with no exact counterpart here, replaced by the nearest one (``reason`` says why)."""

    values: dict[Any, Any]
    """RLinf's value to ours; a value not listed is kept as it is."""
    reason: str
    """Shown at start-up with the replacement."""


@dataclass(frozen=True)
class Means:
    """A value that means a setting of ours: it is replaced by that setting (another value is a ConfigError)."""

    values: dict[Any, tuple[str, Any]]
    """RLinf's value (a list as a tuple) to (our dotted key, our value)."""
    reason: str
    """Shown at start-up with the replacement: why the two mean the same."""


@dataclass(frozen=True)
class SameAs:
    """Ours derives it from another key; RLinf's copy must agree with it."""

    key: str
    """Our dotted key it must equal."""


_TRAIN_ONLY = "read by training only; an eval rolls out every question once"
_MEGATRON_RUNTIME = "a Megatron runtime setting this backend leaves at megatron-core's default"
_FROM_HF_CONFIG = "read from the model's config.json"
_ENGINE_DEFAULT = "the rollout engine keeps its own default"

RLINF_KEYS: dict[str, NoEffect | Moved | Translated | SameAs | Means] = {
    "runner.task_type": NoEffect("RLinf's task name; this trainer runs the Search-R1 task", RLINF_TASK_TYPES),
    "runner.enable_dynamic_batch_size": NoEffect("micro-batches are always cut by runner.max_tokens_per_mbs",
                                                 (True,)),
    "algorithm.training_batch_size_per_gpu": NoEffect("micro-batches are cut by runner.max_tokens_per_mbs"),
    "algorithm.rollout_batch_size_per_gpu": NoEffect("each rollout rank takes an equal share of the batch"),
    "algorithm.val_rollout_batch_size_per_gpu": NoEffect("each rollout rank takes an equal share of the batch"),
    "algorithm.loss_type": NoEffect("the policy loss is RLinf's 'actor' loss", ("actor",)),
    "algorithm.calculate_entropy": NoEffect("entropy is always reported (actor/entropy)"),
    "algorithm.early_stop_imp_ratio": NoEffect("no early stop on the importance ratio; the PPO clip and "
                                               "algorithm.clip_ratio_c bound it"),
    "algorithm.use_valid_token_scale": NoEffect("algorithm.loss_agg_func sets the token weighting", (False,)),
    "algorithm.sampling_params.repetition_penalty": NoEffect("no repetition penalty here", (1.0, 1)),
    "algorithm.sampling_params.min_new_tokens": NoEffect("a turn may end at once (a stop or end token)"),
    "algorithm.sampling_params.stop": NoEffect("the agent loop stops each turn at </search> and </answer>, and "
                                               "at the model's end tokens"),
    "data.type": NoEffect("RLinf's dataset class; prepared jsonl is read here"),
    "data.prompt_key": NoEffect("training reads prepared jsonl: python -m rlinf_search.data.prepare --format "
                                "rlinf reads RLinf's prompt/solutions rows"),
    "data.answer_key": NoEffect("training reads prepared jsonl: python -m rlinf_search.data.prepare --format "
                                "rlinf reads RLinf's prompt/solutions rows"),
    "data.filter_prompt_by_length": Moved(("data.filter_overlong_prompts",)),
    "data.val_rollout_batch_size": NoEffect("validation rolls out every question of data.val_data_paths"),
    "data.num_workers": NoEffect("prompts are read once at start-up"),
    "data.validation_shuffle": NoEffect("validation runs every question in file order"),
    "data.data_size": NoEffect("the eval scores every question of data.val_data_paths; prepare a smaller file "
                               "to score fewer"),
    "agentloop.toolcall_parser": Means({"searchr1-qwen": ("agent.protocol", "searchr1"),
                                        "searchr1": ("agent.protocol", "searchr1"),
                                        "rstar2-qwen": ("agent.protocol", "toolcall")},
                                       "RLinf's parser of the Search-R1 tags, or of Qwen's <tool_call> JSON"),
    "agentloop.group_name": NoEffect("the AgentLoop group (agentloop.num_workers >= 1) is launched under this name",
                                     ("AgentLoopGroup",)),
    # RLinf's current recipe weights each turn back to one GRPO output per trajectory. actor.pack_traj (read as
    # ours) decides whether the turns of a trajectory train as one sequence (true, the recipe's) or one each.
    "algorithm.adv_type": Translated({"grpo_dynamic": "grpo"}, "with advantage_mode: trajectory, grpo_dynamic "
                                     "normalises each trajectory's reward in its group (unbiased std, eps 1e-6) and "
                                     "gives every turn that advantage: GRPO on trajectories, which is one sequence here"),
    "algorithm.advantage_mode": NoEffect("a trajectory's advantage covers all its turns", ("trajectory",)),
    "algorithm.loss_scales": Means({("group_level", "agent_level", "turn_level"):
                                    ("algorithm.loss_agg_func", "seq-mean-token-mean")},
                                   "together they weight each trajectory's turns so its loss is the mean over all its "
                                   "model tokens, averaged over trajectories (RLinf's loss_agg_func token-mean then "
                                   "applies within one turn)"),
    "agentloop.tool_response_truncate_side": NoEffect("observations are cut at their end, keeping the closing "
                                                      "tag", ("right",)),
    "agentloop.print_outputs": NoEffect("runner.rollout_dump writes sample trajectories to files"),
    "agentloop.is_dynamic_rollout_batch": NoEffect("trajectories always run at their own pace"),
    "rollout.rollout_backend": Translated({"sglang": "vllm"}, "no SGLang engine here; vLLM serves the same "
                                                              "model with the same token-in/token-out contract"),
    "rollout.model.model_type": NoEffect(_FROM_HF_CONFIG),
    "rollout.return_logprobs": NoEffect("the engine's log-probs are kept exactly when "
                                        "algorithm.recompute_logprobs is false"),
    "rollout.detokenize": NoEffect("token ids are kept as sampled; stop strings are matched on the text"),
    "rollout.padding": NoEffect("sequences are never padded between workers"),
    "rollout.eos": NoEffect("the tokenizer's end tokens end a turn"),
    "rollout.pipeline_parallel_size": NoEffect("one engine per device group", (1,)),
    "rollout.enforce_eager": NoEffect(_ENGINE_DEFAULT),
    "rollout.distributed_executor_backend": NoEffect(_ENGINE_DEFAULT),
    "rollout.disable_log_stats": NoEffect(_ENGINE_DEFAULT),
    "rollout.cuda_graph_max_bs": NoEffect(_ENGINE_DEFAULT),
    "rollout.vllm.*": NoEffect(_ENGINE_DEFAULT),
    "rollout.sglang.*": NoEffect("no SGLang engine here"),
    "rollout.validate_weight_first_sync": NoEffect("weight sync is tested, not checked at run time"),
    "rollout.validate_weight": NoEffect("weight sync is tested, not checked at run time"),
    "rollout.validate_save_dir": NoEffect("weight sync is tested, not checked at run time"),
    "rollout.print_outputs": NoEffect("runner.rollout_dump writes sample trajectories to files"),
    "inference.model_type": NoEffect(_FROM_HF_CONFIG),
    "inference.model.tensor_model_parallel_size": NoEffect("an InferenceGroup rank holds a whole model", (1,)),
    "inference.model.pipeline_model_parallel_size": NoEffect("an InferenceGroup rank holds a whole model", (1,)),
    "inference.model.sequence_parallel": NoEffect("an InferenceGroup rank holds a whole model", (False,)),
    "reward.use_reward_model": NoEffect("rewards are rule-based (reward.score)", (False,)),
    "tools.search.dummy_mode": Means({True: ("tools.search.backend", "empty"),
                                      False: ("tools.search.backend", "local")},
                                     "RLinf's dummy mode answers every search with no results and never calls the "
                                     "server; the empty backend does the same"),
    "runner.save_interval": Translated({-1: 0}, "RLinf's -1 saves no periodic checkpoint; 0 does the same here "
                                               "(the last step still saves, so a finished run can be evaluated)"),
    "reward.random_print_percent": NoEffect("runner.rollout_dump writes sample trajectories of every step to "
                                            "files (a count, not a share of the batch)"),
    "reward.tokenizer.tokenizer_model": SameAs("rollout.model.model_path"),
    "reward.tokenizer.*": NoEffect("rewards read text the agent loop decoded"),
    "actor.seed": NoEffect("every seed of the run derives from data.seed"),
    "actor.enable_dp_load_balance": NoEffect("ranks get rows balanced by tokens"),
    "actor.calculate_flops": NoEffect("not measured during training"),
    "actor.enable_offload": Moved(("actor.offload_weight", "actor.offload_grad", "actor.offload_optimizer")),
    "actor.sync_precision": SameAs("rollout.model.precision"),
    "actor.mcore_gpt": NoEffect("the Megatron backend always builds megatron-core's GPTModel", (True,)),
    "actor.spec_name": NoEffect("the Megatron backend uses megatron-core's local layer spec"),
    "actor.model.precision": Translated({"fp16": "bf16"}, "fp16 training needs loss scaling, which this "
                                                          "trainer does not do; bf16 has fp32's range"),
    "actor.model.model_path": SameAs("rollout.model.model_path"),
    "actor.model.model_type": NoEffect(_FROM_HF_CONFIG),
    "actor.model.seq_length": SameAs("runner.seq_length"),
    "actor.model.encoder_seq_length": SameAs("runner.seq_length"),
    "actor.model.is_lora": NoEffect("LoRA is not built in; the whole model trains", (False,)),
    "actor.model.megatron_checkpoint": NoEffect("the Megatron actor starts from the HF weights", (None,)),
    "actor.model.activation": NoEffect(_FROM_HF_CONFIG),
    "actor.model.normalization": NoEffect(_FROM_HF_CONFIG),
    "actor.model.add_bias_linear": NoEffect(_FROM_HF_CONFIG),
    "actor.model.position_embedding_type": NoEffect(_FROM_HF_CONFIG),
    "actor.model.apply_rope_fusion": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.bias_dropout_fusion": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.persist_layer_norm": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.bias_activation_fusion": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.attention_softmax_in_fp32": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.batch_p2p_comm": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.variable_seq_lengths": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.gradient_accumulation_fusion": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.moe_token_dispatcher_type": NoEffect(_MEGATRON_RUNTIME),
    "actor.model.use_cpu_initialization": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.optimizer": NoEffect("the actor trains with AdamW", ("adam", "adamw")),
    "actor.optim.min_lr": Moved(("actor.lr_sched.min_lr",)),
    "actor.optim.lr_warmup_steps_ratio": Moved(("actor.lr_sched.lr_warmup_fraction",)),
    "actor.optim.total_training_steps": NoEffect("the lr schedule spans the steps the run really takes"),
    "actor.optim.use_distributed_optimizer": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.overlap_grad_reduce": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.overlap_param_gather": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.overlap_param_gather_with_optimizer_step": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.optimizer_enable_pin": NoEffect(_MEGATRON_RUNTIME),
    "actor.optim.bf16": NoEffect("actor.model.precision sets the precision"),
    "actor.optim.fp16": NoEffect("actor.model.precision sets the precision"),
    "actor.optim.initial_loss_scale": NoEffect("no loss scaling (fp16 training is refused)"),
    "actor.optim.loss_scale_window": NoEffect("no loss scaling (fp16 training is refused)"),
    "actor.lr_sched.max_lr": SameAs("actor.optim.lr"),
    "actor.lr_sched.lr_warmup_init": NoEffect("warm-up starts from 0", (0, 0.0)),
    "actor.lr_sched.lr_warmup_iters": NoEffect("warm-up length is actor.lr_sched.lr_warmup_fraction", (0,)),
    "actor.lr_sched.lr_decay_iters": NoEffect("the schedule spans the steps the run really takes"),
    "actor.tokenizer.tokenizer_model": SameAs("rollout.model.model_path"),
    "actor.tokenizer.*": NoEffect("the actor reads the tokenizer beside the model"),
    "actor.megatron.ckpt_convertor.model": NoEffect(_FROM_HF_CONFIG),
    "actor.megatron.ckpt_convertor.*": NoEffect("the converter reads the checkpoint's own shards"),
    "actor.megatron.*": NoEffect(_MEGATRON_RUNTIME),
    "actor.fsdp_config.gradient_checkpointing": Moved(("actor.model.enable_gradient_checkpointing",)),
    "actor.fsdp_config.strategy": NoEffect("actor.training_backend: fsdp is FSDP2", ("fsdp", "fsdp2")),
    "actor.fsdp_config.sharding_strategy": NoEffect("FSDP2 shards parameters, gradients and optimizer state",
                                                    ("full_shard",)),
    "actor.fsdp_config.mixed_precision.*": NoEffect("bf16 compute is actor.model.precision; gradients reduce "
                                                    "in fp32 and the master weights stay fp32"),
    "actor.fsdp_config.*": NoEffect("actor.training_backend and actor.model set how the FSDP actor runs"),
}
"""RLinf keys by dotted path (``*`` matches the rest of a path); the first matching entry applies."""


def is_rlinf_config(raw: dict) -> bool:
    """Whether ``raw`` is one of RLinf's configs (``runner.task_type: reasoning|reasoning_eval``)."""
    return get(raw, "runner.task_type") in RLINF_TASK_TYPES


def adapt_rlinf_config(raw: dict, *, schema: dict, training_schema: dict) -> list[str]:
    """Rewrite an RLinf config in place into our keys; returns the start-up lines it logged.

    ``schema``: the keys this run reads (training's or the eval's); keys the training schema reads but
    ``schema`` does not are accepted with no effect (an RLinf eval config carries training keys)."""
    task_type = get(raw, "runner.task_type")
    lines: list[str] = []
    for path, value in list(_leaves(raw)):
        if not _known(schema, path) and _known(training_schema, path):
            # Before any rule: a training key an eval does not read (runner.save_interval) needs no translation.
            lines.append(f"{path} ({_TRAIN_ONLY})")
            _delete(raw, path)
            continue
        rule = _rule_for(path, schema)
        if rule is None:
            continue
        line = _apply(raw, path, value, rule)
        if line:
            lines.append(line)
    if lines:
        log.warning("RLinf config (runner.task_type: %s): %d keys accepted with no effect here, or mapped:\n  %s",
                    task_type, len(lines), "\n  ".join(lines))
    return lines


def _apply(raw: dict, path: str, value: Any, rule) -> str:
    if isinstance(rule, NoEffect):
        if rule.allowed is not None and value not in rule.allowed:
            raise ConfigError(f"{path}: {value!r} is not supported here ({rule.reason})")
        _delete(raw, path)
        return f"{path} ({rule.reason})"
    if isinstance(rule, SameAs):
        ours = get(raw, rule.key)
        if value is not None and ours is not None and value != ours:
            raise ConfigError(f"{path} ({value!r}) must equal {rule.key} ({ours!r}): this trainer derives it from "
                              f"{rule.key}")
        _delete(raw, path)
        return f"{path} (taken from {rule.key})"
    if isinstance(rule, Moved):
        _delete(raw, path)
        for target in rule.to:
            existing = get(raw, target)
            if existing is not None and value is not None and existing != value:
                raise ConfigError(f"{path} ({value!r}) and {target} ({existing!r}) disagree; keep {target}")
            if value is not None:
                _set(raw, target, value)
        return f"{path} -> {', '.join(rule.to)}"
    if isinstance(rule, Means):
        key = tuple(value) if isinstance(value, list) else value
        if key not in rule.values:
            known = ", ".join(repr(list(k) if isinstance(k, tuple) else k) for k in rule.values)
            raise ConfigError(f"{path}: {value!r} is not supported here; supported: {known}")
        target, ours = rule.values[key]
        _delete(raw, path)
        _set(raw, target, ours)
        return f"{path}: {value} -> {target}: {ours} ({rule.reason})"
    if value in rule.values:
        _set(raw, path, rule.values[value])
        return f"{path}: {value} -> {rule.values[value]} ({rule.reason})"
    return ""


def _rule_for(path: str, schema: dict):
    """The entry for ``path``: its own, else a pattern's unless ``schema`` reads the key (``actor.megatron.*``
    covers RLinf's Megatron runtime keys, not our ``actor.megatron.use_hf_ckpt``)."""
    if path in RLINF_KEYS:
        return RLINF_KEYS[path]
    if _known(schema, path):
        return None
    for pattern, rule in RLINF_KEYS.items():
        if "*" in pattern and fnmatch.fnmatchcase(path, pattern):
            return rule
    return None


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def _known(schema: Any, path: str) -> bool:
    node = schema
    for part in path.split("."):
        if node == "*" or node is None or isinstance(node, Key):
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _delete(raw: dict, path: str) -> None:
    """Remove a leaf, and any section left empty by it."""
    parts = path.split(".")
    nodes = [raw]
    for part in parts[:-1]:
        nodes.append(nodes[-1][part])
    del nodes[-1][parts[-1]]
    for depth in range(len(parts) - 1, 0, -1):
        if nodes[depth]:
            break
        del nodes[depth - 1][parts[depth - 1]]


def _set(raw: dict, path: str, value: Any) -> None:
    node = raw
    *sections, last = path.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[last] = value


def get(raw: dict, dotted: str, default: Any = None) -> Any:
    """The value at ``dotted`` in the raw (not yet mapped) config; ``default`` when absent or null."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node
