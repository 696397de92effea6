"""Every config key's default is written once: as the field default of the typed view it fills.

The test walks the reader calls of ``rlinf_search/config/`` (``get_int(raw, "runner.max_steps",
RunnerConfig.max_steps)``) and fails on a literal default (a second copy of the value), on one key read
with two different defaults in the same kind of run, on a read of a key the schema does not accept, and
on a schema key nothing reads. Sections read whole into a view (``schema.VIEW_SECTIONS``) are read by their
fields' declarations, defaults included. It then checks docs/config.md's default column against the same values.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

import rlinf_search.config as config_package
from rlinf_search.config.eval import EVAL_SCHEMA
from rlinf_search.key_declarations import PRECISIONS
from rlinf_search.config.schema import SCHEMA, VIEW_SECTIONS
from rlinf_search.key_declarations import field_defaults, field_keys
from rlinf_search.workers.actor.megatron.config import MODEL_KEYS as MEGATRON_MODEL_KEYS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(config_package.__file__).parent
DOC = ROOT / "docs" / "config.md"
READERS = {"get", "get_int", "get_float", "get_bool", "get_precision", "get_registered", "get_section", "data_paths"}
# The eval reads some keys with its own defaults (one sample per question, the name "eval").
EVAL_MODULES = {"eval.py"}


class Read:
    """One reader call: the key it reads, its default expression, where it is."""

    def __init__(self, reader: str, module: str, line: int, key: str | None, default: ast.expr | None):
        self.reader, self.module, self.line, self.key, self.default = reader, module, line, key, default

    @property
    def where(self) -> str:
        return f"config/{self.module}:{self.line}"

    @property
    def kind(self) -> str:
        return "eval" if self.module in EVAL_MODULES else "train"


def _reads() -> list[Read]:
    reads = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS):
                continue
            if len(node.args) < 2 or not (isinstance(node.args[0], ast.Name) and node.args[0].id == "raw"):
                continue  # not a read of the raw config (e.g. the readers' own definitions)
            key_node = node.args[1]
            key = key_node.value if isinstance(key_node, ast.Constant) and isinstance(key_node.value, str) else None
            default = node.args[2] if len(node.args) > 2 else next(
                (kw.value for kw in node.keywords if kw.arg == "default"), None)
            reads.append(Read(node.func.id, path.name, node.lineno, key, default))
    return reads


def _literals(node: ast.expr | None) -> list[str]:
    """The literal values in a default expression that would be a second copy of a key's default.

    None (no default) and empty containers (nothing given) are not values; a field reference, a name
    computed from other keys, ``not X`` or ``A if c else B`` over those are fine."""
    if node is None:
        return []
    if isinstance(node, ast.Constant):
        return [] if node.value is None else [repr(node.value)]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [ast.unparse(node)] if node.elts else []
    if isinstance(node, ast.Dict):
        return [ast.unparse(node)] if node.keys else []
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    if isinstance(node, ast.UnaryOp):
        return _literals(node.operand)
    return []


def _schema_node(schema: dict, key: str):
    node = schema
    for part in key.split("."):
        if node == "*":
            return node  # an open section: its checker names its keys
        if not isinstance(node, dict) or part not in node:
            return KeyError
        node = node[part]
    return node


def _leaves(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, sub in schema.items():
        keys += _leaves(sub, f"{prefix}{name}.") if isinstance(sub, dict) else [f"{prefix}{name}"]
    return keys


READS = _reads()
VIEW_KEYS = {f"{section}.{path}".lstrip("."): cls for section, cls in VIEW_SECTIONS
             for path, _ in field_keys(cls)}
"""The keys the view sections' fields declare, each read by ``from_section``."""


def test_the_walk_finds_the_readers():
    assert len(READS) > 60, f"only {len(READS)} reader calls found in {PACKAGE}: did the readers' names change?"
    assert len(VIEW_KEYS) > 50, f"only {len(VIEW_KEYS)} keys declared by the views: did VIEW_SECTIONS shrink?"


def test_no_default_is_a_second_literal():
    offenders = [f"{read.where}: {read.key or '<computed key>'} defaults to {', '.join(_literals(read.default))}"
                 for read in READS if _literals(read.default)]
    assert not offenders, ("defaults written as literals; hand the reader the typed view's field default "
                           f"(e.g. RunnerConfig.max_steps) instead: {offenders}")


def test_each_key_has_one_default_per_kind_of_run():
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for read in READS:
        if read.key is None:
            continue
        if read.default is None:
            continue  # a presence check (``if get(raw, key) is None``), not a default
        text = ast.unparse(read.default)
        seen.setdefault((read.kind, read.key), {})[text] = read.where
    twice = {f"{kind} {key}": defaults for (kind, key), defaults in seen.items() if len(defaults) > 1}
    assert not twice, f"keys read with different defaults: {twice}"


def test_every_key_read_is_accepted_by_its_schema():
    unknown = [f"{read.where}: {read.key}" for read in READS if read.key is not None
               and _schema_node(EVAL_SCHEMA if read.kind == "eval" else SCHEMA, read.key) is KeyError]
    assert not unknown, f"reads of keys the schema rejects (dead reads or typos): {unknown}"


def test_every_schema_key_is_read():
    """A key the schema accepts but no reader reads would be a setting that silently does nothing. Keys
    of a section read whole into a dataclass (``get_section`` into ``OptimConfig``) and the Megatron keys
    that ``megatron_config_from_actor`` reads count as read; so does a key declared with one choice
    (``reward.reward_type: searchr1``): it states what this trainer does and refuses anything else."""
    read_keys = {read.key for read in READS if read.key is not None}
    whole = {read.key for read in READS if read.key is not None and read.reader == "get_section"}
    megatron = {f"actor.model.{key}" for key in MEGATRON_MODEL_KEYS}

    def covered(key: str) -> bool:
        parts = key.split(".")
        declared = _schema_node(SCHEMA, key)
        if len(getattr(declared, "choices", ())) == 1:
            return True
        return (key in read_keys or key in VIEW_KEYS or key in megatron or key.startswith("actor.megatron.")
                or any(".".join(parts[:n]) in whole for n in range(1, len(parts))))

    unread = [key for key in _leaves(SCHEMA) if _schema_node(SCHEMA, key) != "*" and not covered(key)]
    assert not unread, f"schema keys nothing in rlinf_search/config reads: {unread}"


def _default_values() -> dict[str, object]:
    """Each training key's default as a value, where the default is a field of a typed view (computed
    defaults such as ``<output_dir>/logs`` are documented in words)."""
    namespaces = {}
    for path in PACKAGE.glob("*.py"):
        module = __import__(f"rlinf_search.config.{path.stem}", fromlist=["_"])
        namespaces[path.name] = vars(module)
    values = {}
    for read in READS:
        if read.key is None or read.kind != "train" or read.default is None:
            continue
        node = read.default.operand if isinstance(read.default, ast.UnaryOp) else read.default
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id[0].isupper()):
            continue  # not a field of a view class: a value computed from other keys
        values[read.key] = eval(compile(ast.Expression(read.default), read.where, "eval"),  # noqa: S307
                                dict(namespaces[read.module]))
    for section, cls in VIEW_SECTIONS:
        for name, default, words in field_defaults(cls):
            if default is not dataclasses.MISSING:
                key = f"{section}.{name}".lstrip(".")
                values[key] = default if words is None else _as_value(words, key)
    return values


def _documented_defaults() -> dict[str, str]:
    defaults = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) >= 3 and re.fullmatch(r"`[\w.]+`", cells[0]):
            defaults[cells[0].strip("`")] = cells[2]
    return defaults


def _as_value(cell: str, key: str):
    text = cell.replace("`", "").strip()
    value = yaml.safe_load(text)
    if key.endswith("precision") and value in PRECISIONS:
        value = PRECISIONS[value]
    return value


DEFAULTS = _default_values()


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_docs_state_the_default_the_code_uses(key):
    documented = _documented_defaults()
    assert key in documented, f"docs/config.md has no row for {key}"
    code = DEFAULTS[key]
    code = list(code) if isinstance(code, tuple) else code
    if key.endswith("precision") and code in PRECISIONS:
        code = PRECISIONS[code]
    assert _as_value(documented[key], key) == code, \
        f"docs/config.md: {key} default {documented[key]!r}, the code's is {code!r}"


def test_every_typed_read_is_of_a_key_declared_with_that_type():
    """``get_int``, ``get_float`` and ``get_bool`` convert, and leave the type check to the key's declaration
    (``check_values`` runs before any reader): so each key they read must be declared with their type."""
    from rlinf_search.config.schema import declarations

    declared = declarations()
    wanted = {"get_int": ("int",), "get_float": ("float", "int"), "get_bool": ("bool",)}
    wrong = [f"{read.where}: {read.reader} {read.key} (declared {getattr(declared.get(read.key), 'kind', None)})"
             for read in READS if read.reader in wanted and read.key is not None
             and getattr(declared.get(read.key), "kind", None) not in wanted[read.reader]]
    dynamic = [read.where for read in READS if read.reader in wanted and read.key is None]
    assert not wrong and not dynamic, (wrong, dynamic)
