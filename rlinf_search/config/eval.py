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

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.config.file_checks import FileChecks
from rlinf_search.config.raw import resolve_raw
from rlinf_search.config.readers import get, get_int, read_view
from rlinf_search.config.run import RunConfig, group_names
from rlinf_search.config.runner import RunnerConfig
from rlinf_search.config.schema import SCHEMA, check_keys, check_values
from rlinf_search.config.sections import (
    agent_loop,
    cluster_placement,
    data_paths,
    prompt_limit,
    require_placed,
    reward_config,
    rollout_config,
    sampling_params,
    with_offered_tools,
)
from rlinf_search.data.prompt_tokens import PromptLimit
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Placement
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.config import RolloutConfig

def _some(section: str, *names: str) -> dict:
    """The training ``SCHEMA``'s declarations of ``names`` in ``section``: an eval reads them as training does."""
    return {name: SCHEMA[section][name] for name in names}


EVAL_SCHEMA = {
    "hydra": "*",
    "cluster": "*",
    "runner": _some("runner", "experiment_name", "output_dir", "seq_length"),
    "algorithm": _some("algorithm", "group_size", "sampling_params"),
    "agent": SCHEMA["agent"],
    "agentloop": SCHEMA["agentloop"],
    "tools": SCHEMA["tools"],
    "rollout": SCHEMA["rollout"],
    "data": _some("data", "max_prompt_length", "filter_overlong_prompts", "truncation", "apply_chat_template", "seed",
                  "val_data_paths"),
    "reward": SCHEMA["reward"],
}


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Everything an eval run needs, validated; the rollout and reward workers get their own sections
    of it, as in training. A field's default is its key's default in an eval."""

    cluster: ClusterConfig
    """``cluster``: nodes, GPUs or CPU slots, Ray address."""
    placement: Placement
    """``cluster.component_placement``: where ``rollout`` and ``reward`` run."""
    output_dir: str
    """``runner.output_dir``: eval_results.json goes here."""
    experiment_name: str = "eval"
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
    samples_per_prompt: int = 1
    """``algorithm.group_size``: rollouts per question (1 for greedy)."""
    seed: int
    """``data.seed``: each rollout rank's sampling seed is seed + rank."""
    prompt_limit: PromptLimit
    """``data.max_prompt_length`` and what overlong prompts get (dropped at start-up, refused or cut)."""
    reward_group: str
    """``reward.group_name``: the name the RewardGroup is launched under."""
    reward: RewardConfig
    """``reward``: the training reward, reported beside EM, sub-EM and F1."""


def validate_eval_cfg(cfg: DictConfig | dict, *, files: FileChecks | None = None) -> EvalConfig:
    """Check the whole eval config once; return its typed view. Raises ``ConfigError`` naming the key. ``files``: as
    ``validate_cfg``'s."""
    raw = resolve_raw(cfg, schema=EVAL_SCHEMA)
    check_keys(raw, EVAL_SCHEMA, "")
    check_values(raw, EVAL_SCHEMA)
    runner = read_view(raw, RunnerConfig, "runner", experiment_name=str(get(raw, "runner.experiment_name",
                                                                             EvalConfig.experiment_name)))
    limit = prompt_limit(raw, seq_length=runner.seq_length)
    samples = get_int(raw, "algorithm.group_size", EvalConfig.samples_per_prompt)
    sampling = sampling_params(raw)
    # Nothing trains on an eval's log-probs, so vLLM's filtered ones are fine: recompute=True.
    rollout = rollout_config(raw, sampling, recompute=True)
    search, loop = agent_loop(raw, sampling, limit=limit, seq_length=runner.seq_length, files=files)
    limit = with_offered_tools(limit, loop)
    cluster, placement = cluster_placement(raw, rollout.backend)
    require_placed(placement, ("rollout", "reward"), run="an eval")
    groups = group_names(raw, ("rollout", "reward"))
    return EvalConfig(
        cluster=cluster, placement=placement, output_dir=str(Path(runner.output_dir)),
        experiment_name=runner.experiment_name, rollout=rollout,
        rollout_group=groups["rollout"], agent_loop=loop, search=search,
        val_data_paths=data_paths(raw, "data.val_data_paths", required=True, files=files), samples_per_prompt=samples,
        seed=get_int(raw, "data.seed", RunConfig.seed), prompt_limit=limit, reward_group=groups["reward"],
        reward=reward_config(raw))
