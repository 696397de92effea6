"""Supervised warm start on scripted trajectories, with observations masked out of the loss.

A scripted engine writes the model turns (a script per question), the real agent loop runs them
against a real search tool, and the resulting trajectories train the model on ``response_mask`` 1
tokens only, exactly the tokens RL will later train on.

    python toolkits/sft_warmstart.py --model outputs/tiny/model/base --data outputs/tiny/data/train.prepared.jsonl \
        --server-addr 127.0.0.1:8000 --out outputs/tiny/model/sft

The behaviours and their shares are in ``toolkits/sft_scripts.py``. ``--protocol toolcall`` writes the turns as
function calls through the chat template (``agent.protocol: toolcall``; the model needs a template with tools, as
``toolkits/make_tiny_model.py --tool-calling`` makes).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.toolcall.loop import TemplateWithoutTools
from rlinf_search.agents.tools.search_function import SearchFunction
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.data.prompt_tokens import PromptTokenizer
from rlinf_search.rewards.scores import em_reward
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.tools.search.base import SearchTool
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from toolkits.fact_focus import FocusRule
from toolkits.synth_task import question_fact
from toolkits.sft_scripts import SEARCHR1_TURNS, BehaviourMix, SyntheticScripts, TurnStyle
from toolkits.sft_training import (
    GoalNotReached,
    SFTConfig,
    SFTStage,
    WarmStartLog,
    induction_sequences,
    train_sft,
)
from toolkits.warmstart_probes import Bound, ProbeSet, StageGoal, decision_position

# (record, rng) -> the model turns of one scripted trajectory
ScriptFn = Callable[[QARecord, random.Random], list[str]]


async def collect_trajectories(records: list[QARecord], script: ScriptFn, tool: SearchTool, tokenizer,
                               loop_config: AgentLoopConfig, *, seed: int = 0) -> list[Trajectory]:
    """Run one scripted rollout per record through the real agent loop of ``loop_config.protocol`` and the
    search tool."""
    rng = random.Random(seed)
    scripts = [script(record, rng) for record in records]

    async def one(record: QARecord, turns: list[str]) -> Trajectory:
        loop = build_agent_loop(ScriptedEngine(tokenizer, turns), tool, tokenizer, loop_config)
        return await loop.run(record)

    return list(await asyncio.gather(*(one(r, s) for r, s in zip(records, scripts))))


@torch.no_grad()
def search_probabilities(model, tokenizer, records: list[QARecord], style: TurnStyle = SEARCHR1_TURNS) -> list[float]:
    """The model's chance of opening its first turn with a search, per record (the prompt as the agent
    loop of ``style.protocol`` builds it). Greedy decoding searches where it is above one half."""
    tools = [SearchFunction.from_schema(None).schema] if style.protocol == "toolcall" else None
    prompts = PromptTokenizer(tokenizer, tools=tools)
    search, answer = (tokenizer.encode(tag, add_special_tokens=False) for tag in (style.search_open, "<answer>"))
    position = decision_position(tokenizer, style.search_open)
    chances = []
    for record in records:
        ids = prompts.ids(record) + search[:position]  # the shared opening, if the tags have one
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        pair = torch.softmax(logits, -1)[[search[position], answer[position]]]
        chances.append(float(pair[0] / pair.sum()))
    return chances


def warm_start(model_dir: Path, out_dir: Path, stages: list[SFTStage], config: SFTConfig,
               probe: list[QARecord] = (), probes: ProbeSet | None = None,
               style: TurnStyle | None = None) -> tuple[WarmStartLog, list[float]]:
    """Load ``model_dir``, train on the stages and save the result (model and tokenizer) to ``out_dir``;
    what training did, and the chance of searching first on each ``probe`` record. Nothing is saved when a
    stage misses its goal (``GoalNotReached`` propagates). ``style``: the protocol the trajectories speak
    (None: Search-R1's tags)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    style = style or SEARCHR1_TURNS
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    log = train_sft(model, tokenizer, stages, config, probes, search_open=style.search_open)
    chances = search_probabilities(model, tokenizer, list(probe), style)
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


def _collect_all(records: list[QARecord], val_records: list[QARecord], scripts: SyntheticScripts, tokenizer, args,
                 loop_config: AgentLoopConfig) -> tuple[list[Trajectory], list[Trajectory], list[Trajectory]]:
    """The good searches and the behaviour mix on the training questions, and the probes' good searches on the
    validation questions, each through the real agent loop and the search server at ``args.server_addr``."""
    good = asyncio.run(_collect_from_server(records, lambda record, rng: scripts.good_search(record), tokenizer,
                                            args.server_addr, loop_config, args.seed))
    mixed = asyncio.run(_collect_from_server(records * args.trajectories_per_question, scripts, tokenizer,
                                             args.server_addr, loop_config, args.seed))
    # The probes' searches get a turn for every hop, whatever --max-turns: they score reading, not turn budgets.
    probe_config = dataclasses.replace(loop_config, max_turns=max(loop_config.max_turns, 2))
    probed = asyncio.run(_collect_from_server(val_records, lambda record, rng: scripts.good_search(record), tokenizer,
                                              args.server_addr, probe_config, args.seed))
    return good, mixed, probed


def wrong_answers(trajectories: list[Trajectory], records: list[QARecord]) -> frozenset[int]:
    """Indices of the trajectories whose final answer scores no exact match against their record's gold (the
    guesses), graded as the reward grades it; a trajectory finds its record by uid."""
    golds = {record.uid: record.golden_answers for record in records}
    return frozenset(i for i, trajectory in enumerate(trajectories)
                     if not em_reward(trajectory.response_text, golds[trajectory.uid]))


def goals(args) -> tuple[StageGoal | None, StageGoal | None]:
    """The skill stage's goal (it copies the name into its query and the answer out of the passages) and the mix
    stage's (its chance of searching first inside the band, greedy decoding guessing nearly everywhere)."""
    if not args.val_data:
        return None, None
    skill = StageGoal((Bound("query_copy", ">=", args.query_copy_goal),
                       Bound("answer_copy", ">=", args.answer_copy_goal),
                       *((Bound("least_fact_copy", ">=", args.fact_copy_floor),) if args.fact_copy_floor else ())))
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
    parser.add_argument("--protocol", choices=("searchr1", "toolcall"), default="searchr1",
                        help="agent.protocol of the scripted turns (and of the RL run that follows)")
    parser.add_argument("--val-data", help="prepared synthetic validation jsonl: every stage prints the probes on it "
                                           "as it goes, and the skill and mix stages train until their goals hold")
    parser.add_argument("--probe-questions", type=int, default=200, help="validation questions the probes read")
    parser.add_argument("--check-every", type=int, default=SFTStage.check_every, help="steps between probe readings")
    parser.add_argument("--query-copy-goal", type=float, default=0.85,
                        help="skill stage: share of validation questions whose first query is the subject's name")
    parser.add_argument("--answer-copy-goal", type=float, default=0.9,
                        help="skill stage: share whose answer is copied out of the passage (0.9: every kind of fact; "
                             "runs that stalled at 3e-3 copied one or two of the four kinds, 0.5 to 0.65)")
    parser.add_argument("--fact-copy-floor", type=float, default=0.0,
                        help="skill stage: answer copy every kind of fact must reach too (0: none). The mix stage "
                             "erodes the weakest kind most: toolcall seed 2 met the mean goal with profession at "
                             "0.66, which the mix took to 0.29 and the mean under the mix floor (docs/history/results.md)")
    parser.add_argument("--train-guessed-facts", action=argparse.BooleanOptionalAction, default=True,
                        help="mix stage: train a guess's answer whole (the default), or, with "
                             "--no-train-guessed-facts, "
                             "only up to its deciding token: the stage then sets how often to guess without teaching "
                             "wrong facts, which wore the least-copied kind down on toolcall seed 2 (docs/history/results.md)")
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
                        help="first of all, steps of copying random token sequences written twice (helps the later "
                             "stages learn to copy on the seeds measured; docs/history/results.md)")
    parser.add_argument("--reading-steps", type=int, default=300,
                        help="first, steps of language modelling on good trajectories, passages included")
    parser.add_argument("--skill-steps", type=int, default=400,
                        help="steps on good searches only (with --val-data: the most; it stops at its goal)")
    parser.add_argument("--mix-steps", type=int, default=150,
                        help="then steps on the behaviour mix, which sets how often the model searches")
    parser.add_argument("--balance-facts", action=argparse.BooleanOptionalAction, default=True,
                        help="skill stage: draw more of the kinds of fact the probes find least copied (without it, "
                             "seed 2 under AVX2 kernels left two kinds uncopied for 1000 steps; docs/history/results.md)")
    parser.add_argument("--focus-stalled-fact", action=argparse.BooleanOptionalAction, default=False,
                        help="skill stage, with --balance-facts: a kind of fact still uncopied after 5 readings in "
                             "which every other kind is mostly copied is trained alone until it is "
                             "(toolkits/fact_focus.py; toolcall seed 1 under AVX2 kernels never started copying "
                             "employer without it; docs/history/results.md)")
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size)
    parser.add_argument("--lr", type=float, default=SFTConfig.lr)
    parser.add_argument("--topk", type=int, default=SearchToolConfig.model_fields["topk"].default)
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
    if args.focus_stalled_fact and not args.balance_facts:
        print("sft_warmstart: --focus-stalled-fact needs --balance-facts (it focuses on one kind of fact)",
              file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    try:
        mix = BehaviourMix(search=args.search_share, bad_query=args.bad_query_share)
        records = load_records(args.data)
        style = TurnStyle.for_protocol(args.protocol, tokenizer)
        scripts = SyntheticScripts(records, mix, style)
        val_records = load_records(args.val_data)[: args.probe_questions] if args.val_data else []
        skill_goal, mix_goal = goals(args)
    except (ValueError, OSError) as exc:
        print(f"sft_warmstart: {exc}", file=sys.stderr)
        return 1
    loop_config = AgentLoopConfig(max_turns=args.max_turns, max_tokens_per_turn=64, max_obs_tokens=args.max_obs_tokens,
                                  max_passage_tokens=args.max_passage_tokens, topk=args.topk, protocol=args.protocol)
    started = time.monotonic()
    try:
        good, mixed, probed = _collect_all(records, val_records, scripts, tokenizer, args, loop_config)
    except TemplateWithoutTools as exc:
        print(f"sft_warmstart: {exc}", file=sys.stderr)
        return 1
    failed = sum(1 for t in good + mixed + probed if t.search_errors)
    if failed:
        print(f"sft_warmstart: {failed} scripted trajectories saw failed searches; is the server at "
              f"{args.server_addr} serving the synthetic corpus?", file=sys.stderr)
        return 1
    print(f"collected {len(good) + len(mixed)} scripted trajectories and {len(probed)} validation probes in "
          f"{time.monotonic() - started:.1f} s")
    probes = ProbeSet(val_records, probed, tokenizer, search_open=style.search_open) if val_records else None
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
                       check_every=args.check_every,
                       facts=tuple(question_fact(r.question) for r in records) if args.balance_facts else None,
                       focus=FocusRule() if args.focus_stalled_fact else None),
              SFTStage("mix", mixed, args.mix_steps, goal=mix_goal, check_every=max(1, args.mix_steps),
                       wrong_answers=frozenset() if args.train_guessed_facts else wrong_answers(
                           mixed, records * args.trajectories_per_question))]
    config = SFTConfig(batch_size=args.batch_size, lr=args.lr, seed=args.seed, final_stage_decay=args.final_lr_decay)
    probe = random.Random(args.seed).sample(records, min(200, len(records)))
    try:
        log, chances = warm_start(Path(args.model), Path(args.out), stages, config, probe, probes, style)
    except GoalNotReached as exc:
        print(exc, file=sys.stderr)
        return 1
    (Path(args.out) / "sft_losses.json").write_text(json.dumps({
        "config": vars(args), "losses": log.losses, "search_probabilities": chances,
        "stages": [{"name": st.name, "steps": st.steps, "seconds": round(st.seconds, 1),
                    "readings": [{"step": step, **dataclasses.asdict(r)} for step, r in st.readings],
                    "focus_changes": [{"step": step, "change": change} for step, change in st.focus_changes]}
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
