"""When a row the HF engine decodes is finished: an end token, a stop string, or its token limit.

Checked after every sampled token of every row, so the stop check skips what it can: a stop string can only
complete on a token whose text holds its last character (``>`` for ``</search>`` and ``</answer>``), so only those
tokens decode the row's tail.
"""

from __future__ import annotations

from rlinf_search.data.io_struct import SamplingParams


def end_token_ids(model, tokenizer) -> frozenset[int]:
    """The ids that end a generation: the model's generation config's and the tokenizer's end tokens."""
    ids = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return frozenset(ids)


class FinishCheck:
    """Why a row is finished after its newest token, or None while it goes on."""

    def __init__(self, tokenizer, eos_ids: frozenset[int]):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.stop_enders: dict[tuple[str, ...], tuple[bool, ...]] = {}
        """Per set of stops, per token id: whether the token can end one (empty: check every token)."""
        self._texts: list[str] | None = None  # each token id's text, for the stop sets' tables

    def reason(self, sampling: SamplingParams, output_ids: list[int]) -> tuple[str, str | None] | None:
        """(finish reason, the stop string that ended it) or None."""
        if sampling.stop_at_eos and output_ids[-1] in self.eos_ids:
            return ("eos", None)
        if sampling.stop and self._may_end_stop(sampling.stop, output_ids[-1]):
            # A stop string that just completed lies within the last len(stop)+1 tokens: every
            # token carries at least one of its characters. Earlier text was checked at earlier steps.
            window = max(len(s) for s in sampling.stop) + 1
            tail = self.tokenizer.decode(output_ids[-window:])
            for stop in sampling.stop:
                if stop in tail:
                    return ("stop", stop)
        if len(output_ids) >= sampling.max_new_tokens:
            return ("length", None)
        return None

    def _may_end_stop(self, stops: tuple[str, ...], token: int) -> bool:
        """Whether ``token`` can complete one of ``stops``: only a token whose text holds a stop's last character
        can, so the others skip decoding the row's tail (most rows, most steps). Known per token once per set of
        stops; a stop ending in a non-ASCII or space character (which a token's text alone may not show) is always
        checked."""
        stops = tuple(stops)
        enders = self.stop_enders.get(stops)
        if enders is None:
            last = {stop[-1] for stop in stops if stop}
            if not last or any(not char.isascii() or char.isspace() for char in last):
                enders = self.stop_enders[stops] = ()
            else:
                enders = self.stop_enders[stops] = tuple(any(char in text for char in last)
                                                         for text in self._token_texts())
        return not enders or token >= len(enders) or enders[token]

    def _token_texts(self) -> list[str]:
        """Each token id's text on its own, decoded once per engine (every stop set reads it)."""
        if self._texts is None:
            self._texts = self.tokenizer.batch_decode([[token_id] for token_id in range(len(self.tokenizer))])
        return self._texts
