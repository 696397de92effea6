"""Starting the SearchTool group beside a rollout group and handing its ranks to the rollout ranks."""

from __future__ import annotations

import time

from rlinf_search.scheduler import Cluster, WorkerError, WorkerGroup
from rlinf_search.scheduler.placement import host_placement
from rlinf_search.tools.search import SearchToolConfig
from rlinf_search.workers.rollout.worker import RolloutWorker
from rlinf_search.workers.tool.worker import SearchToolWorker


def launch_search_group(search: SearchToolConfig, cluster: Cluster, rollout: WorkerGroup, *,
                        name: str = "SearchToolGroup", restarts: int = 0) -> WorkerGroup | None:
    """With ``tools.search.num_workers`` >= 1: the SearchTool group, its ranks handed to every rollout rank
    (their agent loops search through it from then on). None with 0: each rollout rank keeps its own client.
    ``restarts``: a rank whose process dies is started again by Ray, up to this many times per rank, behind the
    handle the rollout ranks hold (a tool rank keeps only a cache): the searches in flight at its death fail as
    infrastructure errors, so their groups roll out again (``agentloop.infra_reruns``) once it answers."""
    if search.num_workers < 1:
        return None
    group = SearchToolWorker.create_group(search).launch(cluster, host_placement(name, search.num_workers),
                                                         name=name, restarts_by_ray=restarts)
    rollout.call(RolloutWorker.use_search_group, list(group.actors)).wait()
    return group


class SearchGroupMeter:
    """The SearchTool group's step metrics (``search_group_metrics``) and ``runtime/tool_restarts``: the ranks
    Ray started again so far, seen as a rank answering from another process than at the last step."""

    def __init__(self, group: WorkerGroup):
        self.group = group
        self.restarts = 0
        self._processes: list[int] | None = None

    def step(self, *, timeout_s: float = 60.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                stats = self.group.call(SearchToolWorker.stats).wait(max(1.0, deadline - time.monotonic()))
                break
            except WorkerError as error:
                # A rank Ray is starting again answers once it is up; one that stays gone is reported.
                if not (error.process_lost and self.group.restarts_by_ray) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        processes = [int(s["process_id"]) for s in stats]
        if self._processes is not None:
            self.restarts += sum(now != before for now, before in zip(processes, self._processes))
        self._processes = processes
        return {**search_group_metrics(stats), "runtime/tool_restarts": float(self.restarts)}


def search_group_metrics(stats: list[dict]) -> dict[str, float]:
    """The group's counters (each rank's ``SearchToolWorker.stats``) since the run started, or since Ray started a
    rank again (its counters begin anew), summed over its ranks, for the step's metrics line:
    ``search/calls``, ``search/requests`` (sent to the backend, retries counted), ``search/cache_hit_rate``,
    ``search/shared_rate`` (calls that joined an identical query in flight) and ``search/latency_ms_p99``
    (the slowest rank's). With several retrieval replicas, each one's ``search/replica/<host:port>/requests``,
    ``failures`` and ``ejections`` summed over the ranks, and ``admitted``: the share of ranks sending to it."""
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
