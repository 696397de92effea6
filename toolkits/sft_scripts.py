"""Scripted behaviours for the warm start: good searches mixed with the flaws RL should remove.

Each prepared synthetic record carries ``extra.subject`` (the person asked about) and, for two-hop
questions, ``extra.bridge`` (the city between the person and the country). A script is the list of
model turns of one trajectory; the agent loop and the real search tool fill in the observations.

Behaviours, drawn per trajectory:
- ``search``: search the subject's name, (two-hop: then the city read from the first result) and
  copy the answer out of the ``<information>`` block; in ``toolcall`` each query keeps a leading space inside its
  JSON string (``TurnStyle.for_protocol`` says why). The only behaviour that earns reward reliably.
- ``guess``: answer at once with a plausible answer of the right kind (another record's gold).
- ``bad_query``: search something useless (the question's kind of answer, not the name), then guess.

The turns are written in the run's agent protocol (``TurnStyle``): Search-R1's tags, or a ``<tool_call>`` to the
search function ended by the model's end token (``agent.protocol: toolcall``); the answer is ``<answer>`` in both.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass

from rlinf_search.data.io_struct import QARecord


@dataclass(frozen=True)
class TurnStyle:
    """How a scripted model turn is written in one agent protocol."""

    protocol: str
    """``agent.protocol``: ``searchr1`` or ``toolcall``."""
    search_open: str
    """What a search turn opens with; the first token where it and ``<answer>`` part is the model's decision."""
    end: str = ""
    """Appended to every turn: the model's end token in ``toolcall``, where a turn ends at that token."""
    person_query: str = "{}"
    """A good search's first query, made from the subject's name."""
    place_query: str = "{}"
    """A two-hop question's second query, made from the city read in the first result."""

    @classmethod
    def for_protocol(cls, protocol: str, tokenizer) -> TurnStyle:
        if protocol == "searchr1":
            return cls("searchr1", "<search>")
        if protocol == "toolcall":
            # Inside a JSON string a name has no space before it, and a byte-level BPE spells a word without its
            # leading space with other tokens (" Zal" is one token, "Zal" two), so copying the name from the question
            # would mean learning a second spelling of every name: query copy stalled near 0.7 for hundreds of steps
            # (docs/history/results.md). The scripted query keeps the space ("query_list": [" Fein Fo"]), so the name is in
            # the question's own tokens; the search tool strips it. A fixed first word instead ("who is Fein Fo") did
            # worse: its tokens recur in the prompt ("... you need is missing"), where the copying heads latch on.
            return cls("toolcall", "<tool_call>", tokenizer.eos_token, person_query=" {}", place_query=" {}")
        raise ValueError(f"scripted warm starts speak searchr1 or toolcall, not {protocol!r}")

    def search(self, query: str) -> str:
        if self.protocol == "toolcall":
            # As the chat template renders a call of the built-in search schema, so a re-render matches.
            call = json.dumps({"name": "search", "arguments": {"query_list": [query]}}, ensure_ascii=False)
            return f"<tool_call>\n{call}\n</tool_call>{self.end}"
        return f"<search> {query} </search>"

    def answer(self, text: str) -> str:
        return f"<answer> {text} </answer>{self.end}"


SEARCHR1_TURNS = TurnStyle("searchr1", "<search>")
"""Search-R1's tags: the demo's and the tests' default."""


@dataclass(frozen=True)
class BehaviourMix:
    """Shares of the scripted behaviours; the rest of the trajectories are ``guess``."""

    search: float = 0.2
    """Good searches that copy the answer. With the bad queries, a quarter of the trajectories search:
    the warm-started model's greedy choice is to guess, by a margin rounding cannot flip (at 0.3 + 0.1 its
    chance of searching first landed at 0.48 on one seed, a hair from greedy searching), so held-out EM
    starts low and rises only if RL makes searching the likelier first move."""
    bad_query: float = 0.05
    """Searches with a useless query followed by a guess."""

    def __post_init__(self) -> None:
        if not (0 <= self.search and 0 <= self.bad_query and self.search + self.bad_query <= 1):
            raise ValueError(f"behaviour shares must be >= 0 and sum to <= 1, got search={self.search}, "
                             f"bad_query={self.bad_query}")


def question_kind(record: QARecord) -> str:
    """The question with its subject blanked: ``Where was {} born?``; questions of one kind share answers."""
    subject = record.extra.get("subject")
    if not subject:
        raise ValueError(f"record {record.uid}: no extra.subject; warm-start scripts need synthetic records "
                         f"(python toolkits/synth_task.py, then rlinf_search.data.prepare)")
    return record.question.replace(subject, "{}")


class SyntheticScripts:
    """Builds one scripted trajectory per record, following a :class:`BehaviourMix`."""

    def __init__(self, records: list[QARecord], mix: BehaviourMix, style: TurnStyle = SEARCHR1_TURNS):
        self.mix, self.style = mix, style
        # Guesses come from the answers of other questions of the same kind, so a guess is well formed
        # and plausible (a city for "where", a profession for "what was the profession") but rarely right.
        self.answers_by_kind: dict[str, list[str]] = defaultdict(list)
        for record in records:
            self.answers_by_kind[question_kind(record)].append(record.golden_answers[0])

    def __call__(self, record: QARecord, rng: random.Random) -> list[str]:
        draw = rng.random()
        guess = self.style.answer(rng.choice(self.answers_by_kind[question_kind(record)]))
        if draw < self.mix.search:
            return self.good_search(record)
        if draw < self.mix.search + self.mix.bad_query:
            useless = rng.choice(self.answers_by_kind[question_kind(record)])
            return [self.style.search(useless), guess]
        return [guess]

    def good_search(self, record: QARecord) -> list[str]:
        turns = [self.style.search(self.style.person_query.format(record.extra["subject"]))]
        if record.extra.get("bridge"):
            turns.append(self.style.search(self.style.place_query.format(record.extra["bridge"])))
        return [*turns, self.style.answer(record.golden_answers[0])]
