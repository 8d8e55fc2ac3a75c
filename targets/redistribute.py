"""DTensor ``redistribute`` between ``Shard``, ``Replicate`` and ``Partial`` on 1-D and 2-D meshes.

A global tensor ``x`` ``[d0, d1]`` (sizes drawn per rank with empty shards allowed, so uneven and
smaller than the mesh) lives on the case's whole mesh (``ctx.mesh.device_mesh()``) with source
placements ``src``, one per mesh axis, and is redistributed to ``dst``. Each placement is
``R`` (``Replicate()``), ``S0``/``S1`` (``Shard(d)``, DTensor's rule: ``ceil(n / parts)`` rows
until they run out; two axes on one dim nest) or ``P`` (``Partial("sum")``). A ``Partial`` piece is
an exact decomposition: every element belongs to one coordinate of the ``Partial`` axes (drawn,
input ``owner``) and is 0 on the others, so the sum is ``x`` in any dtype and any order.

Outputs, both DTensors (the engine reads their placements, ``FromDTensor``): ``y``, the
redistributed tensor (the oracle: ``x`` itself), and ``grad_x``, the gradient of ``<y, dy>`` for a
random cotangent ``dy`` given with ``dst`` placements (the oracle: ``dy``), on the source's
placements with ``Partial`` as ``Replicate`` (a partial term's gradient is the whole cotangent).

Implementations: ``reference`` moves the pieces by hand (each rank places its piece in a
zero-filled global buffer, the copy at coordinate 0 of every ``Replicate`` axis only, then one
all-reduce per mesh axis, then the destination piece is cut out), no DTensor collective;
``torch_redistribute`` is PyTorch's ``DTensor.redistribute`` and its backward. Planted bugs: the
``PLANTED`` records at the end of this file.
"""

from __future__ import annotations

import dataclasses
import math

import hypothesis.strategies as st
import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, PlantedBug, Target, Unsupported, Verified, bind
from shardfuzz.spec.budget import all_reduce_bytes
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.placements import FromDTensor

PLACEMENTS = ("R", "S0", "S1", "P")  # simplest first: shrinking prefers Replicate
SIZES = {  # per rank of the last mesh axis; 0 per rank: fewer rows than ranks (empty shards)
    "d0": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True),
    "d1": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True),
}


@st.composite
def _with_placements(draw, base):
    """A case of ``base`` with ``src``/``dst`` drawn for each axis of its mesh."""
    case = draw(base)
    axes = len(case.mesh)
    drawn = {
        k: ",".join(draw(st.lists(st.sampled_from(PLACEMENTS), min_size=axes, max_size=axes)))
        for k in ("src", "dst")
    }
    return dataclasses.replace(case, options={**case.options, **drawn})


def cases(world_sizes=None):
    base = sst.cases(
        "redistribute",
        sizes=SIZES,
        options={"src": st.just("R"), "dst": st.just("R")},  # redrawn per mesh axis below
        world_sizes=world_sizes,
    )
    return sst.bounded_like(_with_placements(base), base)  # it redraws option values only


def placements(case, key: str) -> tuple[str, ...]:
    """``case.options[key]`` (``"S0,P"``) as one placement per mesh axis; a wrong count is an error."""
    got = tuple(case.options[key].split(","))
    bad = [p for p in got if p not in PLACEMENTS]
    if len(got) != len(case.mesh) or bad:
        raise ValueError(
            f"option {key}={case.options[key]!r}: give one of {PLACEMENTS} per mesh axis of {case.mesh}, comma-separated"
        )
    return got


def inputs(case):
    g = generator(case)
    shape = (case.sizes["d0"], case.sizes["d1"])
    partial_parts = math.prod(n for n, p in zip(case.mesh, placements(case, "src")) if p == "P")
    dst_parts = math.prod(n for n, p in zip(case.mesh, placements(case, "dst")) if p == "P")
    return {
        "x": randn(case, *shape, gen=g),
        "dy": randn(case, *shape, gen=g, profile=False),
        # which coordinate of the Partial axes holds each element (source and cotangent)
        "owner": torch.randint(0, max(partial_parts, 1), shape, generator=g),
        "dy_owner": torch.randint(0, max(dst_parts, 1), shape, generator=g),
    }


def oracle(inp, case):
    return {"y": inp["x"].clone(), "grad_x": inp["dy"].clone()}


# -- pieces by hand: DTensor's placement rules, written out -------------------------------------
def box(shape, places, mesh_shape, coord, rule="dtensor"):
    """(offset, size) of the piece at ``coord``: each ``Shard`` axis in turn splits its dim further."""
    offset, size = [0] * len(shape), list(shape)
    for axis, p in enumerate(places):
        if p.startswith("S"):
            d, n, c = int(p[1:]), mesh_shape[axis], coord[axis]
            offset[d] += split_offsets(size[d], n, rule)[c]
            size[d] = split_sizes(size[d], n, rule)[c]
    return offset, size


def cut(t, offset, size):
    return t[tuple(slice(o, o + s) for o, s in zip(offset, size))]


def partial_index(places, mesh_shape, coord) -> int:
    """This coordinate's flat index over the ``Partial`` axes (the owner value it keeps)."""
    flat = 0
    for axis, p in enumerate(places):
        if p == "P":
            flat = flat * mesh_shape[axis] + coord[axis]
    return flat


def piece(full, owner, places, mesh_shape, coord, rule="dtensor"):
    """The local piece of ``full`` at ``coord`` under ``places``; under ``Partial``, the elements
    this coordinate owns (the others 0): the pieces sum to ``full`` exactly."""
    offset, size = box(tuple(full.shape), places, mesh_shape, coord, rule)
    local = cut(full, offset, size)
    if "P" in places:
        keep = cut(owner, offset, size) == partial_index(places, mesh_shape, coord)
        local = torch.where(keep, local, torch.zeros_like(local))
    return local.contiguous()


def torch_placements(places):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return [Replicate() if p == "R" else Partial("sum") if p == "P" else Shard(int(p[1:])) for p in places]


def _dtensor(local, mesh, places, shape):
    from torch.distributed.tensor import DTensor

    stride = torch.empty(shape).stride()
    return DTensor.from_local(
        local, mesh, torch_placements(places), run_check=False, shape=shape, stride=stride
    )


def _coord(mesh):
    return tuple(mesh.get_coordinate())


def gather_full(local, shape, places, mesh, *, bug=None):
    """The global tensor on every rank from its pieces: each piece in a zero-filled buffer (one
    copy per ``Replicate`` axis: coordinate 0), summed over every mesh axis in turn."""
    coord, full = _coord(mesh), local.new_zeros(shape)
    replica = all(c == 0 for c, p in zip(coord, places) if p == "R")
    if replica or bug == "sum_replicas":
        offset, size = box(shape, places, tuple(mesh.shape), coord)
        cut(full, offset, size).copy_(local)
    if bug == "float64_all_reduce":  # "summed in float64 for accuracy": the same sums, wider messages
        wide = full.double()
        for axis in range(mesh.ndim):
            dist.all_reduce(wide, group=mesh.get_group(axis))
        return wide.to(full.dtype)
    for axis in range(mesh.ndim):
        dist.all_reduce(full, group=mesh.get_group(axis))
    return full


def reference(ctx, *, bug=None):
    """Redistribution by hand: the source pieces summed into the global tensor, then cut."""
    mesh, case = ctx.mesh.device_mesh(), ctx.case
    coord, mesh_shape = _coord(mesh), tuple(mesh.shape)
    src, dst = placements(case, "src"), placements(case, "dst")
    x, dy = ctx.inputs["x"], ctx.inputs["dy"]
    shape = tuple(x.shape)
    rule = "tensor_split" if bug == "tensor_split_offsets" else "dtensor"
    full = gather_full(piece(x, ctx.inputs["owner"], src, mesh_shape, coord), shape, src, mesh, bug=bug)
    # a Partial destination: each element kept by one coordinate of *its* Partial axes (dy_owner is
    # drawn over them; the source's owner counts the source's Partial axes)
    y = piece(full, ctx.inputs["dy_owner"], dst, mesh_shape, coord, rule)
    # backward: the cotangent's pieces summed the same way, cut with the source's placements
    grad_places = tuple("R" if p == "P" else p for p in src)
    dy_full = gather_full(piece(dy, ctx.inputs["dy_owner"], dst, mesh_shape, coord), shape, dst, mesh)
    grad = piece(dy_full, ctx.inputs["owner"], grad_places, mesh_shape, coord)
    return {"y": _dtensor(y, mesh, dst, shape), "grad_x": _dtensor(grad, mesh, grad_places, shape)}


def torch_redistribute(ctx, *, bug=None):
    """PyTorch's ``DTensor.redistribute`` forward and backward, the source built from its pieces."""
    mesh, case = ctx.mesh.device_mesh(), ctx.case
    coord, mesh_shape = _coord(mesh), tuple(mesh.shape)
    src, dst = placements(case, "src"), placements(case, "dst")
    if any(d == "P" and s != "P" for s, d in zip(src, dst)):  # torch's own check, by design
        raise Unsupported("torch: redistributing to Partial is for internal use only", reason="to Partial")
    x, dy = ctx.inputs["x"], ctx.inputs["dy"]
    shape = tuple(x.shape)
    if bug == "partial_copies":  # every Partial coordinate keeps every element
        local = cut(x, *box(shape, src, mesh_shape, coord)).contiguous()
    else:
        local = piece(x, ctx.inputs["owner"], src, mesh_shape, coord)
    xd = _dtensor(local, mesh, src, shape).detach().requires_grad_()
    y = xd.redistribute(mesh, torch_placements(dst))
    y.backward(_dtensor(piece(dy, ctx.inputs["dy_owner"], dst, mesh_shape, coord), mesh, dst, shape))
    return {"y": y.detach(), "grad_x": xd.grad}


def _has(case, key, p):
    return p in placements(case, key)


def _nested(case, key):
    shards = [p for p in placements(case, key) if p.startswith("S")]
    return len(shards) == 2 and shards[0] == shards[1]


TRIGGERS = {
    "Partial source": lambda c: _has(c, "src", "P"),
    "Partial destination": lambda c: _has(c, "dst", "P"),
    "Partial -> Shard on one axis": lambda c: any(
        s == "P" and d.startswith("S") for s, d in zip(placements(c, "src"), placements(c, "dst"))
    ),
    "Shard -> another Shard on one axis": lambda c: any(  # an all-to-all
        s.startswith("S") and d.startswith("S") and s != d
        for s, d in zip(placements(c, "src"), placements(c, "dst"))
    ),
    "two mesh axes shard one dim (nested)": lambda c: _nested(c, "src") or _nested(c, "dst"),
    # DTensor's rule and tensor_split's differ only here ([2, 2, 0] vs [2, 1, 1])
    "an uneven Shard destination on a mesh axis of 3+": lambda c: any(
        p.startswith("S") and n >= 3 and c.sizes[f"d{p[1]}"] % n for n, p in zip(c.mesh, placements(c, "dst"))
    ),
    "a dim smaller than its mesh axis (empty shards)": lambda c: any(
        p.startswith("S") and c.sizes[f"d{p[1]}"] < n
        for k in ("src", "dst")
        for n, p in zip(c.mesh, placements(c, k))
    ),
    "2-D mesh, Partial on one axis, Shard on the other": lambda c: (
        sum(1 for m in c.mesh if m > 1) == 2
        and any(set(placements(c, k)) in ({"P", "S0"}, {"P", "S1"}) for k in ("src", "dst"))
    ),
}


def reference_comm(case) -> CommBudget:
    """Per rank: the global tensor all-reduced over every mesh axis in turn, forward (the source's
    pieces) and backward (the cotangent's), in the case dtype."""
    numel = case.sizes["d0"] * case.sizes["d1"]
    sent = 2 * sum(all_reduce_bytes(numel, n, case.dtype) for n in case.mesh)
    why = "2 x one all-reduce of d0*d1 elements per mesh axis"
    return CommBudget(sent=sent, collectives=2 * len(case.mesh), why=why)


PLANTED = [
    PlantedBug(
        "float64_all_reduce",
        "the pieces summed in float64 'for accuracy' (each element has one nonzero piece, so the "
        "sums are exact anyway): right values, 2-4x the bytes",
        Expect(
            kind="communication",
            world_size=2,
            mesh=None,
            uneven=None,
            check=lambda c: c.dtype != "float64",
            note="not float64",
        ),
        p95=2,  # budget.py, 20 seeds (stop 57): its covering row, the second
    ),
    PlantedBug(
        "tensor_split_offsets",
        "destination shards cut by tensor_split's rule ([2, 1, 1]) where DTensor chunks ([2, 2, 0]): "
        "the rules agree on 2 ranks and on even sizes",
        Expect(
            kind="layout",
            world_size=3,
            mesh=(3,),
            uneven=None,  # the other dim shrinks to 1, uneven too
            check=lambda c: (
                len(placements(c, "dst")[0]) == 2 and c.sizes[f"d{placements(c, 'dst')[0][1]}"] == 4
            ),
            note="a Shard(d) destination, that dim 4 on 3 ranks",
            needs=("world>=3", "uneven"),
        ),
        p95=8,  # budget.py, 20 seeds (stop 57): its covering row, the eighth
    ),
    PlantedBug(
        "sum_replicas",
        "every Replicate copy summed into the global tensor, not one per replica: a Replicate "
        "source counted world-size times",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,  # sizes shrink to 1: uneven on 2 ranks, and beside the point
            check=lambda c: placements(c, "src") == ("R",),
            note="Replicate source",
        ),
        p95=10,
    ),
    PlantedBug(
        "partial_copies",
        "a Partial source made of full copies, not of terms that sum to the tensor (each rank's "
        "local piece is the whole value): the Partial axis counts it once per rank",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,  # sizes shrink to 1: uneven on 2 ranks, and beside the point
            check=lambda c: placements(c, "src") == ("P",),
            note="Partial source",
        ),
        p95=1,
        impl=bind("torch_redistribute", bug="partial_copies"),
    ),
]

# DTensor.redistribute itself: tests/test_verified.py runs it
VERIFIED = [
    Verified(
        name="torch_redistribute",
        what="torch's DTensor.redistribute, forward and backward, on 1-D and 2-D meshes with uneven "
        "and empty shards; redistributing to Partial (internal use only) is refused",
        examples=40,
        reaches=(
            "Partial source",
            "Partial -> Shard on one axis",
            "Shard -> another Shard on one axis",
            "a dim smaller than its mesh axis (empty shards)",
            "2-D mesh",
            "uneven",
            "backward",
        ),
        refuses=("to Partial",),
    ),
]

TARGET = Target(
    name="redistribute",
    description="DTensor redistribute between Shard/Replicate/Partial on 1-D and 2-D meshes, uneven and empty shards, forward and backward",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"y": FromDTensor(), "grad_x": FromDTensor()},
    implementations={"reference": "reference", "torch_redistribute": "torch_redistribute"},
    planted=PLANTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    gradients=("grad_x",),
    collectives=None,  # torch's redistribute picks all_gather, reduce_scatter, all_to_all, ...
    comm={"reference": reference_comm},
)
