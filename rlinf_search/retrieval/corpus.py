"""Random access to a passage corpus in JSON-lines form, built for wiki-18 sizes (21 M rows, 5 GB).

Row i of the corpus file is row i of every index built over it. A byte-offset table (one uint64 per
row, plus the file size at the end) is built once in a single streaming pass and memory-mapped, so
looking up a row is one seek and one line parse and no per-passage Python object stays in memory.

Two record formats are read:
- Search-R1 / FlashRAG: ``{"id": ..., "contents": "\\"Title\\"\\ntext"}``
- BEIR: ``{"_id": ..., "title": ..., "text": ...}``
Both are served as ``{"id", "contents", "title", "text"}`` so clients see one shape.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

# Large reads keep the offset scan disk-bound rather than Python-bound.
_SCAN_CHUNK_BYTES = 64 * 1024 * 1024
_OFFSETS_VERSION = 1
_RECORD_KEYS = frozenset({"id", "_id", "contents", "title", "text"})


class CorpusFormatError(ValueError):
    """A corpus line is not a record this store can read."""


@dataclass(frozen=True)
class Passage:
    """One corpus row, in the shape every retrieval client receives."""

    row: int
    """Position in the corpus file; the same position in every index."""
    id: str
    """The record's own id (``id`` or BEIR ``_id``)."""
    title: str
    """The passage title: the first line of ``contents``, unquoted."""
    text: str
    """The passage body without its title line."""
    extra: dict = field(default_factory=dict, compare=False)
    """Any other fields of the stored record (ASearcher's corpus has ``url``); passed to clients as is."""

    @property
    def contents(self) -> str:
        """The Search-R1 form: the quoted title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'

    def as_document(self) -> dict:
        """The JSON object returned under ``document`` by ``/retrieve``."""
        return {**self.extra, "id": self.id, "contents": self.contents, "title": self.title, "text": self.text}


@dataclass(frozen=True)
class CorpusFingerprint:
    """What identifies a corpus file, so an index can refuse a corpus it was not built on."""

    num_rows: int
    """Number of non-empty lines (passages)."""
    size_bytes: int
    """File size in bytes."""
    checksum: str
    """blake2b-128 of the whole file, hex."""


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 ``contents`` into (title, text); the title is the first line, quotes removed."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def parse_record(line: bytes | str, row: int) -> Passage:
    """Parse one corpus line in either supported format."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(f"corpus row {row} is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise CorpusFormatError(f"corpus row {row} is not a JSON object")
    if "contents" in record:
        title, text = split_contents(str(record["contents"]))
        doc_id = record.get("id", row)
    elif "text" in record:
        title, text = str(record.get("title", "")), str(record["text"])
        doc_id = record.get("_id", record.get("id", row))
    else:
        raise CorpusFormatError(
            f"corpus row {row} has neither 'contents' (Search-R1) nor 'text' (BEIR); "
            f"keys are {sorted(record)}"
        )
    extra = {k: v for k, v in record.items() if k not in _RECORD_KEYS}
    return Passage(row=row, id=str(doc_id), title=title, text=text, extra=extra)


def _scan_offsets(path: Path) -> tuple[np.ndarray, str]:
    """One streaming pass: the start offset of every non-empty line, and the file's checksum."""
    digest = hashlib.blake2b(digest_size=16)
    newline_positions: list[np.ndarray] = []
    position = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_SCAN_CHUNK_BYTES):
            digest.update(chunk)
            found = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n"))
            newline_positions.append(found.astype(np.uint64) + np.uint64(position))
            position += len(chunk)
    ends = np.concatenate(newline_positions) if newline_positions else np.zeros(0, np.uint64)
    # A last line without a trailing newline still counts.
    if position and (ends.size == 0 or int(ends[-1]) != position - 1):
        ends = np.append(ends, np.uint64(position))
    starts = np.concatenate([np.zeros(1, np.uint64), ends[:-1] + np.uint64(1)]) if ends.size else ends
    # Blank lines (length 0 between newlines) are not passages.
    keep = ends > starts
    return starts[keep], digest.hexdigest()


def _default_offsets_path(corpus_path: Path) -> Path:
    """Beside the corpus when that folder is writable, else in the user cache (shared data is read-only)."""
    beside = corpus_path.with_name(corpus_path.name + ".offsets.npy")
    if os.access(corpus_path.parent, os.W_OK):
        return beside
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlinf_search" / "offsets"
    key = hashlib.blake2b(str(corpus_path.resolve()).encode(), digest_size=8).hexdigest()
    return cache / f"{corpus_path.name}.{key}.offsets.npy"


class CorpusStore:
    """Memory-mapped, row-addressed access to a JSON-lines corpus."""

    def __init__(self, path: str | os.PathLike, offsets_path: str | os.PathLike | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file not found: {self.path}")
        self.offsets_path = Path(offsets_path) if offsets_path else _default_offsets_path(self.path)
        self._offsets, self.fingerprint = self._load_or_build_offsets()
        self._file = open(self.path, "rb")

    def _load_or_build_offsets(self) -> tuple[np.ndarray, CorpusFingerprint]:
        meta_path = self.offsets_path.with_suffix(".json")
        stat = self.path.stat()
        if self.offsets_path.is_file() and meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            # Size and mtime guard against a corpus edited after the table was built.
            if (
                meta.get("version") == _OFFSETS_VERSION
                and meta.get("size_bytes") == stat.st_size
                and meta.get("mtime_ns") == stat.st_mtime_ns
            ):
                offsets = np.load(self.offsets_path, mmap_mode="r")
                return offsets, CorpusFingerprint(int(offsets.shape[0]), stat.st_size, meta["checksum"])
        starts, checksum = _scan_offsets(self.path)
        self.offsets_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.offsets_path.with_name(self.offsets_path.name + ".tmp.npy")
        np.save(tmp, starts)
        os.replace(tmp, self.offsets_path)
        meta = {"version": _OFFSETS_VERSION, "size_bytes": stat.st_size,
                "mtime_ns": stat.st_mtime_ns, "checksum": checksum}
        meta_path.write_text(json.dumps(meta))
        offsets = np.load(self.offsets_path, mmap_mode="r")
        return offsets, CorpusFingerprint(int(offsets.shape[0]), stat.st_size, checksum)

    def __len__(self) -> int:
        return int(self._offsets.shape[0])

    def raw_line(self, row: int) -> bytes:
        """The stored JSON line of ``row`` (without the newline)."""
        if not 0 <= row < len(self):
            raise IndexError(f"corpus row {row} out of range (corpus has {len(self)} rows)")
        start = int(self._offsets[row])
        # pread keeps lookups safe from several server threads sharing one file handle.
        end = int(self._offsets[row + 1]) if row + 1 < len(self) else self.fingerprint.size_bytes
        return os.pread(self._file.fileno(), end - start, start).rstrip(b"\r\n")

    def __getitem__(self, row: int) -> Passage:
        return parse_record(self.raw_line(row), row)

    def get_many(self, rows: list[int] | np.ndarray) -> list[Passage]:
        return [self[int(r)] for r in rows]

    def iter_passages(self, start: int = 0, stop: int | None = None) -> Iterator[Passage]:
        """Stream rows ``start..stop`` in file order with buffered sequential reads."""
        stop = len(self) if stop is None else min(stop, len(self))
        if start >= stop:
            return
        with open(self.path, "rb") as handle:
            handle.seek(int(self._offsets[start]))
            row = start
            for line in handle:
                if not line.strip():
                    continue
                yield parse_record(line, row)
                row += 1
                if row >= stop:
                    return

    def check_unique_ids(self) -> None:
        """Raise ``CorpusFormatError`` naming the first id two rows share: an index answers by row, and clients
        (and ``/access``) tell passages apart by id, so two passages answering as one id is silent corruption.
        One streaming pass holds a 64-bit hash per row (168 MB for wiki-18's 21 M passages), not the ids."""
        hashes = np.fromiter((int.from_bytes(hashlib.blake2b(p.id.encode(), digest_size=8).digest(), "little")
                              for p in self.iter_passages()), dtype=np.uint64, count=len(self))
        order = np.argsort(hashes, kind="stable")
        repeats = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        for at in repeats:  # a hash collision of two different ids is checked for, not assumed away
            first, second = int(order[at]), int(order[at + 1])
            if self[first].id == self[second].id:
                raise CorpusFormatError(f"{self.path}: rows {min(first, second)} and {max(first, second)} share the "
                                        f"id {self[first].id!r}; give every passage its own id")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "CorpusStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
