"""The step time of every run of a ``benchmarks/pipeline.py`` results file as bars, with lockstep, sync and the
ideal as lines: which mode and split wins, and how far each stays from the packed step.

    python benchmarks/pipeline_sweep_plot.py outputs/bench_pipeline_local/results.json docs/img/pipeline_sweep.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLOURS = {"lockstep": "tab:red", "sync": "tab:grey", "overlap": "tab:orange", "stream": "tab:purple",
           "async": "tab:green"}


def plot_sweep(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["results"]
    names = list(runs)
    steps = [runs[n]["step_s"] for n in names]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(names) + 2), 4.0))
    ax.bar(range(len(names)), steps, color=[COLOURS.get(runs[n]["mode"], "tab:blue") for n in names])
    for x, value in enumerate(steps):
        ax.text(x, value, f"{value:.0f}", ha="center", va="bottom", fontsize=8)
    for label, value, style in (("sync", runs.get("sync", {}).get("step_s"), "--"),
                                ("ideal (packed)", results.get("ideal_step_s"), ":")):
        if value:
            ax.axhline(value, color="black", linestyle=style, linewidth=1)
            ax.text(len(names) - 0.5, value, f" {label} {value:.0f} s", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(names)), [n.replace("-", "\n") for n in names], fontsize=8)
    ax.set_ylabel("step, simulated s")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results.json written by benchmarks/pipeline.py --out")
    parser.add_argument("png", type=Path)
    parser.add_argument("--title", default="step time by mode and engines+actor split (8 GPUs, simulated)")
    args = parser.parse_args(argv)
    plot_sweep(json.loads(args.results.read_text()), args.png, args.title)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
