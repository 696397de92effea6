"""Query encoding alone, in-process on the calling thread: queries/s of ``DenseEncoder.encode_queries`` by batch size.

    python benchmarks/query_encoding.py                        # this checkout's encoder
    python benchmarks/query_encoding.py --code-dir ../old      # another checkout's, e.g. a worktree of an older commit

No faiss, no threads, no HTTP: what a change to the encoder's passes does, side by side with another commit when run
alternately. HotpotQA-100 questions, taken in a fixed rotating order; each cell is the best of ``--repeats`` timings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code-dir", default=str(REPO), help="checkout whose rlinf_search is timed")
    parser.add_argument("--batches", default="1,8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--seconds", type=float, default=2.0, help="per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--retriever", default="minilm")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(args.code_dir).resolve()))
    from rlinf_search.retrieval.encoders import DenseEncoder

    with open(REPO / "tests" / "data" / "hotpotqa_100" / "test.jsonl") as handle:
        questions = [json.loads(line)["question"] for line in handle if line.strip()]
    encoder = DenseEncoder(args.retriever, device="cpu")
    print(f"{args.retriever} from {args.code_dir}; bf16 query batches: {encoder.query_bf16}")
    print(f"{'batch':>5} | queries/s (best of {args.repeats})")
    for size in (int(b) for b in args.batches.split(",")):
        encoder.encode_queries(questions[:size])  # one-off costs out of the timing
        rates = []
        for _ in range(args.repeats):
            started, calls = time.perf_counter(), 0
            while time.perf_counter() - started < args.seconds:
                begin = (calls * 7) % len(questions)
                encoder.encode_queries((questions + questions)[begin: begin + size])
                calls += 1
            rates.append(calls * size / (time.perf_counter() - started))
        print(f"{size:>5} | {max(rates):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
