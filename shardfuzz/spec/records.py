"""The records a target file declares: planted bugs, expected failures, the finding each must give
(:class:`Expect`), and implementations bound with arguments (:func:`bind`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from shardfuzz.case import Case
from shardfuzz.errors import TargetError

KINDS = ("mismatch", "layout", "rank-error", "hang", "ignored-collective", "communication")


@dataclasses.dataclass(frozen=True)
class Bound:
    """An implementation bound with keyword arguments (see :func:`bind`)."""

    impl: Any
    kwargs: Mapping[str, Any]


def bind(impl: Any, **kwargs: Any) -> Bound:
    """``impl`` called as ``impl(ctx, **kwargs)`` on every rank, e.g. ``bind("reference", bug="x")``.

    The arguments travel to the ranks and into failure files, so they must be JSON values.
    """
    for k, v in kwargs.items():
        if not isinstance(v, (str, int, float, bool, type(None))):
            raise TargetError(f"bind({impl!r}, {k}={v!r}): arguments must be str, int, float, bool or None")
    return Bound(impl, dict(kwargs))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Expect:
    """What the shrunk counterexample of a planted bug (or expected failure) must look like:
    structure, never seeds. Keyword-only: a record reads as what it says
    (``Expect(kind="mismatch", world_size=2, mesh=(2,), outputs=("y",))``).

    Attributes:
        kind: the failure kind ("mismatch", "layout", "rank-error", "hang", "ignored-collective",
            "communication"), or a tuple of them for a bug with several minimal forms (the shrinker
            minimises the first kind it meets: ``kinds``).
        world_size, mesh: the smallest world size and mesh that trigger the bug (``world_size`` may
            be a tuple of accepted sizes, with ``mesh=None`` meaning the 1-D mesh).
        uneven: the split sizes that must be uneven in the minimal case; all others must be even
            (``None``: not checked, when ``check`` accepts several minimal forms).
        check: an extra structural predicate on the case.
        outputs: for mismatches, exactly these outputs are wrong (e.g. only a gradient), or a
            predicate on the tuple of wrong outputs.
        timeout: a fixed example timeout (hang bugs: keep it short).
        note: what ``check`` asks for, in words, for the README's minimal-case column.
        needs: the trigger conditions the bug needs at once (labels of ``docs/triggers.md`` or of
            the target's ``triggers``, or ``option=value``, e.g. ``("uneven", "causal")``): the
            shrunk case must reach every one of them.
        exclude: ``--exclude`` expressions of the implementation's *other* known failures, set
            aside (counted) while this one is searched: one implementation, several findings.
    """

    kind: str | tuple[str, ...]
    world_size: int | tuple[int, ...]
    mesh: tuple[int, ...] | None
    uneven: tuple[str, ...] | None = ()
    check: Callable[[Case], bool] | None = None
    outputs: tuple[str, ...] | Callable[[tuple[str, ...]], bool] | None = None
    timeout: float | None = None
    note: str = ""
    needs: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise TargetError(f"Expect(kind={self.kind!r}); allowed: {', '.join(KINDS)}, or a tuple of them")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The accepted kinds, as a tuple."""
        return self.kind if isinstance(self.kind, tuple) else (self.kind,)


@dataclasses.dataclass(frozen=True)
class PlantedBug:
    """A planted bug: a small change to the reference that models a real bug.

    Attributes:
        name: the implementation name it gets (``--impl NAME``).
        models: what real bug it models, in one line.
        expect: the finding the fuzzer must make, shrunk (:class:`Expect`).
        p95: the 95th percentile of examples to the first failure over 20 seeds, measured with
            ``benchmarks/budget.py``; the test budget is ``2 * p95 + 10``.
        link: the upstream issue or pull request of the real bug, if there is one.
        impl: the implementation; default: the reference bound with ``bug=name``.
    """

    name: str
    models: str
    expect: Expect
    p95: int
    link: str = ""
    impl: Any = None

    @property
    def description(self) -> str:
        return f"{self.models} ({self.link})" if self.link else self.models


@dataclasses.dataclass(frozen=True)
class ExpectedFailure:
    """An implementation known to fail (usually real upstream code), with the finding it gives."""

    name: str
    reason: str
    expect: Expect
    p95: int
    link: str = ""
    impl: Any = None

    @property
    def description(self) -> str:
        return f"{self.reason} ({self.link})" if self.link else self.reason
