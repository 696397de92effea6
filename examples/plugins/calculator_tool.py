"""A tool of your own with settings of its own, named in the config by dotted path: one file, no package edit.

    agent:
      protocol: toolcall
    tools:
      calculate:
        class: examples.plugins.calculator_tool:CalculatorTool
        decimals: 2

The model calls ``calculate`` with an arithmetic expression (``1961 - 1889``) and reads the result, beside
``search``. ``decimals`` and ``max_chars`` are this tool's own keys: start-up validates them with
``CalculatorSettings`` (a value out of range or an unknown key stops the run in one line naming
``tools.calculate.<key>``), and each rollout rank builds the tool from the validated settings (docs/agents.md, "Add
a tool"; ``tests/test_tool_plugin.py``). An expression it cannot compute comes back to the model as one line and is
counted (``calculate/arguments``, ``calculate/math``); the tool never raises on what the model wrote.
"""

from __future__ import annotations

import ast
import math
import operator

from pydantic import BaseModel, ConfigDict, Field

from rlinf_search.agents.tools.base import ToolResult, tool_name
from rlinf_search.plugin_settings import with_settings

CALCULATE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Compute an arithmetic expression: numbers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. 1961 - 1889."}},
            "required": ["expression"],
        },
    },
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
"""The largest power computed, and ``MAX_BITS`` the largest integer kept: without them one short expression
(``9**9**9``) could hold the rank's CPU and memory for as long as the model likes."""
MAX_BITS = 1024


class CalculatorSettings(BaseModel):
    """``tools.calculate``."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    decimals: int = Field(6, ge=0, le=12)
    """Digits after the point a result is rounded to (an integral result is written without them)."""
    max_chars: int = Field(200, ge=1)
    """The longest expression computed; a longer one is refused as the model's error."""


class CalculationError(ValueError):
    """An expression the tool cannot compute; ``kind`` is the ``ToolResult.error`` it counts as."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def evaluate(expression: str) -> float:
    """The value of ``expression``, built only from numbers and arithmetic (no names, no calls)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise CalculationError("not an arithmetic expression", "arguments") from None
    return _value(tree.body)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculationError(f"an exponent above {MAX_EXPONENT} is not computed", "math")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculationError("division by zero", "math") from None
        except OverflowError:
            raise CalculationError("the result is too large", "math") from None
        except TypeError:  # an operation complex numbers lack (a negative number to a fractional power made one)
            raise CalculationError("the result is not a real number", "math") from None
        if isinstance(result, int) and result.bit_length() > MAX_BITS:
            raise CalculationError("the result is too large", "math")
        return result
    raise CalculationError(f"{ast.unparse(node)!r} is not a number or arithmetic", "arguments")


@with_settings(CalculatorSettings)
class CalculatorTool:
    """Arithmetic on the rollout rank itself: no service, nothing to close."""

    schema = CALCULATE_SCHEMA
    name = tool_name(CALCULATE_SCHEMA)
    error_kinds = ("arguments", "math")

    def __init__(self, settings: CalculatorSettings, *, tokenizer=None):
        self.settings = settings

    async def call(self, arguments: dict) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            return ToolResult("Error: calculate needs expression, the arithmetic as a string", error="arguments")
        if len(expression) > self.settings.max_chars:
            return ToolResult(f"Error: the expression is longer than {self.settings.max_chars} characters",
                              error="arguments")
        try:
            value = evaluate(expression.strip())
        except CalculationError as exc:
            return ToolResult(f"Error: {exc}", error=exc.kind)
        if isinstance(value, complex) or not math.isfinite(value):
            return ToolResult("Error: the result is not a finite real number", error="math")
        return ToolResult(self._written(value))

    def _written(self, value: float) -> str:
        rounded = round(float(value), self.settings.decimals)
        return str(int(rounded)) if rounded.is_integer() else f"{rounded:.{self.settings.decimals}f}".rstrip("0")

    async def aclose(self) -> None:
        return None
