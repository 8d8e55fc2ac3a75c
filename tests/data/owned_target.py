"""A target whose output one named rank owns (``Owned(rank=-1)``: a pipeline's loss on its last
stage), for tests/test_standalone.py: the sum of squares of rows sharded across ranks, reduced to
the last group rank, and a planted bug that leaves out the other ranks' rows."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"loss": (inp["x"] ** 2).sum()}


def reduced_to_last(ctx):
    total = (ctx.local["x"] ** 2).sum()
    dist.all_reduce(total, group=ctx.group)
    return {"loss": total if ctx.group_rank == ctx.group_size - 1 else torch.empty(0, dtype=total.dtype)}


def own_rows_only(ctx):  # planted bug: the last rank's loss forgets the reduce
    total = (ctx.local["x"] ** 2).sum()
    return {"loss": total if ctx.group_rank == ctx.group_size - 1 else torch.empty(0, dtype=total.dtype)}


def none_elsewhere(ctx):  # a contract slip: the non-owners return None, not torch.empty(0)
    total = (ctx.local["x"] ** 2).sum()
    dist.all_reduce(total, group=ctx.group)
    return {"loss": total if ctx.group_rank == ctx.group_size - 1 else None}


def none_on_the_owner(ctx):  # a bug: the owner's loss never computed
    return {"loss": None if ctx.group_rank == ctx.group_size - 1 else torch.empty(0)}


def zero_elsewhere(ctx):  # another: a 0-d zero on the non-owners
    total = (ctx.local["x"] ** 2).sum()
    dist.all_reduce(total, group=ctx.group)
    return {"loss": total if ctx.group_rank == ctx.group_size - 1 else torch.zeros(())}


TARGET = shardfuzz.Target(
    name="owned_loss",
    cases=lambda world_sizes=None: sst.cases(
        "owned_loss",
        sizes={"rows": sst.Split(min_per_rank=1), "cols": sst.Free(1, 3)},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"loss": shardfuzz.Owned(rank=-1)},
    implementations={
        "reference": reduced_to_last,
        "own_rows_only": own_rows_only,
        "none_elsewhere": none_elsewhere,
        "zero_elsewhere": zero_elsewhere,
        "none_on_the_owner": none_on_the_owner,
    },
)
