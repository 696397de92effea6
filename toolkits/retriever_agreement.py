"""Do two retrievers answer a policy's own searches alike? The queries a run's policy wrote (every ``<search>`` in
its saved ``rollouts/step_*.jsonl``) are searched in each named index of a demo folder, and the top passages
compared: how often each retriever finds none, how often its top passage is titled as the query (the demo's task
searches names, and a name's page is the passage that answers), and how often two retrievers agree on it.

    python -m toolkits.retriever_agreement --base outputs/demo_s2 \\
        --rollouts 'outputs/ablate/retriever_s2base/cells/bm25/seed*/rl/rollouts' --retrievers bm25,minilm,hybrid

The retriever ablation (docs/results.md) reads it beside its table: retrievers that agree on most top passages
cannot be told apart by held-out EM.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import re
import sys
from pathlib import Path

from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.retrievers import RetrieverOptions, open_retriever

SEARCH = re.compile(r"<search>(.*?)</search>", re.S)
BATCH = 256
"""Queries a retriever searches at once."""


def policy_queries(pattern: str) -> list[str]:
    """Every query the model turns of the matching rollout folders wrote, repeats kept (they weigh as often)."""
    queries = []
    for path in sorted(glob.glob(str(Path(pattern) / "step_*.jsonl"))):
        for line in Path(path).read_text().splitlines():
            for part in json.loads(line)["response"]:
                if part["kind"] == "model":
                    queries += [query.strip() for query in SEARCH.findall(part["text"])]
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
    parser.add_argument("--rollouts", required=True, help="a run's rollouts folder; a glob takes several")
    parser.add_argument("--retrievers", default="bm25,minilm,hybrid", help="comma-separated, each built in index/")
    args = parser.parse_args(argv)
    base = Path(args.base)
    queries = policy_queries(args.rollouts)
    if not queries:
        print(f"retriever_agreement: no <search> in {args.rollouts}/step_*.jsonl", file=sys.stderr)
        return 1
    corpus = CorpusStore(base / "data" / "corpus.jsonl")
    names = [name.strip() for name in args.retrievers.split(",") if name.strip()]
    top = {name: top_passages(base / "index", name, corpus, queries) for name in names}
    print(f"{len(queries)} searches ({len(set(queries))} distinct) from {args.rollouts}")
    print("| retriever | no passage | top passage titled as the query |\n|---|---|---|")
    for name in names:
        none = sum(top[name][q] < 0 for q in queries) / len(queries)
        titled = sum(top[name][q] >= 0 and corpus[top[name][q]].title.strip().lower() == q.lower()
                     for q in queries) / len(queries)
        print(f"| {name} | {none:.3f} | {titled:.3f} |")
    print("\n| pair | same top passage |\n|---|---|")
    for first, second in itertools.combinations(names, 2):
        same = sum(top[first][q] == top[second][q] for q in queries) / len(queries)
        print(f"| {first} / {second} | {same:.3f} |")
    corpus.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
