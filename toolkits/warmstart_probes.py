"""Probes of what a warm start has taught, read on validation questions with one teacher-forced pass.

Each validation question gets the scripted good search (the subject, then the bridge entity, then the gold
answer), run once through the real agent loop and search server. A batched forward pass over those
trajectories then reads three skills off the model's next-token distributions:

- **query copy**: the first query (the subject's name and the closing tag, after the search tag) is the
  model's argmax at every token: it copies the name out of the question;
- **answer copy**: the answer turn is the argmax at every token, among questions whose gold answer is in the
  retrieved passages: it reads the fact out of ``<information>``;
- **P(search)**: the chance of opening the first turn with a search rather than an answer (greedy decoding
  searches where it is above one half).

A stage of the warm start trains until its goal over these readings holds (``StageGoal``).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from rlinf_search.data.io_struct import QARecord, Trajectory
from toolkits.synth_task import question_fact


@dataclass(frozen=True)
class ProbeReading:
    """What the probes read off a model, each over the validation questions."""

    query_copy: float
    """Share of questions whose first query (name and closing tag) is the model's argmax at every token."""
    answer_copy: float
    """Share of questions with the gold answer in the passages whose answer turn is the argmax at every token."""
    search_mean: float
    """Mean first-turn chance of searching (against answering at once)."""
    search_greedy: float
    """Share of questions where that chance is above one half: greedy decoding searches there."""
    answer_copy_by_fact: dict[str, float] = field(default_factory=dict)
    """Answer copy among the questions of each kind of fact (``toolkits.synth_task.QUESTIONS``): a stalled
    answer copy is usually some kinds copied and others not."""

    @property
    def least_fact_copy(self) -> float:
        """Answer copy of the least-copied kind of fact (``answer_copy`` when the kinds are not known): a mean
        over the kinds can pass with one of them far behind, and the behaviour-mix stage erodes the weakest
        kind most (docs/history/results.md, the toolcall seed table)."""
        return min(self.answer_copy_by_fact.values(), default=self.answer_copy)

    def __str__(self) -> str:
        facts = ", ".join(f"{fact} {share:.2f}" for fact, share in sorted(self.answer_copy_by_fact.items()))
        return (f"query copy {self.query_copy:.2f}, answer copy {self.answer_copy:.2f}"
                + (f" ({facts})" if facts else "")
                + f", P(search) mean {self.search_mean:.2f} ({self.search_greedy:.0%} above 1/2)")


@dataclass(frozen=True)
class TrajectoryScores:
    """One teacher-forced pass over one scripted trajectory."""

    answer_copied: bool
    """Every token of the last model turn (the answer) is the model's argmax given what precedes it."""
    query_logprob: float
    """Summed log-prob of the first model turn's tokens after its first (the query and its closing tag)."""
    query_copied: bool
    """Each of those query tokens is the model's argmax given what precedes it."""
    search_chance: float
    """The chance of the search tag's deciding token against the answer tag's, at the first turn."""


def decision_position(tokenizer, search_open: str = "<search>") -> int:
    """Index, in the first turn's ids, of the token that decides between searching (a turn opening with
    ``search_open``: ``<search>``, or ``<tool_call>`` in the toolcall protocol) and answering."""
    search, answer = (tokenizer.encode(tag, add_special_tokens=False) for tag in (search_open, "<answer>"))
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


def logits_at(model, ids: torch.Tensor, attention: torch.Tensor, rows: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """The model's next-token logits at ``(rows, positions)`` of the padded batch ``ids``: the LM head runs on those
    hidden states alone when the model has one of its own, else the model's logits are indexed."""
    head = model.get_output_embeddings()
    body = getattr(model, "base_model", model)
    if head is None or body is model:
        return model(input_ids=ids, attention_mask=attention).logits[rows, positions]
    return head(body(input_ids=ids, attention_mask=attention).last_hidden_state[rows, positions])


@torch.no_grad()
def score_trajectories(model, trajectories: list[Trajectory], tokenizer, *, batch_size: int = 32,
                       pad_id: int = 0, search_open: str = "<search>") -> list[TrajectoryScores]:
    """Teacher-forced scores of scripted good searches (each starting with a search that opens with
    ``search_open``), ``batch_size`` rows a pass (right-padded: a causal model's real tokens never see the padding
    after them). The LM head runs only where a score reads the next token (the decision, the query, the answer):
    about a tenth of the positions, and the head and its softmax over the vocabulary were half a reading's time."""
    search, answer = (tokenizer.encode(tag, add_special_tokens=False) for tag in (search_open, "<answer>"))
    decision = decision_position(tokenizer, search_open)
    scores = []
    for start in range(0, len(trajectories), batch_size):
        chunk = trajectories[start: start + batch_size]
        sequences = [t.prompt_ids + t.response_ids for t in chunk]
        width = max(len(s) for s in sequences)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
        # Per row, the positions whose next token a score reads: the decision, the query's tokens, the answer's.
        read = []
        for traj in chunk:
            offset = len(traj.prompt_ids)
            read.append((torch.tensor([offset + decision]),
                         first_turn(traj.response_mask).nonzero().flatten()[1:] + offset,
                         last_turn(traj.response_mask).nonzero().flatten() + offset))
        rows = torch.cat([torch.full((sum(len(p) for p in parts),), row) for row, parts in enumerate(read)])
        targets = torch.cat([torch.cat(parts) for parts in read])
        logprobs = torch.log_softmax(logits_at(model, ids, attention, rows, targets - 1).float(), dim=-1)
        copied = logprobs.argmax(-1) == ids[rows, targets]
        at = 0
        for _, query_at, answer_at in read:
            decide = logprobs[at, [search[decision], answer[decision]]].exp()
            query = slice(at + 1, at + 1 + len(query_at))
            answer_turn = slice(query.stop, query.stop + len(answer_at))
            scores.append(TrajectoryScores(
                answer_copied=bool(copied[answer_turn].all()),
                query_logprob=float(logprobs[query].gather(1, ids[rows[query], targets[query]][:, None]).sum()),
                query_copied=bool(copied[query].all()),
                search_chance=float(decide[0] / decide.sum())))
            at = answer_turn.stop
    return scores


def gold_in_passages(trajectory: Trajectory, record: QARecord, tokenizer) -> bool:
    """Whether a gold answer appears in the response before its answer turn (the retrieved passages)."""
    before = tokenizer.decode(trajectory.response_ids).split("<answer>")[0]
    return any(gold in before for gold in record.golden_answers)


def answer_copy_by_fact(scores: list[TrajectoryScores], found: list[bool], facts: list[str]) -> dict[str, float]:
    """The share of answers copied among each kind of fact's questions whose gold answer was retrieved."""
    by_fact = defaultdict(list)
    for score, retrieved, fact in zip(scores, found, facts, strict=True):
        if retrieved:
            by_fact[fact].append(score.answer_copied)
    return {fact: sum(copied) / len(copied) for fact, copied in by_fact.items()}


class ProbeSet:
    """Scripted good searches on validation questions, collected once, read against any model that shares
    their tokenizer."""

    def __init__(self, records: list[QARecord], trajectories: list[Trajectory], tokenizer, *,
                 search_open: str = "<search>"):
        if not trajectories:
            raise ValueError("the warm-start probes need at least one validation question")
        self.trajectories, self.tokenizer, self.search_open = trajectories, tokenizer, search_open
        self.found = [gold_in_passages(t, r, tokenizer) for t, r in zip(trajectories, records)]
        self.facts = [question_fact(r.question) for r in records]
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def read(self, model) -> ProbeReading:
        was_training = model.training
        model.eval()
        scores = score_trajectories(model, self.trajectories, self.tokenizer, pad_id=self.pad_id,
                                    search_open=self.search_open)
        model.train(was_training)
        chances = [s.search_chance for s in scores]
        answerable = [s for s, f in zip(scores, self.found) if f]
        return ProbeReading(
            query_copy=sum(s.query_copied for s in scores) / len(scores),
            answer_copy=sum(s.answer_copied for s in answerable) / max(1, len(answerable)),
            search_mean=sum(chances) / len(chances),
            search_greedy=sum(c > 0.5 for c in chances) / len(chances),
            answer_copy_by_fact=answer_copy_by_fact(scores, self.found, self.facts))


_COMPARE = {">=": operator.ge, "<=": operator.le}
PROBES = (*ProbeReading.__dataclass_fields__, "least_fact_copy")
"""What a ``Bound`` may read: the fields of ``ProbeReading`` and the readings made from them."""


@dataclass(frozen=True)
class Bound:
    """One condition on a probe reading, such as ``answer_copy >= 0.8``."""

    probe: str
    """A field of ``ProbeReading`` or one of its readings (``PROBES``)."""
    op: str
    """``>=`` or ``<=``."""
    value: float
    """The threshold."""

    def __post_init__(self) -> None:
        if self.probe not in PROBES:
            raise ValueError(f"unknown probe {self.probe!r}; one of {', '.join(PROBES)}")
        if self.op not in _COMPARE:
            raise ValueError(f"unknown comparison {self.op!r}; one of {', '.join(_COMPARE)}")

    def holds(self, reading: ProbeReading) -> bool:
        return _COMPARE[self.op](getattr(reading, self.probe), self.value)

    def __str__(self) -> str:
        return f"{self.probe.replace('_', ' ')} {self.op} {self.value:g}"


@dataclass(frozen=True)
class StageGoal:
    """What a warm-start stage is for: every bound holds on the validation questions."""

    bounds: tuple[Bound, ...]
    """All must hold."""

    def met(self, reading: ProbeReading) -> bool:
        return all(bound.holds(reading) for bound in self.bounds)

    def __str__(self) -> str:
        return ", ".join(str(bound) for bound in self.bounds)
