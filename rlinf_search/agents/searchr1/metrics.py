"""Summaries of a batch of trajectories, for logs and benchmarks."""

from __future__ import annotations

from collections import Counter

from rlinf_search.agents.searchr1.quality import quality_metrics
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.tools.search.metrics import percentile


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means over the batch; ``drift_rate`` is the share of trajectories whose sampled ids differ from
    what re-tokenizing their text would give (the reference implementations' behaviour)."""
    n = len(trajectories)
    if n == 0:
        return {}
    searches = sum(t.num_searches for t in trajectories)
    model_tokens = sum(sum(t.response_mask) for t in trajectories)
    times = sorted(t.total_time_s for t in trajectories)
    metrics = {
        "rollout/trajectories": float(n),
        "rollout/searches_per_trajectory": searches / n,
        "rollout/search_error_rate": sum(t.search_errors for t in trajectories) / max(searches, 1),
        "rollout/turns_per_trajectory": sum(t.num_turns for t in trajectories) / n,
        "rollout/response_length": sum(len(t.response_ids) for t in trajectories) / n,
        "rollout/model_tokens": model_tokens / n,
        "rollout/drift_rate": sum(t.drifted for t in trajectories) / n,
        # agent.protocol toolcall: calls that could not run, and conversations a message-level re-render would change.
        "rollout/tool_call_errors": sum(t.tool_call_errors for t in trajectories) / n,
        "rollout/template_drift_rate": sum(t.template_drift for t in trajectories) / n,
        "rollout/generation_time_s": sum(t.generation_time_s for t in trajectories) / n,
        "rollout/tool_time_s": sum(t.tool_time_s for t in trajectories) / n,
        # The tail that holds a step back: how much longer the slowest trajectories take than the typical one.
        "rollout/trajectory_s_p50": percentile(times, 50),
        "rollout/trajectory_s_p99": percentile(times, 99),
    }
    for reason, count in Counter(t.finish_reason for t in trajectories).items():
        metrics[f"rollout/finish_{reason}"] = count / n
    # Per tool: calls a trajectory made, and its failed calls by kind (``search/arguments``, ``access/not_found``).
    calls, errors = Counter(), Counter()
    for traj in trajectories:
        calls.update(traj.tool_calls)
        errors.update(traj.tool_errors)
    metrics.update({f"rollout/tool_calls/{name}": count / n for name, count in sorted(calls.items())})
    metrics.update({f"rollout/tool_errors/{name}": count / n for name, count in sorted(errors.items())})
    metrics.update(quality_metrics(trajectories))  # repetition, broken format, searches that found the answer
    return metrics

