"""The retrieval server's ceiling: its own retriever searched in-process, per batch size, as the server runs it.

    python benchmarks/encoder_ceiling.py --index-dir outputs/bench/qps/indexes/hotpotqa_100 \\
        --corpus tests/data/hotpotqa_100/corpus.jsonl --retriever minilm

Loads the retriever the way the server does (same options, so the same query precision: bf16 batches where the CPU
has AMX), then for each batch size calls ``search`` on batches of questions for a fixed time: in one worker thread
on all cores, and in two at once on half the cores each (the server's batch threads on a CPU; see its warm-up note
for why not the main thread). The best rate over batch sizes 1-64 and both layouts is what a server with no HTTP
cost could serve: ``benchmarks/retrieval_qps.py`` runs this in the same run, on the same cores, and prints the
server's queries/s beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class CeilingCell:
    """In-process search rate at one batch size and number of concurrent batches."""

    batch_size: int
    """Queries per ``search`` call."""
    streams: int
    """``search`` calls at once, each in its own thread on its share of the cores (the server's batch threads)."""
    qps: float
    """Queries searched per second (encoding and the index search, as one server batch does)."""
    calls: int
    """``search`` calls timed."""


def measure_ceiling(retriever, queries: list[str], *, batch_sizes=BATCH_SIZES, seconds: float = 3.0,
                    topk: int = 3, seed: int = 0, streams: int = 1) -> list[CeilingCell]:
    """Time ``retriever.search`` on random batches of ``queries`` at each batch size for ``seconds`` (after one
    untimed call), in ``streams`` worker threads at once; with more than one, each thread uses its share of the
    cores for torch's intra-op work, as the server's batch threads do (``retrieval.batcher``)."""
    import torch

    cores = len(os.sched_getaffinity(0))
    threads = None if streams == 1 else max(1, cores // streams)

    def rate(size: int, stream: int) -> tuple[int, float]:
        if threads is not None:
            torch.set_num_threads(threads)
        rng = random.Random(seed * 1000 + stream)
        retriever.search(rng.choices(queries, k=size), topk)
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            retriever.search(rng.choices(queries, k=size), topk)
            calls += 1
        return calls, calls * size / elapsed

    cells = []
    with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="ceiling") as workers:
        for size in batch_sizes:
            results = [future.result() for future in [workers.submit(rate, size, s) for s in range(streams)]]
            cells.append(CeilingCell(size, streams, round(sum(r for _, r in results), 2), sum(c for c, _ in results)))
    return cells


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
    parser.add_argument("--streams", default="1,2",
                        help="batches searched at once, each on its share of the cores (the server runs 2 on a CPU)")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--json-out", default=None, help="write the cells here too")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.batch_sizes.split(",")]
        if any(size < 1 for size in sizes):
            raise ValueError(f"--batch-sizes must be positive, got {args.batch_sizes}")
        if any(int(n) < 1 for n in args.streams.split(",")):
            raise ValueError(f"--streams must be positive, got {args.streams}")
        questions = [json.loads(line)["question"] for line in open(args.questions) if line.strip()]
        corpus = CorpusStore(args.corpus)
        retriever = open_retriever(Path(args.index_dir), args.retriever, corpus,
                                   RetrieverOptions(query_precision=args.query_precision))
    except (OSError, ValueError, KeyError) as exc:
        print(f"encoder_ceiling: {exc}", file=sys.stderr)
        return 1
    cells = [cell for streams in (int(n) for n in args.streams.split(","))
             for cell in measure_ceiling(retriever, questions, batch_sizes=sizes, seconds=args.seconds,
                                         topk=args.topk, streams=streams)]
    best = max(cells, key=lambda cell: cell.qps)
    print(f"{'streams':>7} | {'batch':>5} | {'queries/s':>9}")
    for cell in cells:
        print(f"{cell.streams:>7} | {cell.batch_size:>5} | {cell.qps:>9.1f}" + ("  <- ceiling" if cell is best else ""))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"cells": [asdict(c) for c in cells], "best": asdict(best)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
