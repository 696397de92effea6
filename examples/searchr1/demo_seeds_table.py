"""One table from several demo runs (``scripts/demo_seeds.sh``): a row per run directory, then the machine.

    python examples/searchr1/demo_seeds_table.py outputs/demo_seeds/run1_seed0_native outputs/demo_seeds/run2_seed1_native

A row: the seed and the kernels PyTorch used, held-out EM before and after RL, searches per question, the probes
at the end of the warm start's skill and mix stages (query copy, answer copy; P(search)), and minutes per step.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEADER = ("| run | seed | kernels | warm-start EM | after-RL EM | gain | searches | skill end: query / answer copy "
          "(steps) | mix end: P(search) / answer copy | minutes: induction + reading + skill + mix, GRPO, total |")


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _warm_start(run: Path) -> tuple[str, str, str]:
    """(skill-end probes, mix-end probes, stage minutes) from the warm start's sft_losses.json."""
    log = _json(run / "model" / "sft" / "sft_losses.json")
    if log is None or "stages" not in log:
        return "?", "?", "?"
    stages = {stage["name"]: stage for stage in log["stages"]}
    skill, mix = stages.get("skill"), stages.get("mix")
    skill_end = mix_end = "-"
    if skill and skill["readings"]:
        last = skill["readings"][-1]
        skill_end = f"{last['query_copy']:.2f} / {last['answer_copy']:.2f} ({skill['steps']})"
    if mix and mix["readings"]:
        last = mix["readings"][-1]
        mix_end = f"{last['search_mean']:.2f} / {last['answer_copy']:.2f}"
    minutes = " + ".join(f"{stages[name]['seconds'] / 60:.1f}" for name in ("induction", "reading", "skill", "mix")
                         if name in stages)
    return skill_end, mix_end, minutes


def _step_minutes(run: Path) -> dict[str, float]:
    path = run / "step_seconds.tsv"
    if not path.is_file():
        return {}
    rows = (line.split("\t") for line in path.read_text().splitlines() if line.strip())
    return {name: int(seconds) / 60 for name, seconds in rows}


def row(run: Path) -> str:
    """The table row of one run directory (written by ``scripts/demo.sh`` with ``DEMO_OUT=run``)."""
    seed = re.search(r"seed(\d+)", run.name)
    machine = _json(run / "machine.json") or {}
    kernels = machine.get("torch_cpu_capability", "?")
    seconds = run / "seconds"
    total = f"{int(seconds.read_text()) / 60:.1f}" if seconds.is_file() else "?"
    skill_end, mix_end, warm_minutes = _warm_start(run)
    grpo = _step_minutes(run).get("grpo")
    minutes = f"{warm_minutes}, {grpo:.1f}, {total}" if grpo is not None else f"{warm_minutes}, ?, {total}"
    report = _json(run / "eval_results.json")
    if report is None:
        return (f"| {run.name} | {seed.group(1) if seed else '?'} | {kernels} | failed (see {run.name}.log) | | | | "
                f"{skill_end} | {mix_end} | {minutes} |")
    before, after = report["warm_start"], report["after_rl"]
    return (f"| {run.name} | {seed.group(1) if seed else '?'} | {kernels} | {before['em']:.3f} | {after['em']:.3f} | "
            f"{after['em'] - before['em']:+.3f} | {before['searches']:.2f} -> {after['searches']:.2f} | {skill_end} | "
            f"{mix_end} | {minutes} |")


def machines(runs: list[Path]) -> list[str]:
    """One line per distinct machine and library set among the runs."""
    seen = []
    for run in runs:
        info = _json(run / "machine.json")
        if info is not None:
            line = info.get("summary", "?")
            if line not in seen:
                seen.append(line)
    return seen


def main(argv: list[str] | None = None) -> int:
    runs = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not runs:
        print("demo_seeds_table: name at least one demo run directory", file=sys.stderr)
        return 2
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for run in runs:
        print(row(run))
    for line in machines(runs):
        print(f"\nMachine: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
