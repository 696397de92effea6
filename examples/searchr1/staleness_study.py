"""Learning at staleness: from one warm start of the demo, GRPO under ``sync`` and under ``async`` at each
``runner.max_staleness`` and staleness correction, scored on the held-out questions.

    python examples/searchr1/staleness_study.py --base outputs/demo --out outputs/staleness_study \
        [--staleness 1,4,8,16] [--corrections none,tis,mask,decoupled,clip] [--seeds 0,1,2] [--steps 30]

``--base`` is a finished ``bash scripts/demo.sh`` output folder: its data, BM25 index and warm-started model
(``model/sft``) are shared by every cell, so the cells differ only in the pipeline, the correction and the RL seed
(``data.seed``). Each cell runs the demo's GRPO stage (``examples/searchr1/main_searchr1.py``, the demo's
overrides) and its held-out evaluation (``rlinf_search.runners.eval_runner``, greedy, ``--eval-n`` questions).
A cell whose ``eval_results.json`` exists is kept (rerun the command to finish an interrupted study). Writes
``results.json``, ``table.md`` and ``study.png`` (held-out EM per cell; reward and searches per step) under
``--out``, over every finished cell there (so a second call with other seeds adds to the same table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlinf_search.plot import find_metrics  # noqa: E402
from rlinf_search.retrieval.launch import RetrievalServerProcess  # noqa: E402
TOPK = 1  # the demo's


@dataclass(frozen=True)
class Cell:
    """One run of the study."""

    pipeline: str
    """``sync`` or ``async``."""
    staleness: int
    """``runner.max_staleness`` (0 for sync)."""
    correction: str
    """``algorithm.mismatch_correction`` (``none``: null; ``-`` for sync, which has none by default), or ``clip``:
    old log-probs not recomputed, so PPO's ratio and clip are taken against the behaviour policy (the engine's
    log-probs) and no weight corrects the lag."""
    seed: int
    """``data.seed`` of the RL stage."""

    @property
    def name(self) -> str:
        if self.pipeline == "sync":
            return f"sync_seed{self.seed}"
        return f"async_k{self.staleness}_{self.correction}_seed{self.seed}"

    def overrides(self) -> list[str]:
        if self.pipeline == "sync":
            return []
        common = ["++runner.pipeline=async", f"++runner.max_staleness={self.staleness}"]
        if self.correction == "clip":  # no proximal policy: PPO's ratio and clip taken against the engine's log-probs
            return [*common, "++algorithm.recompute_logprobs=false", "++algorithm.mismatch_correction=null"]
        correction = "null" if self.correction == "none" else self.correction
        return [*common, f"++algorithm.mismatch_correction={correction}"]


def run_cell(cell: Cell, base: Path, out: Path, address: str, args) -> dict:
    folder = out / cell.name
    result = folder / "eval" / "eval_results.json"
    if not result.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cell.json").write_text(json.dumps(dataclasses.asdict(cell)))
        data = base / "data"
        with open(folder / "train.log", "w") as log:
            subprocess.run([sys.executable, "examples/searchr1/main_searchr1.py", f"runner.output_dir={folder / 'rl'}",
                            f"runner.max_steps={args.steps}", "runner.resume_dir=null",
                            f"rollout.model.model_path={base / 'model' / 'sft'}", f"tools.search.server_addr={address}",
                            f"tools.search.topk={TOPK}", f"data.seed={cell.seed}",
                            f"data.train_data_paths=[{data / 'train.prepared.jsonl'}]",
                            f"data.val_data_paths=[{data / 'val.prepared.jsonl'}]", *cell.overrides()],
                           check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            final = folder / "rl" / "checkpoints" / f"global_step_{args.steps}" / "hf_model"
            subprocess.run([sys.executable, "-m", "rlinf_search.runners.eval_runner", "--model", str(final),
                            "--data", str(data / "test.prepared.jsonl"), "--server-addr", address, "--topk", str(TOPK),
                            "--max-new-tokens", "64", "--max-samples", str(args.eval_n), "--out", str(folder / "eval")],
                           check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return read_cell(cell, folder)


def read_cell(cell: Cell, folder: Path) -> dict:
    overall = json.loads((folder / "eval" / "eval_results.json").read_text())["overall"]
    steps = [json.loads(line) for line in find_metrics(folder / "rl").read_text().splitlines() if line.strip()]
    steps = [row for row in steps if "reward/mean" in row]
    lags = [row.get("staleness/mean_lag", 0.0) for row in steps]
    return {"cell": cell.name, "pipeline": cell.pipeline, "staleness": cell.staleness, "correction": cell.correction,
            "seed": cell.seed, "heldout_em": overall["em"], "searches": overall.get("searches"),
            "reward": [row["reward/mean"] for row in steps],
            "searches_per_step": [row.get("rollout/searches_per_trajectory", math.nan) for row in steps],
            "mean_lag": statistics.mean(lags) if lags else 0.0, "max_lag": max((row.get("staleness/max_lag", 0.0)
                                                                                for row in steps), default=0.0)}


def table(rows: list[dict], warm_em: float | None) -> str:
    """Mean (sd) held-out EM per pipeline, staleness and correction, over seeds."""
    sync = [r["heldout_em"] for r in rows if r["pipeline"] == "sync"]
    sync_mean = statistics.mean(sync) if sync else math.nan
    lines = ["| cell | seeds | held-out EM, mean (sd) | vs sync | mean lag | max lag | reward, steps 1-5 -> last 5 |",
             "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["pipeline"], r["staleness"], r["correction"]) for r in rows},
                  key=lambda k: (k[0] != "sync", k[1], k[2]))
    for pipeline, staleness, correction in keys:
        mine = [r for r in rows if (r["pipeline"], r["staleness"], r["correction"]) == (pipeline, staleness, correction)]
        ems = [r["heldout_em"] for r in mine]
        sd = statistics.stdev(ems) if len(ems) > 1 else 0.0
        early = statistics.mean(statistics.mean(r["reward"][:5]) for r in mine)
        late = statistics.mean(statistics.mean(r["reward"][-5:]) for r in mine)
        name = "sync" if pipeline == "sync" else f"async k={staleness} {correction}"
        collapsed = " (below warm start)" if warm_em is not None and statistics.mean(ems) < warm_em else ""
        lines.append(f"| {name} | {len(ems)} | {statistics.mean(ems):.3f} ({sd:.3f}){collapsed} | "
                     f"{statistics.mean(ems) - sync_mean:+.3f} | {statistics.mean(r['mean_lag'] for r in mine):.2f} | "
                     f"{max(r['max_lag'] for r in mine):.0f} | {early:.3f} -> {late:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, warm_em: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (em_ax, reward_ax, search_ax) = plt.subplots(1, 3, figsize=(16, 4.5))
    corrections = sorted({r["correction"] for r in rows if r["pipeline"] == "async"})
    sync = [r["heldout_em"] for r in rows if r["pipeline"] == "sync"]
    for correction in corrections:
        points = sorted({r["staleness"] for r in rows if r["correction"] == correction})
        means = [statistics.mean(r["heldout_em"] for r in rows if r["correction"] == correction
                                 and r["staleness"] == k) for k in points]
        em_ax.plot(points, means, marker="o", label=correction)
    if sync:
        em_ax.axhline(statistics.mean(sync), color="black", linestyle="--", label="sync")
    if warm_em is not None:
        em_ax.axhline(warm_em, color="grey", linestyle=":", label="warm start")
    em_ax.set(xscale="log", xlabel="runner.max_staleness", ylabel="held-out EM", title="held-out EM (mean of seeds)")
    em_ax.set_xticks(sorted({r["staleness"] for r in rows if r["pipeline"] == "async"}))
    em_ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    em_ax.legend(fontsize=8)
    for r in rows:
        if r["pipeline"] == "sync" or r["correction"] in ("tis", "none") and r["staleness"] in (1, max(
                x["staleness"] for x in rows)):
            label = "sync" if r["pipeline"] == "sync" else f"k={r['staleness']} {r['correction']}"
            reward_ax.plot(range(1, len(r["reward"]) + 1), r["reward"], label=f"{label} s{r['seed']}", linewidth=1)
            search_ax.plot(range(1, len(r["searches_per_step"]) + 1), r["searches_per_step"], linewidth=1)
    reward_ax.set(xlabel="step", ylabel="reward/mean", title="reward per step")
    search_ax.set(xlabel="step", ylabel="searches per trajectory", title="searches per step")
    reward_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a finished scripts/demo.sh output folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--staleness", default="1,4,8,16")
    parser.add_argument("--corrections", default="none,tis,mask,decoupled")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-n", type=int, default=300)
    parser.add_argument("--no-sync", action="store_true", help="leave out the sync cells")
    args = parser.parse_args()
    base, out = Path(args.base).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    cells = [] if args.no_sync else [Cell("sync", 0, "-", seed) for seed in seeds]
    cells += [Cell("async", int(k), c, seed) for k in args.staleness.split(",") for c in args.corrections.split(",")
              for seed in seeds]
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    server_args = ["--index-dir", str(base / "index"), "--corpus", str(base / "data" / "corpus.jsonl"),
                   "--retriever", "bm25", "--host", "127.0.0.1"]
    started = time.perf_counter()
    with RetrievalServerProcess(server_args, log_path=out / "server.log") as server:
        for index, cell in enumerate(cells):
            row = run_cell(cell, base, out, server.address, args)
            elapsed = time.perf_counter() - started
            eta = elapsed / (index + 1) * (len(cells) - index - 1)
            print(f"[{index + 1}/{len(cells)}] {cell.name}: held-out EM {row['heldout_em']:.3f}, mean lag "
                  f"{row['mean_lag']:.2f} ({elapsed / 60:.1f} min, ETA {eta / 60:.1f} min)", flush=True)
    # The table covers every finished cell under --out, from this call or an earlier one (other seeds, say).
    rows = [read_cell(Cell(**json.loads(path.read_text())), path.parent) for path in sorted(out.glob("*/cell.json"))
            if (path.parent / "eval" / "eval_results.json").is_file()]
    warm = base / "eval" / "warm_start" / "eval_results.json"
    warm_em = json.loads(warm.read_text())["overall"]["em"] if warm.is_file() else None
    (out / "results.json").write_text(json.dumps({"warm_start_em": warm_em, "cells": rows}, indent=1))
    text = table(rows, warm_em)
    (out / "table.md").write_text(text + "\n")
    plot(rows, out / "study.png", warm_em)
    print(f"warm start held-out EM: {warm_em}\n{text}\nwrote {out / 'results.json'}, {out / 'table.md'}, "
          f"{out / 'study.png'}")


if __name__ == "__main__":
    main()
