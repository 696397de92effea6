"""``RunnerConfig``: the typed view of the ``runner`` section (steps, intervals, outputs, logging), and the
resolved ``runner.pipeline`` it carries (``PipelineSettings``; ``config/pipeline.py`` resolves it).

Each field declares the key it reads (``declared``): its type, range and default are written here once, and
``SCHEMA``'s ``runner`` section is made from them (``section_tree``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

from rlinf_search.key_declarations import STR, STRS, Float, Int, declared


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


def _step_limit(steps: int) -> int | None:
    return None if steps == -1 else steps


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """``runner``: how long to train, when to validate and save, where outputs go. Each field declares the key it
    reads (``declared``); ``SCHEMA``'s ``runner`` section is made from them."""

    output_dir: str = declared(MISSING, STR)
    """Root of the run's outputs (checkpoints, logs, eval)."""
    experiment_name: str = declared("run", STR)
    """The run's name in the metric sinks (the W&B run name): ``runner.logger.experiment_name``, else
    ``runner.experiment_name``."""
    max_steps: int | None = declared(100, Int(ge=1, also=((-1, "no step limit: runner.max_epochs ends the run"),)),
                                     convert=_step_limit)
    """Training steps (rollout + update) to run; the run stops at ``max_epochs`` first if that comes first.
    None (written ``-1``, as RLinf and verl do): no step limit, ``max_epochs`` decides."""
    max_epochs: int = declared(1, Int(ge=1))
    """Passes over the training data."""
    val_check_interval: int = declared(0, Int(ge=0))
    """Validate every N steps (0: never during training)."""
    save_interval: int = declared(0, Int(ge=0))
    """Checkpoint every N steps (0: only at the end)."""
    seq_length: int = declared(4096, Int(ge=2))
    """Prompt + response token budget per trajectory."""
    max_tokens_per_mbs: int | None = declared(None, Int(ge=1))
    """Token budget of one micro-batch (forward/backward)."""
    resume_dir: str | None = declared(None, STR)
    """A checkpoint folder to resume from, or ``auto`` for the newest one under ``output_dir``."""
    log_path: str = declared("", STR, at="logger.log_path", default_words="`<output_dir>/logs`")
    """Where metrics.jsonl and TensorBoard files go (unset: ``<output_dir>/logs``)."""
    logger_backends: tuple[str, ...] = declared(("console", "jsonl"), STRS, at="logger.logger_backends",
                                                convert=tuple)
    """Metric sinks (names and their packages checked by ``validate_cfg``)."""
    project_name: str = declared("rlinf-search", STR, at="logger.project_name")
    """W&B project."""
    rollout_dump: int = declared(0, Int(ge=0))
    """Trajectories of each step written to ``output_dir/rollouts/step_K.jsonl`` (and, when > 0, every
    validation trajectory to ``val_step_K.jsonl``); 0: none."""
    max_infra_failed_share: float = declared(0.25, Float(ge=0, le=1))
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
