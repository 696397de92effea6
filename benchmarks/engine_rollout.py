"""The HF engine's rollout in process, this checkout beside an earlier one: the demo's model, questions and BM25
server, batches of 16 questions x 4 samples through the Search-R1 agent loop, in alternating rounds.

    python benchmarks/engine_rollout.py --before-code /tmp/before [--demo outputs/demo] [--batches 15] [--rounds 3]

``--demo`` is a finished ``bash scripts/demo.sh`` folder (its warm-started model ``model/sft``, its prepared training
questions and BM25 index, served once for both sides). ``--before-code DIR`` is a checkout of an earlier commit
(``git worktree add /tmp/before HEAD~1``): each side runs in a process of its own with that side's package first on
``PYTHONPATH``, the same seeds and settings (the demo's: 2 turns, one passage a search, 64 new tokens a turn,
temperature 1). A side's first batch warms up and is left out. It isolates the engine and the agent loop from the
rest of a GRPO step (Ray, the log-prob passes, the update), so a change to them shows at a fraction of
``benchmarks/trl_grpo.py``'s cost; that benchmark stays the one its goals are read from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS_A_BATCH = 16
SAMPLES = 4


def _rollout(demo: Path, address: str, batches: int) -> dict:
    """One side: ``batches`` rollouts of 16 x 4 in this process (imports from whatever ``PYTHONPATH`` puts first)."""
    from rlinf_search.agents.config import AgentLoopConfig
    from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
    from rlinf_search.data.io_struct import QARecord, SamplingParams
    from rlinf_search.tools.search import SearchToolConfig, build_search_tool
    from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine

    rows = [json.loads(line) for line in (demo / "data" / "train.prepared.jsonl").read_text().splitlines()]
    records = [QARecord(uid=r["uid"], prompt=r["prompt"], golden_answers=r["golden_answers"], data_source="synth",
                        question=r["question"]) for r in rows[: QUESTIONS_A_BATCH * batches]]
    engine = HFGenerationEngine(HFEngineConfig(str(demo / "model" / "sft"), device="cpu", max_batch_size=64))
    config = AgentLoopConfig(max_turns=2, max_obs_tokens=160, max_passage_tokens=48, topk=1,
                             sampling=SamplingParams(max_new_tokens=64, temperature=1.0))

    async def run() -> dict:
        tool = build_search_tool(SearchToolConfig(server_addr=address, topk=1))
        loop = SearchR1AgentLoop(engine, tool, engine.tokenizer, config)
        seconds, tokens = [], []
        for batch in range(batches):
            started = time.perf_counter()
            trajectories = await loop.run_batch(records[QUESTIONS_A_BATCH * batch: QUESTIONS_A_BATCH * (batch + 1)],
                                                SAMPLES, seed=batch)
            seconds.append(time.perf_counter() - started)
            tokens.append(sum(sum(t.response_mask) for t in trajectories))
        await tool.aclose()
        await engine.aclose()
        return {"seconds": seconds, "model_tokens": tokens}

    return asyncio.run(run())


def _side(code: Path, demo: Path, address: str, batches: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--side", "--demo", str(demo), "--address", address,
                          "--batches", str(batches)], cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", type=Path, default=ROOT / "outputs" / "demo")
    parser.add_argument("--before-code", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    demo = args.demo.resolve()
    if args.side:
        print(json.dumps(_rollout(demo, args.address, args.batches)))
        return 0
    if args.before_code is None:
        parser.error("--before-code: give a checkout to compare with (git worktree add /tmp/before HEAD~1)")
    if args.batches < 2:
        parser.error("--batches: at least 2 (the first warms up)")
    sys.path.insert(0, str(ROOT))
    from rlinf_search.retrieval.launch import RetrievalServerProcess

    sides = {"after": ROOT, "before": args.before_code.resolve()}
    server_args = ["--index-dir", str(demo / "index"), "--corpus", str(demo / "data" / "corpus.jsonl")]
    rows = []
    with RetrievalServerProcess(server_args) as server:
        for round_ in range(1, args.rounds + 1):
            order = list(sides) if round_ % 2 else list(sides)[::-1]  # whoever went second goes first next
            for name in order:
                run = _side(sides[name], demo, server.address, args.batches)
                seconds, tokens = run["seconds"][1:], run["model_tokens"][1:]
                rows.append({"round": round_, "side": name, "s_a_batch": statistics.mean(seconds),
                             "model_tokens_a_batch": statistics.mean(tokens),
                             "ms_a_model_token": 1000 * sum(seconds) / sum(tokens)})
    print("| round | side | s a batch | model tokens a batch | ms a model token |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['round']} | {row['side']} | {row['s_a_batch']:.3f} | {row['model_tokens_a_batch']:.0f} | "
              f"{row['ms_a_model_token']:.3f} |")
    print()
    for round_ in range(1, args.rounds + 1):
        after, before = (next(r for r in rows if r["round"] == round_ and r["side"] == side)
                         for side in ("after", "before"))
        print(f"round {round_}: after / before, a batch {after['s_a_batch'] / before['s_a_batch']:.2f}x, "
              f"a model token {after['ms_a_model_token'] / before['ms_a_model_token']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
