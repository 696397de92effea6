"""How much code reads and checks the config: lines and code lines of every module that does, at a git revision.

    python -m toolkits.config_code_count                 # the working tree
    python -m toolkits.config_code_count bae77c1 HEAD    # revisions side by side

Code lines leave out blank lines, comments and docstrings. The modules are ``config/``, the declaration layer, and
each typed view that reads or checks its own section (issue 42 asks for the count before and after, wherever a
reader lives); a view added to the list counts at every revision that has it.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("rlinf_search/typed_section.py", "rlinf_search/key_declarations.py", "rlinf_search/key_ranges.py",
           "rlinf_search/section_model.py", "rlinf_search/scheduler/config.py",
           "rlinf_search/tools/search/config.py", "rlinf_search/distill/config.py",
           "rlinf_search/workers/actor/config.py", "rlinf_search/workers/actor/megatron/config.py",
           "rlinf_search/workers/rollout/config.py", "rlinf_search/workers/reward/config.py",
           "rlinf_search/agents/config.py", "rlinf_search/data/prompt_tokens.py")


def _files(revision: str | None) -> dict[str, str]:
    if revision is None:
        paths = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rlinf_search" / "config").glob("*.py"))
        return {p: (ROOT / p).read_text() for p in (*paths, *MODULES) if (ROOT / p).is_file()}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", revision, "rlinf_search/config/"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for path in (*[p for p in listed if p.endswith(".py")], *MODULES):
        shown = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            out[path] = shown.stdout
    return out


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstring_lines = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            docstring_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
        # attribute docstrings: a string expression right after an assignment in a class or module body
        if isinstance(body, list):
            for before, after in zip(body, body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr) and isinstance(
                        getattr(after, "value", None), ast.Constant) and isinstance(after.value.value, str):
                    docstring_lines.update(range(after.lineno, after.end_lineno + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines)


def main(argv: list[str] | None = None) -> int:
    revisions = (argv if argv is not None else sys.argv[1:]) or [None]
    print(f"{'revision':>12} | {'files':>5} | {'lines':>6} | {'code lines':>10}")
    for revision in revisions:
        files = _files(revision)
        lines = sum(text.count("\n") for text in files.values())
        code = sum(code_lines(text) for text in files.values())
        print(f"{revision or 'worktree':>12} | {len(files):>5} | {lines:>6,} | {code:>10,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
