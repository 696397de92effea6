"""Draw a run's training curves to PNG.

    python -m rlinf_search.plot RUN_DIR [--out curves.png] [--keys reward/mean,rollout/searches_per_trajectory]

Reads ``RUN_DIR/metrics.jsonl`` (or ``RUN_DIR/logs/metrics.jsonl``), one panel per metric.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DEFAULT_KEYS = ("reward/mean", "reward/em", "rollout/searches_per_trajectory", "rollout/response_length",
                "actor/kl", "actor/entropy", "actor/clip_fraction", "actor/grad_norm", "val/em")


def find_metrics(run_dir: Path) -> Path:
    for candidate in (run_dir / "metrics.jsonl", run_dir / "logs" / "metrics.jsonl", run_dir):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no metrics.jsonl in {run_dir} or {run_dir / 'logs'}")


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)], later lines winning for a repeated step (a resumed run)."""
    by_key: dict[str, dict[int, float]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            by_key.setdefault(key, {})[int(row["step"])] = float(value)
    return {key: sorted(points.items()) for key, points in by_key.items()}


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` points: per-step RL metrics are means of a few dozen
    sampled rollouts, and the trend is what a reader looks for."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_series(series: dict[str, list[tuple[int, float]]], keys: list[str], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if k in series]
    if not keys:
        raise ValueError(f"none of the requested metrics are in the run; it has {sorted(series)}")
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        steps, values = zip(*series[key])
        if len(steps) >= 20:  # noisy per-step series: faint raw values under a moving average
            ax.plot(steps, values, alpha=0.3, linewidth=1)
            ax.plot(steps, moving_average(list(values), max(3, len(steps) // 8)), linewidth=2, color="C0")
        else:
            ax.plot(steps, values, marker="o", markersize=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    parser.add_argument("--keys", default=",".join(DEFAULT_KEYS), help="comma-separated metric names")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        series = read_series(find_metrics(run_dir))
        out = plot_series(series, args.keys.split(","), Path(args.out) if args.out else run_dir / "curves.png",
                          title=run_dir.name)
    except (FileNotFoundError, ValueError) as exc:
        print(f"plot: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
