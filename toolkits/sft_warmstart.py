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
import dataclasses
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
from toolkits.warmstart_probes import (
    Bound,
    ProbeReading,
    ProbeSet,
    StageGoal,
    decision_position,
    last_turn,
)

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
    """Optimizer steps in this phase; with a ``goal``, the most it may take."""
    goal: StageGoal | None = None
    """Trains until this holds on the validation probes (read every ``check_every`` steps), then the next stage
    starts; not reached in ``steps`` stops the warm start (``GoalNotReached``). None: exactly ``steps`` steps."""
    check_every: int = 50
    """Steps between two probe readings (each is one forward pass over the validation questions); with probes
    given, a stage without a goal is read too, and runs its ``steps`` regardless."""
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
    lr: float = 1e-3
    """AdamW learning rate. At 3e-3 the skill stage stalled with one or two of the task's four kinds of fact
    copied, on several seeds (docs/results.md); 1e-3 with the induction stage learned all four."""
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


def induction_sequences(trajectories: list[Trajectory], count: int, *, seed: int = 0, min_length: int = 16,
                        max_length: int = 48) -> list[Trajectory]:
    """``count`` sequences of tokens drawn at random from the passages' vocabulary, each written twice; the second
    copy is the trained "model turn". The classic task on which small transformers grow induction heads (attend to
    the token after the previous occurrence of the current one, copy it): the general copying a real LM brings to a
    search task from pretraining. Reading facts out of passages is then copying what follows the words quoted
    before them, which the tiny model otherwise learns relation by relation, one every few hundred steps."""
    rng = random.Random(seed)
    vocabulary = sorted({token for t in trajectories for token, model in zip(t.response_ids, t.response_mask)
                         if not model})
    if not vocabulary:
        raise ValueError("induction sequences need trajectories with observation tokens")
    sequences = []
    for index in range(count):
        tokens = [rng.choice(vocabulary) for _ in range(rng.randint(min_length, max_length))]
        sequences.append(Trajectory(uid=f"induction-{index}", prompt_ids=tokens, response_ids=list(tokens),
                                    response_mask=[1] * len(tokens), rollout_logprobs=[0.0] * len(tokens)))
    return sequences


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


class GoalNotReached(RuntimeError):
    """A warm-start stage took its most steps and its goal still did not hold on the validation probes."""

    def __init__(self, stage: SFTStage, reading: ProbeReading):
        super().__init__(f"warm start: stage {stage.name!r} did not reach its goal ({stage.goal}) in {stage.steps} "
                         f"steps; on the validation questions: {reading}. Raise its step cap or try another --seed")
        self.stage, self.reading = stage, reading


@dataclass
class StageRecord:
    """How one stage went."""

    name: str
    """The stage's name."""
    steps: int
    """Optimizer steps it took."""
    seconds: float
    """Wall time, probe readings included."""
    readings: list[tuple[int, ProbeReading]]
    """(steps into the stage, reading) at every probe check; empty without probes."""


@dataclass
class WarmStartLog:
    """What ``train_sft`` did."""

    losses: list[float]
    """Training loss at every step, all stages in order."""
    stages: list[StageRecord]
    """One per stage that ran (stages with 0 steps are skipped)."""


def sft_loss(model, ids: torch.Tensor, attention: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions. The LM head runs on those positions alone: in
    the stages that mask the passages, fewer than one position in ten is labelled."""
    head = model.get_output_embeddings()
    body = getattr(model, "base_model", model)
    if head is None or body is model:  # no separate head to call: the model computes its own loss
        return model(input_ids=ids, attention_mask=attention, labels=labels).loss
    hidden = body(input_ids=ids, attention_mask=attention).last_hidden_state
    targets = labels[:, 1:]
    labelled = targets != -100
    return torch.nn.functional.cross_entropy(head(hidden[:, :-1][labelled]).float(), targets[labelled])


def train_sft(model, tokenizer, stages: list[SFTStage], config: SFTConfig, probes: ProbeSet | None = None,
              *, report: Callable[[str], None] = print) -> WarmStartLog:
    """Cross-entropy on the trained tokens, stage after stage; a stage with a goal stops as soon as the probes
    show it (``report`` gets a line per reading) and raises ``GoalNotReached`` at its step cap."""
    for stage in stages:
        if stage.steps and not stage.trajectories:
            raise ValueError(f"warm-start stage {stage.name!r} has no trajectories")
        if stage.goal is not None and probes is None:
            raise ValueError(f"warm-start stage {stage.name!r} has a goal but no probes were given")
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    model.train()
    log = WarmStartLog(losses=[], stages=[])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    decision = decision_position(tokenizer)
    running = [stage for stage in stages if stage.steps > 0]
    for stage in running:
        record = StageRecord(stage.name, 0, 0.0, [])
        started = time.monotonic()
        final = stage is running[-1]
        for step in (bar := progress(range(stage.steps), desc=f"sft {stage.name}", unit="step")):
            # Warm up, hold, and over the last stage fall linearly (that stage sets how often the model
            # searches; at full lr its last few batches' share of searches would set it).
            lr = config.lr * min(1.0, (len(log.losses) + 1) / max(1, config.warmup_steps))
            if final:
                lr *= 1.0 - config.final_stage_decay * step / stage.steps
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = rng.sample(stage.trajectories, min(config.batch_size, len(stage.trajectories)))
            ids, attention, labels = _batch(batch, pad_id, train_on_observations=stage.train_on_observations,
                                            trains_model_turns=stage.trains_model_turns,
                                            trains_queries=stage.trains_queries,
                                            untrained_position=None if stage.trains_decision else decision)
            loss = sft_loss(model, ids, attention, labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            log.losses.append(loss.item())
            record.steps = step + 1
            bar.set_postfix(loss=f"{log.losses[-1]:.3f}")
            if probes is not None and (record.steps % stage.check_every == 0 or record.steps == stage.steps):
                reading = probes.read(model)
                record.readings.append((record.steps, reading))
                met = stage.goal is not None and stage.goal.met(reading)
                report(f"sft {stage.name} step {record.steps}: {reading}" + (" (goal met)" if met else ""))
                if met:
                    break
        record.seconds = time.monotonic() - started
        log.stages.append(record)
        if stage.goal is not None and not stage.goal.met(record.readings[-1][1]):
            raise GoalNotReached(stage, record.readings[-1][1])
    model.eval()
    return log


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
               probe: list[QARecord] = (), probes: ProbeSet | None = None) -> tuple[WarmStartLog, list[float]]:
    """Load ``model_dir``, train on the stages and save the result (model and tokenizer) to ``out_dir``;
    what training did, and the chance of searching first on each ``probe`` record. Nothing is saved when a
    stage misses its goal (``GoalNotReached`` propagates)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    log = train_sft(model, tokenizer, stages, config, probes)
    chances = search_probabilities(model, tokenizer, list(probe))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return log, chances


async def _collect_from_server(records: list[QARecord], scripts: SyntheticScripts, tokenizer, server_addr: str,
                               loop_config: AgentLoopConfig, seed: int) -> list[Trajectory]:
    tool = build_search_tool(SearchToolConfig(server_addr=server_addr, topk=loop_config.topk))
    try:
        return await collect_trajectories(records, scripts, tool, tokenizer, loop_config, seed=seed)
    finally:
        await tool.aclose()


def goals(args) -> tuple[StageGoal | None, StageGoal | None]:
    """The skill stage's goal (it copies the name into its query and the answer out of the passages) and the mix
    stage's (its chance of searching first inside the band, greedy decoding guessing nearly everywhere)."""
    if not args.val_data:
        return None, None
    skill = StageGoal((Bound("query_copy", ">=", args.query_copy_goal), Bound("answer_copy", ">=", args.answer_copy_goal)))
    low, high = args.search_band
    mix = StageGoal((Bound("search_mean", ">=", low), Bound("search_mean", "<=", high),
                     Bound("search_greedy", "<=", args.max_greedy_search),
                     Bound("answer_copy", ">=", args.mix_answer_copy_floor)))
    return skill, mix


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from rlinf_search.data.prepare import load_records

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory to start from")
    parser.add_argument("--data", required=True, help="prepared synthetic training jsonl")
    parser.add_argument("--server-addr", required=True, help="retrieval server host:port")
    parser.add_argument("--out", required=True, help="directory for the warm-started model")
    parser.add_argument("--val-data", help="prepared synthetic validation jsonl: every stage prints the probes on it "
                                           "as it goes, and the skill and mix stages train until their goals hold")
    parser.add_argument("--probe-questions", type=int, default=200, help="validation questions the probes read")
    parser.add_argument("--check-every", type=int, default=SFTStage.check_every, help="steps between probe readings")
    parser.add_argument("--query-copy-goal", type=float, default=0.85,
                        help="skill stage: share of validation questions whose first query is the subject's name")
    parser.add_argument("--answer-copy-goal", type=float, default=0.9,
                        help="skill stage: share whose answer is copied out of the passage (0.9: every kind of fact; "
                             "runs that stalled at 3e-3 copied one or two of the four kinds, 0.5 to 0.65)")
    parser.add_argument("--mix-answer-copy-floor", type=float, default=0.8,
                        help="mix stage: the answer copying it must keep while it mostly trains guesses")
    parser.add_argument("--search-band", type=float, nargs=2, default=(0.1, 0.4), metavar=("LOW", "HIGH"),
                        help="mix stage: the mean first-turn chance of searching must end inside this band")
    parser.add_argument("--max-greedy-search", type=float, default=0.05,
                        help="mix stage: most share of questions where greedy decoding searches first")
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
    parser.add_argument("--induction-steps", type=int, default=0,
                        help="first of all, steps of copying random token sequences written twice (induction heads: "
                             "the general copying a pretrained LM has)")
    parser.add_argument("--reading-steps", type=int, default=300,
                        help="first, steps of language modelling on good trajectories, passages included")
    parser.add_argument("--skill-steps", type=int, default=400,
                        help="steps on good searches only (with --val-data: the most; it stops at its goal)")
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
        val_records = load_records(args.val_data)[: args.probe_questions] if args.val_data else []
        skill_goal, mix_goal = goals(args)
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
    # The probes' searches get a turn for every hop, whatever --max-turns: they score reading, not turn budgets.
    probe_config = dataclasses.replace(loop_config, max_turns=max(loop_config.max_turns, 2))
    probed = asyncio.run(_collect_from_server(val_records, lambda record, rng: scripts.good_search(record), tokenizer,
                                              args.server_addr, probe_config, args.seed))
    failed = sum(1 for t in good + mixed + probed if t.search_errors)
    if failed:
        print(f"sft_warmstart: {failed} scripted trajectories saw failed searches; is the server at "
              f"{args.server_addr} serving the synthetic corpus?", file=sys.stderr)
        return 1
    print(f"collected {len(good) + len(mixed)} scripted trajectories and {len(probed)} validation probes in "
          f"{time.monotonic() - started:.1f} s")
    probes = ProbeSet(val_records, probed, tokenizer) if val_records else None
    early = args.decision_in_every_stage
    # The induction stage is read at its end only (the probes read the task, which it never shows). The mix stage
    # too: it sets the search rate while its lr decays, and stopping it early would leave that rate to the batches
    # seen so far.
    stages = [SFTStage("induction", induction_sequences(good, 4000, seed=args.seed), args.induction_steps,
                       check_every=max(1, args.induction_steps)),
              SFTStage("corpus", good, args.corpus_steps, train_on_observations=True, trains_model_turns=False,
                       trains_decision=False, check_every=args.check_every),
              SFTStage("comprehension", good, args.comprehension_steps, trains_queries=False, trains_decision=False,
                       check_every=args.check_every),
              SFTStage("reading", good, args.reading_steps, train_on_observations=True, trains_decision=early,
                       check_every=args.check_every),
              SFTStage("skill", good, args.skill_steps, trains_decision=early, goal=skill_goal,
                       check_every=args.check_every),
              SFTStage("mix", mixed, args.mix_steps, goal=mix_goal, check_every=max(1, args.mix_steps))]
    config = SFTConfig(batch_size=args.batch_size, lr=args.lr, seed=args.seed, final_stage_decay=args.final_lr_decay)
    probe = random.Random(args.seed).sample(records, min(200, len(records)))
    try:
        log, chances = warm_start(Path(args.model), Path(args.out), stages, config, probe, probes)
    except GoalNotReached as exc:
        print(exc, file=sys.stderr)
        return 1
    (Path(args.out) / "sft_losses.json").write_text(json.dumps({
        "config": vars(args), "losses": log.losses, "search_probabilities": chances,
        "stages": [{"name": st.name, "steps": st.steps, "seconds": round(st.seconds, 1),
                    "readings": [{"step": step, **dataclasses.asdict(r)} for step, r in st.readings]}
                   for st in log.stages]}))
    mean = sum(chances) / len(chances)
    greedy = sum(c > 0.5 for c in chances) / len(chances)
    stage_steps = ", ".join(f"{st.name} {st.steps} steps in {st.seconds / 60:.1f} min" for st in log.stages)
    # How far the greedy choice sits from the edge: a mean near one half means rounding can flip it.
    print(f"warm start: {stage_steps}; loss {log.losses[0]:.3f} -> {log.losses[-1]:.3f}; first-turn P(search) on "
          f"{len(chances)} training prompts: mean {mean:.3f}, {greedy:.0%} above 1/2 (greedy searches there); "
          f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
