"""The warm start's training: stages of scripted trajectories, the loss on their trained tokens, and the loop that
runs each stage until its probe goal holds on validation questions (``toolkits/warmstart_probes.py``).

``toolkits/sft_warmstart.py`` collects the trajectories through the real agent loop and search server and calls
``train_sft``; the benchmarks and tests call it on trajectories of their own.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlinf_search.data.io_struct import Trajectory
from rlinf_search.progress import progress
from toolkits.fact_focus import FactFocus, FocusRule
from toolkits.warmstart_probes import (
    ProbeReading,
    ProbeSet,
    StageGoal,
    decision_position,
    last_turn,
    logits_at,
)


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
    facts: tuple[str, ...] | None = None
    """The kind of fact each trajectory's question asks for (``toolkits.synth_task.question_fact``, in the order of
    ``trajectories``). Given, and with probes, each batch favours the kinds the last probe reading found least
    copied (``fact_weights``): the kinds of fact are learned one after another, mostly in sudden jumps, and a
    kind still at zero while the others are copied would otherwise get a quarter of the batches or less.
    None: every trajectory equally likely."""
    focus: FocusRule | None = None
    """With ``facts`` and probes: a kind of fact that stays uncopied while the others are copied is then trained alone
    for a round (``toolkits/fact_focus.py``). None: the draw by kind throughout."""
    trains_queries: bool = True
    """Train on every model turn. False: on the last one only, the answer written after the passages, with the
    queries masked: reading comprehension, which a pretrained LM brings to the task, without what to search
    for (the distillation benchmark's student: it can copy a fact in front of it, but was never shown a query)."""
    wrong_answers: frozenset[int] = frozenset()
    """Indices (into ``trajectories``) of the ones whose answer is wrong: a scripted guess. Their answer turn is
    trained up to its deciding token only, so the stage teaches how often to answer without searching, not the
    wrong fact: trained on guesses whole, the behaviour mix wore the least-copied kind of fact down (profession on
    toolcall seed 2, 0.66 -> 0.29), as a guessed profession competed with the one in the passage."""


@dataclass(frozen=True)
class SFTConfig:
    """Warm-start optimisation settings (shared by all stages: one optimizer, one lr schedule)."""

    batch_size: int = 16
    """Trajectories per step."""
    lr: float = 1e-3
    """AdamW learning rate. At 3e-3 the skill stage stalled with one or two of the task's four kinds of fact
    copied, on several seeds (docs/history/results.md); 1e-3 with the induction stage learned all four."""
    warmup_steps: int = 30
    """Linear warm-up; a tiny model at full lr from step 0 can diverge on the first batches."""
    seed: int = 0
    """Seed for trajectory order."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay (0.01, torch's default, for the warm start; the offline distillation
    baseline takes the RL actor's, so the two arms differ only in where their trajectories come from)."""
    final_stage_decay: float = 0.9
    """Over the last stage the lr falls linearly by this fraction of itself (0: constant). That stage sets
    how often the model searches; at full lr its last few batches' share of searches would set it."""


def induction_sequences(trajectories: list[Trajectory], count: int, *, seed: int = 0, min_length: int = 16,
                        max_length: int = 48) -> list[Trajectory]:
    """``count`` sequences of tokens drawn at random from the passages' vocabulary, each written twice; the second
    copy is the trained "model turn": a copying task with no facts in it, after the induction-head task of small
    transformer studies. Why it helps here is not established. In 300 steps its own loss falls only from about 6.3
    to 6.1 (the copy is not learned), yet with it before the reading stage, at lr 1e-3, seed 1's skill stage copied
    answers on 0.98 of validation questions after 200 steps, against 0.59 after 1,200 steps without it
    (docs/history/results.md); it may only warm the attention up on passage tokens. Measured, not explained."""
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


def sft_batch(trajectories: list[Trajectory], pad_id: int, *, train_on_observations: bool = False,
           trains_model_turns: bool = True, trains_queries: bool = True,
           untrained_position: int | None = None, decision_only: list[bool] | None = None,
           decision: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, attention and labels; ``untrained_position``: a response position left out of the loss;
    ``decision_only``: per row, train its last turn only up to its token ``decision`` (a wrong answer's turn)."""
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
        if decision_only is not None and decision_only[row]:
            answer = last_turn(traj.response_mask).nonzero().flatten()
            trained[answer[decision + 1:]] = False
        response = torch.tensor(traj.response_ids)
        labels[row, len(traj.prompt_ids): len(seq)] = torch.where(trained, response, torch.tensor(-100))
    return ids, attention, labels


def fact_weights(facts: tuple[str, ...], reading: ProbeReading | None, *, floor: float = 0.1) -> list[float]:
    """A draw weight per trajectory: each kind of fact gets ``floor`` plus the share of its validation answers not
    yet copied (a kind the reading has no figure for counts as not copied at all), split evenly among its
    trajectories. With every kind copied, the draw is uniform again."""
    copied = reading.answer_copy_by_fact if reading is not None else {}
    counts = Counter(facts)
    need = {fact: floor + 1.0 - copied.get(fact, 0.0) for fact in counts}
    return [need[fact] / counts[fact] for fact in facts]


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
    focus_changes: list[tuple[int, str]] = field(default_factory=list)
    """(steps into the stage, what changed) each time a focus round on one kind of fact started or ended."""


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
    targets = labels[:, 1:]
    rows, positions = (targets != -100).nonzero(as_tuple=True)
    logits = logits_at(model, ids, attention, rows, positions)
    return torch.nn.functional.cross_entropy(logits.float(), targets[rows, positions])


def train_sft(model, tokenizer, stages: list[SFTStage], config: SFTConfig, probes: ProbeSet | None = None,
              *, report: Callable[[str], None] = print,
              after_step: Callable[[int, float], None] | None = None, search_open: str = "<search>") -> WarmStartLog:
    """Cross-entropy on the trained tokens, stage after stage; a stage with a goal stops as soon as the probes
    show it (``report`` gets a line per reading) and raises ``GoalNotReached`` at its step cap. ``after_step``
    gets (optimizer steps so far, this step's loss) after every step: checkpoints and evaluations go there.
    ``search_open``: what a search turn opens with in the trajectories' protocol (where the decision token is)."""
    for stage in stages:
        if stage.steps and not stage.trajectories:
            raise ValueError(f"warm-start stage {stage.name!r} has no trajectories")
        if stage.facts is not None and len(stage.facts) != len(stage.trajectories):
            raise ValueError(f"warm-start stage {stage.name!r} has {len(stage.facts)} facts for "
                             f"{len(stage.trajectories)} trajectories")
        if stage.focus is not None and stage.facts is None:
            raise ValueError(f"warm-start stage {stage.name!r} has a focus rule but no facts to focus on")
        if stage.goal is not None and probes is None:
            raise ValueError(f"warm-start stage {stage.name!r} has a goal but no probes were given")
    rng = random.Random(config.seed)

    def fresh_optimizer() -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    optimizer = fresh_optimizer()
    warm_from = 0  # the step the lr warm-up counts from: 0, or where a focus round renewed the optimizer
    model.train()
    log = WarmStartLog(losses=[], stages=[])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    decision = decision_position(tokenizer, search_open)
    running = [stage for stage in stages if stage.steps > 0]
    last_reading = None
    for stage in running:
        record = StageRecord(stage.name, 0, 0.0, [])
        started = time.monotonic()
        final = stage is running[-1]
        # The draw by kind changes only when the probes are read: weights made then, not every step.
        weighted = stage.facts is not None and probes is not None
        weights = fact_weights(stage.facts, last_reading) if weighted else None
        focus = FactFocus(stage.focus) if weighted and stage.focus is not None else None
        wrong = {id(stage.trajectories[i]) for i in stage.wrong_answers}
        for step in (bar := progress(range(stage.steps), desc=f"sft {stage.name}", unit="step")):
            # Warm up, hold, and over the last stage fall linearly (that stage sets how often the model
            # searches; at full lr its last few batches' share of searches would set it).
            lr = config.lr * min(1.0, (len(log.losses) - warm_from + 1) / max(1, config.warmup_steps))
            if final:
                lr *= 1.0 - config.final_stage_decay * step / stage.steps
            for group in optimizer.param_groups:
                group["lr"] = lr
            if weights is not None:
                batch = rng.choices(stage.trajectories, weights, k=min(config.batch_size, len(stage.trajectories)))
            else:
                batch = rng.sample(stage.trajectories, min(config.batch_size, len(stage.trajectories)))
            ids, attention, labels = sft_batch(batch, pad_id, train_on_observations=stage.train_on_observations,
                                               trains_model_turns=stage.trains_model_turns,
                                               trains_queries=stage.trains_queries,
                                               untrained_position=None if stage.trains_decision else decision,
                                               decision_only=[id(t) in wrong for t in batch] if wrong else None,
                                               decision=decision)
            loss = sft_loss(model, ids, attention, labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            log.losses.append(loss.item())
            record.steps = step + 1
            if after_step is not None:
                after_step(len(log.losses), log.losses[-1])
            bar.set_postfix(loss=f"{log.losses[-1]:.3f}")
            if probes is not None and (record.steps % stage.check_every == 0 or record.steps == stage.steps):
                reading = last_reading = probes.read(model)
                record.readings.append((record.steps, reading))
                met = stage.goal is not None and stage.goal.met(reading)
                report(f"sft {stage.name} step {record.steps}: {reading}" + (" (goal met)" if met else ""))
                change = focus.update(record.steps, reading) if focus is not None and not met else None
                if change:
                    report(f"sft {stage.name} step {record.steps}: {change}")
                    record.focus_changes.append((record.steps, change))
                    if stage.focus.fresh_optimizer:
                        optimizer, warm_from = fresh_optimizer(), len(log.losses)
                if weighted:
                    focused = focus is not None and focus.focus is not None
                    weights = focus.weights(stage.facts) if focused else fact_weights(stage.facts, reading)
                if met:
                    break
        record.seconds = time.monotonic() - started
        log.stages.append(record)
        if stage.goal is not None and not stage.goal.met(record.readings[-1][1]):
            raise GoalNotReached(stage, record.readings[-1][1])
    model.eval()
    return log
