"""The eval config: a training config's shape without the training, checked once by ``validate_eval_cfg``.

The sections and key names are the training config's (an RLinf user's eval YAML reads the same), minus
what only training reads: ``actor``, ``critic``, ``inference`` and the loss and optimizer keys are
unknown keys here. Rollout and reward are placed together; ``algorithm.group_size`` is samples per
question (1 with greedy sampling); the model path is a converted (Hugging Face) checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from rlinf_search.agents.searchr1.loop import AgentLoopConfig
from rlinf_search.config import (
    _agent_loop,
    _check_paths,
    _cluster,
    _rollout,
    _sampling,
    prompt_limit,
    reward_settings,
    require_placed,
    resolve_raw,
)
from rlinf_search.config_schema import (
    SCHEMA,
    ConfigError,
    check_keys,
    get,
    get_bool,
    get_int,
)
from rlinf_search.data.prompt_tokens import PromptLimit
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Placement
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.config import RolloutConfig

EVAL_SCHEMA = {
    "hydra": "*",
    "cluster": "*",
    "runner": {"experiment_name": None, "output_dir": None, "seq_length": None},
    "algorithm": {"group_size": None, "sampling_params": SCHEMA["algorithm"]["sampling_params"]},
    "agentloop": SCHEMA["agentloop"],
    "tools": SCHEMA["tools"],
    "rollout": SCHEMA["rollout"],
    "data": {"max_prompt_length": None, "filter_overlong_prompts": None, "truncation": None,
             "apply_chat_template": None, "seed": None, "val_data_paths": None},
    "reward": {"group_name": None, "reward_type": None, "score": None, "reward_scale": None},
}


@dataclass(frozen=True)
class EvalConfig:
    """Everything an eval run needs, validated. The rollout and reward workers read the same fields
    of it as of a training ``RunConfig``."""

    cluster: ClusterConfig
    """``cluster``: nodes, GPUs or CPU slots, Ray address."""
    placement: Placement
    """``cluster.component_placement``: where ``rollout`` and ``reward`` run."""
    output_dir: str
    """``runner.output_dir``: eval_results.json goes here."""
    experiment_name: str
    """``runner.experiment_name``: names the run in the report."""
    rollout: RolloutConfig
    """``rollout``: the engine and the checkpoint it loads."""
    rollout_group: str
    """``rollout.group_name``: the name the RolloutGroup is launched under."""
    agent_loop: AgentLoopConfig
    """``agentloop`` plus sampling and token budgets."""
    search: SearchToolConfig
    """``tools.search``."""
    val_data_paths: tuple[str, ...]
    """``data.val_data_paths``: prepared jsonl files to score."""
    samples_per_prompt: int
    """``algorithm.group_size``: rollouts per question (1 for greedy)."""
    seed: int
    """``data.seed``: each rollout rank's sampling seed is seed + rank."""
    prompt_limit: PromptLimit
    """``data.max_prompt_length`` and what overlong prompts get (dropped at start-up, refused or cut)."""
    reward_group: str
    """``reward.group_name``: the name the RewardGroup is launched under."""
    reward: RewardConfig
    """``reward``: the training reward, reported beside EM, sub-EM and F1."""


def validate_eval_cfg(cfg: DictConfig | dict) -> EvalConfig:
    """Check the whole eval config once; return its typed view. Raises ``ConfigError`` naming the key."""
    raw = resolve_raw(cfg, schema=EVAL_SCHEMA)
    check_keys(raw, EVAL_SCHEMA, "")
    output_dir = get(raw, "runner.output_dir")
    if not output_dir:
        raise ConfigError("runner.output_dir is required")
    seq_length = get_int(raw, "runner.seq_length", 4096, minimum=2)
    limit = prompt_limit(raw, seq_length=seq_length)
    samples = get_int(raw, "algorithm.group_size", 1, minimum=1)
    sampling = _sampling(raw)
    # Nothing trains on an eval's log-probs, so vLLM's filtered ones are fine: recompute=True.
    rollout = _rollout(raw, sampling, recompute=True)
    search, agent_loop = _agent_loop(raw, sampling, limit=limit, seq_length=seq_length,
                                     retokenize=get_bool(raw, "agentloop.retokenize", False))
    cluster, placement = _cluster(raw, rollout.backend)
    require_placed(placement, ("rollout", "reward"), run="an eval")
    val_paths = tuple(get(raw, "data.val_data_paths", ()))
    _check_paths(val_paths, "data.val_data_paths", required=True)
    return EvalConfig(
        cluster=cluster, placement=placement, output_dir=str(Path(output_dir)),
        experiment_name=str(get(raw, "runner.experiment_name", "eval")), rollout=rollout,
        rollout_group=str(get(raw, "rollout.group_name", "RolloutGroup")), agent_loop=agent_loop, search=search,
        val_data_paths=val_paths, samples_per_prompt=samples, seed=get_int(raw, "data.seed", 0), prompt_limit=limit,
        reward_group=str(get(raw, "reward.group_name", "RewardGroup")), reward=reward_settings(raw))
