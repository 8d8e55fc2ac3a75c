"""A Hypothesis example database keyed per target, implementation and backend.

Every test that :func:`shardfuzz.engine.search.build_test` makes has the same function digest, so with a
shared database they would replay each other's examples. Wrapping the user's database with a key
prefix keeps them apart while still using Hypothesis' own storage and replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis.database import ExampleDatabase

from shardfuzz.engine.shared_db import PRIMARY_REPLAYED

#: Hypothesis' other corpora of a test (its key plus these): sampled by Hypothesis itself
_SIDE_CORPORA = (b".secondary", b".pareto")


class KeyedDatabase(ExampleDatabase):
    """Prefixes every key with ``prefix`` before delegating to ``inner``."""

    def __init__(self, inner: ExampleDatabase, prefix: str) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix.encode() + b"\x00"

    def __repr__(self) -> str:
        return f"KeyedDatabase({self.inner!r}, {self.prefix[:-1].decode()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyedDatabase) and (self.inner, self.prefix) == (
            other.inner,
            other.prefix,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.prefix))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        values = self.inner.fetch(self.prefix + key)
        if key.endswith(_SIDE_CORPORA):
            return values
        # the primary corpus: Hypothesis replays every entry of it before it searches, and a shared
        # one grows by what each run's shrink saved (a new user's fleet: 666 entries after 130 runs,
        # so a worker started later spent 2 m 42 s replaying them); its smallest are the findings
        return sorted(values, key=lambda v: (len(v), v))[:PRIMARY_REPLAYED]

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)


def keyed_database(db: Any, key: str) -> Any:
    """``db`` with every key prefixed by ``key`` (an already keyed database is re-keyed)."""
    if isinstance(db, KeyedDatabase):
        db = db.inner
    return KeyedDatabase(db, key)
