"""``AsyncRollout``: the rollout runs ahead of the update (``runner.pipeline: async``, and ``overlap``).

Batches of prompts are admitted ahead of the step that trains them, at most ``max_staleness`` (k) steps
ahead: when step s begins, the engines hold policy version s-1 and the batches of steps s .. s+k are rolling
out. Each rollout rank streams its share of a batch onto the run's channel (key ``step_<s>``) group by group,
as in ``stream``; several batches roll out on a rank at once (each a call of its own on the rank's threads, all
on its one engine), so an engine never runs dry at a step's tail while the actor trains.

Weights. With ``partial_rollout`` (the ``async`` default) a step's update goes out as soon as it is done and each
engine takes it at a token boundary (``workers/rollout/weight_gate.py``): the requests in flight are aborted and
continue on the new policy from the ids they have (an engine that cannot abort lets their turns finish first).
The next step does not wait for the engines to load it: it starts training its own batch at once, while a thread of the driver waits for the load and
then admits the batch k steps ahead. Without partial rollouts (``overlap``) the update is held back until no
rollout is in flight, so every batch is sampled by one version.

Staleness. Every token records the policy version that sampled it. Step s trains with the actor at version s-1;
its batch was admitted at version >= s-1-k and none of its tokens is older, so no token is more than k versions
behind: a group is never too old to train and none is dropped. The step trains exactly its own batch (the order
of admission), waiting, if it must, for that batch's last group, which has been rolling out since up to k steps
earlier. A group older than k would be a bug: it stops the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlinf_search.agents.engine import derive_seed
from rlinf_search.config.pipeline import PipelineSettings
from rlinf_search.data.io_struct import FinishedGroup, QARecord, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.runners.group_calls import Groups
from rlinf_search.runners.rank_restarts import RankRestarts
from rlinf_search.runners.stages.rollout_source import (
    CollocatedRollout,
    StepRollout,
    StreamedStep,
    as_groups,
    roll_out_lost_share,
    step_key,
    stream_batch,
)
from rlinf_search.runners.stages.update import WeightSyncStage
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.scheduler import GroupCall, WorkerError, wait_all
from rlinf_search.scheduler.channel import Channel


@dataclass
class _Admitted:
    """A batch admitted ahead of its step: rolling out, or finished and waiting to be trained."""

    step: int
    """The step that trains it."""
    records: list[QARecord]
    """Its prompts, in the prompt stream's order."""
    position: tuple[int, int]
    """The prompt stream's (epoch, batch in epoch) after this batch: a checkpoint taken after its step keeps it."""
    calls: list[GroupCall | None] = field(default_factory=list)
    """The rollout ranks' calls streaming its groups, in rank order (none for a batch restored from a checkpoint;
    None for a rank with nothing of it in flight)."""
    arrived: list[FinishedGroup] = field(default_factory=list)
    """Groups already taken off the channel (by a checkpoint or a rank's recovery) or restored."""
    rolled_again: set[int] = field(default_factory=set)
    """Groups rolled out again on a rank started again after its process was lost."""


class AsyncRollout(CollocatedRollout):
    """``async`` / ``overlap``: batches admitted up to ``max_staleness`` steps ahead of the update."""

    def __init__(self, groups: Groups, prompts: PromptStream, group_size: int, *, settings: PipelineSettings,
                 weights: WeightSyncStage, groups_per_batch: int, first_step: int, last_step: int, seed: int,
                 restored: list[list[Trajectory]] | None = None, restarts: RankRestarts | None = None):
        """``groups_per_batch``: groups handed to the update at a time (the step's prompts: one batch);
        ``first_step``/``last_step``: the run's next and last steps (nothing is admitted past the last);
        ``seed``: ``data.seed``, from which each batch's sampling seeds derive; ``restored``: the batches a
        checkpoint kept, already rolled out (their prompts are the stream's next); ``restarts``: a rollout rank
        whose process is lost is started again and what was in flight on it rolls out again (partial rollouts
        only: ``overlap`` holds every batch to one version, which a rank given the newest weights would break)."""
        super().__init__(groups, prompts, group_size, offload=False,
                         restarts=restarts if settings.partial_rollout else None)
        self.settings, self.weights, self.groups_per_batch = settings, weights, groups_per_batch
        self.last_step, self.seed = last_step, seed
        self.channel = Channel.create("finished_groups")
        self.admitted: dict[int, _Admitted] = {}
        self.next_step = first_step
        self._current: _AheadStep | None = None
        self._admitter: _Admitter | None = None
        for trajectories in restored or []:
            records = prompts.next_batch()
            self.admitted[self.next_step] = _Admitted(
                self.next_step, records, (prompts.epoch, prompts.batch_in_epoch),
                arrived=as_groups(trajectories, group_size, groups.rollout.world_size))
            self.next_step += 1
        if not settings.partial_rollout:
            weights.quiesce = self.wait_rollouts

    def begin(self, step: int, timer: StepTimer) -> StepRollout:
        ahead = min(step + self.settings.max_staleness, self.last_step)
        if self.settings.partial_rollout:
            self.join_admitter()
            self._admit(until=step)  # the step's own batch, when nothing was admitted ahead (the run's first step)
            batch = self.admitted.pop(step)
            # The previous update is on its way to the engines: once they have it, admit the batch k steps ahead.
            self._admitter = _Admitter(lambda: (self.weights.settle(), self._admit(until=ahead)))
        else:
            self.weights.flush(timer)  # the update held back until no rollout was in flight
            self._admit(until=ahead)
            batch = self.admitted.pop(step)
        self.trained_position = batch.position
        self._current = _AheadStep(self.channel, batch, timer, groups_per_batch=self.groups_per_batch,
                                   check=self._checker(step), source=self,
                                   recover=self._recover if self.restarts is not None else None)
        return self._current

    def join_admitter(self) -> float:
        """Wait for the admission running beside the step (raising its error); the seconds it ran. A rollout rank
        lost meanwhile (its weight load or a batch's start failed) is recovered here when it can be."""
        admitter, self._admitter = self._admitter, None
        if admitter is None:
            return 0.0
        try:
            return admitter.join()
        except WorkerError as error:
            if not self._recoverable(error):
                raise
            self._recover(error)  # the batches it did not admit are admitted by the next step's begin
            return 0.0

    def _recoverable(self, error: WorkerError) -> bool:
        """Whether ``error`` is a rollout rank's lost process that this run starts again."""
        return self.restarts is not None and error.process_lost and error.group == self.groups.rollout.name

    def _recover(self, error: WorkerError) -> None:
        """A rollout rank's process was lost: start it again with the newest weights (or stop the run in one line),
        then roll out again on it what was in flight there: its groups of this step and of every batch admitted
        ahead that never arrived. Groups that did arrive stay, each trained once."""
        assert self.restarts is not None
        admitter, self._admitter = self._admitter, None
        if admitter is not None:  # the admission beside the step may be using the lost rank
            try:
                admitter.join()
            except WorkerError as other:
                if not self._recoverable(other):
                    raise
        if self.groups.engines is None:  # the lost rank took weights: the load it never finished is sent again
            self.weights.forget_in_flight()
        self.restarts.recover(error)
        rank = error.rank
        again: dict[int, int] = {}
        if self._current is not None:
            again[self._current.step] = self._current.roll_out_lost_share(
                self.groups, self.group_size, rank, seed=derive_seed(self.seed, rank, self._current.step))
        for batch in self.admitted.values():
            if not batch.calls:  # restored from a checkpoint: nothing in flight
                continue
            again[batch.step] = roll_out_lost_share(
                self.groups, self.group_size, self.channel, step_key(batch.step), batch.records, batch.calls, rank,
                have=set(), arrived=batch.arrived, rolled_again=batch.rolled_again,
                seed=derive_seed(self.seed, rank, batch.step))
        where = ", ".join(f"step {step}: {n}" for step, n in sorted(again.items()) if n)
        self.restarts.rolled_again(sum(again.values()), where)

    def _admit(self, *, until: int) -> None:
        while self.next_step <= until:
            step = self.next_step
            records = self.prompts.next_batch()
            calls = stream_batch(self.groups, records, self.group_size, self.channel, step_key(step),
                                 batch_seed=lambda rank, step=step: derive_seed(self.seed, rank, step))
            self.admitted[step] = _Admitted(step, records, (self.prompts.epoch, self.prompts.batch_in_epoch), calls)
            self.next_step += 1

    def groups_in_flight(self) -> int:
        """Groups of the admitted batches not yet finished (neither on the channel nor taken off it)."""
        return sum(len(b.records) - len(b.arrived) - self.channel.qsize(step_key(b.step))
                   for b in self.admitted.values())

    def lost_in_flight(self) -> int:
        """After a rollout rank was lost: the groups of this step and the admitted ones that had not finished (a
        resume keeps what its checkpoint kept and rolls the rest out again)."""
        current = self._current
        unfinished = 0 if current is None else len(current.records) - current.taken - self.channel.qsize(current.key)
        return unfinished + self.groups_in_flight()

    def _checker(self, step: int) -> Callable[[FinishedGroup], None]:
        trained_at, bound = step - 1, self.settings.max_staleness

        def check(group: FinishedGroup) -> None:
            oldest = group.oldest_version
            if oldest is not None and trained_at - oldest > bound:
                raise RuntimeError(f"step {step}: group {group.index} holds tokens of policy version {oldest}, "
                                   f"{trained_at - oldest} versions behind the actor's {trained_at}, past "
                                   f"runner.max_staleness {bound}: the admission bound was broken")
        return check

    def wait_rollouts(self) -> None:
        """Wait until no admitted batch is still rolling out (their groups stay on the channel)."""
        self.join_admitter()
        while True:
            try:
                wait_all([call for batch in self.admitted.values() for call in batch.calls if call is not None])
                return
            except WorkerError as error:
                if not self._recoverable(error):
                    raise
                self._recover(error)

    def before_checkpoint(self) -> None:
        """Wait for the weights sent in the background to be loaded: a rank lost while loading them (its requests
        all done, so no rollout call sees the loss) is started again here, not found dead by the checkpoint's read
        of its RNG state, which no restart covers."""
        try:
            self.weights.settle()
        except WorkerError as error:
            if not self._recoverable(error):
                raise
            self._recover(error)

    @property
    def pending(self) -> Callable[[], list[list[Trajectory]]] | None:
        """Waits for every admitted batch not yet trained and returns their trajectories (a batch each, in step
        order, prompts in order): a checkpoint keeps them, since a resume could not sample them again (older
        weights sampled them)."""
        if not self.admitted:
            return None
        return self._drain

    def _drain(self) -> list[list[Trajectory]]:
        self.wait_rollouts()
        out = []
        for step in sorted(self.admitted):
            batch = self.admitted[step]
            while len(batch.arrived) < len(batch.records):
                batch.arrived.append(self.channel.get(step_key(step), timeout=60))
            batch.calls = []
            batch.arrived.sort(key=lambda g: g.index)
            out.append([t for g in batch.arrived for t in g.trajectories])
        return out

    def close(self) -> None:
        self.join_admitter()
        self.channel.close()


class _Admitter:
    """Runs ``work`` on a thread of the driver beside the step; ``join`` returns its seconds or raises its error."""

    def __init__(self, work: Callable[[], object]):
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(work,), name="async-admitter", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], object]) -> None:
        started = time.perf_counter()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's thread at join
            self._error = exc
        self._seconds = time.perf_counter() - started

    def join(self) -> float:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._seconds


class _AheadStep(StreamedStep):
    """One step of ``AsyncRollout``: its batch's groups as they finish, a mini-batch at a time (``async``) or all
    at once (``overlap``)."""

    def __init__(self, channel: Channel, batch: _Admitted, timer: StepTimer, *, groups_per_batch: int,
                 check: Callable[[FinishedGroup], None], source: AsyncRollout,
                 recover: Callable[[WorkerError], None] | None):
        super().__init__(channel, batch.records, batch.step, timer, batch.calls, groups_per_batch=groups_per_batch,
                         arrived=batch.arrived, check=check, recover=recover, rolled_again=batch.rolled_again)
        self.source = source
        self.whole = groups_per_batch >= len(batch.records)
        if self.whole:
            self.passes = timer  # the update follows the whole rollout: its passes are the step's phases

    def end(self) -> dict[str, float]:
        if self.whole:  # the wait for the batch, then the passes and the update, in turn
            # (the flush at the step's start may have timed its wait for the rollout in flight as "rollout" already)
            self.timer.seconds["rollout"] = self.timer.seconds.get("rollout", 0.0) + self.seconds.get("last_group", 0.0)
            metrics = {}
        else:
            metrics = super().end()
        # The admission beside the step (partial rollouts) is done before the step's weights go out.
        metrics["async/admission_s"] = self.source.join_admitter()
        metrics["async/groups_in_flight"] = float(self.source.groups_in_flight())
        metrics["async/batches_ahead"] = float(len(self.source.admitted))
        metrics["async/wait_s"] = self.seconds.get("last_group", time.perf_counter() - self.started)
        return metrics
