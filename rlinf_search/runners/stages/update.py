"""The two stages after a batch is prepared: the update (actor, and critic when there is one) and the weight
sync to the groups that follow the actor (``LogprobPlan.weight_receivers``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from rlinf_search.config import RunConfig
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.data.rank_plan import mean_by_key
from rlinf_search.runners.group_calls import Groups
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.scheduler import GroupCall, WeightSync, wait_all
from rlinf_search.scheduler.weight_sync import PendingSync
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.worker import CriticWorker


@dataclass
class Trained:
    """What one step's updates report."""

    actor: list[dict[str, float]] = field(default_factory=list)
    """Per actor rank (empty while the critic warms up): its metrics, averaged over the step's mini-batch calls."""
    critic: list[dict[str, float]] = field(default_factory=list)
    """Per critic rank; empty without a critic."""


class UpdateStage:
    """Trains the actor (and critic) on prepared batches.

    ``per_minibatch`` false: a batch is the whole step; the actor splits it into its ``n_minibatches`` (and
    ``ppo_epochs``) itself, the critic trains at the same time in its own processes, and ``submit`` returns
    when both are done. True (``stream``): a batch is one mini-batch of groups and gets one optimizer step;
    ``submit`` returns at once so the next groups are prepared while the actor trains, and ``finish`` waits.
    """

    def __init__(self, groups: Groups, *, critic_warmup_steps: int | None, per_minibatch: bool):
        """``critic_warmup_steps``: steps during which only the critic trains; None without a critic."""
        self.groups, self.per_minibatch = groups, per_minibatch
        self.critic_warmup_steps = critic_warmup_steps
        self._calls: list[GroupCall] = []
        self._trained = Trained()

    @classmethod
    def build(cls, config: RunConfig, groups: Groups) -> UpdateStage:
        warmup = config.critic.warmup_steps if config.critic is not None else None
        return cls(groups, critic_warmup_steps=warmup, per_minibatch=config.runner.pipeline.per_minibatch)

    def submit(self, batch: RolloutBatch, timer: StepTimer, *, completed_steps: int) -> None:
        """Train on ``batch``; ``completed_steps``: steps trained before this one (the critic's warm-up)."""
        if self.per_minibatch:
            self._calls.append(self.groups.actor.call(ActorWorker.train_minibatch, batch))
            return
        with timer.phase("training"):
            critic = self.critic_warmup_steps is not None
            train_actor = not critic or completed_steps >= self.critic_warmup_steps
            # Every rank gets the whole batch (put in the object store once) and trains on its share of it.
            calls = [self.groups.actor.call(ActorWorker.train, batch)] if train_actor else []
            calls += [self.groups.critic.call(CriticWorker.train, batch)] if critic else []
            results = wait_all(calls)
        self._trained = Trained(actor=results[0] if train_actor else [], critic=results[-1] if critic else [])

    def finish(self) -> Trained:
        """The step's update metrics, once every update it was given is done."""
        if self.per_minibatch:
            per_call = wait_all(self._calls)  # [mini-batch][rank]
            self._trained = Trained(actor=[mean_by_key([call[rank] for call in per_call])
                                           for rank in range(len(per_call[0]))])
        trained, self._trained, self._calls = self._trained, Trained(), []
        return trained


class WeightSyncStage:
    """The actor's weights to the engines (and the InferenceGroup's policy copy) after each step's update.

    ``deferred`` (``overlap``: the rollout runs ahead without partial rollouts): later steps' rollouts are running
    on the old weights, so the new ones go out at the next ``flush``, once ``quiesce()`` (set by the rollout
    source) has waited until no rollout is in flight. ``background`` (``async`` with partial rollouts): the
    weights go out at once but the step does not wait for the engines to load them (each first aborts the
    requests in flight at a token boundary, or lets their turns finish); ``settle`` waits, before the rollout admits more work and before the next sync.
    """

    def __init__(self, weight_sync: WeightSync, *, deferred: bool, background: bool = False):
        self.weight_sync, self.deferred, self.background = weight_sync, deferred, background
        self._unsynced: int | None = None
        self._in_flight: PendingSync | None = None
        self.quiesce: Callable[[], None] | None = None
        """Waits until no rollout is in flight (deferred weights go out only then); None: nothing to wait for."""

    def after_update(self, version: int, timer: StepTimer) -> None:
        if self.deferred:
            self._unsynced = version
            return
        with timer.phase("weight_sync"):
            self.settle()
            if self.background:
                self._in_flight = self.weight_sync.start(version)
            else:
                self.weight_sync.sync(version=version)

    def settle(self, timer: StepTimer | None = None) -> None:
        """Wait until a sync sent in the background has been loaded by every receiver."""
        if self._in_flight is None:
            return
        with timer.phase("weight_sync") if timer is not None else nullcontext():
            pending, self._in_flight = self._in_flight, None
            pending.wait()

    def forget_in_flight(self) -> None:
        """Drop the sync sent in the background without waiting for it: a receiver was lost, and the restart sends
        that version to every receiver again (``WeightSync.reopen``)."""
        self._in_flight = None

    def flush(self, timer: StepTimer | None = None) -> None:
        """Send the newest weights now if an update has not gone out yet, and wait until they are loaded."""
        self.settle(timer)
        if self._unsynced is None:
            return
        if self.quiesce is not None:
            with timer.phase("rollout") if timer is not None else nullcontext():
                self.quiesce()
        with timer.phase("weight_sync") if timer is not None else nullcontext():
            self.weight_sync.sync(version=self._unsynced)
        self._unsynced = None
