"""Layouts: how the ranks' local values relate to the oracle's global value.

Two split rules are in common use and they disagree on uneven sizes. With 5 rows on 4 ranks:

* ``"dtensor"`` (the default, DTensor's ``Shard(dim)``; torch TP / FSDP2 use it): every shard has
  ``ceil(5/4) = 2`` rows until the rows run out: ``[2, 2, 1, 0]``;
* ``"tensor_split"`` (``torch.tensor_split``; Megatron-style hand-written code): the first
  ``5 % 4`` shards get one extra row: ``[2, 1, 1, 1]``.

(``torch.chunk`` would return only 3 pieces; never use it to slice ranks.)

A layout answers three questions for the driver, which never relies on the collectives under test:
what shape each rank must hold, which part of the global value each rank must hold, and how to
rebuild the global value from the locals.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from shardfuzz.errors import InvalidArgument

# torch is imported inside the methods that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py)

SPLIT_RULES = ("dtensor", "tensor_split")


def split_sizes(size: int, parts: int, rule: str = "dtensor") -> list[int]:
    """Sizes of the ``parts`` shards of a dim of length ``size`` under ``rule``."""
    if parts < 1:
        raise InvalidArgument(f"parts={parts!r}; must be >= 1")
    if size < 0:
        raise InvalidArgument(f"size={size!r}; must be >= 0")
    if rule == "dtensor":
        chunk = -(-size // parts)
        return [max(0, min(chunk, size - i * chunk)) for i in range(parts)]
    if rule == "tensor_split":
        base, rem = divmod(size, parts)
        return [base + (1 if i < rem else 0) for i in range(parts)]
    raise InvalidArgument(f"rule={rule!r}; allowed: {', '.join(map(repr, SPLIT_RULES))}")


def split_offsets(size: int, parts: int, rule: str = "dtensor") -> list[int]:
    """Start offset of each shard."""
    sizes = split_sizes(size, parts, rule)
    return [sum(sizes[:i]) for i in range(parts)]


@functools.lru_cache(maxsize=4096)
def _split(size: int, parts: int, rule: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and offsets of a split, once per (size, parts, rule): the judge cuts every rank's
    piece of every output, tens of times an example."""
    return tuple(split_sizes(size, parts, rule)), tuple(split_offsets(size, parts, rule))


class Layout:
    """Base class. Subclasses are frozen dataclasses, so they pickle and print cleanly."""

    #: whether each rank's local can be compared on its own (False for Partial)
    per_rank: bool = True

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        raise NotImplementedError

    def expected_shape(
        self, held: tuple[int, ...], global_shape: tuple[int, ...], rank: int, parts: int
    ) -> tuple[int, ...]:
        """The shape ``rank`` must hold, given the shape ``held`` it holds (for layouts with a choice)."""
        return self.local_shape(global_shape, rank, parts)

    def holds_piece(self, held: tuple[int, ...], global_shape: tuple[int, ...]) -> bool:
        """Whether a local of shape ``held`` holds something to compare."""
        return True

    def check_group(self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...]) -> str | None:
        """A problem with one group's local shapes taken together, or None."""
        return None

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        """The part of the global ``value`` (a tensor) that ``rank`` must hold."""
        raise NotImplementedError

    def comparable(self, local: Any, rank: int, parts: int, global_shape: tuple[int, ...]) -> Any:
        """The part of a rank's local that is compared (all of it, except padding)."""
        return local

    def assemble(self, locals_: list[Any]) -> Any:
        """Rebuild the global value from every rank's local, in group-rank order."""
        raise NotImplementedError

    def index_of(self, rank: int, group_size: int) -> int:
        """The index a world rank has in this layout's methods: its group rank."""
        return rank % group_size

    def replicas(self, case: Any) -> list[list[int]]:
        """The world ranks whose locals together make one global value, per replica."""
        return case.replica_ranks

    def assemble_at(self, ranks: list[int], locals_: list[Any]) -> Any:
        """:meth:`assemble` the locals of world ``ranks`` (one replica)."""
        return self.assemble(locals_)

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        """Map an index into a rank's (comparable) local to an index into the global value."""
        return local_index


def _norm_dim(dim: int, ndim: int, layout: Layout) -> int:
    if not -ndim <= dim < max(ndim, 1):
        raise InvalidArgument(f"{layout!r}: dim={dim!r} is out of range for a {ndim}-d value")
    return dim % ndim


@dataclasses.dataclass(frozen=True)
class Shard(Layout):
    """Rank ``i`` holds the ``i``-th shard of ``dim`` under ``rule`` (``"dtensor"`` or ``"tensor_split"``).

    ``blocks=k``: ``dim`` is ``k`` equal blocks fused into one tensor (a fused ``[q; k; v]`` or
    ``[gate; up]`` projection weight), each block split over the ranks, and rank ``i`` holds its shard
    of every block, in block order (Megatron's fused QKV, vLLM's ``MergedColumnParallelLinear``). A
    plain ``Shard(0)`` of a fused ``[gate; up]`` weight gives rank 0 gate rows only: the classic bug."""

    dim: int
    rule: str = "dtensor"
    blocks: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int):
            raise InvalidArgument(f"Shard(dim={self.dim!r}); dim must be an int")
        if self.rule not in SPLIT_RULES:
            raise InvalidArgument(f"Shard(rule={self.rule!r}); allowed: {', '.join(map(repr, SPLIT_RULES))}")
        if not isinstance(self.blocks, int) or isinstance(self.blocks, bool) or self.blocks < 1:
            raise InvalidArgument(f"Shard(blocks={self.blocks!r}); blocks must be an int >= 1 (1: not fused)")

    def __repr__(self) -> str:
        args = [str(self.dim)]
        if self.rule != "dtensor":
            args.append(f"rule={self.rule!r}")
        if self.blocks != 1:
            args.append(f"blocks={self.blocks}")
        return f"Shard({', '.join(args)})"

    def _block(self, size: int) -> int:
        """The size of one fused block of a dim of ``size``."""
        if size % self.blocks:
            raise InvalidArgument(
                f"{self!r}: dim {self.dim} has size {size}, not a multiple of blocks={self.blocks} "
                "(the fused blocks must be equal)"
            )
        return size // self.blocks

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        shape = list(global_shape)
        shape[d] = self.blocks * split_sizes(self._block(global_shape[d]), parts, self.rule)[rank]
        return tuple(shape)

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        import torch

        d = _norm_dim(self.dim, value.ndim, self)
        m = self._block(value.shape[d])
        sizes, offsets = _split(m, parts, self.rule)
        pieces = [value.narrow(d, b * m + offsets[rank], sizes[rank]) for b in range(self.blocks)]
        return pieces[0] if self.blocks == 1 else torch.cat(pieces, dim=d)

    def assemble(self, locals_: list[Any]) -> Any:
        import torch

        d = _norm_dim(self.dim, locals_[0].ndim, self)
        if self.blocks == 1:
            return torch.cat(list(locals_), dim=d)
        # each local is its shard of every block, in block order: block b of rank r is its b-th chunk
        chunked = [t.chunk(self.blocks, dim=d) if t.shape[d] else [t] * self.blocks for t in locals_]
        return torch.cat([c[b] for b in range(self.blocks) for c in chunked], dim=d)

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        m = self._block(global_shape[d])
        idx = list(local_index)
        size = split_sizes(m, parts, self.rule)[rank]
        block, within = divmod(idx[d], size) if self.blocks > 1 and size else (0, idx[d])
        idx[d] = block * m + split_offsets(m, parts, self.rule)[rank] + within
        return tuple(idx)


@dataclasses.dataclass(frozen=True)
class Replicate(Layout):
    """Every rank holds the whole value. Every rank is checked, not just rank 0."""

    def __repr__(self) -> str:
        return "Replicate()"

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        return tuple(global_shape)

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        return value

    def assemble(self, locals_: list[Any]) -> Any:
        return locals_[0]


@dataclasses.dataclass(frozen=True)
class Partial(Layout):
    """Every rank holds a full-shape partial value; their sum over ranks is the global value."""

    per_rank = False

    def __repr__(self) -> str:
        return "Partial()"

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        return tuple(global_shape)

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        raise InvalidArgument("Partial() has no per-rank piece; compare the assembled sum")

    def assemble(self, locals_: list[Any]) -> Any:
        import torch

        return torch.stack([t.double() if t.is_floating_point() else t for t in locals_]).sum(0)


@dataclasses.dataclass(frozen=True)
class PaddedFlat(Layout):
    """A 1-D value padded to a multiple of the group size, then split evenly (ZeRO's flat buffers).

    Rank ``i`` holds ``ceil(n / parts)`` elements; the padding at the end of the last shard(s) is
    never compared.
    """

    def __repr__(self) -> str:
        return "PaddedFlat()"

    def _chunk(self, n: int, parts: int) -> int:
        return -(-n // parts)

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        if len(global_shape) != 1:
            raise InvalidArgument(f"PaddedFlat() needs a 1-d value, got shape {tuple(global_shape)}")
        return (self._chunk(global_shape[0], parts),)

    def _valid(self, n: int, rank: int, parts: int) -> tuple[int, int]:
        c = self._chunk(n, parts)
        start = min(rank * c, n)
        return start, max(0, min(c, n - start))

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        start, k = self._valid(value.shape[0], rank, parts)
        return value[start : start + k]

    def comparable(self, local: Any, rank: int, parts: int, global_shape: tuple[int, ...]) -> Any:
        _, k = self._valid(global_shape[0], rank, parts)
        return local[:k]

    def assemble(self, locals_: list[Any]) -> Any:
        import torch

        return torch.cat(list(locals_))

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        start, _ = self._valid(global_shape[0], rank, parts)
        return (local_index[0] + start,)


@dataclasses.dataclass(frozen=True)
class Zigzag(Layout):
    """Load-balanced causal sequence layout (ring / context parallel "zigzag").

    ``dim`` is cut into ``2 * parts`` chunks (``tensor_split`` rule, so uneven lengths work) and
    rank ``r`` holds chunks ``r`` and ``2 * parts - 1 - r``, concatenated: every rank gets one early
    and one late chunk, balancing causal attention work.
    """

    dim: int

    def __repr__(self) -> str:
        return f"Zigzag({self.dim})"

    def _chunks(self, n: int, rank: int, parts: int) -> list[tuple[int, int]]:
        sizes = split_sizes(n, 2 * parts, "tensor_split")
        offs = [sum(sizes[:i]) for i in range(2 * parts)]
        return [(offs[c], sizes[c]) for c in (rank, 2 * parts - 1 - rank)]

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        shape = list(global_shape)
        shape[d] = sum(k for _, k in self._chunks(global_shape[d], rank, parts))
        return tuple(shape)

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        import torch

        d = _norm_dim(self.dim, value.ndim, self)
        return torch.cat([value.narrow(d, o, k) for o, k in self._chunks(value.shape[d], rank, parts)], dim=d)

    def assemble(self, locals_: list[Any]) -> Any:
        import torch

        parts = len(locals_)
        d = _norm_dim(self.dim, locals_[0].ndim, self)
        total = sum(t.shape[d] for t in locals_)
        chunks: dict[int, Any] = {}
        for r, t in enumerate(locals_):
            (o1, k1), (o2, k2) = self._chunks(total, r, parts)
            chunks[o1] = t.narrow(d, 0, k1)
            chunks[o2] = t.narrow(d, k1, k2)
        return torch.cat([chunks[o] for o in sorted(chunks)], dim=d)

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        (o1, k1), (o2, _) = self._chunks(global_shape[d], rank, parts)
        idx = list(local_index)
        idx[d] = o1 + idx[d] if idx[d] < k1 else o2 + idx[d] - k1
        return tuple(idx)


@dataclasses.dataclass(frozen=True)
class Owned(Layout):
    """Exactly one rank of the group (the owner) holds the whole value; every other rank holds an
    empty tensor of shape ``(0,)``. For state that one rank owns, e.g. ZeroRedundancyOptimizer's
    per-parameter optimizer state. Which rank owns it is the implementation's business, unless
    ``rank`` names it: a group rank, negative from the end (``Owned(rank=0)``: a pipeline's first
    stage, ``Owned(rank=-1)``: its last). That exactly one does (the one named) is checked.
    """

    rank: int | None = None

    def __post_init__(self) -> None:
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)):
            raise InvalidArgument(
                f"Owned(rank={self.rank!r}); must be a group rank (an int, -1: the last) or None"
            )

    def __repr__(self) -> str:
        return "Owned()" if self.rank is None else f"Owned(rank={self.rank})"

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        return tuple(global_shape)  # the owner's; every other rank holds (0,)

    def expected_shape(
        self, held: tuple[int, ...], global_shape: tuple[int, ...], rank: int, parts: int
    ) -> tuple[int, ...]:
        return (0,) if tuple(held) == (0,) else tuple(global_shape)

    def holds_piece(self, held: tuple[int, ...], global_shape: tuple[int, ...]) -> bool:
        return tuple(held) != (0,) or tuple(global_shape) == (0,)

    def check_group(self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...]) -> str | None:
        owner = self.owner_of(shapes, global_shape)
        if owner is None:
            return (
                f"exactly one rank must hold {list(global_shape)} and the others [0] (torch.empty(0): a "
                f"rank that does not own it); they hold {[list(s) for s in shapes]}"
            )
        if self.rank is not None and not -len(shapes) <= self.rank < len(shapes):
            return f"{self!r} names a rank the group of {len(shapes)} does not have"
        if self.rank is not None and owner != self.rank % len(shapes):
            return (
                f"group rank {self.rank % len(shapes)} ({self!r}) must hold {list(global_shape)}; "
                f"group rank {owner} holds it"
            )
        return None

    def owner_of(self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...]) -> int | None:
        """The owning group rank, or None when not exactly one rank holds the value."""
        owners = [r for r, s in enumerate(shapes) if tuple(s) == tuple(global_shape) and s != (0,)]
        others_empty = all(tuple(s) == (0,) for r, s in enumerate(shapes) if r not in owners)
        return owners[0] if len(owners) == 1 and others_empty else None

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        return value

    def assemble(self, locals_: list[Any]) -> Any:
        return next(t for t in locals_ if tuple(t.shape) != (0,))


def check_layout(value: Any, name: str) -> Layout:
    if not isinstance(value, Layout):
        raise InvalidArgument(
            f"{name}={value!r} is not a layout; use Shard(dim), Shard(dim, rule='tensor_split'), "
            "Replicate(), Partial(), PaddedFlat(), Zigzag(dim) or Owned()"
        )
    return value


def strided_view(t: Any) -> Any:
    """A non-contiguous view with ``t``'s values, the way a slice of a fused buffer is one (``q`` of
    a ``qkv`` projection): the first ``n`` columns of a buffer one column wider, or every other
    element of one twice as long for a single row. A tensor of fewer than 2 elements is
    contiguous in every layout and is returned as it is."""
    if t.dim() == 0 or t.numel() < 2:
        return t
    n = t.shape[-1]
    rows = t.numel() // n
    view = (
        t.new_empty(2 * n)[::2]
        if rows == 1 and t.dim() == 1
        else t.new_empty((*t.shape[:-1], n + 1))[..., :n]
    )
    if view.is_contiguous():  # one row of a 2-D or higher tensor: widen it the other way
        view = t.new_empty((*t.shape, 2))[..., 0]
    return view.copy_(t)
