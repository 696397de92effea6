"""The first warm-start losses of a demo's model, to ten digits: is a change of library or kernels a change of math?

    python benchmarks/warmstart_trace.py --demo-out outputs/demo [--steps 12]
    ATEN_CPU_CAPABILITY=default python benchmarks/warmstart_trace.py --demo-out outputs/demo

Starts a BM25 server over the demo's index, collects the scripted good searches of its training questions through
the real agent loop, and takes ``--steps`` reading-stage steps (``toolkits.sft_warmstart``: passages and model turns
trained, batch 16, seed 0) from the demo's untrained model (``model/base``). Prints the machine line and the
losses. Two environments that print the same losses run the same arithmetic; where they part, every later step
of the demo differs too, and which run learns is drawn anew (docs/history/results.md, issue 23).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.prepare import load_records
from rlinf_search.retrieval.launch import RetrievalServerProcess
from toolkits.machine_info import machine_info, summary
from toolkits.sft_scripts import BehaviourMix, SyntheticScripts
from toolkits.sft_training import SFTConfig, SFTStage, train_sft
from toolkits.sft_warmstart import _collect_from_server


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-out", required=True, type=Path, help="a scripts/demo.sh output folder")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--topk", type=int, default=1)
    args = parser.parse_args(argv)
    out = args.demo_out
    tokenizer = AutoTokenizer.from_pretrained(out / "model" / "base")
    model = AutoModelForCausalLM.from_pretrained(out / "model" / "base", dtype=torch.float32)
    records = load_records(out / "data" / "train.prepared.jsonl")
    scripts = SyntheticScripts(records, BehaviourMix())
    loop = AgentLoopConfig(max_turns=2, max_tokens_per_turn=64, max_obs_tokens=160, max_passage_tokens=48,
                           topk=args.topk)
    with RetrievalServerProcess(["--index-dir", str(out / "index"), "--corpus", str(out / "data" / "corpus.jsonl"),
                                 "--retriever", "bm25"]) as server:
        good = asyncio.run(_collect_from_server(records, lambda record, rng: scripts.good_search(record), tokenizer,
                                                server.address, loop, 0))
    stage = SFTStage("reading", good, args.steps, train_on_observations=True, trains_decision=False)
    log = train_sft(model, tokenizer, [stage], SFTConfig())
    print(summary(machine_info()))
    print("losses: " + " ".join(f"{loss:.10f}" for loss in log.losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
