"""Collapse monitors: rules over a run's per-step metrics that say, in one line, when a run is collapsing.

Reward lags the collapse of the reasoning (the policy stops searching, its entropy falls to nothing, its text
repeats, the answer format breaks), so each of those is watched on its own. A monitor reads one value a step
(``Monitor.read``), crosses its threshold (``Monitor.crossed``, against the run's baseline where the threshold is
relative) and fires once it has been crossed for ``patience`` steps in a row; it fires once per run. Monitors are
registered by name (``MONITORS``); ``monitors.stop_on`` names those whose firing stops the run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.registry import Registry


@dataclass(frozen=True)
class Monitor:
    """One rule: the value it reads from a step's metrics and when that value is a collapse."""

    metric: str
    """What it watches, as the metrics name it (the line says it)."""
    read: Callable[[dict], float | None]
    """The step's value (None: not logged this step)."""
    crossed: Callable[[float, float | None, MonitorsConfig], bool]
    """Whether ``value`` is past the threshold, given the baseline (None while the baseline steps are not all seen:
    a relative rule waits for it)."""
    threshold: Callable[[float | None, MonitorsConfig], str]
    """The threshold in words, for the line."""
    relative: bool = False
    """The threshold is a share of the baseline."""
    patience: Callable[[MonitorsConfig], int] = lambda c: c.patience
    """Steps in a row the threshold must be crossed."""


MONITORS: Registry[Monitor] = Registry("collapse monitor", dotted_paths=False)
"""The monitors every run watches, by the name ``monitors.stop_on`` and the lines use."""


def _key(name: str) -> Callable[[dict], float | None]:
    def read(metrics: dict) -> float | None:
        value = metrics.get(name)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
    return read


def _largest(pattern: str) -> Callable[[dict], float | None]:
    compiled = re.compile(pattern)

    def read(metrics: dict) -> float | None:
        values = [float(v) for k, v in metrics.items() if compiled.fullmatch(k) and isinstance(v, (int, float))
                  and math.isfinite(v)]
        return max(values) if values else None
    return read


def _below_share(share: Callable[[MonitorsConfig], float]):
    def crossed(value: float, baseline: float | None, cfg: MonitorsConfig) -> bool:
        return baseline is not None and baseline > 0 and value < share(cfg) * baseline
    return crossed


def _above(limit: Callable[[MonitorsConfig], float]):
    return lambda value, baseline, cfg: value > limit(cfg)


MONITORS.register("entropy", Monitor(
    "actor/entropy", _key("actor/entropy"), _below_share(lambda c: c.entropy_floor),
    lambda b, c: f"{c.entropy_floor:g} x its baseline {b:.3g}", relative=True))
MONITORS.register("searches", Monitor(
    "rollout/searches_per_trajectory", _key("rollout/searches_per_trajectory"),
    # a policy that never searched is not collapsing: the rule needs a baseline that did
    lambda v, b, c: b is not None and b >= 0.05 and v < 0.005,
    lambda b, c: f"0 searches (baseline {b:.3g})", relative=True, patience=lambda c: c.search_zero_steps))
MONITORS.register("length", Monitor(
    "rollout/response_length", _key("rollout/response_length"), _below_share(lambda c: c.length_floor),
    lambda b, c: f"{c.length_floor:g} x its baseline {b:.3g}", relative=True))
MONITORS.register("repetition", Monitor(
    "rollout/repetition_share", _key("rollout/repetition_share"), _above(lambda c: c.repetition_max),
    lambda b, c: f"{c.repetition_max:g}"))
MONITORS.register("format", Monitor(
    "rollout/format_violation_rate", _key("rollout/format_violation_rate"), _above(lambda c: c.format_violation_max),
    lambda b, c: f"{c.format_violation_max:g}"))
MONITORS.register("retrieval", Monitor(
    "rollout/retrieval_hit_rate", _key("rollout/retrieval_hit_rate"), _below_share(lambda c: c.retrieval_hit_floor),
    lambda b, c: f"{c.retrieval_hit_floor:g} x its baseline {b:.3g}", relative=True))
MONITORS.register("kl", Monitor("actor/kl", _key("actor/kl"), _above(lambda c: c.kl_max), lambda b, c: f"{c.kl_max:g}"))
MONITORS.register("clip", Monitor(
    "actor/clip_fraction", _key("actor/clip_fraction"), _above(lambda c: c.clip_fraction_max),
    lambda b, c: f"{c.clip_fraction_max:g}"))
MONITORS.register("is_weight", Monitor(
    "actor/lag_*/is_weight_max", _largest(r"actor/(lag_\d+/)?is_weight_max"), _above(lambda c: c.is_weight_max),
    lambda b, c: f"{c.is_weight_max:g}"))


def check_stop_on(names: tuple[str, ...]) -> None:
    """Every ``monitors.stop_on`` name is a monitor (or ``all``); else a one-line ValueError."""
    unknown = [n for n in names if n != "all" and n not in MONITORS]
    if unknown:
        raise ValueError(f"monitors.stop_on: unknown monitor(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(MONITORS.names())} or all")


@dataclass(frozen=True)
class Firing:
    """A monitor that fired."""

    monitor: str
    """Its name."""
    step: int
    """The step it fired at."""
    since: int
    """The first step of the run of crossed steps that made it fire: where the collapse began."""
    value: float
    """The value at ``step``."""
    line: str
    """The line the run logs."""
    stops: bool
    """``monitors.stop_on`` names it: the run stops."""

    def as_row(self) -> dict:
        return {"monitor": self.monitor, "step": self.step, "since": self.since, "value": self.value,
                "line": self.line, "stops": self.stops}


class CollapseWatch:
    """Every monitor over a run's steps, in order: ``observe`` takes a step's metrics and returns the firings."""

    def __init__(self, config: MonitorsConfig):
        self.config = config
        self.baselines: dict[str, list[float]] = {name: [] for name in MONITORS}
        self.crossed_since: dict[str, int | None] = {name: None for name in MONITORS}
        self.fired: dict[str, Firing] = {}

    def _baseline(self, name: str) -> float | None:
        seen = self.baselines[name]
        return sum(seen) / len(seen) if len(seen) >= self.config.baseline_steps else None

    def observe(self, step: int, metrics: dict) -> list[Firing]:
        """The monitors that fire at ``step`` (each fires once per run)."""
        if not self.config.enabled:
            return []
        out = []
        for name in MONITORS:
            monitor = MONITORS[name]
            value = monitor.read(metrics)
            if value is None:
                continue
            baseline = self._baseline(name)
            if baseline is None and monitor.relative:
                self.baselines[name].append(value)
                continue
            if not monitor.crossed(value, baseline, self.config):
                self.crossed_since[name] = None
                continue
            since = self.crossed_since[name] = self.crossed_since[name] or step
            if name in self.fired or step - since + 1 < monitor.patience(self.config):
                continue
            stops = name in self.config.stop_on or "all" in self.config.stop_on
            line = (f"monitor {name} fired at step {step}: {monitor.metric} {value:.4g} past "
                    f"{monitor.threshold(baseline, self.config)} since step {since}")
            self.fired[name] = firing = Firing(name, step, since, value, line, stops)
            out.append(firing)
        return out


def replay(config: MonitorsConfig, rows: list[dict]) -> tuple[CollapseWatch, list[Firing]]:
    """The watch after ``rows`` (a run's metrics lines, each with ``step``; later lines of a step win), and every
    firing in step order: a resumed run picks its monitors' state up this way, and ``rlinf-search monitors`` reads
    a finished run's."""
    by_step: dict[int, dict] = {}
    for row in rows:
        if "step" in row:
            by_step.setdefault(int(row["step"]), {}).update(row)
    watch, firings = CollapseWatch(config), []
    for step in sorted(by_step):
        firings += watch.observe(step, by_step[step])
    return watch, firings
