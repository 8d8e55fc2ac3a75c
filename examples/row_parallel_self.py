"""A row-parallel linear layer fuzzed before anyone wrote its oracle: ``oracle="self"``.

``y = x @ w.T + b`` with the inner dim sharded (``x``: ``Shard(1)``, ``w``: ``Shard(1)``,
DTensor's rule, uneven and empty shards allowed) and ``b`` replicated; backward from a cotangent
``dy``. The unsharded layer is the spec, so the target names no oracle: each case also runs this
same code at world size 1 in float64, and that is the oracle.

Planted bug: ``bias_every_rank`` (each rank adds the bias to its partial sum before the
all-reduce, so ``y`` gets ``W * b``): right at world size 1, so the self-oracle sees it at 2 ranks.
A bug that is there at world size 1 too (a wrong scale, a transposed weight) is invisible to a
self-oracle: write an oracle for those.
"""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


class _AllReduce(torch.autograd.Function):  # all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, t, group):
        t = t.clone()
        dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def inputs(case):
    b, k, n = (case.sizes[s] for s in ("batch", "inner", "out"))
    g = generator(case)
    return {
        "x": randn(case, b, k, gen=g),
        "w": randn(case, n, k, gen=g, scale=k**-0.5, role="weight"),
        "b": randn(case, n, gen=g, role="weight"),
        "dy": randn(case, b, n, gen=g, role="cotangent"),
    }


def row_parallel(ctx, *, bias_every_rank=False):
    x, w = (ctx.local[k].clone().requires_grad_() for k in ("x", "w"))
    b = ctx.inputs["b"].clone().requires_grad_()
    partial = x @ w.T  # this rank's share of the inner dim
    if bias_every_rank:
        partial = partial + b
    y = _AllReduce.apply(partial, ctx.group)
    if not bias_every_rank:
        y = y + b
    y.backward(ctx.inputs["dy"])
    return {"y": y.detach(), "grad_x": x.grad, "grad_w": w.grad, "grad_b": b.grad}


def reference(ctx):
    return row_parallel(ctx)


def bias_every_rank(ctx):  # planted: W * b
    return row_parallel(ctx, bias_every_rank=True)


TARGET = shardfuzz.Target(
    name="row_parallel_self",
    description="row-parallel linear, forward and backward, its own oracle at world size 1",
    cases=lambda world_sizes=None: sst.cases(
        "row_parallel_self",
        sizes={
            "batch": sst.Free(1, 3),
            "inner": sst.Split(max_per_rank=4, allow_empty=True),
            "out": sst.Free(1, 3),
        },
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle="self",
    input_layouts={"x": shardfuzz.Shard(1), "w": shardfuzz.Shard(1)},
    outputs={
        "y": shardfuzz.Replicate(),
        "grad_x": shardfuzz.Shard(1),
        "grad_w": shardfuzz.Shard(1),
        "grad_b": shardfuzz.Replicate(),
    },
    implementations={"reference": reference, "bias_every_rank": bias_every_rank},
)
