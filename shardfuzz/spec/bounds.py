"""The sizes a target's strategy of cases draws: :class:`Split` (sharded over the implementation's
group, drawn per rank) and :class:`Free` (not sharded), and the mesh shapes of a world size.
``shardfuzz.strategies`` draws from them (and re-exports them: ``sst.Split``, ``sst.Free``).

Imports only the core, no Hypothesis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardfuzz.errors import InvalidArgument

__all__ = ["Free", "Split", "check_int", "check_range", "mesh_shapes_for"]


def check_int(name: str, value: Any, minimum: int) -> None:
    """InvalidArgument unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name}={value!r}; must be an int >= {minimum}")


def check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    """InvalidArgument when ``lo > hi``."""
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} > {hi_name}={hi!r}; no value can satisfy both bounds")


def mesh_shapes_for(world_size: int, *, max_dims: int = 2) -> list[tuple[int, ...]]:
    """Mesh shapes for a world size, simplest first: 1-D, then 2-D factorisations (size-1 axes included)."""
    check_int("world_size", world_size, 1)
    check_int("max_dims", max_dims, 1)
    shapes: list[tuple[int, ...]] = [(world_size,)]
    if max_dims >= 2 and world_size > 1:
        two = [(a, world_size // a) for a in range(2, world_size) if world_size % a == 0]
        shapes += [*sorted(two, key=lambda s: (abs(s[0] - s[1]), s)), (1, world_size), (world_size, 1)]
    return shapes


@dataclasses.dataclass(frozen=True)
class Split:
    """A size sharded over the implementation's group: ``per_rank * group + remainder``.

    ``per_rank`` is drawn in ``[min_per_rank, max_per_rank]`` and the remainder in
    ``[0, group - 1]`` when ``uneven`` (else 0). Empty shards need ``allow_empty``: it lets
    ``per_rank`` be 0 (the global size still stays >= 1), so "uneven" never shrinks into "empty".
    ``min_size`` is the smallest global size, for a dim that is degenerate below it (a router over
    one expert has a softmax of one element: its gradient is exactly 0); a smaller draw is raised
    to it.
    """

    min_per_rank: int = 1
    max_per_rank: int = 3
    uneven: bool = True
    allow_empty: bool = False
    min_size: int = 1

    def __post_init__(self) -> None:
        check_int("min_per_rank", self.min_per_rank, 0)
        check_int("max_per_rank", self.max_per_rank, 0)
        check_range("min_per_rank", self.min_per_rank, "max_per_rank", self.max_per_rank)
        if self.min_per_rank == 0 and not self.allow_empty:
            raise InvalidArgument("min_per_rank=0 gives empty shards; pass allow_empty=True to allow them")
        if self.max_per_rank == 0 and not self.uneven:
            raise InvalidArgument("max_per_rank=0 with uneven=False gives a global size of 0")
        check_int("min_size", self.min_size, 1)


@dataclasses.dataclass(frozen=True)
class Free:
    """A size that is not sharded, in ``[min_size, max_size]``; shrinks toward ``min_size``."""

    min_size: int = 1
    max_size: int = 4

    def __post_init__(self) -> None:
        check_int("min_size", self.min_size, 0)
        check_int("max_size", self.max_size, 0)
        check_range("min_size", self.min_size, "max_size", self.max_size)
