"""The streamed step (``runner.pipeline: stream``): training starts while the slowest trajectories still run.

The rollout ranks put each finished GRPO group on a channel the moment its last sample is done
(``RolloutWorker.stream_rollout``). The driver takes groups in the order they finish; as soon as it holds a
mini-batch of them (``rollout_batch_size / n_minibatches`` groups) it scores them (sharded over the reward
ranks), asks the teacher, computes the reference (and, from an InferenceGroup, old) log-probs and the
group-local advantages, and hands the mini-batch to the actor for one optimizer step, without waiting for
it: the next groups are scored while the actor trains. The weights go to the engines once, when every
mini-batch is trained, so every trajectory of a step is sampled by the same policy, as in ``sync``; what
changes is which trajectories share a mini-batch (those that finished together, not a shuffle).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlinf_search.data.batch import RolloutBatch, collate_trajectories
from rlinf_search.data.io_struct import FinishedGroup, QARecord, RewardScore, Trajectory
from rlinf_search.data.rank_plan import mean_by_key
from rlinf_search.runners.group_calls import shard
from rlinf_search.scheduler import GroupCall, wait_all
from rlinf_search.scheduler.channel import Channel
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.rollout.worker import RolloutWorker

POLL_S = 0.5
"""How often the driver, waiting for a group, checks that no rollout rank has died."""


@dataclass
class StreamedBatch:
    """What one streamed step rolled out and trained on."""

    trajectories: list[Trajectory]
    """Every trajectory of the step, in the step's prompt order (as a ``sync`` step has them)."""
    scores: list[RewardScore]
    """Their rewards, in the same order."""
    actor_metrics: list[dict[str, float]]
    """Per actor rank: each metric's mean over the step's mini-batches."""
    distill_metrics: dict[str, float] = field(default_factory=dict)
    """The teacher's metrics over the step's mini-batches (``TeacherScorer.merge_metrics``; empty without one)."""
    minibatches: list[list[int]] = field(default_factory=list)
    """The group (prompt) indices of each mini-batch, in the order the actor trained them."""
    seconds: dict[str, float] = field(default_factory=dict)
    """``first_update``: step start to the first mini-batch handed to the actor; ``last_group``: to the last
    group off the channel; ``reward``, ``inference``, ``teacher``: driver time spent on those passes."""


class StreamedStep:
    """Runs one streamed step over the runner's groups (``SearchR1Runner`` owns it and lends its passes)."""

    def __init__(self, runner, channel: Channel):
        """``runner``: the ``SearchR1Runner`` whose groups, config, scoring, log-prob and advantage passes this
        step uses; ``channel``: the run's channel for finished groups (one key per step)."""
        self.runner, self.channel = runner, channel
        config = runner.config
        self.group_size = config.group_size
        self.groups_per_minibatch = config.rollout_batch_size // config.actor.n_minibatches

    def run(self, records: list[QARecord], step: int) -> StreamedBatch:
        started = time.perf_counter()
        seconds = {"reward": 0.0, "inference": 0.0, "teacher": 0.0}
        key = f"step_{step}"
        rollout = self._launch(records, key)
        arrived: dict[int, list[Trajectory]] = {}
        scores: dict[int, list[RewardScore]] = {}
        waiting: list[FinishedGroup] = []
        train_calls: list[GroupCall] = []
        distill: list[dict[str, float]] = []
        minibatches: list[list[int]] = []
        while len(arrived) < len(records):
            group = self._next_group(key, rollout)
            if group.index in arrived or not 0 <= group.index < len(records):
                raise RuntimeError(f"streamed step {step}: group {group.index} from rollout rank {group.rank} is "
                                   "a duplicate or not of this step")
            arrived[group.index] = group.trajectories
            waiting.append(group)
            last = len(arrived) == len(records)
            if len(waiting) == self.groups_per_minibatch or last:
                chunk, waiting = waiting, []
                batch, chunk_scores, metrics = self._prepare(records, chunk, seconds, last=last)
                scores.update(chunk_scores)
                if metrics:
                    distill.append(metrics)
                minibatches.append([g.index for g in chunk])
                train_calls.append(self.runner.groups.actor.call(ActorWorker.train_minibatch, batch))
                seconds.setdefault("first_update", time.perf_counter() - started)
        seconds["last_group"] = time.perf_counter() - started
        wait_all(rollout)  # every rank has returned (they have put all their groups)
        per_call = wait_all(train_calls)  # [mini-batch][rank]
        order = range(len(records))
        return StreamedBatch(
            trajectories=[t for i in order for t in arrived[i]], scores=[s for i in order for s in scores[i]],
            actor_metrics=[mean_by_key([call[rank] for call in per_call]) for rank in range(len(per_call[0]))],
            distill_metrics=self.runner.teacher.merge_metrics(distill) if distill else {}, minibatches=minibatches,
            seconds=seconds)

    def _launch(self, records: list[QARecord], key: str) -> list[GroupCall]:
        """Each rollout rank streams its contiguous share of the prompts (the shares ``sync`` gives them)."""
        group = self.runner.groups.rollout
        calls, first = [], 0
        for rank, part in enumerate(shard(records, group.world_size)):
            calls.append(group.call_on(rank, RolloutWorker.stream_rollout, part, self.group_size, self.channel,
                                       key, first))
            first += len(part)
        return calls

    def _next_group(self, key: str, rollout: list[GroupCall]) -> FinishedGroup:
        """The next finished group; a rollout rank that failed or died stops the step with its error."""
        while True:
            try:
                return self.channel.get(key, timeout=POLL_S)
            except TimeoutError:
                for call in rollout:
                    call.raise_if_failed()

    def _prepare(self, records: list[QARecord], chunk: list[FinishedGroup], seconds: dict[str, float], *,
                 last: bool) -> tuple[RolloutBatch, dict[int, list[RewardScore]], dict[str, float]]:
        """A mini-batch of whole groups made ready to train: rewards, teacher, log-probs, advantages.
        ``last``: the step's last mini-batch (the teacher's failure window counts steps)."""
        runner = self.runner
        trajectories = [t for g in chunk for t in g.trajectories]
        chunk_records = [records[g.index] for g in chunk]
        teacher = runner.teacher.start(chunk_records, trajectories) if runner.teacher is not None else None
        clock = time.perf_counter()
        flat = runner.score(trajectories)
        seconds["reward"] += time.perf_counter() - clock
        batch = collate_trajectories(trajectories, [s.reward for s in flat], pad_id=0)
        clock = time.perf_counter()
        runner.compute_logprobs(batch)
        seconds["inference"] += time.perf_counter() - clock
        runner.compute_advantages(batch)  # group-local estimators only (config.pipeline): whole groups suffice
        metrics: dict[str, float] = {}
        if teacher is not None:
            clock = time.perf_counter()
            metrics = runner.teacher.apply(batch, teacher, ends_step=last)
            seconds["teacher"] += time.perf_counter() - clock
        per_group = {g.index: flat[i * self.group_size:(i + 1) * self.group_size] for i, g in enumerate(chunk)}
        return batch, per_group, metrics
