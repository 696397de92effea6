"""Prepare QA data sets as one jsonl of :class:`QARecord` rows, the trainer's and evaluator's input.

    python -m rlinf_search.data.prepare --input bamboogle/test.jsonl,nq_open/dev.jsonl \\
        --format flashrag --out outputs/data/eval.jsonl

Each input file is read by the ``--format`` reader (see :mod:`rlinf_search.data.readers`), given a
prompt from a template (see :mod:`rlinf_search.data.prompts`) unless the source is already
templated, and a ``uid`` that is unique across all inputs: ``{data_source}-{id}``, where ``id`` is
the source's own id or else the record's 0-based position in its file. A uid seen twice is an
error rather than a silent merge, because GRPO groups samples by uid and a collision would mix two
unrelated questions into one group.

``data_source`` is, in order: ``--data-source`` (one name per input, or one for all); the name the
row itself carries (a Search-R1 parquet's ``data_source`` column); else the input's file stem,
or its folder's name when the stem is only a split name (``bamboogle/test.jsonl`` -> ``bamboogle``),
as in FlashRAG's ``{dataset}/{split}.jsonl`` layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rlinf_search.data.io_struct import QARecord
from rlinf_search.data.prompts import (
    DEFAULT_TEMPLATE,
    TemplateError,
    apply_chat_template,
    build_messages,
    load_tokenizer,
    resolve_template,
)
from rlinf_search.data.readers import READERS, PrepareError, SourceRecord, UsageError, get_reader, require_file

# File stems that name a split, not a data set: the folder names the data set instead.
SPLIT_NAMES = frozenset({"train", "dev", "test", "val", "valid", "validation", "eval"})

PromptMaker = Callable[[str], "list[dict] | str"]


def default_data_source(path: Path) -> str:
    """The data-source name derived from a file's path (see the module docstring)."""
    stem = path.stem
    if stem.lower() in SPLIT_NAMES:
        return path.resolve().parent.name or stem
    return stem


def _split_names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    return [name.strip() for name in names]


def resolve_data_sources(paths: Sequence[Path], names: str | Sequence[str] | None) -> list[str | None]:
    """One override per input: the given names (one per input or one for all), or None (derive)."""
    given = _split_names(names)
    if any(not name for name in given):
        raise UsageError("--data-source has an empty name")
    if not given:
        return [None] * len(paths)
    if len(given) == 1:
        return [given[0]] * len(paths)
    if len(given) != len(paths):
        raise UsageError(f"--data-source gives {len(given)} names for {len(paths)} inputs; "
                         "give one name per input, or one for all")
    return [*given]


def make_uid(data_source: str, record: SourceRecord) -> str:
    """``{data_source}-{original id, else 0-based position}``."""
    key = record.original_id if record.original_id is not None else str(record.index)
    return f"{data_source}-{key}"


def _prompt_maker(template: str | None, tokenizer: Any) -> PromptMaker:
    """A function from a question to its prompt: chat messages, or text when a tokenizer is given."""
    text = resolve_template(template or DEFAULT_TEMPLATE)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    if tokenizer is None:
        return lambda question: build_messages(text, question)
    return lambda question: apply_chat_template(build_messages(text, question), tokenizer)


def _records_from_file(path: Path, fmt: str, source_override: str | None, *,
                       make_prompt: PromptMaker, restyle_asked: bool) -> Iterable[tuple[str, QARecord]]:
    """Yield ``(location, record)`` for every row of one input file."""
    reader = get_reader(fmt)
    require_file(path)
    fallback_source = default_data_source(path)
    for row in reader(path):
        if row.prompt is not None and restyle_asked:
            # Re-wrapping would put a second set of instructions around Search-R1's own.
            raise UsageError(f"{path} is already templated ({fmt}); drop --template / --text-prompt")
        data_source = source_override or row.data_source or fallback_source
        prompt = row.prompt if row.prompt is not None else make_prompt(row.question)
        yield f"{path}, {row.location}", QARecord(
            uid=make_uid(data_source, row), prompt=prompt, golden_answers=row.golden_answers,
            data_source=data_source, question=row.question, extra=row.extra,
        )


def prepare(inputs: str | Path | Sequence[str | Path], fmt: str, *,
            data_sources: str | Sequence[str] | None = None, template: str | None = None,
            tokenizer: Any = None) -> list[QARecord]:
    """Read every input with the ``fmt`` reader and return its questions as QARecords, in order.

    Args:
        inputs: one path, or several (a str may be comma-separated, as on the command line).
        fmt: a registered reader name (``flashrag``, ...) or a ``module:function`` reader.
        data_sources: override names, one per input or one for all (see the module docstring).
        template: a template name or a text file with ``{question}``; default ``searchr1``.
        tokenizer: a tokenizer, or a path to one, to store prompts as chat-templated text.

    Raises:
        PrepareError: a missing or malformed input, or a uid seen twice.
        UsageError: options that do not fit together.
    """
    paths = [Path(p) for p in _split_names(inputs)] if isinstance(inputs, str) else (
        [Path(inputs)] if isinstance(inputs, Path) else [Path(p) for p in inputs])
    if not paths:
        raise UsageError("no input files given")
    overrides = resolve_data_sources(paths, data_sources)
    get_reader(fmt)  # an unknown format fails before any file is read
    try:
        make_prompt = _prompt_maker(template, tokenizer)
    except TemplateError as exc:
        raise PrepareError(str(exc)) from exc
    restyle_asked = template is not None or tokenizer is not None
    seen: dict[str, str] = {}
    records: list[QARecord] = []
    for path, override in zip(paths, overrides, strict=True):
        for location, record in _records_from_file(path, fmt, override, make_prompt=make_prompt,
                                                   restyle_asked=restyle_asked):
            _check_unique(record.uid, location, seen)
            records.append(record)
    return records


def _check_unique(uid: str, location: str, seen: dict[str, str]) -> None:
    if uid in seen:
        raise PrepareError(f"{location}: uid {uid!r} was already given to {seen[uid]}; "
                           "give the inputs distinct --data-source names, or fix the duplicate id")
    seen[uid] = location


def write_records(records: Iterable[QARecord], out: str | Path) -> int:
    """Write records as jsonl (UTF-8, one object per line); return how many were written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(dataclasses.asdict(record), ensure_ascii=False) + "\n")
            count += 1
    # Renamed into place so a reader never sees a half-written file.
    tmp.replace(out)
    return count


_FIELDS = {f.name for f in dataclasses.fields(QARecord)}
_REQUIRED = {f.name for f in dataclasses.fields(QARecord)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _record_from_json(row: Any, where: str) -> QARecord:
    if not isinstance(row, dict):
        raise PrepareError(f"{where}: not a JSON object")
    missing, unknown = _REQUIRED - row.keys(), row.keys() - _FIELDS
    if "solutions" in row and "golden_answers" not in row:
        raise PrepareError(f"{where}: an RLinf Search-R1 row (prompt/solutions), not a prepared one; prepare it "
                           "first: python -m rlinf_search.data.prepare --format rlinf --input FILE --out OUT.jsonl")
    if missing or unknown:
        problem = f"missing {sorted(missing)}" if missing else f"unknown keys {sorted(unknown)}"
        raise PrepareError(f"{where}: not a prepared QARecord ({problem})")
    answers = row["golden_answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise PrepareError(f"{where}: golden_answers must be a non-empty list of strings")
    if not isinstance(row["prompt"], (list, str)) or not row["prompt"]:
        raise PrepareError(f"{where}: prompt must be chat messages or text")
    return QARecord(**row)


def load_records(path: str | Path) -> list[QARecord]:
    """Read a prepared jsonl back; checks every row's shape and that uids are unique."""
    path = Path(path)
    require_file(path)
    records: list[QARecord] = []
    seen: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PrepareError(f"{where}: not valid JSON ({exc.msg})") from exc
            record = _record_from_json(row, where)
            _check_unique(record.uid, where, seen)
            records.append(record)
    return records


def count_records(path: str | Path) -> int:
    """How many records ``load_records`` would return (its non-blank lines), without parsing them."""
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.data.prepare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="input file(s), comma-separated")
    parser.add_argument("--format", required=True,
                        help=f"input format: {', '.join(sorted(READERS))}, or a module:function reader")
    parser.add_argument("--out", required=True, help="output jsonl of QARecords")
    parser.add_argument("--data-source", default=None,
                        help="data-source name(s): one per input (comma-separated) or one for all")
    parser.add_argument("--template", default=None,
                        help=f"template name or text file with {{question}} (default {DEFAULT_TEMPLATE})")
    parser.add_argument("--text-prompt", action="store_true",
                        help="store prompts as text with the tokenizer's chat template applied")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (with --text-prompt)")
    return parser


def _check_usage(args: argparse.Namespace) -> None:
    if args.text_prompt and not args.tokenizer:
        raise UsageError("--text-prompt needs --tokenizer PATH")
    if args.tokenizer and not args.text_prompt:
        raise UsageError("--tokenizer is only used with --text-prompt")


def _summary(records: list[QARecord], out: str) -> str:
    per_source = Counter(record.data_source for record in records)
    sources = ", ".join(f"{name} {count}" for name, count in per_source.items())
    return f"wrote {len(records)} questions to {out} ({sources})"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: 0 on success, 1 on bad input, 2 on a usage error."""
    args = _parser().parse_args(argv)
    try:
        _check_usage(args)
        records = prepare(args.input, args.format, data_sources=args.data_source,
                          template=args.template, tokenizer=args.tokenizer if args.text_prompt else None)
        write_records(records, args.out)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(_summary(records, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
