"""One table from several demo runs (``scripts/demo_seeds.sh``): a row per run directory.

    python examples/searchr1/demo_seeds_table.py outputs/demo_seeds/run1_seed0 outputs/demo_seeds/run2_seed1
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def row(run: Path) -> str:
    """The table row of one run directory (written by ``scripts/demo.sh`` with ``DEMO_OUT=run``)."""
    seed = re.search(r"seed(\d+)$", run.name)
    summary = run / "eval_results.json"
    if not summary.is_file():
        return f"| {run.name} | {seed.group(1) if seed else '?'} | failed: no {summary} | | | | |"
    report = json.loads(summary.read_text())
    before, after = report["warm_start"], report["after_rl"]
    seconds = run / "seconds"
    minutes = f"{int(seconds.read_text()) / 60:.1f}" if seconds.is_file() else "?"
    return (f"| {run.name} | {seed.group(1) if seed else '?'} | {before['em']:.3f} | {after['em']:.3f} | "
            f"{after['em'] - before['em']:+.3f} | {before['searches']:.2f} -> {after['searches']:.2f} | {minutes} |")


def main(argv: list[str] | None = None) -> int:
    runs = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not runs:
        print("demo_seeds_table: name at least one demo run directory", file=sys.stderr)
        return 2
    print("| run | seed | warm-start EM | after-RL EM | gain | searches | minutes |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        print(row(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
