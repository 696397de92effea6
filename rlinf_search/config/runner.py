"""``RunnerConfig``: the typed view of the ``runner`` section (steps, intervals, outputs, logging), and the
resolved ``runner.pipeline`` it carries (``PipelineSettings``; ``config/pipeline.py`` resolves it).

``validate_cfg`` builds it from the parsed ``runner`` section (``config/model.py``, where each key's type, range and
default are declared).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path



@dataclass(frozen=True)
class PipelineSettings:
    """``runner.pipeline`` and the keys that shape it, resolved for the run."""

    name: str
    """``sync``, ``overlap``, ``stream`` or ``async``."""
    max_staleness: int = 0
    """Steps the rollout may run ahead of the update (``runner.max_staleness``): a token sampled by policy
    version v is trained by an update no later than v + max_staleness. 0 for the on-policy pipelines."""
    partial_rollout: bool = False
    """New weights reach the engines while trajectories are in flight, at a token boundary where the engine can
    abort (``runner.partial_rollout``); false: only when no rollout is in flight."""

    @property
    def per_minibatch(self) -> bool:
        """The update takes one mini-batch of groups at a time, as they are ready (``stream``, ``async``)."""
        return self.name in ("stream", "async")

    @property
    def ahead(self) -> bool:
        """The rollout runs ahead of the update (``overlap``, ``async``)."""
        return self.max_staleness > 0


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """``runner``: how long to train, when to validate and save, where outputs go (its keys are declared in
    ``config/model.py``'s ``RunnerSection``)."""

    output_dir: str
    """Root of the run's outputs (checkpoints, logs, eval)."""
    experiment_name: str = "run"
    """The run's name in the metric sinks (the W&B run name): ``runner.logger.experiment_name``, else
    ``runner.experiment_name``."""
    max_steps: int | None = 100
    """Training steps (rollout + update) to run; the run stops at ``max_epochs`` first if that comes first.
    None (written ``-1``, as RLinf and verl do): no step limit, ``max_epochs`` decides."""
    max_epochs: int = 1
    """Passes over the training data."""
    val_check_interval: int = 0
    """Validate every N steps (0: never during training)."""
    save_interval: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    seq_length: int = 4096
    """Prompt + response token budget per trajectory."""
    max_tokens_per_mbs: int | None = None
    """Token budget of one micro-batch (forward/backward)."""
    resume_dir: str | None = None
    """A checkpoint folder to resume from, or ``auto`` for the newest one under ``output_dir``."""
    log_path: str = ""
    """Where metrics.jsonl and TensorBoard files go (unset: ``<output_dir>/logs``)."""
    logger_backends: tuple[str, ...] = ("console", "jsonl")
    """Metric sinks (names and their packages checked by ``validate_cfg``)."""
    project_name: str = "rlinf-search"
    """W&B project."""
    rollout_dump: int = 0
    """Trajectories of each step written to ``output_dir/rollouts/step_K.jsonl`` (and, when > 0, every
    validation trajectory to ``val_step_K.jsonl``); 0: none."""
    max_infra_failed_share: float = 0.25
    """A step whose share of GRPO groups dropped for an infrastructure failure (a search server down after the
    groups' re-runs, ``agentloop.infra_reruns``) is above this stops the run in one line naming the failure; at or
    below it, the step trains the rest. 0: any dropped group stops the run."""
    pipeline: PipelineSettings = PipelineSettings("sync")
    """How a step overlaps rollout and training (``config/pipeline.py``): ``runner.pipeline`` (``sync``,
    ``overlap``, ``stream`` or ``async``; unset, ``overlap`` on a disaggregated placement, else ``sync``) with
    ``runner.max_staleness`` and ``runner.partial_rollout``."""

    def __post_init__(self) -> None:
        if not self.log_path:
            object.__setattr__(self, "log_path", str(Path(self.output_dir) / "logs"))
