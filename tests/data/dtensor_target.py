"""Implementations that return DTensors: the engine reads their placements (no layout declared).

The outputs: ``y = 2 * x`` and ``total = x.sum(0)`` of a ``[rows, cols]`` input. Every
implementation builds its DTensors with torch's own calls (``distribute_tensor`` with
``src_data_rank=None``: each rank chunks locally, no collective), so the expected pieces come from
torch, and the engine's placement rule is checked against it.
"""

from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"y": 2 * inp["x"], "total": inp["x"].sum(0)}


def _impl_mesh(ctx):
    return ctx.mesh.device_mesh()["impl"]


def shard_rows(ctx):
    """``y`` as ``Shard(0)`` on the group, ``total`` as ``Partial`` (each rank's rows summed)."""
    mesh = _impl_mesh(ctx)
    x = distribute_tensor(ctx.inputs["x"], mesh, [Shard(0)], src_data_rank=None)
    part = DTensor.from_local(x.to_local().sum(0), mesh, [Partial()], run_check=False)
    return {"y": 2 * x, "total": part}


def replicated(ctx):
    mesh = _impl_mesh(ctx)
    x = distribute_tensor(ctx.inputs["x"], mesh, [Replicate()], src_data_rank=None)
    return {"y": 2 * x, "total": x.to_local().sum(0)}  # a plain tensor: the declared Replicate()


def both_axes(ctx):
    """On the whole mesh: ``y`` sharded over rows on axis 0 and over columns on the last axis
    (or rows on both axes, ``Shard(0), Shard(0)``, when the case has one column)."""
    mesh = ctx.mesh.device_mesh()
    last = Shard(1) if ctx.inputs["x"].shape[1] > 1 else Shard(0)
    placements = [Shard(0)] * (mesh.ndim - 1) + [last]
    x = distribute_tensor(ctx.inputs["x"], mesh, placements, src_data_rank=None)
    part = DTensor.from_local(
        distribute_tensor(ctx.inputs["x"], mesh, [Shard(0)] * mesh.ndim, src_data_rank=None)
        .to_local()
        .sum(0),
        mesh,
        [Partial()] * mesh.ndim,
        run_check=False,
    )
    return {"y": 2 * x, "total": part}


def dtensor_inputs(ctx):
    """``ctx.local["x"]`` is a DTensor (``AsDTensor(Shard(0))``): DTensor ops all the way; the sum
    over the sharded rows comes out ``Partial``."""
    x = ctx.local["x"]
    assert isinstance(x, DTensor) and x.placements == (Shard(0),), x
    return {"y": 2 * x, "total": x.sum(0)}


def local_sum_called_total(ctx):
    """Bug, on a DTensor input: the sum of this rank's own rows returned as the total (a plain
    tensor, the declared Replicate()): the all-reduce that ``x.sum(0)`` would have done is missing."""
    x = ctx.local["x"]
    return {"y": 2 * x, "total": x.to_local().sum(0)}


def partial_called_replicate(ctx):
    """Bug: each rank's partial sum labelled Replicate (a reduction forgotten)."""
    mesh = _impl_mesh(ctx)
    x = distribute_tensor(ctx.inputs["x"], mesh, [Shard(0)], src_data_rank=None)
    part = DTensor.from_local(x.to_local().sum(0), mesh, [Replicate()], run_check=False)
    return {"y": 2 * x, "total": part}


def wrong_local_shape(ctx):
    """Bug: a full local tensor labelled Shard(0) (``from_local`` without a check, global shape given)."""
    mesh = _impl_mesh(ctx)
    x = ctx.inputs["x"]
    y = DTensor.from_local(2 * x, mesh, [Shard(0)], run_check=False, shape=x.shape, stride=x.stride())
    total = distribute_tensor(x.sum(0), mesh, [Replicate()], src_data_rank=None)
    return {"y": y, "total": total}


def shard_called_replicate(ctx):
    """Bug: this rank's rows labelled Replicate (``from_local`` infers the global shape from them)."""
    mesh = _impl_mesh(ctx)
    out = shard_rows(ctx)
    return {**out, "y": DTensor.from_local(out["y"].to_local(), mesh, [Replicate()], run_check=False)}


def from_local_without_shape(ctx):
    """Bug: this rank's rows labelled Shard(0) without ``shape=``: ``from_local`` takes every
    rank's piece to be as large as this one's, right only where the rows divide evenly."""
    mesh = _impl_mesh(ctx)
    out = shard_rows(ctx)
    return {**out, "y": DTensor.from_local(out["y"].to_local(), mesh, [Shard(0)], run_check=False)}


def plain_for_dtensor(ctx):
    """Bug: a plain local tensor where the target says the output is a DTensor."""
    out = shard_rows(ctx)
    return {**out, "y": out["y"].to_local()}


TARGET = shardfuzz.Target(
    name="dtensor_toy",
    cases=lambda world_sizes=None: sst.cases(
        "dtensor_toy",
        sizes={"rows": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True), "cols": sst.Free(1, 3)},
        world_sizes=world_sizes,
        profiles=("normal",),
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.AsDTensor(Shard(0))},
    outputs={"y": shardfuzz.FromDTensor(), "total": shardfuzz.Replicate()},
    implementations={
        "reference": shard_rows,
        "replicated": replicated,
        "both_axes": both_axes,
        "dtensor_inputs": dtensor_inputs,
        "local_sum_called_total": local_sum_called_total,
        "partial_called_replicate": partial_called_replicate,
        "wrong_local_shape": wrong_local_shape,
        "shard_called_replicate": shard_called_replicate,
        "plain_for_dtensor": plain_for_dtensor,
        "from_local_without_shape": from_local_without_shape,
    },
)
