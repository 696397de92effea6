"""Starting the SearchTool group beside a rollout group and handing its ranks to the rollout ranks."""

from __future__ import annotations

from rlinf_search.scheduler import Cluster, WorkerGroup
from rlinf_search.scheduler.placement import host_placement
from rlinf_search.tools.search import SearchToolConfig
from rlinf_search.workers.rollout.worker import RolloutWorker
from rlinf_search.workers.tool.worker import SearchToolWorker


def launch_search_group(search: SearchToolConfig, cluster: Cluster, rollout: WorkerGroup, *,
                        name: str = "SearchToolGroup") -> WorkerGroup | None:
    """With ``tools.search.num_workers`` >= 1: the SearchTool group, its ranks handed to every rollout rank
    (their agent loops search through it from then on). None with 0: each rollout rank keeps its own client."""
    if search.num_workers < 1:
        return None
    group = SearchToolWorker.create_group(search).launch(cluster, host_placement(name, search.num_workers),
                                                         name=name)
    rollout.call(RolloutWorker.use_search_group, list(group.actors)).wait()
    return group


def search_group_metrics(group: WorkerGroup, *, timeout_s: float = 60.0) -> dict[str, float]:
    """The group's counters since the run started, summed over its ranks, for the step's metrics line:
    ``search/calls``, ``search/requests`` (sent to the backend, retries counted), ``search/cache_hit_rate``,
    ``search/shared_rate`` (calls that joined an identical query in flight) and ``search/latency_ms_p99``
    (the slowest rank's). With several retrieval replicas, each one's ``search/replica/<host:port>/requests``,
    ``failures`` and ``ejections`` summed over the ranks, and ``admitted``: the share of ranks sending to it."""
    stats = group.call(SearchToolWorker.stats).wait(timeout_s)
    calls = sum(s["calls"] for s in stats)
    metrics = {"search/calls": float(calls), "search/requests": float(sum(s["requests"] for s in stats)),
               "search/cache_hit_rate": sum(s["cache_hits"] for s in stats) / calls if calls else 0.0,
               "search/shared_rate": sum(s["shared"] for s in stats) / calls if calls else 0.0,
               "search/latency_ms_p99": max(s["latency_ms_p99"] for s in stats)}
    for key in sorted({key for s in stats for key in s if key.startswith("replica/")}):
        if key.endswith(("/requests", "/failures", "/ejections", "/admitted")):
            values = [float(s.get(key, 0)) for s in stats]
            metrics[f"search/{key}"] = sum(values) / len(values) if key.endswith("/admitted") else sum(values)
    return metrics
