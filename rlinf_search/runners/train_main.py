"""Start a training run: the cluster, the worker groups on their placements, then the runner.

Entry scripts call ``train(validate_cfg(cfg))``; each line below is one named step.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_search.config import RunConfig
from rlinf_search.runners.train_runner import Groups, SearchR1Runner, find_resume_point
from rlinf_search.scheduler import Cluster
from rlinf_search.workers.actor.backends import require_training_backend
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.worker import CriticWorker
from rlinf_search.workers.inference.worker import InferenceWorker
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.worker import RolloutWorker


def launch_groups(config: RunConfig, cluster: Cluster, resume: Path | None) -> Groups:
    """Every worker group on its placement (the critic and the InferenceGroup when the config has them)."""
    placement = cluster.placement
    require_training_backend(config.actor, device_kind=cluster.device_kind,
                             actor_ranks=len(placement["actor"].ranks))
    actor = ActorWorker.create_group(config, str(resume) if resume else None).launch(
        cluster, placement["actor"], name=config.actor_group)
    rollout = RolloutWorker.create_group(config).launch(cluster, placement["rollout"], name=config.rollout_group)
    reward = RewardWorker.create_group(config).launch(cluster, placement["reward"], name=config.reward_group)
    critic = None
    if config.critic is not None:  # on the actor's devices: it trains on the same rows at the same time
        critic = CriticWorker.create_group(config, str(resume) if resume else None).launch(
            cluster, placement["actor"], name=config.critic.group_name)
    inference = None
    if config.inference.separate:  # else the actor computes the log-probs on its own devices
        inference = InferenceWorker.create_group(config).launch(
            cluster, placement["inference"], name=config.inference.group_name)
    return Groups(rollout=rollout, actor=actor, reward=reward, critic=critic, inference=inference)


def train(config: RunConfig) -> None:
    resume = find_resume_point(config)
    with Cluster(config.cluster) as cluster:
        groups = launch_groups(config, cluster, resume)
        runner = SearchR1Runner(config, groups, resumed_from=resume)
        if resume:
            # The engine (and the InferenceGroup's policy copy) start from the checkpoint's weights.
            runner.weight_sync.sync(version=runner.state.global_step)
        runner.fit()
        runner.weight_sync.close()
