"""Rollout sources: where a step's finished GRPO groups come from, one source per ``runner.pipeline``.

A source hands the step its groups as ``FinishedGroup`` batches, which is the contract between the rollout
and every stage after it:

- ``CollocatedRollout`` (``sync``): the engines onload, roll out the step's prompts, offload; the step's groups
  are then drained at once, as one batch.
- ``StreamedRollout`` (``stream``): each rollout rank puts a group on the run's ``Channel`` the moment its last
  sample is done; the step takes them in the order they finish, a mini-batch of groups at a time, while the
  slowest trajectories are still being generated.
- ``AsyncRollout`` (``async``, ``overlap``; ``async_rollout.py``): the batches of later steps already roll out,
  onto the same channel, while this step trains.

Every source also keeps the data position of the step it handed out last, which is what a checkpoint saves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from rlinf_search.data.io_struct import FinishedGroup, QARecord, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.runners.group_calls import Groups, shard
from rlinf_search.runners.rank_restarts import RankRestarts, rollout_with_restarts
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.scheduler import GroupCall, WorkerError
from rlinf_search.scheduler.channel import Channel
from rlinf_search.workers.rollout.worker import RolloutWorker

POLL_S = 0.5
"""How often a streamed step, waiting for a group, checks that no rollout rank has died."""


def engine_rollout(groups: Groups, records: list[QARecord], samples: int, *, greedy: bool = False,
                   offload: bool, restarts: RankRestarts | None = None) -> list[Trajectory]:
    """Roll out ``records`` now, in their order (each prompt's samples consecutive). ``offload``: the engines
    share the actor's devices, so they onload for the rollout and offload after it (a no-op on CPU).
    ``restarts``: a rank whose process is lost is started again and its share rolls out again (``rank_restarts.py``)."""
    if offload:
        groups.engine_group.call(groups.engine_worker.onload).wait()
    trajectories = rollout_with_restarts(groups, records, samples, restarts, greedy=greedy)
    if offload:
        groups.engine_group.call(groups.engine_worker.offload).wait()
    return trajectories


def as_groups(trajectories: list[Trajectory], samples: int, ranks: int) -> list[FinishedGroup]:
    """A whole rollout (prompt order, ``samples`` per prompt) cut into its groups; each group's rank is the one
    whose contiguous share of the prompts held it (``rollout_with_restarts``'s shares)."""
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

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, offload: bool,
                 restarts: RankRestarts | None = None):
        self.groups, self.prompts, self.group_size, self.offload = groups, prompts, group_size, offload
        self.restarts = restarts
        """Lost rollout ranks started again (``sync`` only); None: a lost rank stops the run."""
        self.trained_position = (prompts.epoch, prompts.batch_in_epoch)
        """The data position after the prompts of the step handed out last (what a checkpoint keeps)."""

    def begin(self, step: int, timer: StepTimer) -> StepRollout:
        records = self.prompts.next_batch()
        self.trained_position = (self.prompts.epoch, self.prompts.batch_in_epoch)
        with timer.phase("rollout"):
            trajectories = engine_rollout(self.groups, records, self.group_size, offload=self.offload,
                                          restarts=self.restarts)
        return DrainedRollout(records, trajectories, timer, ranks=self.groups.rollout.world_size)

    @property
    def pending(self) -> Callable[[], list[list[Trajectory]]] | None:
        """The rollouts of later steps in flight, for a checkpoint: none here."""
        return None

    def lost_in_flight(self) -> int:
        """GRPO groups whose rollout was in flight for steps after this one when a rollout rank was lost: none."""
        return 0

    def before_checkpoint(self) -> None:
        """Make every rollout rank reachable for a checkpoint's reads (their RNG states): nothing is left in flight
        here."""

    def close(self) -> None:
        pass


class StreamedRollout(CollocatedRollout):
    """``stream``: groups in the order they finish, ``groups_per_batch`` at a time (the actor's mini-batch).
    ``restarts``: a rollout rank lost mid-step is started again and its groups that never arrived roll out again
    on it (``rank_restarts.py``); None: a lost rank stops the run."""

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, groups_per_batch: int,
                 restarts: RankRestarts | None = None):
        super().__init__(groups, prompts, group_size, offload=False, restarts=restarts)
        self.groups_per_batch = groups_per_batch
        self.channel = Channel.create("finished_groups")
        self._current: StreamedStep | None = None

    def begin(self, step: int, timer: StepTimer) -> StepRollout:
        records = self.prompts.next_batch()
        self.trained_position = (self.prompts.epoch, self.prompts.batch_in_epoch)
        calls = stream_batch(self.groups, records, self.group_size, self.channel, step_key(step))
        self._current = StreamedStep(self.channel, records, step, timer, calls, groups_per_batch=self.groups_per_batch,
                                     recover=self._recover if self.restarts is not None else None)
        return self._current

    def _recover(self, error: WorkerError) -> None:
        """Start the lost rank again (or stop the run in one line), then roll its missing groups out on it."""
        assert self.restarts is not None and self._current is not None
        self.restarts.recover(error)
        again = self._current.roll_out_lost_share(self.groups, self.group_size, error.rank)
        self.restarts.rolled_again(again, f"step {self._current.step}")

    def close(self) -> None:
        self.channel.close()


def step_key(step: int) -> str:
    """The channel key a step's finished groups are put under."""
    return f"step_{step}"


def stream_batch(groups: Groups, records: list[QARecord], group_size: int, channel: Channel, key: str, *,
                 batch_seed: Callable[[int], int] | None = None) -> list[GroupCall]:
    """Each rollout rank streams its contiguous share of ``records`` (the shares ``sync`` gives them) onto
    ``channel`` under ``key``; ``batch_seed(rank)``: the rank's seed for this batch (else its generator draws)."""
    rollout = groups.rollout
    return [stream_share(groups, records, group_size, channel, key, rank, indices,
                         None if batch_seed is None else batch_seed(rank))
            for rank, indices in enumerate(rank_shares(len(records), rollout.world_size))]


def rank_shares(groups_in_batch: int, ranks: int) -> list[list[int]]:
    """The group indices each rollout rank rolls out of a batch: contiguous shares, as ``shard`` deals them."""
    return shard(list(range(groups_in_batch)), ranks)


def stream_share(groups: Groups, records: list[QARecord], group_size: int, channel: Channel, key: str, rank: int,
                 indices: list[int], seed: int | None) -> GroupCall:
    """Rollout rank ``rank`` streams the groups ``indices`` of ``records`` onto ``channel`` under ``key``."""
    return groups.rollout.call_on(rank, RolloutWorker.stream_rollout, [records[i] for i in indices], group_size,
                                  channel, key, indices, seed)


def roll_out_lost_share(groups: Groups, group_size: int, channel: Channel, key: str, records: list[QARecord],
                        calls: list[GroupCall | None], rank: int, *, have: set[int], arrived: list[FinishedGroup],
                        rolled_again: set[int], seed: int | None) -> int:
    """After rollout rank ``rank`` was lost and started again: its share of a batch (``records``, streamed under
    ``key`` by ``calls``, one per rank) that never arrived rolls out again on it; how many groups. The groups already
    on the channel are taken off into ``arrived`` first (the lost rank can put no more), so only what was in flight
    on it rolls out again; ``have``: indices taken before; ``rolled_again`` gets the indices. ``calls[rank]`` becomes
    the new call, or None: no call of the lost process is waited on again (one that put all its groups may still
    report the loss)."""
    while channel.qsize(key):
        arrived.append(channel.get(key, timeout=POLL_S))
    have = have | {group.index for group in arrived}
    missing = [i for i in rank_shares(len(records), groups.rollout.world_size)[rank] if i not in have]
    calls[rank] = stream_share(groups, records, group_size, channel, key, rank, missing, seed) if missing else None
    rolled_again.update(missing)
    return len(missing)


class StreamedStep(StepRollout):
    """One step whose groups come off the run's channel as they finish. Its passes overlap the rollout, so they
    are timed apart (``stream/<pass>_s``) and the step's timer gets one ``stream`` phase, from its start to the last
    batch trained. ``groups_per_batch``: groups handed on at a time (a mini-batch; all of them: one batch)."""

    def __init__(self, channel: Channel, records: list[QARecord], step: int, timer: StepTimer,
                 calls: list[GroupCall | None], *, groups_per_batch: int, arrived: list[FinishedGroup] | None = None,
                 check: Callable[[FinishedGroup], None] | None = None,
                 recover: Callable[[WorkerError], None] | None = None, rolled_again: set[int] | None = None):
        """``calls``: the rollout calls producing the step's groups, one per rank in rank order (None: nothing of the
        step in flight on that rank); ``arrived``: groups already taken off the channel (a checkpoint's);
        ``check(group)``: raises on a group the step must not train;
        ``recover(error)``: called when a rollout rank's process was lost (starts it again and has its missing
        groups rolled out again, or raises); None: the loss stops the step; ``rolled_again``: indices already
        rolled out a second time (an earlier recovery's)."""
        super().__init__(records, StepTimer())
        self.channel, self.step, self.timer, self.calls = channel, step, timer, calls
        self.groups_per_batch, self.check, self.recover = groups_per_batch, check, recover
        self.key = step_key(step)
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self._arrived = list(arrived or [])
        self._seen: set[int] = set()
        self.rolled_again: set[int] = set(rolled_again or ())
        """Groups rolled out again after their rank was lost: a copy the lost rank had put just before dying may
        still arrive, and is dropped (the first copy is the one trained)."""
        self.taken = 0
        """Groups taken so far (restored ones included)."""

    def roll_out_lost_share(self, groups: Groups, group_size: int, rank: int, seed: int | None = None) -> int:
        """After rollout rank ``rank`` was started again: its groups of this step that never arrived roll out again
        on it (with ``seed``); how many."""
        if not self.calls:  # every group was in hand before the step began (a checkpoint's)
            return 0
        return roll_out_lost_share(groups, group_size, self.channel, self.key, self.records, self.calls, rank,
                                   have=self._seen, arrived=self._arrived, rolled_again=self.rolled_again, seed=seed)

    def batches(self) -> Iterator[list[FinishedGroup]]:
        arrived = self._seen
        waiting: list[FinishedGroup] = []
        while len(arrived) < len(self.records):
            group = self._arrived.pop(0) if self._arrived else self._next_group()
            if group.index in arrived and group.index in self.rolled_again:
                continue  # the lost rank's copy and the one rolled out again: the first to arrive is trained
            if group.index in arrived or not 0 <= group.index < len(self.records):
                raise RuntimeError(f"streamed step {self.step}: group {group.index} from rollout rank {group.rank} "
                                   "is a duplicate or not of this step")
            self.taken += 1
            if self.check is not None:
                self.check(group)
            arrived.add(group.index)
            waiting.append(group)
            self.last_batch = len(arrived) == len(self.records)
            if len(waiting) == self.groups_per_batch or self.last_batch:
                if self.last_batch:
                    self.seconds["last_group"] = time.perf_counter() - self.started
                batch, waiting = waiting, []
                if self.groups_per_batch >= len(self.records):
                    batch.sort(key=lambda g: g.index)  # the whole step at once: in prompt order, as if drained
                self.minibatches.append([g.index for g in batch])
                yield batch  # resumed once the batch is prepared and handed to the actor
                self.seconds.setdefault("first_update", time.perf_counter() - self.started)
        for call in self._live_calls():  # every rank has returned (they have put all their groups)
            try:
                call.wait()
            except WorkerError as error:  # lost after its last group: nothing of this step to roll out again
                self._lost(error)

    def _next_group(self) -> FinishedGroup:
        """The next finished group; a rollout rank that failed stops the step with its error, one whose process
        was lost is recovered (``recover``) or stops it."""
        while True:
            try:
                return self.channel.get(self.key, timeout=POLL_S)
            except TimeoutError:
                for call in self._live_calls():
                    try:
                        call.raise_if_failed()
                    except WorkerError as error:
                        self._lost(error)
                        break

    def _live_calls(self) -> list[GroupCall]:
        return [call for call in self.calls if call is not None]

    def _lost(self, error: WorkerError) -> None:
        if self.recover is None or not error.process_lost:
            raise error
        self.recover(error)

    def end(self) -> dict[str, float]:
        self.timer.seconds["stream"] = time.perf_counter() - self.started
        seconds = {**self.passes.seconds, **self.seconds}
        metrics = {f"stream/{name}_s": value for name, value in seconds.items()}
        metrics["stream/minibatches"] = float(len(self.minibatches))
        return metrics
