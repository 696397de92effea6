"""How the runners deal work to a group's ranks, on a real Ray cluster: reward ranks each score their own share."""

from __future__ import annotations

import os

import pytest

from rlinf_search.data.io_struct import Trajectory
from rlinf_search.runners.group_calls import score_shards
from rlinf_search.scheduler import Cluster, ClusterConfig
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.reward.worker import RewardWorker


def rank_reward(solution_str, golden_answers, **kwargs) -> float:
    """``reward.score: tests.test_group_calls:rank_reward``: the rank of the process that scored it, plus EM/10."""
    from rlinf_search.rewards import compute_score

    return float(os.environ["RANK"]) + compute_score("em", solution_str, golden_answers) / 10


def _traj(i: int, answer: str) -> Trajectory:
    text = f"<answer> {answer} </answer>"
    return Trajectory(uid=f"t-{i}", prompt_ids=[1], response_ids=[2], response_mask=[1], rollout_logprobs=[0.0],
                      response_text=text, graded_text=text, golden_answers=["Paris"])


@pytest.fixture(scope="module")
def reward():
    with Cluster(ClusterConfig(cpu_slots_per_node=3, num_cpus=2, component_placement={"reward": "0-2"})) as cluster:
        yield RewardWorker.create_group(RewardConfig(score="tests.test_group_calls:rank_reward")).launch(
            cluster, cluster.placement["reward"], name="RewardGroup")


@pytest.mark.parametrize("count", [7, 2])
def test_reward_ranks_each_score_their_own_share(reward, count):
    scores = score_shards(reward, [_traj(i, "Paris" if i % 2 else "Rome") for i in range(count)])
    ranks = [int(s.reward) for s in scores]
    # Contiguous shares in order (7 over 3 ranks: 3, 2, 2; 2 over 3: one each, the last rank idle).
    assert ranks == ([0, 0, 0, 1, 1, 2, 2] if count == 7 else [0, 1])
    assert [round(s.reward % 1, 6) for s in scores] == [0.1 * (i % 2) for i in range(count)]
    assert [s.em for s in scores] == [float(i % 2) for i in range(count)]
