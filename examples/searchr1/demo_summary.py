"""Compare two eval runs (warm start and after RL): a combined eval_results.json, a bar chart, one line.

    python examples/searchr1/demo_summary.py --before A/eval_results.json --after B/eval_results.json --out DIR

Prints ``held-out EM: warm-start 0.050 -> after RL 0.412`` last, the line scripts/demo.sh ends with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

METRICS = ("em", "subem", "f1", "searches")


def load_overall(path: Path) -> dict:
    """The ``overall`` scores of an eval_results.json written by ``rlinf_search.runners.eval_runner``."""
    if not path.is_file():
        raise FileNotFoundError(f"no eval results at {path}; run python -m rlinf_search.runners.eval_runner first")
    report = json.loads(path.read_text())
    if "overall" not in report:
        raise ValueError(f"{path} has no 'overall' scores; is it an eval_results.json?")
    return report["overall"]


def plot_comparison(before: dict, after: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(3 * len(METRICS), 3))
    for axis, metric in zip(axes, METRICS):
        values = [before[metric], after[metric]]
        axis.bar(["warm start", "after RL"], values, color=["#999999", "#2a7ab9"])
        axis.set_title(metric)
        for x, value in enumerate(values):
            axis.text(x, value, f"{value:.2f}", ha="center", va="bottom")
    fig.suptitle(f"held-out test set (n={after['n']})")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="eval_results.json of the warm-started model")
    parser.add_argument("--after", required=True, type=Path, help="eval_results.json of the RL-trained model")
    parser.add_argument("--out", required=True, type=Path, help="folder for eval_results.json and eval_comparison.png")
    args = parser.parse_args(argv)
    try:
        before, after = load_overall(args.before), load_overall(args.after)
    except (OSError, ValueError) as exc:
        print(f"demo_summary: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"warm_start": before, "after_rl": after,
               "gain": {metric: after[metric] - before[metric] for metric in METRICS},
               "details": {"warm_start": str(args.before), "after_rl": str(args.after)}}
    (args.out / "eval_results.json").write_text(json.dumps(summary, indent=1))
    png = plot_comparison(before, after, args.out / "eval_comparison.png")
    for metric in METRICS:
        print(f"{metric:>9}: {before[metric]:.3f} -> {after[metric]:.3f}")
    print(f"wrote {args.out / 'eval_results.json'} and {png}")
    print(f"held-out EM: warm-start {before['em']:.3f} -> after RL {after['em']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
