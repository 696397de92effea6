"""Compare GRPO alone with GRPO + distillation (scripts/distill_demo.sh): one PNG of both runs' curves,
a table, and one line.

    python examples/searchr1/distill_summary.py --out outputs/distill --steps 30

Reads ``OUT/{grpo,distill}/logs/metrics.jsonl`` and ``OUT/eval/{student,teacher,grpo,distill}/eval_results.json``;
writes ``OUT/distill.png`` and ``OUT/distill_summary.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RUNS = ("grpo", "distill")
LABELS = {"grpo": "GRPO", "distill": "GRPO + distillation"}


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"no metrics at {path}; did the run finish?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def held_out(out: Path, name: str) -> dict:
    path = out / "eval" / name / "eval_results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no eval results at {path}")
    return json.loads(path.read_text())["overall"]


def curve(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], row[key]) for row in rows if key in row]
    return [s for s, _ in points], [v for _, v in points]


def window_mean(values: list[float], size: int = 5) -> list[float]:
    return [sum(values[max(0, i - size + 1): i + 1]) / len(values[max(0, i - size + 1): i + 1])
            for i in range(len(values))]


def first_and_last(values: list[float], size: int = 5) -> tuple[float, float] | None:
    """Means of the first and the last ``size`` values; None for a run that did not log them."""
    if not values:
        return None
    return sum(values[:size]) / len(values[:size]), sum(values[-size:]) / len(values[-size:])


def plot(metrics: dict[str, list[dict]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].set_title("student's reverse KL to the teacher\n(per model token, 5-step mean)")
    for name, color in zip(RUNS, ("#2a7ab9", "#cc6600")):
        steps, kl = curve(metrics[name], "distill/reverse_kl")
        if kl:  # the GRPO run logs it when its teacher measures (algorithm.distill.coef 0)
            axes[0].plot(steps, kl, color=color, alpha=0.3)
            axes[0].plot(steps, window_mean(kl), color=color, label=LABELS[name])
        steps, reward = curve(metrics[name], "reward/mean")
        axes[1].plot(steps, window_mean(reward), color=color, label=LABELS[name])
        steps, em = curve(metrics[name], "val/em")
        axes[2].plot(steps, em, marker="o", color=color, label=LABELS[name])
    axes[1].set_title("training reward (5-step mean)")
    axes[2].set_title("validation EM (greedy)")
    for axis in axes:
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
    fig.tight_layout()
    path = out / "distill.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", required=True, type=int)
    args = parser.parse_args(argv)
    try:
        metrics = {name: read_metrics(args.out / name / "logs" / "metrics.jsonl") for name in RUNS}
        evals = {name: held_out(args.out, name) for name in ("student", "teacher", *RUNS)}
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"distill_summary: {exc}", file=sys.stderr)
        return 1
    kl_ends = {name: first_and_last(curve(metrics[name], "distill/reverse_kl")[1]) for name in RUNS}
    summary = {"held_out": evals, "reverse_kl_first5_last5": kl_ends, "steps": args.steps}
    (args.out / "distill_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{'model':<22}{'EM':>7}{'F1':>7}{'searches':>10}")
    for name, label in (("student", "student (before RL)"), ("grpo", LABELS["grpo"]),
                        ("distill", LABELS["distill"]), ("teacher", "teacher")):
        row = evals[name]
        print(f"{label:<22}{row['em']:>7.3f}{row['f1']:>7.3f}{row['searches']:>10.2f}")
    for name in RUNS:
        if kl_ends[name] is not None:
            first, last = kl_ends[name]
            print(f"{LABELS[name]}: reverse KL to the teacher, first 5 -> last 5 steps: {first:.3f} -> {last:.3f}")
    print(f"plot: {plot(metrics, args.out)}")
    print(f"held-out EM after {args.steps} steps: GRPO {evals['grpo']['em']:.3f}, "
          f"GRPO + distillation {evals['distill']['em']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
