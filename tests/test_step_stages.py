"""The step's stages (``runners/stages``): how a whole rollout becomes the batch of groups the passes take,
and how a step's batches, in whatever order their groups finished, are put back in prompt order. The stages
themselves run through real worker groups in tests/test_train_runner.py (sync, overlap), test_critic.py,
test_distill_run.py and test_stream_step.py."""

from __future__ import annotations

import pytest
import torch

from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import FinishedGroup, RewardScore, Trajectory
from rlinf_search.runners.stages import PreparedBatch
from rlinf_search.runners.stages.rollout_source import DrainedRollout, as_groups
from rlinf_search.runners.step_metrics import StepTimer
from rlinf_search.runners.train_runner import _in_prompt_order


def _trajectory(prompt: int, sample: int) -> Trajectory:
    return Trajectory(uid=f"q{prompt}", prompt_ids=[1], response_ids=[10 + sample, 2], response_mask=[1, 1],
                      rollout_logprobs=[-0.5, -0.5])


def test_a_drained_rollout_is_one_batch_of_every_group_with_its_rank():
    # 5 prompts x 2 samples over 2 rollout ranks: the contiguous shares are 3 and 2 prompts.
    trajectories = [_trajectory(p, s) for p in range(5) for s in range(2)]
    groups = as_groups(trajectories, samples=2, ranks=2)
    assert [g.index for g in groups] == [0, 1, 2, 3, 4]
    assert [g.rank for g in groups] == [0, 0, 0, 1, 1]
    assert all({t.uid for t in g.trajectories} == {f"q{g.index}"} and len(g.trajectories) == 2 for g in groups)

    drained = DrainedRollout([object()] * 5, trajectories, StepTimer(), ranks=2)
    batches = list(drained.batches())
    assert len(batches) == 1 and drained.last_batch and drained.minibatches == []
    assert [t for g in batches[0] for t in g.trajectories] == trajectories, "the rows keep the rollout's order"


def test_batches_that_finished_out_of_order_come_back_in_prompt_order():
    def prepared(indices: list[int]) -> PreparedBatch:
        groups = [FinishedGroup(index=i, rank=0, trajectories=[_trajectory(i, s) for s in range(2)]) for i in indices]
        rows = [t for g in groups for t in g.trajectories]
        scores = [RewardScore(reward=float(i), em=0.0) for i in indices for _ in range(2)]
        batch = collate_trajectories(rows, [s.reward for s in scores], pad_id=0)
        # each row's advantage its prompt's index plus a tenth of its sample, on its trained tokens
        batch.advantages = torch.tensor([[i + s / 10] * 2 for i in indices for s in range(2)])
        return PreparedBatch(groups=groups, batch=batch, scores=scores)

    records = [f"record {p}" for p in range(5)]
    kept, trajectories, scores, advantages = _in_prompt_order([prepared([3, 0]), prepared([2]), prepared([4, 1])],
                                                              records)
    assert advantages == pytest.approx([p + s / 10 for p in range(5) for s in range(2)]), "each its own row's"
    assert kept == records
    assert [t.uid for t in trajectories] == [f"q{p}" for p in range(5) for _ in range(2)]
    assert [t.response_ids[0] for t in trajectories] == [10, 11] * 5, "samples stay in sample order"
    assert [s.reward for s in scores] == [float(p) for p in range(5) for _ in range(2)], "each score its own row"
    # A group dropped for an infrastructure failure is in no batch: its prompt is left out, the rest keep their order.
    kept, trajectories, scores, _ = _in_prompt_order([prepared([3, 0]), prepared([4, 1])], records)
    assert kept == ["record 0", "record 1", "record 3", "record 4"]
    assert [t.uid for t in trajectories] == [f"q{p}" for p in (0, 1, 3, 4) for _ in range(2)]
    assert [s.reward for s in scores] == [float(p) for p in (0, 1, 3, 4) for _ in range(2)]


def test_staleness_counts_each_model_token_by_the_version_of_its_turn():
    from rlinf_search.data.io_struct import ResponseSpan
    from rlinf_search.runners.step_metrics import staleness_metrics

    # A partial rollout: 3 tokens of version 4, an observation, 1 token of version 5; a whole turn of version 5.
    partial = Trajectory(uid="a", prompt_ids=[1], response_ids=[5] * 6, response_mask=[1, 1, 1, 0, 0, 1],
                         rollout_logprobs=[0.0] * 6,
                         spans=[ResponseSpan("model", 0, 3, weight_version=4), ResponseSpan("information", 3, 5),
                                ResponseSpan("model", 5, 6, weight_version=5)])
    fresh = Trajectory(uid="b", prompt_ids=[1], response_ids=[5] * 4, response_mask=[1] * 4, rollout_logprobs=[0.0] * 4,
                       spans=[ResponseSpan("model", 0, 4, weight_version=5)])
    assert partial.turn_versions == [4, 5] and partial.oldest_version == 4
    assert FinishedGroup(index=0, rank=0, trajectories=[partial, fresh]).oldest_version == 4
    metrics = staleness_metrics([partial, fresh], trained_version=5)
    assert metrics == {"staleness/lag_0": 5 / 8, "staleness/lag_1": 3 / 8, "staleness/mean_lag": 3 / 8,
                       "staleness/max_lag": 1.0}
    assert staleness_metrics([_trajectory(0, 0)], trained_version=3) == {}, "an engine without versions: none"
