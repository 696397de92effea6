"""The retrieval server's ceiling: its own retriever searched in-process, per batch size, as the server runs it.

    python benchmarks/encoder_ceiling.py --index-dir outputs/bench/qps/indexes/hotpotqa_100 \\
        --corpus tests/data/hotpotqa_100/corpus.jsonl --retriever minilm

Loads the retriever the way the server does (same options, so the same query precision: bf16 batches where the CPU
has AMX), then for each batch size calls ``search`` on batches of questions in a worker thread (the server's batches
run in one; see its warm-up note) for a fixed time. The best rate over batch sizes 1-64 is what a server with no HTTP
cost could serve: ``benchmarks/retrieval_qps.py`` runs this in the same run, on the same cores, and prints the
server's queries/s beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class CeilingCell:
    """In-process search rate at one batch size."""

    batch_size: int
    """Queries per ``search`` call."""
    qps: float
    """Queries searched per second (encoding and the index search, as one server batch does)."""
    calls: int
    """``search`` calls timed."""


def measure_ceiling(retriever, queries: list[str], *, batch_sizes=BATCH_SIZES, seconds: float = 3.0,
                    topk: int = 3, seed: int = 0) -> list[CeilingCell]:
    """Time ``retriever.search`` on random batches of ``queries`` at each batch size for ``seconds`` (after one
    untimed call), in one worker thread."""
    rng = random.Random(seed)

    def rate(size: int) -> CeilingCell:
        retriever.search(rng.choices(queries, k=size), topk)
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            retriever.search(rng.choices(queries, k=size), topk)
            calls += 1
        return CeilingCell(size, round(calls * size / elapsed, 2), calls)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ceiling") as worker:
        return [worker.submit(rate, size).result() for size in batch_sizes]


def main(argv: list[str] | None = None) -> int:
    from rlinf_search.retrieval.corpus import CorpusStore
    from rlinf_search.retrieval.retrievers import RetrieverOptions, open_retriever

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", required=True, help="folder written by build_index")
    parser.add_argument("--corpus", required=True, help="the corpus jsonl the index was built on")
    parser.add_argument("--retriever", default="minilm")
    parser.add_argument("--questions", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" /
                                                   "hotpotqa_100" / "test.jsonl"),
                        help="jsonl with a 'question' field")
    parser.add_argument("--query-precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="as the server's --query-precision")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--seconds", type=float, default=3.0, help="timed per batch size")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--json-out", default=None, help="write the cells here too")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.batch_sizes.split(",")]
        if any(size < 1 for size in sizes):
            raise ValueError(f"--batch-sizes must be positive, got {args.batch_sizes}")
        questions = [json.loads(line)["question"] for line in open(args.questions) if line.strip()]
        corpus = CorpusStore(args.corpus)
        retriever = open_retriever(Path(args.index_dir), args.retriever, corpus,
                                   RetrieverOptions(query_precision=args.query_precision))
    except (OSError, ValueError, KeyError) as exc:
        print(f"encoder_ceiling: {exc}", file=sys.stderr)
        return 1
    cells = measure_ceiling(retriever, questions, batch_sizes=sizes, seconds=args.seconds, topk=args.topk)
    best = max(cells, key=lambda cell: cell.qps)
    print(f"{'batch':>5} | {'queries/s':>9}")
    for cell in cells:
        print(f"{cell.batch_size:>5} | {cell.qps:>9.1f}" + ("  <- ceiling" if cell is best else ""))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"cells": [asdict(c) for c in cells], "best": asdict(best)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
