"""Our GRPO step beside TRL's GRPOTrainer on the demo's task: the same model, data, BM25 server and group size, in
alternating rounds on one machine, each phase's seconds per model token.

    python benchmarks/trl_grpo.py [--demo outputs/demo] [--steps 12] [--rounds 2] [--trl-venv .venv-trl]
                                  [--before-code DIR] [--out outputs/bench_trl]

``--demo`` is a finished ``bash scripts/demo.sh`` folder: its warm-started model (``model/sft``), its prepared
training questions and its BM25 index, served once for both sides. Ours is ``rlinf-search train tiny-cpu``, the
demo's own GRPO stage (Ray worker groups, the agent loop, the HF engine, the actor), its phases read from the run's
``metrics.jsonl``; TRL's is ``benchmarks/trl_searchr1.py`` in a venv of its own (made on first use: torch pinned
first, then ``trl==1.16.0`` and this package, under ``requirements/cpu-lock.txt``). Rounds alternate which side goes
first, so a machine that slows down over the run charges both. ``--before-code DIR`` (a checkout of an earlier
commit, e.g. ``git worktree add /tmp/before HEAD~1``) adds a third side, ``before``: our step run from that
checkout's package, so a change is measured beside the code before it and beside TRL in the same rounds.

The phases are matched as far as the two designs allow: ``rollout`` (generation and search), ``score`` (old and
reference log-probs, reward, advantages: our ``inference``, ``reward`` and ``advantages``; TRL's generate-and-score
less its rollout), ``training`` (the two optimizer steps) and, ours only, ``weight_sync`` (TRL trains the model it
samples from). The first step of each run warms up and is left out of every mean. The two sides sample different
trajectories, so the ratio is taken per model token (the tokens the policy wrote, which both sides train on),
beside the per-step ratio. Printed: a table per round and the ratios; ``--out`` gets ``results.json`` and
``table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.retrieval.launch import RetrievalServerProcess  # noqa: E402

TRL_VERSION = "1.16.0"
PHASES = ("rollout", "score", "training", "weight_sync")
OUR_PHASES = {"rollout": ("rollout",), "score": ("inference", "reward", "advantages"), "training": ("training",),
              "weight_sync": ("weight_sync",)}


def ensure_trl_venv(venv: Path) -> Path:
    """The TRL side's python, installing the venv first when it is not there."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl, rlinf_search"], capture_output=True).returncode == 0:
        return python
    print(f"[trl] making {venv}: torch pinned first, then trl=={TRL_VERSION} and this package (a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"trl=={TRL_VERSION}", "-e", str(ROOT), "-c", str(ROOT / "requirements" / "cpu-lock.txt")],
                   check=True)
    return python


def run_ours(demo: Path, addr: str, steps: int, seed: int, out: Path, code: Path | None = None) -> list[dict]:
    """The demo's GRPO stage for ``steps`` steps; one dict of phase seconds and tokens per step. ``code``: run the
    package of that checkout instead (its Ray workers inherit the path)."""
    env = {**os.environ, "PYTHONPATH": str(code)} if code is not None else None
    shutil.rmtree(out, ignore_errors=True)
    data = demo / "data"
    subprocess.run(
        [sys.executable, "-m", "rlinf_search.cli", "train", "tiny-cpu", f"runner.output_dir={out}",
         f"runner.max_steps={steps}", "runner.resume_dir=null", "runner.val_check_interval=0",
         f"rollout.model.model_path={demo / 'model' / 'sft'}", f"tools.search.server_addr={addr}",
         "tools.search.topk=1", f"data.seed={seed}", f"data.train_data_paths=[{data / 'train.prepared.jsonl'}]",
         f"data.val_data_paths=[{data / 'val.prepared.jsonl'}]"],
        check=True, stdout=(out.parent / f"{out.name}.log").open("w"), stderr=subprocess.STDOUT, env=env,
        cwd=code)
    rows = []
    for line in (out / "logs" / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "time/step_s" not in m:
            continue
        row = {phase: sum(m.get(f"time/{name}_s", 0.0) for name in names) for phase, names in OUR_PHASES.items()}
        row["step_s"] = m["time/step_s"]
        row["trajectories"] = m["rollout/trajectories"]
        row["model_tokens"] = m["rollout/model_tokens"] * m["rollout/trajectories"]
        rows.append(row)
    return rows


def run_trl(python: Path, demo: Path, addr: str, steps: int, seed: int, out: Path) -> list[dict]:
    times = out / "times.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "trl_searchr1.py"), "--model", str(demo / "model" / "sft"),
         "--data", str(demo / "data" / "train.prepared.jsonl"), "--server-addr", addr, "--steps", str(steps),
         "--seed", str(seed), "--out", str(times), "--work-dir", str(out / "work")],
        check=True, stdout=(out.parent / f"{out.name}.log").open("w"), stderr=subprocess.STDOUT)
    rows = []
    for line in times.read_text().splitlines():
        m = json.loads(line)
        rows.append({"rollout": m["rollout_s"], "score": m["score_s"], "training": m["training_s"],
                     "weight_sync": 0.0, "step_s": m["step_s"], "trajectories": m["trajectories"],
                     "model_tokens": m["model_tokens"]})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Means over the steps after the first: seconds a step per phase, model tokens, seconds per 1k model tokens."""
    kept = rows[1:]
    if not kept:
        raise SystemExit("trl_grpo: a run logged fewer than 2 steps; use --steps 2 or more")
    mean = {key: sum(r[key] for r in kept) / len(kept) for key in (*PHASES, "step_s", "model_tokens", "trajectories")}
    tokens = sum(r["model_tokens"] for r in kept)
    mean["ms_per_model_token"] = {phase: 1000 * sum(r[phase] for r in kept) / tokens for phase in (*PHASES, "step_s")}
    mean["model_tokens_per_trajectory"] = tokens / sum(r["trajectories"] for r in kept)
    mean["steps"] = len(kept)
    return mean


def table(rounds: list[dict]) -> str:
    lines = ["| round | side | s a step | rollout s | score s | training s | weight sync s | model tokens a trajectory "
             "| ms a model token (step) | ms a model token (rollout) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        for side in r["order"]:
            s = r[side]
            per = s["ms_per_model_token"]
            lines.append(f"| {r['round']} | {side} | {s['step_s']:.2f} | {s['rollout']:.2f} | {s['score']:.2f} | "
                         f"{s['training']:.2f} | {s['weight_sync']:.2f} | {s['model_tokens_per_trajectory']:.2f} | "
                         f"{per['step_s']:.2f} | {per['rollout']:.2f} |")
    lines += ["", "| round | side / TRL | a step | a model token: step | rollout | score | training |",
              "|---|---|---|---|---|---|---|"]
    for r in rounds:
        trl = r["trl"]["ms_per_model_token"]
        for side in (s for s in ("ours", "before") if s in r):
            mine = r[side]["ms_per_model_token"]
            lines.append(f"| {r['round']} | {side} | {r[side]['step_s'] / r['trl']['step_s']:.2f}x | "
                         + " | ".join(f"{mine[p] / trl[p]:.2f}x" for p in ("step_s", "rollout", "score", "training"))
                         + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", default="outputs/demo", help="a finished scripts/demo.sh folder")
    parser.add_argument("--steps", type=int, default=12, help="RL steps a run (the first is left out)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-venv", default=str(ROOT / ".venv-trl"))
    parser.add_argument("--before-code", default=None, help="a checkout whose package runs as the side 'before'")
    parser.add_argument("--out", default="outputs/bench_trl")
    args = parser.parse_args()
    demo, out = Path(args.demo).resolve(), Path(args.out).resolve()
    if not (demo / "model" / "sft" / "config.json").exists():
        raise SystemExit(f"trl_grpo: {demo} holds no warm-started model (model/sft); run bash scripts/demo.sh first")
    out.mkdir(parents=True, exist_ok=True)
    python = ensure_trl_venv(Path(args.trl_venv))
    rounds = []
    server_args = ["--index-dir", str(demo / "index"), "--corpus", str(demo / "data" / "corpus.jsonl"),
                   "--retriever", "bm25", "--host", "127.0.0.1"]
    with RetrievalServerProcess(server_args, log_path=out / "server.log") as server:
        addr = server.address
        for number in range(1, args.rounds + 1):
            sides = ["ours", "trl"] + (["before"] if args.before_code else [])
            order = tuple(sides[(number - 1) % len(sides):] + sides[:(number - 1) % len(sides)])
            result = {"round": number, "order": order}
            for side in order:
                started = time.perf_counter()
                print(f"round {number}/{args.rounds}: {side}, {args.steps} steps...", flush=True)
                where = out / f"{side}-r{number}"
                if side == "trl":
                    rows = run_trl(python, demo, addr, args.steps, args.seed, where)
                else:
                    code = Path(args.before_code).resolve() if side == "before" else None
                    rows = run_ours(demo, addr, args.steps, args.seed, where, code)
                result[side] = summarize(rows)
                result[side]["per_step"] = rows
                print(f"  {side}: {result[side]['step_s']:.2f} s a step "
                      f"({time.perf_counter() - started:.0f} s with start-up)", flush=True)
            rounds.append(result)
    text = table(rounds)
    print(text)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "machine": machine, "rounds": rounds},
                                                 indent=1))
    (out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
