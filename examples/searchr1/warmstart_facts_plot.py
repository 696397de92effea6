"""Answer copy per kind of fact over a warm start's skill stage, one panel per run, from the warm starts' logs
(the lines ``sft skill step N: ... answer copy A (born_in x, country y, ...)`` that ``toolkits.sft_warmstart``
prints; a run that stopped at its cap saves no sft_losses.json, but its log has every reading). A focus round on one
kind (``toolkits/fact_focus.py``) is shaded.

    python examples/searchr1/warmstart_facts_plot.py --out docs/img/warmstart_facts.png \\
        "4 heads:run_a.log" "8 heads, by kind:run_b.log"
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_READING = re.compile(r"sft skill step (\d+): query copy ([\d.]+), answer copy [\d.]+ \(([^)]*)\)")
# The lines toolkits.fact_focus.FactFocus.update writes when a round starts and when it ends.
_FOCUS = re.compile(r"sft skill step (\d+): "
                    r"(?:\w+ copied under .* training on (\w+) questions alone|focus on (\w+) ends)")


def readings(log: str) -> tuple[list[int], list[float], dict[str, list[float]]]:
    """(steps, query copy, answer copy per kind) of every skill-stage reading in a warm start's log."""
    steps, query, facts = [], [], {}
    for match in _READING.finditer(log):
        steps.append(int(match[1]))
        query.append(float(match[2]))
        for part in match[3].split(", "):
            fact, share = part.rsplit(" ", 1)
            facts.setdefault(fact, []).append(float(share))
    return steps, query, facts


def focus_rounds(log: str) -> list[tuple[int, int | None, str]]:
    """(first step, last step or None if the log ends inside it, kind) of each focus round in a skill stage's log."""
    rounds: list[tuple[int, int | None, str]] = []
    for match in _FOCUS.finditer(log):
        if match[2]:
            rounds.append((int(match[1]), None, match[2]))
        elif rounds and rounds[-1][1] is None:
            rounds[-1] = (rounds[-1][0], int(match[1]), rounds[-1][2])
    return rounds


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL:LOG for each warm start")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    panels = []
    for run in args.runs:
        label, _, path = run.rpartition(":")
        try:
            text = Path(path).read_text(errors="replace")
            steps, query, facts = readings(text)
        except OSError as exc:
            print(f"warmstart_facts_plot: {exc}", file=sys.stderr)
            return 1
        if not steps:
            print(f"warmstart_facts_plot: {path} has no skill-stage reading with answer copy per kind of fact",
                  file=sys.stderr)
            return 1
        panels.append((label or path, steps, query, facts, focus_rounds(text)))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), sharey=True, squeeze=False)
    for ax, (label, steps, query, facts, rounds) in zip(axes[0], panels):
        for first, last, fact in rounds:
            ax.axvspan(first, last if last is not None else steps[-1], color="gold", alpha=0.25, lw=0)
            ax.text(first, 1.02, f"{fact} alone", fontsize=7)
        for fact, shares in sorted(facts.items()):
            ax.plot(steps, shares, marker=".", label=f"answer copy: {fact}")
        ax.plot(steps, query, "k--", label="query copy")
        ax.axhline(0.9, color="grey", lw=0.5)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("skill-stage step")
    axes[0][0].set_ylabel("share of validation questions")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
