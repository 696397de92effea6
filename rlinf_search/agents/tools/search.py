"""The search tool: a search client (``tools/search``) behind a function schema. The Search-R1 protocol calls it
for its ``<search>`` tags, the function-calling protocol by the name the model writes."""

from __future__ import annotations

import asyncio
import json
import time

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.protocol import strip_protocol_tags
from rlinf_search.agents.tools.search_function import ArgumentError, SearchFunction
from rlinf_search.agents.tools.base import ToolResult
from rlinf_search.tools.search.base import SearchOutcome, SearchTool
from rlinf_search.tools.search.observation import (
    NO_RESULTS,
    PassageTokenizer,
    failure_line,
    truncate_passage,
)


class SearchFunctionTool:
    """The search tool: a search client behind a function schema (``query_list`` or ``query`` + ``top_k``)."""

    error_kinds = ("arguments", "backend")

    def __init__(self, client: SearchTool, function: SearchFunction, *, topk: int, max_passage_tokens: int | None,
                 tokenizer: PassageTokenizer | None = None):
        self.client, self.function, self.topk = client, function, topk
        self.max_passage_tokens, self.tokenizer = max_passage_tokens, tokenizer

    @property
    def name(self) -> str:
        return self.function.name

    @property
    def schema(self) -> dict:
        return self.function.schema

    def arguments_for(self, query: str) -> dict:
        """A call's arguments for one query, in this schema's shape (what a ``<search>`` tag stands for)."""
        return self.function.arguments_for(query)

    async def call(self, arguments: dict) -> ToolResult:
        started = time.perf_counter()
        try:
            queries, topk = self.function.queries(arguments, self.topk)
        except ArgumentError as exc:
            return ToolResult(f"Error: {exc}", error="arguments")
        outcomes = await asyncio.gather(*(self.client.search(q, topk) for q in queries))
        blocks = [self.results_text(o) for o in outcomes]
        text = blocks[0] if len(blocks) == 1 else "\n\n".join(
            f"Results for {json.dumps(o.query, ensure_ascii=False)}:\n{b}" for o, b in zip(outcomes, blocks))
        failed = sum(o.error is not None for o in outcomes)
        infra = next((o.error for o in outcomes if o.error is not None and o.infra), None)
        return ToolResult(text, error="backend" if failed else None, searches=list(queries), failed_searches=failed,
                          seconds=time.perf_counter() - started, infra_error=infra)

    def results_text(self, outcome: SearchOutcome) -> str:
        """One query's passages in Search-R1's layout (``Doc n(Title: t) text``), protocol tags taken out of
        every title, passage and error, so a page cannot act or answer for the model."""
        if outcome.error is not None:
            return failure_line(strip_protocol_tags(outcome.error))
        if not outcome.hits:
            return NO_RESULTS
        return "\n".join(
            f"Doc {n}(Title: {strip_protocol_tags(hit.title)}) "
            f"{truncate_passage(strip_protocol_tags(hit.text).strip(), self.max_passage_tokens, self.tokenizer)}"
            for n, hit in enumerate(outcome.hits, start=1))

    async def aclose(self) -> None:
        await self.client.aclose()


def search_tool(client: SearchTool, config: AgentLoopConfig, tokenizer) -> SearchFunctionTool:
    """The search tool over ``client``, with the config's schema (``tool_schema``), passages and truncation."""
    return SearchFunctionTool(client, SearchFunction.from_schema(config.tool_schema), topk=config.topk,
                              max_passage_tokens=config.max_passage_tokens, tokenizer=tokenizer)
