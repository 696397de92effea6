"""One registry class for every extension point: a config names a built-in, a registered entry or user code.

Each concern that users extend (advantage estimators, KL estimators, loss aggregations, mismatch
corrections, rewards, prompt templates, data readers, dense encoders, rollout engines, search backends,
training backends) keeps one :class:`Registry`. ``resolve`` is the single way a name becomes an entry:
a registered name first, then, where the registry allows it, a dotted path to user code
(``my_package.module:function`` or ``my_package.module.function``), so every config key documented as
taking a dotted path does. Validation calls ``resolve`` at start-up, so a misspelt name or a path that
does not import stops the run before any worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

from rlinf_search.plugins import import_callable

T = TypeVar("T")


@dataclass(frozen=True)
class Lazy:
    """A built-in named by dotted path and imported when first resolved (choosing ``hf`` never imports vLLM)."""

    path: str
    """``package.module:attribute``."""


def _looks_dotted(name: str) -> bool:
    return ":" in name or "." in name


class Registry(Mapping[str, T], Generic[T]):
    """Entries of one extension point by name; read-only as a mapping, extended through :meth:`register`."""

    def __init__(self, kind: str, *, dotted_paths: bool = True,
                 fallback: Callable[[str], T] | None = None, check: Callable[[str, T], None] | None = None,
                 error: type[Exception] = ValueError, unavailable: Mapping[str, str] | None = None):
        """
        Args:
            kind: what an entry is, in words ("advantage estimator"); errors use it.
            dotted_paths: whether a name that is not registered may be a dotted path to a callable.
            fallback: how an unregistered name resolves instead of a dotted path (a template file's path).
            check: called on each entry as it is registered or resolved from a path; raises if unusable.
            error: the exception raised for an unknown or duplicate name (ValueError or a subclass of it).
            unavailable: names a config may use that this build does not ship, with what to use instead.
        """
        self.kind, self.dotted_paths = kind, dotted_paths
        self._fallback, self._check, self._error = fallback, check, error
        self._unavailable = dict(unavailable or {})
        self._entries: dict[str, T | Lazy] = {}

    # ---- the mapping: registered names only --------------------------------------------------
    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, Lazy):
            entry = self._entries[name] = import_callable(entry.path, kind=self.kind)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    # ---- extending -------------------------------------------------------------------------
    @overload
    def register(self, name: str, entry: None = None, *, overwrite: bool = False) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T | Lazy, *, overwrite: bool = False) -> T | Lazy: ...

    def register(self, name, entry=None, *, overwrite=False):
        """Add ``entry`` as ``name`` and return it; without ``entry``, a decorator that does so.

        Registering a name again raises the registry's error unless ``overwrite``.
        """
        if entry is None:
            return lambda fn: self.register(name, fn, overwrite=overwrite)
        if not isinstance(name, str) or not name:
            raise self._error(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._entries and not overwrite:
            raise self._error(f"{self.kind} {name!r} is already registered (pass overwrite=True to replace it)")
        if self._check is not None and not isinstance(entry, Lazy):
            self._check(name, entry)
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (KeyError if it is not registered)."""
        del self._entries[name]

    # ---- looking up --------------------------------------------------------------------------
    def resolve(self, name: str, *, key: str | None = None) -> T:
        """The entry ``name`` stands for: a registered name, else what the fallback or a dotted path gives.

        Raises the registry's error (a ValueError) with one line naming the known entries otherwise;
        ``key``, the config key that gave ``name``, starts that line.
        """
        name = str(name)
        where = f"{key}: " if key else ""
        if name in self._unavailable:
            raise self._error(f"{where}{name} is not available in this build: {self._unavailable[name]}")
        if name in self._entries:
            return self[name]
        if self._fallback is not None:
            return self._fallback(name)
        if self.dotted_paths and _looks_dotted(name):
            try:
                entry = import_callable(name, kind=self.kind)
            except ValueError as exc:
                raise self._error(f"{where}{exc}") from None
            if self._check is not None:
                self._check(name, entry)
            return entry
        hint = " (or a dotted path such as 'my_package.module:function')" if self.dotted_paths else ""
        if key:
            raise self._error(f"{key}: unknown {name!r}; choose one of {', '.join(self.names())}{hint}")
        raise self._error(f"unknown {self.kind} {name!r}; known {self.kind}s: {', '.join(self.names())}{hint}")

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
