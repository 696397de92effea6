"""The search tool as a function the model calls: its OpenAI tool schema, and how a call's arguments name the
queries to run.

Two argument shapes are understood, the two the systems users come from give their search tools:

- ``query_list``: an array of strings (verl's ``search_tool_config.yaml``, Search-R1-like); each query is
  searched and the results are answered together, one block per query;
- ``query``: one string, with an optional integer ``top_k`` (rllm's ``local_search``).

The schema itself may come from a tool config file (``tools.search.tool_config``, see ``tool_config.py``);
without one the built-in schema below is offered, in our own wording.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

DEFAULT_SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Look facts up in the document collection. Returns the best passages for each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "One or more short, self-contained search queries.",
                },
            },
            "required": ["query_list"],
        },
    },
}
"""The search function offered when no tool config names one (verl's argument shape, our wording)."""


class SchemaError(ValueError):
    """A tool schema this project cannot offer as the search tool; the message says what is wrong."""


class ArgumentError(ValueError):
    """A call's arguments that name no query; the message is what the model reads."""


@dataclass(frozen=True)
class SearchFunction:
    """The search tool's schema, checked once, and the reading of its calls' arguments."""

    schema: dict
    """The OpenAI tool object, ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    max_top_k: int = 50
    """Largest ``top_k`` a ``query``-style call may ask for (rllm's schema caps it at 50)."""

    @classmethod
    def from_schema(cls, schema: dict | None, *, source: str = "the built-in schema") -> SearchFunction:
        """``schema``: a full tool object or only its ``function`` part (both are in use); None: the default.
        Raises ``SchemaError`` naming ``source`` when the schema has no name or no query argument."""
        if schema is None:
            schema = DEFAULT_SEARCH_SCHEMA
        schema = copy.deepcopy(dict(schema))
        if "function" not in schema:
            schema = {"type": "function", "function": schema}
        function = schema["function"]
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise SchemaError(f"{source}: the tool schema needs function.name (a string)")
        properties = function.get("parameters", {}).get("properties", {})
        if "query_list" not in properties and "query" not in properties:
            raise SchemaError(f"{source}: the search function {function['name']!r} must take query_list (array of "
                              f"strings) or query (string); it declares {', '.join(properties) or 'no arguments'}")
        return cls(schema=schema)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def function(self) -> dict:
        """The ``function`` object: what the parser checks required arguments against."""
        return self.schema["function"]

    def arguments_for(self, query: str) -> dict:
        """The arguments of a call for one query in this schema's shape (what a Search-R1 ``<search>`` tag asks)."""
        properties = self.function.get("parameters", {}).get("properties", {})
        return {"query_list": [query]} if "query_list" in properties else {"query": query}

    def queries(self, arguments: dict, default_topk: int) -> tuple[list[str], int]:
        """The queries a call asks for and the passages per query. Raises ``ArgumentError`` with a line the
        model reads when the arguments name no usable query."""
        topk = default_topk
        if "query_list" in arguments:
            value = arguments["query_list"]
            if isinstance(value, str):
                value = [value]  # a lone string where a list belongs: the intent is clear
            if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
                raise ArgumentError(f"{self.name}: query_list must be a list of strings")
            queries = [q.strip() for q in value if q.strip()]
        elif "query" in arguments:
            if not isinstance(arguments["query"], str):
                raise ArgumentError(f"{self.name}: query must be a string")
            queries = [arguments["query"].strip()] if arguments["query"].strip() else []
            if "top_k" in arguments:
                top_k = arguments["top_k"]
                if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= self.max_top_k:
                    raise ArgumentError(f"{self.name}: top_k must be an integer from 1 to {self.max_top_k}")
                topk = top_k
        else:
            raise ArgumentError(f"{self.name} needs query_list (a list of strings) or query (a string)")
        if not queries:
            raise ArgumentError(f"{self.name}: every query was empty")
        return queries, topk
