"""docs/config.md's type column of every numeric key, written from the key's declaration (``key_declarations.py``).

    python -m toolkits.config_docs           # rewrite the cells that differ
    python -m toolkits.config_docs --check   # exit 1, naming them, if any differs (tests/test_config_docs.py)

A number's type cell is its kind and its range as the refusal words it (``int >= 1``, ``float in (0, 1]``), so the
table and the check cannot drift apart; "or null" stays where the row said null has a meaning. The other columns
(default, meaning, source) are prose and stay as written.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def type_cell(key, written: str) -> str:
    """The type cell of a numeric ``key`` whose row says ``written`` now."""
    cell = f"{key.kind} {key.range_words()}" + (f"; {key.relation}" if key.relation else "")
    return cell + " or null" if "null" in written else cell


def rewritten(text: str) -> tuple[str, list[str]]:
    """``text`` with every declared number's type cell from its declaration, and the keys whose cell changed."""
    from rlinf_search.config.schema import declarations

    declared = {path: key for path, key in declarations().items() if key.numeric}
    lines, changed = text.split("\n"), []
    for i, line in enumerate(lines):
        match = re.match(r"^\| `([\w.<>]+)` \|([^|]*)\|", line)
        if not match or match.group(1) not in declared:
            continue
        path, written = match.group(1), match.group(2).strip()
        cell = type_cell(declared[path], written)
        if cell != written:
            lines[i] = line.replace(f"| `{path}` |{match.group(2)}|", f"| `{path}` | {cell} |", 1)
            changed.append(path)
    return "\n".join(lines), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkits.config_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a cell differs")
    args = parser.parse_args(argv)
    text, changed = rewritten(DOC.read_text(encoding="utf-8"))
    if args.check:
        if changed:
            print(f"docs/config.md: type cells differ from the declarations: {', '.join(changed)}; run "
                  "python -m toolkits.config_docs")
        return 1 if changed else 0
    DOC.write_text(text, encoding="utf-8")
    print(f"docs/config.md: {len(changed)} type cells rewritten from the declarations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
