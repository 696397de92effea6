"""The launched groups of a run, and the ways both runners deal work out to a group's ranks."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_search.data.io_struct import RewardScore, Trajectory
from rlinf_search.scheduler import WorkerGroup, wait_all
from rlinf_search.scheduler.worker_group import Method
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.server import EngineServerWorker
from rlinf_search.workers.rollout.worker import RolloutWorker


@dataclass
class Groups:
    """The launched worker groups a run drives."""

    rollout: WorkerGroup
    actor: WorkerGroup
    reward: WorkerGroup
    critic: WorkerGroup | None = None
    """The value model (``critic.use_critic_model``), on the actor's devices; None without one."""
    inference: WorkerGroup | None = None
    """Old and reference log-probs on devices of its own (``InferenceConfig.separate``); None: the
    actor computes them."""
    search: WorkerGroup | None = None
    """The SearchTool group every rollout rank searches through (``tools.search.num_workers``); None: each
    rollout rank has its own client."""
    engines: WorkerGroup | None = None
    """The engine servers on the rollout devices (``agentloop.num_workers`` >= 1); ``rollout`` is then the
    AgentLoop group, which runs the agent loops and sends each turn to one of them. None: ``rollout``'s ranks
    each hold their own engine."""

    @property
    def engine_group(self) -> WorkerGroup:
        """The group that holds the engines: the one that takes weights, offload and onload."""
        return self.engines if self.engines is not None else self.rollout

    @property
    def engine_worker(self) -> type[EngineServerWorker] | type[RolloutWorker]:
        """The worker class of ``engine_group``, whose methods (``onload``, ``offload``, ``engine_activity``) the
        runner calls."""
        return EngineServerWorker if self.engines is not None else RolloutWorker


def shard(items: list, parts: int) -> list[list]:
    """``items`` dealt into ``parts`` contiguous shares (one per rank), sizes differing by at most one."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for rank in range(parts):
        stop = start + size + (rank < extra)
        out.append(items[start:stop])
        start = stop
    return out


def call_each(group: WorkerGroup, method: Method, per_rank_args: list[tuple]) -> list:
    """Call ``method`` on every rank with that rank's own arguments; results in rank order."""
    return wait_all([group.call_on(rank, method, *args) for rank, args in enumerate(per_rank_args)])


def score_shards(reward: WorkerGroup, trajectories: list[Trajectory]) -> list[RewardScore]:
    """Each reward rank scores its own contiguous share of ``trajectories``; the scores in their order."""
    parts = shard(trajectories, reward.world_size)
    return [score for part in call_each(reward, RewardWorker.score, [(part,) for part in parts]) for score in part]
