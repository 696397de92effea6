"""Do two retrievers answer a policy's own searches alike? The queries a run's policy issued (the ``queries`` of
its dumped training trajectories, ``rollouts/step_K.jsonl``) are searched in each named index of a demo folder, and
the top passages compared: how often each retriever finds none, how often its top passage is titled as the query
(the demo's task searches names, and a name's page is the passage that answers), and how often two retrievers agree
on it.

    python -m toolkits.retriever_agreement --base outputs/demo_s2 \\
        --runs 'outputs/ablate/retriever_s2base/cells/bm25/seed*/rl' --retrievers bm25,minilm,hybrid

The retriever ablation (docs/results.md) reads it beside its table: retrievers that agree on most top passages
cannot be told apart by held-out EM.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import sys
from pathlib import Path

from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.retrievers import RetrieverOptions, open_retriever
from rlinf_search.viewer.run_files import RunFiles

BATCH = 256
"""Queries a retriever searches at once."""


def policy_queries(pattern: str) -> list[str]:
    """Every query the training trajectories dumped by the matching run folders issued, repeats kept (they weigh
    as often)."""
    queries = []
    for run in sorted(glob.glob(pattern)):
        files = RunFiles(Path(run))
        for dump in files.dumps():
            if dump.kind == "train":
                queries += [query for row in files.rows(dump) for query in row["queries"]]
    return queries


def top_passages(index_dir: Path, retriever: str, corpus: CorpusStore, queries: list[str]) -> dict[str, int]:
    """Each distinct query's top corpus row (-1: the retriever found nothing)."""
    opened = open_retriever(index_dir, retriever, corpus, RetrieverOptions())
    distinct = sorted(set(queries))
    rows: list[int] = []
    for start in range(0, len(distinct), BATCH):
        found, _ = opened.search(distinct[start:start + BATCH], 1)
        rows += [int(row[0]) if len(row) else -1 for row in found]
    return dict(zip(distinct, rows, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkits.retriever_agreement", description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="a finished scripts/demo.sh folder (data/corpus.jsonl, index/)")
    parser.add_argument("--runs", required=True, help="a run folder (runner.output_dir); a glob takes several")
    parser.add_argument("--retrievers", default="bm25,minilm,hybrid", help="comma-separated, each built in index/")
    args = parser.parse_args(argv)
    base = Path(args.base)
    queries = policy_queries(args.runs)
    if not queries:
        print(f"retriever_agreement: no search in the training dumps of {args.runs} (rollouts/step_K.jsonl)",
              file=sys.stderr)
        return 1
    corpus = CorpusStore(base / "data" / "corpus.jsonl")
    names = [name.strip() for name in args.retrievers.split(",") if name.strip()]
    top = {name: top_passages(base / "index", name, corpus, queries) for name in names}
    print(f"{len(queries)} searches ({len(set(queries))} distinct) from {args.runs}")
    print("| retriever | no passage | top passage titled as the query |\n|---|---|---|")
    # Each passage that came first for any query, read from the corpus once.
    titles = {row: corpus[row].title.strip().lower() for found in top.values() for row in found.values() if row >= 0}
    for name in names:
        none = sum(top[name][q] < 0 for q in queries) / len(queries)
        titled = sum(titles.get(top[name][q]) == q.lower() for q in queries) / len(queries)
        print(f"| {name} | {none:.3f} | {titled:.3f} |")
    print("\n| pair | same top passage |\n|---|---|")
    for first, second in itertools.combinations(names, 2):
        same = sum(top[first][q] == top[second][q] for q in queries) / len(queries)
        print(f"| {first} / {second} | {same:.3f} |")
    corpus.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
