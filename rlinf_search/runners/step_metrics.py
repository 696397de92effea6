"""What a training step and a validation report: phase times, rollout, reward and per-rank metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from rlinf_search.agents.searchr1.metrics import rollout_metrics
from rlinf_search.data.io_struct import QARecord, RewardScore, Trajectory


@dataclass
class StepTimer:
    """Wall time per phase of one step."""

    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each named phase (a phase entered twice adds up)."""

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def step_metrics(trajectories: list[Trajectory], scores: list[RewardScore], rank_metrics: list[dict],
                 timer: StepTimer) -> dict[str, float]:
    """``rank_metrics``: one dict per trained rank (actor and critic); each key is averaged over ranks."""
    metrics = rollout_metrics(trajectories)
    metrics["reward/mean"] = sum(s.reward for s in scores) / len(scores)
    metrics["reward/em"] = sum(s.em for s in scores) / len(scores)
    for key in dict.fromkeys(key for m in rank_metrics for key in m):
        reported = [m[key] for m in rank_metrics if key in m]
        metrics[key] = sum(reported) / len(reported)
    total = sum(timer.seconds.values())
    metrics.update({f"time/{name}_s": value for name, value in timer.seconds.items()})
    metrics["time/step_s"] = total
    metrics["throughput/tokens_per_s"] = sum(len(t.response_ids) for t in trajectories) / max(total, 1e-9)
    return metrics


def validation_metrics(records: list[QARecord], trajectories: list[Trajectory],
                       scores: list[RewardScore]) -> dict[str, float]:
    """Means over all validation questions, and EM and searches per data source."""
    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    metrics = {"val/em": mean(s.em for s in scores), "val/reward": mean(s.reward for s in scores),
               "val/searches_per_trajectory": mean(t.num_searches for t in trajectories)}
    for source in sorted({r.data_source for r in records}):
        rows = [i for i, r in enumerate(records) if r.data_source == source]
        metrics[f"val/em/{source}"] = mean(scores[i].em for i in rows)
        metrics[f"val/searches/{source}"] = mean(trajectories[i].num_searches for i in rows)
    return metrics
