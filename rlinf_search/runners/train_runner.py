"""The training loop over worker groups: rollout, reward, log-probs, advantages, update, weight sync.

One step, collocated: the rollout group generates (its engine onloaded), the reward group scores,
the actor group (or an InferenceGroup on devices of its own) computes old and reference
log-probs, the critic group (GAE only) scores values, the driver computes advantages, the actor
and critic train, and the new weights go to the rollout group (and the InferenceGroup's policy
copy) with a version number.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlinf_search.algorithms import compute_advantages
from rlinf_search.checkpoint import RunnerState
from rlinf_search.config import RunConfig
from rlinf_search.data.batch import RolloutBatch, collate_trajectories
from rlinf_search.data.io_struct import QARecord, RewardScore, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.distill.scorer import open_teacher
from rlinf_search.progress import progress
from rlinf_search.runners.group_calls import (
    Groups,
    collect_rollout,
    launch_rollout,
    score_shards,
)
from rlinf_search.runners.metric_logger import MetricLogger
from rlinf_search.runners.prompt_sets import RunPrompts, load_run_prompts
from rlinf_search.runners.resume import restore_run, save_run
from rlinf_search.runners.rollout_dump import (
    append_batch_audit,
    append_minibatch_audit,
    dump_row,
    spread,
    write_dump,
)
from rlinf_search.runners.step_metrics import (
    StepTimer,
    step_metrics,
    validation_metrics,
)
from rlinf_search.runners.stream_step import StreamedStep
from rlinf_search.scheduler import Channel, WeightSync, wait_all
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.value_trainer import batch_value_metrics
from rlinf_search.workers.critic.worker import CriticWorker
from rlinf_search.workers.inference.worker import InferenceWorker
from rlinf_search.workers.tool.launch import search_group_metrics

log = logging.getLogger(__name__)


@dataclass
class PendingRollout:
    """A rollout launched ahead of its step (pipelined), or restored from a checkpoint."""

    records: list[QARecord]
    """The step's prompts."""
    calls: list = field(default_factory=list)
    """The rollout ranks' calls, until collected."""
    trajectories: list[Trajectory] | None = None
    """The trajectories, once collected."""

    def result(self) -> list[Trajectory]:
        if self.trajectories is None:
            self.trajectories = collect_rollout(self.calls)
        return self.trajectories


class SearchR1Runner:
    """Drives the groups step by step; checkpoints and resumes."""

    def __init__(self, config: RunConfig, groups: Groups, *, resumed_from: Path | None = None,
                 prompts: RunPrompts | None = None):
        """``prompts``: the run's prompts as ``load_run_prompts`` returns them (read here when None)."""
        self.config, self.groups = config, groups
        self.ckpt_dir = Path(config.runner.output_dir) / "checkpoints"
        if prompts is None:
            prompts = load_run_prompts(train_paths=config.train_data_paths, val_paths=config.val_data_paths,
                                       model_path=config.rollout.model_path, limit=config.prompt_limit)
        self.stream = PromptStream(prompts.train.records, config.rollout_batch_size, shuffle=config.shuffle,
                                   seed=config.seed)
        self.val_records = prompts.val.records
        # Prompts dropped as overlong shorten an epoch; the run ends with its last epoch, as validate_cfg
        # planned from the prompt count before the drop.
        self.total_steps = min(config.total_steps, config.runner.max_epochs * self.stream.batches_per_epoch)
        self.state = RunnerState()
        self.pipelined = config.runner.pipeline == "overlap"  # the next step's rollout runs ahead
        self._prefetched: PendingRollout | None = None
        self._unsynced_version: int | None = None
        if resumed_from is not None:
            self._resume(Path(resumed_from))
        self._trained_position = (self.stream.epoch, self.stream.batch_in_epoch)
        if self._prefetched is not None:  # its prompts are the next batch of the stream
            self._prefetched.records = self.stream.next_batch()
        self.logger = MetricLogger(Path(config.runner.log_path), list(config.runner.logger_backends),
                                   project=config.runner.project_name, experiment=config.runner.experiment_name,
                                   settings=config.settings)
        receivers = {"rollout": groups.engine_group, "inference": groups.inference}
        self.weight_sync = WeightSync(groups.actor, [receivers[name] for name in config.logprobs.weight_receivers])
        # An engine on the actor's devices steps aside while the actor works (a no-op on CPU).
        shared = set(groups.engine_group.placement.devices) & set(groups.actor.placement.devices)
        self._offload_engine = bool(shared) and config.runner.pipeline == "sync"
        self.teacher = open_teacher(config.distill, student_model=config.rollout.model_path) if config.distill else None
        self.streamed = None
        if config.runner.pipeline == "stream":
            self.streamed = StreamedStep(self, Channel.create("finished_groups"))

    def _resume(self, folder: Path) -> None:
        self.state, pending = restore_run(folder, self.groups, pipelined=self.pipelined)
        self.stream.seek(self.state.epoch, self.state.batch_in_epoch)
        if pending is not None:
            self._prefetched = PendingRollout(records=[], trajectories=pending)

    # ---- one step ---------------------------------------------------------------------------
    def _rollout(self, records: list[QARecord], samples: int, *, greedy: bool = False) -> list[Trajectory]:
        if self._offload_engine:  # the engine servers' onload and offload, or the inline rollout ranks'
            self.groups.engine_group.call("onload").wait()
        trajectories = collect_rollout(launch_rollout(self.groups.rollout, records, samples, greedy=greedy))
        if self._offload_engine:
            self.groups.engine_group.call("offload").wait()
        return trajectories

    # score, compute_logprobs and compute_advantages are the step's passes; a streamed step
    # (runners/stream_step.py) runs them on each mini-batch of groups as it arrives.
    def score(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        """Rewards of ``trajectories`` in their order, each reward rank scoring its own share."""
        return score_shards(self.groups.reward, trajectories)

    def _values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` critic values before this step's update, computed on every model, observation and
        padding position; GAE reads them on model tokens only (see ``algorithms.advantages.gae``). Every
        critic rank gets the whole batch and returns its token-balanced share of the rows."""
        shares = self.groups.critic.call(CriticWorker.compute_values, batch).wait()
        return place_rows(tuple(batch.response_mask.shape), shares)

    def compute_advantages(self, batch: RolloutBatch) -> None:
        """Advantages (and, with a critic, values and returns) on ``batch``.

        GAE runs over model tokens only: an observation token is the environment's move, not a time
        step, so a turn's last token bootstraps from the value of the next turn's first token, whose
        state already contains the observation; values on observation and padding tokens are never
        read. The outcome reward sits on the last model token; KL stays a loss term, not a reward.
        """
        if self.groups.critic is not None:
            batch.values = self._values(batch)
        out = compute_advantages(self.config.adv_type, rewards=batch.rewards, response_mask=batch.response_mask,
                                 uids=batch.uids, values=batch.values, gamma=self.config.gamma, lam=self.config.lam,
                                 normalize_advantages=self.config.normalize_advantages)
        batch.advantages, batch.returns = out.advantages, out.returns

    def _update(self, batch: RolloutBatch) -> tuple[list[dict], list[dict]]:
        """Actor and critic updates, run at once (separate processes); during ``critic.warmup_steps``
        only the critic trains. Returns the metrics of each group's ranks."""
        critic = self.config.critic
        train_actor = critic is None or self.state.global_step >= critic.warmup_steps
        # Every rank gets the whole batch (put in the object store once) and trains on its share of it.
        actor_calls = [self.groups.actor.call(ActorWorker.train, batch)] if train_actor else []
        critic_calls = [self.groups.critic.call(CriticWorker.train, batch)] if critic is not None else []
        results = wait_all(actor_calls + critic_calls)
        actor_metrics = results[0] if train_actor else []
        return actor_metrics, results[-1] if critic is not None else []

    def compute_logprobs(self, batch: RolloutBatch) -> None:
        """Old (recomputed, else the engine's) and reference log-probs, where ``config.logprobs`` says."""
        plan = self.config.logprobs
        recompute, kl = plan.recompute, plan.kl
        if plan.scorer is not None:
            if plan.scorer == "inference":
                group, method = self.groups.inference, InferenceWorker.compute_logprobs
            else:
                group, method = self.groups.actor, ActorWorker.compute_logprobs
            # Each rank scores its share of the rows.
            results = group.call(method, batch, old=recompute, ref=kl).wait()
            shape = tuple(batch.response_mask.shape)
            batch.old_logprobs = place_rows(shape, [(r.rows, r.old) for r in results]) if recompute else None
            batch.ref_logprobs = place_rows(shape, [(r.rows, r.ref) for r in results]) if kl else None
        if not recompute:
            batch.old_logprobs = batch.rollout_logprobs.clone()

    def _next_rollout(self, timer: StepTimer, *, prefetch: bool) -> tuple[list[QARecord], list[Trajectory]]:
        """This step's prompts and trajectories.

        Collocated, the rollout runs now. Pipelined (rollout and actor on disjoint devices), the
        rollout of the next step is launched before this step trains, with the weights the rollout
        group has then, so generation and training overlap; the policy that sampled a batch is one
        update behind the one that trains on it (the recomputed old log-probs and the PPO clip
        account for that).
        """
        if not self.pipelined:
            records = self.stream.next_batch()
            self._trained_position = (self.stream.epoch, self.stream.batch_in_epoch)
            with timer.phase("rollout"):
                return records, self._rollout(records, self.config.group_size)
        if self._prefetched is None:
            self._prefetched = self._prefetch()
        records = self._prefetched.records
        self._trained_position = (self.stream.epoch, self.stream.batch_in_epoch)
        with timer.phase("rollout"):
            trajectories = self._prefetched.result()
        if self._unsynced_version is not None:
            with timer.phase("weight_sync"):
                self.weight_sync.sync(version=self._unsynced_version)
            self._unsynced_version = None
        self._prefetched = self._prefetch() if prefetch else None
        return records, trajectories

    def _prefetch(self) -> PendingRollout:
        records = self.stream.next_batch()
        return PendingRollout(records, calls=launch_rollout(self.groups.rollout, records, self.config.group_size))

    def train_step(self, *, prefetch: bool = False) -> dict[str, float]:
        if self.streamed is not None:
            return self._streamed_train_step()
        timer = StepTimer()
        records, trajectories = self._next_rollout(timer, prefetch=prefetch)
        # The teacher scores the trajectories while rewards and log-probs are computed.
        teacher_scoring = self.teacher.start(records, trajectories) if self.teacher is not None else None
        append_batch_audit(self.config.runner.log_path, self.state.global_step + 1, records, trajectories)
        with timer.phase("reward"):
            scores = self.score(trajectories)
        self._dump(f"step_{self.state.global_step + 1}", records, trajectories, scores,
                   keep=spread(len(trajectories), self.config.runner.rollout_dump))
        batch = collate_trajectories(trajectories, [s.reward for s in scores], pad_id=0)
        with timer.phase("inference"):
            self.compute_logprobs(batch)
        with timer.phase("advantages"):  # with a critic, its forward pass is most of it
            self.compute_advantages(batch)
        distill_metrics = {}
        if teacher_scoring is not None:
            with timer.phase("teacher"):  # only the wait for answers still in flight
                distill_metrics = self.teacher.apply(batch, teacher_scoring)
        with timer.phase("training"):
            actor_metrics, critic_metrics = self._update(batch)
        if self.pipelined:
            self._unsynced_version = self.state.global_step + 1  # sent once the rollout in flight is done
        else:
            with timer.phase("weight_sync"):
                self.weight_sync.sync(version=self.state.global_step + 1)
        metrics = step_metrics(trajectories, scores, actor_metrics + critic_metrics, timer)
        if self.groups.critic is not None:
            metrics.update(batch_value_metrics(batch))
        metrics.update(distill_metrics)
        if self.groups.search is not None:
            metrics.update(search_group_metrics(self.groups.search))
        return metrics

    def _streamed_train_step(self) -> dict[str, float]:
        """``runner.pipeline: stream``: rollout, scoring and mini-batch updates overlap within the step
        (``stream_step``); the weights go out once every mini-batch is trained."""
        timer = StepTimer()
        records = self.stream.next_batch()
        self._trained_position = (self.stream.epoch, self.stream.batch_in_epoch)
        step = self.state.global_step + 1
        with timer.phase("stream"):  # rollout, with scoring and training of the groups that finished first
            done = self.streamed.run(records, step)
        with timer.phase("weight_sync"):
            self.weight_sync.sync(version=step)
        append_batch_audit(self.config.runner.log_path, step, records, done.trajectories)
        append_minibatch_audit(self.config.runner.log_path, step, done.minibatches)
        self._dump(f"step_{step}", records, done.trajectories, done.scores,
                   keep=spread(len(done.trajectories), self.config.runner.rollout_dump))
        metrics = step_metrics(done.trajectories, done.scores, done.actor_metrics, timer)
        metrics.update({f"stream/{name}_s": value for name, value in done.seconds.items()})
        metrics["stream/minibatches"] = float(len(done.minibatches))
        metrics.update(done.distill_metrics)
        if self.groups.search is not None:
            metrics.update(search_group_metrics(self.groups.search))
        return metrics

    def _dump(self, name: str, records: list[QARecord], trajectories: list[Trajectory], scores: list[RewardScore],
              *, keep: list[int]) -> None:
        """``runner.rollout_dump``: the trajectories at ``keep`` to ``output_dir/rollouts/{name}.jsonl``.
        ``records[i // samples]`` is trajectory i's prompt (each prompt's samples are consecutive)."""
        if not keep:
            return
        samples = len(trajectories) // len(records)
        write_dump(self.config.runner.output_dir, name,
                   [dump_row(records[i // samples], trajectories[i], scores[i]) for i in keep])

    # ---- validation, checkpoints, the loop --------------------------------------------------
    def _flush_weights(self) -> None:
        """Pipelined: give the rollout group the newest weights now (after any rollout in flight)."""
        if self._unsynced_version is not None:
            self.weight_sync.sync(version=self._unsynced_version)
            self._unsynced_version = None

    def validate(self) -> dict[str, float]:
        """Greedy rollouts of every validation prompt: EM, reward and searches overall and per data source
        (``val/em/<source>``, ``val/searches/<source>``); with ``runner.rollout_dump``, every scored
        trajectory goes to ``rollouts/val_step_K.jsonl``."""
        if not self.val_records:
            return {}
        self._flush_weights()
        trajectories = self._rollout(self.val_records, 1, greedy=True)
        scores = self.score(trajectories)
        if self.config.runner.rollout_dump:
            self._dump(f"val_step_{self.state.global_step}", self.val_records, trajectories, scores,
                       keep=list(range(len(trajectories))))
        return validation_metrics(self.val_records, trajectories, scores)

    def save(self) -> Path:
        # The position after the batch just trained on, not after one prefetched for the next step.
        self.state.epoch, self.state.batch_in_epoch = self._trained_position
        pending = self._prefetched.result if self._prefetched is not None else None
        return save_run(self.ckpt_dir, self.state, self.groups, pending)

    def fit(self) -> None:
        runner = self.config.runner
        total = self.total_steps  # min(max_steps, max_epochs x batches per epoch)
        with progress(total=total, initial=self.state.global_step, desc="train", unit="step") as bar:
            while self.state.global_step < total:
                metrics = self.train_step(prefetch=self.state.global_step + 1 < total)
                self.state.global_step += 1
                step = self.state.global_step
                if runner.val_check_interval and step % runner.val_check_interval == 0:
                    metrics.update(self.validate())  # a prefetched rollout finishes first (calls queue per rank)
                self.logger.log(metrics, step)
                if (runner.save_interval and step % runner.save_interval == 0) or step == total:
                    self.save()
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                                searches=f"{metrics['rollout/searches_per_trajectory']:.2f}")
        self._flush_weights()
        self.logger.close()
        if self.teacher is not None:
            self.teacher.close()
        if self.streamed is not None:
            self.streamed.channel.close()

