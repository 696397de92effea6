"""The run's side of the collapse monitors: the line a firing logs, the file the viewer reads, the stop."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlinf_search.monitors import CollapseWatch, Firing, MonitorsConfig, replay
from rlinf_search.runners.infra_failures import RunStopped

log = logging.getLogger(__name__)
FIRINGS_FILE = "monitors.jsonl"
"""``LOG_PATH/monitors.jsonl``: one line per firing (``Firing.as_row``)."""


class CollapseStop(RunStopped):
    """A monitor named in ``monitors.stop_on`` fired: the run stops before that step's checkpoint."""


def report_firings(firings: list[Firing], log_path: Path) -> Firing | None:
    """Log each firing in one line and append it to ``monitors.jsonl``; the first that stops the run, if any."""
    if not firings:
        return None
    log_path.mkdir(parents=True, exist_ok=True)
    with (log_path / FIRINGS_FILE).open("a") as out:
        for firing in firings:
            log.warning(firing.line)
            out.write(json.dumps(firing.as_row()) + "\n")
    return next((f for f in firings if f.stops), None)


def last_checkpoint_before(ckpt_dir: Path, step: int) -> str:
    """The newest ``global_step_N`` under ``ckpt_dir`` with N < ``step``, or words saying there is none."""
    found = sorted((int(p.name.rsplit("_", 1)[1]), p) for p in ckpt_dir.glob("global_step_*")
                   if p.name.rsplit("_", 1)[1].isdigit() and int(p.name.rsplit("_", 1)[1]) < step)
    return str(found[-1][1]) if found else f"none (no checkpoint before step {step}; the starting model is the last)"


def resumed_watch(config: MonitorsConfig, log_path: Path, *, upto: int) -> CollapseWatch:
    """The watch as it stood after step ``upto``, from the run's own ``metrics.jsonl`` (empty when it has none)."""
    path = log_path / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    watch, _ = replay(config, [r for r in rows if int(r.get("step", 0)) <= upto])
    return watch
