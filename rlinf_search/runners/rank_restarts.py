"""Rollout ranks that come back: a rank whose process is lost mid-rollout is started again on its device, handed the
current weights and the SearchTool group, and its share of the prompts rolls out again, so the step trains its
full batch and no trajectory twice (the lost rank's trajectories never reached the driver). With engine servers
(``agentloop.num_workers`` >= 1) the ranks that run the agent loops are the AgentLoop group's: one of them is
started again the same way, handed the engine servers instead of weights.

Covered, for the group that runs the agent loops: the ``sync`` pipeline's rollout
and validation (the lost rank's share rolls out again), ``stream`` and ``async`` (only the lost rank's groups that
never arrived roll out again, of the step and of every batch admitted ahead: ``StreamedStep.roll_out_lost_share``,
``AsyncRollout._recover``). Not covered, each still stopping the run in one line, resumable from its last
checkpoint: a rank lost during a blocking weight sync or a checkpoint's save, ``overlap`` (every batch is held to one
version, which a rank given the newest weights would break), engine servers, actor and reward ranks. SearchTool
ranks are started again by Ray itself (``workers/tool/launch.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.runners.group_calls import Groups, shard
from rlinf_search.runners.infra_failures import RunStopped
from rlinf_search.scheduler import GroupCall, WeightSync, WorkerError
from rlinf_search.workers.rollout.agent_loop_worker import AgentLoopWorker
from rlinf_search.workers.rollout.worker import RolloutWorker

log = logging.getLogger(__name__)

RESTART_READY_S = 600.0
"""Longest a restarted rank may take to construct (load its model) on a node that is alive."""
_READY_POLL_S = 1.0


class RankRestarts:
    """Starts lost rollout ranks again, at most ``max_restarts`` times over the run."""

    def __init__(self, groups: Groups, weight_sync: Callable[[], WeightSync], *, max_restarts: int):
        """``weight_sync``: the run's weight sync (made after the groups, so asked for when needed)."""
        self.groups, self.weight_sync, self.max_restarts = groups, weight_sync, max_restarts
        self.count = 0
        """Ranks started again so far."""
        self.groups_rolled_again = 0
        """GRPO groups rolled out again because the rank rolling them out was lost (never one that arrived)."""

    @property
    def covers(self) -> bool:
        """Whether lost ranks of the group that runs the agent loops (rollout ranks, or agent-loop ranks beside engine
        servers) can be started again in this run."""
        return self.max_restarts > 0

    def recover(self, error: WorkerError) -> None:
        """Start ``error``'s rank again, or raise ``RunStopped`` when it was no process loss or the budget is spent."""
        if not error.process_lost or not self.covers:
            raise error
        if self.count >= self.max_restarts:
            raise RunStopped(f"{error.group} rank {error.rank} was lost during {error.method}() ({error.cause_type}) "
                             f"after {self.count} rank restart{'s' if self.count != 1 else ''}, the most "
                             "cluster.max_restarts allows; find why ranks die, then resume from the last checkpoint "
                             "with runner.resume_dir=auto") from None
        self.count += 1
        log.warning("%s rank %d was lost during %s() (%s); starting it again (restart %d of at most %d)",
                    error.group, error.rank, error.method, error.cause_type, self.count, self.max_restarts)
        rollout = self.groups.rollout
        try:
            self._wait_ready(rollout.restart(error.rank), rollout.placement.ranks[error.rank].node_rank)
        except (WorkerError, TimeoutError) as exc:
            reason = str(exc).strip().splitlines()[0][:200]
            raise RunStopped(f"{error.group} rank {error.rank} was lost during {error.method}() ({error.cause_type}) "
                             f"and could not be started again ({reason}); resume from the last checkpoint with "
                             "runner.resume_dir=auto") from None
        if self.groups.search is not None:
            rollout.call_on(error.rank, RolloutWorker.use_search_group, list(self.groups.search.actors)).wait()
        if self.groups.engines is not None:  # an agent-loop rank: it holds no weights, only the engine servers' handles
            rollout.call_on(error.rank, AgentLoopWorker.use_engines, list(self.groups.engines.actors)).wait()
        else:
            self.weight_sync().reopen()  # the new process holds the model's weights until it is given the current ones

    def _wait_ready(self, ready: GroupCall, node_rank: int) -> None:
        """Until the new rank is constructed; a rank whose machine is gone will never be: fail as soon as Ray says so
        (a model can take minutes to load, so waiting out a time limit would hold a dead run that long)."""
        cluster = self.groups.rollout.cluster
        deadline = time.monotonic() + RESTART_READY_S
        while True:
            try:
                ready.wait(timeout=_READY_POLL_S)
                return
            except TimeoutError:
                if not cluster.node_alive(node_rank):
                    raise TimeoutError(f"node {node_rank} is gone") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not constructed within {RESTART_READY_S:g} s") from None

    def rolled_again(self, groups: int, where: str) -> None:
        """Count ``groups`` rolled out again on a rank started again; ``where``: which steps' groups, for the log."""
        self.groups_rolled_again += groups
        if not groups:
            log.warning("no GRPO group was in flight on the lost rank")
            return
        log.warning("rolling out again the %d GRPO group%s that were in flight on the lost rank (%s)", groups,
                    "s" if groups != 1 else "", where)

    def metrics(self) -> dict[str, float]:
        return {"runtime/restarts": float(self.count), "runtime/groups_rolled_again": float(self.groups_rolled_again)}


def rollout_with_restarts(groups: Groups, records: list[QARecord], samples: int, restarts: RankRestarts | None, *,
                          greedy: bool = False) -> list[Trajectory]:
    """Each rollout rank rolls out its contiguous share of ``records`` (in their order); a rank whose process is lost
    is started again and its share rolls out again, once every other rank has finished."""
    rollout = groups.rollout
    parts = shard(records, rollout.world_size)
    results: list[list[Trajectory] | None] = [None] * len(parts)
    pending = list(range(len(parts)))
    while pending:
        calls: dict[int, GroupCall] = {rank: rollout.call_on(rank, RolloutWorker.rollout, parts[rank], samples, greedy)
                                       for rank in pending}
        lost: list[WorkerError] = []
        for rank, call in calls.items():
            try:
                results[rank] = call.wait()
            except WorkerError as error:
                if restarts is None or not error.process_lost:
                    raise
                lost.append(error)
        for error in lost:
            restarts.recover(error)
            restarts.rolled_again(len(parts[error.rank]), "the rank's whole share of this rollout")
        pending = [error.rank for error in lost]
    return [traj for part in results for traj in part]
