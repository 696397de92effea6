"""Rollout sources: where a step's finished GRPO groups come from, one source per ``runner.pipeline``.

A source hands the step its groups as ``FinishedGroup`` batches, which is the contract between the rollout
and every stage after it:

- ``CollocatedRollout`` (``sync``): the engines onload, roll out the step's prompts, offload; the step's groups
  are then drained at once, as one batch.
- ``PrefetchedRollout`` (``overlap``): the rollout of step k+1 is launched before step k trains, on the weights
  the engines have then; step k+1 collects it, sends the weights of step k's update, and launches k+2's.
- ``StreamedRollout`` (``stream``): each rollout rank puts a group on the run's ``Channel`` the moment its last
  sample is done; the step takes them in the order they finish, a mini-batch of groups at a time, while the
  slowest trajectories are still being generated.

Every source also keeps the data position of the step it handed out last, which is what a checkpoint saves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from rlinf_search.data.io_struct import FinishedGroup, QARecord, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.runners.group_calls import Groups, collect_rollout, launch_rollout, shard
from rlinf_search.runners.stages.update import WeightSyncStage
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.scheduler import GroupCall, wait_all
from rlinf_search.scheduler.channel import Channel
from rlinf_search.workers.rollout.worker import RolloutWorker

POLL_S = 0.5
"""How often a streamed step, waiting for a group, checks that no rollout rank has died."""


def engine_rollout(groups: Groups, records: list[QARecord], samples: int, *, greedy: bool = False,
                   offload: bool) -> list[Trajectory]:
    """Roll out ``records`` now, in their order (each prompt's samples consecutive). ``offload``: the engines
    share the actor's devices, so they onload for the rollout and offload after it (a no-op on CPU)."""
    if offload:
        groups.engine_group.call("onload").wait()
    trajectories = collect_rollout(launch_rollout(groups.rollout, records, samples, greedy=greedy))
    if offload:
        groups.engine_group.call("offload").wait()
    return trajectories


def as_groups(trajectories: list[Trajectory], samples: int, ranks: int) -> list[FinishedGroup]:
    """A whole rollout (prompt order, ``samples`` per prompt) cut into its groups; each group's rank is the one
    whose contiguous share of the prompts held it (``launch_rollout``'s shares)."""
    prompts = len(trajectories) // samples
    owner = {i: rank for rank, part in enumerate(shard(list(range(prompts)), ranks)) for i in part}
    return [FinishedGroup(index=i, rank=owner[i], trajectories=trajectories[i * samples:(i + 1) * samples])
            for i in range(prompts)]


class StepRollout:
    """One step's rollout as the stages see it: its prompts, and its groups in batches."""

    def __init__(self, records: list[QARecord], timer: StepTimer):
        self.records = records
        """The step's prompts; a group's ``index`` is its place here."""
        self.passes = timer
        """The timer the passes record into: the step's own where they follow the rollout."""
        self.minibatches: list[list[int]] = []
        """The group indices of each batch handed on, in order (recorded where they are the actor's mini-batches)."""
        self.last_batch = False
        """True while the batch just handed on is the step's last."""

    def batches(self) -> Iterator[list[FinishedGroup]]:
        raise NotImplementedError

    def end(self) -> dict[str, float]:
        """Called once the step's updates are done; the source's own metrics."""
        return {}


class DrainedRollout(StepRollout):
    """A rollout that is complete before any stage runs: all its groups in one batch."""

    def __init__(self, records: list[QARecord], trajectories: list[Trajectory], timer: StepTimer, *, ranks: int):
        super().__init__(records, timer)
        self._groups = as_groups(trajectories, len(trajectories) // len(records), ranks)

    def batches(self) -> Iterator[list[FinishedGroup]]:
        self.last_batch = True
        yield self._groups


class CollocatedRollout:
    """``sync``: roll out the step's prompts now, then hand them all on."""

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, offload: bool):
        self.groups, self.prompts, self.group_size, self.offload = groups, prompts, group_size, offload
        self.trained_position = (prompts.epoch, prompts.batch_in_epoch)
        """The data position after the prompts of the step handed out last (what a checkpoint keeps)."""

    def begin(self, step: int, timer: StepTimer, *, prefetch: bool) -> StepRollout:
        records = self.prompts.next_batch()
        self.trained_position = (self.prompts.epoch, self.prompts.batch_in_epoch)
        with timer.phase("rollout"):
            trajectories = engine_rollout(self.groups, records, self.group_size, offload=self.offload)
        return DrainedRollout(records, trajectories, timer, ranks=self.groups.rollout.world_size)

    @property
    def pending(self) -> Callable[[], list[Trajectory]] | None:
        """The next step's rollout in flight, for a checkpoint: none here."""
        return None

    def close(self) -> None:
        pass


class _Prefetch:
    """A rollout launched ahead of its step, or restored from a checkpoint."""

    def __init__(self, records: list[QARecord], calls: list[GroupCall] | None = None,
                 trajectories: list[Trajectory] | None = None):
        self.records, self.calls, self.trajectories = records, calls or [], trajectories

    def result(self) -> list[Trajectory]:
        if self.trajectories is None:
            self.trajectories = collect_rollout(self.calls)
        return self.trajectories


class PrefetchedRollout(CollocatedRollout):
    """``overlap``: the step's rollout was launched during the previous step's update (one update behind the
    policy that trains on it; the recomputed old log-probs and the PPO clip account for that)."""

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, weights: WeightSyncStage,
                 restored: list[Trajectory] | None = None):
        """``restored``: the next step's rollout as a checkpoint kept it (its prompts are the stream's next)."""
        super().__init__(groups, prompts, group_size, offload=False)
        self.weights = weights
        self._next = _Prefetch(prompts.next_batch(), trajectories=restored) if restored is not None else None

    def begin(self, step: int, timer: StepTimer, *, prefetch: bool) -> StepRollout:
        if self._next is None:
            self._next = self._launch()
        current = self._next
        self.trained_position = (self.prompts.epoch, self.prompts.batch_in_epoch)
        with timer.phase("rollout"):
            trajectories = current.result()
        self.weights.flush(timer)  # the previous update, held back while this rollout ran
        self._next = self._launch() if prefetch else None
        return DrainedRollout(current.records, trajectories, timer, ranks=self.groups.rollout.world_size)

    def _launch(self) -> _Prefetch:
        records = self.prompts.next_batch()
        return _Prefetch(records, calls=launch_rollout(self.groups.rollout, records, self.group_size))

    @property
    def pending(self) -> Callable[[], list[Trajectory]] | None:
        """Waits for the next step's rollout: a checkpoint keeps it, since a resume could not sample it again
        (it was sampled by the weights before this step's update)."""
        return self._next.result if self._next is not None else None


class StreamedRollout(CollocatedRollout):
    """``stream``: groups in the order they finish, ``groups_per_batch`` at a time (the actor's mini-batch)."""

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, groups_per_batch: int):
        super().__init__(groups, prompts, group_size, offload=False)
        self.groups_per_batch = groups_per_batch
        self.channel = Channel.create("finished_groups")

    def begin(self, step: int, timer: StepTimer, *, prefetch: bool) -> StepRollout:
        records = self.prompts.next_batch()
        self.trained_position = (self.prompts.epoch, self.prompts.batch_in_epoch)
        return _StreamedStep(self, records, step, timer)

    def close(self) -> None:
        self.channel.close()


class _StreamedStep(StepRollout):
    """One streamed step. Its passes overlap the rollout, so they are timed apart (``stream/<pass>_s``) and the
    step's timer gets one ``stream`` phase, from launch to the last mini-batch trained."""

    def __init__(self, source: StreamedRollout, records: list[QARecord], step: int, timer: StepTimer):
        super().__init__(records, StepTimer())
        self.source, self.step, self.timer = source, step, timer
        self.key = f"step_{step}"
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.calls = self._launch()

    def _launch(self) -> list[GroupCall]:
        """Each rollout rank streams its contiguous share of the prompts (the shares ``sync`` gives them)."""
        source, calls, first = self.source, [], 0
        group = source.groups.rollout
        for rank, part in enumerate(shard(self.records, group.world_size)):
            calls.append(group.call_on(rank, RolloutWorker.stream_rollout, part, source.group_size, source.channel,
                                       self.key, first))
            first += len(part)
        return calls

    def batches(self) -> Iterator[list[FinishedGroup]]:
        arrived: set[int] = set()
        waiting: list[FinishedGroup] = []
        while len(arrived) < len(self.records):
            group = self._next_group()
            if group.index in arrived or not 0 <= group.index < len(self.records):
                raise RuntimeError(f"streamed step {self.step}: group {group.index} from rollout rank {group.rank} "
                                   "is a duplicate or not of this step")
            arrived.add(group.index)
            waiting.append(group)
            self.last_batch = len(arrived) == len(self.records)
            if len(waiting) == self.source.groups_per_batch or self.last_batch:
                if self.last_batch:
                    self.seconds["last_group"] = time.perf_counter() - self.started
                batch, waiting = waiting, []
                self.minibatches.append([g.index for g in batch])
                yield batch  # resumed once the batch is prepared and handed to the actor
                self.seconds.setdefault("first_update", time.perf_counter() - self.started)
        wait_all(self.calls)  # every rank has returned (they have put all their groups)

    def _next_group(self) -> FinishedGroup:
        """The next finished group; a rollout rank that failed or died stops the step with its error."""
        while True:
            try:
                return self.source.channel.get(self.key, timeout=POLL_S)
            except TimeoutError:
                for call in self.calls:
                    call.raise_if_failed()

    def end(self) -> dict[str, float]:
        self.timer.seconds["stream"] = time.perf_counter() - self.started
        seconds = {**self.passes.seconds, **self.seconds}
        metrics = {f"stream/{name}_s": value for name, value in seconds.items()}
        metrics["stream/minibatches"] = float(len(self.minibatches))
        return metrics
