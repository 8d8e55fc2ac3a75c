"""A row-parallel matmul whose partial sums nearly cancel across ranks.

``y = x @ w`` with the inner dim sharded (``x``: ``Shard(1)``, ``w``: ``Shard(0)``, DTensor's rule,
uneven allowed). Each rank computes its partial product in the case dtype (so bfloat16 partial sums
are rounded before they are added) and the partials are all-reduced in that dtype; ``y`` is
replicated.

The inputs make ``y`` a small difference of large numbers: the second half of ``x``'s inner dim
is minus the first half plus a perturbation (option ``perturbation``, times the values' scale;
0 makes the halves cancel exactly), ``w``'s two halves are equal, and an odd inner size leaves a
last column of perturbation size. With the halves on different ranks (2 ranks, even sizes), every
partial sum is large and their sum is small.

Planted bugs: ``floor_split`` (hand-sliced shards of ``inner // W`` columns drop the remainder:
right on even sizes) and ``world_group`` (the all-reduce runs on the world group instead of the
implementation's group: right on every 1-D mesh).
"""

import hypothesis.strategies as st
import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    b, k, n = (case.sizes[s] for s in ("batch", "inner", "out"))
    half, eps = k // 2, case.options["perturbation"]
    g = generator(case)
    a = randn(case, b, half, gen=g, dtype="float32")
    x = torch.cat([a, -a + eps * randn(case, b, half, gen=g, dtype="float32")], dim=1)
    c = randn(case, half, n, gen=g, scale=k**-0.5, dtype="float32")
    w = torch.cat([c, c], dim=0)
    if k % 2:  # an odd inner size: one more column, of perturbation size
        x = torch.cat([x, eps * randn(case, b, 1, gen=g, dtype="float32")], dim=1)
        w = torch.cat([w, randn(case, 1, n, gen=g, scale=k**-0.5, dtype="float32")], dim=0)
    dtype = getattr(torch, case.dtype)
    return {"x": x.to(dtype), "w": w.to(dtype)}


def oracle(inp, case):
    return {"y": inp["x"] @ inp["w"]}


def row_parallel_matmul(ctx, *, floor_split=False, world_group=False):
    x, w = ctx.local["x"], ctx.local["w"]
    if floor_split:  # hand-made shards: inner // W columns each, the remainder dropped
        per = ctx.inputs["x"].shape[1] // ctx.group_size
        cols = slice(ctx.group_rank * per, (ctx.group_rank + 1) * per)
        x, w = ctx.inputs["x"][:, cols], ctx.inputs["w"][cols]
    y = x @ w  # this rank's partial sum, rounded to the case dtype
    dist.all_reduce(y, group=None if world_group else ctx.group)
    return {"y": y}


def reference(ctx):
    return row_parallel_matmul(ctx)


def floor_split(ctx):  # planted: uneven inner sizes lose their last columns
    return row_parallel_matmul(ctx, floor_split=True)


def world_group(ctx):  # planted: on a 2-D mesh the replicas' partial sums are added too
    return row_parallel_matmul(ctx, world_group=True)


TARGET = shardfuzz.Target(
    name="row_parallel_cancel",
    description="row-parallel matmul whose per-rank partial sums nearly cancel",
    cases=lambda world_sizes=None: sst.cases(
        "row_parallel_cancel",
        sizes={
            "batch": sst.Free(1, 3),
            "inner": sst.Split(min_per_rank=1, max_per_rank=4),
            "out": sst.Free(1, 3),
        },
        options={"perturbation": st.sampled_from([1e-3, 0.0, 1e-1])},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(1), "w": shardfuzz.Shard(0)},
    outputs={"y": shardfuzz.Replicate()},
    implementations={"reference": reference, "floor_split": floor_split, "world_group": world_group},
)
