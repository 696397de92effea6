"""A sweep's report: per arm the held-out EM over seeds (mean and standard deviation), final reward, searches and
wall time; per step each curve's mean and spread; the published finding set beside ours. Written as
``results.json``, ``table.md`` and ``curves.png`` in the sweep's folder, over every finished cell there.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from rlinf_search.ablation.cell import CURVES, SweepSettings, cell_dir
from rlinf_search.ablation.study import Study

LABELS = {"reward/mean": "reward", "val/em": "validation EM", "rollout/searches_per_trajectory": "searches",
          "rollout/response_length": "response tokens", "actor/kl": "KL to reference", "actor/entropy": "entropy"}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def gather(study: Study, settings: SweepSettings, arms: list[str], seeds: list[int]) -> list[dict]:
    """The finished cells of the sweep (arms x seeds), in arm order."""
    cells = []
    for arm in arms:
        for seed in seeds:
            path = cell_dir(settings, arm, seed) / "cell.json"
            if path.is_file():
                cells.append(json.loads(path.read_text()))
    return cells


def arm_rows(cells: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: the seeds it finished, held-out EM / F1 / searches and final reward (mean, sd), minutes a cell."""
    rows = {}
    for arm in arms:
        mine = [c for c in cells if c["arm"] == arm]
        if not mine:
            continue
        em, em_sd = _mean_sd([c["heldout_em"] for c in mine])
        rows[arm] = {"seeds": [c["seed"] for c in mine], "heldout_em": em, "heldout_em_sd": em_sd,
                     "heldout_em_per_seed": [c["heldout_em"] for c in mine],
                     "heldout_f1": _mean_sd([c["heldout_f1"] for c in mine])[0],
                     "heldout_searches": _mean_sd([c["heldout_searches"] for c in mine])[0],
                     "final_reward": _mean_sd([c["final_reward"] for c in mine])[0],
                     "final_reward_sd": _mean_sd([c["final_reward"] for c in mine])[1],
                     "cell_minutes": statistics.mean(c["wall_s"] for c in mine) / 60,
                     "curves": mean_curves(mine)}
    return rows


def mean_curves(cells: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Per metric: the steps every cell logged, and the cells' mean and standard deviation at each."""
    out = {}
    for name in CURVES:
        series = [dict((int(step), value) for step, value in c["curves"].get(name, [])) for c in cells]
        if not all(series):
            continue
        steps = sorted(set.intersection(*(set(s) for s in series)))
        stats = [_mean_sd([s[step] for s in series]) for step in steps]
        out[name] = {"step": steps, "mean": [m for m, _ in stats], "sd": [d for _, d in stats]}
    return out


def finding(study: Study, rows: dict[str, dict]) -> str:
    """Our direction against the paper's: the difference of the two arms' mean held-out EM, and whether it is
    outside its own spread (the standard error of a difference of two means over seeds)."""
    if study.expect is None:
        return "not comparable: the paper states no direction on held-out EM for this comparison"
    better, worse = rows.get(study.expect.better), rows.get(study.expect.worse)
    if better is None or worse is None:
        return "not measured yet: an arm of the finding has no finished cell"
    diff = better["heldout_em"] - worse["heldout_em"]
    spread = math.sqrt(better["heldout_em_sd"] ** 2 / len(better["seeds"]) + worse["heldout_em_sd"] ** 2 / len(
        worse["seeds"]))
    where = f"{study.expect.better} - {study.expect.worse} = {diff:+.3f} (standard error {spread:.3f})"
    if len(better["seeds"]) < 2 or len(worse["seeds"]) < 2:
        return f"{where}: one seed, no spread to judge by"
    if abs(diff) <= spread:
        return f"{where}: within the spread, neither agrees nor disagrees"
    return f"{where}: {'agrees' if diff > 0 else 'disagrees'} with the paper's direction"


def table(study: Study, rows: dict[str, dict]) -> str:
    reference = next(iter(rows.values()), None)
    lines = [f"**{study.title}**", "",
             "| arm | seeds | held-out EM, mean (sd) | vs first arm | F1 | searches a question | final reward (sd) | "
             "minutes a cell |", "|---|---|---|---|---|---|---|---|"]
    for arm, r in rows.items():
        lines.append(f"| {arm} | {len(r['seeds'])} | {r['heldout_em']:.3f} ({r['heldout_em_sd']:.3f}) | "
                     f"{r['heldout_em'] - reference['heldout_em']:+.3f} | {r['heldout_f1']:.3f} | "
                     f"{r['heldout_searches']:.2f} | {r['final_reward']:.3f} ({r['final_reward_sd']:.3f}) | "
                     f"{r['cell_minutes']:.1f} |")
    if study.paper:
        lines += ["", f"Paper: {study.paper}"]
    lines += ["", f"Ours: {finding(study, rows)}"]
    return "\n".join(lines)


def plot(study: Study, rows: dict[str, dict], path: Path) -> None:
    """One panel per curve: each arm's mean over seeds, its band one standard deviation either side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in CURVES if any(n in r["curves"] for r in rows.values())]
    cols = 3
    fig, axes = plt.subplots(math.ceil(len(names) / cols) or 1, cols, figsize=(15, 4 * math.ceil(len(names) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, names):
        for arm, r in rows.items():
            curve = r["curves"].get(name)
            if not curve:
                continue
            lo = [m - d for m, d in zip(curve["mean"], curve["sd"])]
            hi = [m + d for m, d in zip(curve["mean"], curve["sd"])]
            line, = ax.plot(curve["step"], curve["mean"], marker="o" if len(curve["step"]) < 6 else None,
                            label=f"{arm} ({len(r['seeds'])} seeds)")
            ax.fill_between(curve["step"], lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set(title=LABELS.get(name, name), xlabel="step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    ems = ", ".join(f"{arm} {r['heldout_em']:.3f}±{r['heldout_em_sd']:.3f}" for arm, r in rows.items())
    fig.suptitle(f"{study.title}: held-out EM {ems} (band: 1 sd over seeds)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(study: Study, settings: SweepSettings, arms: list[str], seeds: list[int]) -> tuple[dict, str]:
    """``results.json``, ``table.md`` and ``curves.png`` under ``settings.out``; (results, table)."""
    cells = gather(study, settings, arms, seeds)
    rows = arm_rows(cells, arms)
    text = table(study, rows)
    results = {"study": study.name, "title": study.title, "paper": study.paper, "finding": finding(study, rows),
               "config": settings.config, "base": str(settings.base), "steps": settings.steps,
               "eval_n": settings.eval_n, "arms": {arm: {"overrides": list(study.arms[arm]), **row}
                                                   for arm, row in rows.items()},
               "cells": [{k: v for k, v in c.items() if k != "curves"} for c in cells]}
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "results.json").write_text(json.dumps(results, indent=1))
    (settings.out / "table.md").write_text(text + "\n")
    if rows:
        plot(study, rows, settings.out / "curves.png")
    return results, text
