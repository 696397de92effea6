"""Where a student's reverse KL to its teacher lies: the exact KL, over the whole vocabulary, at every model
token of trajectories the student samples (temperature 1) on fixed prompts, split by what the token is part
of: a search query, an answer, or the tags and choices around them.

    python examples/searchr1/distill_probe.py --student outputs/distill/student \\
        --teacher outputs/demo/rl/checkpoints/global_step_30/hf_model \\
        --data outputs/demo/data/val.prepared.jsonl --server-addr 127.0.0.1:8000

The training metric ``distill/reverse_kl`` is a one-sample estimate on each step's own prompts; this is
the exact value on the same prompts and seeds for any checkpoint. Both models must share a tokenizer
(the demo's do). The agent-loop limits default to the ``tiny-cpu`` recipe's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.io_struct import SamplingParams, Trajectory
from rlinf_search.data.prepare import load_records
from rlinf_search.runners.eval_runner import rollouts
from rlinf_search.tools.search import SearchToolConfig

ROLES = ("query", "answer", "other")


@dataclass
class ProbeResult:
    """Exact reverse KL per model token, overall and per role."""

    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("all", *ROLES), 0))
    """Model tokens counted, overall and per role."""
    kl_sum: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("all", *ROLES), 0.0))
    """Sum of the per-token KL, overall and per role."""

    def add(self, role: str, kl: float) -> None:
        for key in ("all", role):
            self.tokens[key] += 1
            self.kl_sum[key] += kl

    def mean(self, role: str = "all") -> float:
        return self.kl_sum[role] / max(self.tokens[role], 1)


def token_roles(decode, ids: list[int]) -> list[str]:
    """The role of each token of one model turn: inside ``<search> ... </search>`` (query), inside
    ``<answer> ... </answer>`` (answer), or neither (the tags and what chooses between them)."""
    roles = []
    for end in range(len(ids)):
        before, piece = decode(ids[:end]), decode(ids[end:end + 1]).lstrip()
        role = "other"
        for tag, name in (("<search>", "query"), ("<answer>", "answer")):
            opened = before.rfind(tag)
            # Inside: the tag is open, no closing tag has begun, and this token does not begin one.
            if opened >= 0 and "<" not in before[opened + len(tag):] and not piece.startswith("<"):
                role = name
        roles.append(role)
    return roles


@torch.no_grad()
def exact_reverse_kl(student, teacher, trajectory: Trajectory) -> list[float]:
    """``KL(p_student || p_teacher)`` at every response position (0 where the mask is 0)."""
    ids = torch.tensor([trajectory.prompt_ids + trajectory.response_ids])
    start = len(trajectory.prompt_ids) - 1  # the logits at position i predict token i + 1
    end = start + len(trajectory.response_ids)
    log_s = torch.log_softmax(student(ids).logits[0, start:end].float(), dim=-1)
    log_t = torch.log_softmax(teacher(ids).logits[0, start:end].float(), dim=-1)
    kl = (log_s.exp() * (log_s - log_t)).sum(dim=-1)
    return [float(v) if m else 0.0 for v, m in zip(kl, trajectory.response_mask)]


def probe(student_path: str, teacher_path: str, records, tool_config: SearchToolConfig,
          loop_config: AgentLoopConfig, *, seed: int = 0) -> ProbeResult:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trajectories = asyncio.run(rollouts(student_path, records, tool_config, loop_config, seed=seed))
    tokenizer = AutoTokenizer.from_pretrained(student_path)
    student = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()
    result = ProbeResult()
    for trajectory in trajectories:
        kl = exact_reverse_kl(student, teacher, trajectory)
        for span in trajectory.spans:
            if span.kind != "model":
                continue
            roles = token_roles(tokenizer.decode, trajectory.response_ids[span.start:span.end])
            for offset, role in enumerate(roles):
                result.add(role, kl[span.start + offset])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--student", required=True, help="HF model directory (a checkpoint's hf_model)")
    parser.add_argument("--teacher", required=True, help="HF model directory with the same tokenizer")
    parser.add_argument("--data", required=True, help="prepared jsonl; the first --prompts records are the probe")
    parser.add_argument("--server-addr", required=True, help="retrieval server host:port")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-obs-tokens", type=int, default=160)
    parser.add_argument("--max-passage-tokens", type=int, default=48)
    parser.add_argument("--topk", type=int, default=SearchToolConfig.model_fields["topk"].default)
    parser.add_argument("--out", type=Path, help="also write the result here as json")
    args = parser.parse_args(argv)
    try:
        records = load_records(args.data)[: args.prompts]
    except (OSError, ValueError) as exc:
        print(f"distill_probe: {exc}", file=sys.stderr)
        return 1
    loop_config = AgentLoopConfig(max_turns=args.max_turns, topk=args.topk, max_tokens_per_turn=args.max_new_tokens,
                                  max_obs_tokens=args.max_obs_tokens, max_passage_tokens=args.max_passage_tokens,
                                  sampling=SamplingParams(temperature=1.0))
    result = probe(args.student, args.teacher, records, SearchToolConfig(server_addr=args.server_addr, topk=args.topk),
                   loop_config, seed=args.seed)
    print(f"{'tokens':<8}{'n':>7}{'KL':>8}{'share':>8}")
    for role in ("all", *ROLES):
        share = result.kl_sum[role] / result.kl_sum["all"] if result.kl_sum["all"] else 0.0
        print(f"{role:<8}{result.tokens[role]:>7}{result.mean(role):>8.3f}{share:>8.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"student": args.student, "teacher": args.teacher, "tokens": result.tokens,
                                        "kl_mean": {role: result.mean(role) for role in ("all", *ROLES)}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
