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
from rlinf_search.config.model import EvalConfigFile
from rlinf_search.config.raw import resolve_raw
from rlinf_search.config.readers import parse_config
from rlinf_search.config.run import group_names
from rlinf_search.config.schema import EVAL_SCHEMA
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
    parsed = parse_config(EvalConfigFile, raw)
    seq_length = parsed.runner.seq_length
    limit = prompt_limit(parsed.data, seq_length=seq_length)
    sampling = sampling_params(parsed.algorithm.sampling_params)
    # Nothing trains on an eval's log-probs, so vLLM's filtered ones are fine: recompute=True.
    rollout = rollout_config(parsed.rollout, sampling, recompute=True)
    search, loop = agent_loop(parsed, sampling, limit=limit, seq_length=seq_length, files=files)
    limit = with_offered_tools(limit, loop)
    cluster, placement = cluster_placement(parsed.cluster, rollout.backend)
    require_placed(placement, ("rollout", "reward"), run="an eval")
    groups = group_names(parsed)
    # An eval's own defaults: its name, and one sample per question (greedy).
    algorithm = parsed.algorithm
    return EvalConfig(
        cluster=cluster, placement=placement, output_dir=str(Path(parsed.runner.output_dir)),
        experiment_name=(parsed.runner.experiment_name if "experiment_name" in parsed.runner.model_fields_set
                         else EvalConfig.experiment_name), rollout=rollout,
        rollout_group=groups["rollout"], agent_loop=loop, search=search,
        val_data_paths=data_paths(parsed.data.val_data_paths, "data.val_data_paths", required=True, files=files),
        samples_per_prompt=(algorithm.group_size if "group_size" in algorithm.model_fields_set
                            else EvalConfig.samples_per_prompt),
        seed=parsed.data.seed, prompt_limit=limit, reward_group=groups["reward"], reward=reward_config(parsed.reward))
