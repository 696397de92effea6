"""The shell blocks of README.md and docs/*.md, and what each one's mark says the tests do with it.

Every fenced ``bash`` block carries a mark after the language: ```` ```bash run ```` (the default test lane runs
it, at small sizes where an HTML comment right above it says ``<!-- small: OLD => NEW; ... -->``) or one of
``gpu``, ``cluster``, ``long`` and ``network`` (it needs a GPU, several machines, minutes to hours of CPU, or the
network): then its commands are checked without running them. A checked command's recipe and overrides pass
``rlinf-search check --no-files``; its script or module exists and defines every ``--flag`` the block gives it; each
repository path it names exists. A block with no mark fails the lane, so no command in the docs goes unchecked.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from rlinf_search.cli.app import MODULE_COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
RUN = "run"
CHECKED = ("gpu", "cluster", "long", "network")
MARKS = (RUN, *CHECKED)
_FENCE = re.compile(r"^(\s*)```(\S*)\s*(.*)$")
_SMALL = re.compile(r"<!--\s*small:\s*(.*?)\s*-->", re.S)
# Repository paths a command may name; outputs/, data/ and the like are what the commands make or the user brings.
_REPO_PATH = re.compile(r"^(examples|scripts|benchmarks|toolkits|tests/data|docs|rlinf_search|requirements)/[\w./-]+$")


@dataclass(frozen=True)
class ShellBlock:
    """One fenced shell block of a doc."""

    doc: Path
    """The Markdown file."""
    line: int
    """1-based line of its opening fence."""
    mark: str
    """``run``, one of ``CHECKED``, or "" where the block has none."""
    text: str
    """Its lines, the fence's indentation removed."""
    small: tuple[tuple[str, str], ...] = ()
    """``run``: the (old, new) replacements that make it small, from the comment above it."""

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def small_text(self) -> str:
        """The block with its small-size replacements made; each must match, or the comment is stale."""
        text = self.text
        for old, new in self.small:
            if old not in text:
                raise AssertionError(f"{self.name}: the small-size replacement {old!r} matches nothing in the block")
            text = text.replace(old, new)
        return text


def shell_blocks(docs=DOCS) -> list[ShellBlock]:
    """Every ``bash``/``sh`` fenced block of ``docs``, in order."""
    blocks = []
    for doc in docs:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = _FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            indent, language, rest = fence.groups()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            if language in ("bash", "sh", "shell", "console"):
                above = "\n".join(lines[max(0, i - 6):i])
                comment = _SMALL.findall(above)
                small = tuple(tuple(part.strip() for part in item.split("=>", 1))
                              for item in (comment[-1].split(";") if comment else []) if "=>" in item)
                body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
                blocks.append(ShellBlock(doc, i + 1, rest.split()[0] if rest.split() else "", body, small))
            i = end + 1
    return blocks


def commands(text: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped, split at ``;``, ``&&``,
    ``||``, ``|`` and ``&``, leading ``VAR=value`` assignments removed."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote in an example: nothing to check on that line
            continue
        current: list[str] = []
        for token in tokens + [";"]:
            if token and set(token) <= set(";&|"):
                while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
    return out


def module_sources(argv: list[str]) -> tuple[str, list[Path], list[str]] | None:
    """(what it is, the source files defining its flags, its arguments) for a Python command (``python -m M``,
    ``python path.py``, ``rlinf-search SUB``); None for any other command."""
    head = argv[0]
    if re.search(r"(^|/)python3?$|^\$PY(THON)?$|^\$\{PYTHON:-python3?\}$", head) and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            return argv[2], _module_files(argv[2]), argv[3:]
        if argv[1].endswith(".py"):
            return argv[1], [ROOT / argv[1]], argv[2:]
        return None
    if head == "rlinf-search" and len(argv) > 1:
        sub = argv[1:3] if argv[1] == "index" else argv[1:2]
        module = CLI_MODULES.get(" ".join(sub))
        return ("rlinf-search " + " ".join(sub), _module_files(module) if module else [],
                argv[1 + len(sub):])
    return None


CLI_MODULES = {"check": "rlinf_search.cli.app", "train": "rlinf_search.cli.app", "demo": "rlinf_search.cli.app",
               "schema": "rlinf_search.cli.app",
               "eval": "rlinf_search.runners.eval_runner",
               **{name: module for name, (module, _) in MODULE_COMMANDS.items()}}
"""Where each ``rlinf-search`` subcommand's flags are defined: the app's own (typer options) or the module's parser
it hands its arguments to."""


def _module_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return []
    origin = Path(spec.origin)
    return [origin, origin.parent / "__main__.py"] if origin.name == "__init__.py" else [origin]


_HYDRA_FLAGS = {"--config-name", "--config-path", "--config-dir", "--cfg", "--help", "--multirun", "--info"}
"""The flags a ``@hydra.main`` script takes from Hydra."""


def flags_missing(sources: list[Path], args: list[str]) -> list[str]:
    """The ``--flags`` of ``args`` that no source file names (``--no-x`` counts as ``--x``'s negation)."""
    text = "".join(path.read_text() for path in sources if path.is_file())
    missing = []
    for arg in args:
        if not arg.startswith("--") or arg == "--":
            continue
        flag = arg.split("=", 1)[0]
        plain = "--" + flag[len("--no-"):] if flag.startswith("--no-") else flag
        if "hydra.main" in text and flag in _HYDRA_FLAGS:
            continue
        if f'"{flag}"' not in text and f'"{plain}"' not in text:
            missing.append(flag)
    return missing


def repo_paths(argv: list[str]) -> list[str]:
    """Arguments that name a file or folder of this repository (examples/..., scripts/..., tests/data/...)."""
    found = []
    for arg in argv:
        for part in arg.split(","):
            part = part.split("=", 1)[-1].strip("[]'\"")
            if _REPO_PATH.match(part) and "*" not in part and "$" not in part:
                found.append(part)
    return found


def recipe_run(argv: list[str]) -> tuple[str, list[str]] | None:
    """(recipe, overrides) of a command that runs or checks a recipe: ``rlinf-search check|train|eval CONFIG``,
    the launchers, ``main_searchr1.py``/``main_searchr1_eval.py``; None for any other. Overrides holding a shell
    variable are left out (their value is the shell's)."""
    recipe, rest = None, []
    if argv[0] == "rlinf-search" and len(argv) > 2 and argv[1] in ("check", "train", "eval") \
            and not argv[2].startswith("-"):
        recipe, rest = argv[2], argv[3:]
    elif argv[0] == "bash" and len(argv) > 1 and Path(argv[1]).name.startswith("run_main_searchr1_single"):
        default = "qwen2.5-3b-tool-1node-eval" if argv[1].endswith("_eval.sh") else "qwen2.5-3b-tool-fsdp-1node"
        recipe, rest = (argv[2], argv[3:]) if len(argv) > 2 and not argv[2].startswith("-") else (default, [])
    elif len(argv) > 1 and Path(argv[1]).name in ("main_searchr1.py", "main_searchr1_eval.py"):
        recipe = "tiny-cpu" if argv[1].endswith("main_searchr1.py") else "qwen2.5-3b-tool-1node-eval"
        rest, path = [], None
        args = iter(argv[2:])
        for arg in args:
            if arg in ("--config-name", "--config-path"):
                value = next(args, "")
                recipe, path = (value, path) if arg == "--config-name" else (recipe, value)
            else:
                rest.append(arg)
        if path is not None:
            recipe = str(Path(path) / f"{recipe}.yaml")
    if recipe is None or "/path/to/" in recipe:  # a stand-in for another project's checkout: nothing to compose
        return None
    return recipe, [item for item in rest if "$" not in item and "<" not in item and "=" in item]
