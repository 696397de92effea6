"""Where step metrics go: console, a jsonl file, TensorBoard, W&B. One backend per name, any combination.

``runner.logger.logger_backends: [console, jsonl, tensorboard]``. The jsonl file
(``LOG_PATH/metrics.jsonl``) is what ``python -m rlinf_search.plot`` draws. The run's settings (the
validated config) go to W&B as the run's ``config`` and to TensorBoard as hparams and as text.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Callable, Protocol

METRICS_FILE = "metrics.jsonl"


class MetricSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class ConsoleSink:
    """One line per step with the metrics people watch first."""

    KEYS = ("reward/mean", "reward/em", "rollout/searches_per_trajectory", "rollout/response_length",
            "actor/kl", "actor/grad_norm", "time/step_s")
    LABELS = {"reward/mean": "reward", "rollout/searches_per_trajectory": "searches"}

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = [f"{self.LABELS.get(key, key.split('/')[-1])}={metrics[key]:.4g}" for key in self.KEYS if key in metrics]
        print(f"step {step}: " + "  ".join(shown), flush=True)

    def close(self) -> None:
        pass


class JsonlSink:
    """Appends ``{"step": N, "time": t, metrics...}`` per step; a resumed run appends to the same file."""

    def __init__(self, log_path: Path):
        log_path.mkdir(parents=True, exist_ok=True)
        self._handle = open(log_path / METRICS_FILE, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        self._handle.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def flatten(settings: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become their JSON text (hparams take scalars only)."""
    flat: dict[str, object] = {}
    for key, value in settings.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, path))
        elif isinstance(value, (bool, int, float, str)) or value is None:
            flat[path] = "null" if value is None else value
        else:
            flat[path] = json.dumps(value)
    return flat


class TensorBoardSink:
    def __init__(self, log_path: Path, settings: dict):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self._writer = SummaryWriter(log_dir=str(log_path / "tensorboard"))
        if settings:
            # Written into this run's own event file (add_hparams would open a second run folder).
            for summary in hparams(flatten(settings), {}):
                self._writer.file_writer.add_summary(summary)
            self._writer.add_text("config", "```\n" + json.dumps(settings, indent=1) + "\n```")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """W&B reads its key from WANDB_API_KEY itself; it never passes through our config or logs."""

    def __init__(self, log_path: Path, project: str, experiment: str, settings: dict):
        import wandb

        self._run = wandb.init(project=project, name=experiment, dir=str(log_path), config=settings)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


SINKS: dict[str, Callable[..., MetricSink]] = {
    "console": lambda log_path, project, experiment, settings: ConsoleSink(),
    "jsonl": lambda log_path, project, experiment, settings: JsonlSink(log_path),
    "tensorboard": lambda log_path, project, experiment, settings: TensorBoardSink(log_path, settings),
    "wandb": WandbSink,
}
# The package each sink imports when it starts: checked by ``check_backends`` before any worker starts.
SINK_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_backends(backends: list[str] | tuple[str, ...]) -> None:
    """A one-line ``ValueError`` on a sink name that does not exist or whose package is not installed."""
    unknown = [b for b in backends if b not in SINKS]
    if unknown:
        raise ValueError(f"runner.logger.logger_backends: unknown {unknown}; choose from {sorted(SINKS)}")
    for name in backends:
        package = SINK_PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"runner.logger.logger_backends: {name} needs the {package} package, which is not "
                             f"installed (pip install {package})")


class MetricLogger:
    """Fans step metrics out to the configured sinks."""

    def __init__(self, log_path: Path, backends: list[str], *, project: str = "rlinf-search",
                 experiment: str = "run", settings: dict | None = None):
        """``settings``: the run's validated config, recorded by the sinks that keep one (W&B, TensorBoard)."""
        check_backends(backends)
        self.sinks = [SINKS[name](Path(log_path), project, experiment, settings or {}) for name in backends]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
