"""The MFU numerator (``toolkits/update_flops.py``) against torch's own FLOP counter on a real actor update."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig

from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from toolkits.update_flops import batch_flops


def _batch(rows: int, prompt: int, response: int):
    """Rows of one length (no padding, so eager attention computes exactly the rows' squares), each response with
    an observation block the head must skip."""
    trajs = []
    for i in range(rows):
        mask = [1] * response
        mask[response // 3: response // 2] = [0] * (response // 2 - response // 3)
        trajs.append(Trajectory(uid=f"q{i // 2}", prompt_ids=[5 + i + j for j in range(prompt)],
                                response_ids=[40 + (7 * i + j) % 100 for j in range(response)], response_mask=mask,
                                rollout_logprobs=[0.0] * response))
    batch = collate_trajectories(trajs, [float(i % 2) for i in range(rows)], pad_id=0)
    batch.advantages = torch.where(batch.response_mask.bool(), torch.randn(batch.response_mask.shape), 0.0)
    batch.old_logprobs = torch.zeros(batch.response_mask.shape)
    return batch


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_count_matches_torch_flop_counter_on_an_update(tiny_model_dir, checkpointing):
    # Eager attention: torch's counter sees its matmuls (it has no formula for the CPU sdpa kernel).
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), attn_implementation="eager",
                                        pack_sequences=False, gradient_checkpointing=checkpointing,
                                        max_tokens_per_mbs=200, optim=OptimConfig(lr=1e-4)))
    batch = _batch(rows=4, prompt=24, response=60)
    with FlopCounterMode(display=False) as counter:
        trainer.train_on_batch(batch)  # two micro-batches of 2 rows under the 200-token budget
    counted = counter.get_total_flops()
    ours = batch_flops(AutoConfig.from_pretrained(tiny_model_dir), batch,
                       recompute="layers" if checkpointing else "none")
    every_position = batch_flops(AutoConfig.from_pretrained(tiny_model_dir), batch,
                                 head_positions=batch.attention_mask[:, batch.prompt_length:].numel())
    assert every_position.unscored_head == pytest.approx(every_position.head * 10 / 50)  # 10 of 60 observed
    assert ours.executed == pytest.approx(counted, rel=0.01), (ours, counted)
    assert (ours.recompute > ours.head / 3) == checkpointing
