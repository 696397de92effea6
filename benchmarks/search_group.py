"""What the SearchTool group saves: search requests sent by rollout ranks with clients of their own against the
same searches through one SearchTool group, side by side in one run.

    python benchmarks/search_group.py                     # 4 rollout ranks, 3 steps, 64 prompts x 5 samples

A real retrieval server (BM25 over the bundled HotpotQA corpus) and a real Ray cluster. Each rollout rank is a
process that runs, per step, one search per trajectory of its share of the step's prompts (the GRPO samples of a
prompt search the same query, as a group that has learned the query does; queries are corpus titles). With clients
of their own, a rank opens a client per rollout call, as ``RolloutWorker`` does without the group, so its cache
lives one step; through the group, one cache serves every rank and every step. Steps repeat the same prompts (an
epoch of a small training set, or a prompt that comes back): the group answers the repeats from its cache.
Prints a table: calls, requests and queries sent to the server, and wall time, per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from rlinf_search.retrieval.build_index import main as build_index
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.scheduler import Cluster, ClusterConfig, Worker
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.scheduler.placement import host_placement
from rlinf_search.workers.tool.remote import GroupSearchTool
from rlinf_search.workers.tool.worker import SearchToolWorker

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "hotpotqa_100" / "corpus.jsonl"


class RolloutRank(Worker):
    """Searches its share of a step's trajectories, with its own client or through the group."""

    def __init__(self, config: SearchToolConfig):
        self.config = config

    def step(self, queries: list[str], actors: list | None) -> dict:
        async def run():
            tool = GroupSearchTool(actors) if actors else build_search_tool(self.config)
            try:
                outcomes = await asyncio.gather(*(tool.search(q) for q in queries))
            finally:
                await tool.aclose()
            stats = tool.metrics.snapshot() if not actors else {}
            return {"errors": sum(o.error is not None for o in outcomes), "requests": stats.get("requests", 0),
                    "queries_sent": stats.get("calls", 0) - stats.get("cache_hits", 0) - stats.get("shared", 0)}

        return asyncio.run(run())


def titles(count: int) -> list[str]:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()[:count]]
    return [row["contents"].split("\n", 1)[0].strip('"') for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="rollout ranks (processes)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64, help="prompts a step")
    parser.add_argument("--samples", type=int, default=5, help="trajectories a prompt (GRPO group size)")
    parser.add_argument("--tool-ranks", type=int, default=1, help="SearchTool group ranks")
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/bench_search_group"))
    args = parser.parse_args(argv)
    index = args.work_dir / "index"
    if not (index / "bm25").exists():
        build_index(["--corpus", str(CORPUS), "--out", str(index), "--retriever", "bm25"])
    prompts = titles(args.prompts)
    share = -(-args.prompts // args.ranks)
    server_args = ["--index-dir", str(index), "--corpus", str(CORPUS), "--retriever", "bm25"]
    rows = []
    with RetrievalServerProcess(server_args) as server, \
            Cluster(ClusterConfig(cpu_slots_per_node=args.ranks, num_cpus=2,
                                  component_placement={"rollout": f"0-{args.ranks - 1}"})) as cluster:
        config = SearchToolConfig(server_addr=server.address, topk=3, num_workers=args.tool_ranks)
        ranks = RolloutRank.create_group(config).launch(cluster, cluster.placement["rollout"], name="rollout")
        tools = SearchToolWorker.create_group(config).launch(cluster, host_placement("SearchToolGroup", args.tool_ranks),
                                                             name="SearchToolGroup")
        for mode in ("own clients", "SearchTool group"):
            actors = list(tools.actors) if mode == "SearchTool group" else None
            started, requests, sent, errors = time.perf_counter(), 0, 0, 0
            for _ in range(args.steps):
                calls = [ranks.call_on(rank, RolloutRank.step,
                                       [q for q in prompts[rank * share:(rank + 1) * share] for _ in range(args.samples)],
                                       actors) for rank in range(args.ranks)]
                for result in (call.wait(300) for call in calls):
                    requests += result["requests"]
                    sent += result["queries_sent"]
                    errors += result["errors"]
            if actors:
                stats = tools.call(SearchToolWorker.stats).wait(60)
                requests = sum(s["requests"] for s in stats)
                sent = sum(s["calls"] - s["cache_hits"] - s["shared"] for s in stats)
            rows.append((mode, args.steps * args.prompts * args.samples, requests, sent, errors,
                         time.perf_counter() - started))
    print(f"{args.ranks} rollout ranks, {args.steps} steps of {args.prompts} prompts x {args.samples} samples, "
          f"{args.tool_ranks} tool rank(s), BM25 top 3 over {CORPUS.name}")
    print("| mode | searches | requests sent | queries sent | errors | wall s |")
    print("|---|---|---|---|---|---|")
    for mode, calls, requests, sent, errors, seconds in rows:
        print(f"| {mode} | {calls} | {requests} | {sent} | {errors} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
