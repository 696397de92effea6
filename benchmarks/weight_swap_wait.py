"""What a weight swap costs the sender on a real engine: abort at a token boundary vs drain the turns in flight.

    python benchmarks/weight_swap_wait.py [--requests 24] [--swaps 6] [--repeats 2] [--out outputs/weight_swap_wait]

The HF engine (continuous batching, CPU) decodes a steady stream of agent turns: ``--requests`` run at once and
each finished one is replaced by a new one, with turn lengths drawn like Search-R1's (log-normal around
``--turn-median`` tokens, cut at ``--turn-max``). A second thread swaps the weights every ``--every-s`` seconds
through the rank's weight gate (``GatedEngine.load_weights``), as a weight sync's receiver does. ``interrupt``
aborts the requests in flight and continues them on the new weights after a prefill of what they had; ``drain``
lets every turn in flight finish first. Both run in one process, alternating, on the same model and stream.

The sender of a weight sync waits for the gate before the buckets can stream in: the table's ``wait`` is that
wait per swap, ``load`` the load itself. ``tokens/s`` is the engine's decode rate over the run (the interrupted
mode pays a prefill of every aborted request's tokens again; the drained mode leaves the engine idle while the
last turns finish and the load runs). The model is a Qwen2-architecture LM of random weights (``--hidden``,
``--layers``), big enough that a decode step costs what it costs; its outputs are not text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.data.io_struct import SamplingParams  # noqa: E402
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine  # noqa: E402
from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate  # noqa: E402
from toolkits.make_tiny_model import TinyModelSpec, make_tiny_model  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "hotpotqa_100" / "corpus.jsonl"


def _turn_length(rng: random.Random, median: int, maximum: int) -> int:
    return max(8, min(maximum, int(median * math.exp(0.6 * rng.gauss(0.0, 1.0)))))


def run_mode(engine: HFGenerationEngine, weights: dict, *, interrupt: bool, args, seed: int) -> dict:
    """One stream of turns with ``args.swaps`` swaps; the gate's counts and the engine's tokens."""
    gate = WeightGate()
    gated = GatedEngine(engine, gate, interrupt=interrupt)
    rng = random.Random(seed)
    prompt = engine.tokenizer.encode("Question: who wrote the first algorithm? Think, then search.")
    stop = threading.Event()
    waits, loads = [], []

    def swapper():
        for version in range(1, args.swaps + 1):
            time.sleep(args.every_s)
            before = gate.activity().swap_wait_s
            started = time.perf_counter()
            gated.load_weights(weights, version)
            total = time.perf_counter() - started
            wait = gate.activity().swap_wait_s - before
            waits.append(wait)
            loads.append(total - wait)
        time.sleep(args.every_s / 2)
        stop.set()

    async def one_turn() -> None:
        sampling = SamplingParams(max_new_tokens=_turn_length(rng, args.turn_median, args.turn_max),
                                  temperature=1.0, stop_at_eos=False, seed=rng.randrange(2**31))
        await gated.generate(prompt, sampling)

    async def stream() -> None:
        async def worker():
            while not stop.is_set():
                await one_turn()

        await asyncio.gather(*(worker() for _ in range(args.requests)))

    tokens_before, prefills_before = engine.stats.generated_tokens, engine.stats.prefills
    thread = threading.Thread(target=swapper)
    started = time.perf_counter()
    thread.start()
    asyncio.run(stream())
    thread.join()
    seconds = time.perf_counter() - started
    activity = gate.activity()
    return {"mode": "interrupt" if interrupt else "drain", "seed": seed, "swaps": len(waits),
            "wait_s": waits, "load_s": loads, "aborted": activity.aborted,
            "tokens_per_s": (engine.stats.generated_tokens - tokens_before) / seconds,
            "prefills": engine.stats.prefills - prefills_before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--every-s", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turn-median", type=int, default=120)
    parser.add_argument("--turn-max", type=int, default=500)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--out", default="outputs/weight_swap_wait")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        spec = TinyModelSpec(vocab_size=4096, hidden_size=args.hidden, num_layers=args.layers, num_heads=8,
                             num_kv_heads=2, intermediate_size=args.hidden * 3)
        model_dir = make_tiny_model(Path(scratch) / "model", [CORPUS], spec)
        engine = HFGenerationEngine(HFEngineConfig(str(model_dir), device="cpu", seed=0,
                                                   max_batch_size=args.requests))
        weights = {name: value.clone() for name, value in engine.model.state_dict().items()}
        runs = []
        for repeat in range(args.repeats):  # alternating, so drift on a noisy machine falls on both modes
            for interrupt in ((True, False) if repeat % 2 == 0 else (False, True)):
                run = run_mode(engine, weights, interrupt=interrupt, args=args, seed=repeat)
                runs.append(run)
                print(f"repeat {repeat} {run['mode']:9s}: wait per swap {statistics.mean(run['wait_s']) * 1e3:8.1f} "
                      f"ms, {run['tokens_per_s']:.0f} tokens/s", flush=True)
        asyncio.run(engine.aclose())

    rows = {}
    for mode in ("interrupt", "drain"):
        mine = [r for r in runs if r["mode"] == mode]
        waits = [w for r in mine for w in r["wait_s"]]
        rows[mode] = {"swaps": len(waits), "wait_mean_ms": statistics.mean(waits) * 1e3,
                      "wait_max_ms": max(waits) * 1e3,
                      "load_mean_ms": statistics.mean(l for r in mine for l in r["load_s"]) * 1e3,
                      "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in mine),
                      "tokens_per_s_sd": statistics.stdev(r["tokens_per_s"] for r in mine) if len(mine) > 1 else 0.0,
                      "aborted": sum(r["aborted"] for r in mine)}
    ratio = rows["interrupt"]["wait_mean_ms"] / rows["drain"]["wait_mean_ms"]
    throughput = rows["interrupt"]["tokens_per_s"] / rows["drain"]["tokens_per_s"]
    print(f"\n{args.requests} turns at once (median {args.turn_median}, max {args.turn_max} tokens), "
          f"hidden {args.hidden} x {args.layers} layers, {args.swaps} swaps x {args.repeats} repeats per mode")
    print(f"{'mode':10s} {'swaps':>5s} {'wait/swap ms':>13s} {'max ms':>8s} {'load ms':>8s} {'tokens/s':>14s} "
          f"{'aborted':>8s}")
    for mode, row in rows.items():
        print(f"{mode:10s} {row['swaps']:5d} {row['wait_mean_ms']:13.1f} {row['wait_max_ms']:8.1f} "
              f"{row['load_mean_ms']:8.1f} {row['tokens_per_s']:8.0f} +- {row['tokens_per_s_sd']:3.0f} "
              f"{row['aborted']:8d}")
    print(f"interrupt / drain: wait per swap {ratio:.3f}x, decode rate {throughput:.3f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "modes": rows, "wait_ratio": ratio,
                                                  "throughput_ratio": throughput, "runs": runs}, indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
