"""``actor.model.compile_layers``: the compiled decoder layers train as the eager ones do (packed rows of changing
lengths, gradient checkpointing around the compiled forward), on a real tiny Qwen2 through inductor."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters
from transformers import AutoTokenizer

from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from tests.test_policy_trainer import _prepared_batch


def test_compiled_layers_score_and_update_as_eager_ones(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = dict(model_path=str(tiny_model_dir), optim=OptimConfig(lr=1e-3), gradient_checkpointing=True,
                max_tokens_per_mbs=40, shuffle_rollout=False)  # several packed passes of different token counts
    eager = PolicyTrainer(ActorConfig(**base))
    compiled = PolicyTrainer(ActorConfig(**base, compile_layers=True))
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable")
               for layer in compiled.model.model.layers), "every decoder layer's forward compiled"
    batch = _prepared_batch(eager, tokenizer)
    assert compiled.packed and eager.packed
    torch.testing.assert_close(compiled.compute_logprobs(batch)[1], eager.compute_logprobs(batch)[1],
                               rtol=1e-5, atol=1e-5)
    graphs = []
    for _ in range(3):
        ours, theirs = compiled.train_on_batch(batch), eager.train_on_batch(batch)
        assert abs(ours["actor/grad_norm"] - theirs["actor/grad_norm"]) < 1e-4 * max(1.0, theirs["actor/grad_norm"])
        graphs.append(counters["stats"]["unique_graphs"])
    for (name, mine), (_, other) in zip(compiled.model.named_parameters(), eager.model.named_parameters()):
        torch.testing.assert_close(mine, other, rtol=1e-4, atol=1e-5, msg=name)
    # Graphs were built and run (not a silent eager fallback), and once every pass shape was seen (the first update)
    # no update compiled again.
    assert graphs[0] >= 1 and graphs[0] == graphs[-1], graphs
