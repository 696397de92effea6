"""Progress of long loops: a live tqdm bar on a terminal, a few plain lines in a log file.

tqdm redraws its bar with carriage returns; written to a file (``demo.sh > log``, a CI log, a Ray
worker's log) every redraw stays, and a 600-step stage becomes one unreadable line of 600 bars. When
the stream is not a terminal, :func:`progress` prints a line at every tenth of the work instead, with
the rate and the time left.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Iterable, Iterator


class LineProgress:
    """The part of tqdm's interface this project uses, printing one line per tenth of ``total``."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, file: IO[str] | None = None, lines: int = 10):
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.desc, self.unit, self.n, self.file = desc, unit, initial, file or sys.stderr
        self._start_n, self._started = initial, time.monotonic()
        self._every = max(1, (self.total or 0) // lines) if self.total else None
        self._next = (initial // self._every + 1) * self._every if self._every else None
        self._postfix = ""
        self._closed = False
        if initial and self.total:  # a resumed job says where it picked up (tqdm's bar shows it too)
            print(f"{desc}: resuming at {initial}/{self.total} {unit}s", file=self.file, flush=True)

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self._postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self._postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._next is not None and self.n >= self._next and self.n < (self.total or 0):
            self._print()
            self._next = (self.n // self._every + 1) * self._every

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._print()

    def _print(self) -> None:
        elapsed = time.monotonic() - self._started
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        left = ""
        if self.total and rate > 0 and self.n < self.total:
            left = f", {_clock((self.total - self.n) / rate)} left"
        share = f" {100 * self.n / self.total:3.0f}%" if self.total else ""
        postfix = f", {self._postfix}" if self._postfix else ""
        print(f"{self.desc}:{share} {done} {self.unit}s in {_clock(elapsed)} ({rate:.2f} {self.unit}/s{left}{postfix})",
              file=self.file, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             initial: int = 0):
    """A progress bar over ``iterable`` (or updated by hand up to ``total``): tqdm on a terminal,
    :class:`LineProgress` elsewhere."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial)
