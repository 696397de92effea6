"""Which of a config's files validation opens: all of them before a run, none for ``rlinf-search check --no-files``.

A GPU recipe names data and models that exist on its cluster, not on the laptop it is written on. Checking it there
checks everything else (keys, values, cross-key rules, placement) and lists the files it did not open, so nothing
is passed over in silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FileChecks:
    """Whether validation opens the files a config names, and what it skipped when it does not."""

    enabled: bool = True
    """True: a missing or unreadable file is a ``ConfigError`` (every run); False: it is listed in ``skipped``."""
    skipped: list[str] = field(default_factory=list)
    """One line per check not made: the key, the files, and what the check would have read."""

    def skip(self, key: str, what: str) -> None:
        self.skipped.append(f"{key}: {what}")
