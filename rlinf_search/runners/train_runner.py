"""The training loop: a step is a short recipe over the run's stages (``runners/stages``).

One step: the rollout source hands on the step's finished GRPO groups (all at once in ``sync`` and
``overlap``, a mini-batch at a time in ``stream`` and ``async``); each batch of groups is prepared (teacher,
reward, old and reference log-probs, values, advantages) and given to the update; the new weights then go to
the engines (and the InferenceGroup's policy copy) with a version number, at once (``async``: the engines take
them at a token boundary, the requests in flight continuing on them) or, in ``overlap``, once no rollout is in flight.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlinf_search.checkpoint import RunnerState
from rlinf_search.config import RunConfig
from rlinf_search.data.io_struct import QARecord, RewardScore, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.progress import progress
from rlinf_search.runners.group_calls import Groups
from rlinf_search.runners.infra_failures import InfraFailureTally, refuse_infra_failures
from rlinf_search.runners.rank_restarts import RankRestarts
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
from rlinf_search.runners.stages import PreparedBatch, build_stages, engine_rollout
from rlinf_search.runners.step_metrics import (
    EngineActivityMeter,
    StepTimer,
    staleness_metrics,
    step_metrics,
    validation_metrics,
)
from rlinf_search.monitors import CollapseWatch
from rlinf_search.runners.collapse import CollapseStop, last_checkpoint_before, report_firings, resumed_watch
from rlinf_search.scheduler import WeightSync
from rlinf_search.workers.tool.launch import SearchGroupMeter

log = logging.getLogger(__name__)


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
        restored = None
        if resumed_from is not None:
            self.state, restored = restore_run(Path(resumed_from), groups, pipelined=config.runner.pipeline.ahead)
            self.stream.seek(self.state.epoch, self.state.batch_in_epoch)
        self.logger = MetricLogger(Path(config.runner.log_path), list(config.runner.logger_backends),
                                   project=config.runner.project_name, experiment=config.runner.experiment_name,
                                   settings=config.settings)
        receivers = {"rollout": groups.engine_group, "inference": groups.inference}
        self.weight_sync = WeightSync(groups.actor, [receivers[name] for name in config.logprobs.weight_receivers],
                                      bucket_bytes=config.rollout.update_weights_bucket_megabytes << 20)
        self.restarts = RankRestarts(groups, lambda: self.weight_sync, max_restarts=config.cluster.max_restarts)
        self.stages = build_stages(config, groups, self.stream, self.weight_sync, restored=restored,
                                   first_step=self.state.global_step + 1, last_step=self.total_steps,
                                   restarts=self.restarts)
        self._engine_activity = EngineActivityMeter(
            groups.engine_group, groups.engine_worker.engine_activity,
            # Lost rollout ranks are started again; engine servers are not (the meter reads them when there are).
            losses_recovered=self.restarts.covers and self.stages.source.restarts is not None and groups.engines is None)
        self._engine_activity.step()  # the baseline the first step's engine-idle share is measured from
        self._search_meter = SearchGroupMeter(groups.search) if groups.search is not None else None
        self.watch = CollapseWatch(config.monitors)
        self._tokenizer = None
        if resumed_from is not None:  # the monitors' baselines and firings from the steps already run
            self.watch = resumed_watch(config.monitors, Path(config.runner.log_path), upto=self.state.global_step)

    # ---- one step ---------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        stages, step = self.stages, self.state.global_step + 1
        timer = StepTimer()
        rollout = stages.source.begin(step, timer)
        infra = InfraFailureTally(step, len(rollout.records), max_share=self.config.runner.max_infra_failed_share)
        prepared: list[PreparedBatch] = []
        for handed in rollout.batches():
            groups = infra.keep(handed)  # a group a service failed is never scored or trained
            if rollout.minibatches and len(groups) < len(handed):
                rollout.minibatches[-1] = [g.index for g in groups]
            if not groups:
                continue
            part = stages.prepare(rollout.records, groups, rollout.passes, ends_step=rollout.last_batch,
                                  trained_version=step - 1)
            stages.update.submit(part.batch, timer, completed_steps=step - 1)
            prepared.append(part)
        trained = stages.update.finish()
        source_metrics = rollout.end()
        stages.weights.after_update(step, timer)

        records, trajectories, scores, advantages = _in_prompt_order(prepared, rollout.records)
        append_batch_audit(self.config.runner.log_path, step, records, trajectories, dropped=infra.dropped_uids)
        if rollout.minibatches:  # a streamed step's mini-batches, in the order the actor trained them
            append_minibatch_audit(self.config.runner.log_path, step, [m for m in rollout.minibatches if m])
        self._dump(f"step_{step}", records, trajectories, scores,
                   keep=spread(len(trajectories), self.config.runner.rollout_dump), advantages=advantages)
        metrics = step_metrics(trajectories, scores, trained.actor + trained.critic, timer)
        metrics.update(infra.metrics())
        metrics.update(self.restarts.metrics())
        metrics.update(staleness_metrics(trajectories, trained_version=step - 1))
        metrics.update(source_metrics)
        metrics.update(self._engine_activity.step())
        part_metrics = [part.metrics for part in prepared if part.metrics]
        if len(part_metrics) == 1:
            metrics.update(part_metrics[0])
        elif part_metrics:  # a streamed step's mini-batches: the teacher's counts add up, the rest are means
            metrics.update(stages.prepare.teacher.merge_metrics(part_metrics))
        if self._search_meter is not None:
            metrics.update(self._search_meter.step())
        return metrics

    def _dump(self, name: str, records: list[QARecord], trajectories: list[Trajectory], scores: list[RewardScore],
              *, keep: list[int], advantages: list[float] | None = None) -> None:
        """``runner.rollout_dump``: the trajectories at ``keep`` to ``output_dir/rollouts/{name}.jsonl``, each
        span with its tokens' text (``rlinf-search view`` colours them). ``records[i // samples]`` is trajectory
        i's prompt (each prompt's samples are consecutive); ``advantages``: each trajectory's, where trained."""
        if not keep:
            return
        samples = len(trajectories) // len(records)
        write_dump(self.config.runner.output_dir, name,
                   [dump_row(records[i // samples], trajectories[i], scores[i], sample=i % samples,
                             advantage=None if advantages is None else advantages[i], pieces=self._token_pieces)
                    for i in keep])

    def _token_pieces(self, ids: list[int]) -> list[str]:
        """Each id's text, by the policy's tokenizer (loaded here on the first dump)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.rollout.model_path)
        return [self._tokenizer.decode([i]) for i in ids]

    # ---- validation, checkpoints, the loop --------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Greedy rollouts of every validation prompt: EM, reward and searches overall and per data source
        (``val/em/<source>``, ``val/searches/<source>``); with ``runner.rollout_dump``, every scored
        trajectory goes to ``rollouts/val_step_K.jsonl``."""
        if not self.val_records:
            return {}
        self.stages.weights.flush()  # overlap: the newest update, once no rollout is in flight
        trajectories = engine_rollout(self.groups, self.val_records, 1, greedy=True, offload=self.stages.source.offload,
                                      restarts=self.restarts)
        refuse_infra_failures(trajectories, what=f"validation after step {self.state.global_step}")
        scores = self.stages.prepare.reward(trajectories)
        if self.config.runner.rollout_dump:
            self._dump(f"val_step_{self.state.global_step}", self.val_records, trajectories, scores,
                       keep=list(range(len(trajectories))))
        return validation_metrics(self.val_records, trajectories, scores)

    def save(self) -> Path:
        # The position after the batch just trained on, not after those admitted ahead for later steps.
        self.state.epoch, self.state.batch_in_epoch = self.stages.source.trained_position
        self.stages.source.before_checkpoint()
        return save_run(self.ckpt_dir, self.state, self.groups, self.stages.source.pending)

    def fit(self) -> None:
        runner = self.config.runner
        total = self.total_steps  # min(max_steps, max_epochs x batches per epoch)
        with progress(total=total, initial=self.state.global_step, desc="train", unit="step") as bar:
            while self.state.global_step < total:
                metrics = self.train_step()
                self.state.global_step += 1
                step = self.state.global_step
                if runner.val_check_interval and step % runner.val_check_interval == 0:
                    metrics.update(self.validate())  # overlap: the rollout in flight finishes first, then the weights go out
                firings = self.watch.observe(step, metrics)
                metrics.update({f"monitor/{f.monitor}": 1.0 for f in firings})
                self.logger.log(metrics, step)
                stop = report_firings(firings, Path(runner.log_path))
                if stop is not None:  # this step's checkpoint is not written: the collapse is in it
                    self.logger.close()
                    self.stages.close()
                    raise CollapseStop(f"{stop.line}; monitors.stop_on names it, so the run stops here; the last "
                                       f"checkpoint before the collapse: {last_checkpoint_before(self.ckpt_dir, stop.since)}")
                if (runner.save_interval and step % runner.save_interval == 0) or step == total:
                    self.save()
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                                searches=f"{metrics['rollout/searches_per_trajectory']:.2f}")
        self.stages.weights.flush()
        self.logger.close()
        self.stages.close()


def _in_prompt_order(prepared: list[PreparedBatch], records: list[QARecord]
                     ) -> tuple[list[QARecord], list[Trajectory], list[RewardScore], list[float]]:
    """The prompts a step trained, their trajectories, rewards and advantages (each trajectory's mean over its
    trained tokens) in the prompts' order (each prompt's samples consecutive), from its prepared batches of groups
    in whatever order the groups finished. A group dropped for an infrastructure failure is in no batch, so its
    prompt is left out."""
    by_index = {}
    for part in prepared:
        row = 0
        means = trained_means(part.batch)
        for group in part.groups:
            size = len(group.trajectories)
            by_index[group.index] = (group.trajectories, part.scores[row:row + size], means[row:row + size])
            row += size
    order = sorted(by_index)
    return ([records[i] for i in order], [t for i in order for t in by_index[i][0]],
            [s for i in order for s in by_index[i][1]], [a for i in order for a in by_index[i][2]])


def trained_means(batch) -> list[float]:
    """Each row's advantage, averaged over the tokens it trained (``response_mask``)."""
    if batch.advantages is None:
        return [float("nan")] * len(batch.uids)
    mask = batch.response_mask.to(batch.advantages.dtype)
    return ((batch.advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).tolist()
