"""DTensor outputs: an implementation may return DTensors, and their own placements say where each
rank's local piece sits in the oracle's global value.

On the rank, :func:`describe` turns a DTensor into a :class:`DTensorPiece`: its local tensor, its
global shape, its placements and its device mesh (the mesh's global ranks, this rank's
coordinate). On the driver, :func:`resolve` turns the pieces of one output into a :class:`Placed`
layout, which the judge uses like any declared layout. The piece each rank must hold is computed
here from the oracle's shape with DTensor's rule (``Shard(d)`` on each mesh axis in turn, nested:
``ceil(n / parts)`` rows until they run out), never read back from torch, so a DTensor built with
a wrong local shape (``DTensor.from_local`` without ``run_check``) is a layout finding.

Every pending reduction DTensor's own ops return is read by its exact semantics
(:data:`PARTIAL_OPS`): ``Partial("sum")`` and ``_MaskPartial`` (embedding: rows a rank does not
own are zero) are summed over the ranks of that axis, ``"avg"`` averaged, ``"max"``/``"min"``
reduced by max/min, ``"product"`` (``prod`` of a sharded dim) multiplied, and ``_NormPartial(p)`` (a vector norm of each rank's piece) combined as
``(sum |x|^p)^(1/p)`` (``p = inf``: max, ``-inf``: min, ``0``: a count, summed). Replicated copies
are each compared, except under a ``Partial``, where the copy at coordinate 0 of every
``Replicate`` axis is reduced. A placement that cannot be laid out here (``_StridedShard``, a
subclass torch adds later, ``Partial`` axes with different reductions) is compared through
``full_tensor()``, run on the ranks after the implementation returned and outside its trace, and
the layout says so: never a finding against the implementation.

A DTensor output uses its placements whatever layout the target declares for that output: a
built-in target's DTensor-returning implementation (torch TP, FSDP2) needs no wrapper. Declare
:class:`FromDTensor` for an output that must be a DTensor.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import torch

from shardfuzz.case import Case
from shardfuzz.errors import InvalidArgument, TargetError
from shardfuzz.protocol import decode, encode
from shardfuzz.spec.layouts import Layout, split_offsets, split_sizes

# torch.distributed.tensor (DTensor: 0.7-1.2 s on top of torch) is imported where a DTensor is
# handled: a driver whose targets use none never loads it (the ranks' forkserver preloads it)

#: the reductions of a pending (Partial) placement that can be rebuilt from the ranks' pieces
PARTIAL_OPS = ("sum", "avg", "max", "min", "product", "norm")


@dataclasses.dataclass(frozen=True)
class DTensorPiece:
    """What a rank sends for a DTensor output (``local`` is encoded, as every output is).

    ``placements`` are ``("shard", dim)``, ``("replicate",)``, ``("partial", op)``,
    ``("partial", "norm", p)`` or ``("partial", "sum", "mask")``, one per mesh axis;
    ``mesh_ranks`` the mesh's global ranks, row-major; ``coordinate`` this rank's. ``via`` is set
    when ``local`` is the whole value from ``full_tensor()`` (the DTensor's own placements, as
    text): the placements are then Replicate on every axis.
    """

    local: Any
    global_shape: tuple[int, ...]
    placements: tuple[tuple[Any, ...], ...]
    mesh_shape: tuple[int, ...]
    mesh_ranks: tuple[int, ...]
    coordinate: tuple[int, ...]
    via: str = ""


def _placement(p: Any) -> tuple[Any, ...]:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if type(p) is Shard:  # a subclass (_StridedShard, FSDP2 + TP) is laid out otherwise
        return ("shard", int(p.dim))
    if isinstance(p, Replicate):
        return ("replicate",)
    if isinstance(p, Partial):
        # by what the subclass does, not its name: _NormPartial keeps reduce_op "sum" for its
        # p-th powers, _MaskPartial sums the masked lookups (torch 2.13)
        if hasattr(p, "norm_type"):
            return ("partial", "norm", float(p.norm_type))
        if type(p) is not Partial and type(p).__name__ == "_MaskPartial" and p.reduce_op == "sum":
            return ("partial", "sum", "mask")
        if type(p) is Partial and p.reduce_op in PARTIAL_OPS:
            return ("partial", str(p.reduce_op))
    return ("unknown", repr(p))


def _laid_out(placements: tuple[tuple[Any, ...], ...]) -> bool:
    """Whether the driver can rebuild the value from the pieces: every placement known, and the
    Partial axes all of one reduction (sums and averages mix: a sum, then a division). Two axes of
    different reductions (max on one, sum on the other) reduce in an order the pieces do not tell."""
    if any(p[0] == "unknown" for p in placements):
        return False
    kinds = {(_reduction(p), p[2] if p[1] == "norm" else None) for p in placements if p[0] == "partial"}
    return {k for k, _ in kinds} <= {"sum", "avg"} or len(kinds) == 1


def _reduction(p: tuple[Any, ...]) -> str:
    """The reduction of a partial placement: ``sum``, ``avg``, ``max``, ``min``, ``product`` or ``norm``."""
    return "norm" if p[1] == "norm" else str(p[1])


def describe(value: Any) -> Any:
    """A DTensor as a :class:`DTensorPiece`; any other value unchanged (on the rank)."""
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor can exist: skip the import
        return value
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor):
        return value
    mesh = value.device_mesh
    placements = tuple(_placement(p) for p in value.placements)
    via = ""
    local = value.to_local()
    if not _laid_out(placements):
        # a collective on every rank of the mesh: every rank holds this output with the same
        # placements (DTensor's own invariant), and the trace is already stopped
        via = ", ".join(map(str, value.placements))
        local = value.full_tensor()
        placements = tuple(("replicate",) for _ in placements)
    return DTensorPiece(
        local=encode(local),
        global_shape=tuple(value.shape),
        placements=placements,
        mesh_shape=tuple(mesh.shape),
        mesh_ranks=tuple(int(r) for r in mesh.mesh.flatten().tolist()),
        coordinate=tuple(int(c) for c in (mesh.get_coordinate() or ())),
        via=via,
    )


def placement_text(p: tuple[Any, ...]) -> str:
    kind = p[0]
    if kind == "shard":
        return f"Shard({p[1]})"
    if kind == "replicate":
        return "Replicate()"
    if kind == "partial" and p[1] == "norm":
        return f"_NormPartial({p[2]:g})"
    if kind == "partial" and p[2:] == ("mask",):
        return "_MaskPartial(sum)"
    if kind == "partial":
        return f"Partial({p[1]})"
    return str(p[1])


def box(
    shape: tuple[int, ...],
    placements: tuple[tuple[Any, ...], ...],
    mesh_shape: tuple[int, ...],
    coordinate: tuple[int, ...],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (offset, shape) of the piece at ``coordinate`` under DTensor's rule, mesh axes in turn."""
    offset, size = [0] * len(shape), list(shape)
    for axis, p in enumerate(placements):
        if p[0] != "shard":
            continue
        d = p[1] % len(shape) if shape else 0
        parts, c = mesh_shape[axis], coordinate[axis]
        offset[d] += split_offsets(size[d], parts, "dtensor")[c]
        size[d] = split_sizes(size[d], parts, "dtensor")[c]
    return tuple(offset), tuple(size)


@dataclasses.dataclass(frozen=True)
class FromDTensor(Layout):
    """Declared for an output that every implementation returns as a DTensor: its placements
    decide the layout. A plain tensor there is a layout finding."""

    def __repr__(self) -> str:
        return "FromDTensor()"

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        raise InvalidArgument("FromDTensor(): the output must be a DTensor; its placements give the layout")


@dataclasses.dataclass(frozen=True)
class AsDTensor(Layout):
    """An input layout: the ranks get the input as a DTensor with ``placements`` (torch's
    ``Shard``/``Replicate`` objects) on the mesh axis under test (``mesh="impl"``) or on the whole
    case mesh (``mesh="all"``), made by ``distribute_tensor(..., src_data_rank=None)``: each rank
    takes its piece of the full input locally, no collective."""

    placements: tuple[Any, ...]
    mesh: str = "impl"

    def __init__(self, *placements: Any, mesh: str = "impl") -> None:
        if mesh not in ("impl", "all"):
            raise InvalidArgument(f"AsDTensor(mesh={mesh!r}); allowed: 'impl', 'all'")
        if not placements:
            raise InvalidArgument("AsDTensor(): give one placement per mesh axis, e.g. AsDTensor(Shard(0))")
        if mesh == "impl" and len(placements) != 1:  # a new user's two were reported as a finding
            raise InvalidArgument(
                f"AsDTensor({', '.join(map(repr, placements))}): the axis under test is one mesh axis, so it "
                "takes one placement; for one placement per axis of the case's mesh, AsDTensor(..., mesh='all')"
            )
        object.__setattr__(self, "placements", tuple(placements))
        object.__setattr__(self, "mesh", mesh)

    def __repr__(self) -> str:
        return f"AsDTensor({', '.join(map(repr, self.placements))}, mesh={self.mesh!r})"

    def distribute(self, value: Any, device_mesh: Any) -> Any:
        from torch.distributed.tensor import distribute_tensor

        mesh = device_mesh if self.mesh == "all" else device_mesh["impl"]
        if len(self.placements) != mesh.ndim:
            raise InvalidArgument(f"{self!r}: {len(self.placements)} placements for a {mesh.ndim}-d mesh")
        return distribute_tensor(value, mesh, list(self.placements), src_data_rank=None)


def check_dtensor_inputs(target: Any, case: Case) -> None:
    """TargetError (in the driver, before any rank runs) for an ``AsDTensor(..., mesh="all")`` input
    whose placements do not match the case's mesh, one per axis: on the ranks it raised inside the
    implementation's example and was reported as a finding of the user's code."""
    for name, layout in target.input_layouts.items():
        if (
            isinstance(layout, AsDTensor)
            and layout.mesh == "all"
            and len(layout.placements) != len(case.mesh)
        ):
            raise TargetError(
                f"target {target.name!r}: input_layouts[{name!r}]={layout!r} has {len(layout.placements)} "
                f"placement(s), one per axis of the whole mesh, but this case's mesh {tuple(case.mesh)} has "
                f"{len(case.mesh)}: a strategy that draws meshes of other ranks (1-D and 2-D) needs "
                "AsDTensor(p, mesh='impl') on the axis under test, or the DTensor built in the "
                "implementation from ctx.mesh.device_mesh()"
            )


def local_input(layout: Layout, value: Any, mesh: Any, group_rank: int, group_size: int) -> Any:
    """What ``ctx.local`` holds for a full input ``value`` under its input ``layout`` (on the rank)."""
    if isinstance(layout, AsDTensor):
        return layout.distribute(value, mesh.device_mesh())
    return layout.piece(value, group_rank, group_size)


@dataclasses.dataclass(frozen=True)
class Placed(Layout):
    """The layout of one DTensor output, built from the ranks' pieces: per world rank, the
    (offset, shape) box it holds; the world ranks of each device mesh; the ranks whose locals are
    summed under ``Partial``."""

    placements: tuple[tuple[Any, ...], ...]
    mesh_shape: tuple[int, ...]
    boxes: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    meshes: tuple[tuple[int, ...], ...]
    summed: tuple[int, ...]
    global_shape: tuple[int, ...]
    per_rank: bool = True
    divide: int = 1
    reduce: str = "sum"  # how the pieces of a Partial combine: sum, max, min, product or norm
    norm_p: float = 2.0
    via: str = ""  # the DTensor's own placements when compared through full_tensor()

    def __repr__(self) -> str:
        if self.via:
            return f"DTensor({self.via}) on mesh {self.mesh_shape}, compared through full_tensor()"
        return f"DTensor({', '.join(placement_text(p) for p in self.placements)}) on mesh {self.mesh_shape}"

    def index_of(self, rank: int, group_size: int) -> int:
        return rank  # boxes are per world rank

    def replicas(self, case: Case) -> list[list[int]]:
        return [list(m) for m in self.meshes]

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        return self.boxes[rank][1]

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        offset, size = self.boxes[rank]
        return value[tuple(slice(o, o + s) for o, s in zip(offset, size))]

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        return tuple(o + i for o, i in zip(self.boxes[rank][0], local_index))

    def assemble_at(self, ranks: list[int], locals_: list[Any]) -> Any:
        floating = locals_[0].is_floating_point()
        dtype = torch.float64 if floating else locals_[0].dtype
        p, reduce = self.norm_p, self.reduce
        if reduce == "norm" and math.isinf(p):  # the inf-norm of pieces is the max of their norms
            reduce = "max" if p > 0 else "min"
        if floating:
            start: Any = {"max": -math.inf, "min": math.inf, "product": 1.0}.get(reduce, 0.0)
        else:  # an integer max/min starts from the dtype's own extremes, not 0
            low, high = (
                (False, True) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
            )
            start = {"max": low, "min": high, "product": 1}.get(reduce, 0)
        total = torch.full(self.global_shape, start, dtype=dtype)
        for r, local in zip(ranks, locals_):
            if r not in self.summed:
                continue
            offset, size = self.boxes[r]
            at = tuple(slice(o, o + s) for o, s in zip(offset, size))
            x = local.to(dtype)
            if reduce == "max":
                total[at] = torch.maximum(total[at], x)
            elif reduce == "min":
                total[at] = torch.minimum(total[at], x)
            elif reduce == "product":
                total[at] *= x
            elif reduce == "norm" and p != 0:
                total[at] += x.abs() ** p
            else:  # sum, avg (divided below), and the 0-"norm", a count of nonzeros
                total[at] += x
        if reduce == "norm" and p != 0 and not math.isinf(p):
            total = total ** (1.0 / p)
        return total / self.divide if self.divide > 1 else total


def resolve(
    case: Case, outputs: dict[str, Layout], locals_: list[dict[str, Any]], ref: dict[str, Any]
) -> tuple[dict[str, Layout], list[dict[str, Any]], list[str]]:
    """Replace each DTensor output's declared layout by its :class:`Placed` layout and its pieces
    by their local tensors; the problems found (a layout finding) on the side."""
    outputs, locals_ = dict(outputs), [dict(out) for out in locals_]
    problems: list[str] = []
    for name, declared in list(outputs.items()):
        values = [out.get(name) for out in locals_]
        pieces = [v for v in values if isinstance(v, DTensorPiece)]
        if not pieces:
            plain = [r for r, v in enumerate(values) if v is not None]
            if isinstance(declared, FromDTensor) and plain:
                problems.append(
                    f"output {name!r} (FromDTensor()): {case.rank_label(plain[0])} returned a plain "
                    "value, expected a DTensor"
                )
            continue
        placed, problem = _placed(case, name, values, tuple(getattr(ref.get(name), "shape", ())))
        if problem:
            problems.append(problem)
            continue
        outputs[name] = placed
        for out in locals_:
            out[name] = decode(out[name].local)
    return outputs, locals_, problems


def _placed(case: Case, name: str, values: list[Any], shape: tuple[int, ...]) -> tuple[Any, str]:
    label = case.rank_label
    plain = [r for r, v in enumerate(values) if not isinstance(v, DTensorPiece)]
    if plain:
        return None, f"output {name!r}: {label(plain[0])} returned a plain value where others return DTensors"
    first = values[0]
    for r, v in enumerate(values):
        if (v.placements, v.mesh_shape) != (first.placements, first.mesh_shape):
            return None, (
                f"output {name!r}: {label(r)} holds a DTensor with placements "
                f"{[placement_text(p) for p in v.placements]} on mesh {v.mesh_shape}, {label(0)} "
                f"{[placement_text(p) for p in first.placements]} on mesh {first.mesh_shape}"
            )
        if v.global_shape != shape:  # its placements say why: a sharded value labelled Replicate
            return None, _wrong_global_shape(case, name, values, shape)
        if v.mesh_ranks[int(_flat(v.coordinate, v.mesh_shape))] != r:
            return (
                None,
                f"output {name!r}: {label(r)} is at {v.coordinate} of a mesh {v.mesh_ranks} that puts another rank there",
            )
    if not _laid_out(first.placements):  # describe() sends these through full_tensor()
        return None, (
            f"output {name!r}: placements {[placement_text(p) for p in first.placements]} were sent "
            "without full_tensor(); this is shardfuzz's bug, not the implementation's"
        )
    meshes = sorted({v.mesh_ranks for v in values})
    partial_axes = [a for a, p in enumerate(first.placements) if p[0] == "partial"]
    replicate_axes = [a for a, p in enumerate(first.placements) if p[0] == "replicate"]
    summed = tuple(r for r, v in enumerate(values) if all(v.coordinate[a] == 0 for a in replicate_axes))
    divide = math.prod(first.mesh_shape[a] for a in partial_axes if first.placements[a][1] == "avg")
    reductions = {_reduction(first.placements[a]) for a in partial_axes} - {"avg"}
    norms = [first.placements[a][2] for a in partial_axes if first.placements[a][1] == "norm"]
    return Placed(
        placements=first.placements,
        mesh_shape=first.mesh_shape,
        boxes=tuple(box(shape, first.placements, first.mesh_shape, v.coordinate) for v in values),
        meshes=tuple(meshes),
        summed=summed,
        global_shape=shape,
        per_rank=not partial_axes,
        divide=max(divide, 1),
        reduce=reductions.pop() if reductions else "sum",
        norm_p=norms[0] if norms else 2.0,
        via=first.via,
    ), ""


#: said where the ranks' DTensors disagree on their global shape
FROM_LOCAL_INFERRED = (
    "the ranks disagree on the global shape: DTensor.from_local infers it from each rank's own local "
    "piece, as if every piece were as large (under Replicate, as if each were the whole value): check "
    "the placements, and pass shape= and stride= where the pieces differ"
)


def _wrong_global_shape(case: Case, name: str, values: list[Any], shape: tuple[int, ...]) -> str:
    """The problem of DTensors whose global shape is not the oracle's: every rank that holds a wrong
    one (a new user's report named rank 0 alone, where rank 1's was wrong too), and why where they
    disagree. Its placements, not the target's declared layout, are what is wrong."""
    first = values[0]
    placed = f"{[placement_text(p) for p in first.placements]} on mesh {first.mesh_shape}"
    if len({v.global_shape for v in values}) == 1:
        return (
            f"output {name!r}: every rank holds a DTensor of global shape {list(first.global_shape)} "
            f"({placed}), the oracle gives {list(shape)}"
        )
    wrong = ", ".join(
        f"{case.rank_label(r)} holds a DTensor of global shape {list(v.global_shape)}"
        for r, v in enumerate(values)
        if v.global_shape != shape
    )
    return f"output {name!r}: {wrong} ({placed}), the oracle gives {list(shape)} ({FROM_LOCAL_INFERRED})"


def _flat(coordinate: tuple[int, ...], mesh_shape: tuple[int, ...]) -> int:
    flat = 0
    for c, n in zip(coordinate, mesh_shape):
        flat = flat * n + c
    return flat
