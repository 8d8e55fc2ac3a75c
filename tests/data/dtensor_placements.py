"""DTensor's own ops on sharded inputs, returned as they come: every placement torch 2.13 returns
for them (``Partial`` max/min/sum/product, ``_NormPartial`` with p = 1, 2, inf, ``_MaskPartial`` from a
row-sharded embedding, ``_StridedShard`` from flattening a 2-D-sharded tensor) must be read by the
engine as torch means it. Each implementation returns the DTensor ``y`` and ``y_full``, its
``full_tensor()``: both are judged against the same oracle, so a misread placement is a mismatch
on ``y`` alone. Each op checks the placement it gets is the one this file is about (a torch that
returns another fails loudly, as a rank error)."""

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn

OPS = ("sum", "amax", "amin", "prod", "norm1", "norm2", "norminf", "embedding", "flatten")


def inputs(case):
    gen = generator(case)
    rows, cols = case.sizes["rows"], case.sizes["cols"]
    return {"x": randn(case, rows, cols, gen=gen), "idx": torch.randint(0, rows, (3,), generator=gen)}


def apply(op, x, idx):
    """The op on a full tensor or a DTensor alike."""
    if op == "sum":
        return x.sum(0)
    if op == "amax":
        return x.amax(0)
    if op == "amin":
        return x.amin(0)
    if op == "prod":
        return x.prod(0)
    if op.startswith("norm"):
        return torch.linalg.vector_norm(x, math.inf if op == "norminf" else float(op[4:]))
    if op == "embedding":
        return F.embedding(idx, x)
    return x.flatten()


def oracle(inp, case):
    y = apply(case.options["op"], inp["x"], inp["idx"])
    return {"y": y, "y_full": y}


#: the placement class each op must return on a mesh axis that shards the reduced rows
EXPECTED = {
    "sum": "Partial(sum)",
    "amax": "Partial(max)",
    "amin": "Partial(min)",
    "prod": "Partial(product)",
    "norm1": "_NormPartial",
    "norm2": "_NormPartial",
    "norminf": "Partial(max)",  # torch 2.13 turns the inf-norm's pending reduction into Partial(max)
    "embedding": "_MaskPartial",
}


def _check_placement(op, y, mesh):
    names = [type(p).__name__ for p in y.placements]  # Partial's reduce op too: "Partial(max)"
    got = names + [f"{n}({p.reduce_op})" for n, p in zip(names, y.placements) if n == "Partial"]
    if op == "flatten":
        want = "_StridedShard" if mesh.ndim >= 2 and min(mesh.shape) > 1 else None
    else:
        want = EXPECTED[op] if mesh.size(0) > 1 or op == "embedding" else None
    if want is not None and want not in got:
        raise AssertionError(f"{op}: torch returned placements {y.placements}, this file expects {want}")


def _nested_empty(n, parts):
    """Whether a dim of ``n`` sharded over mesh axes of ``parts`` sizes in turn (nested: each
    axis splits the piece the one before left) leaves some rank an empty piece."""
    if not parts:
        return n == 0
    head, rest = parts[0], parts[1:]
    step = -(-n // head)  # DTensor's rule: ceil(n / parts) until they run out
    pieces = [min(step, max(0, n - i * step)) for i in range(head)]
    return any(_nested_empty(p, rest) for p in pieces)


def _some_shard_empty(case, mesh):
    """Rows on the first axis, columns on the others (see ``reference``)."""
    sizes = [mesh.size(axis) for axis in range(mesh.ndim)]
    return _nested_empty(case.sizes["rows"], sizes[:1]) or _nested_empty(case.sizes["cols"], sizes[1:])


def reference(ctx):
    op, mesh = ctx.case.options["op"], ctx.mesh.device_mesh()
    if op == "embedding":  # a row-sharded table on the group, looked up by replicated indices
        mesh = mesh["impl"]
        x = distribute_tensor(ctx.inputs["x"], mesh, [Shard(0)], src_data_rank=None)
        idx = distribute_tensor(ctx.inputs["idx"], mesh, [Replicate()], src_data_rank=None)
    else:  # rows on the first axis, columns on the second (a 2-D mesh)
        place = [Shard(0)] + [Shard(1)] * (mesh.ndim - 1)
        x, idx = distribute_tensor(ctx.inputs["x"], mesh, place, src_data_rank=None), None
    if op in ("amax", "amin", "norminf") and _some_shard_empty(ctx.case, mesh):
        # torch 2.13's DTensor amax/amin and inf-norm raise on an empty local shard ("Expected
        # reduction dim 0 to have non-zero size", "cannot compute the inf norm on an empty
        # tensor"): not what this file checks, so counted (decided from global sizes: every rank
        # agrees)
        raise shardfuzz.Unsupported(f"{op} with an empty local shard raises in torch 2.13")
    try:
        y = apply(op, x, idx)
    except RuntimeError as e:
        if "Please redistribute the input first" not in str(e):
            raise
        # DTensor's deliberate refusal (flatten of an unevenly 2-D-sharded tensor), the same on
        # every rank: sharding propagation sees global shapes only
        raise shardfuzz.Unsupported(f"{op}: {str(e).splitlines()[0]}") from e
    assert isinstance(y, DTensor), type(y)
    _check_placement(op, y, mesh)
    return {"y": y, "y_full": y.full_tensor()}


def max_called_sum(ctx):
    """Negative control: amax's pending max relabelled as a pending sum (the local maxima added)."""
    if ctx.case.options["op"] != "amax" or _some_shard_empty(ctx.case, ctx.mesh.device_mesh()):
        raise shardfuzz.Unsupported("max_called_sum is written for amax on non-empty shards")
    mesh = ctx.mesh.device_mesh()["impl"]
    x = distribute_tensor(ctx.inputs["x"], mesh, [Shard(0)], src_data_rank=None)
    y = x.amax(0)
    relabelled = DTensor.from_local(y.to_local(), mesh, [Partial("sum")], run_check=False)
    return {"y": relabelled, "y_full": y.full_tensor()}


TARGET = shardfuzz.Target(
    name="dtensor_placements",
    cases=lambda world_sizes=None: sst.cases(
        "dtensor_placements",
        sizes={"rows": sst.Split(min_per_rank=1, max_per_rank=3), "cols": sst.Free(1, 3)},
        options={"op": st.sampled_from(OPS)},
        world_sizes=world_sizes,
        dtypes=("float32", "float64"),
        profiles=("normal",),
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"y": shardfuzz.FromDTensor(), "y_full": shardfuzz.Replicate()},
    implementations={"reference": reference, "max_called_sum": max_called_sum},
)
