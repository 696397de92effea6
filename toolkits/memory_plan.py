"""The actor's memory plan per GPU for a Qwen2.5 shape, printed (the rules live in
``rlinf_search/workers/actor/memory_plan.py``).

    python -m toolkits.memory_plan --shape qwen2.5-3b --ranks 8 --mbs-tokens 8192 --reference
"""

from __future__ import annotations

import argparse
import sys

from rlinf_search.workers.actor.memory_plan import GIB, plan_actor_memory


def main(argv: list[str] | None = None) -> int:
    from toolkits.model_shapes import QWEN25_SHAPES, qwen_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-3b", choices=sorted(QWEN25_SHAPES))
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mbs-tokens", type=int, default=8192)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--reference", action="store_true", help="a bf16 reference model too (KL on)")
    args = parser.parse_args(argv)
    plan = plan_actor_memory(qwen_config(args.shape, layers=args.layers), ranks=args.ranks,
                             mbs_tokens=args.mbs_tokens, chunk_tokens=args.chunk_tokens, reference=args.reference)
    for name in ("state", "reference", "checkpoints", "lm_head_peak", "total"):
        print(f"{name:<14}{getattr(plan, name) / GIB:>8.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
