"""The Search-R1 action protocol: tags, stop strings, parsing a model turn, the corrective observation."""

from __future__ import annotations

import re
from dataclasses import dataclass

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Stop at the closing tag in the engine, or the model keeps writing past its query and those
# tokens (an imagined <information> block, say) get trained on.
# The last turn (after ``max_turns``) stops at ``</search>`` too: a search there ends the trajectory
# without an answer, and nothing the model would write after it (its own <information>, an answer
# copied from that) is generated, trained on or graded.
STOPS = (SEARCH_CLOSE, ANSWER_CLOSE)

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

# Our wording; shown as an observation (masked out of the loss) after a turn with no valid action.
# It names the tags without writing them: an observation that held "<answer> and </answer>" would be
# read as an answer (" and ") by anything that parses the whole response.
INVALID_ACTION_OBSERVATION = (
    "\nThat turn had no valid action. To search, put the query between the search tags; to finish, "
    "put the final answer between the answer tags, as the instructions show.\n"
)

# Any protocol tag, opening or closing; observation text never carries one (see ``strip_protocol_tags``).
PROTOCOL_TAG = re.compile(r"</?\s*(?:think|search|information|answer)\s*>", re.IGNORECASE)


def strip_protocol_tags(text: str) -> str:
    """``text`` with every protocol tag removed, so text the model did not write can never be read as
    one of its actions or answers."""
    return PROTOCOL_TAG.sub(" ", text)


@dataclass(frozen=True)
class Action:
    """What one model turn asked for."""

    kind: str
    """``search``, ``answer`` or ``invalid``."""
    content: str = ""
    """The query or the answer, stripped; empty for ``invalid``."""


def parse_action(turn_text: str) -> Action:
    """Read the first complete ``<search>`` or ``<answer>`` element of one turn's text.

    An empty query is invalid (it would waste a search); an empty answer is still an answer
    (the reward scores it 0).
    """
    match = _ACTION.search(turn_text)
    if match is None:
        return Action("invalid")
    kind, content = match.group(1), match.group(2).strip()
    if kind == "search" and not content:
        return Action("invalid")
    return Action(kind, content)


def cut_after_first_stop(text: str, stops: tuple[str, ...]) -> str:
    """The reference implementations' cut: keep text up to and including the earliest stop string."""
    ends = [text.index(stop) + len(stop) for stop in stops if stop in text]
    return text[: min(ends)] if ends else text
