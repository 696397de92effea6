"""The report of ``benchmarks/pipeline.py``: the seeds of a configuration averaged, the table (ratios against the
low end of lockstep's range, sync and the ideal), and the timeline of busy and idle ranks."""

from __future__ import annotations

import statistics
from pathlib import Path

GROUPS = ("rollout", "actor", "search")


def lockstep_range(results: dict[str, dict]) -> tuple[float, float] | None:
    """The fastest and slowest mean step of the lockstep range (the fitted row left out); None without one."""
    steps = [r["step_s"] for r in results.values() if r["mode"] == "lockstep" and not r["fitted"]]
    return (min(steps), max(steps)) if steps else None


def table(results: dict[str, dict], ideal: float | None) -> str:
    """One row per configuration, its step the mean (and standard deviation) over seeds; ratios against the low end
    of lockstep's range (its fastest variant), sync and the ideal where those ran; the fitted lockstep row last.
    ``floor s``: the row's own GPU work packed on the devices (its ``ideal_step_s``), the step no schedule of that
    work can beat, and its ratio to lockstep's low end: a goal below it needs less work, not a better pipeline."""
    low = (lockstep_range(results) or (None, None))[0]
    sync = results.get("sync", {}).get("step_s")

    def ratio(value: float, base: float | None) -> str:
        return f"{value / base:.2f}x" if base else "-"

    lines = ["| mode | engines+actor | step s (sd) | vs lockstep low | vs sync | vs ideal | floor s (vs lockstep low) | "
             "GPUs idle | idle engines | idle actor | idle retriever | traj p50 s | traj p99 s | mean lag |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in sorted(results.items(), key=lambda item: item[1]["fitted"]):
        label = f"{name} (fitted, apart)" if r["fitted"] else name
        lines.append(f"| {label} | {r['split']} | {r['step_s']:.1f} ({r['step_s_sd']:.1f}) | {ratio(r['step_s'], low)} | "
                     f"{ratio(r['step_s'], sync)} | {ratio(r['step_s'], ideal)} | "
                     f"{r['ideal_step_s']:.1f} ({ratio(r['ideal_step_s'], low)}) | {r['idle_gpus']:.0%} | "
                     f"{r['idle_rollout']:.0%} | {r['idle_actor']:.0%} | {r['idle_search']:.0%} | "
                     f"{r['trajectory_p50_s']:.1f} | {r['trajectory_p99_s']:.1f} | {r['mean_lag']:.2f} |")
    if ideal:
        lines.append(f"| ideal | packed | {ideal:.1f} | {ratio(ideal, low)} | {ratio(ideal, sync)} | 1.00x | "
                     f"{ideal:.1f} ({ratio(ideal, low)}) | 0% | - | - | - | - | - | - |")
    return "\n".join(lines)


def mean_over_seeds(runs: list[dict]) -> dict:
    """The seeds' summaries of one configuration: each number their mean, ``step_s_sd`` the step's standard
    deviation, ``seeds`` each seed's step; the first seed's window (its trace is the one drawn)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.mean(r[key] for r in runs)
    steps = [r["step_s"] for r in runs]
    out.update(step_s_sd=statistics.stdev(steps) if len(steps) > 1 else 0.0, seed_step_s=steps)
    return out


COLOURS = {"decode": "tab:blue", "train": "tab:orange", "logprobs": "tab:brown", "retrieve": "tab:green",
           "weight_sync": "tab:red", "offload": "tab:gray", "onload": "tab:gray"}


def plot_timeline(traces: dict[str, list[dict]], results: dict[str, dict], path: Path) -> None:
    """One panel per mode; one row per rank of each group; coloured where busy, blank where idle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(traces), 1, figsize=(12, 2.6 * len(traces)), squeeze=False)
    for ax, (mode, trace) in zip(axes[:, 0], traces.items()):
        t0 = min(row["start"] for row in trace)
        labels, y = [], 0
        for group in GROUPS:
            pids = sorted({row["pid"] for row in trace if row["group"] == group})
            for i, pid in enumerate(pids):
                for row in trace:
                    if row["pid"] == pid and row["group"] == group:
                        ax.broken_barh([(row["start"] - t0, row["end"] - row["start"])], (y, 0.8),
                                       color=COLOURS.get(row["what"], "black"), linewidth=0)
                labels.append(f"{group} {i}")
                y += 1
        for edge in results[mode]["window"]:
            ax.axvline(edge - t0, color="black", linestyle=":", linewidth=0.8)
        ax.set_yticks([i + 0.4 for i in range(len(labels))], labels, fontsize=6)
        ax.set_title(f"{mode}: {results[mode]['step_s']:.0f} s a step (dotted: the steps measured)", fontsize=9)
        ax.set_xlabel("seconds")
    fig.legend(handles=[Patch(color=c, label=w) for w, c in COLOURS.items() if w != "onload"],
               loc="upper right", fontsize=7, ncol=5)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
