"""Score a checkpoint on a cluster: the rollout group (any engine, one rank per device) rolls out every
question of ``data.val_data_paths``, the reward group scores the training reward, and the driver
writes EM / sub-EM / F1 per data source to ``runner.output_dir/eval_results.json``.

Entry scripts call ``run_eval(validate_eval_cfg(cfg))``; each line below is one named step.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_search.config import ConfigError
from rlinf_search.config.eval import EvalConfig
from rlinf_search.data.prompt_tokens import PromptTooLong
from rlinf_search.data.readers import PrepareError
from rlinf_search.runners.eval_runner import EvalReport, score_trajectories, write_report
from rlinf_search.runners.group_calls import score_shards, shard
from rlinf_search.runners.infra_failures import refuse_infra_failures
from rlinf_search.runners.prompt_sets import load_prompt_set, rollout_tokenizer
from rlinf_search.scheduler import Cluster, wait_all
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.worker import RolloutWorker
from rlinf_search.workers.tool.launch import launch_search_group


def run_eval(config: EvalConfig) -> tuple[EvalReport, Path]:
    """Roll out, score and write the report; returns it and the path of eval_results.json."""
    try:
        tokenizer = rollout_tokenizer(config.rollout.model_path)
        records = load_prompt_set(config.val_data_paths, tokenizer, config.prompt_limit,
                                  split="data.val_data_paths").records
    except (PromptTooLong, PrepareError) as exc:  # before any worker starts
        raise ConfigError(str(exc)) from None
    greedy = config.agent_loop.sampling.greedy
    with Cluster(config.cluster) as cluster:
        rollout = RolloutWorker.create_group(config.rollout, config.agent_loop, config.search, config.seed).launch(cluster, cluster.placement["rollout"],
                                                            name=config.rollout_group)
        launch_search_group(config.search, cluster, rollout)
        reward = RewardWorker.create_group(config.reward).launch(cluster, cluster.placement["reward"],
                                                          name=config.reward_group)
        parts = shard(records, rollout.world_size)
        calls = [rollout.call_on(rank, RolloutWorker.rollout, part, config.samples_per_prompt, greedy)
                 for rank, part in enumerate(parts)]
        trajectories = [traj for part in wait_all(calls) for traj in part]
        refuse_infra_failures(trajectories, what="eval")
        rewards = [score.reward for score in score_shards(reward, trajectories)]
    # Shards are contiguous and each rank keeps its order, so trajectory i belongs to expanded[i].
    expanded = [record for record in records for _ in range(config.samples_per_prompt)]
    report = score_trajectories(expanded, trajectories, rewards)
    return report, write_report(report, Path(config.output_dir), model_path=config.rollout.model_path)
