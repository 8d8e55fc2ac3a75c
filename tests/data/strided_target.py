"""A gradient all-reduce as users write it, with its input declared layout-free (tests/
test_memory_layouts.py): rank r holds ``g[r]`` (``Shard(0)`` of ``[group, rows, cols]``) and the
output is the sum over ranks. ``in_place`` all-reduces its input piece as it is: right while the
piece is contiguous, wrong on gloo once it arrives as a view of a wider buffer."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"g": randn(case, case.group_size, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["g"].sum(0)}


def reference(ctx):
    total = ctx.local["g"][0].clone(memory_format=torch.contiguous_format)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


def in_place(ctx):
    total = ctx.local["g"][0]  # the input piece itself: a view, whatever its layout
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


TARGET = shardfuzz.Target(
    name="grad_sum",
    cases=lambda world_sizes=None: sst.cases(
        "grad_sum",
        sizes={"rows": sst.Free(1, 3), "cols": sst.Free(1, 3)},
        world_sizes=world_sizes,
        strided_inputs=True,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"g": shardfuzz.Shard(0)},
    layout_free=("g",),
    outputs={"total": shardfuzz.Replicate()},
    implementations={"reference": reference, "in_place": in_place},
)
