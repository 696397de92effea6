"""The collapse monitors replayed over a finished (or running) run: which fired, at which step, since when.

    python -m rlinf_search.monitors RUN_DIR [monitors.KEY=VALUE ...]     (rlinf-search monitors RUN_DIR)

Reads ``RUN_DIR/logs/metrics.jsonl`` (or ``RUN_DIR/metrics.jsonl``) and the run's ``monitors`` section from
``RUN_DIR/config.yaml`` (the defaults without one); ``monitors.KEY=VALUE`` tries other thresholds on the same run.
Prints a table (``-`` when none fired) and exits 0; 2 when the run has no metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from rlinf_search.section_model import parse_section
from rlinf_search.config.schema import ConfigError
from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.monitors.rules import check_stop_on, replay
from rlinf_search.plot import find_metrics


def run_monitors(run_dir: Path, overrides: list[str]) -> MonitorsConfig:
    """The run's ``monitors`` section with ``overrides`` applied, validated as a run's would be."""
    config = run_dir / "config.yaml"
    section = dict((yaml.safe_load(config.read_text()) or {}).get("monitors") or {}) if config.is_file() else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("monitors."):
            raise ConfigError(f"{item}: expected monitors.KEY=VALUE")
        section[key.split(".", 1)[1]] = yaml.safe_load(value)
    try:
        monitors = parse_section(MonitorsConfig, section, path="monitors")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_stop_on(monitors.stop_on)
    return monitors


def firings_table(firings) -> str:
    lines = ["| monitor | step | since | value | what |", "|---|---|---|---|---|"]
    lines += [f"| {f.monitor} | {f.step} | {f.since} | {f.value:.4g} | {f.line} |" for f in firings]
    return "\n".join(lines if firings else lines + ["| - | - | - | - | none fired |"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlinf-search monitors", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a training run's runner.output_dir")
    parser.add_argument("overrides", nargs="*", help="monitors.KEY=VALUE thresholds to try instead of the run's")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        metrics = find_metrics(run_dir)
        monitors = run_monitors(run_dir, args.overrides)
    except (FileNotFoundError, ConfigError, ValueError) as exc:
        print(f"monitors: {exc}", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    _, firings = replay(monitors, rows)
    steps = max((int(r["step"]) for r in rows if "step" in r), default=0)
    print(f"{run_dir}: {steps} steps watched")
    print(firings_table(firings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
