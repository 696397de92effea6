"""Real model shapes with random weights: Qwen2.5's published configurations, made locally (no hub here).

    python -m toolkits.model_shapes --shape qwen2.5-0.5b --out /tmp/qwen0.5b-random [--layers 2]

The memory and speed of training depend on the shapes, not the weights, so benchmarks and tests run the
GPU recipes' real shapes (151,936-token vocabulary, grouped-query attention, tied embeddings) on random
weights, loaded by the same code that loads ``Qwen/Qwen2.5-3B-Instruct``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The architecture fields of Qwen2.5's config.json files (Qwen/Qwen2.5-{0.5B,1.5B,3B,7B}-Instruct).
QWEN25_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, tie_word_embeddings=False),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              hidden_act="silu")


def qwen_config(shape: str, *, layers: int | None = None):
    """The ``Qwen2Config`` of ``shape`` (a key of ``QWEN25_SHAPES``), optionally with fewer layers."""
    from transformers import Qwen2Config

    if shape not in QWEN25_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(QWEN25_SHAPES)}")
    settings = {**COMMON, **QWEN25_SHAPES[shape]}
    if layers is not None:
        settings["num_hidden_layers"] = layers
    return Qwen2Config(**settings)


def random_model(shape: str, *, layers: int | None = None, seed: int = 0, dtype=None):
    """A ``Qwen2ForCausalLM`` of ``shape`` with random weights (fp32 unless ``dtype``)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen_config(shape, layers=layers))
    return model if dtype is None else model.to(dtype)


def random_rollout_batch(*, rows: int, row_tokens: int, prompt_tokens: int, seed: int = 0):
    """A ``RolloutBatch`` of random token ids ready for ``train_on_batch``: rows of ``row_tokens / 2 ..
    row_tokens`` tokens (a ``prompt_tokens`` prompt, then a response with two observation blocks),
    uneven as rollouts are, so padding costs what it costs in a real run; random advantages."""
    import random

    import torch

    from rlinf_search.data.batch import collate_trajectories
    from rlinf_search.data.io_struct import Trajectory

    rng = random.Random(seed)
    trajs = []
    for i in range(rows):
        length = rng.randint(row_tokens // 2, row_tokens) - prompt_tokens
        mask = [1] * length
        for start in (length // 4, length // 2):  # observations: trained on by nobody
            mask[start:start + length // 8] = [0] * (length // 8)
        prompt = [rng.randrange(1000, 150000) for _ in range(prompt_tokens)]
        trajs.append(Trajectory(uid=f"q{i // 2}", prompt_ids=prompt,
                                response_ids=[rng.randrange(1000, 150000) for _ in range(length)],
                                response_mask=mask, rollout_logprobs=[0.0] * length))
    batch = collate_trajectories(trajs, [float(i % 2) for i in range(rows)], pad_id=0)
    batch.advantages = torch.where(batch.response_mask.bool(), torch.randn(batch.response_mask.shape), 0.0)
    batch.old_logprobs = torch.zeros(batch.response_mask.shape)
    return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkits.model_shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, choices=sorted(QWEN25_SHAPES))
    parser.add_argument("--out", required=True, help="folder for config.json and model.safetensors")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = random_model(args.shape, layers=args.layers, seed=args.seed)
    model.save_pretrained(Path(args.out))
    print(f"wrote {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
