"""Supervised warm start on scripted Search-R1 trajectories, with observations masked out of the loss.

A scripted engine writes the model turns (a script per question), the real agent loop runs them
against a real search tool, and the resulting trajectories train the model on ``response_mask`` 1
tokens only, exactly the tokens RL will later train on.

    python toolkits/sft_warmstart.py --model outputs/tiny/model/base --data outputs/tiny/data/train.prepared.jsonl \
        --server-addr 127.0.0.1:8000 --out outputs/tiny/model/sft

The behaviours and their shares are in ``toolkits/sft_scripts.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rlinf_search.agents.searchr1.loop import AgentLoopConfig, SearchR1AgentLoop
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.data.prompt_tokens import PromptTokenizer
from rlinf_search.progress import progress
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.tools.search.base import SearchTool
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from toolkits.sft_scripts import BehaviourMix, SyntheticScripts

# (record, rng) -> the model turns of one scripted trajectory
ScriptFn = Callable[[QARecord, random.Random], list[str]]


@dataclass(frozen=True)
class SFTStage:
    """One phase of the warm start: ``steps`` optimizer steps on batches drawn from ``trajectories``."""

    name: str
    """Shown on the progress bar (``skill``, ``mix``)."""
    trajectories: list[Trajectory]
    """The scripted trajectories of this phase."""
    steps: int
    """Optimizer steps in this phase."""
    train_on_observations: bool = False
    """Also train on observation tokens (the retrieved passages). Only for a first "reading" stage:
    a real LM has read Wikipedia before it learns to search it, and passages that repeat each name
    are where a tiny model learns to copy; the later stages mask observations, as RL does."""
    trains_decision: bool = True
    """Train on the first turn's decision token (where ``<search>`` and ``<answer>`` part). Only the
    behaviour-mix stage should: stages of good searches alone would push the chance of searching toward
    1, and whether the short mix stage then pulled it under one half (greedy guesses) or not (greedy
    searches) was decided by rounding noise, so the warm start's EM swung between machines (issue 12).
    With the earlier stages blind to it, the mix stage sets that chance to its share of searches."""
    trains_model_turns: bool = True
    """Train on the model's turns. False with ``train_on_observations``: language modelling on the retrieved
    passages alone, the stand-in for a pretrained LM that has read the corpus but never seen the task
    (the distillation benchmark's student, which must not learn the skill from the warm start)."""
    trains_queries: bool = True
    """Train on every model turn. False: on the last one only, the answer written after the passages, with the
    queries masked: reading comprehension, which a pretrained LM brings to the task, without what to search
    for (the distillation benchmark's student: it can copy a fact in front of it, but was never shown a query)."""


@dataclass(frozen=True)
class SFTConfig:
    """Warm-start optimisation settings (shared by all stages: one optimizer, one lr schedule)."""

    batch_size: int = 16
    """Trajectories per step."""
    lr: float = 3e-3
    """AdamW learning rate (tiny models take large steps)."""
    warmup_steps: int = 30
    """Linear warm-up; a tiny model at full lr from step 0 can diverge on the first batches."""
    seed: int = 0
    """Seed for trajectory order."""
    final_stage_decay: float = 0.9
    """Over the last stage the lr falls linearly by this fraction of itself (0: constant). That stage sets
    how often the model searches; at full lr its last few batches' share of searches would set it."""


async def collect_trajectories(records: list[QARecord], script: ScriptFn, tool: SearchTool, tokenizer,
                               loop_config: AgentLoopConfig, *, seed: int = 0) -> list[Trajectory]:
    """Run one scripted rollout per record through the real agent loop and search tool."""
    rng = random.Random(seed)
    scripts = [script(record, rng) for record in records]

    async def one(record: QARecord, turns: list[str]) -> Trajectory:
        loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, turns), tool, tokenizer, loop_config)
        return await loop.run(record)

    return list(await asyncio.gather(*(one(r, s) for r, s in zip(records, scripts))))


def decision_position(tokenizer) -> int:
    """Index, in the first turn's ids, of the token that decides between searching and answering."""
    search, answer = (tokenizer.encode(tag, add_special_tokens=False) for tag in ("<search>", "<answer>"))
    return next(i for i, (a, b) in enumerate(zip(search, answer)) if a != b)


def last_turn(response_mask: list[int]) -> torch.Tensor:
    """The response positions of the last model turn (the last run of mask 1), as a bool mask."""
    mask = torch.tensor(response_mask, dtype=torch.bool)
    observations = (~mask).nonzero()
    start = int(observations[-1]) + 1 if len(observations) else 0
    last = torch.zeros_like(mask)
    last[start:] = mask[start:]
    return last


def first_turn(response_mask: list[int]) -> torch.Tensor:
    """The response positions of the first model turn (the first run of mask 1), as a bool mask."""
    mask = torch.tensor(response_mask, dtype=torch.bool)
    observations = (~mask).nonzero()
    end = int(observations[0]) if len(observations) else len(mask)
    first = torch.zeros_like(mask)
    first[:end] = mask[:end]
    return first


def _batch(trajectories: list[Trajectory], pad_id: int, *, train_on_observations: bool = False,
           trains_model_turns: bool = True, trains_queries: bool = True,
           untrained_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, attention and labels; ``untrained_position``: a response position left out of the loss."""
    sequences = [t.prompt_ids + t.response_ids for t in trajectories]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (traj, seq) in enumerate(zip(trajectories, sequences)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        model_turn = torch.tensor(traj.response_mask, dtype=torch.bool)
        trained_turns = model_turn if trains_queries else last_turn(traj.response_mask)
        trained = (trained_turns & trains_model_turns) | (~model_turn & train_on_observations)
        if untrained_position is not None and untrained_position < len(trained):
            trained[untrained_position] = False
        response = torch.tensor(traj.response_ids)
        labels[row, len(traj.prompt_ids): len(seq)] = torch.where(trained, response, torch.tensor(-100))
    return ids, attention, labels


def train_sft(model, tokenizer, stages: list[SFTStage], config: SFTConfig) -> list[float]:
    """Cross-entropy on model tokens only, stage after stage; returns the loss per step."""
    for stage in stages:
        if not stage.trajectories:
            raise ValueError(f"warm-start stage {stage.name!r} has no trajectories")
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    total = sum(stage.steps for stage in stages)
    last_stage = total - stages[-1].steps

    def lr_factor(step: int) -> float:  # warm up, hold, then decay over the last stage
        warm = min(1.0, (step + 1) / max(1, config.warmup_steps))
        return warm * (1.0 - config.final_stage_decay * max(0, step - last_stage) / max(1, stages[-1].steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    losses = []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    decision = decision_position(tokenizer)
    for stage in stages:
        for _ in (bar := progress(range(stage.steps), desc=f"sft {stage.name}", unit="step")):
            batch = rng.sample(stage.trajectories, min(config.batch_size, len(stage.trajectories)))
            ids, attention, labels = _batch(batch, pad_id, train_on_observations=stage.train_on_observations,
                                            trains_model_turns=stage.trains_model_turns,
                                            trains_queries=stage.trains_queries,
                                            untrained_position=None if stage.trains_decision else decision)
            loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


@torch.no_grad()
def search_probabilities(model, tokenizer, records: list[QARecord]) -> list[float]:
    """The model's chance of opening its first turn with a search, per record (the prompt as the agent
    loop builds it). Greedy decoding searches where it is above one half."""
    prompts = PromptTokenizer(tokenizer)
    search, answer = (tokenizer.encode(tag, add_special_tokens=False) for tag in ("<search>", "<answer>"))
    position = decision_position(tokenizer)
    chances = []
    for record in records:
        ids = prompts.ids(record) + search[:position]  # the shared opening, if the tags have one
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        pair = torch.softmax(logits, -1)[[search[position], answer[position]]]
        chances.append(float(pair[0] / pair.sum()))
    return chances


def warm_start(model_dir: Path, out_dir: Path, stages: list[SFTStage], config: SFTConfig,
               probe: list[QARecord] = ()) -> tuple[list[float], list[float]]:
    """Load ``model_dir``, train on the stages and save the result (model and tokenizer) to ``out_dir``;
    the losses, and the chance of searching first on each ``probe`` record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses = train_sft(model, tokenizer, stages, config)
    chances = search_probabilities(model, tokenizer, list(probe))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses, chances


async def _collect_from_server(records: list[QARecord], scripts: SyntheticScripts, tokenizer, server_addr: str,
                               loop_config: AgentLoopConfig, seed: int) -> list[Trajectory]:
    tool = build_search_tool(SearchToolConfig(server_addr=server_addr, topk=loop_config.topk))
    try:
        return await collect_trajectories(records, scripts, tool, tokenizer, loop_config, seed=seed)
    finally:
        await tool.aclose()


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from rlinf_search.data.prepare import load_records

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory to start from")
    parser.add_argument("--data", required=True, help="prepared synthetic training jsonl")
    parser.add_argument("--server-addr", required=True, help="retrieval server host:port")
    parser.add_argument("--out", required=True, help="directory for the warm-started model")
    parser.add_argument("--trajectories-per-question", type=int, default=1,
                        help="mixed-behaviour trajectories per training question")
    parser.add_argument("--search-share", type=float, default=BehaviourMix.search)
    parser.add_argument("--bad-query-share", type=float, default=BehaviourMix.bad_query)
    parser.add_argument("--corpus-steps", type=int, default=0,
                        help="first of all, steps of language modelling on the retrieved passages alone (no model "
                             "turn): a model that has read the corpus but not learned the task")
    parser.add_argument("--comprehension-steps", type=int, default=0,
                        help="then steps on the answer turn of good searches only (queries and passages masked): a "
                             "model that can answer from passages in front of it but was never shown what to search")
    parser.add_argument("--reading-steps", type=int, default=300,
                        help="first, steps of language modelling on good trajectories, passages included")
    parser.add_argument("--skill-steps", type=int, default=400,
                        help="steps on good searches only: querying and copying are the slow skills")
    parser.add_argument("--mix-steps", type=int, default=150,
                        help="then steps on the behaviour mix, which sets how often the model searches")
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size)
    parser.add_argument("--lr", type=float, default=SFTConfig.lr)
    parser.add_argument("--topk", type=int, default=SearchToolConfig.topk)
    parser.add_argument("--max-turns", type=int, default=AgentLoopConfig.max_turns)
    parser.add_argument("--max-passage-tokens", type=int, default=48)
    parser.add_argument("--max-obs-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--final-lr-decay", type=float, default=SFTConfig.final_stage_decay,
                        help="fraction by which the lr falls over the last stage (0: constant, as before issue 12)")
    parser.add_argument("--decision-in-every-stage", action="store_true",
                        help="train the search-or-answer token in the reading and skill stages too (the warm start "
                             "before issue 12, whose greedy choice sat on a knife's edge; for comparison only)")
    args = parser.parse_args(argv)
    try:
        mix = BehaviourMix(search=args.search_share, bad_query=args.bad_query_share)
        records = load_records(args.data)
        scripts = SyntheticScripts(records, mix)
    except (ValueError, OSError) as exc:
        print(f"sft_warmstart: {exc}", file=sys.stderr)
        return 1
    loop_config = AgentLoopConfig(max_turns=args.max_turns, max_tokens_per_turn=64, max_obs_tokens=args.max_obs_tokens,
                                  max_passage_tokens=args.max_passage_tokens, topk=args.topk)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    started = time.monotonic()
    good = asyncio.run(_collect_from_server(records, lambda record, rng: scripts.good_search(record), tokenizer,
                                            args.server_addr, loop_config, args.seed))
    mixed = asyncio.run(_collect_from_server(records * args.trajectories_per_question, scripts, tokenizer,
                                             args.server_addr, loop_config, args.seed))
    failed = sum(1 for t in good + mixed if t.search_errors)
    if failed:
        print(f"sft_warmstart: {failed} scripted trajectories saw failed searches; is the server at "
              f"{args.server_addr} serving the synthetic corpus?", file=sys.stderr)
        return 1
    print(f"collected {len(good) + len(mixed)} scripted trajectories in {time.monotonic() - started:.1f} s")
    early = args.decision_in_every_stage
    stages = [SFTStage("corpus", good, args.corpus_steps, train_on_observations=True, trains_model_turns=False,
                       trains_decision=False),
              SFTStage("comprehension", good, args.comprehension_steps, trains_queries=False, trains_decision=False),
              SFTStage("reading", good, args.reading_steps, train_on_observations=True, trains_decision=early),
              SFTStage("skill", good, args.skill_steps, trains_decision=early), SFTStage("mix", mixed, args.mix_steps)]
    config = SFTConfig(batch_size=args.batch_size, lr=args.lr, seed=args.seed, final_stage_decay=args.final_lr_decay)
    probe = random.Random(args.seed).sample(records, min(200, len(records)))
    losses, chances = warm_start(Path(args.model), Path(args.out), stages, config, probe)
    (Path(args.out) / "sft_losses.json").write_text(json.dumps({"config": vars(args), "losses": losses,
                                                                "search_probabilities": chances}))
    mean = sum(chances) / len(chances)
    greedy = sum(c > 0.5 for c in chances) / len(chances)
    # How far the greedy choice sits from the edge: a mean near one half means rounding can flip it.
    print(f"warm start: loss {losses[0]:.3f} -> {losses[-1]:.3f}; first-turn P(search) on {len(chances)} training "
          f"prompts: mean {mean:.3f}, {greedy:.0%} above 1/2 (greedy searches there); saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
