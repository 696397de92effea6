"""The agent loop every protocol shares: one asyncio task per trajectory, many in flight, token ids throughout.

A protocol (``searchr1``, ``toolcall``, a user's dotted path) subclasses ``AgentLoop`` and says what is its own:
where a turn stops (``stops``), what a turn asked for and whether the trajectory ends there (``read_turn``),
and the observation that answers it (``observe_step``). The base runs the turns; keeps the budgets (tool turns,
tokens per turn, the response); derives every request's seed from the batch's; masks observations out of the
loss; records the policy version of each model turn; measures re-tokenization drift; and decodes the spans when
a trajectory ends. Nothing here knows a tag, a template or a tool.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.engine import GenerationEngine, derive_seed, routed_trajectory
from rlinf_search.agents.tools import as_tools, build_tools
from rlinf_search.data.io_struct import QARecord, ResponseSpan, Trajectory
from rlinf_search.data.prompt_tokens import PromptTokenizer

GroupCallback = Callable[[int, list[Trajectory]], Awaitable[None]]
"""``on_group(i, trajectories)``: the samples of the batch's record i, all finished."""


@dataclass
class RolloutState:
    """A trajectory in progress."""

    traj: Trajectory
    """What has been generated and observed so far."""
    started: float
    """``time.perf_counter()`` when it started."""
    seed: int | None = None
    """Its turns' seeds derive from this (None: the engine's own generator)."""
    tool_turns: int = 0
    """Observations appended so far (tool results and corrections)."""
    action: Any = None
    """What the last turn asked for, in the protocol's own terms (set by ``read_turn``)."""
    done: bool = False
    """No more turns."""
    messages: list[dict] | None = None
    """The conversation as chat messages, kept by protocols that measure the template's re-rendering."""


@dataclass
class ModelTurn:
    """One generation call's result, as the trajectory keeps it."""

    ids: list[int]
    """The turn's ids (the sampled ones; re-encoded text with ``retokenize``)."""
    logprobs: list[float]
    """The engine's log-prob of each id (NaN where the ids were re-encoded)."""
    text: str
    """The turn decoded (special tokens skipped)."""
    finish_reason: str
    """The engine's: ``stop``, ``eos`` or ``length``."""
    drifted: bool
    """Re-encoding the text cut at the first stop would give other ids than the sampled ones."""
    version: int | None = None
    """The oldest policy version that sampled the turn (the engine's ``GenerationOutput.weight_version``)."""
    versions: list[int] | None = None
    """The version that sampled each id (``GenerationOutput.token_versions``); None: not counted."""


def cut_after_first_stop(text: str, stops: tuple[str, ...]) -> str:
    """The reference implementations' cut: keep text up to and including the earliest stop string."""
    ends = [text.index(stop) + len(stop) for stop in stops if stop in text]
    return text[: min(ends)] if ends else text


class AgentLoop:
    """Runs rollouts of one protocol against a generation engine and the tools (a subclass per protocol)."""

    stops: tuple[str, ...] = ()
    """Stop strings of every turn (a protocol whose turns end at the model's end token has none)."""

    def __init__(self, engine: GenerationEngine, tools, tokenizer, config: AgentLoopConfig):
        """``tools``: the tools by name (``agents.tools.Tool``) the protocol may call, or a lone search client (it
        becomes the search tool)."""
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self._owned = build_tools(config, tokenizer)
        """The tools ``config.tools`` names beside search: built here, closed by ``aclose``."""
        self.tools = {**as_tools(tools, config, tokenizer), **self._owned}
        self.prompts = PromptTokenizer(tokenizer, apply_chat_template=config.apply_chat_template,
                                       max_prompt_tokens=config.max_prompt_tokens, truncation=config.truncation)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def aclose(self) -> None:
        """Close the tools this loop built (the caller's search client stays the caller's)."""
        for tool in self._owned.values():
            await tool.aclose()

    def prompt_ids(self, record: QARecord) -> list[int]:
        """The prompt's ids (templated, then held to ``max_prompt_tokens`` as ``truncation`` says)."""
        return self.prompts.limited_ids(record)

    # ---- running trajectories ---------------------------------------------------------------------
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
            # A service failure is not the model's doing: roll the whole group out again (the same seeds), after a
            # wait that doubles, so its samples share one baseline; still failing, it goes on marked and is dropped.
            reruns = 0
            while any(t.infra_error for t in done) and reruns < self.config.infra_reruns:
                await asyncio.sleep(self.config.infra_rerun_wait_s * 2 ** reruns)
                reruns += 1
                done = list(await asyncio.gather(*(bounded(first + j, records[i]) for j in range(samples_per_prompt))))
            for traj in done:
                traj.infra_reruns = reruns
            if on_group is not None:
                await on_group(i, done)
            return done

        groups = await asyncio.gather(*(group(i) for i in range(len(records))))
        return [traj for done in groups for traj in done]

    async def run(self, record: QARecord, *, seed: int | None = None) -> Trajectory:
        """One rollout of one prompt, at its own pace (``seed``: its turns' seeds derive from it)."""
        rollout = self.start(record)
        rollout.seed = seed
        with routed_trajectory():  # engine servers behind a router: every turn goes to the first turn's engine
            while not rollout.done:
                await self.generate_step(rollout)
                if not rollout.done:
                    await self.observe_step(rollout)
                    self.end_on_infra_error(rollout)
        return self.finish(rollout)

    async def run_lockstep(self, records: list[QARecord], samples_per_prompt: int = 1) -> list[Trajectory]:
        """The reference schedule, kept for comparison: every trajectory generates its turn, all wait
        for the slowest, then all tool calls of the turn go out together, and so on."""
        rollouts = [self.start(r) for r in records for _ in range(samples_per_prompt)]
        while active := [r for r in rollouts if not r.done]:
            await asyncio.gather(*(self.generate_step(r) for r in active))
            observing = [r for r in active if not r.done]
            await asyncio.gather(*(self.observe_step(r) for r in observing))
            for r in observing:
                self.end_on_infra_error(r)
        return [self.finish(r) for r in rollouts]

    # ---- what a protocol decides ------------------------------------------------------------------
    def read_turn(self, rollout: RolloutState, turn: ModelTurn, tools_allowed: bool) -> str | None:
        """Set ``rollout.action`` from the turn; return the finish reason when the trajectory ends here, else None
        (``tools_allowed``: fewer than ``max_turns`` observations so far)."""
        raise NotImplementedError

    async def observe_step(self, rollout: RolloutState) -> None:
        """Answer ``rollout.action``: run its tool calls (or the correction) and append the observation
        (``append_observation``)."""
        raise NotImplementedError

    async def call_tool(self, traj: Trajectory, name: str, arguments: dict):
        """Run one call of the tool ``name`` and count it on ``traj`` (calls and errors per tool; searches, queries
        and failed searches for the Search-R1 metrics; tool time). Returns its ``ToolResult``."""
        result = await self.tools[name].call(arguments)
        traj.tool_time_s += result.seconds
        traj.tool_calls[name] = traj.tool_calls.get(name, 0) + 1
        if result.error is not None:
            key = f"{name}/{result.error}"
            traj.tool_errors[key] = traj.tool_errors.get(key, 0) + 1
        traj.num_searches += len(result.searches)
        traj.queries.extend(result.searches)
        traj.search_errors += result.failed_searches
        if result.infra_error is not None and traj.infra_error is None:
            traj.infra_error = result.infra_error
        return result

    @staticmethod
    def end_on_infra_error(rollout: RolloutState) -> None:
        """A trajectory whose tool failed for an infrastructure reason will not be trained: generating more of it
        would only spend the engine."""
        if rollout.traj.infra_error is not None and not rollout.done:
            rollout.traj.finish_reason, rollout.done = "infra_error", True

    def graded_text(self, traj: Trajectory) -> str:
        """What rewards read: the model's own spans by default (a protocol adds its observations as it shows
        them)."""
        return "".join(span.text for span in traj.spans if span.kind == "model")

    # ---- the turn machinery ----------------------------------------------------------------------
    def start(self, record: QARecord) -> RolloutState:
        traj = Trajectory(uid=record.uid, prompt_ids=self.prompt_ids(record), response_ids=[], response_mask=[],
                          rollout_logprobs=[], data_source=record.data_source,
                          golden_answers=list(record.golden_answers))
        return RolloutState(traj=traj, started=time.perf_counter())

    def finish(self, rollout: RolloutState) -> Trajectory:
        traj = rollout.traj
        traj.response_text = self.tokenizer.decode(traj.response_ids)
        traj.spans = [replace(span, text=self.tokenizer.decode(traj.response_ids[span.start: span.end]))
                      for span in traj.spans]
        traj.graded_text = self.graded_text(traj)
        traj.total_time_s = time.perf_counter() - rollout.started
        return traj

    async def generate_step(self, rollout: RolloutState) -> None:
        """Generate one turn; mark the rollout done or leave the action for ``observe_step``."""
        traj = rollout.traj
        budget = self.config.max_response_tokens - len(traj.response_ids)
        if budget <= 0:
            traj.finish_reason, rollout.done = "max_response_tokens", True
            return
        tools_allowed = rollout.tool_turns < self.config.max_turns
        seed = None if rollout.seed is None else derive_seed(rollout.seed, traj.num_turns)
        turn = await self.generate_turn(traj, budget, seed)
        self.append(traj, turn.ids, turn.logprobs, kind="model", version=turn.version, versions=turn.versions)
        traj.drifted = traj.drifted or turn.drifted
        finish = self.read_turn(rollout, turn, tools_allowed)
        if finish:
            traj.finish_reason, rollout.done = finish, True

    async def generate_turn(self, traj: Trajectory, budget: int, seed: int | None) -> ModelTurn:
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
        if self.config.retokenize:  # re-encoded ids have no sampling version of their own: the turn's oldest
            return ModelTurn(reencoded, [math.nan] * len(reencoded), text, out.finish_reason, drifted,
                             out.weight_version)
        return ModelTurn(out.output_ids, out.logprobs, text, out.finish_reason, drifted, out.weight_version,
                         out.token_versions)

    def append_observation(self, traj: Trajectory, ids: list[int], *, kind: str) -> None:
        """Append an observation's ids (masked), cut to the response budget left."""
        room = self.config.max_response_tokens - len(traj.response_ids)
        self.append(traj, ids[:room], [0.0] * min(len(ids), room), kind=kind)

    @staticmethod
    def append(traj: Trajectory, ids: list[int], logprobs: list[float], *, kind: str,
               version: int | None = None, versions: list[int] | None = None) -> None:
        """Append one span: ``model`` tokens train (mask 1); observations do not. ``version``: the oldest policy
        version that sampled a model span; ``versions``: each token's (else every token is ``version``'s)."""
        if not ids:
            return
        start = len(traj.response_ids)
        traj.response_ids.extend(ids)
        traj.rollout_logprobs.extend(logprobs)
        if versions is None or len(versions) != len(ids):
            versions = [-1 if version is None else version] * len(ids)
        traj.token_versions.extend(versions)
        traj.response_mask.extend([1 if kind == "model" else 0] * len(ids))
        traj.spans.append(ResponseSpan(kind=kind, start=start, end=len(traj.response_ids), weight_version=version))
