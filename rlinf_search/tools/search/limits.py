"""Per-client memory: the query normal form and an LRU cache of answers (pacing: ``rlinf_search.net.retry``)."""

from __future__ import annotations

import unicodedata
from collections import OrderedDict

from rlinf_search.net.retry import TokenBucket
from rlinf_search.tools.search.base import SearchHit

__all__ = ["AnswerCache", "TokenBucket", "normalise_query"]


def normalise_query(query: str) -> str:
    """The form a query is sent and cached in: NFKC, whitespace collapsed, ends stripped.

    Case is kept: cased encoders and web search can rank ``US`` and ``us`` differently.
    """
    return " ".join(unicodedata.normalize("NFKC", query).split())


class AnswerCache:
    """LRU cache of successful answers keyed on (normalised query, topk); size 0 stores nothing."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, int], list[SearchHit]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> list[SearchHit] | None:
        """A copy of the cached hit list (so a caller editing it cannot corrupt the cache), or None."""
        hits = self._entries.get(key)
        if hits is None:
            return None
        self._entries.move_to_end(key)
        return list(hits)

    def put(self, key: tuple[str, int], hits: list[SearchHit]) -> None:
        """Store an answer, evicting the least recently used entry when full."""
        if self.max_entries <= 0:
            return
        self._entries[key] = list(hits)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
