"""Log-prob passes of the actor on this CPU: packed against padded rows, every response token against model tokens.

    python benchmarks/actor_layout.py [--rows 32] [--repeats 5] [--hidden 192 --layers 3 --vocab 2048]

A random Qwen2 model of the demo's shape scores one micro-batch of Search-R1
shaped rows: a prompt, then model turns and observations (search results), of uneven lengths. Each layout runs
``--repeats`` times, forward only (the old and reference log-prob passes) and forward + backward (training),
through ``TokenScorer``, the module the actor trains. The table gives the median seconds and each layout's time
as a ratio of the first row's, measured side by side in this one run.

- packed: the rows end to end in one sequence; with sdpa, transformers gives it a dense block-diagonal mask over
  the whole sequence, so attention costs its length squared; with ``sdpa_varlen`` (this package's kernel, what
  ``use_remove_padding`` loads) each row attends to itself, at its own length squared;
- padded: one row per sequence, padded to the longest;
- "model tokens": only positions that predict a model token go through the LM head (what the actor now does);
  "all tokens": every response token, observations included (what it did before).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.workers.actor import packed_attention
from rlinf_search.workers.actor.token_scoring import TokenScorer, layout_batch


def search_rows(rows: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Rows shaped like the demo's trajectories: a 60-75 token prompt, then either an answer at once (12 tokens)
    or one or two searches, each a short query turn and a 40-token observation, and an answer turn."""
    rng = random.Random(seed)
    out = []
    for index in range(rows):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(60, 75))]
        response, mask = [], []
        for _ in range(rng.choice([0, 1, 1, 2])):
            for length, model in ((6, 1), (40, 0)):
                response += [rng.randrange(10, vocab) for _ in range(length)]
                mask += [model] * length
        response += [rng.randrange(10, vocab) for _ in range(12)]
        mask += [1] * 12
        out.append(Trajectory(uid=str(index), prompt_ids=prompt, response_ids=response, response_mask=mask,
                              rollout_logprobs=[0.0] * len(response)))
    return out


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=2048)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=args.hidden * 8 // 3,
                         tie_word_embeddings=True)
    packed_attention.register()
    model = Qwen2ForCausalLM(config)
    scorer = TokenScorer(model)
    batch = collate_trajectories(search_rows(args.rows, args.vocab), [0.0] * args.rows, pad_id=0)
    model_tokens = int(batch.response_mask.sum())
    response_tokens = int(batch.attention_mask[:, batch.prompt_length:].sum())
    print(f"{args.rows} rows, {int(batch.attention_mask.sum())} tokens ({response_tokens} response, {model_tokens} "
          f"model), hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
          f"torch kernels {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats}")
    varlen = packed_attention.PACKED_ATTENTION
    cases = [("packed, all tokens, sdpa", "sdpa", True, False), ("padded, all tokens, sdpa", "sdpa", False, False),
             ("padded, model tokens, sdpa", "sdpa", False, True), ("packed, model tokens, sdpa", "sdpa", True, True),
             (f"packed, model tokens, {varlen}", varlen, True, True)]
    print(f"{'layout':36s} {'forward s':>10s} {'ratio':>7s} {'fwd+bwd s':>10s} {'ratio':>7s}")
    base = None
    for name, kernel, packed, model_only in cases:
        model.set_attn_implementation(kernel)
        layout = layout_batch(batch, packed=packed, model_tokens_only=model_only)

        def forward():
            with torch.no_grad():
                scorer(layout)

        def train():
            model.zero_grad(set_to_none=True)
            scorer(layout).logprobs.sum().backward()

        times = (timed(forward, args.repeats), timed(train, args.repeats))
        base = base or times
        print(f"{name:36s} {times[0]:10.3f} {times[0] / base[0]:6.2f}x {times[1]:10.3f} {times[1] / base[1]:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
