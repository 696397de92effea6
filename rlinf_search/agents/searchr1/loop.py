"""The Search-R1 agent loop: one asyncio task per trajectory, many in flight, token ids throughout.

Each turn generates until ``</search>``, ``</answer>`` or an end token. A search calls the tool and
appends the ``<information>`` observation; an answer ends the rollout; anything else gets a short
corrective observation. ``max_turns`` bounds the tool turns (searches and corrections, as the
reference counts them); after that, one last generation without search: it still stops at
``</search>``, and a search there ends the trajectory (``max_turns``) with no answer. Observation
tokens are appended with ``response_mask`` 0, so they are never trained on, and no observation text
carries a protocol tag, so none can be read as an action; rewards read ``Trajectory.graded_text``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from rlinf_search.agents.searchr1.protocol import (
    INVALID_ACTION_OBSERVATION,
    STOPS,
    Action,
    cut_after_first_stop,
    parse_action,
    strip_protocol_tags,
)
from rlinf_search.data.io_struct import QARecord, ResponseSpan, SamplingParams, Trajectory
from rlinf_search.data.prompt_tokens import PromptTokenizer
from rlinf_search.tools.search.base import SearchOutcome, SearchTool
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.tools.search.observation import format_observation
from rlinf_search.workers.rollout.base import GenerationEngine
from rlinf_search.workers.rollout.router import routed_trajectory
from rlinf_search.workers.rollout.sampling import derive_seed

_INFORMATION_TAIL = "</information>\n\n"

GroupCallback = Callable[[int, list[Trajectory]], Awaitable[None]]
"""``on_group(i, trajectories)``: the samples of the batch's record i, all finished."""


@dataclass(frozen=True)
class AgentLoopConfig:
    """Limits and options of the Search-R1 loop."""

    max_turns: int = 2
    """Tool turns (searches and corrective observations) before the final generation without search."""
    max_tokens_per_turn: int = 500
    """Most tokens generated in one turn."""
    max_obs_tokens: int = 500
    """Most tokens in one observation; longer ones are cut, keeping the closing tag."""
    max_passage_tokens: int = 150
    """Each retrieved passage is cut to this many tokens before formatting."""
    max_response_tokens: int = 2048
    """Most tokens after the prompt (model and observation tokens together)."""
    topk: int = SearchToolConfig.topk
    """Passages per search."""
    retokenize: bool = False
    """Reproduce the reference implementations: decode each turn, cut at the stop tag and re-encode
    it. The ids can then differ from the sampled ones and the engine's log-probs no longer apply."""
    apply_chat_template: bool = True
    """Chat-message prompts go through the tokenizer's chat template; false tokenizes their text as it
    is (the messages' contents joined by blank lines). Text prompts are tokenized as they are either way."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling for every turn (``max_new_tokens`` and ``stop`` are set per turn by the loop)."""
    max_concurrent_trajectories: int = 256
    """Trajectories in flight at once in ``run_batch``."""
    max_prompt_tokens: int | None = None
    """``data.max_prompt_length``: longer prompts are refused or cut as ``truncation`` says; None: no limit."""
    truncation: str = "error"
    """``data.truncation``: ``error`` (refuse an overlong prompt, naming its uid), ``left`` (keep its end)
    or ``right`` (keep its start)."""
    protocol: str = "searchr1"
    """``agent.protocol``: how the model acts, a name in ``rlinf_search.agents.AGENT_PROTOCOLS`` (``searchr1``:
    the ``<search>``/``<answer>`` tags; ``toolcall``: function calling through the chat template) or a dotted
    path to an agent-loop class."""
    tool_schema: dict | None = None
    """``toolcall``: the search tool's OpenAI schema (``tools.search.tool_config``); None: the built-in one."""

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_turn", "max_obs_tokens", "max_passage_tokens", "max_response_tokens",
                     "topk", "max_concurrent_trajectories"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent loop: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_turns < 0:
            raise ValueError(f"agent loop: max_turns must be >= 0, got {self.max_turns}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"agent loop: max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        PromptTokenizer.check_truncation(self.truncation)


def _finish_reason(action_kind: str, engine_finish: str, search_allowed: bool) -> str | None:
    """Why the rollout ends after this turn, or None to continue."""
    if action_kind == "answer":
        return "answer"
    if engine_finish == "eos":
        return "eos"
    if not search_allowed:
        return "max_turns"  # the last generation gave no answer (a search there is not run)
    return None


@dataclass
class _Rollout:
    """A trajectory in progress."""

    traj: Trajectory
    started: float
    seed: int | None = None
    tool_turns: int = 0
    action: Action | None = None
    done: bool = False
    messages: list[dict] | None = None
    """The conversation as chat messages, kept by protocols that measure the template's re-rendering."""


@dataclass
class _Turn:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    drifted: bool
    version: int | None = None
    """The policy version that generated the turn (the engine's ``GenerationOutput.weight_version``)."""


class SearchR1AgentLoop:
    """Runs Search-R1 rollouts against a generation engine and a search tool."""

    stops: tuple[str, ...] = STOPS
    """Stop strings of every turn (a protocol whose turns end at the model's end token has none)."""

    def __init__(self, engine: GenerationEngine, tool: SearchTool, tokenizer, config: AgentLoopConfig):
        self.engine, self.tool, self.tokenizer, self.config = engine, tool, tokenizer, config
        self._information_tail_ids = self._encode(_INFORMATION_TAIL)
        self.prompts = PromptTokenizer(tokenizer, apply_chat_template=config.apply_chat_template,
                                       max_prompt_tokens=config.max_prompt_tokens, truncation=config.truncation)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, record: QARecord) -> list[int]:
        """The prompt's ids (templated, then held to ``max_prompt_tokens`` as ``truncation`` says)."""
        return self.prompts.limited_ids(record)

    async def run_batch(self, records: list[QARecord], samples_per_prompt: int = 1, *,
                        seed: int | None = None, on_group: GroupCallback | None = None) -> list[Trajectory]:
        """Roll out every record ``samples_per_prompt`` times, all concurrently; results in input order.

        ``seed``: every turn of trajectory i samples with its own seed, derived from (seed, i, turn),
        so the batch replays token for token however the engine happens to batch the requests.
        ``on_group(i, trajectories)`` is awaited as soon as all samples of ``records[i]`` are done (a streamed
        step hands each finished GRPO group on while the rest still run); the seeds do not depend on it.
        """
        limit = asyncio.Semaphore(self.config.max_concurrent_trajectories)

        async def bounded(index: int, record: QARecord) -> Trajectory:
            async with limit:
                return await self.run(record, seed=None if seed is None else derive_seed(seed, index))

        async def group(i: int) -> list[Trajectory]:
            first = i * samples_per_prompt
            done = list(await asyncio.gather(*(bounded(first + j, records[i]) for j in range(samples_per_prompt))))
            if on_group is not None:
                await on_group(i, done)
            return done

        groups = await asyncio.gather(*(group(i) for i in range(len(records))))
        return [traj for done in groups for traj in done]

    async def run(self, record: QARecord, *, seed: int | None = None) -> Trajectory:
        """One rollout of one prompt, at its own pace (``seed``: its turns' seeds derive from it)."""
        rollout = self._start(record)
        rollout.seed = seed
        with routed_trajectory():  # engine servers behind a router: every turn goes to the first turn's engine
            while not rollout.done:
                await self._generate_step(rollout)
                if not rollout.done:
                    await self._observe_step(rollout)
        return self._finish(rollout)

    async def run_lockstep(self, records: list[QARecord], samples_per_prompt: int = 1) -> list[Trajectory]:
        """The reference schedule, kept for comparison: every trajectory generates its turn, all wait
        for the slowest, then all searches of the turn go out together, and so on."""
        rollouts = [self._start(r) for r in records for _ in range(samples_per_prompt)]
        while active := [r for r in rollouts if not r.done]:
            await asyncio.gather(*(self._generate_step(r) for r in active))
            await asyncio.gather(*(self._observe_step(r) for r in active if not r.done))
        return [self._finish(r) for r in rollouts]

    def _start(self, record: QARecord) -> _Rollout:
        traj = Trajectory(uid=record.uid, prompt_ids=self.prompt_ids(record), response_ids=[], response_mask=[],
                          rollout_logprobs=[], data_source=record.data_source,
                          golden_answers=list(record.golden_answers))
        return _Rollout(traj=traj, started=time.perf_counter())

    def _finish(self, rollout: _Rollout) -> Trajectory:
        traj = rollout.traj
        traj.response_text = self.tokenizer.decode(traj.response_ids)
        traj.spans = [replace(span, text=self.tokenizer.decode(traj.response_ids[span.start: span.end]))
                      for span in traj.spans]
        traj.graded_text = graded_text(traj.spans)
        traj.total_time_s = time.perf_counter() - rollout.started
        return traj

    async def _generate_step(self, rollout: _Rollout) -> None:
        """Generate one turn; mark the rollout done or leave the action for ``_observe_step``."""
        traj = rollout.traj
        budget = self.config.max_response_tokens - len(traj.response_ids)
        if budget <= 0:
            traj.finish_reason, rollout.done = "max_response_tokens", True
            return
        search_allowed = rollout.tool_turns < self.config.max_turns
        seed = None if rollout.seed is None else derive_seed(rollout.seed, traj.num_turns)
        turn = await self._generate_turn(traj, budget, seed)
        self._append(traj, turn.ids, turn.logprobs, kind="model", version=turn.version)
        traj.drifted = traj.drifted or turn.drifted
        finish = self._read_turn(rollout, turn, search_allowed)
        if finish:
            traj.finish_reason, rollout.done = finish, True

    def _read_turn(self, rollout: _Rollout, turn: _Turn, search_allowed: bool) -> str | None:
        """Set ``rollout.action`` from the turn; the finish reason when the trajectory ends here, else None."""
        rollout.action = parse_action(turn.text)
        return _finish_reason(rollout.action.kind, turn.finish_reason, search_allowed)

    async def _observe_step(self, rollout: _Rollout) -> None:
        """Run the pending action's tool call (or the correction) and append the observation."""
        rollout.tool_turns += 1
        observation = await self._observe(rollout.traj, rollout.action)
        kind = "information" if rollout.action.kind == "search" else "correction"
        self._append_observation(rollout.traj, observation, kind=kind)

    async def _generate_turn(self, traj: Trajectory, budget: int, seed: int | None) -> _Turn:
        sampling = replace(self.config.sampling, max_new_tokens=min(self.config.max_tokens_per_turn, budget),
                           stop=self.stops, seed=seed)
        started = time.perf_counter()
        out = await self.engine.generate(traj.prompt_ids + traj.response_ids, sampling)
        traj.generation_time_s += time.perf_counter() - started
        traj.num_turns += 1
        text = self.tokenizer.decode(out.output_ids, skip_special_tokens=True)
        # What the reference implementations would train on: the decoded turn cut at the stop, re-encoded
        # (an end token the engine stopped on is not text; it is compared apart from it).
        reencoded = self._encode(cut_after_first_stop(text, self.stops))
        sampled = out.output_ids[:-1] if out.finish_reason == "eos" else out.output_ids
        drifted = reencoded != sampled
        if self.config.retokenize:
            return _Turn(reencoded, [math.nan] * len(reencoded), text, out.finish_reason, drifted, out.weight_version)
        return _Turn(out.output_ids, out.logprobs, text, out.finish_reason, drifted, out.weight_version)

    async def _observe(self, traj: Trajectory, action: Action) -> str:
        if action.kind != "search":
            return INVALID_ACTION_OBSERVATION
        started = time.perf_counter()
        outcome = await self.tool.search(action.content, self.config.topk)
        traj.tool_time_s += time.perf_counter() - started
        traj.num_searches += 1
        traj.queries.append(action.content)
        traj.search_errors += outcome.error is not None
        return format_observation(_without_tags(outcome), max_passage_tokens=self.config.max_passage_tokens,
                                  tokenizer=self.tokenizer)

    def _append_observation(self, traj: Trajectory, observation: str, *, kind: str) -> None:
        ids = self._encode(observation)
        if len(ids) > self.config.max_obs_tokens:
            # Keep the closing tag, so the model still sees a well-formed block.
            tail = self._information_tail_ids if observation.endswith(_INFORMATION_TAIL) else []
            ids = ids[: max(self.config.max_obs_tokens - len(tail), 0)] + tail
            ids = ids[: self.config.max_obs_tokens]
        room = self.config.max_response_tokens - len(traj.response_ids)
        self._append(traj, ids[:room], [0.0] * min(len(ids), room), kind=kind)

    @staticmethod
    def _append(traj: Trajectory, ids: list[int], logprobs: list[float], *, kind: str,
                version: int | None = None) -> None:
        """Append one span: ``model`` tokens train (mask 1); observations (``information``,
        ``correction``) do not. ``version``: the policy version that generated a model span."""
        if not ids:
            return
        start = len(traj.response_ids)
        traj.response_ids.extend(ids)
        traj.rollout_logprobs.extend(logprobs)
        traj.response_mask.extend([1 if kind == "model" else 0] * len(ids))
        traj.spans.append(ResponseSpan(kind=kind, start=start, end=len(traj.response_ids), weight_version=version))


def graded_text(spans: list[ResponseSpan]) -> str:
    """The response as rewards read it: the model's spans as it wrote them; each observation with any
    protocol tag taken out of its text (a search result keeps its ``<information>`` wrapper, which the
    format check reads), so only the model's own tags can count as an action or an answer."""
    parts = []
    for span in spans:
        if span.kind == "model":
            parts.append(span.text)
        elif span.kind == "information":
            parts.append(f"\n\n<information>{strip_protocol_tags(span.text).strip()}</information>\n\n")
        else:
            parts.append(strip_protocol_tags(span.text))
    return "".join(parts)


def _without_tags(outcome: SearchOutcome) -> SearchOutcome:
    """``outcome`` with protocol tags taken out of every title, passage and error: a page that happens
    to hold ``<answer>`` must not put an answer into the model's context or the graded text."""
    hits = [replace(hit, title=strip_protocol_tags(hit.title), text=strip_protocol_tags(hit.text))
            for hit in outcome.hits]
    error = None if outcome.error is None else strip_protocol_tags(outcome.error)
    return replace(outcome, hits=hits, error=error)
