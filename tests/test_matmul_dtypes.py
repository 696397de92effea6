"""``benchmarks/matmul_dtypes.py``, the tool that found the Megatron recipe's fp32 backward on a GPU
(docs/history/benchmarks.md section 7), on CPU: it sees the autocast bf16 matmuls of a real update in both passes,
the recompute of a checkpointed layer in the backward, and an fp32 update as fp32."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from tests.test_fsdp import _config, _uneven_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from matmul_dtypes import observed_update, pass_flops  # noqa: E402


def _shares(flops: dict, phase: str) -> dict[str, float]:
    total = pass_flops(flops, phase)
    return {dtype: v / total for (p, dtype), v in flops.items() if p == phase}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_update_runs_its_matmuls_in_the_compute_dtype_in_both_passes(tiny_model_dir, dtype):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer = PolicyTrainer(_config(tiny_model_dir, training_backend="ddp", dtype=dtype, n_minibatches=1))
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
    flops = observed_update(trainer, batch)
    assert _shares(flops, "forward") == {dtype: 1.0}
    assert _shares(flops, "backward") == {dtype: 1.0}
    # Backward: each weight matmul twice (input and weight gradients), attention's backward kernel too.
    assert 1.8 * pass_flops(flops, "forward") < pass_flops(flops, "backward") < 2.2 * pass_flops(flops, "forward")


def test_a_checkpointed_layer_is_recomputed_inside_the_backward(tiny_model_dir):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    results = {}
    for checkpointing in (False, True):
        trainer = PolicyTrainer(_config(tiny_model_dir, training_backend="ddp", dtype="bfloat16", n_minibatches=1,
                                        gradient_checkpointing=checkpointing))
        batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
        flops = observed_update(trainer, batch)
        results[checkpointing] = pass_flops(flops, "backward")
    assert results[True] > results[False] * 1.2  # the decoder layers' forward again, in the backward pass
