"""The HF engine's decode step, transformers' forward against ``lean_decode.LeanDecoder``, on one model and the
engine's own cache layers, at several batch sizes: milliseconds a step and their ratio, the two alternating.

    python benchmarks/lean_decode.py [--model outputs/demo/model/sft] [--rows 4,12,32,64] [--context 150]
                                     [--steps 40] [--rounds 3] [--threads 1]

Each row starts from a prefill of ``--context`` random tokens (a third of the rows left-padded by 20), then both
paths decode ``--steps`` steps from copies of that cache; the first 5 steps of each are left out. One torch thread
by default: what each rollout rank of the embedded default runs with.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.workers.rollout.hf_cache import cache_kwargs  # noqa: E402
from rlinf_search.workers.rollout.kv_room import with_room  # noqa: E402
from rlinf_search.workers.rollout.lean_decode import lean_decoder  # noqa: E402

WARM_STEPS = 5


def _prefilled(model, rows: int, context: int):
    from transformers import DynamicCache

    ids = torch.randint(3, model.config.vocab_size, (rows, context), generator=torch.Generator().manual_seed(rows))
    mask = torch.ones(rows, context, dtype=torch.long)
    mask[::3, :20] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = with_room(DynamicCache())
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache),
                    use_cache=True, logits_to_keep=1)
    return cache, mask, positions[:, -1] + 1, out.logits[:, -1].argmax(-1)


def _ms_a_step(model, decoder, start, steps: int) -> float:
    cache, mask, position, token = copy.deepcopy(start)
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            began = time.perf_counter()
            if decoder is None:
                logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position[:, None],
                               **cache_kwargs(model, cache), use_cache=True).logits[:, -1]
            else:
                logits = decoder.step(token, position, mask, cache)
            times.append(time.perf_counter() - began)
            token, position = logits.argmax(-1), position + 1
    return 1000 * statistics.mean(times[WARM_STEPS:])


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "outputs" / "demo" / "model" / "sft")
    parser.add_argument("--rows", default="4,12,32,64")
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.steps <= WARM_STEPS:
        parser.error(f"--steps: more than {WARM_STEPS} (the first {WARM_STEPS} warm up)")
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    decoder = lean_decoder(model)
    if decoder is None:
        raise SystemExit(f"lean decode does not apply to {args.model} (see the log line above)")
    print(f"| rows | round | transformers ms a step | lean ms a step | lean / transformers |")
    print("|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        start = _prefilled(model, rows, args.context)
        for round_ in range(1, args.rounds + 1):
            order = ("hf", "lean") if round_ % 2 else ("lean", "hf")
            ms = {side: _ms_a_step(model, None if side == "hf" else decoder, start, args.steps) for side in order}
            print(f"| {rows} | {round_} | {ms['hf']:.2f} | {ms['lean']:.2f} | {ms['lean'] / ms['hf']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
