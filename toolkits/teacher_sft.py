"""The offline distillation baseline: supervised fine-tuning of the student on the teacher's own trajectories.

The teacher (a Hugging Face model directory, run on the HF engine) samples trajectories through the real agent
loop and search server, on the questions an RL run with the same ``--seed`` would see, as many as that run
samples (``--steps`` x ``--prompts-per-step`` x ``--samples-per-prompt``); the student is then trained on the
model tokens of those trajectories (observations masked, as RL masks them) with the RL actor's optimizer
settings, ``--minibatches`` updates a step. Only where the trajectories come from differs from on-policy
training: this is sequence-level knowledge distillation (Kim and Rush, 2016), the offline arm of
``scripts/distill_compare.sh``.

    python -m toolkits.teacher_sft --teacher outputs/demo/rl/checkpoints/global_step_30/hf_model \\
        --student outputs/demo/model/sft --data outputs/demo/data/train.prepared.jsonl \\
        --val-data outputs/demo/data/val.prepared.jsonl --server-addr 127.0.0.1:8000 --out outputs/teacher_sft

Writes what an RL run writes for the comparison to read: ``OUT/checkpoints/global_step_N/hf_model`` every
``--save-every`` steps, and ``OUT/logs/metrics.jsonl`` (``sft/loss`` each step, ``val/em`` with every
checkpoint: greedy, every validation question), ``OUT/teacher.json`` (what the teacher's samples scored) and
``OUT/teacher_trajectories.jsonl`` (what the student trained on: text and ids, model tokens marked).
The teacher and the student must share a tokenizer: the student trains on the teacher's token ids.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.io_struct import QARecord, SamplingParams, Trajectory
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.runners.eval_runner import evaluate, rollouts, score_trajectories
from rlinf_search.tools.search import SearchToolConfig
from toolkits.sft_training import SFTConfig, SFTStage, train_sft


@dataclass(frozen=True)
class TeacherSFTPlan:
    """How much the baseline samples and trains: the shape of the RL run it stands beside."""

    steps: int
    """RL-equivalent steps; checkpoints are named by these."""
    prompts_per_step: int
    """Questions a step (``data.rollout_batch_size``)."""
    samples_per_prompt: int
    """Teacher trajectories per question (``algorithm.group_size``)."""
    minibatches: int
    """Optimizer updates a step (``algorithm.n_minibatches``)."""
    save_every: int
    """Steps between checkpoints (each with a validation pass)."""

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "samples_per_prompt", "minibatches", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"teacher_sft: --{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if (self.prompts_per_step * self.samples_per_prompt) % self.minibatches:
            raise ValueError(f"teacher_sft: {self.prompts_per_step * self.samples_per_prompt} trajectories a step do "
                             f"not split into {self.minibatches} equal minibatches")

    @property
    def batch_size(self) -> int:
        """Trajectories per optimizer update."""
        return self.prompts_per_step * self.samples_per_prompt // self.minibatches


def teacher_questions(records: list[QARecord], plan: TeacherSFTPlan, seed: int) -> list[QARecord]:
    """The questions of the RL run's first ``plan.steps`` steps, in its order (shuffled with ``seed``)."""
    stream = PromptStream(records, plan.prompts_per_step, shuffle=True, seed=seed)
    return [record for _ in range(plan.steps) for record in stream.next_batch()]


def check_same_tokenizer(teacher_dir: Path, student_dir: Path) -> None:
    """Raise ``ValueError`` (one line) unless the two directories' tokenizers map text to the same ids."""
    from transformers import AutoTokenizer

    teacher, student = (AutoTokenizer.from_pretrained(d) for d in (teacher_dir, student_dir))
    if teacher.get_vocab() != student.get_vocab():
        raise ValueError(f"teacher_sft: the teacher ({teacher_dir}) and the student ({student_dir}) have different "
                         "vocabularies; this baseline trains the student on the teacher's token ids, so both must "
                         "share one tokenizer")


class CheckpointWriter:
    """Called after every optimizer update: saves the student and scores it on the validation questions at each
    ``save_every``-th step, and appends one metrics row per step."""

    def __init__(self, model, tokenizer, out: Path, plan: TeacherSFTPlan, val_records: list[QARecord],
                 tool_config: SearchToolConfig, eval_loop: AgentLoopConfig):
        self.model, self.tokenizer, self.out, self.plan = model, tokenizer, out, plan
        self.val_records, self.tool_config, self.eval_loop = val_records, tool_config, eval_loop
        self.step_losses: list[float] = []
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.metrics = (out / "logs" / "metrics.jsonl").open("w")

    def __call__(self, updates: int, loss: float) -> None:
        self.step_losses.append(loss)
        if updates % self.plan.minibatches:
            return
        step = updates // self.plan.minibatches
        row = {"step": step, "time": time.time(), "sft/loss": sum(self.step_losses) / len(self.step_losses)}
        self.step_losses = []
        if step % self.plan.save_every == 0 or step == self.plan.steps:
            folder = self.out / "checkpoints" / f"global_step_{step}" / "hf_model"
            self.model.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            if self.val_records:
                report, _ = asyncio.run(evaluate(str(folder), self.val_records, self.tool_config, self.eval_loop))
                row.update({"val/em": report.overall["em"], "val/searches": report.overall["searches"]})
                print(f"step {step}: validation EM {report.overall['em']:.3f} on {len(self.val_records)} questions")
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()

    def close(self) -> None:
        self.metrics.close()


def run(args: argparse.Namespace) -> dict:
    """Sample the teacher's trajectories, train the student on them; returns what ``OUT/teacher.json`` holds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prepare import load_records

    plan = TeacherSFTPlan(args.steps, args.prompts_per_step, args.samples_per_prompt, args.minibatches,
                          args.save_every)
    check_same_tokenizer(args.teacher, args.student)
    records = load_records(args.data)
    val_records = load_records(args.val_data)[: args.val_samples] if args.val_data else []
    tool_config = SearchToolConfig(server_addr=args.server_addr, topk=args.topk)
    loop = AgentLoopConfig(max_turns=args.max_turns, max_tokens_per_turn=args.max_new_tokens,
                           max_obs_tokens=args.max_obs_tokens, max_passage_tokens=args.max_passage_tokens,
                           topk=args.topk, max_prompt_tokens=args.max_prompt_tokens,
                           sampling=SamplingParams(temperature=args.temperature))
    eval_loop = dataclasses.replace(loop, sampling=SamplingParams(greedy=True))
    questions = [r for r in teacher_questions(records, plan, args.seed) for _ in range(plan.samples_per_prompt)]
    started = time.monotonic()
    trajectories: list[Trajectory] = asyncio.run(rollouts(str(args.teacher), questions, tool_config, loop,
                                                          seed=args.seed))
    sampled = score_trajectories(questions, trajectories).overall
    failed = sum(1 for t in trajectories if t.search_errors)
    if failed:
        raise RuntimeError(f"teacher_sft: {failed} teacher trajectories saw failed searches; is the retrieval "
                           f"server at {args.server_addr} serving this task's corpus?")
    summary = {"teacher": str(args.teacher), "trajectories": len(trajectories), "em": sampled["em"],
               "searches": sampled["searches"], "seconds": round(time.monotonic() - started, 1)}
    print(f"teacher sampled {len(trajectories)} trajectories in {summary['seconds']} s: EM {sampled['em']:.3f}, "
          f"{sampled['searches']:.2f} searches each")

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    model = AutoModelForCausalLM.from_pretrained(args.student, dtype=torch.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "teacher.json").write_text(json.dumps(summary, indent=1))
    with (args.out / "teacher_trajectories.jsonl").open("w") as saved:
        for record, traj in zip(questions, trajectories):
            saved.write(json.dumps({"uid": record.uid, "question": record.question, "response": traj.response_text,
                                    "prompt_ids": traj.prompt_ids, "response_ids": traj.response_ids,
                                    "response_mask": traj.response_mask}) + "\n")
    updates = plan.steps * plan.minibatches
    # The RL actor's settings: its lr, warm-up fraction (of updates), constant after, no weight decay.
    config = SFTConfig(batch_size=plan.batch_size, lr=args.lr, seed=args.seed, final_stage_decay=0.0,
                       warmup_steps=max(1, round(args.warmup_fraction * updates)), weight_decay=args.weight_decay)
    writer = CheckpointWriter(model, tokenizer, args.out, plan, val_records, tool_config, eval_loop)
    try:
        log = train_sft(model, tokenizer, [SFTStage("teacher", trajectories, updates, check_every=updates)], config,
                        after_step=writer)
    finally:
        writer.close()
    summary["loss"] = [log.losses[0], log.losses[-1]]
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolkits.teacher_sft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, type=Path, help="the teacher's Hugging Face model directory")
    parser.add_argument("--student", required=True, type=Path, help="the student's Hugging Face model directory")
    parser.add_argument("--data", required=True, help="prepared training jsonl (the RL run's data.train_data_paths)")
    parser.add_argument("--val-data", help="prepared validation jsonl: val/em at every checkpoint")
    parser.add_argument("--val-samples", type=int, default=None, help="validation questions (default: all)")
    parser.add_argument("--server-addr", required=True, help="retrieval server host:port")
    parser.add_argument("--out", required=True, type=Path, help="folder for checkpoints/, logs/ and teacher.json")
    parser.add_argument("--seed", type=int, default=0, help="the RL run's data.seed (question order, sampling)")
    parser.add_argument("--steps", type=int, default=30, help="the RL run's runner.max_steps")
    parser.add_argument("--prompts-per-step", type=int, default=16, help="data.rollout_batch_size")
    parser.add_argument("--samples-per-prompt", type=int, default=4, help="algorithm.group_size")
    parser.add_argument("--minibatches", type=int, default=2, help="algorithm.n_minibatches")
    parser.add_argument("--save-every", type=int, default=10, help="runner.save_interval")
    parser.add_argument("--lr", type=float, default=1e-4, help="actor.optim.lr")
    parser.add_argument("--warmup-fraction", type=float, default=0.05, help="actor.lr_sched.lr_warmup_fraction")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="actor.optim.weight_decay")
    parser.add_argument("--temperature", type=float, default=1.0, help="algorithm.sampling_params.temperature")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="algorithm.sampling_params.max_new_tokens")
    parser.add_argument("--max-turns", type=int, default=2, help="agentloop.max_turns")
    parser.add_argument("--max-obs-tokens", type=int, default=160, help="agentloop.max_tool_response_length")
    parser.add_argument("--max-passage-tokens", type=int, default=48, help="agentloop.max_passage_tokens")
    parser.add_argument("--max-prompt-tokens", type=int, default=128, help="data.max_prompt_length")
    parser.add_argument("--topk", type=int, default=1, help="tools.search.topk")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = run(args)
    except (ValueError, OSError, RuntimeError) as exc:
        print(exc if str(exc).startswith("teacher_sft:") else f"teacher_sft: {exc}", file=sys.stderr)
        return 1
    print(f"student trained on the teacher's trajectories: loss {summary['loss'][0]:.3f} -> {summary['loss'][1]:.3f}; "
          f"checkpoints under {args.out / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
