"""Readers that turn one QA file into :class:`SourceRecord` rows, in a registry keyed by format name.

Built-in formats:

- ``flashrag``: FlashRAG's QA jsonl, ``{"id", "question", "golden_answers", "metadata"?}``.
- ``hotpotqa``: the same shape (``tests/data/hotpotqa_100/test.jsonl``); ``metadata`` (type, level,
  supporting titles) is kept in ``extra``.
- ``nq_open``: ``{"question", "answer": [...]}`` with no id (the record's position is used).
- ``asearcher``: ASearcher's jsonl (or a ``.json`` array): ``question``, ``answer`` (a string or a
  list; ``gt`` when ``answer`` is absent, as in its evaluation data), an id in ``idx``, ``qid``,
  ``query_id`` or ``id`` (the order its training code looks them up), and ``source`` /
  ``aug_answer`` kept in ``extra``. ``aug_answer`` is not a gold answer: ASearcher weighs it lower.
- ``searchr1_parquet``: verl / Search-R1 training parquet; its ``prompt`` is already templated and
  is passed through untouched.
- ``rlinf``: RLinf's Search-R1 training jsonl (its ``data.prompt_key`` / ``data.answer_key`` defaults):
  ``prompt`` (text already in the chat template, or chat messages), ``solutions`` (a string or a
  list); an id in ``id``/``idx``/``index`` and a ``data_source`` when the row has them.

A reader is any callable ``(path) -> Iterable[SourceRecord]``; add one with :func:`register_reader`,
or name it on the command line as ``package.module:function``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_search.registry import Registry


class PrepareError(Exception):
    """Bad input (a missing file, a malformed row); the message names the file and the row."""


class UsageError(PrepareError):
    """Options that do not fit together (the command line exits with 2)."""


@dataclass
class SourceRecord:
    """One question as read from a source file, before a uid and a prompt are given to it."""

    index: int
    """0-based position of the record in its file (the id of sources that have none)."""
    location: str
    """Where it is, for messages: ``line 3`` (jsonl), ``record 3`` (json array), ``row 3`` (parquet)."""
    question: str
    """The bare question ("" if a pre-templated source does not carry it separately)."""
    golden_answers: list[str]
    """Every accepted answer, as strings, at least one."""
    original_id: str | None = None
    """The source's own id, if it has one."""
    prompt: list[dict] | str | None = None
    """A prompt the source already templated (passed through untouched); None to template it here."""
    data_source: str | None = None
    """The source's own name for its data set, if each row carries one."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every other field of the row, for logs and per-type metrics."""


Reader = Callable[[Path], Iterable[SourceRecord]]

READERS: Registry[Reader] = Registry("format", error=PrepareError)
"""Readers by format name (the ``--format`` value); a ``module:function`` path names your own."""


def register_reader(name: str, reader: Reader, *, overwrite: bool = False) -> None:
    """Make ``reader`` available as format ``name``."""
    READERS.register(name, reader, overwrite=overwrite)


def get_reader(name: str) -> Reader:
    """The registered reader ``name``, else the function a ``module:function`` path names."""
    return READERS.resolve(name)


def fail(path: Path, location: str, problem: str) -> PrepareError:
    """An error naming the file and the row (readers raise what this returns)."""
    return PrepareError(f"{path}, {location}: {problem}")


def require_file(path: Path) -> None:
    """Raise a one-line error when ``path`` is not a readable file."""
    if not path.is_file():
        raise PrepareError(f"{path}: no such file")


def iter_json_records(path: Path) -> Iterator[tuple[int, str, dict]]:
    """Yield ``(index, location, row)`` from a jsonl file (blank lines skipped) or a ``.json`` array."""
    require_file(path)
    if path.suffix == ".json":
        yield from _iter_json_array(path)
        return
    index, line_no = 0, 0
    try:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                location = f"line {line_no}"
                yield index, location, _parse_object(line, path, location)
                index += 1
    except UnicodeDecodeError as exc:
        raise fail(path, f"line {line_no + 1}", "not UTF-8 text (is --format right?)") from exc


def _iter_json_array(path: Path) -> Iterator[tuple[int, str, dict]]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{path}: not UTF-8 text (is --format right?)") from exc
    except json.JSONDecodeError as exc:
        raise PrepareError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(rows, list):
        raise PrepareError(f"{path}: a .json input must hold a list of records")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise fail(path, f"record {index + 1}", "not a JSON object")
        yield index, f"record {index + 1}", row


def _parse_object(line: str, path: Path, location: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise fail(path, location, f"not valid JSON ({exc.msg})") from exc
    if not isinstance(row, dict):
        raise fail(path, location, "not a JSON object")
    return row


def as_answers(value: Any, path: Path, location: str) -> list[str]:
    """Gold answers as a non-empty list of strings (one string, or a list/tuple of scalars)."""
    items = [value] if isinstance(value, (str, int, float)) else value
    if not isinstance(items, (list, tuple)):
        raise fail(path, location, "no golden answers")
    answers = [str(item).strip() for item in items if item is not None and str(item).strip()]
    if not answers:
        raise fail(path, location, "no golden answers")
    return answers


def as_question(value: Any, path: Path, location: str) -> str:
    """The question as a stripped, non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise fail(path, location, "no question")
    return value.strip()


def _optional_id(value: Any) -> str | None:
    return None if value is None or str(value) == "" else str(value)


def read_flashrag(path: Path) -> Iterator[SourceRecord]:
    """FlashRAG QA rows; ``metadata`` is flattened into ``extra`` next to any unknown keys."""
    for index, location, row in iter_json_records(path):
        rest = {k: v for k, v in row.items() if k not in ("id", "question", "golden_answers", "metadata")}
        metadata = row.get("metadata")
        extra = {**rest, **metadata} if isinstance(metadata, dict) else rest
        yield SourceRecord(
            index=index, location=location,
            question=as_question(row.get("question"), path, location),
            golden_answers=as_answers(row.get("golden_answers"), path, location),
            original_id=_optional_id(row.get("id")), extra=extra,
        )


def read_nq_open(path: Path) -> Iterator[SourceRecord]:
    """NQ-open rows ``{"question", "answer": [...]}``; they carry no id."""
    for index, location, row in iter_json_records(path):
        yield SourceRecord(
            index=index, location=location,
            question=as_question(row.get("question"), path, location),
            golden_answers=as_answers(row.get("answer"), path, location),
            extra={k: v for k, v in row.items() if k not in ("question", "answer")},
        )


# ASearcher's training code resolves a question's id from these keys, in this order.
_ASEARCHER_ID_KEYS = ("idx", "qid", "query_id", "id")


def read_asearcher(path: Path) -> Iterator[SourceRecord]:
    """ASearcher rows: ``question``, ``answer`` (or ``gt``), an id, ``source``, ``aug_answer``."""
    for index, location, row in iter_json_records(path):
        answer = row["answer"] if "answer" in row else row.get("gt")
        id_key = next((k for k in _ASEARCHER_ID_KEYS if _optional_id(row.get(k)) is not None), None)
        consumed = {"question", "answer", "gt", *_ASEARCHER_ID_KEYS}
        yield SourceRecord(
            index=index, location=location,
            question=as_question(row.get("question"), path, location),
            golden_answers=as_answers(answer, path, location),
            original_id=str(row[id_key]) if id_key else None,
            extra={k: v for k, v in row.items() if k not in consumed},
        )


def _question_from_prompt(prompt: Any) -> str:
    """The text after the last ``Question:`` of the last user message (Search-R1's prompt shape)."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users and isinstance(users[-1], str) else ""
    else:
        text = prompt if isinstance(prompt, str) else ""
    if "Question:" not in text:
        return ""
    # A text prompt goes on past the question with the chat template's markers (<|im_end|> ...).
    tail = text.rsplit("Question:", 1)[1].split("<|", 1)[0].strip()
    return tail.splitlines()[0].strip() if tail else ""


def _parquet_question(row: dict) -> str:
    for value in (row.get("question"), (row.get("extra_info") or {}).get("question")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return _question_from_prompt(row.get("prompt"))


def _parquet_answers(row: dict, path: Path, location: str) -> list[str]:
    ground_truth = ((row.get("reward_model") or {}).get("ground_truth") or {})
    target = ground_truth.get("target") if isinstance(ground_truth, dict) else ground_truth
    return as_answers(target if target is not None else row.get("golden_answers"), path, location)


def _parquet_id(row: dict) -> str | None:
    own = _optional_id(row.get("id"))
    return own if own is not None else _optional_id((row.get("extra_info") or {}).get("index"))


def _iter_parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_file(path)
    try:
        parquet = pq.ParquetFile(path)
        # Batches keep memory flat on a large training set.
        for batch in parquet.iter_batches(batch_size=4096):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise PrepareError(f"{path}: cannot read as parquet ({str(exc).splitlines()[0]})") from exc


def read_searchr1_parquet(path: Path) -> Iterator[SourceRecord]:
    """verl / Search-R1 parquet rows; the templated ``prompt`` and the row's ``data_source`` are kept."""
    consumed = {"prompt", "question", "id", "data_source", "golden_answers", "reward_model"}
    for index, row in enumerate(_iter_parquet_rows(path)):
        location = f"row {index + 1}"
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
            raise fail(path, location, "no prompt")
        yield SourceRecord(
            index=index, location=location, question=_parquet_question(row),
            golden_answers=_parquet_answers(row, path, location), original_id=_parquet_id(row),
            prompt=prompt, data_source=_optional_id(row.get("data_source")),
            extra={k: v for k, v in row.items() if k not in consumed and v is not None},
        )


# RLinf's Search-R1 rows carry no id field of their own; these are looked up in order when present.
_RLINF_ID_KEYS = ("id", "idx", "index", "uid")


def read_rlinf(path: Path) -> Iterator[SourceRecord]:
    """RLinf's Search-R1 jsonl: ``prompt`` (kept as it is) and ``solutions``; the question is read from
    the prompt's last ``Question:`` when the row has no ``question``."""
    consumed = {"prompt", "solutions", "question", "data_source", *_RLINF_ID_KEYS}
    for index, location, row in iter_json_records(path):
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            raise fail(path, location, "no prompt (RLinf rows hold the templated prompt in 'prompt')")
        if "solutions" not in row:
            raise fail(path, location, "no 'solutions' (RLinf rows hold the gold answers there)")
        question = row.get("question")
        id_key = next((k for k in _RLINF_ID_KEYS if _optional_id(row.get(k)) is not None), None)
        yield SourceRecord(
            index=index, location=location,
            question=question.strip() if isinstance(question, str) else _question_from_prompt(prompt),
            golden_answers=as_answers(row["solutions"], path, location), prompt=prompt,
            original_id=str(row[id_key]) if id_key else None, data_source=_optional_id(row.get("data_source")),
            extra={k: v for k, v in row.items() if k not in consumed},
        )


register_reader("flashrag", read_flashrag)
register_reader("hotpotqa", read_flashrag)
register_reader("nq_open", read_nq_open)
register_reader("asearcher", read_asearcher)
register_reader("searchr1_parquet", read_searchr1_parquet)
register_reader("rlinf", read_rlinf)
