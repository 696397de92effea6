"""What the viewer reads from a run folder: the rollout dumps (``rollouts/step_K.jsonl``, ``val_step_K.jsonl``), the
metrics (``logs/metrics.jsonl``) and the monitors' firings (``logs/monitors.jsonl``). Read on every request, so a
page on a run still training shows its newest steps."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlinf_search.runners.collapse import FIRINGS_FILE
from rlinf_search.runners.rollout_dump import ROLLOUTS_DIR

DUMP_NAME = re.compile(r"^(val_)?step_(\d+)$")


@dataclass(frozen=True)
class Dump:
    """One rollout file."""

    name: str
    """``step_K`` or ``val_step_K`` (the file's stem)."""
    step: int
    """The step it was written at."""
    kind: str
    """``train`` (a sample of the step's trajectories) or ``val`` (every validation trajectory)."""
    path: Path
    """The file."""


class RunFiles:
    """A run folder as the viewer sees it."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs" if (run_dir / "logs").is_dir() else run_dir

    def dumps(self) -> list[Dump]:
        """Every rollout file, by step (training before validation at the same step)."""
        out = []
        for path in (self.run_dir / ROLLOUTS_DIR).glob("*.jsonl"):
            match = DUMP_NAME.match(path.stem)
            if match:
                out.append(Dump(path.stem, int(match.group(2)), "val" if match.group(1) else "train", path))
        return sorted(out, key=lambda d: (d.step, d.kind != "train"))

    def dump(self, name: str) -> Dump | None:
        return next((d for d in self.dumps() if d.name == name), None)

    def rows(self, dump: Dump) -> list[dict]:
        """The file's trajectories, each with its index in the file and its search count."""
        rows = []
        for index, line in enumerate(line for line in dump.path.read_text(encoding="utf-8").splitlines() if line):
            row = json.loads(line)
            row.update(index=index, step=dump.step, dump=dump.name, searches=len(row.get("queries", [])))
            rows.append(row)
        return rows

    def prompt(self, uid: str) -> list[dict]:
        """Every dumped trajectory of prompt ``uid``, step by step."""
        return [row for dump in self.dumps() for row in self.rows(dump) if row["uid"] == uid]

    def metrics(self) -> dict[str, list[list[float]]]:
        """metric -> [[step, value], ...] (a resumed run's later line for a step wins)."""
        path = self.log_dir / "metrics.jsonl"
        series: dict[str, dict[int, float]] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                for key, value in row.items():
                    if key not in ("step", "time") and isinstance(value, (int, float)) and value == value:
                        series.setdefault(key, {})[int(row["step"])] = float(value)
        return {key: [[s, v] for s, v in sorted(points.items())] for key, points in sorted(series.items())}

    def firings(self) -> list[dict]:
        path = self.log_dir / FIRINGS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
