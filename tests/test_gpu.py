"""The GPU recipe's training path on a CUDA device: FSDP2 with bf16 compute, and the packed rows through
the GPU attention kernels. Skipped where there is no CUDA (this project's CI machines); run them with
``bash scripts/test.sh tests/test_gpu.py`` on a GPU machine. docs/recipes.md says which ran."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoTokenizer

from rlinf_search.workers.actor.backends import build_trainer
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.config import OptimConfig
from rlinf_search.workers.actor.token_scoring import TokenScorer, layout_batch, to_device
from tests.test_fsdp import _config, _uneven_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_fsdp2_bf16_update_on_cuda(tiny_model_dir):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer = build_trainer(_config(tiny_model_dir, training_backend="fsdp", dtype="bfloat16",
                                    gradient_checkpointing=True,
                                    optim=OptimConfig(lr=1e-6, weight_decay=0.0, total_steps=10)))
    assert trainer.device.type == "cuda"
    before = {n: p.detach().full_tensor().clone() for n, p in trainer.scorer.named_parameters()}
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
    metrics = trainer.train_on_batch(batch)
    assert all(v == v for v in metrics.values()), metrics  # no NaN
    moved = changed = 0
    for name, p in trainer.scorer.named_parameters():
        assert p.dtype == torch.float32, name
        full = p.detach().full_tensor()
        moved += int((full != before[name]).sum())
        changed += full.numel()
    assert moved / changed > 0.9, "bf16 compute over fp32 master weights moves the weights at lr 1e-6"


@pytest.mark.parametrize("kernel", ["sdpa_varlen", "flex_attention", "flash_attention_2"])
def test_packed_rows_match_padded_rows_on_cuda(tiny_model_dir, kernel):
    """Packed rows through each packed-row kernel against padded rows through sdpa, in bf16: log-probs and
    gradients. ``sdpa_varlen`` must run torch's varlen kernel here, not its per-row CPU loop."""
    if kernel == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    from rlinf_search.workers.actor import packed_attention
    from rlinf_search.workers.actor.hf_model import load_causal_lm

    if kernel == "sdpa_varlen":
        assert packed_attention._varlen_call() is not None, "torch has no usable varlen attention"
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    results = {}
    for name, packed in ((kernel, True), ("sdpa", False)):
        model = load_causal_lm(str(tiny_model_dir), dtype=torch.bfloat16, attn_implementation=name).cuda()
        layout = to_device(layout_batch(batch, packed=packed), torch.device("cuda"))
        flat = TokenScorer(model)(layout).logprobs
        flat.float().sum().backward()
        results[packed] = (layout.to_rows(flat).detach().float().cpu(),
                           {n: p.grad.float().cpu() for n, p in model.named_parameters()})
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-2, rtol=0)
    for name, grad in results[True][1].items():
        scale = float(results[False][1][name].abs().max()) + 1e-12
        torch.testing.assert_close(grad / scale, results[False][1][name] / scale, atol=3e-2, rtol=0, msg=name)


def test_peak_memory_within_ten_percent_of_the_plan(tmp_path):
    """One update of Qwen2.5-0.5B's full shape (FSDP2 at one rank, every saver on): the allocator's peak
    against ``toolkits.memory_plan``, the rules docs/recipes.md's 3B plan is computed from."""
    from rlinf_search.workers.actor.config import ActorConfig, PolicyLossConfig
    from rlinf_search.workers.actor.memory_plan import plan_actor_memory
    from toolkits.model_shapes import qwen_config, random_model, random_rollout_batch

    random_model("qwen2.5-0.5b", dtype=torch.bfloat16).save_pretrained(tmp_path)
    trainer = build_trainer(ActorConfig(model_path=str(tmp_path), training_backend="fsdp", dtype="bfloat16",
                                        gradient_checkpointing=True, pack_sequences=True, logprob_chunk_tokens=1024,
                                        max_tokens_per_mbs=8192, n_minibatches=1, shuffle_rollout=False,
                                        optim=OptimConfig(lr=1e-6, total_steps=10), loss=PolicyLossConfig(kl_beta=0.0)))
    batch = random_rollout_batch(rows=8, row_tokens=4096, prompt_tokens=512)
    trainer.train_on_batch(batch)  # optimizer state allocated
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    trainer.train_on_batch(batch)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    plan = plan_actor_memory(qwen_config("qwen2.5-0.5b"), ranks=1, mbs_tokens=8192).total
    assert abs(peak - plan) <= 0.1 * plan, f"peak {peak / 2**30:.2f} GiB, plan {plan / 2**30:.2f} GiB"


def test_cuda_ipc_sync_loads_an_hf_engine_bit_exact_without_a_host_copy(tiny_model_dir):
    """An actor process and an HF engine process on one GPU: buckets as IPC handles, loaded device to device."""
    from benchmarks.ipc_sync import run

    out = run(str(tiny_model_dir), "bfloat16", bucket_bytes=64 * 1024)  # the tiny model in many buckets
    sender, receiver = out["sender"], out["receiver"]
    assert receiver["version"] == 1 and sender["sums"] == receiver["sums"]
    assert receiver["rss_rise"] < 64 * 2**20 and sender["rss_rise"] < 64 * 2**20
