"""docs/config.md's type column of every numeric key and the default column of every key, written from the config
model (``rlinf_search/config/model.py``, described by ``key_ranges.py``).

    python -m toolkits.config_docs           # rewrite the cells that differ
    python -m toolkits.config_docs --check   # exit 1, naming them, if any differs (tests/test_config_docs.py)

A number's type cell is its kind and its range as the refusal words it (``int >= 1``, ``float in (0, 1]``), so the
table and the check cannot drift apart; "or null" stays where the row said null has a meaning. A default cell is
rewritten where it states another value than the field's default (a computed default: the field's
``default_words``); a cell stating the same value in other words (``0`` for ``0.0``) stays. The meaning and source
columns are prose and stay as written.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING
from pathlib import Path

import yaml

from rlinf_search.key_ranges import field_defaults

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def type_cell(key, written: str) -> str:
    """The type cell of a numeric ``key`` whose row says ``written`` now."""
    cell = f"{key.kind} {key.range_words()}" + (f"; {key.relation}" if key.relation else "")
    return cell + " or null" if "null" in written else cell


def cell_value(cell: str, path: str):
    """The value a default cell states (``fp32`` as its dtype name, as the precision fields hold it)."""
    from rlinf_search.config.precision import PRECISIONS

    value = yaml.safe_load(cell.replace("`", "").strip() or "null")
    if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return PRECISIONS[value] if path.endswith("precision") and value in PRECISIONS else value


def default_cell(value) -> str:
    """A field default as a docs cell: ``true``, ``null``, ``1e-6``, `` `token-mean` ``, `` `[console, jsonl]` ``."""
    if value is MISSING:
        return "required"
    if isinstance(value, (list, tuple)):
        return f"`[{', '.join(map(str, value))}]`"
    if isinstance(value, str):
        return f"`{value}`"
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{m.group(1).lstrip('+')}{m.group(2)}", yaml.safe_dump(value).split("\n")[0])


def declared_defaults() -> dict[str, str]:
    """The default cell of every key of the training config model and its open sections' models: its
    ``default_words``, else its default written as a cell."""
    from rlinf_search.config.model import TrainConfigFile
    from rlinf_search.config.schema import DATACLASS_SECTIONS, section_models

    return {f"{path}.{name}".lstrip("."): words or default_cell(default)
            for path, model in [*section_models(TrainConfigFile), *DATACLASS_SECTIONS.items()]
            for name, default, words in field_defaults(model)}


def rewritten(text: str) -> tuple[str, list[str]]:
    """``text`` with every declared number's type cell and every view field's default cell from its declaration, and
    the keys whose cell changed."""
    from rlinf_search.config.schema import declarations

    numeric = {path: key for path, key in declarations().items() if key.numeric}
    defaults = declared_defaults()
    lines, changed = text.split("\n"), []
    for i, line in enumerate(lines):
        match = re.match(r"^\| `([\w.<>]+)` \|([^|]*)\|([^|]*)\|", line)
        if not match or (match.group(1) not in numeric and match.group(1) not in defaults):
            continue
        path, written, default = match.group(1), match.group(2).strip(), match.group(3).strip()
        cell = type_cell(numeric[path], written) if path in numeric else written
        if path in defaults and cell_value(default, path) != cell_value(defaults[path], path):
            default = defaults[path]
        if (cell, default) != (written, match.group(3).strip()):
            lines[i] = line.replace(f"| `{path}` |{match.group(2)}|{match.group(3)}|",
                                    f"| `{path}` | {cell} | {default} |", 1)
            changed.append(path)
    return "\n".join(lines), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkits.config_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a cell differs")
    args = parser.parse_args(argv)
    text, changed = rewritten(DOC.read_text(encoding="utf-8"))
    if args.check:
        if changed:
            print(f"docs/config.md: cells differ from the declarations: {', '.join(changed)}; run "
                  "python -m toolkits.config_docs")
        return 1 if changed else 0
    DOC.write_text(text, encoding="utf-8")
    print(f"docs/config.md: {len(changed)} rows rewritten from the declarations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
