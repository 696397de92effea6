"""The distillation arms of scripts/distill_compare.sh: each arm's learning rate, then a table of held-out EM
at each checkpoint (mean and spread over seeds) and one PNG.

    python examples/searchr1/distill_compare_summary.py --out outputs/distill_compare --steps 30 --every 10 --seeds 0 1 2
    python examples/searchr1/distill_compare_summary.py --out outputs/distill_compare --steps 30 --best-lr grpo --seed 0

Reads ``OUT/runs/<arm>_lr<lr>_s<seed>/`` (``logs/metrics.jsonl`` and ``eval/step_<N>/eval_results.json``). An
arm's lr is the one whose run on the first seed has the best validation EM (``val/em``) at the last step; ties
go to the smaller lr. Held-out test questions are never used to choose.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

# The same folder: run as a script, it is on sys.path.
from distill_summary import curve, read_metrics

ARMS = ("grpo", "grpo_rkl", "grpo_topk", "topk_only", "sft_teacher")
LABELS = {"grpo": "GRPO", "grpo_rkl": "GRPO + reverse KL", "grpo_topk": "GRPO + top-k KL", "topk_only": "top-k KL alone",
          "sft_teacher": "SFT on teacher"}
RUN_NAME = re.compile(r"^(?P<arm>[a-z_]+)_lr(?P<lr>[0-9.e+-]+)_s(?P<seed>\d+)$")


def runs(out: Path) -> list[dict]:
    """Every finished run under ``OUT/runs``: arm, lr (as written), seed, folder."""
    found = []
    for folder in sorted((out / "runs").iterdir()):
        match = RUN_NAME.match(folder.name)
        if folder.is_dir() and match and (folder / "done").is_file():
            found.append({"arm": match["arm"], "lr": match["lr"], "seed": int(match["seed"]), "dir": folder})
    return found


def val_em(folder: Path, step: int) -> float:
    points = [value for at, value in zip(*curve(read_metrics(folder / "logs" / "metrics.jsonl"), "val/em"))
              if at == step]
    if not points:
        raise ValueError(f"{folder} logged no val/em at step {step}")
    return points[-1]


def test_em(folder: Path, step: int) -> float:
    return json.loads((folder / "eval" / f"step_{step}" / "eval_results.json").read_text())["overall"]["em"]


def best_lr(found: list[dict], arm: str, seed: int, steps: int) -> str:
    candidates = [run for run in found if run["arm"] == arm and run["seed"] == seed]
    if not candidates:
        raise ValueError(f"no finished run of arm {arm} on seed {seed}")
    return max(candidates, key=lambda run: (val_em(run["dir"], steps), -float(run["lr"])))["lr"]


def plot(table: dict, checkpoints: list[int], out: Path, teacher_em: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.5, 4))
    for arm, (lr, per_step) in table.items():
        means = [statistics.mean(per_step[s]) for s in checkpoints]
        low = [min(per_step[s]) for s in checkpoints]
        high = [max(per_step[s]) for s in checkpoints]
        axis.plot(checkpoints, means, marker="o", label=f"{LABELS.get(arm, arm)} (lr {lr})")
        axis.fill_between(checkpoints, low, high, alpha=0.15)
    if teacher_em is not None:
        axis.axhline(teacher_em, color="black", linestyle="--", linewidth=1, label=f"teacher ({teacher_em:.3f})")
    axis.set_xlabel("step")
    axis.set_ylabel("held-out EM (mean, band: min..max over seeds)")
    axis.legend(fontsize=8)
    fig.tight_layout()
    path = out / "distill_compare.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", required=True, type=int)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--best-lr", metavar="ARM", help="print this arm's chosen lr and stop")
    parser.add_argument("--seed", type=int, default=0, help="with --best-lr: the seed the lr grid ran on")
    parser.add_argument("--teacher-eval", type=Path, help="the teacher's eval_results.json on the same held-out "
                                                          "questions: a dashed line on the plot")
    args = parser.parse_args(argv)
    try:
        found = runs(args.out)
        if args.best_lr:
            print(best_lr(found, args.best_lr, args.seed, args.steps))
            return 0
        checkpoints = list(range(args.every, args.steps + 1, args.every))
        table = {}
        for arm in [a for a in ARMS if any(run["arm"] == a for run in found)]:
            lr = best_lr(found, arm, args.seeds[0], args.steps)
            chosen = [run for run in found if run["arm"] == arm and run["lr"] == lr and run["seed"] in args.seeds]
            table[arm] = (lr, {step: [test_em(run["dir"], step) for run in chosen] for step in checkpoints})
    except (OSError, KeyError, ValueError) as exc:
        print(f"distill_compare_summary: {exc}", file=sys.stderr)
        return 1
    header = f"{'arm':<20}{'lr':>8}{'seeds':>6}" + "".join(f"{'EM @' + str(s):>18}" for s in checkpoints)
    print(header)
    print("-" * len(header))
    summary = {}
    for arm, (lr, per_step) in table.items():
        cells = []
        for step in checkpoints:
            values = per_step[step]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
        print(f"{LABELS.get(arm, arm):<20}{lr:>8}{len(per_step[checkpoints[0]]):>6}" + "".join(f"{c:>18}" for c in cells))
        summary[arm] = {"lr": lr, "test_em": {str(step): per_step[step] for step in checkpoints}}
    (args.out / "distill_compare.json").write_text(json.dumps(summary, indent=1))
    teacher_em = json.loads(args.teacher_eval.read_text())["overall"]["em"] if args.teacher_eval else None
    if teacher_em is not None:
        print(f"{'teacher':<20}{'':>8}{'':>6}{teacher_em:>18.3f}  (held-out EM, greedy)")
    print(f"(± is the standard deviation over seeds; plot: {plot(table, checkpoints, args.out, teacher_em)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
